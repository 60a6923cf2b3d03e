//! What an Execution reports. While it cannot run yet (Succeeded=Unknown: queued, its executor
//! missing or not ready, no place under its class), once per reason ([`Actor::wait`]). And how
//! it ends: the bridge's answer judged to a [`Verdict`], the final status (cut to its byte
//! budget), the executor made unusable when the verdict says so, the execution counted, the
//! result written (or kept for the next reconcile when the write fails), the next one woken and
//! the oldest history beyond the executor's limit pruned: an [`Ending`], decided by [`ending`]
//! and applied by [`Actor::end`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{ResourceExt, api::DeleteParams, runtime::controller::Action};
use tracing::{info, warn};

use super::{actor::Actor, budget, context::Context};
use crate::{
    bridge::{CodeError, RunResult, RunStatus, session::CallError},
    briq::{ErrorClass, ExecOutcome, SandboxApi},
    controller::{context::Result, index::of_executor, status::mark_unusable},
    crd::{
        BriqExecutor, Execution, ExecutionError, ExecutionStatus, MAX_STATUS_BYTES, RunOrder,
        conditions::{self, SUCCEEDED, desired},
        reasons::{ExecutionReason, Phase},
    },
    traces,
};

/// The status of an Execution that waits (Succeeded=Unknown), or `None` when `current`
/// already says so.
pub fn waiting_status(
    current: &ExecutionStatus,
    generation: Option<i64>,
    reason: ExecutionReason,
    message: String,
) -> Option<ExecutionStatus> {
    let want = [desired(SUCCEEDED, "Unknown", reason.as_str(), message)];
    if conditions::satisfied(&current.conditions, &want, generation)
        && current.observed_generation == generation
    {
        return None;
    }
    Some(ExecutionStatus {
        observed_generation: generation,
        conditions: conditions::merge(&current.conditions, &want, generation),
        // A recovery may wait on an Execution recorded as running: its attempt stays recorded,
        // or it would look never run and be sent again.
        attempt_id: current.attempt_id.clone(),
        start_time: current.start_time.clone(),
        ..Default::default()
    })
}

impl<'a, S: SandboxApi> Actor<'a, S> {
    /// Reports a not-yet-runnable Execution (Succeeded=Unknown) unless it already says so, or
    /// this process wrote so and its cache does not show it yet: an Execution waiting in a
    /// burst is reconciled on each of its own changes, which arrive after the next decision.
    pub(super) async fn wait(&self, reason: ExecutionReason, message: String) -> Result<()> {
        let generation = self.execution.metadata.generation;
        let uid = self.execution.uid().unwrap_or_default();
        let current = self
            .ctx
            .kept
            .waiting_written(&uid)
            .unwrap_or_else(|| self.status());
        if let Some(waiting) = waiting_status(&current, generation, reason, message) {
            self.write(&waiting).await?;
            self.ctx.kept.wrote_waiting(&uid, waiting);
        }
        Ok(())
    }
}

/// How an Execution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub reason: ExecutionReason,
    pub message: String,
    /// Set when the executor must never run code again.
    pub unusable: Option<String>,
}

impl Verdict {
    pub fn new(reason: ExecutionReason, message: impl Into<String>) -> Verdict {
        Verdict {
            reason,
            message: message.into(),
            unusable: None,
        }
    }

    pub(super) fn poisons(mut self, why: impl Into<String>) -> Verdict {
        self.unusable = Some(why.into());
        self
    }

    pub fn succeeded(&self) -> bool {
        self.reason.phase() == Phase::Succeeded
    }
}

/// What a failed call to an Execution's sandbox proves: one classification for every step that
/// calls it (the run, the journal's recall, the cancel), each of which decides what to do about
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// briq says the sandbox is gone, and its kernel with it.
    SandboxGone,
    /// briq refused the call for good, before acting on it.
    Refused,
    /// briq did not answer, or its answer could not be read: what the call did is unknown
    /// until briq answers again, and asking the journal runs nothing.
    BriqUnanswered,
    /// The bridge answered, but not as the bridge does (no envelope, another kind of answer,
    /// none within the attempt's own time).
    BridgeUnreadable,
}

/// Classifies a failed call to the sandbox ([`Failure`]).
pub fn failure(error: &CallError) -> Failure {
    match error {
        CallError::ResultUnreadable(_) => Failure::BriqUnanswered,
        CallError::Briq(error) => match (error.exec_outcome(), error.class()) {
            (_, ErrorClass::NotFound) => Failure::SandboxGone,
            (ExecOutcome::NotRun, ErrorClass::Terminal) => Failure::Refused,
            _ => Failure::BriqUnanswered,
        },
        CallError::TimedOut(_) | CallError::Malformed(_) | CallError::UnexpectedKind(_) => {
            Failure::BridgeUnreadable
        }
    }
}

/// Maps what the bridge answered to the Execution's outcome.
pub fn judge(outcome: Result<RunResult, CallError>, timeout: u32) -> (Verdict, Option<RunResult>) {
    use ExecutionReason::*;
    let result = match outcome {
        Ok(result) => result,
        Err(CallError::TimedOut(waited)) => {
            let message = format!(
                "the sandbox command did not return within {waited:?}; the executor is now unusable"
            );
            let verdict =
                Verdict::new(Timeout, message).poisons("an Execution's command timed out");
            return (verdict, None);
        }
        Err(error @ (CallError::Malformed(_) | CallError::UnexpectedKind(_))) => {
            let message =
                format!("malformed answer from the bridge ({error}); the executor is now unusable");
            let verdict = Verdict::new(MalformedResponse, message)
                .poisons("the bridge answered malformed output");
            return (verdict, None);
        }
        Err(error @ CallError::ResultUnreadable(_)) => {
            let message = format!("the outcome is unknown: {error}; the executor is now unusable");
            let verdict = Verdict::new(TransportError, message)
                .poisons("an Execution's result could not be read after its code ran");
            return (verdict, None);
        }
        Err(CallError::Briq(error)) => {
            let verdict = match (error.exec_outcome(), error.class()) {
                (ExecOutcome::NotRun, ErrorClass::NotFound) => Verdict::new(
                    KernelLost,
                    format!(
                        "the sandbox is gone ({error}), so the code did not run; the executor is now unusable"
                    ),
                )
                .poisons("its sandbox no longer exists"),
                (ExecOutcome::NotRun, _) => Verdict::new(
                    TransportError,
                    format!(
                        "briq refused the request to run the code or was never reached, so the code did not run: {error}"
                    ),
                ),
                (ExecOutcome::Unknown, _) => Verdict::new(
                    TransportError,
                    format!(
                        "the outcome is unknown: the code may have run ({error}); the executor is now unusable"
                    ),
                )
                .poisons("a failed call to briq left an Execution's outcome unknown"),
            };
            return (verdict, None);
        }
    };
    let result = refuse_oversized_answer(result);
    let error_text = |fallback: &str| {
        result
            .error
            .as_ref()
            .map(|e| format!("{}: {}", e.name, e.message))
            .unwrap_or_else(|| fallback.to_owned())
    };
    let verdict = match result.status {
        RunStatus::Ok => Verdict::new(Completed, "the code ran"),
        RunStatus::FinalAnswer => Verdict::new(FinalAnswer, "the code returned a final answer"),
        RunStatus::Error => Verdict::new(CodeError, error_text("the code raised an error")),
        RunStatus::FinalAnswerRejected => Verdict::new(
            FinalAnswerRejected,
            error_text("the final answer was rejected"),
        ),
        RunStatus::Timeout => Verdict::new(
            Timeout,
            format!(
                "the code ran past its {timeout}s deadline; the kernel was interrupted and the executor is now unusable"
            ),
        )
        .poisons(format!("an Execution ran past its {timeout}s deadline")),
        RunStatus::KernelLost => Verdict::new(
            KernelLost,
            "the kernel is gone (the sandbox slept or restarted) and its Python state with it; the executor is now unusable",
        )
        .poisons("its kernel was lost (the sandbox slept or restarted)"),
        // The bridge's message says whether it ever ran, and whether the kernel kept its state.
        RunStatus::Cancelled => Verdict::new(Cancelled, error_text("cancelled")),
        // The session turns a run's not_accepted into a malformed answer; one that got here
        // anyway is treated the same way.
        RunStatus::NotAccepted => Verdict::new(
            MalformedResponse,
            "malformed answer from the bridge (a run answered not_accepted); the executor is now unusable",
        )
        .poisons("the bridge answered malformed output"),
    };
    (verdict, Some(result))
}

/// A final answer too large to store whole ([`budget::MAX_FINAL_ANSWER_BYTES`] as the API
/// server encodes it) is refused, as the bridge refuses one over its own budget: a cut answer
/// would not decode.
fn refuse_oversized_answer(mut result: RunResult) -> RunResult {
    let Some(size) = result
        .final_answer
        .as_deref()
        .map(budget::encoded_len)
        .filter(|size| *size > budget::MAX_FINAL_ANSWER_BYTES)
    else {
        return result;
    };
    result.status = RunStatus::FinalAnswerRejected;
    result.final_answer = None;
    result.error = Some(CodeError {
        name: "FinalAnswerRejected".into(),
        message: format!(
            "the final answer takes {size} bytes as stored, over its {}-byte budget",
            budget::MAX_FINAL_ANSWER_BYTES
        ),
        traceback: String::new(),
    });
    result
}

/// The final status of an Execution: `base`'s attempt and start, the verdict, and the result
/// if the bridge gave one, cut to [`MAX_STATUS_BYTES`] as the API server stores it.
pub fn final_status(
    base: &ExecutionStatus,
    generation: Option<i64>,
    verdict: &Verdict,
    result: Option<RunResult>,
    now: Time,
) -> ExecutionStatus {
    let succeeded = desired(
        SUCCEEDED,
        if verdict.succeeded() { "True" } else { "False" },
        verdict.reason.as_str(),
        verdict.message.clone(),
    );
    let mut status = ExecutionStatus {
        observed_generation: generation,
        conditions: conditions::merge(&base.conditions, &[succeeded], generation),
        attempt_id: base.attempt_id.clone(),
        start_time: base.start_time.clone(),
        completion_time: Some(now),
        ..Default::default()
    };
    if let Some(result) = result {
        status.logs = Some(result.logs).filter(|logs| !logs.is_empty());
        status.output = result.output;
        status.is_final_answer = result.status == RunStatus::FinalAnswer;
        status.final_answer = result.final_answer;
        status.truncated = result.truncated;
        status.display_outputs_dropped = Some(result.display_dropped).filter(|n| *n > 0);
        status.duration_millis = Some(result.duration_ms);
        status.error = result.error.map(|e| ExecutionError {
            name: e.name,
            message: e.message,
            traceback: Some(e.traceback).filter(|t| !t.is_empty()),
        });
    } else if !verdict.succeeded() {
        status.error = Some(ExecutionError {
            name: verdict.reason.as_str().to_owned(),
            message: verdict.message.clone(),
            traceback: None,
        });
    }
    budget::fit(status, MAX_STATUS_BYTES)
}

/// Which finished Executions to delete so that `limit` remain: the oldest first.
pub fn beyond_history<T>(mut finished: Vec<(RunOrder, T)>, limit: usize) -> Vec<T> {
    finished.sort_by(|a, b| a.0.cmp(&b.0));
    let excess = finished.len().saturating_sub(limit);
    finished.into_iter().take(excess).map(|(_, t)| t).collect()
}

impl<S> Context<S> {
    pub(super) fn finish(&self, execution: &Execution) {
        if let Some(uid) = execution.uid() {
            self.kept.finished(&uid);
        }
        self.wake_next(execution);
        self.wake_waiting_for_capacity(execution);
    }
}

/// How an Execution ends, as data: what [`Actor::end`] does, in this order and nothing else.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    /// The executor marked unusable first (this process's memory, then its status), before
    /// anyone else can take the next turn.
    pub mark_unusable: Option<String>,
    /// One more Execution counted on the executor (its status written in batches): the code
    /// went to its sandbox, or was meant to.
    pub count: bool,
    /// The final status: one server-side apply, kept for the next reconcile when it fails.
    /// Once written, the next Execution of the executor and those waiting for a place in the
    /// namespace are woken.
    pub status: ExecutionStatus,
    /// Then the oldest finished Executions beyond the executor's `executionHistoryLimit` are
    /// deleted.
    pub prune_history: bool,
}

/// How an Execution with status `base` ends with `verdict` (and the bridge's `result`) at
/// `now`; `ran`: after its code went to the sandbox (or was meant to), on an executor keeping
/// `history_limit` finished Executions.
pub fn ending(
    base: &ExecutionStatus,
    generation: Option<i64>,
    verdict: &Verdict,
    result: Option<RunResult>,
    now: Time,
    ran: bool,
    history_limit: Option<u32>,
) -> Ending {
    Ending {
        mark_unusable: verdict.unusable.clone(),
        count: ran,
        status: final_status(base, generation, verdict, result, now),
        prune_history: ran && history_limit.is_some(),
    }
}

impl<'a, S: SandboxApi> Actor<'a, S> {
    /// Ends the Execution with `verdict` before its code went anywhere (refused, cancelled, its
    /// sandbox not its executor's, interrupted): [`ending`], applied by [`Actor::end`].
    pub(super) async fn conclude(
        &self,
        executor: Option<&BriqExecutor>,
        base: ExecutionStatus,
        verdict: &Verdict,
    ) -> Result<Action> {
        let generation = self.execution.metadata.generation;
        let mut ending = ending(
            &base,
            generation,
            verdict,
            None,
            conditions::now(),
            false,
            None,
        );
        if executor.is_none() {
            // Nothing to mark: the verdict is about the executor as it is (gone, unusable).
            ending.mark_unusable = None;
        }
        self.end(executor, verdict, ending).await
    }

    /// Ends the Execution after a run (or its recovery, or its cancel) in `executor`.
    pub(super) async fn finish_run(
        &self,
        executor: &BriqExecutor,
        base: ExecutionStatus,
        verdict: &Verdict,
        result: Option<crate::bridge::RunResult>,
    ) -> Result<Action> {
        info!(reason = %verdict.reason, "execution finished");
        let ending = ending(
            &base,
            self.execution.metadata.generation,
            verdict,
            result,
            conditions::now(),
            true,
            executor.spec.execution_history_limit,
        );
        self.end(Some(executor), verdict, ending).await
    }

    /// Applies `ending` (see [`Ending`]); `verdict` only labels the metric.
    pub(super) async fn end(
        &self,
        executor: Option<&BriqExecutor>,
        verdict: &Verdict,
        ending: Ending,
    ) -> Result<Action> {
        if let (Some(why), Some(executor)) = (&ending.mark_unusable, executor) {
            if let Some(uid) = executor.uid() {
                self.ctx.kept.made_unusable(&uid);
            }
            mark_unusable(&self.ctx.shared, executor, why).await?;
        }
        if let (true, Some(executor)) = (ending.count, executor) {
            let recorded = executor
                .status
                .as_ref()
                .and_then(|s| s.executions_total)
                .unwrap_or(0);
            self.ctx.kept.count_execution(
                &executor.uid().unwrap_or_default(),
                &self.namespace,
                &executor.name_any(),
                recorded,
            );
        }
        let status = ending.status;
        let (written, writing) = traces::noted(self.write(&status)).await;
        self.note(|t| t.result_written = writing);
        if let Err(error) = written {
            // Keep the result: the retry writes it rather than calling the Execution interrupted.
            if let Some(uid) = self.execution.uid() {
                self.ctx.kept.keep_unwritten(&uid, status);
            }
            return Err(error);
        }
        self.ctx.shared.metrics.execution_finished(
            verdict.reason,
            status.start_time.as_ref(),
            status.completion_time.as_ref(),
        );
        self.ctx.finish(self.execution);
        if let (true, Some(executor)) = (ending.prune_history, executor) {
            self.prune(executor).await;
        }
        Ok(Action::await_change())
    }

    /// Deletes the oldest finished Executions beyond the executor's `executionHistoryLimit`.
    async fn prune(&self, executor: &BriqExecutor) {
        let Some(limit) = executor.spec.execution_history_limit else {
            return;
        };
        let done = of_executor(&self.ctx.store, &self.namespace, self.executor_name())
            .filter(|e| e.metadata.deletion_timestamp.is_none() && self.ctx.is_finished(e))
            .map(|e| (e.run_order(), e.name_any()))
            .collect();
        for old in beyond_history(done, limit as usize) {
            if let Err(error) = self.api.delete(&old, &DeleteParams::default()).await {
                warn!(%error, execution = %old, "could not prune an old Execution");
            }
        }
    }
}

#[cfg(test)]
mod tests;
