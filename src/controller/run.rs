//! The controllers' runtime: the watches, the caches they fill, the three controllers and their
//! sweepers, wired together and stopped together.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, TryStreamExt};
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        Controller, WatchStreamExt,
        controller::{self},
        events::{Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{
    cache,
    context::{Result, Settings, Shared},
    execution, executor, orphans, pool, wake,
};
use crate::{
    briq::SandboxApi,
    crd::{
        BriqExecutor, BriqExecutorClass, BriqExecutorPool, CLAIMED_BY_ANNOTATION, Execution,
        conditions,
    },
    http::Health,
    metrics::{ControllerKind, Live, Metrics},
};

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
pub fn log_failure<T, E: std::fmt::Display>(
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
pub fn live(
    executors: &Store<BriqExecutor>,
    executions: &Store<Execution>,
    bookkeeping: usize,
    briq: BriqKeys,
) -> Live {
    let mut live = Live {
        bookkeeping: bookkeeping as i64,
        briq_unreachable_keys: briq.unreachable as i64,
        briq_mismatched_keys: briq.mismatched as i64,
        ..Live::default()
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    for execution in executions.state() {
        let status = execution.status.clone().unwrap_or_default();
        if execution.finished() || execution.metadata.deletion_timestamp.is_some() {
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
    live.classes = crate::usage::usage(&executors.state(), &executions.state());
    // A handed-over member records its claimer's sandbox too: counted once, with the claimer.
    live.sandboxes = executors
        .state()
        .iter()
        .filter(|e| e.status.as_ref().is_some_and(|s| s.sandbox_id.is_some()))
        .filter(|e| !e.annotations().contains_key(CLAIMED_BY_ANNOTATION))
        .count() as i64;
    live.suspended = executors
        .state()
        .iter()
        .filter(|e| {
            e.status.as_ref().is_some_and(|s| {
                conditions::find(&s.conditions, conditions::READY).is_some_and(|ready| {
                    ready.reason == crate::crd::reasons::ExecutorReason::Suspended.as_str()
                })
            })
        })
        .count() as i64;
    live
}

pub type Count = Box<dyn Fn() -> usize + Send + Sync>;

/// The API keys briq answers no call with, and those whose server's interface does not match.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BriqKeys {
    pub unreachable: usize,
    pub mismatched: usize,
}

/// How often the bookkeeping is checked against the caches.
pub const BOOKKEEPING_SWEEP: Duration = Duration::from_secs(10);

/// A task that ends with its owner.
pub struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reports the controllers' state to the observer; undoes it when the controllers stop (or are
/// dropped, as when the lease is lost).
pub struct Reporting {
    observer: Observer,
    synced: tokio::task::JoinHandle<()>,
}

impl Reporting {
    fn start(
        observer: &Observer,
        executors: Store<BriqExecutor>,
        executions: Store<Execution>,
        bookkeeping: Count,
        briq_keys: Box<dyn Fn() -> BriqKeys + Send + Sync>,
    ) -> Reporting {
        let (cached_executors, cached_executions) = (executors.clone(), executions.clone());
        observer.metrics.set_live(Some(Box::new(move || {
            live(
                &cached_executors,
                &cached_executions,
                bookkeeping(),
                briq_keys(),
            )
        })));
        let health = observer.health.clone();
        let synced = tokio::spawn(async move {
            if cache::until_ready(&executors).await && cache::until_ready(&executions).await {
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
    let shared = Arc::new(Shared {
        classes: class_store.clone(),
        classes_listed,
        recorder,
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
    // An Execution for a suspended executor resumes it; the end of the last one suspends an
    // executor asked to suspend (wake.rs, `suspension_wake`).
    let (suspension_executors, suspension_executions) =
        (executor_store.clone(), execution_store.clone());
    let suspension = wake::sender(class_wake_tx.clone());
    let execution_events = watcher(executions, watcher::Config::default().any_semantic())
        .modify(move |execution| {
            keep_code.heard(execution);
            cache::compact_execution(execution);
        })
        .reflect(execution_writer)
        .inspect(move |event| freshness.heard(event))
        .inspect_ok(move |event| {
            match event {
                watcher::Event::Delete(gone) => {
                    on_execution_event.deleted(gone);
                    if let Some(executor) = wake::suspension_wake(&suspension_executors, gone, true)
                    {
                        suspension(executor);
                    }
                }
                watcher::Event::Apply(execution) => {
                    if let Some(executor) =
                        wake::suspension_wake(&suspension_executors, execution, false)
                    {
                        suspension(executor);
                    }
                }
                // A (re)list is in the cache only at its end.
                watcher::Event::InitDone => {
                    for execution in suspension_executions.state() {
                        if let Some(executor) =
                            wake::suspension_wake(&suspension_executors, &execution, false)
                        {
                            suspension(executor);
                        }
                    }
                }
                watcher::Event::Init | watcher::Event::InitApply(_) => {}
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
    let briq_keys: Box<dyn Fn() -> BriqKeys + Send + Sync> = {
        let shared = shared.clone();
        Box::new(move || BriqKeys {
            unreachable: shared.sandboxes.unreachable_keys(),
            mismatched: shared.sandboxes.mismatched_keys(),
        })
    };
    let _reporting = Reporting::start(
        &observer,
        executor_store,
        execution_store,
        bookkeeping,
        briq_keys,
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
    fn suspended_executors_are_counted_by_their_ready_reason() {
        let (executors, mut writer) = reflector::store::<BriqExecutor>();
        for (name, reason) in [
            ("a", "Suspended"),
            ("b", "Suspending"),
            ("c", "KernelReady"),
        ] {
            let mut object = executor(name, Some("bq_1"), json!({}));
            object.status.as_mut().unwrap().conditions = conditions::merge(
                &[],
                &[conditions::desired(conditions::READY, "False", reason, "")],
                None,
            );
            writer.apply_watcher_event(&watcher::Event::Apply(object));
        }
        let (executions, _) = reflector::store::<Execution>();
        assert_eq!(
            live(&executors, &executions, 0, BriqKeys::default()).suspended,
            1
        );
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
        assert_eq!(
            live(&executors, &executions, 0, BriqKeys::default()).sandboxes,
            3
        );
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
        assert_eq!(
            live(&executors, &executions, 0, BriqKeys::default()).oldest_queued_seconds,
            0
        );
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
        let briq = BriqKeys {
            unreachable: 1,
            mismatched: 2,
        };
        let now = live(&executors, &executions, 0, briq);
        assert_eq!((now.queued, now.running), (2, 2));
        assert_eq!((now.waiting_for_briq, now.briq_unreachable_keys), (1, 1));
        assert_eq!(now.briq_mismatched_keys, 2);
        assert!(
            (20 * 60..20 * 60 + 30).contains(&now.oldest_queued_seconds),
            "{now:?}"
        );
    }
}
