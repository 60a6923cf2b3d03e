//! The idle timeout: a ready executor with no Execution for its `idleTimeoutSeconds` expires
//! ([`idleness`]), and its sandbox is given back.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{
    ResourceExt,
    runtime::{controller::Action, events::EventType},
};
use tracing::info;

use super::{
    actor::Actor,
    status::{sandbox_fields, state, status_of},
    step::{Step, decide},
};
use crate::{
    briq::SandboxApi,
    controller::{
        class,
        context::{Result, Shared},
        credentials::made_under,
        index::{self, Activity},
        recheck::CONFLICT_RECHECK,
    },
    crd::{BriqExecutor, BriqExecutorStatus, reasons::ExecutorReason},
};

/// Where a ready executor stands against its `idleTimeoutSeconds`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Idleness {
    /// No idle timeout, or an Execution waits or runs: nothing to watch for.
    InUse,
    /// Idle, not for long enough yet: look again after this long.
    IdleFor { remaining: std::time::Duration },
    /// Idle for the whole timeout: give the sandbox back, with this message.
    Expired { message: String },
}

/// Idle since the latest of: the kernel's first answer, the last Execution the operator counted
/// (`lastExecutionTime`) and the latest creation or completion among the cached Executions. The
/// later the better: a source that lags (counts are written in batches) or was pruned (finished
/// Executions are deleted) can only make the executor look busier, never idler.
fn idleness(
    timeout_seconds: Option<u32>,
    status: &BriqExecutorStatus,
    executions: Activity,
    now: Timestamp,
) -> Idleness {
    let Some(timeout) = timeout_seconds else {
        return Idleness::InUse;
    };
    if executions.unfinished > 0 {
        return Idleness::InUse;
    }
    let since = [
        status.ready_time.as_ref().map(|t| t.0),
        status.last_execution_time.as_ref().map(|t| t.0),
        executions.last,
    ]
    .into_iter()
    .flatten()
    .max();
    // Ready without a recorded time (a status written by an older operator): start now.
    let idle = since.map_or(SignedDuration::ZERO, |since| now.duration_since(since));
    let timeout = SignedDuration::from_secs(timeout.into());
    if idle >= timeout {
        let message = format!(
            "no Execution for {}s (idleTimeoutSeconds): expired, its sandbox destroyed; create a new \
             BriqExecutor",
            timeout.as_secs()
        );
        return Idleness::Expired { message };
    }
    let remaining = (timeout - idle.max(SignedDuration::ZERO)).unsigned_abs();
    Idleness::IdleFor { remaining }
}

/// Where `executor` stands against its idle timeout, from its status and the cached Executions
/// (`activity`), and what it becomes at the timeout: suspended rather than expired
/// ([`class::suspends_when_idle`]).
pub(super) fn idle_policy<S>(
    shared: &Shared<S>,
    executor: &BriqExecutor,
    activity: Activity,
) -> (Idleness, bool) {
    let class = made_under(shared, executor);
    let class = class.as_ref().map(|c| &c.spec);
    let idleness = idleness(
        class::idle_timeout_seconds(&executor.spec, class),
        &status_of(executor),
        activity,
        Timestamp::now(),
    );
    (idleness, class::suspends_when_idle(&executor.spec, class))
}

impl<S: SandboxApi> Actor<'_, S> {
    /// Where the executor stands against its idle timeout, from its status and the cached
    /// Executions.
    pub(super) fn idleness(&self, executor: &BriqExecutor) -> Idleness {
        let namespace = executor.namespace().unwrap_or_default();
        let activity = index::activity(self.executions, &namespace, &executor.name_any());
        idle_policy(self.shared, executor, activity).0
    }

    /// Idle for its timeout: decided again on a fresh read (it cannot be taken back), and said
    /// in the status first, so that no Execution takes a turn after and a failed destroy is
    /// retried; the `Conclude` step that this write leads to gives the sandbox back.
    pub(super) async fn expire(&self, cached: &BriqExecutor) -> Result<Action> {
        let fresh = self.api.get(&cached.name_any()).await?;
        let still_ready = matches!(
            decide(&status_of(&fresh), fresh.annotations(), &self.asked(&fresh)),
            Step::Probe { .. }
        );
        let Idleness::Expired { message } = self.idleness(&fresh) else {
            return Ok(Action::requeue(CONFLICT_RECHECK));
        };
        if !still_ready {
            return Ok(Action::requeue(CONFLICT_RECHECK));
        }
        let expired = state("False", true, ExecutorReason::IdleTimeout, message.clone());
        self.report(&fresh, expired, sandbox_fields(&fresh)).await?;
        self.shared
            .metrics
            .executor_ended(ExecutorReason::IdleTimeout);
        self.event(&fresh, EventType::Normal, "Expired", "Reclaim", message)
            .await;
        info!("expired: idle for its idleTimeoutSeconds");
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests;
