//! Installing the Helm chart in the tests: the helm binary, the locally built operator image, one
//! release per test in a fresh namespace (uninstalled when dropped), and its values.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use kube::Client;

use super::operator::assert_no_other_operator;
use super::{namespace, repo_root, run_kubectl};

/// Release name. Not `ax-operator`: e2e/run-tests.sh applies config/rbac.yaml, whose cluster-wide
/// `ax-operator` ClusterRole Helm could not adopt.
pub const RELEASE: &str = "axh";
/// `<release>-<chart>`: the name of the chart's Deployment, ServiceAccount, ClusterRole, Service.
pub const FULLNAME: &str = "axh-ax-operator";
/// Namespaces of the Helm tests start with this (see `common::namespace`).
pub const NAMESPACE_PREFIX: &str = "e2e-helm-";
/// The short lease of the Helm tests (the chart's defaults are 15 s, 10 s and 2 s).
pub const LEASE_SECONDS: u64 = 10;
pub const RENEW_DEADLINE_SECONDS: u64 = 7;
pub const RENEW_SECONDS: u64 = 1;

pub fn helm_binary() -> String {
    std::env::var("HELM").unwrap_or_else(|_| "helm".into())
}

pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/ax-operator")
}

/// The operator image imported into the cluster's containerd by e2e/image.sh.
pub fn operator_image() -> (String, String) {
    let image =
        std::env::var("AX_OPERATOR_IMAGE").unwrap_or_else(|_| "localhost/ax-operator:dev".into());
    let slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[slash..].rfind(':') {
        Some(colon) => (
            image[..slash + colon].to_string(),
            image[slash + colon + 1..].to_string(),
        ),
        None => panic!("AX_OPERATOR_IMAGE={image} needs a tag (e.g. localhost/ax-operator:dev)"),
    }
}

pub fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs helm; panics with its output unless it succeeds.
pub fn helm(args: &[&str]) -> String {
    let out = run(&helm_binary(), args);
    assert!(
        out.status.success(),
        "helm {} failed:\n{}{}",
        args.join(" "),
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// One Helm release of the chart. Dropping it uninstalls it (after printing the operator logs when
/// the test failed), so a failed test leaves no operator running for the next one.
pub struct Release {
    pub namespace: String,
    uninstalled: bool,
}

impl Release {
    /// Installs the chart into a fresh namespace with the local image, the short lease of these
    /// tests and `values` merged over that.
    pub async fn install(client: &Client, test: &str, values: serde_json::Value) -> Release {
        uninstall_leftover_releases();
        // Without operator pods (replicaCount 0) the release reconciles nothing and may share the
        // cluster with other operators.
        if values["replicaCount"] != 0 {
            assert_no_other_operator(client).await;
        }
        let namespace = namespace(client, test).await;
        let (repository, tag) = operator_image();
        let mut all = serde_json::json!({
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "operator": {
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewDeadlineSeconds": RENEW_DEADLINE_SECONDS,
                "renewIntervalSeconds": RENEW_SECONDS,
                "logFilter": "info,ax=debug,kube=warn",
            },
        });
        merge(&mut all, values);
        let dir = repo_root().join("target/e2e");
        std::fs::create_dir_all(&dir).expect("create target/e2e");
        let values_file = dir.join(format!("helm-values-{namespace}.yaml"));
        std::fs::write(
            &values_file,
            ax::yaml::to_string(&all).expect("values as YAML"),
        )
        .expect("write the values file");
        let release = Release {
            namespace,
            uninstalled: false,
        };
        let chart = chart_dir();
        helm(&[
            "install",
            RELEASE,
            chart.to_str().expect("chart path is UTF-8"),
            "--namespace",
            &release.namespace,
            "--values",
            values_file.to_str().expect("values path is UTF-8"),
        ]);
        release
    }

    pub fn uninstall(&mut self) {
        self.uninstalled = true;
        helm(&["uninstall", RELEASE, "--namespace", &self.namespace]);
    }

    pub fn service_account(&self) -> String {
        format!("system:serviceaccount:{}:{FULLNAME}", self.namespace)
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_operator_logs(&self.namespace);
        }
        if !self.uninstalled {
            let out = run(
                &helm_binary(),
                &["uninstall", RELEASE, "--namespace", &self.namespace],
            );
            if !out.status.success() {
                eprintln!(
                    "helm uninstall in {} failed: {}",
                    self.namespace,
                    text(&out.stderr)
                );
            }
        }
        if !std::thread::panicking() {
            // Tidy up after a pass; a failure's namespace stays for a look.
            let _ = run_kubectl(
                &["delete", "namespace", &self.namespace, "--wait=false"],
                None,
            );
        }
    }
}

pub fn merge(base: &mut serde_json::Value, over: serde_json::Value) {
    match (base, over) {
        (serde_json::Value::Object(base), serde_json::Value::Object(over)) => {
            for (key, value) in over {
                merge(base.entry(key).or_insert(serde_json::Value::Null), value);
            }
        }
        (base, over) => *base = over,
    }
}

pub fn print_operator_logs(namespace: &str) {
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    let (_, pods, _) = run_kubectl(
        &[
            "-n", namespace, "get", "pods", "-l", &selector, "-o", "name",
        ],
        None,
    );
    for pod in pods.lines() {
        let (_, logs, err) = run_kubectl(&["-n", namespace, "logs", pod, "--tail=60"], None);
        eprintln!("--- {namespace}/{pod} (last 60 lines)\n{logs}{err}");
    }
}

/// Uninstalls releases of the Helm tests that an interrupted run left behind: their cluster-wide RBAC
/// would block the next install, their pods would reconcile beside the next release's.
pub fn uninstall_leftover_releases() {
    let list = helm(&["list", "--all-namespaces", "--output", "json"]);
    let releases: Vec<serde_json::Value> = serde_json::from_str(&list).expect("helm list JSON");
    for release in releases {
        let namespace = release["namespace"].as_str().unwrap_or_default();
        if release["name"] == RELEASE && namespace.starts_with(NAMESPACE_PREFIX) {
            eprintln!("uninstalling release {RELEASE} left in {namespace} by an earlier run");
            helm(&["uninstall", RELEASE, "--namespace", namespace]);
        }
    }
}
