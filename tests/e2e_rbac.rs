//! The chart's user roles (`ax-view`, `ax-edit`, `ax-admin`, aggregated into Kubernetes' built-in
//! `view`, `edit` and `admin`): a ServiceAccount that only holds the built-in `edit` role in one
//! namespace uses `kubectl ax` there (submit, list, wait, retry, cancel) and gets a one-line
//! refusal naming the verb and resource in another.

mod common;

use std::time::{Duration, Instant};

use common::cli::{Run, ax_with, namespace_with_leader};
use common::helm::{chart_dir, helm};
use common::{kubectl_apply, run_kubectl, write_service_account_kubeconfig};
use serde_json::json;

const ROLES: [&str; 3] = ["ax-view", "ax-edit", "ax-admin"];

/// The chart's user roles applied as `helm template` renders them; deleted again when dropped, so
/// the Helm tests that run later install them into a cluster without them.
struct UserRoles;

impl UserRoles {
    fn apply() -> UserRoles {
        let chart = chart_dir();
        let rendered = helm(&[
            "template",
            "ax",
            chart.to_str().unwrap(),
            "--show-only",
            "templates/user-roles.yaml",
        ]);
        let (ok, _, err) = run_kubectl(&["apply", "-f", "-"], Some(&rendered));
        assert!(ok, "apply the user roles: {err}");
        UserRoles
    }
}

impl Drop for UserRoles {
    fn drop(&mut self) {
        let mut args = vec!["delete", "clusterrole", "--ignore-not-found"];
        args.extend(ROLES);
        run_kubectl(&args, None);
    }
}

/// `resource` may name a subresource, `axtasks.ax.dev/status` (kubectl would read what follows the
/// slash as an object's name).
fn can_i(account: &str, ns: &str, verb: &str, resource: &str) -> bool {
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    let subresource = format!("--subresource={subresource}");
    let mut args = vec!["auth", "can-i", verb, resource, "-n", ns, "--as", account];
    if subresource != "--subresource=" {
        args.push(&subresource);
    }
    let (_, out, _) = run_kubectl(&args, None);
    out.trim() == "yes"
}

async fn ax_as(kubeconfig: &str, ns: &str, args: &[&str]) -> Run {
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.extend([
        "-n".into(),
        ns.into(),
        "--kubeconfig".into(),
        kubeconfig.into(),
    ]);
    tokio::task::spawn_blocking(move || {
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        ax_with(&all, None, &[])
    })
    .await
    .expect("kubectl-ax thread")
}

#[tokio::test]
async fn the_builtin_edit_role_uses_ax_in_its_namespace_and_nowhere_else() {
    let (client, mine) = namespace_with_leader("rbac-mine").await;
    let other = common::namespace(&client, "rbac-other").await;
    let _roles = UserRoles::apply();
    kubectl_apply(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "alice", "namespace": mine}}));
    kubectl_apply(
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "alice-edit", "namespace": mine},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "alice", "namespace": mine}]}),
    );
    let alice = format!("system:serviceaccount:{mine}:alice");

    // The aggregation controller adds the rules to `edit` within a moment.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !can_i(&alice, &mine, "create", "axtasks.ax.dev") {
        assert!(
            Instant::now() < deadline,
            "`edit` never gained create on axtasks"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (verb, resource) in [
        ("patch", "axtasks.ax.dev"),
        ("delete", "axdags.ax.dev"),
        ("create", "axcrons.ax.dev"),
        ("watch", "axtasks.ax.dev"),
    ] {
        assert!(can_i(&alice, &mine, verb, resource), "{verb} {resource}");
        assert!(
            !can_i(&alice, &other, verb, resource),
            "{verb} {resource} in another namespace"
        );
    }
    assert!(
        !can_i(&alice, &mine, "patch", "axtasks.ax.dev/status"),
        "a task's status stays the operator's"
    );

    let file = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    write_service_account_kubeconfig(&mine, "alice", &file).await;
    let kc = file.to_str().unwrap();
    let submit = |name: &'static str, command: &'static str| {
        [
            "submit",
            "--name",
            name,
            "--type",
            "rbac",
            "--image",
            "busybox:1.36",
            "--max-retries",
            "0",
            "--command",
            command,
        ]
    };
    ax_as(kc, &mine, &submit("quick", "echo done")).await.ok();
    ax_as(
        kc,
        &mine,
        &submit("slow", "trap 'exit 143' TERM; sleep 300 & wait"),
    )
    .await
    .ok();
    let listed = ax_as(kc, &mine, &["list", "-o", "name"]).await.ok();
    assert!(
        listed.stdout.contains("quick") && listed.stdout.contains("slow"),
        "{listed:#?}"
    );
    ax_as(
        kc,
        &mine,
        &["wait", "quick", "--for", "succeeded", "--timeout", "2m"],
    )
    .await
    .ok();
    ax_as(kc, &mine, &["retry", "quick"]).await.ok();
    ax_as(kc, &mine, &["cancel", "slow", "--yes"]).await.ok();
    ax_as(kc, &mine, &["wait", "slow", "--timeout", "2m"])
        .await
        .ok();

    // Nothing in the other namespace: each refusal is one line naming the verb and resource.
    let line = ax_as(kc, &other, &["list"]).await.one_line_error();
    assert!(
        line.contains(&format!(
            "no permission to list axtasks.ax.dev in namespace \"{other}\" as \"{alice}\""
        )),
        "{line}"
    );
    let line = ax_as(kc, &other, &submit("intruder", "echo no"))
        .await
        .one_line_error();
    assert!(
        line.contains("no permission to create axtasks.ax.dev"),
        "{line}"
    );
}
