//! AxCron on the real cluster with the operator started by e2e/run-tests.sh: children are real
//! AxTasks and AxDags on the simulated nodes, fired on schedules with a seconds field so that a
//! test proves a policy in seconds rather than minutes (the every-minute test takes three).

mod common;
mod cron_support;

use std::collections::BTreeSet;
use std::time::Duration;

use ax::api::{AxCron, AxTask, DagPhase, TaskPhase};
use common::*;
use cron_support::*;
use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

#[tokio::test]
async fn every_minute_one_child_per_minute_named_after_its_time() {
    let client = client().await;
    let ns = namespace(&client, "cron-minute").await;
    let (audit, watch) = audit_children(&client, &ns);
    let manifest = example_of::<AxCron>("cron-hello.yaml", "every-minute", |v| {
        v["spec"]["task"]["template"] = sim_template(500, 0, false);
        v["spec"]["successfulRunsHistoryLimit"] = 10.into();
    });
    let created = create_cron(&client, &ns, &manifest).await;
    let t0 = created.metadata.creation_timestamp.clone().unwrap().0;
    let first = next_minute(t0);
    let minutes = [first, first + 60, first + 120];
    let expected: BTreeSet<String> = minutes
        .iter()
        .map(|m| format!("every-minute-{m}"))
        .collect();

    // Three minutes and a little: every child of the three minutes Succeeded.
    let wait = Duration::from_secs((first + 120 - Timestamp::now().as_second()).max(0) as u64 + 90);
    let children = wait_children(&client, &ns, "every-minute", wait, |children| {
        expected.iter().all(|name| {
            children
                .get(name)
                .is_some_and(|c| phase(c) == Some(TaskPhase::Succeeded))
        })
    })
    .await;
    let in_window: BTreeSet<String> = children
        .values()
        .filter(|c| scheduled(*c) <= first + 120)
        .map(|c| c.name_any())
        .collect();
    assert_eq!(in_window, expected, "exactly one child per minute");
    for minute in minutes {
        let child = &children[&format!("every-minute-{minute}")];
        assert_eq!(scheduled(child), minute);
        let owner = &child.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), Some(owner.uid.clone())),
            ("AxCron", created.uid())
        );
        // Created at its time (a little after, never before).
        let born = child
            .metadata
            .creation_timestamp
            .clone()
            .unwrap()
            .0
            .as_second();
        assert!(
            (minute..minute + 15).contains(&born),
            "{minute} created at {born}"
        );
    }
    {
        let audit = audit.lock().unwrap();
        for name in &expected {
            assert_eq!(
                audit.uids[name].len(),
                1,
                "{name} was created more than once"
            );
        }
    }
    watch.abort();

    let cron: AxCron = wait_for(&client, &ns, "every-minute", LONG, |c: &AxCron| {
        c.status
            .as_ref()
            .is_some_and(|s| s.last_successful_time.is_some() && s.next_schedule_time.is_some())
    })
    .await;
    assert_eq!(
        cron_condition(&cron, "InvalidSpec").unwrap().status,
        "False"
    );
    let status = cron.status.unwrap();
    assert!(status.last_schedule_time.unwrap().as_second() >= first + 120);
    assert_eq!(status.next_schedule_time.unwrap().as_second() % 60, 0);
    wait_events_of(&client, &ns, "AxCron", "every-minute", &["Fired"]).await;

    // The printer columns, with the next time readable (a string, not a date).
    let (ok, out, err) = run_kubectl(&["get", "axc", "every-minute", "-n", &ns], None);
    assert!(ok, "{err}");
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "NEXT", "AGE"
        ]
    );
    assert!(
        out.contains("Europe/Berlin") && !out.contains("<invalid>"),
        "{out}"
    );
    delete_cron(&client, &ns, "every-minute").await;
}

#[tokio::test]
async fn forbid_never_overlaps_and_the_skipped_firing_is_an_event() {
    let client = client().await;
    let ns = namespace(&client, "cron-forbid").await;
    let (audit, watch) = audit_children(&client, &ns);
    // A child every 4 s that runs for 9 s: the firings in between are skipped.
    create_cron(
        &client,
        &ns,
        &cron(
            "forbid",
            serde_json::json!({
                "schedule": "*/4 * * * * *",
                "concurrencyPolicy": "Forbid",
                "successfulRunsHistoryLimit": 10,
                "task": sim_task(9000, 0, false),
            }),
        ),
    )
    .await;
    let children = wait_children(&client, &ns, "forbid", LONG, |children| {
        children
            .values()
            .filter(|c| phase(c) == Some(TaskPhase::Succeeded))
            .count()
            >= 2
    })
    .await;
    delete_cron(&client, &ns, "forbid").await;
    let events = wait_events_of(&client, &ns, "AxCron", "forbid", &["SkippedConcurrent"]).await;
    let skipped = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("SkippedConcurrent"))
        .unwrap();
    assert!(
        skipped
            .message
            .as_deref()
            .is_some_and(|m| m.contains("is still active (concurrencyPolicy Forbid)")),
        "{skipped:?}"
    );
    for child in children.values() {
        assert_eq!(scheduled(child) % 4, 0, "{}", child.name_any());
        assert_eq!(child.name_any(), format!("forbid-{}", scheduled(child)));
    }
    watch.abort();
    let audit = audit.lock().unwrap();
    assert_eq!(
        audit.max_active, 1,
        "two children were active at once: {:?}",
        audit.phases
    );
}

/// Forbid, and the running child is canceled while its worker ignores SIGTERM for its 12 s grace
/// period: the child is Canceled at once but not final, so no firing starts a second worker of the
/// job beside it; once the worker is gone the next firing runs.
#[tokio::test]
async fn forbid_waits_for_a_canceled_childs_worker_to_stop() {
    let client = client().await;
    let ns = namespace(&client, "cron-forbid-stop").await;
    let mut task = sim_task(0, 0, true);
    let spec = &mut task["template"]["spec"];
    spec["terminationGracePeriodSeconds"] = 12.into();
    spec["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "AX_SIM_IGNORE_SIGTERM", "value": "true"}));
    create_cron(
        &client,
        &ns,
        &cron(
            "stopping",
            serde_json::json!({
                "schedule": "*/3 * * * * *",
                "concurrencyPolicy": "Forbid",
                "task": task,
            }),
        ),
    )
    .await;
    let children = wait_children(&client, &ns, "stopping", LONG, |children| {
        children
            .values()
            .any(|c| phase(c) == Some(TaskPhase::Running))
    })
    .await;
    let first = children
        .values()
        .find(|c| phase(c) == Some(TaskPhase::Running))
        .unwrap()
        .name_any();
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    let cancel = Patch::Merge(serde_json::json!({"spec": {"cancel": true}}));
    // Timed from the cancel, not counted in looks: beside 16 other tests one look may take seconds.
    let canceled_at = std::time::Instant::now();
    tasks
        .patch(&first, &PatchParams::default(), &cancel)
        .await
        .unwrap();
    wait_phase(&client, &ns, &first, TaskPhase::Canceled, LONG).await;

    // While the canceled child's worker lives, nothing else is created.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let worker = format!("{first}-1");
    let mut looked = 0;
    while pods.get_opt(&worker).await.unwrap().is_some_and(|p| {
        !matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
    }) {
        let children = task_children(&client, &ns, "stopping").await;
        assert_eq!(
            children.keys().collect::<Vec<_>>(),
            [&first],
            "a child fired while the canceled one's worker still runs"
        );
        looked += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The worker ignores SIGTERM for its 12 s grace period.
    let lived = canceled_at.elapsed();
    assert!(
        looked >= 1 && lived > Duration::from_secs(8),
        "the worker stopped at once ({looked} looks, gone {lived:?} after the cancel); the test showed nothing"
    );
    // Then the next firing runs.
    wait_children(&client, &ns, "stopping", LONG, |children| {
        children.keys().any(|name| *name != first)
    })
    .await;
    delete_cron(&client, &ns, "stopping").await;
}

#[tokio::test]
async fn replace_cancels_the_running_child_and_the_new_one_runs() {
    let client = client().await;
    let ns = namespace(&client, "cron-replace").await;
    // Children that never finish by themselves.
    create_cron(
        &client,
        &ns,
        &cron(
            "replace",
            serde_json::json!({
                "schedule": "*/6 * * * * *",
                "concurrencyPolicy": "Replace",
                "task": sim_task(0, 0, true),
            }),
        ),
    )
    .await;
    let first = wait_children(&client, &ns, "replace", LONG, |children| {
        children
            .values()
            .any(|c| phase(c) == Some(TaskPhase::Running))
    })
    .await;
    let first = first
        .values()
        .find(|c| phase(c) == Some(TaskPhase::Running))
        .unwrap()
        .name_any();
    let canceled = wait_phase(&client, &ns, &first, TaskPhase::Canceled, LONG).await;
    assert!(canceled.spec.cancel, "canceled through spec.cancel");
    // The child that replaced it runs.
    let children = wait_children(&client, &ns, "replace", LONG, |children| {
        children
            .values()
            .any(|c| scheduled(c) > scheduled(&canceled) && phase(c) == Some(TaskPhase::Running))
    })
    .await;
    let running: Vec<&AxTask> = children
        .values()
        .filter(|c| !phase(c).is_some_and(TaskPhase::is_terminal))
        .collect();
    assert!(
        running.len() <= 2,
        "{:?}",
        running.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    );
    wait_events_of(&client, &ns, "AxCron", "replace", &["Fired", "Replaced"]).await;
    delete_cron(&client, &ns, "replace").await;
}

#[tokio::test]
async fn a_dag_template_creates_a_dag_that_runs_to_completion_at_each_firing() {
    let client = client().await;
    let ns = namespace(&client, "cron-dag").await;
    let manifest = example_of::<AxCron>("cron-dag.yaml", "etl", |v| {
        let spec = &mut v["spec"];
        spec["schedule"] = "*/8 * * * * *".into();
        spec["misfirePolicy"] = "Skip".into();
        spec["successfulRunsHistoryLimit"] = 10.into();
        for task in spec["dag"]["tasks"].as_array_mut().unwrap() {
            task["spec"]["template"] = sim_template(300, 0, false);
        }
    });
    create_cron(&client, &ns, &manifest).await;
    let deadline = std::time::Instant::now() + LONG;
    let dags = loop {
        let dags = dag_children(&client, &ns, "etl").await;
        let done = dags
            .values()
            .filter(|d| d.status.as_ref().and_then(|s| s.phase) == Some(DagPhase::Succeeded))
            .count();
        if done >= 2 {
            break dags;
        }
        assert!(std::time::Instant::now() < deadline, "DAGs: {dags:#?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for dag in dags
        .values()
        .filter(|d| d.status.as_ref().and_then(|s| s.phase) == Some(DagPhase::Succeeded))
    {
        assert_eq!(dag.name_any(), format!("etl-{}", scheduled(dag)));
        // `*/8` steps within each minute: :00, :08, … :56, then :00 again.
        assert_eq!(scheduled(dag) % 60 % 8, 0);
        let status = dag.status.as_ref().unwrap();
        assert_eq!(status.progress.as_deref(), Some("2/2"));
        // Its tasks ran through the DAG controller: extract, then load.
        let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
        let extract = tasks
            .get(&format!("{}-extract", dag.name_any()))
            .await
            .unwrap();
        let load = tasks
            .get(&format!("{}-load", dag.name_any()))
            .await
            .unwrap();
        assert_eq!(phase(&extract), Some(TaskPhase::Succeeded));
        assert_eq!(phase(&load), Some(TaskPhase::Succeeded));
        let (extracted, loading) = (
            extract.status.as_ref().unwrap().finished_at.unwrap(),
            load.metadata.creation_timestamp.clone().unwrap().0,
        );
        assert!(
            loading.as_second() >= extracted.as_second(),
            "load before extract finished"
        );
    }
    delete_cron(&client, &ns, "etl").await;
}

#[tokio::test]
async fn history_limits_delete_the_oldest_finished_children_and_their_pods() {
    let client = client().await;
    let ns = namespace(&client, "cron-history").await;
    let spec = |task: serde_json::Value| {
        serde_json::json!({
            "schedule": "*/2 * * * * *",
            "successfulRunsHistoryLimit": 2,
            "failedRunsHistoryLimit": 1,
            "task": task,
        })
    };
    create_cron(&client, &ns, &cron("ok", spec(sim_task(100, 0, false)))).await;
    create_cron(&client, &ns, &cron("bad", spec(sim_task(100, 1, false)))).await;

    // The first child of each, finished, and its pod.
    let first_ok = wait_children(&client, &ns, "ok", LONG, |c| {
        c.values().any(|t| phase(t) == Some(TaskPhase::Succeeded))
    })
    .await;
    let first_ok = first_ok.keys().next().unwrap().clone();
    let first_bad = wait_children(&client, &ns, "bad", LONG, |c| {
        c.values().any(|t| phase(t) == Some(TaskPhase::Dead))
    })
    .await;
    let first_bad = first_bad.keys().next().unwrap().clone();
    assert!(!pods_of(&client, &ns, &first_ok).await.is_empty());

    // A few firings later: only the newest finished children are left, the first is gone.
    for (cron, first, keep, outcome) in [
        ("ok", &first_ok, 2, TaskPhase::Succeeded),
        ("bad", &first_bad, 1, TaskPhase::Dead),
    ] {
        let children = wait_children(&client, &ns, cron, LONG, |c| {
            let finished = c.values().filter(|t| phase(t) == Some(outcome)).count();
            !c.contains_key(first.as_str()) && c.len() >= keep && finished <= keep
        })
        .await;
        let finished = children
            .values()
            .filter(|t| phase(t).is_some_and(TaskPhase::is_terminal))
            .count();
        assert!(finished <= keep, "{cron}: {:?}", children.keys());
    }
    delete_cron(&client, &ns, "ok").await;
    delete_cron(&client, &ns, "bad").await;
    // Their pods went with them (ownership).
    let deadline = std::time::Instant::now() + LONG;
    while !pods_of(&client, &ns, &first_ok).await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "pods of {first_ok} left"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    wait_events_of(&client, &ns, "AxCron", "ok", &["DeletedHistory"]).await;
}

#[tokio::test]
async fn invalid_schedules_are_rejected_or_reported_naming_the_field() {
    let client = client().await;
    let ns = namespace(&client, "cron-invalid").await;
    let api: Api<AxCron> = Api::namespaced(client.clone(), &ns);
    let task = sim_task(100, 0, false);

    // What the schema can say, the API server says.
    for (name, spec, says) in [
        (
            "three-fields",
            serde_json::json!({"schedule": "* * *", "task": task}),
            "spec.schedule",
        ),
        (
            "both",
            serde_json::json!({"schedule": "@daily", "task": task, "dag": {"tasks": []}}),
            "spec",
        ),
        ("neither", serde_json::json!({"schedule": "@daily"}), "spec"),
    ] {
        match api.create(&Default::default(), &cron(name, spec)).await {
            Err(kube::Error::Api(e)) => {
                assert_eq!(e.code, 422, "{name}: {e:?}");
                assert!(e.message.contains(says), "{name}: {}", e.message);
            }
            other => panic!("{name} was not rejected: {other:?}"),
        }
    }

    // The rest, the operator says in InvalidSpec.
    create_cron(
        &client,
        &ns,
        &cron(
            "day-32",
            serde_json::json!({"schedule": "0 0 32 * *", "task": task}),
        ),
    )
    .await;
    create_cron(
        &client,
        &ns,
        &example_of::<AxCron>("cron-invalid-schedule.yaml", "never", |_| {}),
    )
    .await;
    create_cron(
        &client,
        &ns,
        &cron(
            "mars",
            serde_json::json!({"schedule": "@daily", "timeZone": "Mars/Olympus_Mons", "task": task}),
        ),
    )
    .await;
    for (name, message) in [
        ("day-32", "field 3 (day of month): 32 out of range 1-31"),
        ("never", "the schedule never fires, February has no day 31"),
        (
            "mars",
            "timeZone: \"Mars/Olympus_Mons\" is not an IANA time zone",
        ),
    ] {
        let cron = wait_for(&client, &ns, name, LONG, |c: &AxCron| {
            cron_condition(c, "InvalidSpec").is_some_and(|c| c.status == "True")
        })
        .await;
        let condition = cron_condition(&cron, "InvalidSpec").unwrap();
        assert!(condition.message.contains(message), "{name}: {condition:?}");
        assert!(cron.status.as_ref().unwrap().next_schedule_time.is_none());
        wait_events_of(&client, &ns, "AxCron", name, &["InvalidSpec"]).await;
    }

    // Fixed, it runs.
    api.patch(
        "day-32",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"schedule": "*/2 * * * * *"}})),
    )
    .await
    .unwrap();
    wait_for(&client, &ns, "day-32", LONG, |c: &AxCron| {
        cron_condition(c, "InvalidSpec").is_some_and(|c| c.status == "False")
            && c.status
                .as_ref()
                .is_some_and(|s| s.next_schedule_time.is_some())
    })
    .await;
    wait_children(&client, &ns, "day-32", LONG, |c| !c.is_empty()).await;
    assert!(task_children(&client, &ns, "never").await.is_empty());
    for name in ["day-32", "never", "mars"] {
        delete_cron(&client, &ns, name).await;
    }
}

#[tokio::test]
async fn a_suspended_cron_creates_nothing_until_resumed() {
    let client = client().await;
    let ns = namespace(&client, "cron-suspend").await;
    create_cron(
        &client,
        &ns,
        &cron(
            "paused",
            serde_json::json!({"schedule": "*/2 * * * * *", "suspend": true, "task": sim_task(100, 0, false)}),
        ),
    )
    .await;
    let cron = wait_for(&client, &ns, "paused", LONG, |c: &AxCron| {
        cron_condition(c, "Suspended").is_some_and(|c| c.status == "True")
    })
    .await;
    assert!(cron.status.as_ref().unwrap().next_schedule_time.is_none());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(task_children(&client, &ns, "paused").await.is_empty());

    let api: Api<AxCron> = Api::namespaced(client.clone(), &ns);
    api.patch(
        "paused",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"suspend": false}})),
    )
    .await
    .unwrap();
    let children = wait_children(&client, &ns, "paused", LONG, |c| !c.is_empty()).await;
    let resumed = wait_for(&client, &ns, "paused", LONG, |c: &AxCron| {
        cron_condition(c, "Suspended").is_some_and(|c| c.status == "False")
    })
    .await;
    // Misfires while suspended are skipped (misfirePolicy Skip): the first child is a regular
    // firing after the resume.
    let resumed_at = cron_condition(&resumed, "Suspended")
        .unwrap()
        .last_transition_time
        .0
        .as_second();
    for child in children.values() {
        assert!(
            child.annotations().get("ax.dev/catch-up").is_none(),
            "{}",
            child.name_any()
        );
        assert!(
            scheduled(child) >= resumed_at - 2,
            "{} before the resume at {resumed_at}",
            child.name_any()
        );
    }
    delete_cron(&client, &ns, "paused").await;
}
