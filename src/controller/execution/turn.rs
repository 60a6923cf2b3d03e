//! An Execution's turn: whether its executor can still take one ([`unable`]), its place in its
//! executor's queue (the run order, whose turn it is as the cache shows it, a burst still
//! arriving; a LIST only while the cache lags), its place under its class in its namespace
//! (`perNamespace.maxQueuedExecutions` wait and `perNamespace.maxRunningExecutions` run at
//! once), and the wake-ups when one leaves. Joining the queue adopts the Execution into its
//! executor's history; at its turn it takes the executor's lock and a place, and sends its code
//! ([`Actor::run`]).
//!
//! A place to run is counted with what this process let start ([`Bookkeeping::take_place`])
//! and freed when an Execution ends or goes.
//!
//! [`Bookkeeping::take_place`]: super::bookkeeping::Bookkeeping::take_place

use std::{sync::Arc, time::Duration};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::OwnerReference, jiff::Timestamp};
use kube::{
    Api, ResourceExt,
    api::{ListParams, ObjectMeta, Patch, PatchParams},
    runtime::{controller::Action, reflector::ObjectRef},
};
use serde_json::json;

use super::{actor::Actor, context::Context, end::Verdict};
use crate::{
    briq::SandboxApi,
    controller::{
        context::Result,
        credentials::made_under,
        index::{live_neighbours, of_executor},
        recheck::{self, BURST_WINDOW, Wait},
    },
    crd::{
        BriqExecutor, Execution, POOL_MEMBER_ANNOTATION,
        conditions::{self, STALLED},
        history_owner,
        reasons::ExecutionReason,
    },
    traces,
};

/// Where an Execution stands in its executor's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    Mine,
    Behind,
    /// First so far, but of a burst that may still grow: ask again after this long.
    BurstArriving(Duration),
}

/// The owner references of an Execution whose owners are `owners` once `executor` (of `uid`) is
/// among them, so that deleting the executor deletes its history; `None` when it is already (its
/// creator set it, as the Python client and kubectl-briq do): no write.
pub fn owners_with(
    owners: &[OwnerReference],
    executor: &BriqExecutor,
    uid: &str,
) -> Option<Vec<OwnerReference>> {
    if owners.iter().any(|owner| owner.uid == uid) {
        return None;
    }
    let mut owners = owners.to_vec();
    owners.extend(history_owner(executor));
    Some(owners)
}

pub use crate::crd::RunOrder;

/// Why `executor` can take no more Executions, if it cannot.
pub fn unable(executor: &BriqExecutor, known_unusable: bool) -> Option<Verdict> {
    let name = executor.metadata.name.as_deref().unwrap_or_default();
    if executor.metadata.deletion_timestamp.is_some() {
        return Some(Verdict::new(
            ExecutionReason::ExecutorDeleted,
            format!("BriqExecutor {name} is being deleted"),
        ));
    }
    if let Some(pool) = executor
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POOL_MEMBER_ANNOTATION))
    {
        return Some(Verdict::new(
            ExecutionReason::ExecutorUnusable,
            format!(
                "BriqExecutor {name} is a member of BriqExecutorPool {pool} and runs no code of its \
                 own; create a BriqExecutor with spec.poolRef.name: {pool} and run code there"
            ),
        ));
    }
    let status = executor.status.clone().unwrap_or_default();
    if status.unusable || known_unusable {
        let why = status
            .unusable_reason
            .unwrap_or_else(|| "an earlier Execution made it unusable".into());
        return Some(Verdict::new(
            ExecutionReason::ExecutorUnusable,
            format!("BriqExecutor {name} is unusable ({why}); create a new BriqExecutor"),
        ));
    }
    conditions::find(&status.conditions, STALLED)
        .filter(|c| c.status == "True")
        .map(|stalled| {
            Verdict::new(
                ExecutionReason::ExecutorUnusable,
                format!(
                    "BriqExecutor {name} cannot run code ({}: {}); create a new BriqExecutor",
                    stalled.reason, stalled.message
                ),
            )
        })
}

/// The Executions waiting in a namespace under a class with `perNamespace.maxQueuedExecutions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceQueue {
    pub class: String,
    pub max: u32,
    /// Executions not started yet, of the namespace's executors of the class, that hold a place
    /// before this one: before it in run order, or placed already.
    pub waiting_before: usize,
}

/// Where an Execution stands in its executor's cached queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuePlace {
    /// Its turn as the cache shows it; `None` when the cache does not hold it.
    pub turn: Option<Turn>,
    /// How many unfinished Executions of the executor hold a place before it
    /// ([`Observed::ahead`](super::step::Observed::ahead)).
    pub ahead: usize,
}

/// Another Execution of the same executor, as the API server lists it.
#[derive(Debug, Clone)]
pub struct Sibling {
    pub uid: Option<String>,
    pub order: RunOrder,
    /// Deleted, or known (to the cache or this process) to have finished.
    pub done: bool,
}

/// Whether it is the turn of the Execution `uid` at `mine` among `siblings`, at `now`. A sibling
/// not known to be finished counts as waiting.
pub fn turn(uid: Option<&str>, mine: &RunOrder, siblings: &[Sibling], now: Timestamp) -> Turn {
    let mut burst = false;
    for sibling in siblings {
        if sibling.uid.as_deref() == uid || sibling.done {
            continue;
        }
        if sibling.order < *mine {
            return Turn::Behind;
        }
        burst |= sibling.order.0 == mine.0;
    }
    // Created in the same second as others still waiting: one that sorts before it by name
    // may still be on its way. Let the burst's second pass first.
    let window_ends = mine
        .0
        .and_then(|created| created.checked_add(BURST_WINDOW).ok());
    match window_ends.map(|at| now.duration_until(at)) {
        Some(left) if burst && left.is_positive() => Turn::BurstArriving(left.unsigned_abs()),
        _ => Turn::Mine,
    }
}

impl<S> Context<S> {
    /// Unfinished Executions of the same executor, in run order.
    fn queue(&self, namespace: &str, executor: &str) -> Vec<Arc<Execution>> {
        let mut queue: Vec<Arc<Execution>> = of_executor(&self.store, namespace, executor)
            .filter(|e| e.metadata.deletion_timestamp.is_none() && !self.is_finished(e))
            .collect();
        queue.sort_by_key(|e| e.run_order());
        queue
    }

    /// Where `execution` stands in the cached queue of its executor (one read of it): its
    /// turn, and how many hold a place before it. The watch delivers Executions in the order the
    /// API server stored them, so a cached Execution comes with every one stored before it; but
    /// the run order breaks ties within one creationTimestamp second by name, so an Execution
    /// stored a moment later may still come first: [`decide`](super::step::decide) lets the
    /// cache decide only while it is current.
    pub(super) fn queue_place(&self, execution: &Execution) -> QueuePlace {
        let namespace = execution.namespace().unwrap_or_default();
        let order = execution.run_order();
        let queue = self.queue(&namespace, &execution.spec.executor_ref.name);
        let ahead = queue
            .iter()
            .filter(|e| e.uid() != execution.uid() && (e.run_order() < order || e.holds_a_place()))
            .count();
        let in_queue = queue.iter().any(|e| e.uid() == execution.uid());
        let siblings: Vec<Sibling> = queue.iter().map(|e| sibling(&e.metadata, false)).collect();
        let turn = in_queue.then(|| {
            turn(
                execution.uid().as_deref(),
                &order,
                &siblings,
                Timestamp::now(),
            )
        });
        QueuePlace { turn, ahead }
    }

    /// Whether it is `execution`'s turn, asked of the API server (metadata only, selected by
    /// executor): when the watch cache is known to lag (listing, or its watch failed), it may
    /// not hold an Execution created a while ago.
    async fn turn(&self, api: &Api<Execution>, execution: &Execution) -> Result<Turn> {
        let selector = format!("spec.executorRef.name={}", execution.spec.executor_ref.name);
        let listed = api
            .list_metadata(&ListParams::default().fields(&selector))
            .await?;
        let namespace = execution.namespace().unwrap_or_default();
        let cached: std::collections::HashMap<String, Arc<Execution>> =
            of_executor(&self.store, &namespace, &execution.spec.executor_ref.name)
                .filter_map(|e| e.uid().map(|uid| (uid, e)))
                .collect();
        let siblings: Vec<Sibling> = listed
            .items
            .iter()
            .map(|sibling| {
                let finished = sibling
                    .uid()
                    .and_then(|uid| cached.get(&uid))
                    .is_some_and(|e| self.is_finished(e));
                self::sibling(&sibling.metadata, finished)
            })
            .collect();
        Ok(turn(
            execution.uid().as_deref(),
            &execution.run_order(),
            &siblings,
            Timestamp::now(),
        ))
    }

    /// Reconciles the head of the queue `execution` was in, now that it has left it (finished
    /// or deleted), rather than at the head's next re-check.
    pub(super) fn wake_next(&self, execution: &Execution) {
        let namespace = execution.namespace().unwrap_or_default();
        if let Some(next) = self
            .queue(&namespace, &execution.spec.executor_ref.name)
            .first()
        {
            let _ = self.wake.send(ObjectRef::from_obj(next.as_ref()));
        }
    }
}

/// A sibling in the queue, from its metadata: done once deleted or `finished`.
fn sibling(metadata: &ObjectMeta, finished: bool) -> Sibling {
    Sibling {
        uid: metadata.uid.clone(),
        order: crate::crd::run_order(metadata),
        done: metadata.deletion_timestamp.is_some() || finished,
    }
}

impl<'a, S: SandboxApi> Actor<'a, S> {
    /// Its turn, as [`decide`](super::step::decide) read it from the cache (`confirm`: asked
    /// of the API server first, the cache lagging): takes the executor's lock, then a place
    /// under its class, and sends the code.
    ///
    /// The executor is the cached one, admitted by `decide`: a cache lagging behind its
    /// deletion at most lets this Execution run while the finalizer drains (it waits for it),
    /// its sandbox is confirmed with briq before any code goes to it, and an executor this
    /// process made unusable is known here before the cache says so.
    pub(super) async fn take_turn(
        &self,
        executor: &BriqExecutor,
        version: &str,
        confirm: bool,
    ) -> Result<Action> {
        if confirm {
            let (turn, read) = traces::noted(self.ctx.turn(&self.api, self.execution)).await;
            self.note(|t| t.turn_read = read);
            match turn? {
                Turn::Mine => {}
                Turn::Behind => return self.queued(recheck::recheck(Wait::Turn)).await,
                Turn::BurstArriving(left) => return self.queued(left).await,
            }
        }
        let lock = self.ctx.kept.lock(&executor.uid().unwrap_or_default());
        let _turn = self.slot.without(lock.lock()).await;
        if self.ctx.shared.stopping() {
            // Shutting down: nothing new starts; the next operator (or leader) runs it.
            return Ok(Action::await_change());
        }
        // Another Execution may have made the executor unusable while this one waited.
        if let Some(verdict) = unable(executor, self.ctx.is_unusable(executor)) {
            return self.conclude(None, self.status(), &verdict).await;
        }
        if let Err(message) = self.ctx.place(self.execution, executor) {
            self.wait(ExecutionReason::WaitingForCapacity, message)
                .await?;
            return Ok(Action::requeue(recheck::recheck(Wait::Capacity)));
        }
        Box::pin(self.run(executor, version)).await
    }

    pub(super) async fn queued(&self, recheck: Duration) -> Result<Action> {
        let message = format!(
            "waiting for earlier Executions of BriqExecutor {}",
            self.executor_name()
        );
        self.wait(ExecutionReason::Queued, message).await?;
        Ok(Action::requeue(recheck))
    }

    /// Makes the executor the Execution's owner, so that deleting an executor deletes its
    /// history.
    /// Returns the Execution's resourceVersion after it (the patched one, or the one seen).
    pub(super) async fn adopt(&self, executor: Option<&BriqExecutor>) -> Result<String> {
        let seen = self.execution.resource_version().unwrap_or_default();
        let Some(uid) = executor.and_then(|e| e.uid()) else {
            return Ok(seen);
        };
        let executor = executor.expect("an executor with a uid");
        let Some(owners) = owners_with(self.execution.owner_references(), executor, &uid) else {
            // Its creator set it (the Python client and kubectl-briq do): no write.
            return Ok(seen);
        };
        // Conditional too: an owner reference added on top of someone else's change would make
        // the decision look fresher than it is.
        let patch = json!({ "metadata": { "ownerReferences": owners, "resourceVersion": seen } });
        let adopted = self
            .api
            .patch(
                &self.execution.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        Ok(adopted.resource_version().unwrap_or_default())
    }
}

impl<S> Context<S> {
    /// `execution` ended or went: the Executions of its namespace waiting for a place under
    /// their class's `maxRunningExecutions` look again.
    pub(super) fn wake_waiting_for_capacity(&self, execution: &Execution) {
        let namespace = execution.namespace().unwrap_or_default();
        let uid = execution.uid().unwrap_or_default();
        for waiting in self.kept.place_freed(&namespace, &uid) {
            let _ = self.wake.send(waiting);
        }
    }

    /// `execution`'s namespace queue under `executor`'s class, when the class limits it and
    /// `execution` has not started: how many of the namespace's Executions on executors of the
    /// class wait (not started, not finished) before it: before it in run order, or placed
    /// already.
    pub(super) fn namespace_queue(
        &self,
        execution: &Execution,
        executor: &BriqExecutor,
    ) -> Option<NamespaceQueue> {
        if execution
            .status
            .as_ref()
            .is_some_and(|s| s.attempt_id.is_some())
        {
            return None;
        }
        let shared = self.shared.as_ref();
        let class = made_under(shared, executor)?;
        let max = class
            .spec
            .per_namespace
            .as_ref()
            .and_then(|limits| limits.max_queued_executions)?;
        let namespace = execution.namespace().unwrap_or_default();
        let class_name = class.name_any();
        let order = execution.run_order();
        let waiting_before = live_neighbours(&self.store, execution)
            .filter(|e| {
                e.status.as_ref().is_none_or(|s| s.attempt_id.is_none())
                    && !self.is_finished(e)
                    && (e.run_order() < order || e.holds_a_place())
                    && self
                        .cached_executor(&namespace, &e.spec.executor_ref.name)
                        .and_then(|executor| made_under(shared, &executor))
                        .is_some_and(|c| c.name_any() == class_name)
            })
            .count();
        Some(NamespaceQueue {
            class: class_name,
            max,
            waiting_before,
        })
    }

    /// Whether `execution`, on `executor`, may start now under its class's
    /// `maxRunningExecutions` in its namespace: `Err(message)` when the namespace has no place.
    pub(super) fn place(
        &self,
        execution: &Execution,
        executor: &BriqExecutor,
    ) -> Result<(), String> {
        let shared = self.shared.as_ref();
        let Some(class) = made_under(shared, executor) else {
            return Ok(());
        };
        let Some(max) = class
            .spec
            .per_namespace
            .as_ref()
            .and_then(|limits| limits.max_running_executions)
        else {
            return Ok(());
        };
        let namespace = execution.namespace().unwrap_or_default();
        let class_name = class.name_any();
        let of_class = |e: &Execution| {
            self.cached_executor(&namespace, &e.spec.executor_ref.name)
                .and_then(|executor| made_under(shared, &executor))
                .is_some_and(|c| c.name_any() == class_name)
        };
        let executions: Vec<Arc<Execution>> = self
            .store
            .state()
            .into_iter()
            .filter(|e| e.namespace().as_deref() == Some(namespace.as_str()))
            .collect();
        let running: std::collections::HashSet<String> = executions
            .iter()
            .filter(|e| {
                e.status.as_ref().is_some_and(|s| s.attempt_id.is_some())
                    && !self.is_finished(e)
                    && of_class(e)
            })
            .filter_map(|e| e.uid())
            .collect();
        let cache_shows = |uid: &str| {
            executions
                .iter()
                .find(|e| e.uid().as_deref() == Some(uid))
                .is_none_or(|e| self.is_finished(e))
        };
        let uid = execution.uid().unwrap_or_default();
        if self
            .kept
            .take_place(&namespace, &uid, max as usize, &running, cache_shows)
        {
            return Ok(());
        }
        self.kept
            .wait_for_place(&uid, ObjectRef::from_obj(execution));
        Err(format!(
            "namespace {namespace} runs {} Executions of class {class_name} at once, its \
             perNamespace.maxRunningExecutions; this one runs when one of them ends",
            running.len().max(max as usize)
        ))
    }
}

#[cfg(test)]
mod tests;
