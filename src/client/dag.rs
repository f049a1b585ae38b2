//! A DAG as both front ends draw it (no client required): each task's level, the longest chain
//! of dependencies before it, and the names of node phases.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::api::{DagNodePhase, DagTask};

/// Each task's level: 0 without dependencies, else one more than its deepest dependency. Tasks
/// on or behind a cycle have none. Unknown dependencies are ignored (the operator reports them).
pub fn levels(tasks: &[DagTask]) -> BTreeMap<String, Option<usize>> {
    let names: HashSet<&str> = tasks.iter().map(|t| t.name.as_str()).collect();
    let mut deps: HashMap<&str, Vec<&str>> = HashMap::new();
    for t in tasks {
        // The first of duplicate names counts, as everywhere else here.
        deps.entry(t.name.as_str()).or_insert_with(|| {
            t.depends_on
                .iter()
                .map(String::as_str)
                .filter(|d| names.contains(d))
                .collect()
        });
    }
    let mut level: HashMap<&str, usize> = HashMap::new();
    // Relax until nothing changes; a task gets a level once all its dependencies have one.
    loop {
        let mut changed = false;
        for (name, ds) in &deps {
            if level.contains_key(name) {
                continue;
            }
            if ds.iter().all(|d| level.contains_key(d)) {
                let l = ds.iter().map(|d| level[d] + 1).max().unwrap_or(0);
                level.insert(name, l);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    deps.keys()
        .map(|name| (name.to_string(), level.get(name).copied()))
        .collect()
}

pub fn node_phase_name(phase: DagNodePhase) -> String {
    serde_json::to_value(phase)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tasks(edges: &[(&str, &[&str])]) -> Vec<DagTask> {
        edges
            .iter()
            .map(|(name, deps)| {
                serde_json::from_value(serde_json::json!({
                    "name": name, "dependsOn": deps,
                    "spec": {"type": "x", "template": {}},
                }))
                .unwrap()
            })
            .collect()
    }

    #[test]
    fn levels_are_the_longest_chain_of_dependencies() {
        let l = levels(&tasks(&[
            ("a", &[]),
            ("b", &["a"]),
            ("c", &["a"]),
            ("d", &["b", "c"]),
            ("e", &["a", "d"]),
            ("x", &["nope"]),
        ]));
        let want: BTreeMap<String, Option<usize>> = [
            ("a", Some(0)),
            ("b", Some(1)),
            ("c", Some(1)),
            ("d", Some(2)),
            ("e", Some(3)),
            ("x", Some(0)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(l, want);
    }

    #[test]
    fn tasks_on_or_behind_a_cycle_have_no_level() {
        let l = levels(&tasks(&[
            ("a", &["b"]),
            ("b", &["a"]),
            ("c", &["a"]),
            ("d", &[]),
        ]));
        assert_eq!(l["a"], None);
        assert_eq!(l["c"], None);
        assert_eq!(l["d"], Some(0));
    }

    proptest! {
        /// In a random acyclic graph every task has a level above each of its dependencies'.
        #[test]
        fn levels_respect_every_edge(edges in proptest::collection::vec(proptest::collection::vec(any::<prop::sample::Index>(), 0..4), 1..15)) {
            let names: Vec<String> = (0..edges.len()).map(|i| format!("t{i}")).collect();
            // Only edges to earlier tasks: acyclic by construction.
            let ts: Vec<DagTask> = edges.iter().enumerate().map(|(i, deps)| {
                let deps: Vec<String> = if i == 0 { vec![] } else {
                    deps.iter().map(|d| names[d.index(i)].clone()).collect()
                };
                serde_json::from_value(serde_json::json!({
                    "name": names[i], "dependsOn": deps, "spec": {"type": "x", "template": {}},
                })).unwrap()
            }).collect();
            let l = levels(&ts);
            for t in &ts {
                let mine = l[&t.name].expect("acyclic: every task has a level");
                for d in &t.depends_on {
                    prop_assert!(mine > l[d].unwrap());
                }
                if t.depends_on.is_empty() {
                    prop_assert_eq!(mine, 0);
                }
            }
        }
    }
}
