//! The three controllers (Executions, executors, pools) as kube-runtime `Controller`s over the
//! watches' feeds: the contexts they keep between reconciles ([`Contexts`]), the one signal
//! that stops them all ([`stop_on`]), and how each one's reconciles run and fail ([`run`]).

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use futures::{Stream, StreamExt};
use kube::{
    Client,
    runtime::{
        Controller,
        controller::{self},
        watcher,
    },
};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tracing::warn;

use super::watches::{Caches, Feeds};
use crate::{
    briq::SandboxApi,
    controller::{
        context::{Result, Settings, Shared, event_recorder},
        execution, executor, orphans, pool,
    },
    crd::{BriqExecutor, BriqExecutorPool, Execution},
    metrics::{ControllerKind, Metrics},
};

/// What the controllers keep between reconciles: what they share, each one's own context, and
/// the orphan sweeper's.
pub struct Contexts<S> {
    pub shared: Arc<Shared<S>>,
    pub execution: Arc<execution::Context<S>>,
    pub executor: Arc<executor::Context<S>>,
    pub pool: Arc<pool::Context<S>>,
    pub orphans: Arc<orphans::Sweeper<S>>,
}

impl<S: SandboxApi> Contexts<S> {
    /// The contexts over `caches`; `stopping` turns true once shutdown begins.
    pub fn new(
        client: &Client,
        sandboxes: S,
        settings: Settings,
        metrics: &Arc<Metrics>,
        stopping: Arc<AtomicBool>,
        caches: &Caches,
    ) -> Self {
        let recorder = event_recorder(client.clone());
        let shared = Arc::new(Shared {
            classes: caches.classes.clone(),
            classes_listed: caches.classes_listed.clone(),
            recorder,
            client: client.clone(),
            sandboxes,
            settings,
            metrics: metrics.clone(),
            stopping,
            holder: format!("op-{:012x}", rand::random::<u64>() >> 16),
        });
        Contexts {
            execution: Arc::new(execution::Context::new(
                shared.clone(),
                caches.executions.clone(),
                caches.executors.clone(),
                caches.wake_execution.clone(),
            )),
            executor: Arc::new(executor::Context::new(
                shared.clone(),
                caches.executors.clone(),
                caches.executions.clone(),
                caches.pools.clone(),
            )),
            pool: Arc::new(pool::Context::new(
                shared.clone(),
                caches.pools.clone(),
                caches.executors.clone(),
            )),
            orphans: Arc::new(orphans::Sweeper::new(
                shared.clone(),
                caches.executors.clone(),
            )),
            shared,
        }
    }
}

/// The stop signal of each controller, and the flag [`Shared::stopping`] reads: the controllers
/// stop on the same signal, each finishing the reconciles it has started.
pub fn stop_on(
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> (
    [impl Future<Output = ()> + Send + Sync + 'static; 3],
    Arc<AtomicBool>,
) {
    let (shutdown_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let stop_signal = || {
        let mut rx = shutdown_tx.subscribe();
        async move {
            let _ = rx.recv().await;
        }
    };
    let stops = [stop_signal(), stop_signal(), stop_signal()];
    let stopping = Arc::new(AtomicBool::new(false));
    let stopping_flag = stopping.clone();
    tokio::spawn(async move {
        shutdown.await;
        stopping_flag.store(true, Ordering::SeqCst);
        let _ = shutdown_tx.send(());
    });
    (stops, stopping)
}

/// The three controllers over `feeds`, which run until `stop` (from [`stop_on`]) resolves and
/// each has finished the reconciles it started.
pub fn run<S, E, X, P, F>(
    feeds: Feeds<E, X, P>,
    caches: &Caches,
    contexts: &Contexts<S>,
    stop: [F; 3],
) -> impl Future<Output = ()> + use<S, E, X, P, F>
where
    S: SandboxApi + 'static,
    E: Stream<Item = Result<Execution, watcher::Error>> + Send + 'static,
    X: Stream<Item = Result<BriqExecutor, watcher::Error>> + Send + 'static,
    P: Stream<Item = Result<BriqExecutorPool, watcher::Error>> + Send + 'static,
    F: Future<Output = ()> + Send + Sync + 'static,
{
    let [execution_stop, executor_stop, pool_stop] = stop;
    // Executions are woken by executor changes through the one watch of executors, once the
    // executor cache shows them (see wake.rs).
    let execution_loop = Controller::for_stream(feeds.executions, caches.executions.clone())
        // Unbounded: the work slots bound the work, fairly across namespaces, and a reconcile
        // that only waits for briq (an action running) holds none (see fair.rs).
        .with_config(controller::Config::default().concurrency(0))
        .reconcile_on(UnboundedReceiverStream::new(feeds.woken.executions))
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
            contexts.execution.clone(),
        )
        .for_each(|result| async move { log_failure("execution", result) });
    // Unbounded, as for Executions: the work slots bound the work (see fair.rs).
    let executor_loop = Controller::for_stream(feeds.executors, caches.executors.clone())
        .with_config(controller::Config::default().concurrency(0))
        .reconcile_on(UnboundedReceiverStream::new(feeds.woken.executors))
        .graceful_shutdown_on(executor_stop)
        .run(
            |executor, ctx| async move {
                let metrics = ctx.shared.metrics.clone();
                let reconcile = executor::reconcile(executor, ctx);
                metrics.reconcile(ControllerKind::Executor, reconcile).await
            },
            executor::error_policy,
            contexts.executor.clone(),
        )
        .for_each(|result| async move { log_failure("executor", result) });
    // Pools: woken by their own changes and by any change of a member (claimed ones too, which
    // the pool no longer owns: a claim is what makes it refill), through the executor triggers;
    // and by any change of a class.
    let pool_loop = Controller::for_stream(feeds.pools, caches.pools.clone())
        .reconcile_on(UnboundedReceiverStream::new(feeds.woken.pools))
        .graceful_shutdown_on(pool_stop)
        .run(
            |pool, ctx| async move {
                let metrics = ctx.shared.metrics.clone();
                metrics
                    .reconcile(ControllerKind::Pool, pool::reconcile(pool, ctx))
                    .await
            },
            pool::error_policy,
            contexts.pool.clone(),
        )
        .for_each(|result| async move { log_failure("pool", result) });
    async move {
        futures::future::join3(execution_loop, executor_loop, pool_loop).await;
    }
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
