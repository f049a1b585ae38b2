//! The operator killed with SIGKILL while tasks are Scheduled and Running, then restarted: every
//! task still finishes, and no attempt ever has two pods. This test starts its own operators
//! (e2e/run-tests.sh stops the shared one first).

mod common;

use std::time::{Duration, Instant};

use ax::api::{AxTask, TaskPhase};
use common::process::Operator;
use common::sim::{SimWorker, sim_task_with};
use common::*;
use kube::api::{Api, ListParams};

/// An operator of this test, logging to target/e2e/operator-restart.log.
fn start_operator(identity: &str) -> Operator {
    Operator::builder(identity)
        .log("operator-restart.log")
        .start()
}

/// A task of `seconds` on the real kubelet, or on a simulated node.
fn task(name: &str, sim: bool, seconds: u64) -> AxTask {
    if sim {
        let worker = SimWorker::running_for(seconds * 1000).start_ms(300);
        return sim_task_with(name, "hello", &worker, |_| {});
    }
    example("hello.yaml", name, |v| {
        v["spec"]["template"]["spec"]["containers"][0]["command"] =
            serde_json::json!(["sh", "-c", format!("sleep {seconds}")]);
    })
}

#[tokio::test]
async fn operator_killed_mid_flight_loses_nothing_and_duplicates_nothing() {
    let client = client().await;
    let ns = namespace(&client, "restart").await;

    let (seen, watch) = record_worker_pods(&client, &ns);

    let mut operator = start_operator("restart-a");
    let mut names = Vec::new();
    for i in 0..6 {
        let name = format!("real-{i}");
        create(&client, &ns, &task(&name, false, 6)).await;
        names.push(name);
    }
    for i in 0..40 {
        let name = format!("sim-{i}");
        create(&client, &ns, &task(&name, true, 4 + (i % 4))).await;
        names.push(name);
    }

    // Kill it as soon as tasks are in flight, twice, restarting in between.
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    for round in 0..2 {
        let deadline = Instant::now() + LONG;
        loop {
            let tasks = api.list(&ListParams::default()).await.unwrap().items;
            let in_flight = tasks
                .iter()
                .filter(|t| matches!(phase(t), Some(TaskPhase::Scheduled | TaskPhase::Running)))
                .count();
            if in_flight >= 5 {
                break;
            }
            assert!(Instant::now() < deadline, "tasks never got in flight");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        operator.sigkill();
        tokio::time::sleep(Duration::from_secs(2)).await;
        operator = start_operator(&format!("restart-{round}"));
    }

    for name in &names {
        let t = wait_task(&client, &ns, name, Duration::from_secs(180), |t| {
            phase(t).is_some_and(TaskPhase::is_terminal)
        })
        .await;
        let s = t.status.clone().unwrap();
        assert_eq!(
            s.phase,
            Some(TaskPhase::Succeeded),
            "{name}: {:#?}",
            s.history
        );
        assert_eq!(
            (s.attempt, s.retries),
            (1, 0),
            "{name}: a restart must not cost an attempt: {:#?}",
            s.history
        );
        assert_history_chain(&t);
    }
    operator.sigkill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    watch.abort();

    let seen = seen.lock().unwrap();
    for name in &names {
        let uids = seen
            .get(&(name.clone(), "1".into()))
            .unwrap_or_else(|| panic!("no pod seen for {name}"));
        assert_eq!(uids.len(), 1, "{name} attempt 1 had {} pods", uids.len());
    }
    assert!(
        seen.keys().all(|(_, attempt)| attempt == "1"),
        "only first attempts ran: {:?}",
        seen.keys()
    );
}
