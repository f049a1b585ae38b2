//! `kubectl ax` where the operator or the CRDs go away: this file starts and SIGKILLs its own
//! operators and removes a CRD for a moment, so it runs in the serial phase of e2e/run-tests.sh
//! (OWN_OPERATOR), after the shared operator is stopped.

mod common;

use std::time::{Duration, Instant};

use ax::api::{AxTask, TaskPhase};
use common::cli::*;
use common::process::Operator;
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use serde_json::json;

/// An operator of this test, logging to target/e2e/operator-cli-restart.log.
fn start_operator(identity: &str) -> Operator {
    Operator::builder(identity)
        .log("operator-cli-restart.log")
        .start()
}

/// Dead after its first attempt (no retries); any later attempt succeeds.
fn phoenix(name: &str) -> AxTask {
    serde_json::from_value(json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
        "metadata": {"name": name},
        "spec": {
            "type": "cli-restart",
            "retry": {"maxRetries": 0},
            "template": {"spec": {
                "dnsPolicy": "Default",
                "containers": [{
                    "name": "worker", "image": "localhost/ax-busybox:1", "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "[ \"$AX_ATTEMPT\" -ge 2 ]"],
                }],
            }},
        },
    }))
    .unwrap()
}

/// Waits until the operator Lease in ax-system has no live holder (the killed one expired).
async fn wait_lease_expired(client: &Client) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "ax-system");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let lease = leases.get_opt("ax-operator").await.unwrap();
        let state = ax::client::operator::lease_state(
            lease.and_then(|l| l.spec).as_ref(),
            jiff::Timestamp::now(),
        );
        if state.not_running_because().is_some() {
            return;
        }
        assert!(Instant::now() < deadline, "lease still live: {state:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Needs the operator to act on spec.rerun (issue 11, the operator side).
#[tokio::test]
async fn a_rerun_request_survives_an_operator_sigkill() {
    let client = client().await;
    let ns = namespace(&client, "cli-sigkill").await;
    let (seen, watch) = record_worker_pods(&client, &ns);
    let mut operator = start_operator("cli-restart-a");
    for name in ["before-kill", "while-down"] {
        create(&client, &ns, &phoenix(name)).await;
    }
    for name in ["before-kill", "while-down"] {
        wait_phase(&client, &ns, name, TaskPhase::Dead, LONG).await;
    }

    // Requested while the operator runs, then the operator is killed at once.
    ax_async(&ns, &["retry", "before-kill"]).await.ok();
    operator.sigkill();

    // With no live operator, retry refuses (one line, non-zero) unless told to go on.
    wait_lease_expired(&client).await;
    let refused = ax_async(&ns, &["retry", "while-down"]).await;
    let line = refused.one_line_error();
    assert!(
        line.contains("the ax operator is not running: Lease ax-system/ax-operator"),
        "{line}"
    );
    ax_async(&ns, &["retry", "while-down", "--skip-operator-check"])
        .await
        .ok();

    let mut operator = start_operator("cli-restart-b");
    operator_leading(&client).await;
    let r = ax_async(
        &ns,
        &[
            "wait",
            "before-kill",
            "while-down",
            "--for",
            "succeeded",
            "--timeout",
            "2m",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{r:#?}");
    // Give a duplicate every chance to show up.
    tokio::time::sleep(Duration::from_secs(5)).await;
    operator.sigkill();
    watch.abort();

    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    for name in ["before-kill", "while-down"] {
        let t = api.get(name).await.unwrap();
        let s = t.status.clone().unwrap();
        assert_eq!(
            (s.attempt, s.observed_rerun, s.phase),
            (2, 1, Some(TaskPhase::Succeeded)),
            "{name}: exactly one new attempt: {:#?}",
            s.history
        );
        let reruns = history(&t).iter().filter(|h| h.reason == "Rerun").count();
        assert_eq!(reruns, 1, "{name}: {:#?}", s.history);
    }
    let seen = seen.lock().unwrap();
    for name in ["before-kill", "while-down"] {
        for attempt in ["1", "2"] {
            let pods = seen
                .get(&(name.to_string(), attempt.to_string()))
                .map(|u| u.len());
            assert_eq!(pods, Some(1), "{name} attempt {attempt}: {seen:?}");
        }
        assert!(
            !seen.contains_key(&(name.to_string(), "3".to_string())),
            "{name}: no third attempt: {seen:?}"
        );
    }
}

/// Puts a CRD back when the test ends, also when it fails.
struct RestoreCrd(&'static str);

impl Drop for RestoreCrd {
    fn drop(&mut self) {
        let path = repo_root().join("crds").join(self.0);
        let (ok, _, err) = run_kubectl(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                path.to_str().unwrap(),
            ],
            None,
        );
        if !ok {
            // No panic in a drop: it would abort a test that is already failing.
            eprintln!("restoring {} failed: {err}", self.0);
        }
        run_kubectl(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/axqueues.ax.dev",
            ],
            None,
        );
    }
}

#[tokio::test]
async fn missing_crds_are_named() {
    // AxQueues are few and cluster-scoped (the operator recreates `default`): the cheapest CRD
    // to take away for a moment.
    let _restore = RestoreCrd("axqueues.yaml");
    let (ok, _, err) = run_kubectl(
        &[
            "delete",
            "crd",
            "axqueues.ax.dev",
            "--wait=true",
            "--timeout=60s",
        ],
        None,
    );
    assert!(ok, "delete the AxQueue CRD: {err}");
    // Discovery catches up with the deletion shortly after.
    let deadline = Instant::now() + Duration::from_secs(30);
    let line = loop {
        let run = ax_with(&["top"], None, &[]);
        if run.code != 0 {
            break run.one_line_error();
        }
        assert!(Instant::now() < deadline, "top still works: {run:#?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        line,
        "error: the API server does not serve axqueues.ax.dev: the ax CRDs are not installed (kubectl apply --server-side -f crds/, or helm install charts/ax-operator)"
    );
}
