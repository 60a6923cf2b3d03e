//! An Execution's place in its executor's queue: the run order, whose turn it is (from the cache
//! where it can decide, else from a LIST), a burst still arriving, and the wake-up of the next
//! one when one leaves. Joining the queue adopts the Execution into its executor's history;
//! the head confirms its turn and runs ([`Actor::run`]).

use std::{sync::Arc, time::Duration};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::OwnerReference, jiff::Timestamp};
use kube::{
    Api, ResourceExt,
    api::{ListParams, ObjectMeta, Patch, PatchParams},
    runtime::{controller::Action, reflector::ObjectRef},
};
use serde_json::json;

use super::{actor::Actor, admit::unable, context::Context};
use crate::{
    briq::SandboxApi,
    controller::{
        context::Result,
        index::of_executor,
        recheck::{self, BURST_WINDOW, Wait},
    },
    crd::{BriqExecutor, Execution, history_owner, reasons::ExecutionReason},
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

/// The turn of the Execution at the head of the cached queue, from the cache where it can
/// decide; `None` where only the API server can (a LIST of its executor's Executions).
///
/// The cache never invents a sibling, so when it says to wait (one before it, or a burst still
/// arriving) the API server would say so too. When it says it is this one's turn, a sibling it
/// lacks was stored after this one (the watch delivers in the order the API server stored
/// them) within the same creationTimestamp second, sorting before it by name: when the cache is
/// current, that is a sibling stored within the watch's own delay (milliseconds), a window a
/// LIST would narrow but not close (one created a moment after the LIST is missed as well), and
/// a sibling created after this one started runs after it in any case. So the cache decides,
/// except when it is known to lag by more: listing, relisting, or its watch failed.
pub fn turn_from_cache(cached: Turn, cache_current: bool) -> Option<Turn> {
    match cached {
        Turn::Behind | Turn::BurstArriving(_) => Some(cached),
        Turn::Mine if cache_current => Some(Turn::Mine),
        Turn::Mine => None,
    }
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

    /// How many unfinished Executions come before `execution` in the cached queue; `None` when
    /// it is not in it. The watch delivers Executions in the order the API server stored them,
    /// so a cached Execution comes with every one stored before it; but the run order breaks
    /// ties within one creationTimestamp second by name, so an Execution stored a moment later
    /// may still come first: the head confirms its turn ([`Actor::take_turn`]).
    ///
    /// Also how many of them hold a place before it ([`super::observed::Observed::ahead`]):
    /// those before it in run order and those already placed. Both from one read of the cached
    /// queue.
    pub(super) fn queue_place(&self, execution: &Execution) -> (Option<usize>, usize) {
        let namespace = execution.namespace().unwrap_or_default();
        let order = execution.run_order();
        let queue = self.queue(&namespace, &execution.spec.executor_ref.name);
        let position = queue.iter().position(|e| e.uid() == execution.uid());
        let places = queue
            .iter()
            .filter(|e| e.uid() != execution.uid() && (e.run_order() < order || e.holds_a_place()))
            .count();
        (position, places)
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

    /// [`Context::turn`] as far as the cache knows, without asking the API server. The cache
    /// can miss siblings created a moment ago but never invents one, so when it says to wait
    /// (a burst still arriving), the API server would say so too.
    fn cached_turn(&self, execution: &Execution) -> Turn {
        let namespace = execution.namespace().unwrap_or_default();
        let siblings: Vec<Sibling> =
            of_executor(&self.store, &namespace, &execution.spec.executor_ref.name)
                .map(|e| sibling(&e.metadata, self.is_finished(&e)))
                .collect();
        turn(
            execution.uid().as_deref(),
            &execution.run_order(),
            &siblings,
            Timestamp::now(),
        )
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
    /// At the head of the cached queue: confirm the turn (from the cache where it can decide,
    /// else asked of the API server: [`turn_from_cache`]), then run under the
    /// executor's lock.
    ///
    /// The executor is the cached one, admitted by [`super::step::decide`]: a cache lagging behind
    /// its deletion at most lets this Execution run while the finalizer drains (it waits for
    /// it), its sandbox is confirmed with briq before any code goes to it, and an executor this
    /// process made unusable is known here before the cache says so.
    pub(super) async fn take_turn(&self, executor: &BriqExecutor, version: &str) -> Result<Action> {
        let cached = self.ctx.cached_turn(self.execution);
        let turn = match turn_from_cache(cached, self.ctx.freshness.current()) {
            Some(turn) => turn,
            None => {
                let (turn, read) = traces::noted(self.ctx.turn(&self.api, self.execution)).await;
                self.note(|t| t.turn_read = read);
                turn?
            }
        };
        match turn {
            Turn::Mine => {}
            Turn::Behind => return self.queued(recheck::recheck(Wait::Turn)).await,
            Turn::BurstArriving(left) => return self.queued(left).await,
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

#[cfg(test)]
mod tests;
