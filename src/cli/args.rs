//! The command line of `kubectl ax`: every verb and flag, as clap derive types (no logic here).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::client::ctx::GlobalArgs;
use crate::client::submit::TaskFields;
use crate::console::UiArgs;

/// `kubectl ax`: the ax operators' console (tasks, DAGs, queues) in the terminal.
#[derive(Parser, Debug)]
#[command(
    name = "kubectl-ax",
    bin_name = "kubectl-ax",
    version,
    about = "The ax console: list, inspect, re-run and cancel AxTasks, show DAGs, queues and crons",
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

// One value per run: the size difference between verbs does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// List tasks, like `kubectl get axtasks` with filters, the last reason and its age.
    #[command(visible_alias = "ls")]
    List(ListArgs),
    /// A task's history as a table, one row per attempt, and why it is waiting now; or a DAG's
    /// nodes, a queue's limits and counts, a cron's schedule (`dag/NAME`, `queue/NAME`,
    /// `cron/NAME`).
    Describe(DescribeArgs),
    /// Re-run finished tasks (or DAGs: `dag/NAME`) through `spec.rerun`.
    Retry(RetryArgs),
    /// Cancel tasks (or DAGs: `dag/NAME`) through `spec.cancel`.
    Cancel(CancelArgs),
    /// Hold tasks before dispatch (`spec.suspend`), or stop a queue dispatching (`queue/NAME`:
    /// `stopPolicy: Hold`, or `HoldAndDrain` with `--drain`).
    Suspend(SuspendArgs),
    /// Let suspended tasks, or a held queue (`queue/NAME`), dispatch again.
    Resume(SuspendArgs),
    /// The worker pod's logs of one attempt of a task.
    Logs(LogsArgs),
    /// A DAG as levels: each task with its phase, its child AxTask and what it depends on.
    Dag(DagArgs),
    /// Queues at a glance: pending per bucket, running / concurrency, open circuits, retry tokens.
    Top(TopArgs),
    /// Create a task from flags, or from a file with flags overriding it; prints its name.
    Submit(SubmitArgs),
    /// Wait until tasks (or `dag/NAME`) finish; exit 0 only when the condition holds.
    Wait(WaitArgs),
    /// Delete tasks (or DAGs: `dag/NAME`) by name, labels, or age of finished ones.
    Delete(DeleteArgs),
    /// Create a new task from another one's spec (a fresh run under a new name).
    Resubmit(ResubmitArgs),
    /// The web console: tasks, the state machine of each, queues, DAGs, a dashboard, a submit
    /// form, served on 127.0.0.1 with your own credentials.
    Ui(UiArgs),
    /// AxCrons: list them, fire one now, suspend or resume one.
    Cron(CronArgs),
    /// Shell completion script for bash, zsh or fish.
    Completion(CompletionArgs),
    /// The version of kubectl-ax, the API server and who holds the operator Lease.
    Version(VersionArgs),
}

pub use super::output::OutputFormat;

/// `--dry-run` as kubectl has it: `client` decides and prints without calling the API server,
/// `server` sends the request with `dryRun=All` (validated, not stored), `none` acts.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DryRun {
    #[default]
    None,
    Client,
    Server,
}

impl DryRun {
    pub fn is_dry(self) -> bool {
        self != DryRun::None
    }

    /// The note after each line of output, as kubectl writes it.
    pub fn note(self) -> &'static str {
        match self {
            DryRun::None => "",
            DryRun::Client => " (dry run)",
            DryRun::Server => " (server dry run)",
        }
    }
}

#[derive(Args, Debug, Default, Clone)]
pub struct TaskFilterArgs {
    /// Only tasks in these phases (comma-separated or repeated), e.g. `--phase Dead,Canceled`.
    #[arg(long, value_delimiter = ',')]
    pub phase: Vec<String>,
    /// Only tasks of this type (`spec.type`).
    #[arg(long = "type")]
    pub task_type: Option<String>,
    /// Only tasks waiting in, or dispatched from, this AxQueue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Label selector, as for kubectl (`-l app=x,tier!=db`).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub filter: TaskFilterArgs,
    /// Output format: wide (more columns), json, yaml, name or jsonpath=TEMPLATE (kubectl's).
    #[arg(short = 'o', long)]
    pub output: Option<OutputFormat>,
    /// After the list, print each change as it happens (an API watch).
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// No header line.
    #[arg(long)]
    pub no_headers: bool,
}

#[derive(Args, Debug)]
pub struct DescribeArgs {
    /// The task, or `dag/NAME`, `queue/NAME`, `cron/NAME`.
    pub target: String,
    /// Instead of the description: json or yaml (the object as stored), name, or
    /// jsonpath=TEMPLATE.
    #[arg(short = 'o', long)]
    pub output: Option<OutputFormat>,
}

#[derive(Args, Debug)]
pub struct RetryArgs {
    /// Tasks by name, or `dag/NAME` for a DAG (re-runs what did not succeed).
    pub targets: Vec<String>,
    /// Tasks with these labels (only finished ones are re-run).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Tasks in these phases (only finished ones are re-run), e.g. `--phase Dead`.
    #[arg(long, value_delimiter = ',')]
    pub phase: Vec<String>,
    /// `client`: show what would be done; `server` (also bare `--dry-run`): the API server
    /// checks the request too; `none`: do it.
    #[arg(long, value_enum, num_args = 0..=1, require_equals = true,
          default_value = "none", default_missing_value = "server")]
    pub dry_run: DryRun,
}

#[derive(Args, Debug)]
pub struct CancelArgs {
    /// Tasks by name, or `dag/NAME` for a DAG (cancels every running child).
    pub targets: Vec<String>,
    /// Tasks with these labels (only unfinished ones are canceled).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Tasks of this AxQueue (only unfinished ones are canceled).
    #[arg(long)]
    pub queue: Option<String>,
    /// Do not ask for confirmation when more than one task matches.
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// `client`: show what would be done; `server` (also bare `--dry-run`): the API server
    /// checks the request too; `none`: do it.
    #[arg(long, value_enum, num_args = 0..=1, require_equals = true,
          default_value = "none", default_missing_value = "server")]
    pub dry_run: DryRun,
}

#[derive(Args, Debug)]
pub struct SuspendArgs {
    /// Tasks by name, or `queue/NAME` for an AxQueue.
    pub targets: Vec<String>,
    /// Tasks with these labels (only unfinished ones).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// `suspend queue/NAME` only: also stop its running attempts (`stopPolicy: HoldAndDrain`);
    /// they wait in the queue again without using a retry.
    #[arg(long)]
    pub drain: bool,
    /// `client`: show what would be done; `server` (also bare `--dry-run`): the API server
    /// checks the request too; `none`: do it.
    #[arg(long, value_enum, num_args = 0..=1, require_equals = true,
          default_value = "none", default_missing_value = "server")]
    pub dry_run: DryRun,
}

#[derive(Args, Debug)]
pub struct LogsArgs {
    /// The task.
    pub task: String,
    /// Attempt number (default: the current attempt).
    #[arg(long, conflicts_with = "previous")]
    pub attempt: Option<i32>,
    /// The attempt before the current one.
    #[arg(short = 'p', long)]
    pub previous: bool,
    /// Keep streaming as the worker writes.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Container (default: the main container, `ax.dev/main-container` or the first one).
    #[arg(short = 'c', long)]
    pub container: Option<String>,
    /// Only the last N lines.
    #[arg(long)]
    pub tail: Option<i64>,
}

#[derive(Args, Debug)]
pub struct DagArgs {
    /// The DAG; without it, every DAG of the namespace is listed.
    pub dag: Option<String>,
    /// Output format: json or yaml (the AxDag as stored), name, or jsonpath=TEMPLATE.
    #[arg(short = 'o', long)]
    pub output: Option<OutputFormat>,
}

#[derive(Args, Debug)]
pub struct CronArgs {
    #[command(subcommand)]
    pub command: CronCommand,
}

#[derive(Subcommand, Debug)]
pub enum CronCommand {
    /// AxCrons with their schedule, last and next run, and whether they are suspended.
    #[command(visible_alias = "ls")]
    List(CronListArgs),
    /// Fire now, once: create one child from the cron's template (like `kubectl create job
    /// --from=cronjob/NAME`); the schedule goes on as before.
    Trigger { name: String },
    /// Stop firing (`spec.suspend: true`); runs already started go on.
    Suspend { name: String },
    /// Fire again on schedule (`spec.suspend: false`); missed times follow the misfire policy.
    Resume { name: String },
}

#[derive(Args, Debug)]
pub struct CronListArgs {
    /// No header line.
    #[arg(long)]
    pub no_headers: bool,
    /// Output format: wide (the table), json, yaml, name or jsonpath=TEMPLATE.
    #[arg(short = 'o', long)]
    pub output: Option<OutputFormat>,
}

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Only these AxQueues.
    pub queues: Vec<String>,
    /// Print the table again whenever a queue's status changes (an API watch).
    #[arg(short = 'w', long, conflicts_with = "output")]
    pub watch: bool,
    /// Output format: wide (the table), json, yaml (the AxQueues), name or jsonpath=TEMPLATE.
    #[arg(short = 'o', long)]
    pub output: Option<OutputFormat>,
}

#[derive(Args, Debug, Default)]
pub struct SubmitArgs {
    /// An AxTask manifest (YAML or JSON, `-` for stdin); the flags below override its fields.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub task: TaskFields,
    /// `client` (also bare `--dry-run`): print the task that would be created (YAML);
    /// `server`: the API server validates it without storing it; `none`: create it.
    #[arg(long, value_enum, num_args = 0..=1, require_equals = true,
          default_value = "none", default_missing_value = "client")]
    pub dry_run: DryRun,
    #[command(flatten)]
    pub wait: SubmitWaitArgs,
}

/// `--wait` of `submit` and `resubmit`: after creating, wait as `wait NAME --for succeeded`.
#[derive(Args, Debug, Default, Clone)]
pub struct SubmitWaitArgs {
    /// After creating, wait until the task Succeeded (exit codes as `kubectl ax wait`).
    #[arg(long)]
    pub wait: bool,
    /// With `--wait`: give up after this long (seconds, or a duration like `10m`; default 10m).
    #[arg(long, requires = "wait")]
    pub timeout: Option<String>,
}

#[derive(Args, Debug)]
pub struct DeleteArgs {
    /// Tasks by name, or `dag/NAME` for a DAG (its child tasks go with it).
    pub targets: Vec<String>,
    /// Tasks with these labels.
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Only finished tasks (Succeeded, Dead, Canceled).
    #[arg(long)]
    pub completed: bool,
    /// Only tasks that finished more than this long ago (`24h`, `90m`, seconds); implies
    /// finished ones.
    #[arg(long)]
    pub older_than: Option<String>,
    /// Do not ask for confirmation when more than one object matches.
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// `client` (also bare `--dry-run`): show what would be deleted; `server`: the API server
    /// checks the deletes too; `none`: delete.
    #[arg(long, value_enum, num_args = 0..=1, require_equals = true,
          default_value = "none", default_missing_value = "client")]
    pub dry_run: DryRun,
}

#[derive(Args, Debug)]
pub struct ResubmitArgs {
    /// The task whose spec the new one takes.
    pub task: String,
    /// Name of the new task (default: `<task>-` plus a random suffix chosen by the API server).
    #[arg(long)]
    pub name: Option<String>,
    /// `client` (also bare `--dry-run`): print the task that would be created (YAML);
    /// `server`: the API server validates it without storing it; `none`: create it.
    #[arg(long, value_enum, num_args = 0..=1, require_equals = true,
          default_value = "none", default_missing_value = "client")]
    pub dry_run: DryRun,
    #[command(flatten)]
    pub wait: SubmitWaitArgs,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitFor {
    /// Any final phase (Succeeded, Dead, Canceled; a DAG's Succeeded, Failed, Canceled).
    Terminal,
    /// Succeeded; a task that finishes otherwise ends the wait with a non-zero exit.
    Succeeded,
}

#[derive(Args, Debug)]
pub struct WaitArgs {
    /// Tasks by name, or `dag/NAME`.
    #[arg(required = true)]
    pub targets: Vec<String>,
    /// The condition to wait for.
    #[arg(long = "for", value_enum, default_value = "terminal")]
    pub condition: WaitFor,
    /// Give up after this long (seconds, or a duration like `10m`).
    #[arg(long, default_value = "10m")]
    pub timeout: String,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Args, Debug)]
pub struct CompletionArgs {
    pub shell: Shell,
}

#[derive(Args, Debug)]
pub struct VersionArgs {
    /// Only the version of kubectl-ax, without asking the cluster.
    #[arg(long)]
    pub client: bool,
}
