//! Cancelling an Execution (`spec.cancel`, or deleting it while it runs). The sandbox's journal
//! decides, never this process: the bridge's `cancel` claims an attempt nobody sent yet (so no
//! later delivery runs it), or interrupts the running one in its kernel and restarts the kernel
//! when the code does not stop within [`CANCEL_GRACE`]; its answer is the attempt's journaled
//! result, judged like any run's. Two triggers, neither lost: a reconcile that finds the
//! Execution cancelled ([`Step::Cancel`](super::step::Step::Cancel), [`Actor::cancel`]), and,
//! for the run this process is waiting on (a reconcile of the same object cannot start until it
//! ends), the watch telling the bookkeeping ([`Actor::cancellable`]).

use kube::{ResourceExt, runtime::controller::Action};
use tokio::sync::watch;
use tracing::{info, warn};

use super::{
    actor::Actor,
    end::{Failure, Verdict, failure, judge},
    send::Access,
    send::{Judged, attempt_id},
};
use crate::{
    bridge::{
        RunResult,
        session::{CallError, Session},
    },
    briq::SandboxApi,
    controller::context::{Error, Result},
    controller::recheck::{CANCEL_GRACE, FIRST_CANCEL_PAUSE, MAX_CANCEL_PAUSE},
    crd::{BriqExecutor, reasons::ExecutionReason},
};

/// What the sandbox answered to a cancel.
#[derive(Debug)]
pub enum CancelAnswer {
    /// The attempt's journaled result (cancelled, or how it ended first): judge it.
    Judge(Box<Judged>),
    /// briq did not carry the question: ask again (cancelling twice is harmless).
    AskAgain(CallError),
    /// The sandbox's bridge gave no cancel answer (one installed by an earlier release, which
    /// has no `cancel`): the attempt is left to its run or to the journal's `recall`.
    NoCancel(CallError),
}

/// Reads the answer to the bridge's `cancel` of a run with `timeout`.
pub fn cancel_answer(
    answer: std::result::Result<RunResult, CallError>,
    timeout: u32,
) -> CancelAnswer {
    let error = match answer {
        Ok(result) => return CancelAnswer::Judge(Box::new(judge(Ok(result), timeout))),
        Err(error) => error,
    };
    match failure(&error) {
        Failure::SandboxGone => CancelAnswer::Judge(Box::new(judge(Err(error), timeout))),
        Failure::Refused | Failure::BriqUnanswered => CancelAnswer::AskAgain(error),
        Failure::BridgeUnreadable => CancelAnswer::NoCancel(error),
    }
}

/// The verdict of an Execution cancelled before anything could have sent it.
pub fn never_ran(why: &str) -> Verdict {
    Verdict::new(
        ExecutionReason::Cancelled,
        format!("cancelled before it ran: the code never ran ({why})"),
    )
}

impl<'a, S: SandboxApi> Actor<'a, S> {
    /// Cancels this unfinished Execution. With a usable executor, its sandbox's journal decides
    /// (the attempt claimed as cancelled, or interrupted where it runs) and its answer is judged;
    /// without one, nothing can have run it: it ends `Cancelled` at once.
    pub(super) async fn cancel(&self, executor: Option<&BriqExecutor>) -> Result<Action> {
        let base = self.status();
        let Some(executor) =
            executor.filter(|e| e.status.as_ref().is_some_and(|s| s.sandbox_id.is_some()))
        else {
            return self
                .conclude(None, base, &never_ran("its executor has no sandbox"))
                .await;
        };
        let (key, sandbox_id) = match self.sandbox(executor, &base).await? {
            Access::Granted(key, sandbox_id) => (key, sandbox_id),
            Access::Denied(action) => return Ok(action),
        };
        let attempt = attempt_id(&self.execution.uid().unwrap_or_default());
        let timeout = self.timeout_seconds(executor);
        let answer = self
            .session(&key, &sandbox_id)
            .cancel(&attempt, CANCEL_GRACE)
            .await;
        let (verdict, result) = match (cancel_answer(answer, timeout), &base.attempt_id) {
            (CancelAnswer::Judge(judged), _) => *judged,
            (CancelAnswer::AskAgain(error), Some(_)) => {
                return self.await_briq(executor, base, error).await;
            }
            (CancelAnswer::AskAgain(error), None) => return Err(Error::Bridge(error)),
            (CancelAnswer::NoCancel(error), Some(_)) => {
                warn!(%error, "the sandbox's bridge cannot cancel; its journal tells how the run ends");
                return self.recover(executor).await;
            }
            (CancelAnswer::NoCancel(error), None) => {
                warn!(%error, "the sandbox's bridge cannot cancel; the attempt was never sent");
                let verdict =
                    never_ran("the sandbox's bridge predates cancel, and it was never sent");
                return self.conclude(None, base, &verdict).await;
            }
        };
        info!(reason = %verdict.reason, "cancelled");
        self.finish_run(executor, base, &verdict, result).await
    }

    /// Awaits `run`, the code already sent as `attempt` through `session`'s sandbox; when the
    /// Execution is cancelled meanwhile, the sandbox is told to cancel the attempt, and the
    /// run's own answer (the journal's record, cancelled) ends it — once the cancel has
    /// answered too: a cancel that restarts the kernel answers when the new kernel is up, and
    /// the next Execution must not find none.
    pub(super) async fn cancellable<F, T>(
        &self,
        run: F,
        session: &Session<'_, S>,
        attempt: &str,
    ) -> T
    where
        F: Future<Output = T>,
    {
        let uid = self.execution.uid().unwrap_or_default();
        let mut run = std::pin::pin!(run);
        tokio::select! {
            done = &mut run => return done,
            () = self.ctx.kept.cancel_requested(&uid) => {}
        }
        info!(%attempt, "cancelled while it runs: interrupting it in its kernel");
        let (ended, run_ended) = watch::channel(false);
        let run = async {
            let done = run.await;
            ended.send_replace(true);
            done
        };
        tokio::join!(run, keep_cancelling(session, attempt, run_ended)).0
    }
}

/// Tells the sandbox to cancel `attempt` until it has answered or cannot cancel, or until the
/// run has ended: a request briq did not carry (an outage must not let the code run on to its
/// deadline) is sent again after a pause that grows to [`MAX_CANCEL_PAUSE`] (or the pause briq
/// asked for). A call in flight is always awaited. Its answer is not needed: the run's own
/// answer is the journal's record.
async fn keep_cancelling<S: SandboxApi>(
    session: &Session<'_, S>,
    attempt: &str,
    mut run_ended: watch::Receiver<bool>,
) {
    let mut pause = FIRST_CANCEL_PAUSE;
    loop {
        let error = match session.cancel(attempt, CANCEL_GRACE).await {
            Ok(_) => return,
            Err(error) => error,
        };
        let retry_after = error.retry_after();
        match cancel_answer(Err(error), 0) {
            CancelAnswer::AskAgain(error) if !*run_ended.borrow() => {
                warn!(%error, ?pause, "briq did not carry the cancel; asking again");
            }
            CancelAnswer::AskAgain(_) => return,
            CancelAnswer::Judge(_) | CancelAnswer::NoCancel(_) => {
                warn!("the sandbox cannot cancel; the run goes on to its own end");
                return;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(retry_after.unwrap_or(pause)) => {}
            _ = run_ended.wait_for(|ended| *ended) => return,
        }
        pause = (pause * 2).min(MAX_CANCEL_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        bridge::{Malformed, RunStatus},
        controller::execution::fixtures::{not_found, result, unavailable},
    };

    #[test]
    fn a_cancel_answer_is_judged_asked_again_or_left_to_the_journal() {
        let cancelled = result(RunStatus::Cancelled, Some(("Cancelled", "interrupted")));
        let CancelAnswer::Judge(judged) = cancel_answer(Ok(cancelled), 30) else {
            panic!("a cancelled record is judged");
        };
        assert_eq!(judged.0.reason, ExecutionReason::Cancelled);
        assert_eq!(judged.0.message, "Cancelled: interrupted");
        assert_eq!(
            judged.0.unusable, None,
            "a cancel keeps the executor usable"
        );

        let restarted = result(
            RunStatus::Cancelled,
            Some(("KernelRestarted", "state gone")),
        );
        let CancelAnswer::Judge(judged) = cancel_answer(Ok(restarted), 30) else {
            panic!("a cancelled record is judged");
        };
        assert_eq!(judged.0.message, "KernelRestarted: state gone");
        assert_eq!(
            judged.0.unusable, None,
            "a restarted kernel runs the next one"
        );

        let finished_first = result(RunStatus::Ok, None);
        let CancelAnswer::Judge(judged) = cancel_answer(Ok(finished_first), 30) else {
            panic!("a record of a run that ended first is judged");
        };
        assert_eq!(judged.0.reason, ExecutionReason::Completed);

        let CancelAnswer::Judge(judged) = cancel_answer(Err(CallError::Briq(not_found())), 30)
        else {
            panic!("a sandbox gone is judged");
        };
        assert_eq!(judged.0.reason, ExecutionReason::KernelLost);

        assert!(matches!(
            cancel_answer(Err(CallError::Briq(unavailable(503))), 30),
            CancelAnswer::AskAgain(_)
        ));
        assert!(matches!(
            cancel_answer(Err(CallError::Malformed(Malformed::Missing)), 30),
            CancelAnswer::NoCancel(_)
        ));
    }
}
