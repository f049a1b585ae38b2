//! kubectl-ax: the kubectl plugin of ax (`kubectl ax ...`). All logic lives in `ax::cli`.

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cli = ax::cli::args::Cli::parse();
    std::process::exit(ax::cli::main(cli).await);
}
