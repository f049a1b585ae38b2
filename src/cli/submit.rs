//! `kubectl ax submit`: an AxTask from flags, or from a manifest with flags overriding its fields
//! (built by `client::submit`, as the console's form is); `run` reads the manifest and payload
//! files, creates the task and prints its name, and with `--wait` waits for it (client
//! required).

use std::io::{Read, Write};

use kube::ResourceExt;
use kube::api::PostParams;
use serde_json::Value;

use crate::api::AxTask;
use crate::client::ctx::Ctx;
use crate::client::error::{ClientError, Op, Resource, from_kube};
use crate::client::format::parse_duration;
use crate::client::operator;
use crate::client::rerun::FIELD_MANAGER;
use crate::client::submit::{build_task, parse_payload};

use super::args::{DryRun, SubmitArgs, SubmitWaitArgs, WaitArgs, WaitFor};
use super::list::to_yaml;

/// `--timeout` of `submit --wait`, as `kubectl ax wait` has it.
pub const DEFAULT_WAIT_TIMEOUT: &str = "10m";

fn read_source(path: &std::path::Path) -> Result<String, ClientError> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        return Ok(text);
    }
    std::fs::read_to_string(path)
        .map_err(|e| ClientError::Usage(format!("{}: {e}", path.display())))
}

pub async fn run(ctx: &Ctx, args: &SubmitArgs) -> Result<(), ClientError> {
    let base = match &args.file {
        Some(path) => {
            let text = read_source(path)?;
            let value: Value = crate::yaml::from_str(&text).map_err(|e| {
                ClientError::Usage(format!("{}: not YAML or JSON: {e}", path.display()))
            })?;
            Some(value)
        }
        None => None,
    };
    let payload = match &args.task.payload {
        Some(p) => match p.strip_prefix('@') {
            Some(file) => {
                let text = read_source(std::path::Path::new(file))?;
                Some(parse_payload(p, Some(&text))?)
            }
            None => Some(parse_payload(p, None)?),
        },
        None => None,
    };
    // -n wins; else the manifest's namespace; else the context's.
    let file_namespace = base
        .as_ref()
        .and_then(|b| b["metadata"]["namespace"].as_str())
        .map(str::to_owned);
    let namespace = match (&ctx.global.namespace, file_namespace) {
        (Some(ns), _) => ns.clone(),
        (None, Some(ns)) => ns,
        (None, None) => ctx.namespace.clone(),
    };
    let task = build_task(&args.task, base, payload, &namespace)?;
    create(ctx, &task, args.dry_run, &args.wait).await
}

/// Creates the task (or prints it, or has the server check it), prints its name, and with
/// `--wait` waits for it as `kubectl ax wait NAME --for succeeded` would; shared by `resubmit`.
pub async fn create(
    ctx: &Ctx,
    task: &AxTask,
    dry_run: DryRun,
    wait: &SubmitWaitArgs,
) -> Result<(), ClientError> {
    if dry_run == DryRun::Client {
        std::io::stdout()
            .lock()
            .write_all(to_yaml(task)?.as_bytes())?;
        return Ok(());
    }
    // Checked before the request, so that a bad value fails before anything is created.
    let timeout = wait.timeout.as_deref().unwrap_or(DEFAULT_WAIT_TIMEOUT);
    parse_duration("timeout", timeout)?;
    if !dry_run.is_dry() {
        operator::check(ctx).await?;
    }
    let namespace = task.namespace().unwrap_or_else(|| ctx.namespace.clone());
    let op = Op::new("create", Resource::Task).namespace(Some(&namespace));
    let params = PostParams {
        dry_run: dry_run.is_dry(),
        field_manager: Some(FIELD_MANAGER.into()),
    };
    let created = ctx
        .tasks(Some(&namespace))
        .create(&params, task)
        .await
        .map_err(|e| from_kube(&op, e))?;
    let name = created.name_any();
    {
        let mut out = std::io::stdout().lock();
        if dry_run.is_dry() {
            writeln!(out, "axtask/{name} created{}", dry_run.note())?;
            return Ok(());
        }
        // The name first, on its own line, even when a wait follows: scripts read it.
        writeln!(out, "{name}")?;
        out.flush()?;
    }
    if !wait.wait {
        return Ok(());
    }
    let in_namespace = ctx.in_namespace(&namespace);
    let args = WaitArgs {
        targets: vec![name],
        condition: WaitFor::Succeeded,
        timeout: timeout.to_owned(),
    };
    super::wait::run(&in_namespace, &args).await
}
