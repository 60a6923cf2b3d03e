//! What an `Execution` needs next, decided from what was observed: pure functions, tested with
//! exact expected outputs. The reconciler ([`super`]) observes and acts.

use std::time::Duration;

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::{SignedDuration, Timestamp},
};

use crate::{
    bridge::session::CallError,
    bridge::{CodeError, RunResult, RunStatus},
    briq::{ErrorClass, ExecOutcome},
    controller::{
        execution::budget,
        ownership::{Ownership, not_owned_message},
        recheck::{self, ATTEMPT_GRACE, Wait},
    },
    crd::{
        BriqExecutor, ExecutionError, ExecutionStatus, MAX_EXECUTION_TIMEOUT_SECONDS,
        MAX_STATUS_BYTES, POOL_MEMBER_ANNOTATION,
        conditions::{self, READY, STALLED, SUCCEEDED, desired},
        reasons::{ExecutionReason, Phase},
    },
};

/// How long after its creationTimestamp (whole seconds) the head of a burst of Executions
/// created in one second waits before it runs: siblings of that second may still be arriving.
pub const BURST_SETTLE: SignedDuration = SignedDuration::from_secs(2);

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

    fn poisons(mut self, why: impl Into<String>) -> Verdict {
        self.unusable = Some(why.into());
        self
    }

    pub fn succeeded(&self) -> bool {
        self.reason.phase() == Phase::Succeeded
    }
}

/// Why an Execution cannot run in its executor now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Never: the Execution fails.
    Fail(Verdict),
    /// Not yet: the Execution waits, with this reason and message, until something it waits on
    /// changes (see [`wake`]), or at the latest `recheck` from now.
    Wait {
        reason: ExecutionReason,
        message: String,
        recheck: Duration,
    },
}

/// Where an Execution stands in its executor's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    Mine,
    Behind,
    /// First so far, but of a burst that may still grow: ask again after this long.
    Settling(Duration),
}

/// The turn of the Execution at the head of the cached queue, from the cache where it can
/// decide; `None` where only the API server can (a LIST of its executor's Executions).
///
/// The cache never invents a sibling, so when it says to wait (one before it, or a burst still
/// settling) the API server would say so too. When it says it is this one's turn, a sibling it
/// lacks was stored after this one (the watch delivers in the order the API server stored
/// them) within the same creationTimestamp second, sorting before it by name: when the cache is
/// current, that is a sibling stored within the watch's own delay (milliseconds), a window a
/// LIST would narrow but not close (one created a moment after the LIST is missed as well), and
/// a sibling created after this one started runs after it in any case. So the cache decides,
/// except when it is known to lag by more: listing, relisting, or its watch failed.
pub fn turn_from_cache(cached: Turn, cache_current: bool) -> Option<Turn> {
    match cached {
        Turn::Behind | Turn::Settling(_) => Some(cached),
        Turn::Mine if cache_current => Some(Turn::Mine),
        Turn::Mine => None,
    }
}

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
    /// its sandbox's journal what became of the attempt ([`recovered`]).
    Recover,
    Refuse(Refusal),
    /// Not at the head of its executor's queue: wait there.
    Queue,
    /// At the head of the cached queue: confirm the turn and the executor afresh, then run.
    ConfirmTurn,
}

/// What the execution controller observed of an unfinished Execution, from its caches.
pub struct Observed<'a> {
    pub executor_name: &'a str,
    pub namespace: &'a str,
    /// Whether this process holds an unwritten result for it.
    pub unwritten_result: bool,
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
    pub heads_queue: bool,
    /// Whether it already holds its place in its queues ([`ExecutionReason::holds_a_place`]):
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

/// The Executions waiting in a namespace under a class with `perNamespace.maxQueuedExecutions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceQueue {
    pub class: String,
    pub max: u32,
    /// Executions not started yet, of the namespace's executors of the class, that hold a place
    /// before this one: before it in run order, or placed already.
    pub waiting_before: usize,
}

/// An attempt recorded in an Execution's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    pub started: Option<Timestamp>,
    /// The run's deadline in seconds ([`timeout_seconds`]).
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

pub fn decide(observed: &Observed) -> Step {
    if observed.unwritten_result {
        return Step::WriteResult;
    }
    if let Some(attempt) = &observed.attempt {
        let askable = observed
            .executor
            .is_some_and(|e| unable(e, observed.executor_known_unusable).is_none());
        if askable {
            return Step::Recover;
        }
        return match attempt.may_report_for(observed.now) {
            Some(left) => Step::AwaitAttempt(left),
            None => Step::Interrupt,
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

pub use crate::crd::RunOrder;

/// Another Execution of the same executor, as the API server lists it.
#[derive(Debug, Clone)]
pub struct Sibling {
    pub uid: Option<String>,
    pub order: RunOrder,
    /// Deleted, or known (to the cache or this process) to have finished.
    pub done: bool,
}

/// Whether it is the turn of the Execution `uid` at `mine` among `siblings`, at `now`. A sibling
/// not known to be finished counts as waiting.
pub fn turn(uid: Option<&str>, mine: &RunOrder, siblings: &[Sibling], now: Timestamp) -> Turn {
    let mut burst = false;
    for sibling in siblings {
        if sibling.uid.as_deref() == uid || sibling.done {
            continue;
        }
        if sibling.order < *mine {
            return Turn::Behind;
        }
        burst |= sibling.order.0 == mine.0;
    }
    // Created in the same second as others still waiting: one that sorts before it by name
    // may still be on its way. Let the second settle first.
    let settled = mine
        .0
        .and_then(|created| created.checked_add(BURST_SETTLE).ok());
    match settled.map(|at| now.duration_until(at)) {
        Some(left) if burst && left.is_positive() => Turn::Settling(left.unsigned_abs()),
        _ => Turn::Mine,
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

/// A run's answer judged, or the error that left its outcome for the sandbox's journal to tell.
pub type Judged = (Verdict, Option<RunResult>);

/// Maps what a run answered to its outcome, unless briq's answer leaves whether the code ran
/// unknown for now (`Err`): a 5xx, a timeout or a lost connection after sending, a request
/// refused for a while (429) or never sent, a result that could not be read. The sandbox's
/// journal knows what became of the attempt; it is asked once briq answers again
/// ([`recovered`]), which beats calling the executor unusable on a guess.
pub fn ran(outcome: Result<RunResult, CallError>, timeout: u32) -> Result<Judged, CallError> {
    match outcome {
        Err(error) if for_the_journal(&error) => Err(error),
        outcome => Ok(judge(outcome, timeout)),
    }
}

/// Whether a failed run leaves its outcome to the journal: every failure of briq to answer,
/// but not a missing sandbox (the kernel is lost) nor a request briq refused for good (it did
/// not run, and would be refused again).
fn for_the_journal(error: &CallError) -> bool {
    match error {
        CallError::ResultUnreadable(_) => true,
        CallError::Briq(error) => !matches!(
            (error.exec_outcome(), error.class()),
            (_, ErrorClass::NotFound) | (ExecOutcome::NotRun, ErrorClass::Terminal)
        ),
        CallError::TimedOut(_) | CallError::Malformed(_) | CallError::UnexpectedKind(_) => false,
    }
}

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
    match answer {
        Ok(None) => Recovered::Resend,
        Ok(Some(result)) => Recovered::Judge(Box::new(judge(Ok(result), timeout))),
        // The sandbox is gone, and its kernel with it: judged as a run that found it gone.
        Err(CallError::Briq(error)) if error.class() == ErrorClass::NotFound => {
            Recovered::Judge(Box::new(judge(Err(CallError::Briq(error)), timeout)))
        }
        Err(error @ (CallError::Briq(_) | CallError::ResultUnreadable(_))) => {
            Recovered::AskAgain(error)
        }
        // No envelope (the attempt was accepted and nobody knows how it ended), or no answer
        // within the attempt's own time: it may have run.
        Err(CallError::Malformed(_) | CallError::UnexpectedKind(_) | CallError::TimedOut(_)) => {
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

/// What becomes of a finished Execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Kept: no time to live, or no completion time recorded yet.
    Keep,
    DeleteNow,
    /// Deleted after this long.
    DeleteAfter(Duration),
}

/// When a finished Execution is deleted: `ttl` seconds (its own, else its executor's) after
/// it `completed`.
pub fn expiry(completed: Option<Timestamp>, ttl: Option<u32>, now: Timestamp) -> Expiry {
    let (Some(completed), Some(ttl)) = (completed, ttl) else {
        return Expiry::Keep;
    };
    let Ok(at) = completed.checked_add(SignedDuration::from_secs(ttl.into())) else {
        return Expiry::Keep;
    };
    let left = now.duration_until(at);
    if left.is_positive() {
        Expiry::DeleteAfter(left.unsigned_abs())
    } else {
        Expiry::DeleteNow
    }
}

/// Which finished Executions to delete so that `limit` remain: the oldest first.
pub fn beyond_history<T>(mut finished: Vec<(RunOrder, T)>, limit: usize) -> Vec<T> {
    finished.sort_by(|a, b| a.0.cmp(&b.0));
    let excess = finished.len().saturating_sub(limit);
    finished.into_iter().take(excess).map(|(_, t)| t).collect()
}

#[cfg(test)]
mod tests;
