//! A task's key in its queue (`spec.fairness.key`): the tenant its fair share, `keyConcurrency`
//! and `keyRate` count it under. By default its namespace; a queue may take it from a label or a
//! payload field instead. Such a key is resolved when the task is decided on whole and recorded in
//! its status (`status.queueKey`), so a task that waits settled — its payload and labels not
//! cached — and a task seen after a restart keep their key without a read.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::{KeySourceSpec, QueueKey};

/// The key of a task that has no such label or payload field.
pub const NO_KEY: &str = "<none>";

/// Longest key value kept, in bytes: a key is a status field, a metric label and a map key.
pub const MAX_KEY_BYTES: usize = 128;

/// Where a queue takes its tasks' keys from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeySource {
    #[default]
    Namespace,
    Label {
        name: String,
        /// `label:<name>`, as `status.queueKey.from` records it.
        from: String,
    },
    Payload {
        path: Vec<String>,
        /// `payload:<dotted.path>`.
        from: String,
    },
}

/// Why a `spec.fairness.key` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySourceError {
    #[error("spec.fairness.key: set exactly one of label and payload")]
    NotOne,
    #[error("spec.fairness.key.label: {0:?} is not a label name")]
    Label(String),
    #[error("spec.fairness.key.payload: {0:?} is not a dotted path of field names")]
    Payload(String),
}

impl KeySource {
    pub fn of(spec: &KeySourceSpec) -> Result<KeySource, KeySourceError> {
        match (&spec.label, &spec.payload) {
            (Some(name), None) => {
                if !is_label_name(name) {
                    return Err(KeySourceError::Label(name.clone()));
                }
                Ok(KeySource::Label {
                    name: name.clone(),
                    from: format!("label:{name}"),
                })
            }
            (None, Some(path)) => {
                let fields: Vec<String> = path.split('.').map(String::from).collect();
                if fields.iter().any(String::is_empty) {
                    return Err(KeySourceError::Payload(path.clone()));
                }
                Ok(KeySource::Payload {
                    path: fields,
                    from: format!("payload:{path}"),
                })
            }
            _ => Err(KeySourceError::NotOne),
        }
    }

    /// The source a recorded key names (`label:<name>` or `payload:<path>`), if it is one.
    pub fn recorded_as(from: &str) -> Option<KeySource> {
        let spec = match from.split_once(':')? {
            ("label", name) => KeySourceSpec {
                label: Some(name.into()),
                payload: None,
            },
            ("payload", path) => KeySourceSpec {
                label: None,
                payload: Some(path.into()),
            },
            _ => return None,
        };
        KeySource::of(&spec).ok()
    }

    /// What `status.queueKey.from` says for this source; `None` for the namespace.
    pub fn from(&self) -> Option<&str> {
        match self {
            KeySource::Namespace => None,
            KeySource::Label { from, .. } | KeySource::Payload { from, .. } => Some(from),
        }
    }

    /// The key of a task with these labels and payload; `None` when it is the namespace.
    pub fn key_of(
        &self,
        labels: Option<&BTreeMap<String, String>>,
        payload: Option<&Value>,
    ) -> Option<QueueKey> {
        let (from, value) = match self {
            KeySource::Namespace => return None,
            KeySource::Label { name, from } => (from, labels.and_then(|l| l.get(name)).cloned()),
            KeySource::Payload { path, from } => {
                let field =
                    payload.and_then(|p| path.iter().try_fold(p, |value, name| value.get(name)));
                let value = field.and_then(|v| match v {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(n) => Some(n.to_string()),
                    Value::Bool(b) => Some(b.to_string()),
                    _ => None,
                });
                (from, value)
            }
        };
        let value = value.filter(|v| !v.is_empty()).map_or_else(
            || NO_KEY.to_string(),
            |mut v| {
                truncate(&mut v, MAX_KEY_BYTES);
                v
            },
        );
        Some(QueueKey {
            from: from.clone(),
            value,
        })
    }

    /// Whether a key recorded in a status is of this source (`None`: the namespace).
    pub fn recorded(&self, key: Option<&QueueKey>) -> bool {
        self.from() == key.map(|k| k.from.as_str())
    }
}

/// The tenant a task counts under: its recorded key, or its namespace.
pub fn tenant<'a>(namespace: &'a str, key: Option<&'a QueueKey>) -> &'a str {
    key.map_or(namespace, |k| k.value.as_str())
}

fn truncate(value: &mut String, max: usize) {
    if value.len() > max {
        let mut end = max;
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        value.truncate(end);
    }
}

/// A label name as the API server accepts it: an optional DNS-subdomain prefix and `/`, then a
/// name of at most 63 alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
fn is_label_name(name: &str) -> bool {
    let (prefix, local) = match name.split_once('/') {
        Some((prefix, local)) => (Some(prefix), local),
        None => (None, name),
    };
    let alnum_ends = |s: &str| {
        s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    let local_ok = !local.is_empty()
        && local.len() <= 63
        && alnum_ends(local)
        && local
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && alnum_ends(part)
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    local_ok && prefix_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn label(name: &str) -> KeySource {
        KeySource::of(&KeySourceSpec {
            label: Some(name.into()),
            payload: None,
        })
        .unwrap()
    }

    fn payload(path: &str) -> KeySource {
        KeySource::of(&KeySourceSpec {
            label: None,
            payload: Some(path.into()),
        })
        .unwrap()
    }

    #[test]
    fn a_source_is_exactly_one_valid_label_or_path() {
        let spec = |label: Option<&str>, payload: Option<&str>| KeySourceSpec {
            label: label.map(String::from),
            payload: payload.map(String::from),
        };
        assert_eq!(
            KeySource::of(&spec(None, None)),
            Err(KeySourceError::NotOne)
        );
        assert_eq!(
            KeySource::of(&spec(Some("a"), Some("b"))),
            Err(KeySourceError::NotOne)
        );
        for bad in ["", "-a", "a b", "x/", "/a", "Ex.com/a", &"a".repeat(64)] {
            assert!(
                matches!(
                    KeySource::of(&spec(Some(bad), None)),
                    Err(KeySourceError::Label(_))
                ),
                "{bad:?}"
            );
        }
        for good in ["customer", "team.example.com/customer", "a_b-c.d"] {
            assert!(KeySource::of(&spec(Some(good), None)).is_ok(), "{good:?}");
        }
        for bad in ["", ".", "a.", ".a", "a..b"] {
            assert!(
                matches!(
                    KeySource::of(&spec(None, Some(bad))),
                    Err(KeySourceError::Payload(_))
                ),
                "{bad:?}"
            );
        }
        assert_eq!(payload("customer.id").from(), Some("payload:customer.id"));
        assert_eq!(label("customer").from(), Some("label:customer"));
        assert_eq!(KeySource::Namespace.from(), None);
        for source in [label("customer"), payload("customer.id")] {
            let from = source.from().unwrap();
            assert_eq!(KeySource::recorded_as(from), Some(source.clone()));
        }
        for unknown in ["", "label:", "payload:a..b", "annotation:x", "customer"] {
            assert_eq!(KeySource::recorded_as(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn keys_come_from_the_label_or_the_scalar_payload_field() {
        let labels = BTreeMap::from([("customer".to_string(), "x".to_string())]);
        let key = |source: &KeySource, payload: Value| {
            source
                .key_of(Some(&labels), Some(&payload))
                .map(|k| k.value)
        };
        assert_eq!(key(&KeySource::Namespace, json!({})), None);
        assert_eq!(key(&label("customer"), json!({})).as_deref(), Some("x"));
        assert_eq!(key(&label("team"), json!({})).as_deref(), Some(NO_KEY));
        let id = payload("customer.id");
        assert_eq!(
            key(&id, json!({"customer": {"id": "c-1"}})).as_deref(),
            Some("c-1")
        );
        assert_eq!(
            key(&id, json!({"customer": {"id": 42}})).as_deref(),
            Some("42")
        );
        assert_eq!(
            key(&id, json!({"customer": {"id": true}})).as_deref(),
            Some("true")
        );
        for none in [
            json!({}),
            json!({"customer": "c-1"}),
            json!({"customer": {"id": null}}),
            json!({"customer": {"id": {"a": 1}}}),
            json!({"customer": {"id": ["a"]}}),
            json!({"customer": {"id": ""}}),
        ] {
            assert_eq!(key(&id, none.clone()).as_deref(), Some(NO_KEY), "{none}");
        }
        assert_eq!(
            id.key_of(None, None).map(|k| k.value).as_deref(),
            Some(NO_KEY)
        );
    }

    #[test]
    fn a_recorded_key_is_of_its_source_only() {
        let key = label("customer").key_of(None, None);
        assert!(label("customer").recorded(key.as_ref()));
        assert!(!label("team").recorded(key.as_ref()));
        assert!(!payload("customer").recorded(key.as_ref()));
        assert!(!KeySource::Namespace.recorded(key.as_ref()));
        assert!(KeySource::Namespace.recorded(None));
        assert!(!label("customer").recorded(None));
        assert_eq!(tenant("ns", key.as_ref()), NO_KEY);
        assert_eq!(tenant("ns", None), "ns");
    }

    proptest! {
        /// Any payload value gives a key of at most MAX_KEY_BYTES, cut on a character boundary.
        #[test]
        fn keys_are_bounded(value in ".{0,200}") {
            let key = payload("k").key_of(None, Some(&json!({"k": value.clone()}))).unwrap();
            prop_assert!(key.value.len() <= MAX_KEY_BYTES);
            prop_assert!(value.starts_with(&key.value) || key.value == NO_KEY);
        }
    }
}
