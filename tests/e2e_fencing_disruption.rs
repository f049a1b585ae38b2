//! At most one live worker per task when things break: the operator dies between writing a
//! task's final phase and deleting its pod; the kubelet stops answering under a running task.
//! These tests start their own operators and stop the kubelet, so they run on their own (in
//! e2e/run-tests.sh's serial phase, after the shared operator is stopped).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use ax::api::{AxTask, TaskPhase};
use common::audit::audit;
use common::process::Operator;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};

/// An operator of this test with the credentials of `kubeconfig`, logging to
/// target/e2e/operator-fencing.log.
fn start_operator(identity: &str, kubeconfig: &str) -> Operator {
    Operator::builder(identity)
        .log("operator-fencing.log")
        .kubeconfig(kubeconfig)
        .start()
}

fn operator_kubeconfig() -> String {
    std::env::var("AX_OPERATOR_KUBECONFIG").expect("AX_OPERATOR_KUBECONFIG")
}

fn cluster_sh(args: &[&str]) {
    let status = Command::new(repo_root().join("e2e/cluster.sh"))
        .args(args)
        .status()
        .expect("run e2e/cluster.sh");
    assert!(status.success(), "e2e/cluster.sh {args:?} failed");
}

/// Starts the kubelet again however the test ends.
struct KubeletStopped;

impl KubeletStopped {
    fn now() -> Self {
        cluster_sh(&["kubelet", "stop"]);
        KubeletStopped
    }
}

impl Drop for KubeletStopped {
    fn drop(&mut self) {
        cluster_sh(&["kubelet", "start"]);
    }
}

fn long_task(name: &str, script: &str) -> AxTask {
    example("hello.yaml", name, |v| {
        v["spec"]["type"] = "disruption".into();
        let spec = &mut v["spec"]["template"]["spec"];
        spec["terminationGracePeriodSeconds"] = 2.into();
        spec["containers"][0]["command"] = serde_json::json!(["sh", "-c", script]);
        v["spec"]["retry"] = serde_json::json!({
            "backoff": {"baseSeconds": 1, "factor": 1, "maxSeconds": 1, "jitterMillis": 0}});
    })
}

fn pod_alive(pod: &Option<Pod>) -> bool {
    pod.as_ref().is_some_and(|p| {
        !matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
    })
}

/// A ServiceAccount that may do all the operator does except delete pods: its operator writes
/// Canceled, then its delete fails — the state an operator killed between the two leaves.
fn operator_that_cannot_delete_pods() -> String {
    let role = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: ax-operator-nodelete, namespace: ax-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ax-operator-nodelete}
rules:
  - {apiGroups: [ax.dev], resources: [axtasks, axdags, axqueues], verbs: [get, list, watch, create, patch, update, delete]}
  - {apiGroups: [ax.dev], resources: [axtasks/status, axdags/status, axqueues/status], verbs: [get, patch, update]}
  - {apiGroups: [ax.dev], resources: [axtasks/finalizers], verbs: [update]}
  - {apiGroups: [""], resources: [pods], verbs: [get, list, watch, create, patch]}
  - {apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}
  - {apiGroups: [""], resources: [namespaces], verbs: [get, list, watch]}
  - {apiGroups: ["", events.k8s.io], resources: [events], verbs: [create, patch]}
  - {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update, patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ax-operator-nodelete}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ax-operator-nodelete}
subjects: [{kind: ServiceAccount, name: ax-operator-nodelete, namespace: ax-system}]
"#;
    let (ok, _, err) = run_kubectl(&["apply", "-f", "-"], Some(role));
    assert!(ok, "{err}");
    let file = repo_root().join("target/e2e/ax-operator-nodelete.kubeconfig");
    cluster_sh(&[
        "sa-kubeconfig",
        "ax-system",
        "ax-operator-nodelete",
        file.to_str().unwrap(),
    ]);
    file.to_string_lossy().into_owned()
}

/// The operator wrote Canceled and died before its delete reached the API server: the next
/// operator stops the worker.
#[tokio::test]
async fn a_kill_lost_with_the_operator_is_sent_by_the_next_one() {
    let client = client().await;
    let ns = namespace(&client, "lostkill").await;
    let audit = audit(&client, &ns);
    let restricted = operator_that_cannot_delete_pods();
    let mut operator = start_operator("fencing-nodelete", &restricted);

    create(&client, &ns, &long_task("orphan", "sleep 300")).await;
    wait_phase(&client, &ns, "orphan", TaskPhase::Running, LONG).await;
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    let cancel = Patch::Merge(serde_json::json!({"spec": {"cancel": true}}));
    tasks
        .patch("orphan", &PatchParams::default(), &cancel)
        .await
        .unwrap();
    wait_phase(&client, &ns, "orphan", TaskPhase::Canceled, LONG).await;
    // Its delete is refused; it dies without ever getting it through.
    tokio::time::sleep(Duration::from_secs(3)).await;
    operator.sigkill();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    assert!(
        pod_alive(&pods.get_opt("orphan-1").await.unwrap()),
        "the worker runs on after its task was Canceled"
    );

    let mut operator = start_operator("fencing-next", &operator_kubeconfig());
    wait_pod_gone(&client, &ns, "orphan-1", LONG).await;
    wait_task(&client, &ns, "orphan", LONG, |t| {
        t.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "WorkerTerminating" && c.status == "False")
        })
    })
    .await;
    operator.sigkill();
    audit.assert_one_live_worker("orphan");
    let (ok, _, err) = run_kubectl(
        &[
            "delete",
            "clusterrolebinding,clusterrole",
            "ax-operator-nodelete",
            "--ignore-not-found",
        ],
        None,
    );
    assert!(ok, "{err}");
}

/// The kubelet stops answering for 60 s under a running task whose hard timeout passes meanwhile:
/// the pod stays Terminating (nothing can confirm it stopped), so no second worker starts while the
/// first may still run; once the kubelet is back the task finishes, without a duplicate.
#[tokio::test]
async fn a_kubelet_that_stops_answering_never_gets_a_second_worker_beside_the_first() {
    let client = client().await;
    let ns = namespace(&client, "kubelet").await;
    let audit = audit(&client, &ns);
    let mut operator = start_operator("fencing-kubelet", &operator_kubeconfig());
    let task = example("hello.yaml", "cut-off", |v| {
        v["spec"]["type"] = "disruption".into();
        v["spec"]["timeout"] = serde_json::json!({"hardSeconds": 20});
        v["spec"]["retry"] = serde_json::json!({
            "backoff": {"baseSeconds": 1, "factor": 1, "maxSeconds": 1, "jitterMillis": 0}});
        let spec = &mut v["spec"]["template"]["spec"];
        spec["terminationGracePeriodSeconds"] = 2.into();
        spec["containers"][0]["command"] =
            serde_json::json!(["sh", "-c", "[ \"$AX_ATTEMPT\" -ge 2 ] && exit 0; sleep 300"]);
    });
    create(&client, &ns, &task).await;
    wait_phase(&client, &ns, "cut-off", TaskPhase::Running, LONG).await;
    {
        let _stopped = KubeletStopped::now();
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            let t = wait_task(&client, &ns, "cut-off", LONG, |_| true).await;
            let s = t.status.clone().unwrap();
            assert_eq!(
                s.attempt, 1,
                "no second attempt while the first may run: {:#?}",
                s.history
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let t = wait_task(&client, &ns, "cut-off", LONG, |_| true).await;
        assert_eq!(phase(&t), Some(TaskPhase::TimedOut), "{:#?}", history(&t));
        let waiting = t
            .status
            .as_ref()
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.type_ == "WorkerTerminating" && c.status == "True");
        assert!(waiting, "{:#?}", t.status);
    }
    let t = wait_task(&client, &ns, "cut-off", Duration::from_secs(180), |t| {
        phase(t).is_some_and(TaskPhase::is_terminal)
    })
    .await;
    let s = t.status.clone().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Succeeded), "{:#?}", s.history);
    assert_eq!(s.attempt, 2);
    operator.sigkill();
    audit.assert_one_live_worker("cut-off");
    assert_eq!(
        audit.pod_lifecycle("cut-off"),
        vec![('+', "1".into()), ('-', "1".into()), ('+', "2".into())]
    );
}

/// A worker finishes while no operator runs and its pod is deleted (pod GC, a cleanup script)
/// before the next operator reads it: the pod's outcome finalizer keeps it readable, so the task
/// ends Succeeded on its first attempt instead of taking the missing pod for a lost worker and
/// running the work again.
#[tokio::test]
async fn a_finished_worker_deleted_before_any_operator_reads_it_keeps_its_outcome() {
    let client = client().await;
    let ns = namespace(&client, "deleted-done").await;
    let audit = audit(&client, &ns);
    let mut operator = start_operator("fencing-deleted-a", &operator_kubeconfig());
    create(&client, &ns, &long_task("done", "sleep 8")).await;
    wait_phase(&client, &ns, "done", TaskPhase::Running, LONG).await;
    operator.sigkill();

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + LONG;
    while pod_alive(&pods.get_opt("done-1").await.unwrap()) {
        assert!(Instant::now() < deadline, "the worker did not finish");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (ok, _, err) = run_kubectl(
        &["delete", "pod", "-n", &ns, "done-1", "--wait=false"],
        None,
    );
    assert!(ok, "{err}");
    let held = pods.get_opt("done-1").await.unwrap();
    assert!(
        held.as_ref()
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
        "the deleted pod stays readable until its outcome is recorded: {held:#?}"
    );

    let mut operator = start_operator("fencing-deleted-b", &operator_kubeconfig());
    let t = wait_task(&client, &ns, "done", LONG, |t| {
        phase(t).is_some_and(TaskPhase::is_terminal)
    })
    .await;
    let s = t.status.clone().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Succeeded), "{:#?}", s.history);
    assert_eq!(s.attempt, 1, "the work ran once: {:#?}", s.history);
    wait_pod_gone(&client, &ns, "done-1", LONG).await;
    operator.sigkill();
    audit.assert_one_live_worker("done");
    assert_eq!(
        audit.pod_lifecycle("done"),
        vec![('+', "1".into()), ('-', "1".into())]
    );
}
