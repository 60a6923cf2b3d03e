//! What wakes each wait of the operator: a trigger from a watch that cannot be lost, or a bounded
//! recheck, decided here.
//!
//! A wake-up is lost when it is spent before the state it should reveal is in the cache the
//! woken reconcile reads: a reconcile that reads the old state waits again, and nothing comes
//! after. So every trigger derived from a change of executors is sent only once the executor
//! cache shows that change ([`ExecutorTriggers`]): one watch of executors feeds the cache, and
//! each of its events is turned into wake-ups after it was applied. (A watch of its own per
//! controller could deliver a change before the shared cache had it: an Execution woken by its
//! executor's Ready would read "not ready" and wait for a change that had already come.)
//!
//! The waits, and what wakes them:
//!
//! | wait | trigger | recheck ([`recheck`](super::recheck::recheck)) |
//! |---|---|---|
//! | Execution, executor missing | the executor's creation ([`ExecutorTriggers`]) | [`SAFETY_NET`](super::recheck::SAFETY_NET), until `executorWait` runs out |
//! | Execution, executor not Ready | the executor's Ready write ([`ExecutorTriggers`]) | [`SAFETY_NET`](super::recheck::SAFETY_NET) |
//! | Execution, its turn in the queue | the one before it finishing or deleted (`wake_next`) | [`TURN`](super::recheck::TURN) |
//! | Execution, a burst still arriving | — | until [`BURST_WINDOW`](super::recheck::BURST_WINDOW) after its creation second |
//! | Execution, an attempt another process may still report | — | until the attempt's deadline and [`ATTEMPT_GRACE`](super::recheck::ATTEMPT_GRACE) |
//! | Execution whose outcome briq left unknown (`WaitingForBriq`) | — | [`briq_recheck`](super::recheck::briq_recheck): 1 s at first, up to 15 s, never before `Retry-After`, until the outage patience runs out |
//! | Execution or executor, its key Secret | — (Secrets are not watched: the operator reads them one by one) | [`key_recheck`](super::recheck::key_recheck): 1 s at first, up to 30 s |
//! | executor, another operator's pending create of its sandbox | the sandbox id recorded (its own watch) | until the mark is `pending_create_expiry` old |
//! | executor, its class created or changed to allow it (`ClassNotFound`, `ClassRefused`) | any change of a class ([`class_events`]) | [`CLASS_RECHECK`](super::recheck::CLASS_RECHECK) |
//! | executor, a place under its class's `maxExecutors` (`WaitingForCapacity`) | any change of an executor of its namespace ([`ExecutorTriggers`]), of a class | [`CLASS_RECHECK`](super::recheck::CLASS_RECHECK) |
//! | Execution, a place under its class's `maxRunningExecutions` (`WaitingForCapacity`) | an Execution of its namespace ending or deleted (`Context::finish`, `deleted`) | [`SAFETY_NET`](super::recheck::SAFETY_NET) |
//! | claimer, a Ready pool member | a member of its pool Ready and unclaimed ([`claimers_to_serve`], [`ExecutorTriggers`]) | [`CLAIM_RECHECK`](super::recheck::CLAIM_RECHECK) until `coldCreateAfterSeconds` |
//! | pool, its members provisioning | any change of a member ([`ExecutorTriggers`]) | [`POOL_FILLING`](super::recheck::POOL_FILLING) |
//! | pool, its template's class (`ClassNotFound`) or its class's `maxPoolReplicas` | any change of a class ([`class_events`]) | [`POOL_FILLING`](super::recheck::POOL_FILLING) |
//! | source with forks waiting (`Forking`), its running Execution finishing | — | [`DRAIN`](super::recheck::DRAIN) |
//! | source, a fork created or gone; fork, its source created, its snapshot saved | that executor's change ([`fork_links`], [`ExecutorTriggers`]) | [`SAFETY_NET`](super::recheck::SAFETY_NET) |
//! | suspended source started for its forks, their reads done | the forks' own writes ([`fork_links`]) | [`SAFETY_NET`](super::recheck::SAFETY_NET) |
//! | deleted executor, its Executions concluding | — | [`DRAIN`](super::recheck::DRAIN), within the drain limit |
//! | finished Execution, its time to live | its own changes, its executor's (TTL default) | exactly when it ends |
//! | Ready executor, its idle timeout | its own changes | exactly when it ends, else the probe interval |
//! | suspended executor, an Execution to run | the Execution's creation or change, once the Execution cache shows it ([`suspension_wake`]); its own `Suspending`/`Suspended` write | — |
//! | executor asked to suspend (`spec.suspend`), its last Execution finishing | that Execution's end or deletion, once the Execution cache shows it ([`suspension_wake`]) | the probe interval |
//! | suspending executor, an Execution that took its turn before finishing | — | [`DRAIN`](super::recheck::DRAIN) |
//! | a failed reconcile | — | its backoff (`Settings::backoff_max`) |

use futures::{Stream, StreamExt, TryStreamExt};
use kube::{
    ResourceExt,
    runtime::{
        WatchStreamExt,
        reflector::{ObjectRef, Store, store::Writer},
        watcher,
    },
};
use tokio::sync::mpsc::UnboundedSender;

use crate::crd::{
    BriqExecutor, BriqExecutorClass, BriqExecutorPool, CLAIMED_BY_ANNOTATION, Execution,
    POOL_FALLBACK_ANNOTATION, POOL_MEMBER_ANNOTATION, reasons::ExecutorReason,
};

/// A wake-up of one object.
pub type Wake<K> = Box<dyn Fn(ObjectRef<K>) + Send + Sync>;

/// Sends wake-ups to a controller's `reconcile_on` stream.
pub fn sender<K>(to: UnboundedSender<ObjectRef<K>>) -> Wake<K>
where
    K: kube::Resource + 'static,
    K::DynamicType: std::fmt::Debug + Clone + Eq + std::hash::Hash + Send + Sync,
{
    Box::new(move |object| {
        // A closed channel: that controller has stopped, and wakes nothing any more.
        let _ = to.send(object);
    })
}

/// Turns the events of the one watch of executors into wake-ups of what waits on executors,
/// each sent only once the executor cache shows the event's change: [`executor_events`] hands
/// it every event after the reflector has applied it.
pub struct ExecutorTriggers {
    pub executors: Store<BriqExecutor>,
    pub executions: Store<Execution>,
    pub wake_execution: Wake<Execution>,
    pub wake_pool: Wake<BriqExecutorPool>,
    pub wake_executor: Wake<BriqExecutor>,
}

impl ExecutorTriggers {
    pub fn heard(&self, event: &watcher::Event<BriqExecutor>) {
        match event {
            watcher::Event::Apply(executor) | watcher::Event::Delete(executor) => {
                self.changed(executor)
            }
            // A (re)list is buffered and swapped into the cache at its end: only then does the
            // cache show what it listed.
            watcher::Event::InitDone => {
                for executor in self.executors.state() {
                    self.changed(&executor);
                }
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    fn changed(&self, executor: &BriqExecutor) {
        let (executions, pool) = woken_by(&self.executions, executor);
        for execution in executions {
            (self.wake_execution)(execution);
        }
        if let Some(pool) = pool {
            (self.wake_pool)(pool);
        }
        // A place under a class's maxExecutors may have come free (an executor went, or gave
        // its sandbox back).
        let executors = self.executors.state();
        for waiting in waiting_for_a_place(&executors, executor) {
            (self.wake_executor)(waiting);
        }
        // A member became (or stayed) Ready: claimers waiting for one take it now.
        for claimer in claimers_to_serve(&executors, executor) {
            (self.wake_executor)(claimer);
        }
        for linked in fork_links(&executors, executor) {
            (self.wake_executor)(linked);
        }
    }
}

/// The executors a change of `executor` may move along a fork: its source (a fork created,
/// changed or gone: the source saves for it, or stops waiting) and its forks (a snapshot
/// saved, a source created or gone).
pub fn fork_links(
    executors: &[std::sync::Arc<BriqExecutor>],
    executor: &BriqExecutor,
) -> Vec<ObjectRef<BriqExecutor>> {
    let namespace = executor.namespace().unwrap_or_default();
    let source = executor
        .spec
        .fork_from
        .as_ref()
        .map(|from| ObjectRef::new(&from.name).within(&namespace));
    let forks = executors
        .iter()
        .filter(|fork| {
            fork.namespace().as_deref() == Some(namespace.as_str())
                && fork
                    .spec
                    .fork_from
                    .as_ref()
                    .is_some_and(|from| from.name == executor.name_any())
        })
        .map(|fork| ObjectRef::from_obj(fork.as_ref()));
    source.into_iter().chain(forks).collect()
}

/// The one watch of executors (`watch`): each event is compacted into the executor cache
/// (`writer`), then, with the cache showing it, handed to `deleted` (a deletion) and to
/// `triggers`. Yields the executors applied, for the executor controller.
pub fn executor_events<St>(
    watch: St,
    writer: Writer<BriqExecutor>,
    triggers: ExecutorTriggers,
    deleted: impl Fn(&BriqExecutor) + Send + 'static,
) -> impl Stream<Item = Result<BriqExecutor, watcher::Error>> + Send
where
    St: Stream<Item = watcher::Result<watcher::Event<BriqExecutor>>> + Send + 'static,
{
    watch
        .modify(super::cache::compact)
        .reflect(writer)
        .inspect_ok(move |event| {
            if let watcher::Event::Delete(gone) = event {
                deleted(gone);
            }
            triggers.heard(event);
        })
        .applied_objects()
}

/// The watch of classes (`watch`): each event is applied to the class cache (`writer`), then,
/// with the cache showing it, wakes the executors that wait on a class ([`waiting_on_a_class`])
/// and every pool (a pool's size and members depend on its class);
/// `listed` turns true once the first list is in the cache.
/// A watch that fails (the class CRD not installed: CRDs older than the operator) is logged and
/// retried with backoff; executors that would take a class wait meanwhile.
pub fn class_events<St>(
    watch: St,
    writer: Writer<BriqExecutorClass>,
    listed: tokio::sync::watch::Sender<bool>,
    executors: Store<BriqExecutor>,
    wake_executor: Wake<BriqExecutor>,
    pools: Store<BriqExecutorPool>,
    wake_pool: Wake<BriqExecutorPool>,
) -> impl Stream<Item = ()> + Send
where
    St: Stream<Item = watcher::Result<watcher::Event<BriqExecutorClass>>> + Send + 'static,
{
    watch
        .default_backoff()
        .modify(super::cache::compact)
        .reflect(writer)
        .map(move |event| match event {
            Ok(
                event @ (watcher::Event::Apply(_)
                | watcher::Event::Delete(_)
                | watcher::Event::InitDone),
            ) => {
                if matches!(event, watcher::Event::InitDone) {
                    // The cache holds every class now (a relist swaps its list in here).
                    listed.send_replace(true);
                }
                for executor in waiting_on_a_class(&executors.state()) {
                    wake_executor(executor);
                }
                for pool in pools.state() {
                    wake_pool(ObjectRef::from_obj(pool.as_ref()));
                }
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(
                %error,
                "watching BriqExecutorClasses failed (are the CRDs current? kubectl apply \
                 --server-side -f crds/); retrying"
            ),
        })
}

/// The executors waiting on a class: those that report `ClassNotFound`, `ClassRefused` or
/// `WaitingForCapacity` (a class change may raise its limit).
pub fn waiting_on_a_class(
    executors: &[std::sync::Arc<BriqExecutor>],
) -> Vec<ObjectRef<BriqExecutor>> {
    let waits = [
        ExecutorReason::ClassNotFound,
        ExecutorReason::ClassRefused,
        ExecutorReason::WaitingForCapacity,
    ];
    executors
        .iter()
        .filter(|executor| {
            waits
                .iter()
                .any(|reason| ready_reason_is(executor, *reason))
        })
        .map(|executor| ObjectRef::from_obj(executor.as_ref()))
        .collect()
}

/// The executors of `changed`'s namespace waiting for a place under their class's
/// `maxExecutors` (`WaitingForCapacity`), other than `changed`.
pub fn waiting_for_a_place(
    executors: &[std::sync::Arc<BriqExecutor>],
    changed: &BriqExecutor,
) -> Vec<ObjectRef<BriqExecutor>> {
    executors
        .iter()
        .filter(|executor| {
            executor.namespace() == changed.namespace()
                && executor.uid() != changed.uid()
                && ready_reason_is(executor, ExecutorReason::WaitingForCapacity)
        })
        .map(|executor| ObjectRef::from_obj(executor.as_ref()))
        .collect()
}

/// The claimers of `changed`'s pool that a Ready member can serve now, when `changed` is an
/// unclaimed member of that pool: as many of the oldest claimers still waiting (no member held,
/// no sandbox of their own) as the pool has Ready members, woken at once rather than at their
/// next look (a claimer whose wait began after this snapshot finds the member itself).
pub fn claimers_to_serve(
    executors: &[std::sync::Arc<BriqExecutor>],
    changed: &BriqExecutor,
) -> Vec<ObjectRef<BriqExecutor>> {
    let Some(pool) = changed.annotations().get(POOL_MEMBER_ANNOTATION) else {
        return Vec::new();
    };
    let unclaimed_ready = |executor: &&std::sync::Arc<BriqExecutor>| {
        executor.namespace() == changed.namespace()
            && executor.annotations().get(POOL_MEMBER_ANNOTATION) == Some(pool)
            && !executor.annotations().contains_key(CLAIMED_BY_ANNOTATION)
            && super::index::is_ready(executor)
    };
    if changed.annotations().contains_key(CLAIMED_BY_ANNOTATION) || !super::index::is_ready(changed)
    {
        return Vec::new();
    }
    let ready = executors.iter().filter(unclaimed_ready).count();
    let mut waiting: Vec<&std::sync::Arc<BriqExecutor>> = executors
        .iter()
        .filter(|executor| {
            let annotations = executor.annotations();
            executor.namespace() == changed.namespace()
                && executor
                    .spec
                    .pool_ref
                    .as_ref()
                    .is_some_and(|r| &r.name == pool)
                && executor.claimed_member().is_none()
                && !annotations.contains_key(POOL_FALLBACK_ANNOTATION)
                && executor.metadata.deletion_timestamp.is_none()
        })
        .collect();
    waiting.sort_by_key(|executor| {
        (
            executor.metadata.creation_timestamp.clone(),
            executor.name_any(),
        )
    });
    waiting
        .into_iter()
        .take(ready)
        .map(|executor| ObjectRef::from_obj(executor.as_ref()))
        .collect()
}

fn ready_reason_is(executor: &BriqExecutor, reason: ExecutorReason) -> bool {
    executor.status.as_ref().is_some_and(|status| {
        crate::crd::conditions::find(&status.conditions, crate::crd::conditions::READY)
            .is_some_and(|ready| ready.reason == reason.as_str())
    })
}

/// The executor whose suspension a change of `execution` may decide, once the Execution cache
/// shows that change (so the executor's reconcile counts it): an unfinished Execution for an
/// executor the executor cache shows suspending or suspended (it must resume), or a finished
/// one for an executor that `spec.suspend` asks to suspend once idle. If the executor cache
/// does not show the suspension yet, the executor's own write of it wakes that reconcile, which
/// then sees the Execution.
/// `gone`: the Execution was deleted (it needs no kernel any more).
pub fn suspension_wake(
    executors: &Store<BriqExecutor>,
    execution: &Execution,
    gone: bool,
) -> Option<ObjectRef<BriqExecutor>> {
    let namespace = execution.namespace()?;
    let executor = ObjectRef::new(&execution.spec.executor_ref.name).within(&namespace);
    let cached = executors.get(&executor)?;
    let suspended = [ExecutorReason::Suspending, ExecutorReason::Suspended]
        .into_iter()
        .any(|reason| ready_reason_is(&cached, reason));
    let needs_kernel =
        !gone && !execution.finished() && execution.metadata.deletion_timestamp.is_none();
    let wake = if needs_kernel {
        suspended
    } else {
        cached.spec.suspend && !suspended
    };
    wake.then_some(executor)
}

/// What a change of `executor` wakes: the Executions that wait on it (or whose time to live is
/// its), and the pool it is a member of, or claims from while it holds no member yet (a claim is
/// demand: a pool sized by it grows, from zero too, without waiting for its next look).
pub fn woken_by(
    executions: &Store<Execution>,
    executor: &BriqExecutor,
) -> (
    Vec<ObjectRef<Execution>>,
    Option<ObjectRef<BriqExecutorPool>>,
) {
    let annotations = executor.annotations();
    let claiming = executor.spec.pool_ref.as_ref().filter(|_| {
        executor.claimed_member().is_none() && !annotations.contains_key(POOL_FALLBACK_ANNOTATION)
    });
    let pool = annotations
        .get(POOL_MEMBER_ANNOTATION)
        .or(claiming.map(|pool_ref| &pool_ref.name))
        .zip(executor.namespace())
        .map(|(pool, namespace)| ObjectRef::new(pool).within(&namespace));
    (super::index::waiting_on(executions, executor), pool)
}

#[cfg(test)]
mod tests;
