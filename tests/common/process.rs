//! An ax-operator process a test starts on this machine (the tests in e2e/run-tests.sh's
//! OWN_OPERATOR list, run after the shared operator is stopped): how it is started, stopped,
//! probed and measured. Dropping one stops it, also when the test fails, so none outlives its test
//! to reconcile every namespace beside the next one's operator.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, ListParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::operator::LEASE_NAME;
use super::{LONG, repo_root};

/// How to start an [`Operator`]: `Operator::builder(identity)`, then the settings where a test
/// differs from the defaults, then `start()`.
pub struct OperatorBuilder {
    identity: String,
    log_file: String,
    kubeconfig: Option<PathBuf>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    http_port: bool,
    fresh_log: bool,
    terminate_on_drop: bool,
}

impl OperatorBuilder {
    /// The log file in target/e2e (default `operator-<identity>.log`), appended to.
    pub fn log(mut self, file: &str) -> Self {
        self.log_file = file.to_string();
        self
    }

    /// Truncates the log file first, so it holds this run alone.
    pub fn fresh_log(mut self) -> Self {
        self.fresh_log = true;
        self
    }

    /// The credentials it runs with (default: the operator's, `AX_OPERATOR_KUBECONFIG`).
    pub fn kubeconfig(mut self, path: impl AsRef<Path>) -> Self {
        self.kubeconfig = Some(path.as_ref().to_path_buf());
        self
    }

    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// An environment variable, over the defaults (`RUST_LOG=info,ax=debug`, `AX_METRICS_ADDR`).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Serves /metrics and /readyz on a known free port (default: any port, never probed).
    pub fn http_port(mut self) -> Self {
        self.http_port = true;
        self
    }

    /// Stops it with SIGTERM when dropped (a leader releases its Lease, so the next operator need
    /// not wait it out), SIGKILL after 15 s; the default is SIGKILL at once.
    pub fn terminate_on_drop(mut self) -> Self {
        self.terminate_on_drop = true;
        self
    }

    pub fn start(self) -> Operator {
        // The binary cargo built for this test run, unless the runner names another.
        let bin = std::env::var("AX_OPERATOR_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ax-operator").into());
        let kubeconfig = self.kubeconfig.unwrap_or_else(|| {
            std::env::var("AX_OPERATOR_KUBECONFIG")
                .expect("AX_OPERATOR_KUBECONFIG")
                .into()
        });
        let http_port = self.http_port.then(|| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port()
        });
        let log_dir = repo_root().join("target/e2e");
        std::fs::create_dir_all(&log_dir).expect("create target/e2e");
        let log_path = log_dir.join(&self.log_file);
        let log = if self.fresh_log {
            std::fs::File::create(&log_path)
        } else {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
        }
        .unwrap_or_else(|e| panic!("{}: {e}", log_path.display()));
        let metrics_addr = format!("127.0.0.1:{}", http_port.unwrap_or(0));
        let child = Command::new(bin)
            .args(["--identity", &self.identity])
            .args(&self.args)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,ax=debug")
            .env("AX_METRICS_ADDR", metrics_addr)
            .envs(self.env)
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("start ax-operator");
        Operator {
            child,
            identity: self.identity,
            http_port,
            log_path,
            terminate_on_drop: self.terminate_on_drop,
        }
    }
}

/// An ax-operator process of this test; stopped when dropped (see
/// [`OperatorBuilder::terminate_on_drop`]).
pub struct Operator {
    child: Child,
    identity: String,
    http_port: Option<u16>,
    log_path: PathBuf,
    terminate_on_drop: bool,
}

/// `kill -TERM pid`; whether it was sent.
fn sigterm(pid: u32) -> bool {
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

impl Operator {
    pub fn builder(identity: &str) -> OperatorBuilder {
        OperatorBuilder {
            identity: identity.to_string(),
            log_file: format!("operator-{identity}.log"),
            kubeconfig: None,
            args: Vec::new(),
            env: Vec::new(),
            http_port: false,
            fresh_log: false,
            terminate_on_drop: false,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// SIGKILL and reap: no chance to clean up or release the Lease, like a node or OOM kill.
    pub fn sigkill(&mut self) {
        self.child.kill().expect("SIGKILL the operator");
        self.child.wait().expect("reap the operator");
    }

    /// SIGTERM and wait: the operator shuts down the way a Deployment rollout stops it.
    pub fn terminate(&mut self) {
        assert!(sigterm(self.child.id()), "kill -TERM the operator");
        self.child.wait().expect("reap the operator");
    }

    /// Panics if it has exited, pointing at its log.
    pub fn assert_running(&mut self) {
        if let Some(exit) = self.child.try_wait().expect("wait") {
            panic!(
                "the operator exited ({exit}); see {}",
                self.log_path.display()
            );
        }
    }

    /// (VmRSS, VmHWM) in KiB: its resident memory now and at its peak.
    pub fn memory_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the operator runs");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or_else(|| panic!("{name} in /proc/<pid>/status:\n{status}"))
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// `/readyz`: (status code, body), or None while nothing listens yet.
    pub async fn readyz(&self) -> Option<(u16, String)> {
        self.http_get("/readyz").await
    }

    /// `/metrics` as text, or None while nothing listens yet.
    pub async fn metrics(&self) -> Option<String> {
        self.http_get("/metrics")
            .await
            .filter(|(code, _)| *code == 200)
            .map(|(_, body)| body)
    }

    /// GET `path` of its HTTP endpoint: (status code, body).
    async fn http_get(&self, path: &str) -> Option<(u16, String)> {
        let port = self
            .http_port
            .expect("an operator started with OperatorBuilder::http_port");
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nhost: localhost\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut response = String::new();
        tokio::time::timeout(
            Duration::from_secs(10),
            stream.read_to_string(&mut response),
        )
        .await
        .ok()?
        .ok()?;
        let code = response.split(' ').nth(1)?.parse().ok()?;
        let body = response.split_once("\r\n\r\n")?.1.to_string();
        Some((code, body))
    }

    /// Whether `/readyz` answers 200: its role is known and every informer cache has listed.
    pub async fn ready(&self) -> bool {
        self.readyz().await.is_some_and(|(code, _)| code == 200)
    }

    /// Polls `/readyz` until it answers, for up to `timeout`.
    pub async fn first_answer(&self, timeout: Duration) -> (u16, String) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(answer) = self.readyz().await {
                return answer;
            }
            assert!(Instant::now() < deadline, "/readyz never answered");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let answer = self.readyz().await;
            if answer.as_ref().is_some_and(|(code, _)| *code == 200) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "/readyz not 200 within {timeout:?}: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether this operator holds an `ax-operator` Lease.
    pub async fn leading(&self, client: &Client) -> bool {
        let leases: Api<Lease> = Api::all(client.clone());
        let fields = format!("metadata.name={LEASE_NAME}");
        let list = leases.list(&ListParams::default().fields(&fields)).await;
        list.expect("list leases").items.iter().any(|lease| {
            lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                == Some(self.identity.as_str())
        })
    }

    /// Waits until it leads and `/readyz` answers 200, which a leader does only once every cache
    /// has listed: it has read every task. (A standby is ready at once and reads nothing; a
    /// restarted one leads only once the killed one's Lease expired.)
    pub async fn wait_leading_and_ready(&mut self, client: &Client) {
        let deadline = Instant::now() + LONG;
        while !(self.leading(client).await && self.ready().await) {
            self.assert_running();
            assert!(
                Instant::now() < deadline,
                "{} not leading and ready within {LONG:?}",
                self.identity
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        // Stopped and reaped by the test already: its pid may be another process's by now.
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if self.terminate_on_drop && sigterm(self.child.id()) {
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
