//! ax-operator: runs the AxTask controller and the dispatcher against the cluster in KUBECONFIG
//! (or the in-cluster service account).

use ax::controller::run::{Settings, run};
use clap::Parser;
use tracing_subscriber::EnvFilter;

#[derive(Parser, Debug)]
#[command(
    name = "ax-operator",
    version,
    about = "Runs AxTasks as worker pods: queue, dispatch, supervise, retry"
)]
struct Args {
    /// Maximum number of tasks Scheduled or Running at once.
    #[arg(long, env = "AX_CONCURRENCY", default_value_t = 100)]
    concurrency: usize,
    /// Log format.
    #[arg(long, env = "AX_LOG_FORMAT", value_parser = ["text", "json"], default_value = "text")]
    log_format: String,
    /// Name recorded as the actor of transitions (`ax-operator/<identity>`); the pod name in-cluster.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
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
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("pid-{}", std::process::id()));
    let client = kube::Client::try_default().await?;
    run(
        client,
        Settings {
            concurrency: args.concurrency,
            identity,
        },
    )
    .await
}
