//! AxCron across operator outages: stopped for three scheduled times, then started again
//! (misfire policies), and SIGKILLed right after creating a child (no second child for that
//! time). These tests start their own operators (e2e/run-tests.sh stops the shared one first:
//! they are in its OWN_OPERATOR list).

mod common;
mod cron_support;

use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use ax::api::AxCron;
use common::*;
use cron_support::*;
use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;

/// An operator of our own, without leader election (no lease to wait for after a SIGKILL: the
/// point here is what the new process does with the state the old one left).
fn start_operator(tag: &str) -> Child {
    let bin = std::env::var("AX_OPERATOR_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ax-operator").into());
    let kubeconfig = std::env::var("AX_OPERATOR_KUBECONFIG").expect("AX_OPERATOR_KUBECONFIG");
    let log_dir = repo_root().join("target/e2e");
    std::fs::create_dir_all(&log_dir).unwrap();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_dir.join("operator-cron-restart.log"))
        .unwrap();
    Command::new(bin)
        .args(["--identity", tag])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info,ax=debug")
        .env("AX_METRICS_ADDR", "127.0.0.1:0")
        .env("AX_LEADER_ELECT", "false")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start ax-operator")
}

/// SIGTERM and wait: the operator shuts down the way a Deployment rollout stops it.
fn stop(child: &mut Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    child.wait().unwrap();
}

fn sigkill(child: &mut Child) {
    child.kill().expect("SIGKILL the operator");
    child.wait().unwrap();
}

async fn sleep_until(unix: i64) {
    let wait = unix * 1000 - Timestamp::now().as_millisecond();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
}

#[tokio::test]
async fn stopped_for_three_times_skip_catches_up_none_run_once_one_run_all_its_max() {
    const EVERY: i64 = 30;
    let client = client().await;
    let ns = namespace(&client, "cron-outage").await;
    let mut operator = start_operator("cron-outage-a");
    let spec = |misfire: &str| {
        serde_json::json!({
            "schedule": format!("*/{EVERY} * * * * *"),
            "misfirePolicy": misfire,
            "maxCatchUp": 2,
            "successfulRunsHistoryLimit": 20,
            "task": sim_task(200, 0, false),
        })
    };
    for (name, misfire) in [("skip", "Skip"), ("once", "RunOnce"), ("all", "RunAll")] {
        create_cron(&client, &ns, &cron(name, spec(misfire))).await;
    }
    // Stop the operator just after the firing at t0, once all three fired it.
    let t0 = ((Timestamp::now().as_second() + 5) / EVERY + 1) * EVERY;
    for name in ["skip", "once", "all"] {
        let child = format!("{name}-{t0}");
        wait_children(
            &client,
            &ns,
            name,
            Duration::from_secs((EVERY + 40) as u64),
            |c| c.contains_key(&child),
        )
        .await;
    }
    stop(&mut operator);
    assert!(
        Timestamp::now().as_second() < t0 + EVERY,
        "stopped too late to miss three times"
    );

    // Down for t0+30, t0+60, t0+90; back 18 s after the last of them (past its 15 s tolerance)
    // and 12 s before the next regular time.
    sleep_until(t0 + 3 * EVERY + 18).await;
    let mut operator = start_operator("cron-outage-b");
    // The regular firing after the outage shows the operator acted on everything before it.
    let regular = t0 + 4 * EVERY;
    let mut in_outage = BTreeMap::new();
    for name in ["skip", "once", "all"] {
        let child = format!("{name}-{regular}");
        let children = wait_children(&client, &ns, name, Duration::from_secs(90), |c| {
            c.contains_key(&child)
        })
        .await;
        let missed: Vec<(i64, bool)> = children
            .values()
            .filter(|c| scheduled(*c) > t0 && scheduled(*c) < regular)
            .map(|c| {
                let catch_up =
                    c.annotations().get("ax.dev/catch-up").map(String::as_str) == Some("true");
                (scheduled(c) - t0, catch_up)
            })
            .collect();
        in_outage.insert(name, missed);
    }
    sigkill(&mut operator);
    assert_eq!(in_outage["skip"], [], "Skip: no catch-up");
    assert_eq!(
        in_outage["once"],
        [(90, true)],
        "RunOnce: one catch-up, for the latest missed time"
    );
    assert_eq!(
        in_outage["all"],
        [(60, true), (90, true)],
        "RunAll with maxCatchUp 2: the two latest missed times"
    );
    for name in ["skip", "once", "all"] {
        let events = wait_events_of(&client, &ns, "AxCron", name, &["MissedSchedule"]).await;
        let notes: Vec<&str> = events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("MissedSchedule"))
            .filter_map(|e| e.message.as_deref())
            .collect();
        let want = match name {
            "skip" => "3 scheduled times",
            "once" => "stands for them (misfirePolicy RunOnce)",
            _ => "only the latest 2 missed times run",
        };
        assert!(notes.iter().any(|n| n.contains(want)), "{name}: {notes:?}");
    }
}

#[tokio::test]
async fn sigkill_right_after_a_child_is_created_never_makes_a_second_child_for_its_time() {
    let client = client().await;
    let ns = namespace(&client, "cron-kill").await;
    let (audit, watch) = audit_children(&client, &ns);
    let mut operator = start_operator("cron-kill-0");
    // RunAll, so the restarted operator goes back over every time since the status it finds,
    // including the one whose child was just created.
    create_cron(
        &client,
        &ns,
        &cron(
            "kill",
            serde_json::json!({
                "schedule": "*/3 * * * * *",
                "misfirePolicy": "RunAll",
                "maxCatchUp": 5,
                "successfulRunsHistoryLimit": 50,
                "task": sim_task(200, 0, false),
            }),
        ),
    )
    .await;
    let crons: Api<AxCron> = Api::namespaced(client.clone(), &ns);
    let mut lost_writes = 0;
    for round in 1..=3 {
        let seen = audit.lock().unwrap().uids.len();
        let deadline = Instant::now() + LONG;
        let newest = loop {
            {
                let audit = audit.lock().unwrap();
                if audit.uids.len() > seen {
                    break audit.uids.keys().next_back().cloned().unwrap();
                }
            }
            assert!(
                Instant::now() < deadline,
                "no child created in round {round}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        sigkill(&mut operator);
        let cron = crons.get("kill").await.unwrap();
        let handled = cron
            .status
            .and_then(|s| s.last_handled_time)
            .map_or(0, |t| t.as_second());
        let child_time: i64 = newest.rsplit('-').next().unwrap().parse().unwrap();
        if handled < child_time {
            lost_writes += 1;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        operator = start_operator(&format!("cron-kill-{round}"));
    }
    // Some normal firings after the last restart.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let children = task_children(&client, &ns, "kill").await;
    sigkill(&mut operator);
    watch.abort();
    println!("status write lost before the SIGKILL in {lost_writes} of 3 rounds");

    let audit = audit.lock().unwrap();
    for (name, uids) in &audit.uids {
        assert_eq!(uids.len(), 1, "{name} was created {} times", uids.len());
    }
    let mut by_time: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for child in children.values() {
        by_time
            .entry(scheduled(child))
            .or_default()
            .push(child.name_any());
        assert_eq!(child.name_any(), format!("kill-{}", scheduled(child)));
    }
    assert!(
        by_time.values().all(|names| names.len() == 1),
        "{by_time:?}"
    );
    assert!(children.len() >= 4, "{:?}", children.keys());
}
