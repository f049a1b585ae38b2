//! AxCrons as tests read them: a cron of a spec, and a task template to put in it.

use crate::api::AxCron;

pub fn cron(name: &str, spec: serde_json::Value) -> AxCron {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxCron",
        "metadata": {"name": name, "namespace": "ns", "uid": "u-1", "generation": 1},
        "spec": spec,
    }))
    .expect("an AxCron")
}

pub fn task() -> serde_json::Value {
    serde_json::json!({"type": "t", "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}})
}
