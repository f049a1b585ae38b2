//! Running the real `kubectl-ax` binary in the e2e tests, against the cluster in KUBECONFIG.

use std::process::Command;

/// What one run of kubectl-ax did.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Panics unless the run exited 0, showing its output.
    pub fn ok(self) -> Run {
        assert_eq!(self.code, 0, "kubectl-ax failed: {self:#?}");
        self
    }

    /// Panics unless the run failed with exactly one line on stderr; returns that line.
    pub fn one_line_error(&self) -> String {
        assert_ne!(self.code, 0, "expected a failure: {self:#?}");
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "expected one error line: {self:#?}");
        assert!(lines[0].starts_with("error: "), "{self:#?}");
        lines[0].to_string()
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_kubectl-ax")
}

/// `kubectl-ax ARGS` with `extra_env`, and `stdin` written to it (closed when None).
pub fn ax_with(args: &[&str], stdin: Option<&str>, extra_env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let out = super::output_with_stdin(&mut cmd, stdin);
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// `kubectl-ax ARGS -n NS`.
pub fn ax(ns: &str, args: &[&str]) -> Run {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["-n", ns]);
    ax_with(&all, None, &[])
}

/// Like `ax`, off the async test's thread (a blocking child process must not stall the runtime).
pub async fn ax_async(ns: &str, args: &[&str]) -> Run {
    let ns = ns.to_string();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ax(&ns, &args)
    })
    .await
    .expect("kubectl-ax thread")
}

/// The rows of a table printed by kubectl-ax, each split on runs of blanks, keyed by header.
pub fn table_rows(text: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let headers: Vec<&str> = header.split_whitespace().collect();
    lines
        .map(|l| {
            headers
                .iter()
                .map(|h| h.to_string())
                .zip(l.split_whitespace().map(str::to_string))
                .collect()
        })
        .collect()
}

/// A client and a fresh namespace for `test`, once an operator leads (see [`operator_leading`]).
pub async fn namespace_with_leader(test: &str) -> (kube::Client, String) {
    let client = super::client().await;
    operator_leading(&client).await;
    let ns = super::namespace(&client, test).await;
    (client, ns)
}

/// Waits until an operator holds its Lease in ax-system: the runner starts it just before the
/// tests, and until it leads, kubectl-ax rightly refuses to act.
pub async fn operator_leading(client: &kube::Client) {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), "ax-system");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let lease = leases
            .get_opt("ax-operator")
            .await
            .expect("read the operator Lease");
        let state = ax::client::operator::lease_state(
            lease.and_then(|l| l.spec).as_ref(),
            jiff::Timestamp::now(),
        );
        if state.not_running_because().is_none() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no operator leads after 60s: {state:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}
