//! The `Execution` reconciler: runs each Execution at most once, one at a time per executor, in
//! creation order. One Execution's path reads in four files, in the order it runs: `step.rs`
//! (observe the caches, `decide` the next [`Step`](step::Step), refuse), `turn.rs` (its queue,
//! its turn, a place under its class), `send.rs` (its sandbox, the attempt, the code sent once),
//! `end.rs` (what it reports: waiting, then its [`Ending`](end::Ending)). Off that path:
//! `recover.rs` (an attempt whose outcome briq did not say), `cancel.rs`, `expire.rs` (time to
//! live). Each file has its pure decisions at the top, table-tested beside it, and its effects
//! below. Where each reason of the `Succeeded` condition
//! ([`ExecutionReason`](crate::crd::reasons::ExecutionReason)) is decided:
//!
//! | reason | where | function (file) |
//! |---|---|---|
//! | `ExecutorNotFound`, `ExecutorNeverAppeared` | no executor (yet) | `admit` (step.rs) |
//! | `ExecutorDeleted` | the executor gone or being deleted | `admit` (step.rs), `unable` (turn.rs) |
//! | `ExecutorUnusable` | unusable, a pool member, stalled; again at the turn | `unable`, `Actor::take_turn` (turn.rs) |
//! | `ExecutorNotReady` | not Ready; its key Secret missing | `admit` (step.rs), `Actor::sandbox` (send.rs) |
//! | `QueueFull` | the executor's or the namespace's queue full | `queue_full`, `namespace_queue_full` (step.rs) |
//! | `Queued` | behind others, a burst still arriving | `decide` (step.rs) on `turn` (turn.rs), `Actor::queued` (turn.rs) |
//! | `WaitingForCapacity` | no place under the class in the namespace | `Context::place` (turn.rs) |
//! | `SandboxNotOwned` | briq says the sandbox is another's | `ownership_verdict` (send.rs) |
//! | `Running` | the attempt recorded, the code sent | `running_status`, `Actor::run` (send.rs) |
//! | `WaitingForBriq` | briq did not say whether the code ran | `waiting_for_briq_message`, `Actor::await_briq` (recover.rs) |
//! | `Interrupted` | nobody can tell how a running attempt ended | `recovered`, `Actor::interrupt` (recover.rs) |
//! | `Completed`, `FinalAnswer`, `CodeError`, `FinalAnswerRejected`, `Timeout`, `MalformedResponse` | the bridge's answer judged | `judge` (end.rs) |
//! | `KernelLost` | the kernel or the sandbox gone | `judge` (end.rs), `ownership_verdict` (send.rs) |
//! | `TransportError` | briq refused for good; the outcome stayed unknown | `judge` (end.rs), `outcome_stayed_unknown` (recover.rs) |
//! | `Cancelled` | never sent, claimed by the journal, or interrupted in its kernel | `never_ran`, `Actor::cancel`, `Actor::cancellable` (cancel.rs), `judge` (end.rs) |
//!
//! Waiting reasons are written by `Actor::wait`, final ones by `Actor::end`, which applies an
//! [`Ending`](end::Ending) decided by `ending` (both end.rs). Each reconcile reads the caches
//! only (the executor from the API server only when the cache has none, the turn only while
//! the cache lags), asks `decide` what comes next, and performs it. A finished Execution is
//! deleted once its time to live is over (expire.rs).
//!
//! kube-runtime never reconciles one object twice at once, but reconciles different
//! Executions concurrently; the per-executor lock and the turn check serialize them.
//! Every send carries an attempt id derived from the Execution, which the sandbox's journal runs
//! once; `Running` is written before the exec or, with the code at hand, beside it. An Execution
//! found running without a result (the operator stopped mid-run) is asked of the journal
//! (recover.rs), never sent again.

mod actor;
mod bookkeeping;
mod budget;
mod cancel;
mod context;
mod end;
mod expire;
#[cfg(test)]
mod fixtures;
mod recover;
mod send;
mod step;
mod trace;
mod turn;

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
