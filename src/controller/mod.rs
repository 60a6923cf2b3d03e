//! The two controllers: `BriqExecutor` (sandbox lifecycle) and `Execution` (one action each,
//! in order, at most once).
//!
//! Status ownership (server-side apply): the executor controller owns the executor's
//! conditions, sandbox id and timestamps ([`EXECUTOR_MANAGER`]); `unusable` is written once, by
//! whichever controller finds the executor unusable ([`UNUSABLE_MANAGER`]); the execution
//! controller owns the executor's execution counters ([`EXECUTIONS_MANAGER`]) and the whole
//! status of every Execution ([`EXECUTOR_MANAGER`]). Each applies its complete set every time,
//! so no manager ever drops another's fields.

mod backoff;
mod cache;
pub mod class;
mod conditions;
mod events;
mod execution;
mod executor;
mod fair;
mod orphans;
mod ownership;
mod pool;
mod wake;

pub use executor::{CREATE_PENDING_ANNOTATION, FINALIZER, SANDBOX_ID_ANNOTATION};
pub use orphans::{KEY_IN_USE_FINALIZER, orphans};
/// What a pool labels its members with: an upgrade that changed it would replace every unclaimed
/// member (`tests/upgrade.rs`).
pub use pool::template_hash;

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    core::PartialObjectMeta,
    runtime::{
        Controller, WatchStreamExt,
        controller::{self, Action},
        events::{Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::{
    bridge::session,
    briq::{ApiKey, SandboxApi},
    crd::{
        API_KEY_LABEL, API_KEY_LABEL_VALUE, BriqExecutor, BriqExecutorClass, BriqExecutorPool,
        CLAIMED_BY_ANNOTATION, DEFAULT_API_KEY_SECRET_KEY, Execution, reasons::ExecutorReason,
    },
    http::Health,
    metrics::{ControllerKind, Live, Metrics},
};

pub const EXECUTOR_MANAGER: &str = "briq-operator";
pub const UNUSABLE_MANAGER: &str = "briq-operator-unusable";
pub const EXECUTIONS_MANAGER: &str = "briq-operator-executions";

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
    /// timeout): another operator's claim to create younger than this may still have its create
    /// in flight, so nobody creates in its place before.
    pub create_settle: Duration,
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
            create_settle: Duration::from_secs(60),
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
    classes: Store<BriqExecutorClass>,
    /// True once the class watch has listed every class.
    classes_listed: tokio::sync::watch::Receiver<bool>,
    recorder: Recorder,
    /// Events nothing is ordered against, published in the background ([`events`]).
    deferred_events: events::Events,
    metrics: Arc<Metrics>,
    /// Set once shutdown begins: Executions not started yet are left to the next operator.
    stopping: Arc<AtomicBool>,
    /// This process, as its claims to create sandboxes name it (random per start).
    holder: String,
}

impl<S> Shared<S> {
    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    fn backoff(&self) -> backoff::Backoff {
        backoff::Backoff::new(self.settings.backoff_base, self.settings.backoff_max)
    }
}

/// Drops the backoff counts of objects `store` no longer holds.
fn prune_backoff<K>(backoff: &backoff::Backoff, store: &Store<K>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let live: std::collections::HashSet<String> = store
        .state()
        .iter()
        .map(|o| object_key(o.as_ref()))
        .collect();
    backoff.retain(|key| live.contains(key));
}

/// The key of `object` in a controller's bookkeeping.
fn object_key<K: Resource<DynamicType = ()>>(object: &K) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// Ends a reconcile of `object`: a success starts its backoff over.
fn settle<K: Resource<DynamicType = ()>>(
    backoff: &backoff::Backoff,
    object: &K,
    result: Result<Action>,
) -> Result<Action> {
    if result.is_ok() {
        backoff.forget(&object_key(object));
    }
    result
}

/// How long ago `object` was created; a creation time ahead of this clock (skew) counts as just
/// created.
fn waited<K: Resource>(object: &K) -> Duration {
    object
        .meta()
        .creation_timestamp
        .as_ref()
        .map(|created| {
            let waited = k8s_openapi::jiff::Timestamp::now().duration_since(created.0);
            waited
                .max(k8s_openapi::jiff::SignedDuration::ZERO)
                .unsigned_abs()
        })
        .unwrap_or_default()
}

/// When to retry a failed reconcile of `object`: its backoff, never sooner than briq asked.
fn retry<K: Resource<DynamicType = ()>>(
    backoff: &backoff::Backoff,
    object: &K,
    error: &Error,
) -> Action {
    let delay = backoff.failed(&object_key(object), error.retry_after());
    let kind = K::kind(&());
    warn!(%kind, name = %object.name_any(), %error, ?delay, "reconcile failed; retrying");
    Action::requeue(delay)
}

/// The API key of `executor`: from its Secret, or the operator's default.
async fn api_key<S>(shared: &Shared<S>, executor: &BriqExecutor) -> Result<ApiKey> {
    Ok(key_and_secret(shared, executor).await?.0)
}

/// [`api_key`], with the Secret it came from when that is a Secret of the executor's namespace
/// (`None`: the operator's default key, or its class's, whose Secret is the platform's).
async fn key_and_secret<S>(
    shared: &Shared<S>,
    executor: &BriqExecutor,
) -> Result<(ApiKey, Option<Secret>)> {
    let recorded = class::recorded(executor.annotations());
    match class_of(shared, executor, recorded).await?.0 {
        class::Resolved::Class(class) => return Ok((class_key(shared, &class).await?, None)),
        class::Resolved::Missing(name) => return Err(Error::ClassMissing(name)),
        class::Resolved::Unclassed => {}
    }
    own_key(shared, executor).await
}

/// The key of an executor without a class: from its `apiKeySecretRef`, else the operator's
/// default key.
async fn own_key<S>(
    shared: &Shared<S>,
    executor: &BriqExecutor,
) -> Result<(ApiKey, Option<Secret>)> {
    let Some(reference) = &executor.spec.api_key_secret_ref else {
        let key = shared.settings.default_api_key.clone().ok_or_else(|| {
            Error::ApiKey(
                "no apiKeySecretRef is set, no BriqExecutorClass applies and the operator has no \
                 default briq API key"
                    .into(),
            )
        })?;
        return Ok((key, None));
    };
    let namespace = executor.namespace().unwrap_or_default();
    let (key, secret) = secret_key(shared, &namespace, &reference.name, &reference.key).await?;
    Ok((key, Some(secret)))
}

/// The key of `class`, from its Secret in the operator's namespace.
async fn class_key<S>(shared: &Shared<S>, class: &BriqExecutorClass) -> Result<ApiKey> {
    let Some(namespace) = &shared.settings.platform_namespace else {
        return Err(Error::ApiKey(format!(
            "BriqExecutorClass {} applies, but the operator was started without \
             --platform-namespace, where class keys are",
            class.name_any()
        )));
    };
    let reference = &class.spec.api_key_secret_ref;
    Ok(
        secret_key(shared, namespace, &reference.name, &reference.key)
            .await?
            .0,
    )
}

/// How long a reconcile waits for the first list of classes.
const CLASSES_WAIT: Duration = Duration::from_secs(10);

/// Waits for the first list of classes: before it, no class is known, and an executor (or a
/// pool) could be taken for one without a class. A list that does not come (CRDs or RBAC older
/// than the operator) fails the reconcile, retried with backoff, rather than holding its work
/// slot for good. (Not the store's own readiness future: a store wakes only its latest waiter,
/// and the reconciles waiting at once would all but one wait for good.)
async fn classes_known<S>(shared: &Shared<S>) -> Result<()> {
    let mut listed = shared.classes_listed.clone();
    match tokio::time::timeout(CLASSES_WAIT, listed.wait_for(|listed| *listed)).await {
        Ok(Ok(_)) => Ok(()),
        _ => Err(Error::ClassesUnknown),
    }
}

/// The class `executor` takes ([`class::resolve`]), as `recorded`, from the class cache, with
/// its namespace's labels, which are read only when they can matter (empty otherwise).
async fn class_of<S>(
    shared: &Shared<S>,
    executor: &BriqExecutor,
    recorded: class::Recorded<'_>,
) -> Result<(class::Resolved, BTreeMap<String, String>)> {
    classes_known(shared).await?;
    let classes = shared.classes.state();
    let labels = if class::needs_namespace_labels(&executor.spec, recorded, &classes) {
        let namespace = executor.namespace().unwrap_or_default();
        let namespaces: Api<Namespace> = Api::all(shared.client.clone());
        namespaces
            .get_metadata_opt(&namespace)
            .await?
            .and_then(|n| n.metadata.labels)
            .unwrap_or_default()
    } else {
        BTreeMap::new()
    };
    let resolved = class::resolve(&executor.spec, recorded, &classes, &labels);
    Ok((resolved, labels))
}

/// The class `executor` was made under, if any, from the cache (an executor not made yet may
/// get another: see [`class_of`]).
fn made_under<S>(shared: &Shared<S>, executor: &BriqExecutor) -> Option<Arc<BriqExecutorClass>> {
    let classes = shared.classes.state();
    let recorded = class::recorded(executor.annotations());
    match class::resolve(&executor.spec, recorded, &classes, &BTreeMap::new()) {
        class::Resolved::Class(class) => Some(class),
        _ => None,
    }
}

/// The API key in field `key` (empty: the default field) of the labelled Secret
/// `namespace/name`.
async fn secret_key<S>(
    shared: &Shared<S>,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<(ApiKey, Secret)> {
    let secrets: Api<Secret> = Api::namespaced(shared.client.clone(), namespace);
    // Only Secrets labelled for it are keys: otherwise anyone who may create an executor could
    // have the operator send any Secret of the namespace to briq, even one they cannot read.
    // An unlabelled Secret is reported exactly like a missing one.
    let secret = secrets
        .get_opt(name)
        .await?
        .filter(|secret| {
            secret.labels().get(API_KEY_LABEL).map(String::as_str) == Some(API_KEY_LABEL_VALUE)
        })
        .ok_or_else(|| {
            Error::ApiKey(format!(
                "no Secret {namespace}/{name} labelled {API_KEY_LABEL}={API_KEY_LABEL_VALUE}"
            ))
        })?;
    let key = if key.is_empty() {
        DEFAULT_API_KEY_SECRET_KEY
    } else {
        key
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .ok_or_else(|| Error::ApiKey(format!("Secret {namespace}/{name} has no key {key}")))?;
    let text = String::from_utf8(bytes.0.clone()).map_err(|_| {
        Error::ApiKey(format!(
            "key {key} of Secret {namespace}/{name} is not UTF-8"
        ))
    })?;
    let api_key = ApiKey::new(text.trim())
        .map_err(|e| Error::ApiKey(format!("key {key} of Secret {namespace}/{name}: {e}")))?;
    Ok((api_key, secret))
}

/// Server-side applies `status` (a JSON object of the fields `manager` owns) to `object`.
async fn apply_status<K>(
    api: &Api<K>,
    object: &K,
    manager: &str,
    status: serde_json::Value,
) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    apply_status_of(api, &object.name_any(), manager, status).await
}

/// [`apply_status`] to the object named `name`.
async fn apply_status_of<K>(
    api: &Api<K>,
    name: &str,
    manager: &str,
    status: serde_json::Value,
) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    // Nothing here reads the written object: the API server answers with its metadata only,
    // instead of echoing the whole object (an Execution's code is up to 256 KiB, and every
    // transfer of it costs the operator memory the allocator keeps).
    let request = kube::core::Request::new(api.resource_url()).patch_subresource(
        "status",
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&status_patch::<K>(status, None)),
    );
    let mut request = request.map_err(kube::Error::BuildRequest)?;
    request.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(METADATA_ONLY),
    );
    let client = api.clone().into_client();
    client
        .request::<PartialObjectMeta<K>>(request)
        .await
        .map(drop)
        .map_err(Error::from)
}

/// The `Accept` header that makes the API server answer with an object's metadata only.
const METADATA_ONLY: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// A server-side apply patch of `K`'s status, conditional on `resource_version` when given.
fn status_patch<K: Resource<DynamicType = ()>>(
    status: serde_json::Value,
    resource_version: Option<&str>,
) -> serde_json::Value {
    let mut patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    if let Some(version) = resource_version {
        patch["metadata"] = json!({ "resourceVersion": version });
    }
    patch
}

/// [`apply_status`], only if `object` is still at `resource_version` (when given): a write
/// decided on one version of an object never lands on another. Returns the object as written;
/// a conflict is [`is_conflict`].
async fn apply_status_at<K>(
    api: &Api<K>,
    object: &K,
    manager: &str,
    status: serde_json::Value,
    resource_version: Option<&str>,
) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = status_patch::<K>(status, resource_version);
    Ok(api
        .patch_status(
            &object.name_any(),
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&patch),
        )
        .await?)
}

/// Whether a conditional write lost: the object changed since the version it was decided on.
fn is_conflict(error: &Error) -> bool {
    matches!(error, Error::Kube(kube::Error::Api(status)) if status.code == 409)
}

/// Whether a conditional write landed (`false`: it lost, see [`is_conflict`]); other errors
/// stay errors.
fn landed<T>(written: Result<T>) -> Result<bool> {
    match written {
        Ok(_) => Ok(true),
        Err(error) if is_conflict(&error) => Ok(false),
        Err(error) => Err(error),
    }
}

/// Marks `executor` unusable, for good: it never runs code again.
async fn mark_unusable<S>(shared: &Shared<S>, executor: &BriqExecutor, reason: &str) -> Result<()> {
    if executor.status.as_ref().is_some_and(|s| s.unusable) {
        return Ok(());
    }
    warn!(executor = %executor.name_any(), reason, "executor is now unusable");
    let api: Api<BriqExecutor> = Api::namespaced(
        shared.client.clone(),
        &executor.namespace().unwrap_or_default(),
    );
    let status = json!({ "unusable": true, "unusableReason": conditions::clip(reason.to_owned()) });
    apply_status(&api, executor, UNUSABLE_MANAGER, status).await?;
    shared.metrics.executor_ended(ExecutorReason::Unusable);
    let note = format!("{reason}; it never runs code again");
    let warning = kube::runtime::events::EventType::Warning;
    publish(shared, executor, warning, "Unusable", "Run", note).await;
    Ok(())
}

/// An Event of this controller.
fn event(
    type_: kube::runtime::events::EventType,
    reason: &str,
    action: &str,
    note: String,
) -> kube::runtime::events::Event {
    kube::runtime::events::Event {
        type_,
        reason: reason.to_owned(),
        // Event notes are limited to 1 KiB.
        note: Some(note.chars().take(1000).collect()),
        action: action.to_owned(),
        secondary: None,
    }
}

/// Queues `event` about `object`, which nothing is ordered against ([`events`]).
fn publish_deferred<S, K: Resource<DynamicType = ()>>(
    shared: &Shared<S>,
    object: &K,
    event: kube::runtime::events::Event,
) {
    shared
        .deferred_events
        .publish(event, object.object_ref(&()));
}

/// Publishes an event about `object`; a failure to publish is logged, never fatal.
async fn publish<S, K: Resource<DynamicType = ()>>(
    shared: &Shared<S>,
    object: &K,
    type_: kube::runtime::events::EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = event(type_, reason, action, note);
    if let Err(error) = shared
        .recorder
        .publish(&event, &object.object_ref(&()))
        .await
    {
        warn!(%error, reason, "could not publish an event");
    }
}

/// What the process around the controllers learns from them: metrics, and whether their caches
/// are synced (for `/readyz`).
#[derive(Clone, Debug, Default)]
pub struct Observer {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
}

/// Runs both controllers until `shutdown` resolves.
pub async fn run<S>(
    client: Client,
    sandboxes: S,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) where
    S: SandboxApi + 'static,
{
    run_observed(client, sandboxes, settings, shutdown, Observer::default()).await
}

/// Logs what the controller runtime reports. A reconcile scheduled for an object deleted
/// meanwhile is the normal end of that object, not a failure worth a warning.
fn log_failure<T, E: std::fmt::Display>(
    controller: &str,
    result: Result<T, kube::runtime::controller::Error<E, watcher::Error>>,
) {
    match result {
        Ok(_) => {}
        Err(kube::runtime::controller::Error::ObjectNotFound(gone)) => {
            tracing::debug!(%gone, controller, "the object was deleted before its reconcile ran");
        }
        Err(error) => warn!(%error, controller, "reconcile failed"),
    }
}

/// Unfinished Executions (queued, running) and executors holding a sandbox, from the caches;
/// `bookkeeping` entries held by the controllers.
fn live(
    executors: &Store<BriqExecutor>,
    executions: &Store<Execution>,
    bookkeeping: usize,
    briq_unreachable_keys: usize,
) -> Live {
    let mut live = Live {
        bookkeeping: bookkeeping as i64,
        briq_unreachable_keys: briq_unreachable_keys as i64,
        ..Live::default()
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    for execution in executions.state() {
        let status = execution.status.clone().unwrap_or_default();
        if execution::finished(&execution) || execution.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if status.attempt_id.is_some() {
            live.running += 1;
            let waiting =
                conditions::find(&status.conditions, conditions::SUCCEEDED).is_some_and(|c| {
                    c.reason == crate::crd::reasons::ExecutionReason::WaitingForBriq.as_str()
                });
            live.waiting_for_briq += i64::from(waiting);
        } else {
            live.queued += 1;
            if let Some(created) = &execution.metadata.creation_timestamp {
                let age = now.duration_since(created.0).as_secs().max(0);
                live.oldest_queued_seconds = live.oldest_queued_seconds.max(age);
            }
        }
    }
    live.classes = class::usage(&executors.state(), &executions.state());
    // A handed-over member records its claimer's sandbox too: counted once, with the claimer.
    live.sandboxes = executors
        .state()
        .iter()
        .filter(|e| e.status.as_ref().is_some_and(|s| s.sandbox_id.is_some()))
        .filter(|e| !e.annotations().contains_key(CLAIMED_BY_ANNOTATION))
        .count() as i64;
    live
}

type Count = Box<dyn Fn() -> usize + Send + Sync>;

/// How long a stopping operator waits for its deferred Events to go out.
const EVENT_FLUSH: Duration = Duration::from_secs(5);

/// How often the bookkeeping is checked against the caches.
const BOOKKEEPING_SWEEP: Duration = Duration::from_secs(10);

/// A task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reports the controllers' state to the observer; undoes it when the controllers stop (or are
/// dropped, as when the lease is lost).
struct Reporting {
    observer: Observer,
    synced: tokio::task::JoinHandle<()>,
}

impl Reporting {
    fn start(
        observer: &Observer,
        executors: Store<BriqExecutor>,
        executions: Store<Execution>,
        bookkeeping: Count,
        briq_unreachable_keys: Count,
    ) -> Reporting {
        let (cached_executors, cached_executions) = (executors.clone(), executions.clone());
        observer.metrics.set_live(Some(Box::new(move || {
            live(
                &cached_executors,
                &cached_executions,
                bookkeeping(),
                briq_unreachable_keys(),
            )
        })));
        let health = observer.health.clone();
        let synced = tokio::spawn(async move {
            if until_ready(&executors).await && until_ready(&executions).await {
                info!("controller caches synced");
                health.set_synced(true);
            }
        });
        Reporting {
            observer: observer.clone(),
            synced,
        }
    }
}

/// Whether `store` got its first full list (false: its writer is gone). The applier waits on the
/// same store, and a store wakes only its latest waiter: ask again every 100 ms instead of
/// relying on a wake-up.
async fn until_ready<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    loop {
        let wait = store.wait_until_ready();
        if let Ok(result) = tokio::time::timeout(Duration::from_millis(100), wait).await {
            return result.is_ok();
        }
    }
}

impl Drop for Reporting {
    fn drop(&mut self) {
        self.synced.abort();
        self.observer.health.set_synced(false);
        self.observer.metrics.set_live(None);
    }
}

/// [`run`], reporting metrics and cache sync to `observer`.
pub async fn run_observed<S>(
    client: Client,
    sandboxes: S,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    observer: Observer,
) where
    S: SandboxApi + 'static,
{
    let (executors, executions): (Api<BriqExecutor>, Api<Execution>) = match &settings.namespace {
        Some(namespace) => (
            Api::namespaced(client.clone(), namespace),
            Api::namespaced(client.clone(), namespace),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let pools: Api<BriqExecutorPool> = match &settings.namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    // Both controllers stop on the same signal, each finishing the reconciles it has started.
    let (shutdown_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let stop_signal = || {
        let mut rx = shutdown_tx.subscribe();
        async move {
            let _ = rx.recv().await;
        }
    };
    let (execution_stop, executor_stop, pool_stop) = (stop_signal(), stop_signal(), stop_signal());
    let stopping = Arc::new(AtomicBool::new(false));
    let stopping_flag = stopping.clone();
    tokio::spawn(async move {
        shutdown.await;
        stopping_flag.store(true, Ordering::SeqCst);
        let _ = shutdown_tx.send(());
    });

    // Classes are known before any executor takes one: [`class_of`] waits for their first list.
    let classes_api: Api<BriqExecutorClass> = Api::all(client.clone());
    let (class_store, class_writer) = reflector::store::<BriqExecutorClass>();
    let (class_wake_tx, class_wake_rx) = mpsc::unbounded_channel::<ObjectRef<BriqExecutor>>();
    let (classes_listed_tx, classes_listed) = tokio::sync::watch::channel(false);
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "briq-operator".into(),
            instance: None,
        },
    );
    let (deferred_events, event_publisher) = events::Events::start(recorder.clone());
    let event_publisher = AbortOnDrop(event_publisher);
    let shared = Arc::new(Shared {
        classes: class_store.clone(),
        classes_listed,
        recorder,
        deferred_events,
        client: client.clone(),
        sandboxes,
        settings,
        metrics: observer.metrics.clone(),
        stopping,
        holder: format!("op-{:012x}", rand::random::<u64>() >> 16),
    });
    let (wake_tx, wake_rx) = mpsc::unbounded_channel::<ObjectRef<Execution>>();
    let (execution_store, execution_writer) = reflector::store::<Execution>();
    let (executor_store, executor_writer) = reflector::store::<BriqExecutor>();
    let execution_ctx = Arc::new(execution::Context::new(
        shared.clone(),
        execution_store.clone(),
        executor_store.clone(),
        wake_tx.clone(),
    ));
    let (pool_store, pool_writer) = reflector::store::<BriqExecutorPool>();
    let executor_ctx = Arc::new(executor::Context::new(
        shared.clone(),
        executor_store.clone(),
        execution_store.clone(),
        pool_store.clone(),
    ));

    // A deleted Execution is not reconciled, but the one queued behind it must hear of it, and
    // what the controller kept of it goes.
    let on_execution_event = execution_ctx.clone();
    let freshness = execution_ctx.freshness.clone();
    let keep_code = execution_ctx.clone();
    let execution_events = watcher(executions, watcher::Config::default().any_semantic())
        .modify(move |execution| {
            keep_code.codes.heard(execution);
            cache::compact_execution(execution);
        })
        .reflect(execution_writer)
        .inspect(move |event| freshness.heard(event))
        .inspect_ok(move |event| {
            if let watcher::Event::Delete(gone) = event {
                on_execution_event.deleted(gone);
            }
        })
        .applied_objects();
    // Executions are woken by executor changes through the one watch of executors below, once
    // the executor cache shows them (see wake.rs).
    let execution_loop = Controller::for_stream(execution_events, execution_store.clone())
        // Unbounded: the work slots bound the work, fairly across namespaces, and a reconcile
        // that only waits for briq (an action running) holds none (see fair.rs).
        .with_config(controller::Config::default().concurrency(0))
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(
            wake_rx,
        ))
        .graceful_shutdown_on(execution_stop)
        .run(
            |execution, ctx| async move {
                let metrics = ctx.shared.metrics.clone();
                let reconcile = execution::reconcile(execution, ctx);
                metrics
                    .reconcile(ControllerKind::Execution, reconcile)
                    .await
            },
            execution::error_policy,
            execution_ctx.clone(),
        )
        .for_each(|result| async move { log_failure("execution", result) });
    let orphan_sweep = Arc::new(orphans::Sweeper::new(
        shared.clone(),
        executor_store.clone(),
    ));
    // One watch of executors for all three controllers: what waits on an executor is woken only
    // once the executor cache shows the change that woke it, or the woken reconcile could read
    // the old state and wait for a change that has already come.
    let (pool_wake_tx, pool_wake_rx) = mpsc::unbounded_channel::<ObjectRef<BriqExecutorPool>>();
    let triggers = wake::ExecutorTriggers {
        executors: executor_store.clone(),
        executions: execution_store.clone(),
        wake_execution: wake::sender(wake_tx.clone()),
        wake_pool: wake::sender(pool_wake_tx.clone()),
        wake_executor: wake::sender(class_wake_tx.clone()),
    };
    let (on_executor_deleted, wake_sweeper) = (executor_ctx.clone(), orphan_sweep.clone());
    let forget_executor = execution_ctx.clone();
    let executor_events = wake::executor_events(
        // The first list is a consistent read, not the API server's watch cache: a restarted
        // operator must see every handover its predecessor made (executor::handover).
        watcher(executors, watcher::Config::default()),
        executor_writer,
        triggers,
        move |gone| {
            on_executor_deleted.deleted(gone);
            wake_sweeper.deleted(gone);
            forget_executor.executor_deleted(gone);
        },
    );
    let class_watch = AbortOnDrop(tokio::spawn(
        wake::class_events(
            watcher(classes_api, watcher::Config::default().any_semantic()),
            class_writer,
            classes_listed_tx,
            executor_store.clone(),
            wake::sender(class_wake_tx),
            pool_store.clone(),
            wake::sender(pool_wake_tx),
        )
        .for_each(|_| async {}),
    ));
    // Unbounded, as for Executions: the work slots bound the work (see fair.rs).
    let executor_controller = Controller::for_stream(executor_events, executor_store.clone())
        .with_config(controller::Config::default().concurrency(0))
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(
            class_wake_rx,
        ));
    // Pools: woken by their own changes and by any change of a member (claimed ones too, which
    // the pool no longer owns: a claim is what makes it refill), through the executor triggers;
    // and by any change of a class.
    let pool_ctx = Arc::new(pool::Context::new(
        shared.clone(),
        pool_store.clone(),
        executor_store.clone(),
    ));
    let pool_events = watcher(pools, watcher::Config::default().any_semantic())
        .modify(cache::compact)
        .reflect(pool_writer)
        .applied_objects();
    let pool_loop = Controller::for_stream(pool_events, pool_store)
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(
            pool_wake_rx,
        ))
        .graceful_shutdown_on(pool_stop)
        .run(
            |pool, ctx| async move {
                let metrics = ctx.shared.metrics.clone();
                metrics
                    .reconcile(ControllerKind::Pool, pool::reconcile(pool, ctx))
                    .await
            },
            pool::error_policy,
            pool_ctx.clone(),
        )
        .for_each(|result| async move { log_failure("pool", result) });
    let bookkeeping: Count = {
        let (executor_ctx, execution_ctx) = (executor_ctx.clone(), execution_ctx.clone());
        let pool_ctx = pool_ctx.clone();
        Box::new(move || {
            executor_ctx.bookkeeping() + execution_ctx.bookkeeping() + pool_ctx.bookkeeping()
        })
    };
    let briq_unreachable_keys: Count = {
        let shared = shared.clone();
        Box::new(move || shared.sandboxes.unreachable_keys())
    };
    let _reporting = Reporting::start(
        &observer,
        executor_store,
        execution_store,
        bookkeeping,
        briq_unreachable_keys,
    );
    let orphan_sweeper = shared
        .settings
        .orphan_sweep_interval
        .map(|interval| AbortOnDrop(tokio::spawn(orphan_sweep.run(interval))));
    // Deletions prune the bookkeeping at once; a reconcile still running then may add an entry
    // after that, which this sweep removes.
    let sweeper = {
        let (executor_ctx, execution_ctx) = (executor_ctx.clone(), execution_ctx.clone());
        let pool_ctx = pool_ctx.clone();
        AbortOnDrop(tokio::spawn(async move {
            let mut every = tokio::time::interval(BOOKKEEPING_SWEEP);
            loop {
                every.tick().await;
                executor_ctx.sweep();
                execution_ctx.sweep();
                pool_ctx.sweep();
            }
        }))
    };
    let count_writer = {
        let execution_ctx = execution_ctx.clone();
        let interval = shared.settings.count_write_interval;
        AbortOnDrop(tokio::spawn(async move {
            let mut every =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            loop {
                every.tick().await;
                execution_ctx.write_counts().await;
            }
        }))
    };
    let executor_loop = executor_controller
        .graceful_shutdown_on(executor_stop)
        .run(
            |executor, ctx| async move {
                let metrics = ctx.shared.metrics.clone();
                let reconcile = executor::reconcile(executor, ctx);
                metrics.reconcile(ControllerKind::Executor, reconcile).await
            },
            executor::error_policy,
            executor_ctx,
        )
        .for_each(|result| async move { log_failure("executor", result) });
    info!("controllers started");
    futures::future::join3(execution_loop, executor_loop, pool_loop).await;
    drop(count_writer);
    drop(class_watch);
    execution_ctx.write_counts().await;
    drop(sweeper);
    drop(orphan_sweeper);
    shared.deferred_events.flush(EVENT_FLUSH).await;
    drop(event_publisher);
    info!("controllers stopped");
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::crd::POOL_MEMBER_ANNOTATION;

    use super::*;

    fn executor(name: &str, sandbox: Option<&str>, annotations: serde_json::Value) -> BriqExecutor {
        serde_json::from_value(json!({
            "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
            "metadata": { "name": name, "namespace": "team", "annotations": annotations },
            "spec": {},
            "status": { "sandboxId": sandbox },
        }))
        .unwrap()
    }

    #[test]
    fn a_handed_over_sandbox_counts_once_among_the_live_sandboxes() {
        let (executors, mut writer) = reflector::store::<BriqExecutor>();
        for object in [
            executor("own", Some("bq_1"), json!({})),
            executor(
                "fast-m1",
                Some("bq_2"),
                json!({ CLAIMED_BY_ANNOTATION: "uid-c" }),
            ),
            executor("agent", Some("bq_2"), json!({})),
            executor(
                "fast-m2",
                Some("bq_3"),
                json!({ POOL_MEMBER_ANNOTATION: "fast" }),
            ),
            executor("waiting", None, json!({})),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(object));
        }
        let (executions, _) = reflector::store::<Execution>();
        assert_eq!(live(&executors, &executions, 0, 0).sandboxes, 3);
    }

    #[test]
    fn the_oldest_queued_age_is_that_of_the_oldest_unstarted_unfinished_execution() {
        let ago = |minutes: i64| {
            let at = k8s_openapi::jiff::Timestamp::now()
                - k8s_openapi::jiff::SignedDuration::from_mins(minutes);
            at.to_string()
        };
        let execution = |name: &str, created: String, status: serde_json::Value| -> Execution {
            serde_json::from_value(json!({
                "apiVersion": "briq.cloud/v1alpha1", "kind": "Execution",
                "metadata": { "name": name, "namespace": "team", "creationTimestamp": created },
                "spec": { "executorRef": { "name": "py" }, "code": "1" },
                "status": status,
            }))
            .unwrap()
        };
        let (executions, mut writer) = reflector::store::<Execution>();
        let (executors, _) = reflector::store::<BriqExecutor>();
        assert_eq!(live(&executors, &executions, 0, 0).oldest_queued_seconds, 0);
        let done = json!({ "conditions": [{
            "type": "Succeeded", "status": "True", "reason": "Completed", "message": "",
            "lastTransitionTime": ago(1),
        }]});
        for object in [
            execution("finished", ago(120), done),
            execution("running", ago(60), json!({ "attemptId": "a1" })),
            execution(
                "waiting-for-briq",
                ago(2),
                json!({ "attemptId": "a2", "conditions": [{
                    "type": "Succeeded", "status": "Unknown", "reason": "WaitingForBriq",
                    "message": "", "lastTransitionTime": ago(1),
                }]}),
            ),
            execution("queued-long", ago(20), json!({})),
            execution("queued-new", ago(1), json!({})),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(object));
        }
        let now = live(&executors, &executions, 0, 1);
        assert_eq!((now.queued, now.running), (2, 2));
        assert_eq!((now.waiting_for_briq, now.briq_unreachable_keys), (1, 1));
        assert!(
            (20 * 60..20 * 60 + 30).contains(&now.oldest_queued_seconds),
            "{now:?}"
        );
    }
}
