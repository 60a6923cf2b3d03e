//! The objects the scenarios create and wait for, and a counter of the watch events they cause.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use futures::{StreamExt, TryStreamExt, stream};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams},
    runtime::watcher,
};
use serde_json::json;

use briq_operator::crd::{BriqExecutor, Execution, history_owner};

use crate::{stack, wait};

const READY_TIMEOUT: Duration = Duration::from_secs(180);
const DELETE_TIMEOUT: Duration = Duration::from_secs(180);
/// Create calls in flight at once when many objects are created "at once".
const CREATES_AT_ONCE: usize = 32;
/// How long a watch may take to list what is there before it reports changes.
const WATCH_START_TIMEOUT: Duration = Duration::from_secs(30);

pub fn executor(name: &str, spec: serde_json::Value) -> anyhow::Result<BriqExecutor> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1",
        "kind": "BriqExecutor",
        "metadata": { "name": name },
        "spec": spec,
    }))?)
}

pub fn execution(name: &str, executor: &str, code: &str) -> anyhow::Result<Execution> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1",
        "kind": "Execution",
        "metadata": { "name": name },
        "spec": { "executorRef": { "name": executor }, "code": code },
    }))?)
}

/// Server-side applies `status` to the Execution `name`, as the operator writes one (the bench
/// times such writes alone).
pub async fn apply_execution_status(
    api: &Api<Execution>,
    name: &str,
    status: serde_json::Value,
) -> anyhow::Result<()> {
    let patch =
        json!({ "apiVersion": "briq.cloud/v1alpha1", "kind": "Execution", "status": status });
    api.patch_status(
        name,
        &kube::api::PatchParams::apply("briq-bench").force(),
        &kube::api::Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// [`execution`] as the Python client and kubectl-briq create it: owned by `executor` from
/// the start, so the operator need not adopt it.
pub fn execution_of(name: &str, executor: &BriqExecutor, code: &str) -> anyhow::Result<Execution> {
    let mut execution = execution(name, &executor.name_any(), code)?;
    execution.metadata.owner_references = history_owner(executor).map(|owner| vec![owner]);
    Ok(execution)
}

fn condition<'a>(
    conditions: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// `Succeeded` is True or False.
pub fn finished(execution: &Execution) -> bool {
    execution
        .status
        .as_ref()
        .and_then(|s| condition(&s.conditions, "Succeeded"))
        .is_some_and(|c| c.status != "Unknown")
}

/// Checks that a finished Execution succeeded with output `expected`.
pub fn check_output(execution: &Execution, expected: &str) -> anyhow::Result<()> {
    let status = execution.status.clone().unwrap_or_default();
    let succeeded = condition(&status.conditions, "Succeeded");
    if succeeded.is_none_or(|c| c.status != "True") || status.output.as_deref() != Some(expected) {
        bail!(
            "Execution {} did not give {expected}: {:?}, output {:?}",
            execution.name_any(),
            succeeded.map(|c| (&c.reason, &c.message)),
            status.output
        );
    }
    Ok(())
}

/// Ready=True, Ready=False with a final reason (Stalled=True, or `reason`), else still going.
pub fn ready_reason(executor: &BriqExecutor) -> Option<(bool, String, String)> {
    let status = executor.status.as_ref()?;
    let ready = condition(&status.conditions, "Ready")?;
    let stalled = condition(&status.conditions, "Stalled").is_some_and(|c| c.status == "True");
    (ready.status == "True" || stalled || ready.status == "False").then(|| {
        (
            ready.status == "True",
            ready.reason.clone(),
            ready.message.clone(),
        )
    })
}

/// Ready=True.
pub fn ready(executor: &BriqExecutor) -> bool {
    ready_reason(executor).is_some_and(|(ready, _, _)| ready)
}

/// Waits until the executor is Ready (an error if it stalls or fails).
pub async fn wait_ready(api: &Api<BriqExecutor>, name: &str) -> anyhow::Result<BriqExecutor> {
    let decided = |e: &BriqExecutor| {
        ready_reason(e).is_some_and(|(ready, reason, _)| ready || reason != "Provisioning")
    };
    let found = wait::for_object(api, name, READY_TIMEOUT, decided)
        .await
        .with_context(|| format!("executor {name} was not ready"))?;
    match ready_reason(&found) {
        Some((true, _, _)) => Ok(found),
        Some((false, reason, message)) => bail!("executor {name}: {reason}: {message}"),
        None => bail!("executor {name} has no Ready condition"),
    }
}

/// Creates executors `names` (spec `spec`), `at_once` at a time, each waited on until Ready.
/// One whose setup fails (a kernel start-up past its deadline on a busy machine, say) is
/// deleted and created again, twice at most; returns how many setups failed so.
pub async fn create_ready(
    api: &Api<BriqExecutor>,
    names: &[String],
    spec: &serde_json::Value,
    at_once: usize,
) -> anyhow::Result<usize> {
    let failures = AtomicU64::new(0);
    stream::iter(names)
        .map(|name| {
            let failures = &failures;
            async move {
                for attempt in 0.. {
                    api.create(&PostParams::default(), &executor(name, spec.clone())?)
                        .await?;
                    match wait_ready(api, name).await {
                        Ok(_) => return Ok(()),
                        Err(error) if attempt >= 2 => return Err(error),
                        Err(_) => {
                            failures.fetch_add(1, Ordering::SeqCst);
                            api.delete(name, &DeleteParams::default()).await?;
                            wait::deleted(api, name, DELETE_TIMEOUT).await?;
                        }
                    }
                }
                unreachable!("the loop returns")
            }
        })
        .buffer_unordered(at_once.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(failures.load(Ordering::SeqCst) as usize)
}

/// Creates every object, [`CREATES_AT_ONCE`] calls at a time, none after `deadline`; when each
/// create call was sent, by name.
pub async fn create_all<K>(
    api: &Api<K>,
    objects: impl IntoIterator<Item = K>,
    deadline: Option<Instant>,
) -> anyhow::Result<HashMap<String, Instant>>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    stream::iter(objects)
        // Asked each time a call slot frees up.
        .take_while(|_| std::future::ready(deadline.is_none_or(|d| Instant::now() < d)))
        .map(|object| async move {
            let at = Instant::now();
            api.create(&PostParams::default(), &object).await?;
            Ok::<_, anyhow::Error>((object.name_any(), at))
        })
        .buffer_unordered(CREATES_AT_ONCE)
        .try_collect()
        .await
}

/// When each object of an `Api` was first seen meeting a condition, through one watch that is
/// running by the time [`FirstSeen::start`] returns.
pub struct FirstSeen {
    /// By name: when, and the note taken of the object then.
    seen: Arc<Mutex<HashMap<String, (Instant, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FirstSeen {
    pub async fn start<K>(api: Api<K>, condition: fn(&K) -> bool) -> anyhow::Result<FirstSeen>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        FirstSeen::start_noting(api, condition, |_| String::new()).await
    }

    /// [`FirstSeen::start`], also taking `note` of each object as it was when first seen
    /// meeting the condition ([`FirstSeen::notes`]): what a later read may no longer show.
    pub async fn start_noting<K>(
        api: Api<K>,
        condition: fn(&K) -> bool,
        note: fn(&K) -> String,
    ) -> anyhow::Result<FirstSeen>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        let seen: Arc<Mutex<HashMap<String, (Instant, String)>>> = Arc::default();
        let (synced_tx, synced) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn({
            let seen = Arc::clone(&seen);
            async move {
                let mut synced_tx = Some(synced_tx);
                let mut events = watcher(api, watcher::Config::default()).boxed();
                while let Some(event) = events.next().await {
                    let object = match event {
                        Ok(watcher::Event::InitDone) => {
                            if let Some(tx) = synced_tx.take() {
                                let _ = tx.send(());
                            }
                            continue;
                        }
                        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
                        _ => continue,
                    };
                    if condition(&object) {
                        let now = Instant::now();
                        lock(&seen)
                            .entry(object.name_any())
                            .or_insert_with(|| (now, note(&object)));
                    }
                }
            }
        });
        tokio::time::timeout(WATCH_START_TIMEOUT, synced)
            .await
            .context("the watch did not start")??;
        Ok(FirstSeen { seen, task })
    }

    pub fn count(&self) -> usize {
        lock(&self.seen).len()
    }

    /// Waits until `count` objects were seen, or until `bound` after `since`; whether they were.
    pub async fn wait_for(&self, count: usize, since: Instant, bound: Duration) -> bool {
        loop {
            if self.count() >= count {
                return true;
            }
            if since.elapsed() > bound {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// When each object was first seen meeting the condition, by name.
    pub fn times(&self) -> HashMap<String, Instant> {
        lock(&self.seen)
            .iter()
            .map(|(name, (at, _))| (name.clone(), *at))
            .collect()
    }

    /// The note taken of each object when it was first seen meeting the condition, by name.
    pub fn notes(&self) -> HashMap<String, String> {
        lock(&self.seen)
            .iter()
            .map(|(name, (_, note))| (name.clone(), note.clone()))
            .collect()
    }

    /// Waits until every one of `names` was seen (other objects of the `Api` meeting the
    /// condition do not count), or until `deadline`; whether they were.
    pub async fn wait_for_names(&self, names: &[String], deadline: Instant) -> bool {
        loop {
            if names.iter().all(|name| lock(&self.seen).contains_key(name)) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// When the named object was first seen meeting the condition.
    pub fn seen(&self, name: &str) -> Option<Instant> {
        lock(&self.seen).get(name).map(|(at, _)| *at)
    }
}

impl Drop for FirstSeen {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A poisoned lock's data, still usable: a panicking watch task must not take the bench down.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Deletes every executor of the namespace (their finalizers destroy the sandboxes) and waits
/// until they are gone.
pub async fn delete_executors(api: &Api<BriqExecutor>) -> anyhow::Result<()> {
    stack::delete_executors(api, DELETE_TIMEOUT).await
}

/// Counts the watch events anyone watching a namespace receives, per kind, from the moment
/// [`WatchCounter::start`] returns.
pub struct WatchCounter {
    executions: Arc<AtomicU64>,
    executors: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl WatchCounter {
    pub async fn start(client: &Client, namespace: &str) -> anyhow::Result<WatchCounter> {
        let (executions, executors) = (Arc::default(), Arc::default());
        let tasks = vec![
            count_events::<Execution>(
                Api::namespaced(client.clone(), namespace),
                Arc::clone(&executions),
            )
            .await?,
            count_events::<BriqExecutor>(
                Api::namespaced(client.clone(), namespace),
                Arc::clone(&executors),
            )
            .await?,
        ];
        Ok(WatchCounter {
            executions,
            executors,
            tasks,
        })
    }

    /// (Execution events, BriqExecutor events) so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.executions.load(Ordering::SeqCst),
            self.executors.load(Ordering::SeqCst),
        )
    }
}

impl Drop for WatchCounter {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Starts a raw watch from the current resource version; returns once it is established.
async fn count_events<K>(
    api: Api<K>,
    counter: Arc<AtomicU64>,
) -> anyhow::Result<tokio::task::JoinHandle<()>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    async fn from_now<K>(api: &Api<K>) -> kube::Result<String>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let list = api.list_metadata(&ListParams::default().limit(1)).await?;
        Ok(list.metadata.resource_version.unwrap_or_default())
    }
    let params = WatchParams::default().timeout(290);
    let mut version = from_now(&api).await?;
    let mut events = api.watch(&params, &version).await?.boxed();
    Ok(tokio::spawn(async move {
        loop {
            while let Some(event) = events.next().await {
                match event {
                    Ok(WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o)) => {
                        counter.fetch_add(1, Ordering::SeqCst);
                        version = o.resource_version().unwrap_or(version);
                    }
                    Ok(WatchEvent::Bookmark(b)) => version = b.metadata.resource_version,
                    // Too old a version: start again from now (events in between are lost,
                    // which a benchmark of minutes does not see in practice).
                    Ok(WatchEvent::Error(_)) | Err(_) => {
                        version = from_now(&api).await.unwrap_or(version);
                        break;
                    }
                }
            }
            match api.watch(&params, &version).await {
                Ok(next) => events = next.boxed(),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }))
}
