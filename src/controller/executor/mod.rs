//! The `BriqExecutor` reconciler: creates the sandbox exactly once (or claims a pool member's),
//! provisions the bridge and kernel, watches that the sandbox keeps running, suspends and
//! resumes it, saves snapshots for its forks or starts as a fork, gives it back after the idle
//! timeout, and destroys it when the executor goes.
//!
//! Each reconcile observes the executor (from the cache, and afresh before any step that cannot
//! be taken back), asks `step::decide` (step.rs) for the next step, and performs it
//! (`Actor::apply`, apply.rs). Each step has a file of its own: its pure decisions first, tested
//! with exact expected outputs, then the `Actor` methods that perform it. What they share is in
//! actor.rs (the `Context` kept between reconciles, the `Actor` of one reconcile) and status.rs
//! (the status, annotation and Event writes).
//!
//! Where each reason of its `Ready` and `Stalled` conditions is written:
//!
//! | reason (`Ready`, `Stalled`) | step | written by (file) |
//! |---|---|---|
//! | `ApiKeyMissing` | admit: its API key | `Actor::credentials` (admit.rs) |
//! | `ClassNotFound` | admit: its class | `Actor::credentials`, `Actor::admit` (admit.rs) |
//! | `ClassRefused` | admit: its class's limits | `Actor::admit` (admit.rs) |
//! | `WaitingForCapacity` | admit: its class's `maxExecutors` | `Actor::admit`, `Actor::at_capacity` (admit.rs) |
//! | `Provisioning` | create, provision | `Actor::create_sandbox` (create.rs), `Actor::provision` (provision.rs), `Actor::report_provisioning`, `Actor::forget_sandbox` (status.rs) |
//! | `BriqRefused`, `BriqInterfaceMismatch` | create | `Actor::create_sandbox` (create.rs) |
//! | `KernelReady` | provision, probe, claim | `Actor::provision` (provision.rs), `Actor::probe`, `Actor::disown` (probe.rs), `Actor::record_claim` (claim/record.rs) |
//! | `SetupFailed` | provision, then conclude | `Actor::provision` (provision.rs); the sandbox given back by `Actor::give_back` (cleanup.rs) |
//! | `SandboxNotOwned` | verify (provision, probe) | `Actor::disown` (probe.rs) |
//! | `Unusable` | probe, then report unusable | `Actor::probe`, `Actor::disown` (probe.rs); `Step::ReportUnusable` in `Actor::apply` (apply.rs) |
//! | `BriqUnreachable` (on `BriqReachable`) | probe | `briq_unreachable` in `Actor::probe` (probe.rs) |
//! | `EnvUnavailable` | claim: its `poolRef.env` | `Actor::claim_env` (claim/env.rs) |
//! | `WaitingForPool` | claim | `Actor::claim` (claim/take.rs) |
//! | `PoolMismatch` | claim, then conclude | `Actor::claim` (claim/take.rs) |
//! | `Claimed` | handed over (a pool member) | `Step::HandedOver` in `Actor::apply` (apply.rs) |
//! | `IdleTimeout` | idle, then conclude | `Actor::expire` (idle.rs); the sandbox given back by `Actor::give_back` (cleanup.rs) |
//! | `Suspending`, `Suspended` (also on the `Suspended` condition, with `SuspendFailed`) | suspend | `Actor::suspend`, `Actor::save_failed` (suspend.rs) |
//! | `Resuming` (and `Resumed` on `Suspended`) | resume | `Actor::resume` (suspend.rs) |
//! | `Forking` | a source's snapshot for its forks | `Actor::snapshot` (fork.rs) |
//! | `WaitingForSnapshot`, `ForkSourceNotFound` | a fork waiting for its source | `Actor::await_snapshot` (fork.rs) |
//! | `ForkRefused` | a fork that can never be made | `Step::RefuseFork` in `Actor::apply` (apply.rs) |
//! | `ForkFailed` | a fork's sandbox or load, then conclude | `Actor::create_sandbox` (create.rs), `Actor::fork_failed` (provision.rs) |
//! | `Terminating` | drain, clean up | `Actor::drain` (drain.rs), `Actor::cleanup` (cleanup.rs) |
//! | `DestroyFailed` | clean up | `Actor::cleanup` (cleanup.rs) |

mod actor;
mod admit;
mod apply;
mod asked;
mod claim;
mod class_status;
mod cleanup;
mod create;
mod drain;
#[cfg(test)]
mod fixtures;
mod fork;
mod idle;
mod pending_create;
mod probe;
mod provision;
mod status;
mod step;
mod suspend;
mod trace;

use std::sync::Arc;

use kube::{
    Api, ResourceExt,
    runtime::{
        controller::Action,
        finalizer::{Event as FinalizerEvent, finalizer},
    },
};
use tracing::instrument;

pub use self::actor::Context;
use self::{
    actor::Actor,
    claim::marks::{First, first},
    status::status_of,
};
use super::{
    context::{Error, Result},
    fair::{Held, Priority},
    requeue::{reconciled, retry},
};
use crate::{
    briq::SandboxApi,
    crd::{BriqExecutor, FINALIZER, POOL_MEMBER_ANNOTATION},
};

#[instrument(skip_all, fields(namespace = executor.namespace(), name = executor.name_any()))]
pub async fn reconcile<S: SandboxApi>(
    executor: Arc<BriqExecutor>,
    ctx: Arc<Context<S>>,
) -> Result<Action> {
    let object = executor.as_ref().clone();
    let api: Api<BriqExecutor> = Api::namespaced(
        ctx.shared.client.clone(),
        &executor.namespace().unwrap_or_default(),
    );
    let namespace = executor.namespace().unwrap_or_default();
    let step = step::decide(
        &status_of(&executor),
        executor.annotations(),
        &ctx.asked(&executor),
    );
    let uid = executor.uid().unwrap_or_default();
    let since = ctx.handovers.reported_since(&uid);
    let (first, handover_over) = first(&executor, &step, since, ctx.shared.settings.probe_interval);
    if handover_over {
        ctx.handovers.settled(&uid);
    }
    if let First::Recheck(recheck) = first {
        return Ok(Action::requeue(recheck));
    }
    let actor = Actor {
        shared: &ctx.shared,
        api: &api,
        executions: &ctx.executions,
        executors: &ctx.store,
        pools: &ctx.pools,
        handovers: &ctx.handovers,
        slot: Held::take(&ctx.work, &namespace, priority(&executor)).await,
    };
    match first {
        First::Claim => {
            let claimed = actor.claim_step(&executor).await;
            return reconciled(&ctx.backoff, &object, claimed);
        }
        First::Settle(member) => {
            let settled = actor.settle_recorded(&executor, member).await;
            return reconciled(&ctx.backoff, &object, settled);
        }
        First::Recheck(_) | First::Step => {}
    }
    // The finalizer helper removes the finalizer once a cleanup returns, so the wait for the
    // executor's Executions comes before it.
    if executor.metadata.deletion_timestamp.is_some()
        && executor.holds_finalizer()
        && let Some(wait) = actor.drain(&executor).await.transpose()
    {
        return reconciled(&ctx.backoff, &object, wait);
    }
    let result = finalizer(&api, FINALIZER, executor, |event| async {
        match event {
            // Boxed: inline, the step would sit in every reconcile's future, and a debug
            // build's poll frames copy it.
            FinalizerEvent::Apply(executor) => Box::pin(actor.apply(&executor, step)).await,
            FinalizerEvent::Cleanup(executor) => Box::pin(actor.cleanup(&executor)).await,
        }
    })
    .await;
    let result = match result {
        // A reconcile of a stale copy found the executor already gone: its finalizer was removed
        // by the reconcile before (which the cleanup's own status write had queued again).
        Err(kube::runtime::finalizer::Error::RemoveFinalizer(kube::Error::Api(status)))
            if status.code == 404 =>
        {
            Ok(Action::await_change())
        }
        other => other.map_err(|error| Error::Finalizer(Box::new(error))),
    };
    reconciled(&ctx.backoff, &object, result)
}

/// A pool's member, claimed or not, is background work: nobody waits for it until it is
/// claimed, and once claimed its claimer does the work someone waits for. A burst of claims and
/// the refill it sets off share the API server; the claims go first.
fn priority(executor: &BriqExecutor) -> Priority {
    if executor.annotations().contains_key(POOL_MEMBER_ANNOTATION) {
        Priority::Background
    } else {
        Priority::Foreground
    }
}

pub fn error_policy<S>(executor: Arc<BriqExecutor>, error: &Error, ctx: Arc<Context<S>>) -> Action {
    retry(&ctx.backoff, executor.as_ref(), error)
}
