//! ax-sim: simulated Kubernetes nodes for scale tests (the approach KWOK takes). It registers Node
//! objects no kubelet runs, keeps them Ready, and drives the pods scheduled on them through the
//! status subresource as their env asks (see `script.rs`). Each node reports the capacity and
//! pressure conditions its annotations ask for; `--pool` makes the nodes a test's private pool
//! (`nodes.rs`).

mod nodes;
mod pods;
mod status;
mod writer;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

// The script contract is the library's, shared with the tests; `crate::script` names it here.
use ax_sim::script;
use clap::Parser;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tracing_subscriber::EnvFilter;

use crate::nodes::SimNodes;
use crate::pods::{Counters, PodDriver};
use crate::writer::ApiWriter;

#[derive(Debug, Parser)]
#[command(version, about = "Simulated Kubernetes nodes for ax scale tests")]
struct Args {
    /// Kubeconfig of the cluster; without it the usual inference applies (in-cluster, ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// How many nodes to simulate.
    #[arg(long, env = "AX_SIM_NODES")]
    nodes: usize,
    /// Node names are PREFIX-0 … PREFIX-(N-1).
    #[arg(long, env = "AX_SIM_PREFIX", default_value = "ax-sim")]
    prefix: String,
    /// Register the nodes as a private pool: label and taint `ax.dev/sim-pool=POOL` instead of
    /// `ax.dev/sim-node=true`, so only pods selecting that pool land there (a test's own nodes).
    /// Only pods labelled `ax.dev/sim-pool=POOL` are driven (and watched).
    #[arg(long, env = "AX_SIM_POOL")]
    pool: Option<String>,
    /// Most API writes in flight at once.
    #[arg(long, env = "AX_SIM_API_CONCURRENCY", default_value_t = 32)]
    api_concurrency: usize,
}

#[derive(Debug, thiserror::Error)]
enum SimError {
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("inferring the cluster config: {0}")]
    InferConfig(#[from] kube::config::InferConfigError),
    #[error("building the API client: {0}")]
    Client(#[source] kube::Error),
    #[error("installing the signal handler: {0}")]
    Signal(#[source] std::io::Error),
}

async fn client(kubeconfig: Option<&PathBuf>) -> Result<Client, SimError> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|source| SimError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|source| SimError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?
        }
        None => kube::Config::infer().await?,
    };
    Client::try_from(config).map_err(SimError::Client)
}

/// Logs what was done every 10 s while something changes: the throughput seen by the simulator.
async fn report_progress(counters: Arc<Counters>) {
    const PERIOD: Duration = Duration::from_secs(10);
    let mut last = counters.snapshot();
    let mut ticks = tokio::time::interval(PERIOD);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let now = counters.snapshot();
        if now != last {
            let rate = |index: usize| (now[index] - last[index]) as f64 / PERIOD.as_secs_f64();
            tracing::info!(
                started = now[0],
                finished = now[1],
                deleted = now[2],
                failed_writes = now[3],
                started_per_s = rate(0),
                finished_per_s = rate(1),
                deleted_per_s = rate(2),
                "pods driven"
            );
            last = now;
        }
    }
}

/// Registers the nodes, waiting out an API server that is not up yet (or briefly down).
async fn register_until_done(sim_nodes: &SimNodes) {
    const RETRY_AFTER: Duration = Duration::from_secs(5);
    while let Err(error) = sim_nodes.register_all().await {
        tracing::warn!(%error, "registering sim nodes failed; retrying in {RETRY_AFTER:?}");
        tokio::time::sleep(RETRY_AFTER).await;
    }
}

async fn run(args: Args) -> Result<(), SimError> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(SimError::Signal)?;
    let client = client(args.kubeconfig.as_ref()).await?;
    let simulate = async {
        let writer = ApiWriter::new(args.api_concurrency);
        // Report the server's own version as the "kubelet" version, so version checks see no skew.
        let kubelet_version = match writer
            .write("server version", || client.apiserver_version())
            .await
        {
            Ok(info) => info.git_version,
            Err(error) => {
                tracing::warn!(%error, "cannot read the API server version");
                "v0.0.0-ax-sim".to_owned()
            }
        };
        let names = nodes::node_names(&args.prefix, args.nodes);
        let marker = nodes::Marker::for_pool(args.pool.as_deref());
        let pod_selector = args.pool.is_some().then(|| marker.selector());
        let sim_nodes = SimNodes::new(
            client.clone(),
            writer.clone(),
            names,
            marker,
            kubelet_version,
        );
        register_until_done(&sim_nodes).await;
        tracing::info!(
            nodes = args.nodes,
            prefix = args.prefix,
            "sim nodes ready; driving their pods"
        );
        let counters = Arc::new(Counters::default());
        let driver = PodDriver::new(
            client.clone(),
            writer,
            sim_nodes.names(),
            pod_selector,
            counters.clone(),
        );
        tokio::join!(
            sim_nodes.keep_alive(),
            sim_nodes.watch(),
            driver.run(),
            report_progress(counters)
        );
    };
    tokio::select! {
        () = simulate => tracing::error!("ax-sim stopped driving pods"),
        _ = terminate.recv() => tracing::info!("SIGTERM: exiting"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: exiting"),
    }
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the tokio runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(args));
    // Pod tasks still sleeping are simply dropped: a restarted simulator picks their pods up again.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "ax-sim failed");
            ExitCode::FAILURE
        }
    }
}
