//! ax-operator: runs the AxTask controller and the dispatcher against the cluster in KUBECONFIG
//! (or the in-cluster service account), with leader election, metrics and health endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ax::controller::run::{Settings, run};
use ax::core::egress::Allowlist;
use ax::core::trace::Sampler;
use ax::ops::api_requests::CountRequestsLayer;
use ax::ops::http::{self, HttpState};
use ax::ops::leader::{LEASE_NAME, Leadership, LeaseSettings, Role};
use ax::ops::metrics::{DEFAULT_MAX_TYPES, Metrics};
use ax::ops::traces::{TraceConfig, TraceProtocol, Traces};
use clap::Parser;
use tokio::sync::watch;
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser, Debug)]
#[command(
    name = "ax-operator",
    version,
    about = "Runs AxTasks as worker pods: queue, dispatch, supervise, retry"
)]
struct Args {
    /// `spec.concurrency` (most tasks Scheduled or Running at once) of the `default` AxQueue when
    /// the operator creates it because it is missing. An existing queue is never changed: limits
    /// live in the AxQueues (`kubectl edit axqueue default`) and edits apply without a restart.
    #[arg(long, env = "AX_CONCURRENCY", default_value_t = 100)]
    concurrency: u32,
    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, env = "AX_LOG_FORMAT", value_parser = ["text", "json"], default_value = "text")]
    log_format: String,
    /// Name recorded as the actor of transitions (`ax-operator/<identity>`) and held in the Lease;
    /// the pod name in-cluster. Defaults to the host name.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Namespace of the leader-election Lease: the operator's own.
    #[arg(long, env = "POD_NAMESPACE", default_value = "ax-system")]
    namespace: String,
    /// Compete for the `ax-operator` Lease and reconcile only while holding it.
    #[arg(long, env = "AX_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// How long a standby waits after the Lease last changed before it takes the lease over: a
    /// crashed leader is replaced after about this long.
    #[arg(long, env = "AX_LEASE_DURATION_SECONDS", default_value_t = 15)]
    lease_duration_seconds: u64,
    /// How long the leader keeps leading without a successful renewal (however slow the API
    /// server answers meanwhile); less than the lease duration, the difference being the time the
    /// old leader has to stop before a standby may start.
    #[arg(long, env = "AX_RENEW_DEADLINE_SECONDS", default_value_t = 10)]
    renew_deadline_seconds: u64,
    /// How often the leader renews the Lease and a standby reads it; less than the renew deadline.
    #[arg(long, env = "AX_RENEW_INTERVAL_SECONDS", default_value_t = 2)]
    renew_interval_seconds: u64,
    /// Callback destinations admitted beyond public addresses, comma-separated. An address or CIDR
    /// (`127.0.0.2`, `10.0.0.0/8`, `fd00::/8`) admits every address in it, loopback and link-local
    /// included; a host suffix (`svc.cluster.local`) lets names equal to it or ending in it resolve
    /// to private addresses. Everything else that is not public is refused (`CallbackRefused`).
    #[arg(long, env = "AX_CALLBACK_ALLOW", value_delimiter = ',')]
    callback_allow: Vec<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "AX_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// How long after a dispatch the task's status may wait before it says Scheduled or Running:
    /// an attempt that ends sooner is written once, with its whole path, instead of three times.
    /// Outcomes, failures and cancels are written at once. 0 writes every change at once.
    #[arg(long, env = "AX_PROGRESS_WRITE_DELAY_SECONDS", default_value_t = 3.0,
        value_parser = seconds)]
    progress_write_delay_seconds: f64,
    /// Status writes that record only progress and are due (their delay ran out) are made at most
    /// this many a second, in the order they fell due; an outcome that comes first carries the
    /// progress instead. In a burst this keeps the API server on the work; outcomes never wait.
    #[arg(long, env = "AX_PROGRESS_WRITES_PER_SECOND", default_value_t = 10,
        value_parser = clap::value_parser!(u32).range(1..=100_000))]
    progress_writes_per_second: u32,
    /// Distinct task types the metrics name (the `type` label): the first this many seen since the
    /// operator started keep their name, later ones are reported as `other`, so a client that
    /// makes up types cannot grow the metrics without bound.
    #[arg(long, env = "AX_METRICS_MAX_TYPES", default_value_t = DEFAULT_MAX_TYPES)]
    metrics_max_types: usize,
    /// OTLP endpoint for task traces (`http://collector:4317` for gRPC, `http://collector:4318`
    /// for HTTP). Unset: no traces, and tasks get no `status.trace`.
    #[arg(long, env = "AX_TRACE_ENDPOINT")]
    trace_endpoint: Option<String>,
    /// How spans reach the endpoint: OTLP over gRPC or over HTTP (protobuf).
    #[arg(long, env = "AX_TRACE_PROTOCOL", value_enum, default_value = "http")]
    trace_protocol: TraceProtocol,
    /// Which task traces are exported: `always`, `ratio` (of trace ids) or `parentbased` (the
    /// submitter's decision when a task continues its trace, else the ratio).
    #[arg(long, env = "AX_TRACE_SAMPLER", value_parser = ["always", "ratio", "parentbased"],
        default_value = "parentbased")]
    trace_sampler: String,
    /// The fraction of traces `ratio` and `parentbased` sample, from 0 to 1.
    #[arg(long, env = "AX_TRACE_SAMPLER_RATIO", default_value_t = 1.0)]
    trace_sampler_ratio: f64,
}

/// A number of seconds from 0 to one hour.
fn seconds(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(s) if (0.0..=3600.0).contains(&s) => Ok(s),
        _ => Err(format!("{value} is not a number of seconds from 0 to 3600")),
    }
}

/// mimalloc rather than glibc's malloc: the cache of a large backlog is millions of small
/// allocations made on whichever worker thread parsed them. Measured on 100,000 pending tasks
/// (`ax-bench memory`, after a restart): RSS 233 MiB against 252 MiB with glibc held to two arenas
/// and trimmed, and 30% less CPU for the rebuild's list, a third of which glibc spent in its arena
/// locks.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,kube=warn"));
    let subscriber = tracing_subscriber::fmt().with_env_filter(filter);
    if args.log_format == "json" {
        subscriber.json().init();
    } else {
        subscriber.init();
    }
    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("pid-{}", std::process::id()));
    let callback_allow = Allowlist::parse(args.callback_allow.iter().map(String::as_str))?;
    info!(allow = %callback_allow, "callbacks go to public addresses and these");
    let metrics = Arc::new(Metrics::with_max_types(args.metrics_max_types));
    let client = kube::client::ClientBuilder::try_from(kube::Config::infer().await?)?
        .with_layer(&CountRequestsLayer::new(metrics.clone()))
        .build();

    let traces = match args.trace_endpoint.as_ref().filter(|e| !e.is_empty()) {
        Some(endpoint) => Traces::start(
            &TraceConfig {
                endpoint: endpoint.clone(),
                protocol: args.trace_protocol,
                sampler: Sampler::parse(&args.trace_sampler, args.trace_sampler_ratio)?,
            },
            metrics.clone(),
        )?,
        None => Traces::off(),
    };

    let http_state = HttpState::new(metrics.clone());
    let server_state = http_state.clone();
    let addr = args.metrics_addr;
    tokio::spawn(async move {
        if let Err(e) = http::serve(addr, server_state).await {
            error!(%addr, error = %e, "HTTP server stopped");
            std::process::exit(1);
        }
    });
    info!(%addr, "serving /metrics, /healthz, /readyz");

    // run() reports when every informer cache has listed; /readyz waits for it while leading.
    let (caches_synced, synced) = watch::channel(false);
    let settings = Settings {
        default_queue_concurrency: args.concurrency,
        identity: identity.clone(),
        metrics: metrics.clone(),
        callback_allow,
        caches_synced,
        progress_write_delay: Duration::from_secs_f64(args.progress_write_delay_seconds),
        progress_writes_per_second: args.progress_writes_per_second,
        traces,
    };
    if !args.leader_elect {
        let (_always_leader, roles) = watch::channel(Role::Leader);
        tokio::spawn(follow_readiness(http_state, metrics, roles, synced));
        return run(client, settings).await;
    }

    let lease = LeaseSettings {
        namespace: args.namespace.clone(),
        lease_name: LEASE_NAME.into(),
        identity,
        lease_duration: Duration::from_secs(args.lease_duration_seconds),
        renew_deadline: Duration::from_secs(args.renew_deadline_seconds),
        retry_period: Duration::from_secs(args.renew_interval_seconds),
    };
    let leadership = Leadership::start(client.clone(), lease)?;
    tokio::spawn(follow_readiness(
        http_state,
        metrics,
        leadership.subscribe(),
        synced,
    ));
    info!(
        namespace = args.namespace,
        lease = LEASE_NAME,
        "waiting to become the leader"
    );
    let mut shutdown = std::pin::pin!(shutdown_signal());
    tokio::select! {
        acquired = leadership.acquire() => acquired?,
        _ = &mut shutdown => {
            // A standby has nothing to finish: stop at once instead of waiting out the grace period.
            info!("stopping (standby)");
            leadership.step_down().await;
            return Ok(());
        }
    }
    info!("leading: reconciling");
    tokio::select! {
        // The controllers stop on SIGTERM themselves; then hand the lease over at once.
        result = run(client, settings) => {
            leadership.step_down().await;
            result
        }
        _ = leadership.lost() => {
            // Stop at once: another replica may take over once our renew deadline has passed, and
            // this process may still have writes in flight. Restarting makes us a standby.
            error!("lost the lease; exiting");
            std::process::exit(1);
        }
    }
}

/// Keeps `/readyz` and `ax_leader` in step with the role and the caches: ready once the role is
/// known and, while leading, once every cache has listed (a standby reads no caches).
async fn follow_readiness(
    state: HttpState,
    metrics: Arc<Metrics>,
    mut roles: watch::Receiver<Role>,
    mut synced: watch::Receiver<bool>,
) {
    let (mut roles_open, mut synced_open) = (true, true);
    while roles_open || synced_open {
        let role = *roles.borrow_and_update();
        let caches = *synced.borrow_and_update();
        state.set_role_known(role != Role::Unknown);
        state.set_caches_synced(role == Role::Standby || caches);
        metrics.set_leader(role == Role::Leader);
        tokio::select! {
            changed = roles.changed(), if roles_open => roles_open = changed.is_ok(),
            changed = synced.changed(), if synced_open => synced_open = changed.is_ok(),
        }
    }
}

/// Resolves on SIGTERM (what Kubernetes sends) or Ctrl-C.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}
