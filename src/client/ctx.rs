//! The connection of one `kubectl ax` run, and of the console it starts (client required): the
//! user's kubeconfig and context as the global flags name them, the namespace to look in, and
//! reads of ax objects that turn failures into `ClientError`s.

use std::path::PathBuf;
use std::sync::OnceLock;

use clap::Args;
use kube::api::{ListParams, ObjectList};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::api::{AxDag, AxQueue, AxTask};

use super::error::{ClientError, Op, Resource, error_chain, from_kube};

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
    /// Namespace of the operator's leader-election Lease, checked before acting (default:
    /// `ax-system` if it holds one, else where a Lease of that name is found, a live one first).
    #[arg(long, global = true, env = "AX_OPERATOR_NAMESPACE")]
    pub operator_namespace: Option<String>,
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

pub struct Ctx {
    pub client: Client,
    /// The namespace named by `-n`, else the context's, else `default`.
    pub namespace: String,
    pub global: GlobalArgs,
    /// The namespace of the operator's Lease once looked up (`operator::lease_namespace`).
    pub operator_namespace: OnceLock<String>,
}

impl Ctx {
    /// A client from `--kubeconfig`/`--context`, else kube's usual inference ($KUBECONFIG,
    /// ~/.kube/config, in-cluster).
    pub async fn connect(global: &GlobalArgs) -> Result<Ctx, ClientError> {
        let options = KubeConfigOptions {
            context: global.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match (&global.kubeconfig, &global.context) {
            (Some(path), _) => {
                let kubeconfig = Kubeconfig::read_from(path)
                    .map_err(|e| ClientError::Config(format!("{}: {}", path.display(), e)))?;
                Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| ClientError::Config(error_chain(&e)))?
            }
            (None, Some(_)) => Config::from_kubeconfig(&options)
                .await
                .map_err(|e| ClientError::Config(error_chain(&e)))?,
            (None, None) => Config::infer()
                .await
                .map_err(|e| ClientError::Config(error_chain(&e)))?,
        };
        let namespace = global
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = Client::try_from(config).map_err(|e| ClientError::Config(error_chain(&e)))?;
        Ok(Ctx {
            client,
            namespace,
            global: global.clone(),
            operator_namespace: OnceLock::new(),
        })
    }

    /// The same connection looking in `namespace`.
    pub fn in_namespace(&self, namespace: &str) -> Ctx {
        Ctx {
            client: self.client.clone(),
            namespace: namespace.to_owned(),
            global: self.global.clone(),
            operator_namespace: self.operator_namespace.clone(),
        }
    }

    /// `None` with `-A`: every namespace.
    pub fn list_namespace(&self) -> Option<&str> {
        (!self.global.all_namespaces).then_some(self.namespace.as_str())
    }

    pub fn tasks(&self, namespace: Option<&str>) -> Api<AxTask> {
        match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    pub fn dags(&self, namespace: Option<&str>) -> Api<AxDag> {
        match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    pub fn queues(&self) -> Api<AxQueue> {
        Api::all(self.client.clone())
    }

    /// The task, or `NotFound` naming the namespace searched.
    pub async fn get_task(&self, name: &str) -> Result<AxTask, ClientError> {
        let op = Op::new("get", Resource::Task)
            .namespace(Some(&self.namespace))
            .name(name);
        self.tasks(Some(&self.namespace))
            .get(name)
            .await
            .map_err(|e| from_kube(&op, e))
    }

    pub async fn get_dag(&self, name: &str) -> Result<AxDag, ClientError> {
        let op = Op::new("get", Resource::Dag)
            .namespace(Some(&self.namespace))
            .name(name);
        self.dags(Some(&self.namespace))
            .get(name)
            .await
            .map_err(|e| from_kube(&op, e))
    }

    /// Tasks in the namespace (or all with `-A`) matching the label selector.
    pub async fn list_tasks(
        &self,
        selector: Option<&str>,
    ) -> Result<ObjectList<AxTask>, ClientError> {
        let namespace = self.list_namespace();
        let op = Op::new("list", Resource::Task).namespace(namespace);
        let mut params = ListParams::default();
        if let Some(s) = selector {
            params = params.labels(s);
        }
        self.tasks(namespace)
            .list(&params)
            .await
            .map_err(|e| from_kube(&op, e))
    }
}
