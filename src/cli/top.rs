//! `kubectl ax top`: every AxQueue at a glance, from its status as the operator wrote it: pending
//! tasks per bucket, running / concurrency, open circuits, retry tokens, dispatched and dead
//! totals; then, for queues with keys (`fairness`, `keyConcurrency`, `keyRate`), their top
//! namespaces' running and waiting tasks. `--watch` redraws on each change of a queue (an API
//! watch). `queue_row` and `render` are pure; `run` reads (client required).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};

use futures::TryStreamExt;
use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ListParams;
use kube::runtime::watcher;

use crate::api::AxQueue;
use crate::client::ctx::Ctx;
use crate::client::error::{ClientError, Op, Resource, from_kube, watch_error};
use crate::client::format::time;
use crate::core::conditions;

use super::args::TopArgs;
use super::format;
use super::output::write_objects;

pub const HEADERS: [&str; 10] = [
    "QUEUE",
    "CRITICAL",
    "HIGH",
    "NORMAL",
    "LOW",
    "RUNNING",
    "OPEN-CIRCUITS",
    "RETRY-TOKENS",
    "DISPATCHED",
    "DEAD",
];

/// One queue under `HEADERS`; RUNNING is `running/concurrency`, an invalid spec is flagged.
pub fn queue_row(queue: &AxQueue) -> Vec<String> {
    let status = queue.status.clone().unwrap_or_default();
    let invalid = conditions::find(&status.conditions, conditions::INVALID_SPEC, true).is_some();
    let name = if invalid {
        format!("{} ({})", queue.name_any(), conditions::INVALID_SPEC)
    } else if queue.spec.stop_policy.holds() {
        format!("{} ({})", queue.name_any(), queue.spec.stop_policy.as_str())
    } else {
        queue.name_any()
    };
    vec![
        name,
        status.pending.critical.to_string(),
        status.pending.high.to_string(),
        status.pending.normal.to_string(),
        status.pending.low.to_string(),
        format!("{}/{}", status.running, queue.spec.concurrency),
        status.open_circuits.join(","),
        status.retry_tokens.to_string(),
        status.dispatched.to_string(),
        status.dead.to_string(),
    ]
}

pub const KEY_HEADERS: [&str; 4] = ["QUEUE", "KEY", "RUNNING", "WAITING"];

pub fn render(queues: &[AxQueue]) -> String {
    let rows: Vec<Vec<String>> = queues.iter().map(queue_row).collect();
    let mut text = format::table(&HEADERS, &rows);
    let keys: Vec<Vec<String>> = queues
        .iter()
        .flat_map(|q| {
            let keys = q
                .status
                .as_ref()
                .map(|s| s.keys.clone())
                .unwrap_or_default();
            keys.into_iter().map(move |k| {
                vec![
                    q.name_any(),
                    k.key,
                    k.running.to_string(),
                    k.waiting.to_string(),
                ]
            })
        })
        .collect();
    if !keys.is_empty() {
        text.push('\n');
        text.push_str(&format::table(&KEY_HEADERS, &keys));
    }
    text
}

fn wanted(args: &TopArgs, queue: &AxQueue) -> bool {
    args.queues.is_empty() || args.queues.contains(&queue.name_any())
}

pub async fn run(ctx: &Ctx, args: &TopArgs) -> Result<(), ClientError> {
    let op = Op::new("list", Resource::Queue);
    if !args.watch {
        let mut queues: Vec<AxQueue> = ctx
            .queues()
            .list(&ListParams::default())
            .await
            .map_err(|e| from_kube(&op, e))?
            .items
            .into_iter()
            .filter(|q| wanted(args, q))
            .collect();
        if let Some(missing) = args
            .queues
            .iter()
            .find(|name| !queues.iter().any(|q| q.name_any() == **name))
        {
            return Err(ClientError::NotFound {
                resource: Resource::Queue,
                name: missing.clone(),
                namespace: None,
            });
        }
        queues.sort_by_key(|q| q.name_any());
        let mut out = std::io::stdout().lock();
        if !write_objects(&mut out, args.output.as_ref(), "axqueue", &queues, false)? {
            out.write_all(render(&queues).as_bytes())?;
        }
        return Ok(());
    }
    let watch_op = Op::new("watch", Resource::Queue);
    let stream = watcher(ctx.queues(), watcher::Config::default());
    let mut stream = std::pin::pin!(stream);
    let mut queues: BTreeMap<String, AxQueue> = BTreeMap::new();
    let mut listing: BTreeMap<String, AxQueue> = BTreeMap::new();
    let mut ready = false;
    let clear = std::io::stdout().is_terminal();
    loop {
        let event = match stream.try_next().await {
            Ok(Some(e)) => e,
            Ok(None) => return Ok(()),
            // Before the first list, an error says why nothing can be watched (403, no CRDs);
            // later ones are interruptions the watcher recovers from.
            Err(e) if !ready => return Err(watch_error(&watch_op, e)),
            Err(e) => {
                eprintln!(
                    "warning: watch interrupted ({}); resuming",
                    watch_error(&watch_op, e)
                );
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        match event {
            watcher::Event::Init => listing.clear(),
            watcher::Event::InitApply(q) => {
                listing.insert(q.name_any(), q);
            }
            watcher::Event::InitDone => {
                queues = std::mem::take(&mut listing);
                ready = true;
            }
            watcher::Event::Apply(q) => {
                queues.insert(q.name_any(), q);
            }
            watcher::Event::Delete(q) => {
                queues.remove(&q.name_any());
            }
        }
        if !ready {
            continue;
        }
        let shown: Vec<AxQueue> = queues
            .values()
            .filter(|q| wanted(args, q))
            .cloned()
            .collect();
        let mut out = std::io::stdout().lock();
        if clear {
            out.write_all(b"\x1b[H\x1b[2J")?;
        }
        writeln!(out, "{}", time(Timestamp::now()))?;
        out.write_all(render(&shown).as_bytes())?;
        if !clear {
            writeln!(out)?;
        }
        out.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_shows_the_status_counts_and_concurrency() {
        let q: AxQueue = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxQueue",
            "metadata": {"name": "batch"},
            "spec": {"concurrency": 10},
            "status": {"pending": {"critical": 1, "high": 2, "normal": 3, "low": 4},
                       "running": 7, "openCircuits": ["report", "mail"], "openCircuitCount": 2,
                       "retryTokens": 12, "dispatched": 99, "dead": 5},
        }))
        .unwrap();
        assert_eq!(
            queue_row(&q),
            [
                "batch",
                "1",
                "2",
                "3",
                "4",
                "7/10",
                "report,mail",
                "12",
                "99",
                "5"
            ]
        );
        let text = render(&[q]);
        assert!(text.starts_with("QUEUE"), "{text}");
        assert!(!text.contains("KEY"), "{text}");
    }

    #[test]
    fn a_queue_with_keys_lists_its_top_namespaces_below() {
        let q: AxQueue = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxQueue",
            "metadata": {"name": "shared"},
            "spec": {"concurrency": 10, "fairness": {}},
            "status": {"running": 3, "keys": [
                {"key": "team-a", "running": 2, "waiting": 40},
                {"key": "team-b", "running": 1, "waiting": 0},
            ]},
        }))
        .unwrap();
        let text = render(&[q]);
        let lines: Vec<&str> = text.lines().collect();
        let header = lines
            .iter()
            .position(|l| l.starts_with("QUEUE") && l.contains("KEY"))
            .unwrap_or_else(|| panic!("no key table: {text}"));
        let words = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(words(lines[header + 1]), ["shared", "team-a", "2", "40"]);
        assert_eq!(words(lines[header + 2]), ["shared", "team-b", "1", "0"]);
    }

    #[test]
    fn an_invalid_or_unreported_queue_still_renders() {
        let q: AxQueue = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxQueue",
            "metadata": {"name": "new"},
            "spec": {},
            "status": {"conditions": [{"type": "InvalidSpec", "status": "True", "reason": "BadTimeZone",
                                        "lastTransitionTime": "2025-01-01T00:00:00Z"}]},
        }))
        .unwrap();
        let row = queue_row(&q);
        assert_eq!(row[0], "new (InvalidSpec)");
        assert_eq!(row[5], "0/100");
        assert_eq!(row[6], "");
    }
}
