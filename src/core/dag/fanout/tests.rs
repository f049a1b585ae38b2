//! Tests of the fan-out core: examples of each rule, and a simulated node whose items end in a
//! random order with random restarts — each index gets exactly one child, never more than
//! `parallelism` at work, and the outcome depends only on how the items end, not on their order.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use TaskPhase::{Canceled, Dead, Pending, Running, Succeeded};

fn node(items: u32, parallelism: u32) -> FanOut {
    FanOut {
        items,
        parallelism,
        success: SuccessPolicy::All,
        max_failed_items: None,
    }
}

fn phases(list: &[(u32, TaskPhase)]) -> BTreeMap<u32, TaskPhase> {
    list.iter().copied().collect()
}

#[test]
fn items_are_created_lowest_first_under_the_parallelism() {
    let s = step(&node(10, 3), &BTreeMap::new());
    assert_eq!(s.create, [0, 1, 2]);
    assert_eq!(s.outcome, NodeOutcome::Running);
    assert_eq!(s.counts.not_created, 10);
    // Item 1 ended: one slot, the lowest gap first.
    let s = step(
        &node(10, 3),
        &phases(&[(0, Running), (1, Succeeded), (2, Pending)]),
    );
    assert_eq!(s.create, [3]);
    let s = step(
        &node(10, 3),
        &phases(&[(0, Running), (2, Succeeded), (3, Running)]),
    );
    assert_eq!(
        s.create,
        [1],
        "a missing child is created again (lowest first)"
    );
}

#[test]
fn a_node_succeeds_when_every_item_ended_and_enough_succeeded() {
    let all = phases(&[(0, Succeeded), (1, Succeeded), (2, Succeeded)]);
    assert_eq!(step(&node(3, 2), &all).outcome, NodeOutcome::Succeeded);
    let one_dead = phases(&[(0, Succeeded), (1, Dead), (2, Succeeded)]);
    assert!(matches!(
        step(&node(3, 2), &one_dead).outcome,
        NodeOutcome::Failed(_)
    ));
    let mut two_of_three = node(3, 2);
    two_of_three.success = SuccessPolicy::MinSucceeded(2);
    assert_eq!(
        step(&two_of_three, &one_dead).outcome,
        NodeOutcome::Succeeded
    );
    let mut half = node(4, 4);
    half.success = SuccessPolicy::MinSucceededPercent(50);
    assert_eq!(half.required(), 2);
    let s = step(
        &half,
        &phases(&[(0, Dead), (1, Succeeded), (2, Canceled), (3, Succeeded)]),
    );
    assert_eq!(s.outcome, NodeOutcome::Succeeded);
    assert_eq!(s.failed_indexes, "0,2");
}

#[test]
fn more_failed_items_than_tolerated_fails_at_once_creates_nothing_and_cancels_the_rest() {
    let mut n = node(500, 10);
    n.max_failed_items = Some(2);
    let s = step(
        &n,
        &phases(&[(0, Dead), (1, Dead), (2, Running), (3, Succeeded)]),
    );
    assert_eq!(
        s.outcome,
        NodeOutcome::Running,
        "2 failed items are tolerated"
    );
    let s = step(
        &n,
        &phases(&[(0, Dead), (1, Dead), (2, Running), (4, Dead)]),
    );
    assert!(matches!(&s.outcome, NodeOutcome::Failed(m) if m.contains("maxFailedItems 2")));
    assert!(s.create.is_empty());
    assert_eq!(s.cancel, [2]);
    assert_eq!(s.failed_indexes, "0-1,4");
}

#[test]
fn a_success_out_of_reach_fails_without_running_the_rest() {
    let mut n = node(10, 2);
    n.success = SuccessPolicy::MinSucceeded(9);
    let s = step(&n, &phases(&[(0, Dead), (1, Dead)]));
    assert!(matches!(s.outcome, NodeOutcome::Failed(_)));
    assert!(s.create.is_empty());
}

#[test]
fn failed_indexes_are_ranges_and_a_long_list_is_cut() {
    assert_eq!(compact([]), "");
    assert_eq!(compact([3]), "3");
    assert_eq!(compact([0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    let every_other: Vec<u32> = (0..300).map(|i| i * 2).collect();
    let text = compact(every_other);
    assert!(text.ends_with(",… 200 more"), "{text}");
    assert_eq!(text.split(',').count(), FAILED_INDEXES_LISTED + 1);
}

#[test]
fn a_node_of_a_million_items_steps_without_listing_them() {
    let n = node(1_000_000, 500);
    let s = step(&n, &BTreeMap::new());
    assert_eq!(s.create.len(), 500);
    assert_eq!(s.counts.not_created, 1_000_000);
}

/// Runs a node to its end: each step's creations exist from then on; at each turn one item at work
/// ends (the one `order` picks) as `ends` says; `restarts` drop nothing (the core keeps no memory).
fn for_each(json: serde_json::Value) -> crate::api::ForEach {
    serde_json::from_value(json).expect("a forEach")
}

#[test]
fn a_spec_gives_its_node_or_a_clear_error() {
    let range = of_spec(
        "d",
        "map",
        &[],
        &for_each(serde_json::json!({"range": {"count": 2000}})),
        None,
    );
    assert_eq!(
        range,
        Ok(FanOut {
            items: 2000,
            parallelism: DEFAULT_PARALLELISM,
            success: SuccessPolicy::All,
            max_failed_items: None,
        })
    );
    let listed = for_each(serde_json::json!({
        "items": ["a", {"b": 1}, 3], "parallelism": 2, "maxFailedItems": 1,
        "successPolicy": {"minSucceededPercent": 50},
    }));
    let node = of_spec("d", "map", &[], &listed, None).expect("valid");
    assert_eq!(
        (
            node.items,
            node.parallelism,
            node.success,
            node.max_failed_items
        ),
        (3, 2, SuccessPolicy::MinSucceededPercent(50), Some(1))
    );
    assert_eq!(node.required(), 2);
    let error = |json| of_spec("d", "map", &[], &for_each(json), None).expect_err("invalid");
    let one_source = "exactly one of items, range and fromOutput";
    assert!(error(serde_json::json!({})).contains(one_source));
    assert!(error(serde_json::json!({"items": [1], "range": {"count": 1}})).contains(one_source));
    assert!(
        error(serde_json::json!({"range": {"count": 1}, "fromOutput": {"task": "split"}}))
            .contains(one_source)
    );
    assert!(
        error(serde_json::json!({"fromOutput": {"task": "split"}}))
            .contains("`split` is not one of its dependsOn")
    );
    assert!(
        error(serde_json::json!({"range": {"count": 1}, "successPolicy": {}}))
            .contains("exactly one of minSucceeded and minSucceededPercent")
    );
    assert!(error(serde_json::json!({"range": {"count": 2000000}})).contains("more than 1000000"));
    let long = "x".repeat(55);
    let too_long = of_spec(
        &long,
        "map",
        &[],
        &for_each(serde_json::json!({"range": {"count": 100000}})),
        None,
    );
    assert!(
        too_long.expect_err("too long").contains("`x"),
        "names the last child"
    );
}

#[test]
fn a_from_output_node_has_the_items_of_its_parents_list_once_known() {
    let from = for_each(serde_json::json!({"fromOutput": {"task": "split", "path": "orders"}}));
    let parents = ["split".to_owned()];
    let node = |known| of_spec("d", "map", &parents, &from, known).map(|n| n.items);
    assert_eq!(node(None), Ok(0), "no items before the parent's output");
    assert_eq!(node(Some(500)), Ok(500));
    let spec = from.from_output.as_ref().expect("fromOutput");
    let output = serde_json::json!({"orders": [1, 2, 3], "n": 3});
    assert_eq!(
        output_items("map", spec, Some(&output)).map(<[_]>::len),
        Ok(3)
    );
    let error = |output: Option<serde_json::Value>| {
        output_items("map", spec, output.as_ref()).expect_err("no list")
    };
    assert!(error(None).contains("task `split` succeeded without an output"));
    assert!(error(Some(serde_json::json!({"n": 3}))).contains("has no `orders`"));
    assert!(
        error(Some(serde_json::json!({"orders": {"a": 1}})))
            .contains("`orders` in the output of task `split` is an object, not a list")
    );
    let whole = crate::api::FromOutput {
        task: "split".into(),
        path: None,
    };
    let list = serde_json::json!(["a", "b"]);
    assert_eq!(
        output_items("map", &whole, Some(&list)).map(<[_]>::len),
        Ok(2)
    );
    assert!(
        output_items("map", &whole, Some(&serde_json::json!(7)))
            .expect_err("a number")
            .contains("the output of task `split` is a number, not a list")
    );
    let failed = unusable("why".into());
    assert_eq!(failed.phase(), crate::api::TaskPhase::Dead);
    assert!(failed.create.is_empty());
}

#[test]
fn a_cached_list_keeps_its_length() {
    let mut cached = for_each(serde_json::json!({"items": [1, 2, 3]}));
    cached.cached_item_count = cached.items.take().map(|i| i.len());
    assert_eq!(
        of_spec("d", "t", &[], &cached, None).map(|n| n.items),
        Ok(3)
    );
    cached.range = Some(crate::api::ItemRange { count: 3 });
    assert!(
        of_spec("d", "t", &[], &cached, None).is_err(),
        "both, even when cached"
    );
}

#[test]
fn an_item_child_gets_its_item_in_the_payload_and_env() {
    let spec: crate::api::AxTaskSpec = serde_json::from_value(serde_json::json!({
        "type": "t", "payload": {"order": 7},
        "template": {"spec": {"containers": [
            {"name": "w", "image": "i", "env": [{"name": "AX_ITEM_INDEX", "value": "mine"}]},
        ]}},
    }))
    .expect("spec");
    let child = item_spec(&spec, 4, serde_json::json!({"sku": "x"}));
    assert_eq!(
        child.payload,
        Some(serde_json::json!({"order": 7, "item": {"sku": "x"}, "itemIndex": 4}))
    );
    let env: Vec<(String, String)> = child.template.containers()[0]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    assert!(env.contains(&("AX_ITEM".into(), r#"{"sku":"x"}"#.into())));
    assert!(
        env.contains(&("AX_ITEM_INDEX".into(), "mine".into())),
        "the template's own wins"
    );
    assert_eq!(
        spec.payload,
        Some(serde_json::json!({"order": 7})),
        "the task's spec is kept"
    );
    let bare = crate::api::AxTaskSpec::default();
    assert_eq!(
        item_spec(&bare, 0, 5.into()).payload,
        Some(serde_json::json!({"item": 5, "itemIndex": 0}))
    );
}

#[test]
fn a_step_reports_counts_and_the_phase_the_graph_sees() {
    let n = FanOut {
        max_failed_items: Some(0),
        ..node(4, 2)
    };
    let s = step(&n, &phases(&[(0, Dead), (1, Running)]));
    assert_eq!(
        s.phase(),
        Running,
        "a failed node is Running while its items stop"
    );
    let status = s.status(&n);
    assert_eq!((status.total, status.at_work, status.failed), (4, 1, 1));
    assert_eq!(status.failed_indexes, "0");
    assert!(status.message.contains("maxFailedItems 0"));
    assert_eq!(step(&n, &phases(&[(0, Dead), (1, Canceled)])).phase(), Dead);
    let done = phases(&[
        (0, Succeeded),
        (1, Succeeded),
        (2, Succeeded),
        (3, Succeeded),
    ]);
    assert_eq!(step(&n, &done).phase(), Succeeded);
    assert_eq!(
        step(&node(0, 1), &BTreeMap::new()).phase(),
        Succeeded,
        "no items: done"
    );
}

#[test]
fn taking_the_items_to_create_gives_the_step_of_them_created() {
    let n = FanOut {
        max_failed_items: Some(3),
        ..node(10, 4)
    };
    let mut children = phases(&[(0, Succeeded), (1, Dead), (2, Running)]);
    let mut s = step(&n, &children);
    let create = s.take_create();
    assert_eq!(create, [3, 4, 5]);
    for i in create {
        children.insert(i, Pending);
    }
    assert_eq!(s, step(&n, &children));
}

fn run(n: &FanOut, ends: &[bool], order: &[usize]) -> (NodeOutcome, u32) {
    let mut children: BTreeMap<u32, TaskPhase> = BTreeMap::new();
    let mut created = vec![0u32; n.items as usize];
    for turn in 0.. {
        let s = step(n, &children);
        let at_work = children
            .values()
            .filter(|p| !matches!(p, Succeeded | Dead | Canceled))
            .count();
        assert!(at_work <= n.parallelism as usize);
        for i in &s.create {
            assert!(!children.contains_key(i), "item {i} created twice");
            created[*i as usize] += 1;
            children.insert(*i, Pending);
        }
        for i in &s.cancel {
            children.insert(*i, Canceled);
        }
        if s.outcome != NodeOutcome::Running {
            let again = step(n, &children);
            assert_eq!(
                std::mem::discriminant(&again.outcome),
                std::mem::discriminant(&s.outcome),
                "a decided outcome stays"
            );
            assert!(again.create.is_empty());
            return (s.outcome, created.iter().sum());
        }
        let working: Vec<u32> = children
            .iter()
            .filter(|(_, p)| **p == Pending)
            .map(|(i, _)| *i)
            .collect();
        assert!(!working.is_empty(), "a running node has an item at work");
        let pick = working[order[turn % order.len()] % working.len()];
        let phase = if ends[pick as usize] { Succeeded } else { Dead };
        children.insert(pick, phase);
    }
    unreachable!()
}

proptest! {
    #[test]
    fn each_item_gets_one_child_and_the_outcome_does_not_depend_on_the_order(
        ends in prop::collection::vec(prop::bool::weighted(0.8), 1..120),
        parallelism in 1u32..20,
        max_failed in prop::option::of(0u32..10),
        policy in 0u8..3,
        k in 0u32..130,
        order_a in prop::collection::vec(0usize..1000, 1..50),
        order_b in prop::collection::vec(0usize..1000, 1..50),
    ) {
        let items = ends.len() as u32;
        let success = match policy {
            0 => SuccessPolicy::All,
            1 => SuccessPolicy::MinSucceeded(k),
            _ => SuccessPolicy::MinSucceededPercent(k.min(100)),
        };
        let n = FanOut { items, parallelism, success, max_failed_items: max_failed };
        let (a, created_a) = run(&n, &ends, &order_a);
        let (b, _) = run(&n, &ends, &order_b);
        prop_assert_eq!(matches!(a, NodeOutcome::Succeeded), matches!(b, NodeOutcome::Succeeded));
        let failures = ends.iter().filter(|e| !**e).count() as u32;
        let expected = failures <= max_failed.unwrap_or(u32::MAX) && failures <= items - n.required();
        prop_assert_eq!(matches!(a, NodeOutcome::Succeeded), expected);
        if expected {
            prop_assert_eq!(created_a, items, "a node that succeeds ran every item once");
        }
    }
}
