//! The watches and the caches they fill: one watch per kind (Executions, executors, pools,
//! classes), each event applied to its cache before it wakes anything, so that a woken reconcile
//! reads the change that woke it (wake.rs says what wakes whom). The watches of Executions,
//! executors and pools feed their controllers; the watch of classes runs as a task of its own.

use std::sync::Arc;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use kube::{
    Api, Client, Resource,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store, store::Writer},
        watcher,
    },
};
use tokio::sync::{
    mpsc::{self, UnboundedReceiver, UnboundedSender},
    watch,
};

use crate::{
    briq::SandboxApi,
    controller::{cache, execution, executor, orphans, wake},
    crd::{BriqExecutor, BriqExecutorClass, BriqExecutorPool, Execution},
    task::AbortOnDrop,
};

/// The caches the watches fill and the controllers read, and the senders of the wake-ups each
/// controller hears beside its own watch.
pub struct Caches {
    pub executors: Store<BriqExecutor>,
    pub executions: Store<Execution>,
    pub pools: Store<BriqExecutorPool>,
    pub classes: Store<BriqExecutorClass>,
    /// True once the class watch has listed every class.
    pub classes_listed: watch::Receiver<bool>,
    pub wake_execution: UnboundedSender<ObjectRef<Execution>>,
    pub wake_executor: UnboundedSender<ObjectRef<BriqExecutor>>,
    pub wake_pool: UnboundedSender<ObjectRef<BriqExecutorPool>>,
}

/// The watches before they start: what each one watches and the cache it writes.
pub struct Watches {
    executions: (Api<Execution>, Writer<Execution>),
    executors: (Api<BriqExecutor>, Writer<BriqExecutor>),
    pools: (Api<BriqExecutorPool>, Writer<BriqExecutorPool>),
    classes: (Api<BriqExecutorClass>, Writer<BriqExecutorClass>),
    classes_listed: watch::Sender<bool>,
    woken: Woken,
}

/// The receiving ends of the wake-ups, one per controller (its `reconcile_on`).
pub struct Woken {
    pub executions: UnboundedReceiver<ObjectRef<Execution>>,
    pub executors: UnboundedReceiver<ObjectRef<BriqExecutor>>,
    pub pools: UnboundedReceiver<ObjectRef<BriqExecutorPool>>,
}

/// What drives the controllers: the objects each one's watch applied, and its wake-ups.
pub struct Feeds<E, X, P> {
    pub executions: E,
    pub executors: X,
    pub pools: P,
    pub woken: Woken,
}

/// The watches started: the feeds of the controllers, and the class watch, a task of its own
/// (classes drive no controller: a class change wakes executors and pools).
pub struct Started<E, X, P> {
    pub feeds: Feeds<E, X, P>,
    pub class_watch: AbortOnDrop,
}

/// The caches, empty, and the watches that will fill them: of `namespace` (every namespace when
/// `None`), and every class (classes belong to no namespace).
pub fn caches(client: &Client, namespace: Option<&str>) -> (Caches, Watches) {
    // Classes are known before any executor takes one: `credentials::class_of` waits for their
    // first list.
    let (classes, class_writer) = reflector::store::<BriqExecutorClass>();
    let (classes_listed_tx, classes_listed) = watch::channel(false);
    let (executions, execution_writer) = reflector::store::<Execution>();
    let (executors, executor_writer) = reflector::store::<BriqExecutor>();
    let (pools, pool_writer) = reflector::store::<BriqExecutorPool>();
    let (wake_execution, woken_executions) = mpsc::unbounded_channel();
    let (wake_executor, woken_executors) = mpsc::unbounded_channel();
    let (wake_pool, woken_pools) = mpsc::unbounded_channel();
    let caches = Caches {
        executors,
        executions,
        pools,
        classes,
        classes_listed,
        wake_execution,
        wake_executor,
        wake_pool,
    };
    let watches = Watches {
        executions: (scoped(client, namespace), execution_writer),
        executors: (scoped(client, namespace), executor_writer),
        pools: (scoped(client, namespace), pool_writer),
        classes: (Api::all(client.clone()), class_writer),
        classes_listed: classes_listed_tx,
        woken: Woken {
            executions: woken_executions,
            executors: woken_executors,
            pools: woken_pools,
        },
    };
    (caches, watches)
}

/// The API of `K` in `namespace`, or in every namespace when `None`.
fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

impl Watches {
    /// Starts the class watch, and hands the other watches to their controllers; the contexts
    /// hear what they keep of the objects watched (code, cancel requests, deletions).
    pub fn start<S: SandboxApi + 'static>(
        self,
        caches: &Caches,
        execution: &Arc<execution::Context<S>>,
        executor: &Arc<executor::Context<S>>,
        orphans: &Arc<orphans::Sweeper<S>>,
    ) -> Started<
        impl Stream<Item = Result<Execution, watcher::Error>> + Send + use<S>,
        impl Stream<Item = Result<BriqExecutor, watcher::Error>> + Send + use<S>,
        impl Stream<Item = Result<BriqExecutorPool, watcher::Error>> + Send + use<S>,
    > {
        let (executions, execution_writer) = self.executions;
        let (executors, executor_writer) = self.executors;
        let (pools, pool_writer) = self.pools;
        let (classes, class_writer) = self.classes;
        let feeds = Feeds {
            executions: watch_executions(executions, execution_writer, caches, execution),
            executors: watch_executors(
                executors,
                executor_writer,
                caches,
                execution,
                executor,
                orphans,
            ),
            pools: watch_pools(pools, pool_writer),
            woken: self.woken,
        };
        let class_watch = AbortOnDrop(tokio::spawn(
            wake::class_events(
                watcher(classes, watcher::Config::default().any_semantic()),
                class_writer,
                self.classes_listed,
                caches.executors.clone(),
                wake::sender(caches.wake_executor.clone()),
                caches.pools.clone(),
                wake::sender(caches.wake_pool.clone()),
            )
            .for_each(|_| async {}),
        ));
        Started { feeds, class_watch }
    }
}

/// The watch of Executions: each one's code and cancel request kept beside the cache, the rest
/// compacted into it; then deletions and suspensions heard, once the cache shows them.
fn watch_executions<S: SandboxApi + 'static>(
    api: Api<Execution>,
    writer: Writer<Execution>,
    caches: &Caches,
    execution_ctx: &Arc<execution::Context<S>>,
) -> impl Stream<Item = Result<Execution, watcher::Error>> + Send + use<S> {
    // A deleted Execution is not reconciled, but the one queued behind it must hear of it, and
    // what the controller kept of it goes.
    let on_execution_event = execution_ctx.clone();
    let freshness = execution_ctx.freshness.clone();
    let keep_code = execution_ctx.clone();
    // An Execution for a suspended executor resumes it; the end of the last one suspends an
    // executor asked to suspend (wake.rs, `suspension_wake`).
    let (suspension_executors, suspension_executions) =
        (caches.executors.clone(), caches.executions.clone());
    let suspension = wake::sender(caches.wake_executor.clone());
    watcher(api, watcher::Config::default().any_semantic())
        .modify(move |execution| {
            keep_code.heard(execution);
            cache::compact_execution(execution);
        })
        .reflect(writer)
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
        .applied_objects()
}

/// One watch of executors for all three controllers: what waits on an executor is woken only
/// once the executor cache shows the change that woke it, or the woken reconcile could read the
/// old state and wait for a change that has already come.
fn watch_executors<S: SandboxApi + 'static>(
    api: Api<BriqExecutor>,
    writer: Writer<BriqExecutor>,
    caches: &Caches,
    execution_ctx: &Arc<execution::Context<S>>,
    executor_ctx: &Arc<executor::Context<S>>,
    orphan_sweep: &Arc<orphans::Sweeper<S>>,
) -> impl Stream<Item = Result<BriqExecutor, watcher::Error>> + Send + use<S> {
    let triggers = wake::ExecutorTriggers {
        executors: caches.executors.clone(),
        executions: caches.executions.clone(),
        wake_execution: wake::sender(caches.wake_execution.clone()),
        wake_pool: wake::sender(caches.wake_pool.clone()),
        wake_executor: wake::sender(caches.wake_executor.clone()),
    };
    let (on_executor_deleted, wake_sweeper) = (executor_ctx.clone(), orphan_sweep.clone());
    let forget_executor = execution_ctx.clone();
    wake::executor_events(
        // The first list is a consistent read, not the API server's watch cache: a restarted
        // operator must see every handover its predecessor made (executor::handover).
        watcher(api, watcher::Config::default()),
        writer,
        triggers,
        move |gone| {
            on_executor_deleted.deleted(gone);
            wake_sweeper.deleted(gone);
            forget_executor.executor_deleted(gone);
        },
    )
}

/// The watch of pools, compacted into the pool cache.
fn watch_pools(
    api: Api<BriqExecutorPool>,
    writer: Writer<BriqExecutorPool>,
) -> impl Stream<Item = Result<BriqExecutorPool, watcher::Error>> + Send {
    watcher(api, watcher::Config::default().any_semantic())
        .modify(cache::compact)
        .reflect(writer)
        .applied_objects()
}
