//! What comes next for an unfinished Execution: [`Actor::observed`] reads the caches into an
//! [`Observed`], [`decide`] (pure, table-tested) picks the [`Step`], and [`Actor::reconcile`]
//! performs it. Whether it may run in its executor at all is [`admit`]'s (pure too): a missing,
//! deleted, unusable or unready executor, or a full queue, gives a [`Refusal`] that fails the
//! Execution or makes it wait.

use std::{sync::Arc, time::Duration};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{ResourceExt, runtime::controller::Action};

use super::{
    actor::Actor,
    cancel::never_ran,
    end::Verdict,
    send::{Attempt, timeout_seconds},
    turn::{NamespaceQueue, Turn, unable},
};
use crate::{
    briq::SandboxApi,
    controller::{
        context::{Error, Result},
        recheck::{self, Wait},
    },
    crd::{
        BriqExecutor, DEFAULT_EXECUTION_TIMEOUT_SECONDS,
        conditions::{self, READY},
        reasons::ExecutionReason,
    },
};

/// The next step of an unfinished Execution, judged from the caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// This process has a result it could not write yet: write it.
    WriteResult,
    /// Recorded as running without a result, past the attempt's deadline: the code may have
    /// run and nobody will report it. Never send it again.
    Interrupt,
    /// Recorded as running by someone (another operator process, or this one before a
    /// restart) whose attempt may still report, in an executor that can no longer be asked:
    /// look again after this long.
    AwaitAttempt(Duration),
    /// Recorded as running, no result here (a restart, a fail-over), in a usable executor: ask
    /// its sandbox's journal what became of the attempt
    /// ([`recovered`](super::recover::recovered)).
    Recover,
    Refuse(Refusal),
    /// Not its turn in its executor's queue as the cache shows it (one before it, or a burst
    /// still arriving): wait there, and look again after this long at the latest.
    Queue(Duration),
    /// Its turn as the cache shows it: take it (the executor's lock, a place under its class)
    /// and send the code. `confirm`: the cache lags (listing, or its watch failed), so the turn
    /// is asked of the API server first ([`Actor::take_turn`]).
    TakeTurn {
        confirm: bool,
    },
    /// Cancelled, with a sandbox to ask: its journal claims the attempt or interrupts it
    /// ([`Actor::cancel`](super::cancel)).
    Cancel,
    /// Cancelled, never recorded as running, and no usable sandbox could have taken it: it ends
    /// `Cancelled` at once.
    CancelUnsent,
}

pub fn decide(observed: &Observed) -> Step {
    if observed.unwritten_result {
        return Step::WriteResult;
    }
    if let Some(attempt) = &observed.attempt {
        let askable = observed
            .executor
            .is_some_and(|e| unable(e, observed.executor_known_unusable).is_none());
        if askable {
            return if observed.cancel {
                Step::Cancel
            } else {
                Step::Recover
            };
        }
        return match attempt.may_report_for(observed.now) {
            Some(left) => Step::AwaitAttempt(left),
            None => Step::Interrupt,
        };
    }
    if observed.cancel {
        let has_sandbox = observed.executor.is_some_and(|e| {
            unable(e, observed.executor_known_unusable).is_none()
                && e.status.as_ref().is_some_and(|s| s.sandbox_id.is_some())
        });
        return if has_sandbox {
            Step::Cancel
        } else {
            Step::CancelUnsent
        };
    }
    if let Err(refusal) = admit(observed) {
        return Step::Refuse(refusal);
    }
    // The cache never invents a sibling, so when it says to wait the API server would say so
    // too; when it says it is this one's turn, a sibling it lacks was stored after this one,
    // within the watch's own delay (milliseconds) when the cache is current: a window a LIST
    // would narrow but not close, and one created after this one started runs after it in any
    // case. So the cache decides, except while it is known to lag by more.
    match observed.turn {
        Some(Turn::Mine) => Step::TakeTurn {
            confirm: !observed.cache_current,
        },
        Some(Turn::BurstArriving(left)) => Step::Queue(left),
        Some(Turn::Behind) | None => Step::Queue(recheck::recheck(Wait::Turn)),
    }
}

impl<'a, S: SandboxApi> Actor<'a, S> {
    fn observed<'b>(&'b self, executor: Option<&'b BriqExecutor>, uid: &str) -> Observed<'b> {
        let name = self.executor_name();
        let place = self.ctx.queue_place(self.execution);
        Observed {
            executor_name: name,
            namespace: &self.namespace,
            unwritten_result: self.ctx.kept.unwritten(uid).is_some(),
            cancel: self.execution.spec.cancel,
            attempt: self.status().attempt_id.map(|_| Attempt {
                started: self.status().start_time.map(|t| t.0),
                timeout_seconds: executor.map_or_else(
                    || {
                        timeout_seconds(
                            self.execution.spec.timeout_seconds,
                            DEFAULT_EXECUTION_TIMEOUT_SECONDS,
                            None,
                        )
                    },
                    |executor| self.timeout_seconds(executor),
                ),
            }),
            now: Timestamp::now(),
            adopted: self
                .execution
                .owner_references()
                .iter()
                .any(|owner| owner.kind == "BriqExecutor" && owner.name == name),
            executor,
            created: self
                .execution
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0),
            executor_wait: SignedDuration::try_from(self.ctx.shared.settings.executor_wait)
                .unwrap_or(SignedDuration::MAX),
            executor_known_unusable: executor.is_some_and(|e| self.ctx.is_unusable(e)),
            turn: place.turn,
            cache_current: self.ctx.freshness.current(),
            placed: self.execution.holds_a_place(),
            ahead: place.ahead,
            namespace_queue: executor.and_then(|e| self.ctx.namespace_queue(self.execution, e)),
        }
    }

    pub(super) async fn reconcile(&self) -> Result<Action> {
        let uid = self
            .execution
            .uid()
            .ok_or_else(|| Error::Invariant("an Execution without uid".into()))?;
        // Waiting costs the API server nothing: the cache decides, and only an executor missing
        // from it is read (it may have been created a moment ago).
        let executor = match self
            .ctx
            .cached_executor(&self.namespace, self.executor_name())
        {
            Some(executor) => Some(executor),
            None => self
                .executors
                .get_opt(self.executor_name())
                .await?
                .map(Arc::new),
        };
        let executor = executor.as_deref();
        // The steps that reach briq are boxed: inline, each would sit in this future, and a
        // debug build's poll frames copy them (test threads have 2 MiB of stack).
        match decide(&self.observed(executor, &uid)) {
            Step::WriteResult => {
                let result = self.ctx.kept.unwritten(&uid).unwrap_or_default();
                self.write(&result).await?;
                self.ctx.kept.written(&uid);
                self.ctx.finish(self.execution);
                Ok(Action::await_change())
            }
            Step::Interrupt => Box::pin(self.interrupt()).await,
            Step::Recover => {
                let executor = executor.expect("recovery is decided on an executor");
                Box::pin(self.recover(executor)).await
            }
            Step::AwaitAttempt(left) => Ok(Action::requeue(left)),
            Step::Refuse(refusal) => self.refuse(refusal).await,
            Step::Queue(recheck) => {
                self.adopt(executor).await?;
                self.queued(recheck).await
            }
            Step::Cancel => Box::pin(self.cancel(executor)).await,
            Step::CancelUnsent => {
                let verdict = never_ran("no usable sandbox could have taken it");
                self.conclude(None, self.status(), &verdict).await
            }
            Step::TakeTurn { confirm } => {
                let executor = executor.expect("a turn is taken on an admitted executor");
                let version = self.adopt(Some(executor)).await?;
                Box::pin(self.take_turn(executor, &version, confirm)).await
            }
        }
    }
}

/// What the execution controller observed of an unfinished Execution, from its caches.
pub struct Observed<'a> {
    pub executor_name: &'a str,
    pub namespace: &'a str,
    /// Whether this process holds an unwritten result for it.
    pub unwritten_result: bool,
    /// Whether it is cancelled (`spec.cancel`).
    pub cancel: bool,
    /// The attempt recorded in the status, if any.
    pub attempt: Option<Attempt>,
    pub now: Timestamp,
    /// Whether the Execution has an owner reference to an executor of its executor's name: it
    /// was adopted once, so its executor existed.
    pub adopted: bool,
    pub executor: Option<&'a BriqExecutor>,
    /// When the Execution was created, and how long it may wait for an executor that does not
    /// exist (`Settings::executor_wait`).
    pub created: Option<Timestamp>,
    pub executor_wait: SignedDuration,
    /// This process made the executor unusable; its cache may not show it yet.
    pub executor_known_unusable: bool,
    /// Its turn in its executor's queue as the cache shows it; `None` when the cache does not
    /// hold it.
    pub turn: Option<Turn>,
    /// Whether the cache is current: not listing, its watch not failed.
    pub cache_current: bool,
    /// Whether it already holds its place in its queues
    /// ([`ExecutionReason::holds_a_place`](crate::crd::reasons::ExecutionReason::holds_a_place)):
    /// the queue limits judge only an Execution that does not.
    pub placed: bool,
    /// How many unfinished Executions of the executor hold a place before it: those before it
    /// in the cached queue and those already placed (the running one among them). An
    /// Execution created later in the same second may sort before one already queued; it
    /// still comes after it for the queue's limit.
    pub ahead: usize,
    /// Its namespace's queue under its executor's class, when the class limits it.
    pub namespace_queue: Option<NamespaceQueue>,
}

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

#[cfg(test)]
mod tests;
