//! The command line of `kubectl ax`: every verb and flag, as clap derive types (no logic here).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// `kubectl ax`: the ax operators' console (tasks, DAGs, queues) in the terminal.
#[derive(Parser, Debug)]
#[command(
    name = "kubectl-ax",
    bin_name = "kubectl-ax",
    version,
    about = "The ax console: list, inspect, re-run and cancel AxTasks, show DAGs and queues",
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Where to connect, and where to look.
#[derive(Args, Debug, Clone, Default)]
pub struct GlobalArgs {
    /// Namespace of the tasks (default: the kubeconfig context's namespace, else `default`).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Every namespace (list, retry/cancel by selector, top is cluster-wide anyway).
    #[arg(short = 'A', long, global = true)]
    pub all_namespaces: bool,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Path of the kubeconfig (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the operator's leader-election Lease, checked before acting.
    #[arg(
        long,
        global = true,
        env = "AX_OPERATOR_NAMESPACE",
        default_value = "ax-system"
    )]
    pub operator_namespace: String,
    /// Name of the operator's leader-election Lease.
    #[arg(
        long,
        global = true,
        env = "AX_OPERATOR_LEASE",
        default_value = "ax-operator"
    )]
    pub operator_lease: String,
    /// Act even when the operator's Lease shows no live operator.
    #[arg(long, global = true)]
    pub skip_operator_check: bool,
}

// One value per run: the size difference between verbs does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// List tasks, like `kubectl get axtasks` with filters, the last reason and its age.
    #[command(visible_alias = "ls")]
    List(ListArgs),
    /// A task's history as a table, one row per attempt, and why it is waiting now.
    Describe(DescribeArgs),
    /// Re-run finished tasks (or DAGs: `dag/NAME`) through `spec.rerun`.
    Retry(RetryArgs),
    /// Cancel tasks (or DAGs: `dag/NAME`) through `spec.cancel`.
    Cancel(CancelArgs),
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
    /// Shell completion script for bash, zsh or fish.
    Completion(CompletionArgs),
    /// The version of kubectl-ax, the API server and who holds the operator Lease.
    Version(VersionArgs),
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Wide,
    Json,
    Yaml,
    Name,
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
    /// Output format: wide (more columns), json, yaml or name.
    #[arg(short = 'o', long, value_enum)]
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
    /// The task.
    pub task: String,
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
    /// Show what would be re-run; the API server checks the request (server-side dry run).
    #[arg(long)]
    pub dry_run: bool,
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
    /// Show what would be canceled; the API server checks the request (server-side dry run).
    #[arg(long)]
    pub dry_run: bool,
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
    /// Output format: json or yaml (the AxDag as stored), or name.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Only these AxQueues.
    pub queues: Vec<String>,
    /// Print the table again whenever a queue's status changes (an API watch).
    #[arg(short = 'w', long)]
    pub watch: bool,
}

#[derive(Args, Debug, Default)]
pub struct SubmitArgs {
    /// An AxTask manifest (YAML or JSON, `-` for stdin); the flags below override its fields.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Task name (default: `<type>-` plus a random suffix chosen by the API server).
    #[arg(long)]
    pub name: Option<String>,
    /// Task type (`spec.type`); required without `-f`.
    #[arg(long = "type")]
    pub task_type: Option<String>,
    /// Worker image; required without `-f`.
    #[arg(long)]
    pub image: Option<String>,
    /// `imagePullPolicy` of the worker container (Always, IfNotPresent, Never).
    #[arg(long)]
    pub image_pull_policy: Option<String>,
    /// Shell command for the worker, run as `sh -c COMMAND`.
    #[arg(long, conflicts_with = "args")]
    pub command: Option<String>,
    /// Worker command in exec form, after `--`: `kubectl ax submit ... -- /bin/worker --fast`.
    #[arg(last = true)]
    pub args: Vec<String>,
    /// Environment variable of the worker, `NAME=VALUE` (repeatable).
    #[arg(long = "env", short = 'e')]
    pub env: Vec<String>,
    /// Priority bucket: Critical, High, Normal or Low.
    #[arg(long)]
    pub priority: Option<String>,
    /// AxQueue to wait in.
    #[arg(long)]
    pub queue: Option<String>,
    /// Payload: a JSON object, or `@FILE` to read it from a file.
    #[arg(long)]
    pub payload: Option<String>,
    /// Retries after the first attempt (`retry.maxRetries`).
    #[arg(long)]
    pub max_retries: Option<i32>,
    /// Hard timeout of an attempt: seconds, or a duration like `10m`, `1h30m`.
    #[arg(long)]
    pub hard_timeout: Option<String>,
    /// Soft timeout of an attempt: seconds, or a duration like `30s`.
    #[arg(long)]
    pub soft_timeout: Option<String>,
    /// Total retry budget from the first dispatch: seconds, or a duration like `1h`.
    #[arg(long)]
    pub budget: Option<String>,
    /// Do not queue the task before this RFC 3339 time.
    #[arg(long)]
    pub start_after: Option<String>,
    /// Delete the task this long after it finished: seconds, or a duration.
    #[arg(long)]
    pub ttl: Option<String>,
    /// Label of the task, `KEY=VALUE` (repeatable).
    #[arg(long = "label", short = 'L')]
    pub labels: Vec<String>,
    /// Print the task that would be created (YAML) instead of creating it.
    #[arg(long)]
    pub dry_run: bool,
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
