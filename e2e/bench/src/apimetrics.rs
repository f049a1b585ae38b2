//! The API server's own count of the writes it served: `apiserver_request_total` from its
//! `/metrics` (Prometheus text format), reduced to mutating verbs and keyed by resource, verb and
//! status code, so two scrapes give the writes made in between. Pure text in, counts out.

use std::collections::BTreeMap;

use serde::Serialize;

/// Verbs that change something (the API server spells server-side apply `APPLY`).
const MUTATING_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "DELETE",
    "DELETECOLLECTION",
    "APPLY",
];

/// One series of writes: what was written, how, and what the API server answered.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct WriteKey {
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub verb: String,
    pub code: String,
}

impl WriteKey {
    /// `pods`, `pods/binding`, `axtasks.ax.dev/status`, `events.events.k8s.io`.
    pub fn display_resource(&self) -> String {
        let mut name = self.resource.clone();
        if !self.group.is_empty() {
            name.push('.');
            name.push_str(&self.group);
        }
        if !self.subresource.is_empty() {
            name.push('/');
            name.push_str(&self.subresource);
        }
        name
    }

    /// Writes that come with time, not with units: node heartbeats (node status, node leases)
    /// and leader-election leases of every controller.
    pub fn is_background(&self) -> bool {
        (self.group.is_empty() && self.resource == "nodes")
            || (self.group == "coordination.k8s.io" && self.resource == "leases")
    }

    /// A 409: an update that lost a race (Conflict) or a create of a name that exists
    /// (AlreadyExists).
    pub fn is_conflict(&self) -> bool {
        self.code == "409"
    }

    pub fn is_success(&self) -> bool {
        self.code.starts_with('2')
    }
}

/// Write counts by series, as scraped (cumulative since the API server started).
pub type Writes = BTreeMap<WriteKey, f64>;

/// The mutating series of `apiserver_request_total` in a `/metrics` text.
pub fn writes(metrics_text: &str) -> Writes {
    let mut writes = Writes::new();
    for line in metrics_text.lines() {
        let Some((labels, value)) = sample(line, "apiserver_request_total") else {
            continue;
        };
        let label = |name: &str| labels.get(name).cloned().unwrap_or_default();
        let verb = label("verb");
        if !MUTATING_VERBS.contains(&verb.as_str()) {
            continue;
        }
        let key = WriteKey {
            group: label("group"),
            resource: label("resource"),
            subresource: label("subresource"),
            verb,
            code: label("code"),
        };
        // Series differing only in labels we drop (scope, version, contentType…) add up.
        *writes.entry(key).or_default() += value;
    }
    writes
}

/// Writes made between two scrapes (series that did not grow are left out).
pub fn delta(before: &Writes, after: &Writes) -> BTreeMap<WriteKey, u64> {
    after
        .iter()
        .filter_map(|(key, &now)| {
            let was = before.get(key).copied().unwrap_or(0.0);
            let grew = (now - was).round();
            (grew >= 1.0).then(|| (key.clone(), grew as u64))
        })
        .collect()
}

/// The labels and value of one sample line of `metric`, or `None` for any other line.
fn sample(line: &str, metric: &str) -> Option<(BTreeMap<String, String>, f64)> {
    let rest = line.strip_prefix(metric)?;
    let (labels, value) = if let Some(inner) = rest.strip_prefix('{') {
        let end = inner.rfind('}')?;
        (labels(&inner[..end])?, &inner[end + 1..])
    } else if rest.starts_with(' ') {
        (BTreeMap::new(), rest)
    } else {
        // Another metric sharing the prefix (`apiserver_request_total_foo`).
        return None;
    };
    let value = value.split_whitespace().next()?.parse().ok()?;
    Some((labels, value))
}

/// `a="x",b="y\"z"` → {a: x, b: y"z}.
fn labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut rest = text.trim_start_matches(',');
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.insert(name.trim().to_owned(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    Some(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",contentType="application/json",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 10
apiserver_request_total{code="409",component="apiserver",contentType="application/json",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",contentType="application/vnd.kubernetes.protobuf",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",contentType="application/json",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 99
apiserver_request_total{code="200",component="apiserver",contentType="application/json",dry_run="",group="ax.dev",resource="axtasks",scope="namespace",subresource="status",verb="APPLY",version="v1alpha1"} 1.5e+01
apiserver_request_total_other{code="201",verb="POST"} 7
apiserver_request_duration_seconds_bucket{verb="POST",le="0.1"} 3
"#;

    fn key(group: &str, resource: &str, sub: &str, verb: &str, code: &str) -> WriteKey {
        WriteKey {
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            verb: verb.into(),
            code: code.into(),
        }
    }

    #[test]
    fn keeps_mutating_verbs_by_resource_and_code() {
        let w = writes(TEXT);
        assert_eq!(w.len(), 4, "{w:?}");
        assert_eq!(w[&key("", "pods", "", "POST", "201")], 10.0);
        assert_eq!(w[&key("", "pods", "", "POST", "409")], 2.0);
        assert_eq!(w[&key("", "pods", "", "POST", "200")], 1.0);
        assert_eq!(w[&key("ax.dev", "axtasks", "status", "APPLY", "200")], 15.0);
    }

    #[test]
    fn series_that_differ_in_dropped_labels_add_up() {
        let text = "apiserver_request_total{code=\"201\",contentType=\"a\",resource=\"pods\",verb=\"POST\"} 1\n\
                    apiserver_request_total{code=\"201\",contentType=\"b\",resource=\"pods\",verb=\"POST\"} 2\n";
        assert_eq!(writes(text)[&key("", "pods", "", "POST", "201")], 3.0);
    }

    #[test]
    fn delta_is_what_grew_between_scrapes() {
        let before = writes(TEXT);
        let after = writes(&TEXT.replace("} 10\n", "} 25\n").replace(
            "apiserver_request_total_other",
            "apiserver_request_total{code=\"201\",group=\"batch\",resource=\"jobs\",verb=\"POST\"} 4\nx",
        ));
        let d = delta(&before, &after);
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(d[&key("", "pods", "", "POST", "201")], 15);
        assert_eq!(d[&key("batch", "jobs", "", "POST", "201")], 4);
    }

    #[test]
    fn escaped_label_values_are_read_whole() {
        let (labels, value) = sample(
            r#"apiserver_request_total{a="x\"y,z",b="2"} 3"#,
            "apiserver_request_total",
        )
        .unwrap();
        assert_eq!(labels["a"], "x\"y,z");
        assert_eq!(labels["b"], "2");
        assert_eq!(value, 3.0);
    }

    #[test]
    fn resources_are_named_and_classified() {
        let status = key("ax.dev", "axtasks", "status", "APPLY", "409");
        assert_eq!(status.display_resource(), "axtasks.ax.dev/status");
        assert!(status.is_conflict() && !status.is_success());
        assert_eq!(
            key("", "pods", "binding", "POST", "201").display_resource(),
            "pods/binding"
        );
        assert!(key("", "nodes", "status", "PATCH", "200").is_background());
        assert!(key("coordination.k8s.io", "leases", "", "PUT", "200").is_background());
        assert!(!key("", "pods", "", "POST", "201").is_background());
    }
}
