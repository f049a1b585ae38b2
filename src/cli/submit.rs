//! `kubectl ax submit`: an AxTask from flags, or from a manifest with flags overriding its fields
//! (built by `client::submit`, as the console's form is); `run` reads the manifest and payload
//! files, creates the task and prints its name (client required).

use std::io::{Read, Write};

use kube::ResourceExt;
use kube::api::PostParams;
use serde_json::Value;

use crate::client::ctx::Ctx;
use crate::client::error::{ClientError, Op, Resource, from_kube};
use crate::client::operator;
use crate::client::submit::{build_task, parse_payload};

use super::args::SubmitArgs;
use super::list::to_yaml;

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
    if args.dry_run {
        std::io::stdout()
            .lock()
            .write_all(to_yaml(&task)?.as_bytes())?;
        return Ok(());
    }
    operator::check(ctx).await?;
    let op = Op::new("create", Resource::Task).namespace(Some(&namespace));
    let created = ctx
        .tasks(Some(&namespace))
        .create(&PostParams::default(), &task)
        .await
        .map_err(|e| from_kube(&op, e))?;
    writeln!(std::io::stdout().lock(), "{}", created.name_any())?;
    Ok(())
}
