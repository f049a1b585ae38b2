//! `kubectl ax resubmit TASK`: a new task from another one's spec, for a fresh run with a history
//! of its own (where `retry` re-runs the same object). What the new task is, is decided by
//! `client::submit::resubmit_task` (pure); `run` reads the source and creates it as `submit`
//! does, `--wait` and `--dry-run` included (client required).

use crate::client::ctx::Ctx;
use crate::client::error::ClientError;
use crate::client::submit::resubmit_task;

use super::args::ResubmitArgs;
use super::target::{Kind, parse_target};

pub async fn run(ctx: &Ctx, args: &ResubmitArgs) -> Result<(), ClientError> {
    let target = parse_target(&args.task)?;
    if target.kind != Kind::Task {
        return Err(ClientError::Usage(format!(
            "{:?}: resubmit copies a task (a DAG runs again with `kubectl ax retry dag/NAME`)",
            args.task
        )));
    }
    let source = ctx.get_task(&target.name).await?;
    let task = resubmit_task(&source, args.name.as_deref());
    super::submit::create(ctx, &task, args.dry_run, &args.wait).await
}
