//! Label selectors (`metav1.LabelSelector`): `matchLabels` and `matchExpressions` (`In`, `NotIn`,
//! `Exists`, `DoesNotExist`), all of which must hold; an empty selector selects everything.
//! Matching is kube's (`kube::core::Selector`). What this module adds is what kube's conversion
//! does not check: the API server's rules for its own selectors (operators, values, label
//! syntax), each reported naming the field, so a bad selector is refused where it is wrong
//! instead of silently selecting nothing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
pub use kube::core::{Selector, SelectorExt};

/// Why a selector cannot be used; `field` is the path of the offending part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SelectorError {
    pub field: String,
    pub message: String,
}

/// Reads a selector; `field` is where it sits in the spec (for messages).
pub fn parse(selector: &LabelSelector, field: &str) -> Result<Selector, SelectorError> {
    check(selector, field)?;
    // After `check`, kube's conversion cannot fail; its error is kept anyway rather than a panic.
    Selector::try_from(selector.clone()).map_err(|e| SelectorError {
        field: field.to_owned(),
        message: e.0,
    })
}

/// The API server's checks on a selector, each failure naming the part that is wrong.
fn check(selector: &LabelSelector, field: &str) -> Result<(), SelectorError> {
    let error = |field: String, message: String| SelectorError { field, message };
    for (key, value) in selector.match_labels.iter().flatten() {
        let at = format!("{field}.matchLabels[{key}]");
        label_key(key).map_err(|m| error(at.clone(), m))?;
        label_value(value).map_err(|m| error(at, m))?;
    }
    for (i, expression) in selector.match_expressions.iter().flatten().enumerate() {
        let at = format!("{field}.matchExpressions[{i}]");
        label_key(&expression.key).map_err(|m| error(format!("{at}.key"), m))?;
        let values = expression.values.as_deref().unwrap_or_default();
        for value in values {
            label_value(value).map_err(|m| error(format!("{at}.values"), m))?;
        }
        let operator = expression.operator.as_str();
        match operator {
            "In" | "NotIn" if values.is_empty() => {
                return Err(error(
                    format!("{at}.values"),
                    format!("must not be empty with operator {operator}"),
                ));
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(error(
                    format!("{at}.values"),
                    format!("must be empty with operator {operator}"),
                ));
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => {
                return Err(error(
                    format!("{at}.operator"),
                    format!("{other:?} is not one of In, NotIn, Exists, DoesNotExist"),
                ));
            }
        }
    }
    Ok(())
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name of at most 63 characters.
fn label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !dns_subdomain(prefix)
    {
        return Err(format!(
            "the prefix of label key {key:?} must be a DNS subdomain (lowercase letters, digits, '-' and '.', at most 253)"
        ));
    }
    if name.is_empty() || !label_name(name) {
        return Err(format!(
            "label key {key:?} must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// A label value: empty, or like the name part of a key.
fn label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || label_name(value) {
        Ok(())
    } else {
        Err(format!(
            "label value {value:?} must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ))
    }
}

fn label_name(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    name.len() <= 63
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn dns_subdomain(prefix: &str) -> bool {
    prefix.len() <= 253
        && prefix.split('.').all(|label| {
            let edge =
                |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
            label.len() <= 63
                && edge(label.chars().next())
                && edge(label.chars().last())
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use proptest::prelude::*;

    use super::*;

    fn selector(value: serde_json::Value) -> LabelSelector {
        serde_json::from_value(value).expect("a LabelSelector")
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn an_empty_selector_selects_everything() {
        let parsed = parse(&LabelSelector::default(), "s").expect("valid");
        assert!(parsed.selects_all());
        assert!(parsed.matches(&labels(&[])));
        assert!(parsed.matches(&labels(&[("a", "b")])));
        let empty_lists = selector(serde_json::json!({"matchLabels": {}, "matchExpressions": []}));
        assert_eq!(parse(&empty_lists, "s"), Ok(Selector::default()));
    }

    #[test]
    fn match_labels_and_expressions_must_all_hold() {
        let parsed = parse(
            &selector(serde_json::json!({
                "matchLabels": {"ax.dev/team": "a"},
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["gold", "silver"]},
                    {"key": "frozen", "operator": "DoesNotExist"},
                    {"key": "env", "operator": "NotIn", "values": ["prod"]},
                    {"key": "cost-center", "operator": "Exists"},
                ],
            })),
            "s",
        )
        .expect("valid");
        let base = [("ax.dev/team", "a"), ("tier", "gold"), ("cost-center", "")];
        assert!(parsed.matches(&labels(&base)));
        let with = |extra: (&'static str, &'static str)| {
            let mut l = labels(&base);
            l.insert(extra.0.into(), extra.1.into());
            parsed.matches(&l)
        };
        assert!(with(("env", "dev")), "NotIn holds for another value");
        assert!(!with(("env", "prod")));
        assert!(!with(("frozen", "")));
        assert!(!with(("tier", "bronze")));
        assert!(!with(("ax.dev/team", "b")));
        assert!(!parsed.matches(&labels(&[("ax.dev/team", "a"), ("tier", "gold")])));
    }

    #[test]
    fn bad_selectors_are_refused_naming_the_field() {
        let cases = [
            (
                serde_json::json!({"matchExpressions": [{"key": "a", "operator": "Contains", "values": ["x"]}]}),
                "s.matchExpressions[0].operator",
            ),
            (
                serde_json::json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
                "s.matchExpressions[0].values",
            ),
            (
                serde_json::json!({"matchExpressions": [
                    {"key": "a", "operator": "Exists"},
                    {"key": "b", "operator": "DoesNotExist", "values": ["x"]},
                ]}),
                "s.matchExpressions[1].values",
            ),
            (
                serde_json::json!({"matchExpressions": [{"key": "", "operator": "Exists"}]}),
                "s.matchExpressions[0].key",
            ),
            (
                serde_json::json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["no spaces"]}]}),
                "s.matchExpressions[0].values",
            ),
            (
                serde_json::json!({"matchLabels": {"Bad.Prefix/x": "y"}}),
                "s.matchLabels[Bad.Prefix/x]",
            ),
            (
                serde_json::json!({"matchLabels": {"team": "-a"}}),
                "s.matchLabels[team]",
            ),
        ];
        for (value, field) in cases {
            let problem = parse(&selector(value.clone()), "s").expect_err(&value.to_string());
            assert_eq!(problem.field, field, "{problem}");
        }
        // What the API server accepts as label syntax is accepted here.
        for key in [
            "a",
            "a.b_c-d",
            "example.com/x",
            "k8s.io/A_b.c",
            &"x".repeat(63),
        ] {
            let value = serde_json::json!({"matchLabels": {key: "v"}});
            assert!(parse(&selector(value), "s").is_ok(), "{key}");
        }
    }

    /// The selector as the Kubernetes documentation states it, requirement by requirement over
    /// the raw API types: the reference `matches` is checked against.
    fn reference(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
        let labels_hold = selector
            .match_labels
            .iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v));
        let expressions_hold = selector.match_expressions.iter().flatten().all(|e| {
            let values = e.values.clone().unwrap_or_default();
            let has = labels.contains_key(&e.key);
            match e.operator.as_str() {
                "In" => has && values.contains(&labels[&e.key]),
                "NotIn" => !has || !values.contains(&labels[&e.key]),
                "Exists" => has,
                "DoesNotExist" => !has,
                _ => unreachable!("only valid operators are generated"),
            }
        });
        labels_hold && expressions_hold
    }

    fn small_key() -> impl Strategy<Value = String> {
        prop_oneof![Just("a"), Just("b"), Just("team"), Just("ax.dev/t")].prop_map(String::from)
    }

    fn small_value() -> impl Strategy<Value = String> {
        prop_oneof![Just("x"), Just("y"), Just(""), Just("z.1")].prop_map(String::from)
    }

    fn requirement() -> impl Strategy<Value = LabelSelectorRequirement> {
        let values = || proptest::collection::vec(small_value(), 1..3);
        prop_oneof![
            (small_key(), values()).prop_map(|(key, values)| LabelSelectorRequirement {
                key,
                operator: "In".into(),
                values: Some(values),
            }),
            (small_key(), values()).prop_map(|(key, values)| LabelSelectorRequirement {
                key,
                operator: "NotIn".into(),
                values: Some(values),
            }),
            small_key().prop_map(|key| LabelSelectorRequirement {
                key,
                operator: "Exists".into(),
                values: None,
            }),
            small_key().prop_map(|key| LabelSelectorRequirement {
                key,
                operator: "DoesNotExist".into(),
                values: Some(Vec::new()),
            }),
        ]
    }

    proptest! {
        #[test]
        fn matching_agrees_with_the_documented_semantics(
            match_labels in proptest::option::of(proptest::collection::btree_map(small_key(), small_value(), 0..3)),
            match_expressions in proptest::option::of(proptest::collection::vec(requirement(), 0..4)),
            object in proptest::collection::btree_map(small_key(), small_value(), 0..4),
        ) {
            let raw = LabelSelector { match_labels, match_expressions };
            let parsed = parse(&raw, "s").expect("generated selectors are valid");
            prop_assert_eq!(parsed.matches(&object), reference(&raw, &object));
            let requirements = raw.match_labels.iter().flatten().count()
                + raw.match_expressions.iter().flatten().count();
            prop_assert_eq!(parsed.selects_all(), requirements == 0);
        }
    }
}
