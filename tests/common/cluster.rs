//! Disturbing the local cluster itself: pausing the API server (SIGSTOP) to play a slow or
//! unreachable control plane. Only for tests in the serial phase: while it is stopped nothing else
//! can use the cluster.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::Client;

/// The kube-apiserver of the local cluster, stopped until this is dropped (or `resume`d). A
/// watchdog process resumes it after `at_most` even if the test process dies first.
pub struct ApiServerPause {
    pid: String,
    watchdog: Option<Child>,
    paused_at: Instant,
}

fn apiserver_pid() -> String {
    let state = std::env::var("AX_E2E_DIR").unwrap_or_else(|_| "/var/lib/ax-e2e".into());
    let file = format!("{state}/run/kube-apiserver.pid");
    let pid = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("reading {file}: {e} (is the local cluster up?)"))
        .trim()
        .to_string();
    assert!(
        !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()),
        "{file} holds no pid: {pid:?}"
    );
    pid
}

fn signal(pid: &str, signal: &str) -> bool {
    Command::new("kill")
        .args([signal, pid])
        .status()
        .is_ok_and(|s| s.success())
}

impl ApiServerPause {
    pub fn start(at_most: Duration) -> ApiServerPause {
        let pid = apiserver_pid();
        // The safety net first: resumes the API server even if this process is killed.
        let watchdog = Command::new("sh")
            .args([
                "-c",
                &format!("sleep {}; kill -CONT {pid}", at_most.as_secs() + 1),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the resume watchdog");
        assert!(signal(&pid, "-STOP"), "kill -STOP {pid} failed");
        ApiServerPause {
            pid,
            watchdog: Some(watchdog),
            paused_at: Instant::now(),
        }
    }

    /// Resumes the API server; returns how long it was stopped.
    pub fn resume(mut self) -> Duration {
        self.cont();
        self.paused_at.elapsed()
    }

    fn cont(&mut self) {
        signal(&self.pid, "-CONT");
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

impl Drop for ApiServerPause {
    fn drop(&mut self) {
        if self.watchdog.is_some() {
            self.cont();
        }
    }
}

/// Waits until the API server answers again (after a pause), for up to 60 s.
pub async fn wait_api_server(client: &Client) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answered = tokio::time::timeout(Duration::from_secs(5), client.apiserver_version())
            .await
            .is_ok_and(|r| r.is_ok());
        if answered {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the API server does not answer 60 s after it was resumed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
