//! AxQueues made for one test.

use std::time::{Duration, Instant};

use ax::api::AxQueue;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::run_kubectl;

/// An AxQueue for one test, deleted when the test ends (also when it fails).
pub struct TestQueue {
    pub name: String,
}

impl Drop for TestQueue {
    fn drop(&mut self) {
        run_kubectl(
            &[
                "delete",
                "axqueue",
                &self.name,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}

pub async fn create_queue(client: &Client, test: &str, spec: serde_json::Value) -> TestQueue {
    let name = format!("e2e-{test}-{:04x}", rand::random::<u16>());
    let queue: AxQueue = serde_json::from_value(json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxQueue",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("an AxQueue");
    let api: Api<AxQueue> = Api::all(client.clone());
    api.create(&PostParams::default(), &queue)
        .await
        .expect("create queue");
    TestQueue { name }
}

pub async fn patch_queue(client: &Client, name: &str, spec: serde_json::Value) {
    let api: Api<AxQueue> = Api::all(client.clone());
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": spec})),
    )
    .await
    .expect("patch queue");
}

pub async fn get_queue(client: &Client, name: &str) -> AxQueue {
    let api: Api<AxQueue> = Api::all(client.clone());
    api.get(name).await.expect("get queue")
}

/// Polls the queue until `done` holds, or panics after `timeout` showing its last status.
pub async fn wait_queue(
    client: &Client,
    name: &str,
    timeout: Duration,
    what: &str,
    mut done: impl FnMut(&AxQueue) -> bool,
) -> AxQueue {
    let deadline = Instant::now() + timeout;
    loop {
        let queue = get_queue(client, name).await;
        if done(&queue) {
            return queue;
        }
        assert!(
            Instant::now() < deadline,
            "queue {name}: {what} not within {timeout:?}; last status:\n{}",
            ax::yaml::to_string(&queue.status).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until the queue's status counts `n` tasks pending, so all of them are queued before the
/// queue opens.
pub async fn wait_pending(client: &Client, queue: &str, n: i64) {
    wait_queue(client, queue, super::LONG, &format!("{n} pending"), |q| {
        q.status.as_ref().is_some_and(|s| {
            let p = &s.pending;
            p.critical + p.high + p.normal + p.low == n
        })
    })
    .await;
}
