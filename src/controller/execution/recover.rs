//! An attempt found recorded as running with no result in this process (a restart, a fail-over,
//! a second operator), or whose outcome briq left unknown: the sandbox's journal is asked what
//! became of it, briq is waited for within the outage patience, and an attempt nobody can ask
//! about any more is concluded as interrupted. Nothing is sent twice.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{ResourceExt, runtime::controller::Action};
use tracing::{info, warn};

use super::{
    actor::Actor,
    end::waiting_status,
    end::{Failure, Verdict, failure, judge},
    send::Access,
    send::Attempt,
    send::{Judged, ran},
};
use crate::{
    bridge::{RunResult, session::CallError},
    briq::SandboxApi,
    controller::{
        context::{Error, Result},
        recheck::{self, ATTEMPT_GRACE, CONFLICT_RECHECK, Wait},
    },
    crd::{BriqExecutor, ExecutionStatus, conditions, reasons::ExecutionReason},
};

/// What the sandbox's journal said of an attempt whose outcome this process does not know.
#[derive(Debug)]
pub enum Recovered {
    /// It never reached the sandbox, so its code never ran: send it now, as the same attempt
    /// (the journal runs an attempt once, should the first delivery still arrive).
    Resend,
    /// It ran (or ran and was waited for): judge its result like any run's.
    Judge(Box<Judged>),
    /// The question did not get through (briq refused or failed, a spilled answer could not
    /// be read): ask again once briq answers; asking runs nothing.
    AskAgain(CallError),
}

/// Reads the answer to `recall` ([`crate::bridge::session::Session::recall`]).
pub fn recovered(answer: Result<Option<RunResult>, CallError>, timeout: u32) -> Recovered {
    let error = match answer {
        Ok(None) => return Recovered::Resend,
        Ok(Some(result)) => return Recovered::Judge(Box::new(judge(Ok(result), timeout))),
        Err(error) => error,
    };
    match failure(&error) {
        // The sandbox is gone, and its kernel with it: judged as a run that found it gone.
        Failure::SandboxGone => Recovered::Judge(Box::new(judge(Err(error), timeout))),
        Failure::Refused | Failure::BriqUnanswered => Recovered::AskAgain(error),
        // No envelope (the attempt was accepted and nobody knows how it ended), or no answer
        // within the attempt's own time: it may have run.
        Failure::BridgeUnreadable => {
            Recovered::Judge(Box::new((
            Verdict::new(
                ExecutionReason::Interrupted,
                "the operator lost track of this Execution while it ran and the sandbox kept no result; it may have run, so it is not run again, and the executor is now unusable",
            )
            .poisons("an Execution was interrupted mid-run; the kernel state is uncertain"),
            None,
            )))
        }
    }
}

/// How much longer an attempt whose outcome briq left unknown may wait for briq to answer its
/// journal: its deadline, the grace for its result, then `patience`; `None` once that is over.
pub fn patience_left(attempt: &Attempt, patience: Duration, now: Timestamp) -> Option<Duration> {
    let Some(started) = attempt.started else {
        return Some(patience);
    };
    let patience = SignedDuration::try_from(patience).unwrap_or(SignedDuration::MAX);
    let until = started
        .checked_add(SignedDuration::from_secs(attempt.timeout_seconds.into()))
        .and_then(|t| t.checked_add(ATTEMPT_GRACE))
        .and_then(|t| t.checked_add(patience))
        .unwrap_or(Timestamp::MAX);
    let left = now.duration_until(until);
    left.is_positive().then(|| left.unsigned_abs())
}

/// What an Execution waiting on briq says (`WaitingForBriq`) while its attempt's outcome is
/// unknown.
pub fn waiting_for_briq_message(error: &CallError, give_up: Option<Timestamp>) -> String {
    let until = give_up.map_or_else(String::new, |at| format!(" until {at:.0}"));
    format!(
        "briq did not answer whether the code ran ({error}); the sandbox's attempt journal will be \
         asked once briq answers again{until}, and the code is never sent twice"
    )
}

/// The verdict when briq did not answer whether the code ran within the outage patience.
pub fn outcome_stayed_unknown(error: &CallError, patience: Duration) -> Verdict {
    Verdict::new(
        ExecutionReason::TransportError,
        format!(
            "the outcome stayed unknown: briq did not answer whether the code ran within {}s \
             beyond its deadline (last: {error}); it may have run, and the executor is now unusable",
            patience.as_secs()
        ),
    )
    .poisons("briq left an Execution's outcome unknown beyond the outage patience")
}

impl<'a, S: SandboxApi> Actor<'a, S> {
    /// Recorded as running, with no result in this process: an operator restart, a fail-over
    /// or a second operator. The sandbox's journal says what became of the attempt; nothing
    /// runs twice, and only an attempt the sandbox never accepted is sent (as the same attempt).
    pub(super) async fn recover(&self, executor: &BriqExecutor) -> Result<Action> {
        let base = self.status();
        let attempt = base
            .attempt_id
            .clone()
            .ok_or_else(|| Error::Invariant("recovering an Execution without attempt".into()))?;
        let (key, sandbox_id) = match self.sandbox(executor, &base).await? {
            Access::Granted(key, sandbox_id) => (key, sandbox_id),
            Access::Denied(action) => return Ok(action),
        };
        let lock = self.ctx.kept.lock(&executor.uid().unwrap_or_default());
        let _turn = self.slot.without(lock.lock()).await;
        if self.ctx.shared.stopping() {
            return Ok(Action::await_change());
        }
        let timeout = self.timeout_seconds(executor);
        let session = self.session(&key, &sandbox_id);
        let seconds = Duration::from_secs(timeout.into());
        let answer = session.recall(&attempt, seconds).await;
        let (verdict, result) = match recovered(answer, timeout) {
            Recovered::Judge(judged) => *judged,
            Recovered::AskAgain(error) => {
                return self.await_briq(executor, base, error).await;
            }
            Recovered::Resend => {
                // The cache holds no code; the Execution as it is now does, and must still be
                // at this attempt with no result (someone else may have recovered it).
                let fresh = self.api.get(&self.execution.name_any()).await?;
                let current = fresh.status.clone().unwrap_or_default();
                if current.attempt_id.as_deref() != Some(attempt.as_str()) || fresh.finished() {
                    return Ok(Action::requeue(CONFLICT_RECHECK));
                }
                info!(%attempt, "the attempt never reached the sandbox; sending it now");
                let outcome = self
                    .cancellable(
                        session.run(&attempt, &fresh.spec.code, seconds),
                        &session,
                        &attempt,
                    )
                    .await;
                match ran(outcome, timeout) {
                    Ok(judged) => judged,
                    Err(unknown) => return self.await_briq(executor, base, unknown).await,
                }
            }
        };
        info!(%attempt, "recovered an Execution the operator lost track of");
        self.finish_run(executor, base, &verdict, result).await
    }

    /// briq did not answer whether the attempt in `base` ran: the Execution stays running, says
    /// it waits for briq, and asks the sandbox's journal again later ([`Actor::recover`]);
    /// once its patience is over, the outcome stayed unknown and the executor is unusable.
    pub(super) async fn await_briq(
        &self,
        executor: &BriqExecutor,
        base: ExecutionStatus,
        error: CallError,
    ) -> Result<Action> {
        let attempt = Attempt {
            started: base.start_time.as_ref().map(|t| t.0),
            timeout_seconds: self.timeout_seconds(executor),
        };
        let patience = self.ctx.shared.settings.outage_patience;
        let now = Timestamp::now();
        let Some(left) = patience_left(&attempt, patience, now) else {
            warn!(%error, "briq did not answer whether the code ran within the outage patience");
            let verdict = outcome_stayed_unknown(&error, patience);
            return self.finish_run(executor, base, &verdict, None).await;
        };
        warn!(%error, ?left, "briq did not answer whether the code ran; its journal will be asked");
        let give_up = SignedDuration::try_from(left)
            .ok()
            .and_then(|left| now.checked_add(left).ok());
        let message = waiting_for_briq_message(&error, give_up);
        self.wait_for_briq(base, message).await?;
        let waited = attempt
            .started
            .map(|started| now.duration_since(started).max(SignedDuration::ZERO))
            .map_or(Duration::ZERO, SignedDuration::unsigned_abs);
        Ok(Action::requeue(recheck::recheck(Wait::Briq {
            waited,
            left,
            retry_after: error.retry_after(),
        })))
    }

    /// Says the Execution waits for briq (`WaitingForBriq`), keeping the attempt of `base`
    /// recorded, unless it says so already: one write per wait, not one per question.
    async fn wait_for_briq(&self, base: ExecutionStatus, message: String) -> Result<()> {
        let uid = self.execution.uid().unwrap_or_default();
        let current = self
            .ctx
            .kept
            .waiting_written(&uid)
            .filter(|written| written.attempt_id == base.attempt_id)
            .unwrap_or(base);
        let reason = ExecutionReason::WaitingForBriq;
        let already = conditions::find(&current.conditions, conditions::SUCCEEDED)
            .is_some_and(|c| c.status == "Unknown" && c.reason == reason.as_str());
        if already {
            return Ok(());
        }
        let generation = self.execution.metadata.generation;
        if let Some(waiting) = waiting_status(&current, generation, reason, message) {
            self.write(&waiting).await?;
            self.ctx.kept.wrote_waiting(&uid, waiting);
        }
        Ok(())
    }

    /// Recorded as running, but no result: the code may have run. Never send it again.
    pub(super) async fn interrupt(&self) -> Result<Action> {
        let executor = self.executors.get_opt(self.executor_name()).await?;
        let verdict = Verdict::new(
            ExecutionReason::Interrupted,
            "the operator stopped while this Execution was running; it is not run again because it may have run",
        )
        .poisons(format!(
            "Execution {} was interrupted mid-run; the kernel state is uncertain",
            self.execution.name_any()
        ));
        self.conclude(executor.as_ref(), self.status(), &verdict)
            .await
    }
}

#[cfg(test)]
mod tests;
