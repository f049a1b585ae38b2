//! `kubectl ax`, the kubectl plugin of ax (binary `kubectl-ax`): the operators' console in the
//! terminal. Each verb has its own module; the pure parts (tables, filters, DAG levels, error
//! classification, what to patch) are plain functions tested without a cluster, the rest reads
//! and writes through the user's kubeconfig.
//!
//! Errors are one line on stderr (`error: ...`). Exit codes: 0 done, 1 the operation failed (a
//! task ended otherwise, a request refused), 2 a usage error (clap's, or ours), 3 `wait` timed out.

pub mod args;
pub mod complete;
pub mod cron;
pub mod dag;
pub mod delete;
pub mod describe;
pub mod format;
pub mod list;
pub mod logs;
pub mod output;
pub mod rerun;
pub mod resubmit;
pub mod submit;
pub mod suspend;
pub mod target;
pub mod top;
pub mod wait;

use std::io::Write;

use clap::CommandFactory;

use crate::client::ctx::Ctx;
use crate::client::error::{self, ClientError};
use crate::client::operator;

use args::{Cli, Command, Shell};

/// Runs one command line; the exit code to end the process with.
pub async fn main(cli: Cli) -> i32 {
    match run(cli).await {
        Ok(()) => 0,
        // `kubectl ax list | head`: a closed pipe is the reader's choice, not an error.
        Err(ClientError::Io(e)) if e.contains("Broken pipe") => 0,
        Err(e) => {
            eprintln!("error: {e}");
            exit_code(&e)
        }
    }
}

pub async fn run(cli: Cli) -> Result<(), ClientError> {
    match &cli.command {
        Command::Completion(args) => return completion(args.shell),
        Command::Version(args) if args.client => {
            println!("kubectl-ax {}", env!("CARGO_PKG_VERSION"));
            return Ok(());
        }
        _ => {}
    }
    let ctx = Ctx::connect(&cli.global).await?;
    match &cli.command {
        Command::List(args) => list::run(&ctx, args).await,
        Command::Describe(args) => describe::run(&ctx, args).await,
        Command::Retry(args) => rerun::retry(&ctx, args).await,
        Command::Cancel(args) => rerun::cancel(&ctx, args).await,
        Command::Suspend(args) => suspend::run(&ctx, args, true).await,
        Command::Resume(args) => suspend::run(&ctx, args, false).await,
        Command::Logs(args) => logs::run(&ctx, args).await,
        Command::Dag(args) => dag::run(&ctx, args).await,
        Command::Top(args) => top::run(&ctx, args).await,
        Command::Submit(args) => submit::run(&ctx, args).await,
        Command::Wait(args) => wait::run(&ctx, args).await,
        Command::Delete(args) => delete::run(&ctx, args).await,
        Command::Resubmit(args) => resubmit::run(&ctx, args).await,
        Command::Ui(args) => crate::console::run(ctx, args).await,
        Command::Cron(args) => cron::run(&ctx, args).await,
        Command::Version(_) => version(&ctx).await,
        Command::Completion(_) => unreachable!("handled before connecting"),
    }
}

/// The exit code of a failed command.
pub fn exit_code(e: &ClientError) -> i32 {
    match e {
        ClientError::Usage(_) => 2,
        ClientError::TimedOut(_) => 3,
        _ => 1,
    }
}

fn completion(shell: Shell) -> Result<(), ClientError> {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut command = Cli::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut command, "kubectl-ax", &mut out);
    out.flush()?;
    Ok(())
}

async fn version(ctx: &Ctx) -> Result<(), ClientError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "kubectl-ax {}", env!("CARGO_PKG_VERSION"))?;
    let server = ctx
        .client
        .apiserver_version()
        .await
        .map_err(|e| ClientError::Unreachable(error::error_chain(&e)))?;
    writeln!(out, "server     {}", server.git_version)?;
    let operator = match operator::state(ctx).await {
        Ok(state) => state.describe(),
        Err(e) => format!("unknown ({e})"),
    };
    writeln!(
        out,
        "operator   {operator} [Lease {}/{}]",
        operator::lease_namespace(ctx).await,
        ctx.global.operator_lease
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::Parser;

    #[test]
    fn the_krew_manifest_installs_this_binary_at_this_version() {
        let template = include_str!("../../plugins/ax.yaml")
            .replace("@VERSION@", env!("CARGO_PKG_VERSION"))
            .replace("@URI@", "https://example.org/kubectl-ax.tar.gz")
            .replace("@SHA256@", &"0".repeat(64));
        let manifest: serde_json::Value = crate::yaml::from_str(&template).expect("YAML");
        assert_eq!(manifest["kind"], "Plugin");
        assert_eq!(manifest["metadata"]["name"], "ax", "`kubectl ax`");
        assert_eq!(
            manifest["spec"]["version"],
            format!("v{}", env!("CARGO_PKG_VERSION"))
        );
        let platform = &manifest["spec"]["platforms"][0];
        assert_eq!(platform["bin"], "kubectl-ax");
        assert_eq!(platform["files"][0]["from"], "kubectl-ax");
        assert_eq!(
            Cli::command().get_name(),
            "kubectl-ax",
            "the binary kubectl runs as `kubectl ax`"
        );
    }

    fn parse(line: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kubectl-ax").chain(line.split_whitespace()))
    }

    fn dry_run_of(line: &str) -> args::DryRun {
        match parse(line)
            .unwrap_or_else(|e| panic!("{line}: {e}"))
            .command
        {
            Command::Retry(a) => a.dry_run,
            Command::Cancel(a) => a.dry_run,
            Command::Suspend(a) | Command::Resume(a) => a.dry_run,
            Command::Submit(a) => a.dry_run,
            Command::Delete(a) => a.dry_run,
            Command::Resubmit(a) => a.dry_run,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn dry_run_takes_kubectls_values_and_a_bare_flag_keeps_its_old_meaning() {
        use args::DryRun;
        for verb in ["retry x", "cancel x", "suspend x", "resume x"] {
            assert_eq!(dry_run_of(verb), DryRun::None, "{verb}");
            assert_eq!(dry_run_of(&format!("{verb} --dry-run")), DryRun::Server);
            assert_eq!(
                dry_run_of(&format!("{verb} --dry-run=client")),
                DryRun::Client
            );
            assert_eq!(dry_run_of(&format!("{verb} --dry-run=none")), DryRun::None);
        }
        for verb in ["submit --type t --image i", "delete x", "resubmit x"] {
            assert_eq!(dry_run_of(&format!("{verb} --dry-run")), DryRun::Client);
            assert_eq!(
                dry_run_of(&format!("{verb} --dry-run=server")),
                DryRun::Server
            );
        }
        assert!(parse("delete --dry-run=maybe x").is_err());
    }

    #[test]
    fn timeout_of_submit_belongs_to_wait() {
        assert!(parse("submit --type t --image i --timeout 5m").is_err());
        let Command::Submit(a) = parse("submit --type t --image i --wait --timeout 5m")
            .unwrap()
            .command
        else {
            panic!("submit")
        };
        assert!(a.wait.wait);
        assert_eq!(a.wait.timeout.as_deref(), Some("5m"));
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
