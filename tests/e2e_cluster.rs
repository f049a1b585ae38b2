//! The local cluster itself: a pod on the real kubelet runs, and its terminal phase, exit code,
//! termination message and logs come back through the API server.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams, PostParams};

#[tokio::test]
async fn a_pod_on_the_real_kubelet_reports_exit_code_and_termination_message() {
    let client = client().await;
    let ns = namespace(&client, "pod").await;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "exits-3"},
        "spec": {
            "restartPolicy": "Never",
            "dnsPolicy": "Default",
            "nodeName": "localhost",
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "main",
                "image": "localhost/ax-busybox:1",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo hi; echo '{\"error\":\"biz\"}' > /dev/termination-log; exit 3"]
            }]
        }
    }))
    .unwrap();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // A brand-new namespace gets its default ServiceAccount a moment later; until then the API
    // server asks to retry.
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = api.create(&PostParams::default(), &pod).await {
        assert!(Instant::now() < deadline, "creating the pod: {e}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let deadline = Instant::now() + LONG;
    let pod = loop {
        let pod = api.get("exits-3").await.unwrap();
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        if phase == "Failed" || phase == "Succeeded" {
            break pod;
        }
        assert!(
            Instant::now() < deadline,
            "pod still {phase} after {LONG:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let status = pod.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    let terminated = status.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(terminated.exit_code, 3);
    assert_eq!(
        terminated.message.as_deref().map(str::trim),
        Some(r#"{"error":"biz"}"#)
    );
    let logs = api.logs("exits-3", &LogParams::default()).await.unwrap();
    assert_eq!(logs.trim(), "hi");
}
