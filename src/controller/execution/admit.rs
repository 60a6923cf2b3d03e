//! Whether an Execution may run in its executor at all, as far as the executor and the queues'
//! limits are concerned: a missing, deleted, unusable or unready executor, a full queue. A
//! [`Refusal`] fails the Execution or makes it wait; [`decide`](super::step::decide) and the
//! turn ([`Actor::take_turn`]) ask here.

use std::time::Duration;

use k8s_openapi::jiff::SignedDuration;
use kube::runtime::controller::Action;

use super::{actor::Actor, conclude::Verdict, observed::Observed};
use crate::{
    briq::SandboxApi,
    controller::{
        context::Result,
        recheck::{self, Wait},
    },
    crd::{
        BriqExecutor, POOL_MEMBER_ANNOTATION,
        conditions::{self, READY, STALLED},
        reasons::ExecutionReason,
    },
};

/// Why an Execution cannot run in its executor now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Never: the Execution fails.
    Fail(Verdict),
    /// Not yet: the Execution waits, with this reason and message, until something it waits on
    /// changes (see [`wake`](crate::controller::wake)), or at the latest `recheck` from now.
    Wait {
        reason: ExecutionReason,
        message: String,
        recheck: Duration,
    },
}

/// Whether the Execution may run in its executor now, as far as the executor is concerned.
pub fn admit(observed: &Observed) -> Result<(), Refusal> {
    let name = observed.executor_name;
    let Some(executor) = observed.executor else {
        if observed.adopted {
            let message = format!("BriqExecutor {name} was deleted");
            return Err(Refusal::Fail(Verdict::new(
                ExecutionReason::ExecutorDeleted,
                message,
            )));
        }
        // A name that never comes must not keep an Execution waiting forever; a creation time
        // ahead of this clock (skew) counts as just created.
        let waited = observed
            .created
            .map_or(SignedDuration::ZERO, |created| {
                observed.now.duration_since(created)
            })
            .max(SignedDuration::ZERO);
        if waited >= observed.executor_wait {
            let message = format!(
                "BriqExecutor {name} did not appear in namespace {} within {}s; the code did not run",
                observed.namespace,
                observed.executor_wait.as_secs()
            );
            return Err(Refusal::Fail(Verdict::new(
                ExecutionReason::ExecutorNeverAppeared,
                message,
            )));
        }
        let message = format!(
            "BriqExecutor {name} does not exist in namespace {}",
            observed.namespace
        );
        return Err(Refusal::Wait {
            reason: ExecutionReason::ExecutorNotFound,
            message,
            recheck: recheck::recheck(Wait::ExecutorMissing {
                left: (observed.executor_wait - waited).unsigned_abs(),
            }),
        });
    };
    if let Some(verdict) = unable(executor, observed.executor_known_unusable) {
        return Err(Refusal::Fail(verdict));
    }
    if !observed.placed {
        if let Some(verdict) = queue_full(executor, observed.ahead) {
            return Err(Refusal::Fail(verdict));
        }
        if let Some(verdict) = namespace_queue_full(observed) {
            return Err(Refusal::Fail(verdict));
        }
    }
    let conditions = executor
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    if !conditions::is_true(conditions, READY) {
        let why = conditions::find(conditions, READY)
            .map(|c| c.message.as_str())
            .unwrap_or_default();
        let message = format!("BriqExecutor {name} is not ready: {why}");
        return Err(Refusal::Wait {
            reason: ExecutionReason::ExecutorNotReady,
            message,
            recheck: recheck::recheck(Wait::ExecutorNotReady),
        });
    }
    // A claimer is Ready with the record of its claim, and gets its finalizer in the write
    // after (executor/claim/record.rs): code runs only where deleting the executor waits for it.
    if !executor.holds_finalizer() {
        let message = format!(
            "BriqExecutor {name} is not ready: it does not hold its finalizer yet, which makes \
             its deletion wait for its Executions"
        );
        return Err(Refusal::Wait {
            reason: ExecutionReason::ExecutorNotReady,
            message,
            recheck: recheck::recheck(Wait::ExecutorNotReady),
        });
    }
    Ok(())
}

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

/// Why an Execution with `ahead` unfinished Executions before it may not wait in `executor`'s
/// queue, if it may not: the one at the head runs, `maxQueuedExecutions` wait behind it.
pub fn queue_full(executor: &BriqExecutor, ahead: usize) -> Option<Verdict> {
    let max = executor.spec.max_queued_executions as usize;
    let waiting = ahead.saturating_sub(1);
    (waiting >= max).then(|| {
        Verdict::new(
            ExecutionReason::QueueFull,
            format!(
                "BriqExecutor {} already has {waiting} Executions waiting (maxQueuedExecutions is \
                 {max}); this one was not run: create it again once the queue drains",
                executor.metadata.name.as_deref().unwrap_or_default()
            ),
        )
    })
}

/// Why an Execution not started yet may not wait in its namespace's queue under its class, if
/// it may not: `perNamespace.maxQueuedExecutions` wait before it.
pub fn namespace_queue_full(observed: &Observed) -> Option<Verdict> {
    let queue = observed.namespace_queue.as_ref()?;
    if observed.attempt.is_some() || queue.waiting_before < queue.max as usize {
        return None;
    }
    Some(Verdict::new(
        ExecutionReason::QueueFull,
        format!(
            "namespace {} already has {} Executions of class {} waiting (its \
             perNamespace.maxQueuedExecutions is {}); this one was not run: create it again once \
             they drain",
            observed.namespace, queue.waiting_before, queue.class, queue.max
        ),
    ))
}

impl<'a, S: SandboxApi> Actor<'a, S> {
    pub(super) async fn refuse(&self, refusal: Refusal) -> Result<Action> {
        match refusal {
            Refusal::Fail(verdict) => self.conclude(None, self.status(), &verdict).await,
            Refusal::Wait {
                reason,
                message,
                recheck,
            } => {
                self.wait(reason, message).await?;
                Ok(Action::requeue(recheck))
            }
        }
    }
}
