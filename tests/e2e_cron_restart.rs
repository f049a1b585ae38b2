//! AxCron across operator outages: stopped for three scheduled times, then started again
//! (misfire policies), and SIGKILLed right after creating a child (no second child for that
//! time). These tests start their own operators (e2e/run-tests.sh stops the shared one first:
//! they are in its OWN_OPERATOR list).

mod common;
mod cron_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ax::api::AxCron;
use common::process::{Operator, OperatorBuilder};
use common::*;
use cron_support::*;
use jiff::Timestamp;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::ResourceExt;
use kube::api::Api;

/// An operator of our own, without leader election (no lease to wait for after a SIGKILL: the
/// point here is what the new process does with the state the old one left).
fn start_operator(identity: &str) -> Operator {
    operator_builder(identity).start()
}

/// [`start_operator`] with the credentials of `kubeconfig`.
fn start_operator_as(identity: &str, kubeconfig: &str) -> Operator {
    operator_builder(identity).kubeconfig(kubeconfig).start()
}

fn operator_builder(identity: &str) -> OperatorBuilder {
    Operator::builder(identity)
        .log("operator-cron-restart.log")
        .env("AX_LEADER_ELECT", "false")
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
    operator.terminate();
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
    operator.sigkill();
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
        operator.sigkill();
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
    operator.sigkill();
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

/// An operator identity for one test: a ServiceAccount of its namespace bound to the operator's
/// ClusterRole less what `withhold` takes out; [`Self::grant`] gives that back, in the namespace.
/// The cluster-wide role and binding are deleted when it drops.
struct Restricted {
    namespace: String,
    kubeconfig: tempfile::TempPath,
}

impl Restricted {
    /// `withhold`: (resource, verb) pairs taken out of the operator's rules.
    async fn new(client: &kube::Client, ns: &str, withhold: &[(&str, &str)]) -> Restricted {
        let roles: Api<ClusterRole> = Api::all(client.clone());
        let operator = roles
            .get("ax-operator")
            .await
            .expect("the operator's ClusterRole");
        let mut rules: Vec<PolicyRule> = Vec::new();
        for rule in operator.rules.unwrap_or_default() {
            let resources = rule.resources.clone().unwrap_or_default();
            for resource in resources {
                let verbs: Vec<String> = rule
                    .verbs
                    .iter()
                    .filter(|verb| !withhold.contains(&(resource.as_str(), verb.as_str())))
                    .cloned()
                    .collect();
                if !verbs.is_empty() {
                    rules.push(PolicyRule {
                        resources: Some(vec![resource.clone()]),
                        verbs,
                        ..rule.clone()
                    });
                }
            }
        }
        let restricted = Restricted {
            namespace: ns.to_owned(),
            kubeconfig: tempfile::NamedTempFile::new().unwrap().into_temp_path(),
        };
        let name = restricted.cluster_name();
        kubectl_apply(
            &serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "operator", "namespace": ns}}),
        );
        kubectl_apply(
            &serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": rules}),
        );
        kubectl_apply(
            &serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}]}),
        );
        write_service_account_kubeconfig(ns, "operator", &restricted.kubeconfig).await;
        restricted
    }

    fn cluster_name(&self) -> String {
        format!("e2e-{}-operator", self.namespace)
    }

    fn kubeconfig(&self) -> &str {
        self.kubeconfig.to_str().unwrap()
    }

    /// Gives back, in the test's namespace only, what was withheld.
    fn grant(&self, withheld: &[(&str, &str)]) {
        let rules: Vec<serde_json::Value> = withheld
            .iter()
            .map(|(resource, verb)| {
                serde_json::json!({"apiGroups": ["ax.dev"], "resources": [resource], "verbs": [verb]})
            })
            .collect();
        kubectl_apply(
            &serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "withheld", "namespace": self.namespace}, "rules": rules}),
        );
        kubectl_apply(
            &serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "withheld", "namespace": self.namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "withheld"},
            "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": self.namespace}]}),
        );
    }
}

impl Drop for Restricted {
    fn drop(&mut self) {
        let name = self.cluster_name();
        run_kubectl(
            &[
                "delete",
                "clusterrolebinding,clusterrole",
                &name,
                "--ignore-not-found",
            ],
            None,
        );
    }
}

/// Any change of the cron wakes its reconcile (one refused waits 30 s otherwise).
async fn touch(crons: &Api<AxCron>, name: &str) {
    let patch = serde_json::json!({"metadata": {"annotations": {"e2e/touched": Timestamp::now().to_string()}}});
    crons
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

/// The cron's status cannot be written (RBAC refuses it, as an overloaded API server or a lost
/// connection would fail it): before the fix each firing created its child, the write failed, the
/// child ran and was deleted at once (`ttlSecondsAfterFinished: 0`), and the time fired again. The
/// firing is written first now: nothing is created until it lands, then each time once.
#[tokio::test]
async fn a_failing_status_write_creates_nothing_and_no_time_fires_twice() {
    const STATUS: [(&str, &str); 1] = [("axcrons/status", "patch")];
    let client = client().await;
    let ns = namespace(&client, "cron-unwritten").await;
    let restricted = Restricted::new(&client, &ns, &STATUS).await;
    let (audit, watch) = audit_children(&client, &ns);
    let mut operator = start_operator_as("cron-unwritten", restricted.kubeconfig());
    let mut task = sim_task(100, 0, false);
    task["ttlSecondsAfterFinished"] = 0.into();
    create_cron(
        &client,
        &ns,
        &cron(
            "ttl0",
            serde_json::json!({
                "schedule": "*/4 * * * * *",
                "misfirePolicy": "RunAll",
                "maxCatchUp": 3,
                "successfulRunsHistoryLimit": 50,
                "task": task,
            }),
        ),
    )
    .await;
    // Four scheduled times with the status refused, each reconciled again and again: a refusal
    // (403) waits 30 s, a transient failure (a 500, a timeout) 2 s; the touches stand for those
    // retries and for the cron's other events.
    let crons: Api<AxCron> = Api::namespaced(client.clone(), &ns);
    let refused_until = Instant::now() + Duration::from_secs(17);
    while Instant::now() < refused_until {
        touch(&crons, "ttl0").await;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let while_refused = audit.lock().unwrap().uids.clone();
    for (name, uids) in &while_refused {
        assert_eq!(
            uids.len(),
            1,
            "{name} was created {} times while its firing could not be recorded",
            uids.len()
        );
    }
    assert!(
        while_refused.is_empty(),
        "children created while their firing could not be recorded: {while_refused:?}"
    );

    restricted.grant(&STATUS);
    touch(&crons, "ttl0").await;
    // Firings go on: at least four more children, each run and deleted by its TTL.
    let deadline = Instant::now() + LONG;
    loop {
        let created = audit.lock().unwrap().uids.len();
        if created >= 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {created} children after the status could be written"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Time for any second child of those times to show.
    tokio::time::sleep(Duration::from_secs(8)).await;
    operator.sigkill();
    watch.abort();
    let uids = audit.lock().unwrap().uids.clone();
    for (name, uids) in &uids {
        assert_eq!(uids.len(), 1, "{name} was created {} times", uids.len());
    }
    let status = crons.get("ttl0").await.unwrap().status.unwrap();
    let newest = uids
        .keys()
        .map(|n| n.rsplit('-').next().unwrap().parse::<i64>().unwrap())
        .max()
        .unwrap();
    assert!(status.last_handled_time.unwrap().as_second() >= newest);
}

/// A firing recorded whose child could not be created (RBAC refuses the create, as it would be
/// missing after a crash between the write and the create) is created once the create passes,
/// even long after its time: it was decided and recorded in time.
#[tokio::test]
async fn a_recorded_firing_whose_create_failed_is_created_when_it_can_be() {
    const CREATE: [(&str, &str); 1] = [("axtasks", "create")];
    let client = client().await;
    let ns = namespace(&client, "cron-heal").await;
    let restricted = Restricted::new(&client, &ns, &CREATE).await;
    let (audit, watch) = audit_children(&client, &ns);
    let mut operator = start_operator_as("cron-heal", restricted.kubeconfig());
    create_cron(
        &client,
        &ns,
        &cron(
            "heal",
            serde_json::json!({
                "schedule": "*/5 * * * * *",
                "successfulRunsHistoryLimit": 50,
                "task": sim_task(100, 0, false),
            }),
        ),
    )
    .await;
    let crons: Api<AxCron> = Api::namespaced(client.clone(), &ns);
    let recorded: AxCron = wait_for(&client, &ns, "heal", LONG, |c: &AxCron| {
        c.status
            .as_ref()
            .is_some_and(|s| !s.pending_children.is_empty())
    })
    .await;
    let recorded: Vec<String> = recorded
        .status
        .unwrap()
        .pending_children
        .iter()
        .map(|p| p.name.clone())
        .collect();
    // Long past their times (and the 2.5 s tolerance of this schedule).
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        audit.lock().unwrap().uids.is_empty(),
        "created while refused"
    );

    restricted.grant(&CREATE);
    touch(&crons, "heal").await;
    let deadline = Instant::now() + LONG;
    loop {
        let missing: Vec<String> = {
            let audit = audit.lock().unwrap();
            recorded
                .iter()
                .filter(|n| !audit.uids.contains_key(*n))
                .cloned()
                .collect()
        };
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "recorded firings never created: {missing:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_for(&client, &ns, "heal", LONG, |c: &AxCron| {
        c.status
            .as_ref()
            .is_some_and(|s| s.pending_children.is_empty())
    })
    .await;
    operator.sigkill();
    watch.abort();
    let audit = audit.lock().unwrap();
    for (name, uids) in &audit.uids {
        assert_eq!(uids.len(), 1, "{name} was created {} times", uids.len());
    }
}
