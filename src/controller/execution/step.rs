//! What comes next for an unfinished Execution: [`decide`] (pure) picks the [`Step`] from what
//! [`Actor::observed`] saw in the caches, and [`Actor::reconcile`] hands it to the step's file.

use std::{sync::Arc, time::Duration};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{ResourceExt, runtime::controller::Action};

use super::{
    actor::Actor,
    admit::{Refusal, admit, unable},
    cancel::never_ran,
    observed::{Attempt, Observed},
    run::timeout_seconds,
};
use crate::{
    briq::SandboxApi,
    controller::{
        context::{Error, Result},
        recheck::{self, Wait},
    },
    crd::{BriqExecutor, DEFAULT_EXECUTION_TIMEOUT_SECONDS},
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
    /// Not at the head of its executor's queue: wait there.
    Queue,
    /// At the head of the cached queue: confirm the turn and the executor afresh, then run.
    ConfirmTurn,
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
    if observed.heads_queue {
        Step::ConfirmTurn
    } else {
        Step::Queue
    }
}

impl<'a, S: SandboxApi> Actor<'a, S> {
    fn observed<'b>(&'b self, executor: Option<&'b BriqExecutor>, uid: &str) -> Observed<'b> {
        let name = self.executor_name();
        let (position, places_before) = self.ctx.queue_place(self.execution);
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
            heads_queue: position == Some(0),
            placed: self.execution.holds_a_place(),
            ahead: places_before,
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
            Step::Queue => {
                self.adopt(executor).await?;
                self.queued(recheck::recheck(Wait::Turn)).await
            }
            Step::Cancel => Box::pin(self.cancel(executor)).await,
            Step::CancelUnsent => {
                let verdict = never_ran("no usable sandbox could have taken it");
                self.conclude(None, self.status(), &verdict).await
            }
            Step::ConfirmTurn => {
                let executor = executor.expect("a turn is confirmed on an admitted executor");
                let version = self.adopt(Some(executor)).await?;
                Box::pin(self.take_turn(executor, &version)).await
            }
        }
    }
}

#[cfg(test)]
mod tests;
