//! `/readyz` means ready (DESIGN §6): 503 until the role is known and every informer cache has
//! listed, 200 after. The operator under test reaches the API server through a TCP proxy that holds
//! every connection until the test opens it, so "before sync" lasts as long as the test wants and
//! no timing luck is involved. Starts its own operators: run with `--test-threads 1` after the
//! shared operator is stopped (e2e/run-tests.sh's OWN_OPERATOR list).

mod common;

use std::time::{Duration, Instant};

use common::process::Operator;
use common::repo_root;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP proxy to the API server whose connections wait until it is opened.
struct GatedProxy {
    port: u16,
    open: watch::Sender<bool>,
}

impl GatedProxy {
    async fn start(upstream: String) -> GatedProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (open, gate) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let (mut gate, upstream) = (gate.clone(), upstream.clone());
                tokio::spawn(async move {
                    if gate.wait_for(|open| *open).await.is_err() {
                        return;
                    }
                    if let Ok(mut outbound) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        GatedProxy { port, open }
    }

    fn open(&self) {
        self.open.send_replace(true);
    }
}

/// The operator's kubeconfig with its server replaced by the proxy on `proxy_port`; returns (the
/// file written, the API server's original host:port).
fn kubeconfig_through(proxy_port: u16, name: &str) -> (std::path::PathBuf, String) {
    let path = std::env::var("AX_OPERATOR_KUBECONFIG")
        .expect("AX_OPERATOR_KUBECONFIG (set by e2e/run-tests.sh and with-cluster)");
    let text = std::fs::read_to_string(&path).expect("read the operator's kubeconfig");
    let mut config: serde_json::Value = ax::yaml::from_str(&text).expect("kubeconfig YAML");
    let mut upstream = None;
    for cluster in config["clusters"].as_array_mut().expect("clusters") {
        let server = cluster["cluster"]["server"]
            .as_str()
            .expect("server")
            .to_string();
        let authority = server
            .strip_prefix("https://")
            .expect("an https server")
            .trim_end_matches('/')
            .to_string();
        // The API server's certificate names 127.0.0.1; only the port changes.
        let host = authority
            .rsplit_once(':')
            .map_or(authority.as_str(), |(h, _)| h);
        cluster["cluster"]["server"] = format!("https://{host}:{proxy_port}").into();
        upstream = Some(authority);
    }
    let dir = repo_root().join("target/e2e");
    std::fs::create_dir_all(&dir).expect("target/e2e");
    let file = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&file, ax::yaml::to_string(&config).expect("YAML")).expect("write kubeconfig");
    (file, upstream.expect("a cluster in the kubeconfig"))
}

/// An operator as `name` with the credentials of `kubeconfig`, its /readyz on a port of its own,
/// stopped with SIGTERM when dropped (a leader releases its Lease for the next test's operator).
fn start_operator(name: &str, kubeconfig: &std::path::Path, args: &[&str]) -> Operator {
    Operator::builder(name)
        .kubeconfig(kubeconfig)
        .args(args)
        .http_port()
        .terminate_on_drop()
        .start()
}

/// Holds the API server away for a few seconds and checks /readyz says 503 with `reason`
/// throughout.
async fn assert_not_ready_while_held(operator: &Operator, reason: &str) {
    let (code, body) = operator.first_answer(Duration::from_secs(30)).await;
    assert_eq!((code, body.as_str()), (503, format!("{reason}\n").as_str()));
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let answer = operator.readyz().await;
        assert_eq!(
            answer.as_ref().map(|(c, b)| (*c, b.as_str())),
            Some((503, format!("{reason}\n").as_str())),
            "ready before the API server answered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn readyz_is_503_until_every_cache_has_listed() {
    // Without leader election the role is known at once: only the caches hold readiness.
    let (_, upstream) = kubeconfig_through(1, "readiness-probe");
    let proxy = GatedProxy::start(upstream).await;
    let (kubeconfig, _) = kubeconfig_through(proxy.port, "readiness-caches");
    let operator = start_operator("readiness-caches", &kubeconfig, &["--leader-elect=false"]);
    assert_not_ready_while_held(&operator, "caches not synced").await;
    proxy.open();
    operator.wait_ready(Duration::from_secs(60)).await;
}

#[tokio::test]
async fn readyz_is_503_until_the_role_is_known_then_200_once_leading_and_synced() {
    let (_, upstream) = kubeconfig_through(1, "readiness-probe");
    let proxy = GatedProxy::start(upstream).await;
    let (kubeconfig, _) = kubeconfig_through(proxy.port, "readiness-role");
    let operator = start_operator("readiness-role", &kubeconfig, &[]);
    assert_not_ready_while_held(&operator, "leader election role not known").await;
    proxy.open();
    // Alone, it takes the Lease, then its caches list.
    operator.wait_ready(Duration::from_secs(90)).await;
}
