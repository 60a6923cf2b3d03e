//! The `Execution` reconciler: runs each Execution at most once, one at a time per executor, in
//! creation order. One file per step of an Execution's life, each with its pure decisions at the
//! top (table-tested beside it) and its effects below. Where each reason of the `Succeeded`
//! condition ([`ExecutionReason`](crate::crd::reasons::ExecutionReason)) is decided:
//!
//! | reason | step | function (file) |
//! |---|---|---|
//! | `ExecutorNotFound`, `ExecutorNeverAppeared` | admit: no executor (yet) | `admit` (admit.rs) |
//! | `ExecutorDeleted` | admit: the executor gone or being deleted | `admit`, `unable` (admit.rs) |
//! | `ExecutorUnusable` | admit: unusable, a pool member, stalled; again at the turn | `unable` (admit.rs), `Actor::take_turn` (queue.rs) |
//! | `ExecutorNotReady` | admit: not Ready; its key Secret missing | `admit` (admit.rs), `Actor::sandbox` (sandbox.rs) |
//! | `QueueFull` | admit: the executor's or the namespace's queue full | `queue_full`, `namespace_queue_full` (admit.rs) |
//! | `Queued` | queue: behind others, a burst still arriving | `turn`, `turn_from_cache`, `Actor::queued` (queue.rs) |
//! | `WaitingForCapacity` | capacity: no place under the class in the namespace | `Context::place` (capacity.rs) |
//! | `SandboxNotOwned` | sandbox: briq says it is another's | `ownership_verdict` (sandbox.rs) |
//! | `Running` | run: the attempt recorded, the code sent | `running_status`, `Actor::run` (run.rs) |
//! | `WaitingForBriq` | recover: briq did not say whether the code ran | `waiting_for_briq_message`, `Actor::await_briq` (recover.rs) |
//! | `Interrupted` | recover: nobody can tell how a running attempt ended | `recovered`, `Actor::interrupt` (recover.rs) |
//! | `Completed`, `FinalAnswer`, `CodeError`, `FinalAnswerRejected`, `Timeout`, `MalformedResponse` | conclude: the bridge's answer judged | `judge` (conclude.rs) |
//! | `KernelLost` | conclude: the kernel or the sandbox gone | `judge` (conclude.rs), `ownership_verdict` (sandbox.rs) |
//! | `TransportError` | conclude: briq refused for good; recover: the outcome stayed unknown | `judge` (conclude.rs), `outcome_stayed_unknown` (recover.rs) |
//! | `Cancelled` | cancel: never sent, claimed by the journal, or interrupted in its kernel | `never_ran`, `Actor::cancel`, `Actor::cancellable` (cancel.rs), `judge` (conclude.rs) |
//!
//! Waiting reasons are written by `Actor::wait` (wait.rs), final ones by `Actor::end`
//! (conclude.rs), which applies an [`Ending`](conclude::Ending) decided by `ending`. Each
//! reconcile observes (the caches first; the head of a queue reads afresh only while the cache
//! cannot decide its turn, `turn_from_cache` in queue.rs; `Actor::observed`, step.rs), asks
//! `decide` (step.rs) what comes next, and performs it. A finished Execution is deleted once its
//! time to live is over (expire.rs).
//!
//! kube-runtime never reconciles one object twice at once, but reconciles different
//! Executions concurrently; the per-executor lock and the turn check serialize them.
//! Every send carries an attempt id derived from the Execution, which the sandbox's journal runs
//! once; `Running` is written before the exec or, with the code at hand, beside it. An Execution
//! found running without a result (the operator stopped mid-run) is asked of the journal
//! (recover.rs), never sent again.

mod actor;
mod admit;
mod bookkeeping;
mod budget;
mod cancel;
mod capacity;
mod conclude;
mod context;
mod expire;
#[cfg(test)]
mod fixtures;
mod observed;
mod queue;
mod recover;
mod run;
mod sandbox;
mod step;
mod trace;
mod wait;

use std::sync::Arc;

use kube::{ResourceExt, runtime::controller::Action};
use tracing::instrument;

pub use self::context::Context;
use self::{actor::Actor, expire::expire};
use super::{
    context::{Error, Result},
    fair::{Held, Priority},
    requeue::{reconciled, retry},
};
use crate::{briq::SandboxApi, crd::Execution};

#[instrument(skip_all, fields(namespace = execution.namespace(), name = execution.name_any()))]
pub async fn reconcile<S: SandboxApi>(
    execution: Arc<Execution>,
    ctx: Arc<Context<S>>,
) -> Result<Action> {
    let namespace = execution.namespace().unwrap_or_default();
    let slot = Held::take(&ctx.work, &namespace, Priority::Foreground).await;
    // The watch cache can still show "Running" for an Execution this process just finished.
    // Most reconciles are of finished Executions (all of them at start-up, at once): they stop
    // here, before the full reconcile's future (some 7 KiB) is allocated.
    if ctx.is_finished(&execution) {
        return expire(&execution, &ctx).await;
    }
    let result = Box::pin(Actor::new(&execution, &ctx, slot).reconcile()).await;
    reconciled(&ctx.backoff, execution.as_ref(), result)
}

pub fn error_policy<S>(execution: Arc<Execution>, error: &Error, ctx: Arc<Context<S>>) -> Action {
    retry(&ctx.backoff, execution.as_ref(), error)
}
