//! What every controller shares: the errors that end a reconcile, the settings of a run, and the
//! clients, caches and reporters the controllers share ([`Shared`]).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use kube::{
    Client,
    runtime::{
        events::{Recorder, Reporter},
        reflector::Store,
    },
};

use super::backoff;
use crate::{bridge::session, briq::ApiKey, crd::BriqExecutorClass, metrics::Metrics};

/// Errors that end a reconcile early; it is retried with per-object exponential backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("briq: {0}")]
    Briq(#[from] crate::briq::Error),
    #[error(transparent)]
    Bridge(#[from] session::CallError),
    #[error("{0}")]
    ApiKey(String),
    #[error("no BriqExecutorClass {0}")]
    ClassMissing(String),
    #[error(
        "BriqExecutorClasses are not listed yet (are the CRDs and the operator's RBAC current? \
         kubectl apply --server-side -f crds/)"
    )]
    ClassesUnknown,
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("{0}")]
    Invariant(String),
}

impl Error {
    /// How long briq asked us to wait before calling again, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        use kube::runtime::finalizer::Error as Finalizer;
        match self {
            Error::Briq(error) => error.retry_after(),
            Error::Bridge(error) => error.retry_after(),
            Error::Finalizer(error) => match error.as_ref() {
                Finalizer::ApplyFailed(inner) | Finalizer::CleanupFailed(inner) => {
                    inner.retry_after()
                }
                _ => None,
            },
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Settings of a controller run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Key used by executors without `apiKeySecretRef` and without a class.
    pub default_api_key: Option<ApiKey>,
    /// The operator's own namespace, where the key Secrets that `BriqExecutorClass`es name
    /// are (tenants cannot read them); `None`: classes cannot be used.
    pub platform_namespace: Option<String>,
    /// How often a ready executor checks that its sandbox still runs (a cheap GET, which does
    /// not count as use, so idle sandboxes still go to sleep as configured).
    pub probe_interval: Duration,
    /// First retry delay after a failed reconcile; doubles per consecutive failure, and is never
    /// shorter than briq's `Retry-After`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Watch only this namespace; all namespaces when `None`.
    pub namespace: Option<String>,
    /// How often the orphan sweeper looks for sandboxes whose executor is gone (it also looks
    /// when an executor is deleted); `None`: never.
    pub orphan_sweep_interval: Option<Duration>,
    /// How old an ownerless sandbox must be before the sweeper destroys it: a create in flight
    /// is never taken for an orphan.
    pub orphan_grace: Duration,
    /// How long an Execution waits for an executor that does not exist before it fails
    /// (`ExecutorNeverAppeared`): a misspelt name must not keep it waiting forever.
    pub executor_wait: Duration,
    /// How long beyond a run's own deadline an Execution whose outcome briq left unknown (a
    /// 5xx, a timeout, an outage) waits for briq to answer its sandbox's journal before the
    /// outcome is called unknown and the executor unusable.
    pub outage_patience: Duration,
    /// The longest a request to create a sandbox can take (twice the briq client's request
    /// timeout): another operator's pending-create mark younger than this may still have its create
    /// in flight, so nobody creates in its place before.
    pub pending_create_expiry: Duration,
    /// Work slots of the executor and execution controllers: how many reconciles do work at
    /// once, shared fairly across namespaces (`fair.rs`). Each reconcile at work may hold a
    /// connection to the API server: unbounded, 1,000 executors left 340 of them open. A
    /// reconcile that only waits for briq (an action running, a sandbox being set up) holds none.
    pub executor_concurrency: u16,
    pub execution_concurrency: u16,
    /// How often the executors' `executionsTotal` and `lastExecutionTime` are written: one
    /// write per executor that ran Executions since, not one per Execution. Written once more
    /// when the controllers stop.
    pub count_write_interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            default_api_key: None,
            platform_namespace: None,
            probe_interval: Duration::from_secs(30),
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(300),
            namespace: None,
            orphan_sweep_interval: Some(Duration::from_secs(300)),
            orphan_grace: Duration::from_secs(600),
            executor_wait: Duration::from_secs(600),
            outage_patience: Duration::from_secs(600),
            pending_create_expiry: Duration::from_secs(60),
            executor_concurrency: 32,
            execution_concurrency: 256,
            count_write_interval: Duration::from_secs(30),
        }
    }
}

/// What both controllers use and neither owns: the clients, the settings and where they
/// report. Each controller keeps its own state in a context of its own.
pub struct Shared<S> {
    pub client: Client,
    pub sandboxes: S,
    pub settings: Settings,
    /// Every `BriqExecutorClass`, from its watch.
    pub classes: Store<BriqExecutorClass>,
    /// True once the class watch has listed every class.
    pub classes_listed: tokio::sync::watch::Receiver<bool>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// Set once shutdown begins: Executions not started yet are left to the next operator.
    pub stopping: Arc<AtomicBool>,
    /// This process, as its pending-create marks name it (random per start).
    pub holder: String,
}

/// The Events recorder of the operator's controllers, on `client`.
pub fn event_recorder(client: Client) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: "briq-operator".into(),
            instance: None,
        },
    )
}

impl<S> Shared<S> {
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    pub fn backoff(&self) -> backoff::Backoff {
        backoff::Backoff::new(self.settings.backoff_base, self.settings.backoff_max)
    }
}
