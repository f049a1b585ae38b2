//! Tests of the trace context and of the spans built from a history: a retried task's spans by
//! hand, and a property test over random legal histories written in random batches — each span is
//! built exactly once whatever the batches, with one id, inside its parent's run.

use std::collections::{BTreeMap, BTreeSet};

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

use super::*;
use crate::api::{AttemptRecord, Condition, FailureKind};
use crate::core::task::{LEGAL, Reason};

use TaskPhase::{Canceled, Dead, Failed, Pending, Running, Scheduled, Succeeded, TimedOut};

const UID: &str = "6a1f0e0c-0000-4000-8000-000000000001";
const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_900_000_000 + secs).expect("in range")
}

fn subject() -> Subject<'static> {
    Subject {
        namespace: "ns",
        name: "job",
        uid: UID,
        created: Some(t(0)),
        task_type: "report",
        queue: "default",
        priority: "Normal",
    }
}

fn entry(
    secs: i64,
    from: Option<TaskPhase>,
    to: TaskPhase,
    attempt: i32,
    reason: &str,
) -> HistoryEntry {
    HistoryEntry {
        time: t(secs),
        from,
        to,
        attempt,
        reason: reason.into(),
        message: format!("{reason} at {secs}"),
        actor: "test".into(),
    }
}

fn record(attempt: i32, scheduled: i64, exit_code: Option<i32>) -> AttemptRecord {
    AttemptRecord {
        attempt,
        pod: format!("job-{attempt}"),
        node: Some("sim-1".into()),
        scheduled_at: t(scheduled),
        started_at: Some(t(scheduled + 1)),
        finished_at: None,
        outcome: None,
        exit_code,
        failure_kind: exit_code
            .filter(|c| *c != 0)
            .map(|_| FailureKind::Retryable),
        reason: None,
    }
}

#[test]
fn a_traceparent_parses_and_bad_ones_are_refused() {
    let parent = TraceParent::parse(PARENT).unwrap();
    assert_eq!(parent.trace_id, "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(parent.span_id, "b7ad6b7169203331");
    assert!(parent.sampled);
    assert!(
        !TraceParent::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")
            .unwrap()
            .sampled
    );
    for bad in [
        "",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        "zz-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ] {
        assert!(TraceParent::parse(bad).is_err(), "{bad:?} parsed");
    }
}

#[test]
fn a_task_continues_its_submitters_trace_or_derives_its_own_from_its_uid() {
    let (ctx, error) = context_of(UID, Some(PARENT), None, Sampler::Always);
    assert_eq!(error, None);
    assert_eq!(ctx.trace_id, "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(ctx.parent_span_id.as_deref(), Some("b7ad6b7169203331"));
    let (own, _) = context_of(UID, None, None, Sampler::Always);
    assert_eq!(
        own,
        context_of(UID, None, None, Sampler::Always).0,
        "the standby derives the same"
    );
    assert_eq!(own.trace_id.len(), 32);
    assert_eq!(own.parent_span_id, None);
    assert_ne!(
        own.trace_id,
        context_of("another-uid", None, None, Sampler::Always)
            .0
            .trace_id
    );
    let (fallback, error) = context_of(UID, Some("garbage"), None, Sampler::Always);
    assert!(error.is_some());
    assert_eq!(fallback, own);
}

#[test]
fn parentbased_follows_the_submitter_and_ratio_the_trace_id() {
    let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    assert!(
        !context_of(UID, Some(unsampled), None, Sampler::ParentBased(1.0))
            .0
            .sampled
    );
    assert!(
        context_of(UID, Some(PARENT), None, Sampler::ParentBased(0.0))
            .0
            .sampled
    );
    assert!(
        !context_of(UID, None, None, Sampler::ParentBased(0.0))
            .0
            .sampled
    );
    assert!(
        context_of(UID, Some(unsampled), None, Sampler::Always)
            .0
            .sampled
    );
    // About a quarter of many uids at 0.25.
    let sampled = (0..4000)
        .filter(|i| {
            context_of(&format!("uid-{i}"), None, None, Sampler::Ratio(0.25))
                .0
                .sampled
        })
        .count();
    assert!((800..1200).contains(&sampled), "{sampled} of 4000");
    assert!(Sampler::parse("ratio", 1.5).is_err());
    assert!(Sampler::parse("sometimes", 0.5).is_err());
    assert_eq!(Sampler::parse("always", 1.0), Ok(Sampler::Always));
}

/// Attempt 1 fails, attempt 2 fails, attempt 3 succeeds; written in five batches as the
/// reconciler would.
fn retried_twice() -> (AxTaskStatus, Vec<Vec<HistoryEntry>>) {
    let batches = vec![
        vec![entry(0, None, Pending, 0, "Queued")],
        vec![
            entry(2, Some(Pending), Scheduled, 1, "Dispatched"),
            entry(3, Some(Scheduled), Running, 1, "WorkerRunning"),
            entry(5, Some(Running), Failed, 1, "ExitCode"),
            entry(5, Some(Failed), Pending, 1, Reason::RetryScheduled.as_str()),
        ],
        vec![
            entry(7, Some(Pending), Scheduled, 2, "Dispatched"),
            entry(8, Some(Scheduled), Running, 2, "WorkerRunning"),
        ],
        vec![
            entry(9, Some(Running), Failed, 2, "ExitCode"),
            entry(9, Some(Failed), Pending, 2, Reason::RetryScheduled.as_str()),
            entry(12, Some(Pending), Scheduled, 3, "Dispatched"),
        ],
        vec![
            entry(13, Some(Scheduled), Running, 3, "WorkerRunning"),
            entry(15, Some(Running), Succeeded, 3, "Completed"),
        ],
    ];
    let status = AxTaskStatus {
        attempt: 3,
        retries: 2,
        attempts: vec![
            record(1, 2, Some(1)),
            record(2, 7, Some(1)),
            record(3, 12, Some(0)),
        ],
        trace: Some(context_of(UID, Some(PARENT), None, Sampler::Always).0),
        ..Default::default()
    };
    (status, batches)
}

/// Every span the batches end, each batch written on top of the ones before.
fn replay(status: &AxTaskStatus, batches: &[Vec<HistoryEntry>]) -> Vec<Span> {
    let trace = status.trace.clone().unwrap();
    let mut written = AxTaskStatus {
        trace: status.trace.clone(),
        ..Default::default()
    };
    let mut spans = Vec::new();
    for batch in batches {
        let mut after = status.clone();
        after.history = written.history.iter().chain(batch).cloned().collect();
        spans.extend(spans_ended(
            &subject(),
            &trace,
            Some(&written),
            &after,
            batch,
        ));
        written = after;
    }
    spans
}

#[test]
fn a_task_retried_twice_has_a_queued_span_two_backoffs_three_attempts_and_its_run() {
    let (status, batches) = retried_twice();
    let spans = replay(&status, &batches);
    let names: Vec<_> = spans.iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        [
            "queued", "attempt", "backoff", "attempt", "backoff", "attempt", "task"
        ]
    );
    let trace = status.trace.as_ref().unwrap();
    let run = span_id(&trace.trace_id, UID, SpanOf::Run(0));
    let task = spans.last().unwrap();
    assert_eq!(task.span_id, run);
    assert_eq!(task.parent_span_id.as_deref(), Some("b7ad6b7169203331"));
    assert!(task.parent_is_remote);
    assert_eq!((task.start, task.end), (t(0), t(15)));
    assert_eq!(task.status, SpanStatus::Ok);
    for span in &spans[..6] {
        assert_eq!(
            span.parent_span_id.as_deref(),
            Some(run.as_str()),
            "{span:?}"
        );
        assert_eq!(span.trace_id, "0af7651916cd43dd8448eb211c80319c");
    }
    let attempts: Vec<_> = spans.iter().filter(|s| s.name == "attempt").collect();
    for (n, span) in attempts.iter().enumerate() {
        let attempt = n as i32 + 1;
        assert_eq!(
            span.attributes[0],
            ("ax.attempt", Value::Int(attempt.into()))
        );
        // The worker was told this span is its parent.
        assert_eq!(
            worker_traceparent(trace, UID, attempt),
            format!("00-{}-{}-01", trace.trace_id, span.span_id)
        );
        assert!(
            span.attributes
                .contains(&("k8s.pod.name", Value::from(format!("job-{attempt}"))))
        );
        assert!(
            span.attributes
                .contains(&("k8s.node.name", Value::from("sim-1")))
        );
    }
    assert_eq!((attempts[0].start, attempts[0].end), (t(2), t(5)));
    assert!(
        attempts[0]
            .attributes
            .contains(&("ax.retry", Value::from("retry")))
    );
    assert!(
        attempts[0]
            .attributes
            .contains(&("ax.exit_code", Value::Int(1)))
    );
    assert!(matches!(attempts[0].status, SpanStatus::Error(_)));
    // Attempt 2's retry is in the same write as its failure; attempt 3 succeeded.
    assert!(
        attempts[1]
            .attributes
            .contains(&("ax.retry", Value::from("retry")))
    );
    assert_eq!(attempts[2].status, SpanStatus::Ok);
    assert_eq!(attempts[2].events[0].name, "Running");
    assert_eq!(attempts[2].events[0].time, t(13));
    let backoffs: Vec<_> = spans.iter().filter(|s| s.name == "backoff").collect();
    assert_eq!((backoffs[0].start, backoffs[0].end), (t(5), t(7)));
    assert_eq!((backoffs[1].start, backoffs[1].end), (t(9), t(12)));
}

#[test]
fn what_held_a_waiting_task_is_an_event_of_its_wait() {
    let (status, batches) = retried_twice();
    let trace = status.trace.clone().unwrap();
    let mut written = status.clone();
    written.history = batches[0].clone();
    written.conditions = vec![Condition {
        type_: crate::core::conditions::QUEUED.into(),
        status: "False".into(),
        reason: "ConcurrencyLimit".into(),
        message: "the queue's 10 slots are in use".into(),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(1)),
        observed_generation: None,
    }];
    let mut after = status.clone();
    after.history = batches[..2].concat();
    let spans = spans_ended(&subject(), &trace, Some(&written), &after, &batches[1]);
    assert_eq!(spans[0].name, "queued");
    assert_eq!(spans[0].events.len(), 1);
    assert_eq!(spans[0].events[0].time, t(1));
    assert!(
        spans[0].events[0]
            .attributes
            .contains(&("ax.reason", Value::from("ConcurrencyLimit")))
    );
}

#[test]
fn an_unsampled_trace_builds_nothing() {
    let (mut status, batches) = retried_twice();
    status.trace.as_mut().unwrap().sampled = false;
    assert!(replay(&status, &batches).is_empty());
}

#[test]
fn a_dags_children_are_children_of_its_run_span() {
    let (dag, _) = context_of("dag-uid", None, None, Sampler::Always);
    let parent = child_traceparent(&dag, "dag-uid", 0);
    let (child, error) = context_of(UID, Some(&parent), None, Sampler::ParentBased(0.0));
    assert_eq!(error, None);
    assert_eq!(child.trace_id, dag.trace_id);
    let span = dag_span(
        "ns",
        "d",
        "dag-uid",
        &dag,
        0,
        t(0),
        t(9),
        "Succeeded",
        Some("2/2"),
    )
    .unwrap();
    assert_eq!(child.parent_span_id.as_deref(), Some(span.span_id.as_str()));
    assert!(child.sampled);
    // Its own spans do not collide with its siblings' in the shared trace.
    assert_ne!(
        span_id(&child.trace_id, UID, SpanOf::Attempt(1)),
        span_id(&child.trace_id, "sibling-uid", SpanOf::Attempt(1))
    );
}

// ---------------------------------------------------------------------------------------------
// Random histories
// ---------------------------------------------------------------------------------------------

/// A legal history from choices: each step takes one of the transitions legal from where the
/// task is (the state machine's table), numbering attempts at dispatch.
fn history_from(choices: &[usize]) -> (Vec<HistoryEntry>, Vec<AttemptRecord>) {
    let mut history = Vec::new();
    let mut records = Vec::new();
    let mut phase: Option<TaskPhase> = None;
    let mut attempt = 0;
    for (i, choice) in choices.iter().enumerate() {
        let options: Vec<TaskPhase> = LEGAL
            .iter()
            .filter(|(from, _)| *from == phase)
            .map(|(_, to)| *to)
            .collect();
        let to = options[choice % options.len()];
        if to == Scheduled {
            attempt += 1;
            records.push(record(attempt, i as i64, None));
        }
        let reason = match (phase, to) {
            (Some(Failed | TimedOut), Pending) => Reason::RetryScheduled.as_str(),
            (Some(p), Pending) if p.is_terminal() => Reason::Rerun.as_str(),
            _ => "Step",
        };
        history.push(entry(i as i64, phase, to, attempt, reason));
        phase = Some(to);
    }
    (history, records)
}

/// The spans of a history written in batches cut at `cuts`.
fn spans_in_batches(
    history: &[HistoryEntry],
    records: &[AttemptRecord],
    cuts: &BTreeSet<usize>,
) -> Vec<Span> {
    let trace = context_of(UID, Some(PARENT), None, Sampler::Always).0;
    let runs = history
        .iter()
        .filter(|h| h.reason == Reason::Rerun.as_str())
        .count() as i64;
    let mut bounds: Vec<usize> = cuts
        .iter()
        .copied()
        .filter(|c| *c > 0 && *c < history.len())
        .collect();
    bounds.push(history.len());
    let mut written = AxTaskStatus::default();
    let mut from = 0;
    let mut spans = Vec::new();
    for to in bounds {
        let so_far = &history[..to];
        let after = AxTaskStatus {
            history: so_far.to_vec(),
            attempts: records.to_vec(),
            observed_rerun: so_far
                .iter()
                .filter(|h| h.reason == Reason::Rerun.as_str())
                .count() as i64,
            trace: Some(trace.clone()),
            ..Default::default()
        };
        assert!(after.observed_rerun <= runs);
        spans.extend(spans_ended(
            &subject(),
            &trace,
            Some(&written),
            &after,
            &history[from..to],
        ));
        written = after;
        from = to;
    }
    spans
}

proptest! {
    #[test]
    fn every_span_is_built_once_whatever_the_batches(
        choices in prop::collection::vec(0usize..6, 1..60),
        cuts_a in prop::collection::btree_set(0usize..60, 0..20),
        cuts_b in prop::collection::btree_set(0usize..60, 0..20),
    ) {
        let (history, records) = history_from(&choices);
        let a = spans_in_batches(&history, &records, &cuts_a);
        let b = spans_in_batches(&history, &records, &cuts_b);
        // The same spans however the history was cut into writes; aside: held events, which come
        // from the status before, and what became of a failed attempt, said only when the same
        // write says it.
        let strip = |spans: &[Span]| -> Vec<Span> {
            spans.iter().cloned().map(|mut s| {
                s.events.retain(|e| e.name != "held");
                s.attributes.retain(|(k, _)| *k != "ax.retry");
                s
            }).collect()
        };
        prop_assert_eq!(strip(&a), strip(&b));
        // One id per span: nothing is exported twice.
        let ids: BTreeSet<_> = a.iter().map(|s| s.span_id.clone()).collect();
        prop_assert_eq!(ids.len(), a.len());
        // Each ended attempt has its one span; each terminal entry its run's span.
        let ended: BTreeMap<i32, usize> = history.iter()
            .filter(|h| matches!(h.from, Some(Scheduled | Running)) && h.to != Running)
            .fold(BTreeMap::new(), |mut m, h| { *m.entry(h.attempt).or_default() += 1; m });
        let attempt_spans: BTreeMap<i32, usize> = a.iter().filter(|s| s.name == "attempt")
            .fold(BTreeMap::new(), |mut m, s| {
                let Some((_, Value::Int(n))) = s.attributes.first() else { unreachable!() };
                *m.entry(*n as i32).or_default() += 1; m
            });
        prop_assert_eq!(ended, attempt_spans);
        let terminal = history.iter().filter(|h| h.to.is_terminal()).count();
        prop_assert_eq!(a.iter().filter(|s| s.name == "task").count(), terminal);
        let trace = context_of(UID, Some(PARENT), None, Sampler::Always).0;
        for span in &a {
            prop_assert!(span.start <= span.end, "{:?}", span);
            if span.name == "task" {
                prop_assert_eq!(span.parent_span_id.as_deref(), Some("b7ad6b7169203331"));
            } else {
                // A child of one of the task's runs.
                let parent = span.parent_span_id.clone().unwrap();
                let runs = history.iter().filter(|h| h.reason == Reason::Rerun.as_str()).count() as i64;
                prop_assert!((0..=runs).any(|r| span_id(&trace.trace_id, UID, SpanOf::Run(r)) == parent));
            }
        }
        let _ = (Canceled, Dead, SignedDuration::ZERO);
    }
}

#[test]
fn a_cron_firings_child_links_its_run_to_the_firing_span() {
    let firing = firing_context("cron-uid", t(60), Sampler::Always);
    assert_eq!(firing, firing_context("cron-uid", t(60), Sampler::Always));
    assert_ne!(
        firing.trace_id,
        firing_context("cron-uid", t(120), Sampler::Always).trace_id,
        "each firing is a trace of its own"
    );
    let link = firing_link(&firing, "cron-uid");
    let span = firing_span(
        &firing,
        "ns",
        "nightly",
        "cron-uid",
        "nightly-1",
        t(60),
        t(61),
        false,
    )
    .unwrap();
    assert_eq!(link, traceparent(&firing.trace_id, &span.span_id, true));
    assert_eq!((span.start, span.end), (t(60), t(61)));

    let (child, _) = context_of(UID, None, Some(&link), Sampler::Always);
    assert_eq!(child.parent_span_id, None, "a link, not a parent");
    assert_ne!(child.trace_id, firing.trace_id);
    let mut status = retried_twice().0;
    status.trace = Some(child.clone());
    let (_, batches) = retried_twice();
    let spans = replay(&status, &batches);
    let run = spans.iter().find(|s| s.name == "task").unwrap();
    assert_eq!(
        run.links,
        [SpanLink {
            trace_id: firing.trace_id.clone(),
            span_id: span.span_id.clone()
        }]
    );
    // A link that does not parse is left out.
    assert_eq!(
        context_of(UID, None, Some("nonsense"), Sampler::Always)
            .0
            .link,
        None
    );
}

#[test]
fn a_callbacks_span_is_a_child_of_its_run_and_names_the_posts_traceparent() {
    let (trace, _) = context_of(UID, Some(PARENT), None, Sampler::Always);
    let span = callback_span(&trace, UID, 1, t(10), t(11), "failed", "POST answered 500").unwrap();
    assert_eq!(
        span.parent_span_id,
        Some(span_id(&trace.trace_id, UID, SpanOf::Run(1)))
    );
    assert_eq!(
        callback_traceparent(&trace, UID, 1),
        traceparent(&trace.trace_id, &span.span_id, true)
    );
    assert!(matches!(span.status, SpanStatus::Error(_)));
    let unsampled = TraceContext {
        sampled: false,
        ..trace
    };
    assert_eq!(
        callback_span(&unsampled, UID, 1, t(10), t(11), "delivered", ""),
        None
    );
}
