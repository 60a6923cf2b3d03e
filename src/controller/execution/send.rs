//! Sending the code, at most once. First the executor's sandbox (for the run, the journal's
//! recall and the cancel alike): its API key, and briq's word that the sandbox the executor's
//! (tenant-writable) status names is its own. Then the run: its deadline, the attempt id the
//! sandbox's journal runs once, `Running` recorded before or beside the exec, the answer read
//! ([`ran`]: judged, or left to the journal when briq did not say whether the code ran), and
//! the run's trace.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::{SignedDuration, Timestamp},
};
use kube::{ResourceExt, runtime::controller::Action};
use tracing::{info, warn};

use super::{
    actor::Actor,
    end::{Failure, Verdict, failure, judge},
    trace,
};
use crate::{
    bridge::{
        RunResult,
        session::{CallError, Session},
    },
    briq::SandboxApi,
    controller::{
        class,
        context::{Error, Result},
        credentials::{api_key, made_under},
        ownership::{
            Ownership, claimed_member, expected_sandbox_name, not_owned_message, ownership,
        },
        recheck::{self, ATTEMPT_GRACE, CONFLICT_RECHECK, RUNNING_WRITE_AFTER, Wait},
        requeue::waited,
        status::{apply_status_at, is_conflict},
    },
    crd::{
        BriqExecutor, EXECUTOR_MANAGER, Execution, ExecutionStatus, MAX_EXECUTION_TIMEOUT_SECONDS,
        conditions::{self, SUCCEEDED, desired},
        reasons::ExecutionReason,
    },
    traces,
};

/// What to do when briq says whose the sandbox an executor's status names is: `None`, run.
pub fn ownership_verdict(sandbox: &str, ownership: &Ownership) -> Option<Verdict> {
    use ExecutionReason::*;
    match ownership {
        Ownership::Owned => None,
        Ownership::Foreign => Some(Verdict::new(
            SandboxNotOwned,
            format!("{}; the code was not sent", not_owned_message(sandbox)),
        )),
        Ownership::Gone => Some(
            Verdict::new(
                KernelLost,
                format!("sandbox {sandbox} no longer exists; the executor is now unusable"),
            )
            .poisons("its sandbox no longer exists"),
        ),
    }
}

/// Whether an Execution may use its executor's sandbox now.
pub(super) enum Access {
    Granted(crate::briq::ApiKey, String),
    Denied(Action),
}

impl<'a, S: SandboxApi> Actor<'a, S> {
    pub(super) fn session<'s>(
        &'s self,
        key: &'s crate::briq::ApiKey,
        sandbox_id: &'s str,
    ) -> Session<'s, S> {
        Session::new(&self.ctx.shared.sandboxes, key, sandbox_id)
    }

    /// The executor's key and sandbox, once briq confirms the sandbox is the executor's own,
    /// for a step that asks it (the run, the journal's recall, the cancel); or what was done
    /// instead: waiting for a key; the Execution concluded, the executor poisoned when its
    /// sandbox is not its own; or, with an attempt recorded in `base`, waiting for briq when it
    /// could not be asked whose the sandbox is (nor could its journal be). Noted in the trace.
    pub(super) async fn sandbox(
        &self,
        executor: &BriqExecutor,
        base: &ExecutionStatus,
    ) -> Result<Access> {
        let (access, checked) = traces::noted(self.access(executor)).await;
        self.note(|t| t.sandbox_check = checked);
        match access {
            Err(Error::Briq(error)) if base.attempt_id.is_some() => {
                // Boxed: the wait (and the end it may reach) would otherwise sit inside every
                // step's future that reaches the sandbox, and a debug build's poll frames copy it.
                let waited = Box::pin(self.await_briq(executor, base.clone(), error.into()));
                Ok(Access::Denied(waited.await?))
            }
            access => access,
        }
    }

    async fn access(&self, executor: &BriqExecutor) -> Result<Access> {
        let key = match api_key(&self.ctx.shared, executor).await {
            Ok(key) => key,
            Err(Error::ApiKey(message)) => {
                self.wait(ExecutionReason::ExecutorNotReady, message)
                    .await?;
                let waited = waited(self.execution);
                let recheck = recheck::recheck(Wait::KeySecret { waited });
                return Ok(Access::Denied(Action::requeue(recheck)));
            }
            Err(error) => return Err(error),
        };
        let sandbox_id = executor
            .status
            .as_ref()
            .and_then(|s| s.sandbox_id.clone())
            .ok_or_else(|| {
                Error::Invariant(format!(
                    "BriqExecutor {} is ready without a sandbox",
                    self.executor_name()
                ))
            })?;
        if let Some(verdict) = self.verify_ownership(executor, &key, &sandbox_id).await? {
            let action = self
                .conclude(Some(executor), self.status(), &verdict)
                .await?;
            return Ok(Access::Denied(action));
        }
        Ok(Access::Granted(key, sandbox_id))
    }

    /// Why the code must not go to `sandbox`, if it must not: the executor's status names it, and
    /// status is tenant-writable, so briq confirms it is the executor's own (once per executor
    /// and sandbox; this process remembers the answer).
    async fn verify_ownership(
        &self,
        executor: &BriqExecutor,
        key: &crate::briq::ApiKey,
        sandbox: &str,
    ) -> Result<Option<Verdict>> {
        let uid = executor.uid().unwrap_or_default();
        if self.ctx.kept.owns(&uid, sandbox) {
            return Ok(None);
        }
        let found = self.ctx.shared.sandboxes.get_sandbox(key, sandbox).await;
        let member = claimed_member(executor, &self.ctx.executors, &self.ctx.shared.client).await?;
        let expected = expected_sandbox_name(executor, member.as_ref());
        let Some(ownership) = ownership(&expected, &found) else {
            return Err(found.expect_err("briq did not say").into());
        };
        if ownership == Ownership::Owned {
            self.ctx.kept.confirmed_owner(&uid, sandbox);
        }
        Ok(ownership_verdict(sandbox, &ownership))
    }
}

/// One send of an Execution's code, as data: what [`Actor::run`] does with the sandbox, in
/// this order and nothing else, before its answer is read ([`ran`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Send {
    /// The attempt id ([`attempt_id`]): the sandbox's journal runs it once, whoever sends it.
    pub attempt: String,
    /// The status that records the attempt as running.
    pub running: ExecutionStatus,
    /// How `running` is recorded around the exec.
    pub recording: Recording,
    /// The run's deadline in seconds ([`timeout_seconds`]).
    pub timeout: u32,
}

/// How a run records its attempt around the send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recording {
    /// Before the send, conditionally (at the version decided on): the write brings back the
    /// code the cache does not hold, and a conflict decides again.
    First,
    /// `code` (at hand) goes at once, and `running` is written beside the exec once the action
    /// outlasts `after`: an action that ends sooner has it folded into its result write.
    Beside { code: Arc<str>, after: Duration },
}

/// The send of Execution `uid` (status `current`, at `generation`) to `executor`, its code at
/// hand or not, with a deadline of `timeout` seconds, at `now`.
pub fn send(
    uid: &str,
    current: &ExecutionStatus,
    generation: Option<i64>,
    executor: &str,
    code: Option<Arc<str>>,
    timeout: u32,
    now: Time,
) -> Send {
    let attempt = attempt_id(uid);
    Send {
        running: running_status(current, generation, executor, attempt.clone(), now),
        attempt,
        recording: match code {
            Some(code) => Recording::Beside {
                code,
                after: RUNNING_WRITE_AFTER,
            },
            None => Recording::First,
        },
        timeout,
    }
}

/// The deadline of one run: the Execution's own, else the executor's, within 1 to 40 s and
/// never beyond its class's maximum (`class_max`).
pub fn timeout_seconds(
    execution: Option<u32>,
    executor_default: u32,
    class_max: Option<u32>,
) -> u32 {
    let max = class_max.unwrap_or(MAX_EXECUTION_TIMEOUT_SECONDS);
    execution
        .unwrap_or(executor_default)
        .clamp(1, max.clamp(1, MAX_EXECUTION_TIMEOUT_SECONDS))
}

/// The attempt id of the Execution with `uid`: the same for every delivery of it — by this
/// operator after a restart, by a second one racing — so the sandbox's journal, which accepts an
/// attempt id once, runs it at most once whatever sends it. Its uid's 32 hex digits (the
/// journal takes 16 to 64 lowercase hex digits); a uid of another shape is hashed to them.
pub fn attempt_id(uid: &str) -> String {
    let digits: String = uid
        .chars()
        .filter(|c| *c != '-')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if (16..=64).contains(&digits.len()) && digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return digits;
    }
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(uid.as_bytes());
    hash[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// An attempt recorded in an Execution's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    pub started: Option<Timestamp>,
    /// The run's deadline in seconds ([`timeout_seconds`](super::send::timeout_seconds)).
    pub timeout_seconds: u32,
}

impl Attempt {
    /// How long its runner may still report a result; `None` once nobody can.
    pub fn may_report_for(&self, now: Timestamp) -> Option<Duration> {
        let timeout = SignedDuration::from_secs(self.timeout_seconds.into());
        let until = self
            .started?
            .checked_add(timeout)
            .ok()?
            .checked_add(ATTEMPT_GRACE)
            .ok()?;
        let left = now.duration_until(until);
        left.is_positive().then(|| left.unsigned_abs())
    }
}

/// The status recorded before the code is sent: `attempt` identifies the one try.
pub fn running_status(
    current: &ExecutionStatus,
    generation: Option<i64>,
    executor: &str,
    attempt: String,
    now: Time,
) -> ExecutionStatus {
    let running = desired(
        SUCCEEDED,
        "Unknown",
        ExecutionReason::Running.as_str(),
        format!("running in BriqExecutor {executor}"),
    );
    ExecutionStatus {
        observed_generation: generation,
        conditions: conditions::merge(&current.conditions, &[running], generation),
        attempt_id: Some(attempt),
        start_time: Some(now),
        ..Default::default()
    }
}

/// A run's answer judged, or the error that left its outcome for the sandbox's journal to tell.
pub type Judged = (Verdict, Option<RunResult>);

/// Maps what a run answered to its outcome, unless briq's answer leaves whether the code ran
/// unknown for now (`Err`): a 5xx, a timeout or a lost connection after sending, a request
/// refused for a while (429) or never sent, a result that could not be read. The sandbox's
/// journal knows what became of the attempt; it is asked once briq answers again
/// ([`recovered`](super::recover::recovered)), which beats calling the executor unusable on a
/// guess.
/// A missing sandbox (the kernel is lost) and a request briq refused for good (it did not run,
/// and would be refused again) are judged at once.
pub fn ran(outcome: Result<RunResult, CallError>, timeout: u32) -> Result<Judged, CallError> {
    match outcome {
        Err(error) if failure(&error) == Failure::BriqUnanswered => Err(error),
        outcome => Ok(judge(outcome, timeout)),
    }
}

impl<'a, S: SandboxApi> Actor<'a, S> {
    /// Sends the code, at most once, as [`send`] says: its attempt id derives from the
    /// Execution ([`attempt_id`]), and the sandbox's journal runs an attempt id once, whoever
    /// delivers it and however often. With its code at hand (kept in the bookkeeping) the code
    /// goes at once, and `Running` is written beside the exec
    /// once the action outlasts [`RUNNING_WRITE_AFTER`] (an action that ends first has it folded
    /// into its result: one write); otherwise the `Running` write comes first and brings the
    /// code back. `version` is the Execution's resourceVersion this run was decided on:
    /// `Running` is recorded only at that version. The end is [`Actor::finish_run`]'s.
    pub(super) async fn run(&self, executor: &BriqExecutor, version: &str) -> Result<Action> {
        // The awaits that reach briq are boxed: a debug build's poll frame holds every inline
        // one at once (test threads have 2 MiB of stack).
        let (key, sandbox_id) = match Box::pin(self.sandbox(executor, &self.status())).await? {
            Access::Granted(key, sandbox_id) => (key, sandbox_id),
            Access::Denied(action) => return Ok(action),
        };
        let uid = self.execution.uid().unwrap_or_default();
        let Send {
            attempt,
            running,
            recording,
            timeout,
        } = send(
            &uid,
            &self.status(),
            self.execution.metadata.generation,
            self.executor_name(),
            self.ctx.kept.code(&uid),
            self.timeout_seconds(executor),
            conditions::now(),
        );
        let deadline = Duration::from_secs(timeout.into());
        let session = self.session(&key, &sandbox_id);
        let (outcome, sent) = match recording {
            Recording::Beside { code, after } => {
                self.ctx.kept.forget_waiting(&uid);
                let exec = self.cancellable(
                    traces::noted(session.run(&attempt, &code, deadline)),
                    &session,
                    &attempt,
                );
                let exec = Box::pin(self.record_beside(exec, &running, version, after));
                self.slot.without(exec).await
            }
            Recording::First => {
                let Some(recorded) = Box::pin(self.record_first(&running, version)).await? else {
                    return Ok(Action::requeue(CONFLICT_RECHECK));
                };
                let exec = self.cancellable(
                    traces::noted(session.run(&attempt, &recorded.spec.code, deadline)),
                    &session,
                    &attempt,
                );
                self.slot.without(Box::pin(exec)).await
            }
        };
        self.note(|t| {
            t.code = sent;
            t.kernel = outcome
                .as_ref()
                .ok()
                .map(|result| Duration::from_millis(result.duration_ms));
        });
        let (verdict, result) = match ran(outcome, timeout) {
            Ok(judged) => judged,
            Err(unknown) => return Box::pin(self.await_briq(executor, running, unknown)).await,
        };
        let action = Box::pin(self.finish_run(executor, running, &verdict, result)).await;
        if action.is_ok() {
            self.emit_trace(&attempt, &verdict);
        }
        action
    }

    /// Records `running` before the code goes (conditionally, at `version`): the recorded
    /// Execution (the whole object, at the version decided on plus this status; the spec is
    /// immutable) brings the code, which the cache does not hold. `None` when the Execution
    /// changed since the decision (another operator recorded its attempt, or anyone wrote it):
    /// it is decided again on what it is now.
    async fn record_first(
        &self,
        running: &ExecutionStatus,
        version: &str,
    ) -> Result<Option<Execution>> {
        match self.record_running(running, version).await {
            Ok(recorded) => {
                self.ctx
                    .kept
                    .forget_waiting(&recorded.uid().unwrap_or_default());
                Ok(Some(recorded))
            }
            Err(error) if is_conflict(&error) => {
                info!("the Execution changed before its attempt was recorded; deciding again");
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// Awaits `exec`, the code already sent, and records `running` beside it (conditionally,
    /// at `version`) once the action outlasts `after` ([`Recording::Beside`]); an action that
    /// ends first has it folded into its result write. The record informs, it does not guard: the
    /// journal runs the attempt once, so a write that fails or finds the Execution changed (a
    /// second operator recorded the same attempt) is only logged, and the result is written in
    /// any case.
    async fn record_beside<F, T>(
        &self,
        exec: F,
        running: &ExecutionStatus,
        version: &str,
        after: Duration,
    ) -> T
    where
        F: Future<Output = T>,
    {
        let mut exec = std::pin::pin!(exec);
        tokio::select! {
            done = &mut exec => return done,
            () = tokio::time::sleep(after) => {}
        }
        let (done, recorded) = tokio::join!(exec, self.record_running(running, version));
        match recorded {
            Ok(_) => {}
            Err(error) if is_conflict(&error) => {
                info!(
                    "the Execution changed before its attempt was recorded; the journal runs it once"
                )
            }
            Err(error) => {
                warn!(%error, "recording the attempt beside its run failed; its result is written next")
            }
        }
        done
    }

    /// Writes `running`, only if the Execution is still at `version`; noted in its trace.
    async fn record_running(&self, running: &ExecutionStatus, version: &str) -> Result<Execution> {
        let status = serde_json::to_value(running).expect("status serializes");
        let (recorded, recording) = traces::noted(apply_status_at(
            &self.api,
            self.execution,
            EXECUTOR_MANAGER,
            status,
            Some(version),
        ))
        .await;
        self.note(|t| t.attempt_recorded = recording);
        recorded
    }

    /// The deadline of this Execution's code in `executor`, in seconds.
    /// The run's deadline, under the class the executor was made under.
    pub(super) fn timeout_seconds(&self, executor: &BriqExecutor) -> u32 {
        let class = made_under(&self.ctx.shared, executor);
        let class = class.as_ref().map(|c| &c.spec);
        timeout_seconds(
            self.execution.spec.timeout_seconds,
            class::effective(&executor.spec, class).execution_timeout_seconds,
            class.and_then(|c| c.max_execution_timeout_seconds),
        )
    }

    /// Exports the trace of this run, under the client's span when it named one.
    fn emit_trace(&self, attempt: &str, verdict: &Verdict) {
        if !traces::enabled() {
            return;
        }
        let name = self.execution.name_any();
        let subject = trace::Subject {
            namespace: &self.namespace,
            execution: &name,
            executor: self.executor_name(),
            attempt,
            created: self
                .execution
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or_else(SystemTime::now, |t| t.0.into()),
        };
        let timeline = self.timeline.lock().unwrap_or_else(|e| e.into_inner());
        let spans = trace::spans(
            &subject,
            &timeline,
            verdict.reason,
            &verdict.message,
            SystemTime::now(),
        );
        let parent = self
            .execution
            .annotations()
            .get(traces::TRACEPARENT_ANNOTATION)
            .map(String::as_str);
        traces::emit(parent, &spans);
    }
}

#[cfg(test)]
mod tests;
