//! What a `BriqExecutor` needs next, decided from what was observed: pure functions, tested
//! with exact expected outputs. The reconciler ([`super`]) observes and acts.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::{SignedDuration, Timestamp},
};

pub use crate::controller::ownership::{Ownership, not_owned_message, ownership};
use crate::{
    bridge::session::{CallError, Provisioned, SetupError},
    briq::{self, ErrorClass, SandboxState},
    controller::{index::Activity, recheck::ATTEMPT_GRACE},
    crd::{
        BriqExecutorPoolSpec, BriqExecutorSpec, BriqExecutorStatus, CLAIMED_BY_ANNOTATION,
        CLAIMED_MEMBER_ANNOTATION, CREATE_PENDING_ANNOTATION, MAX_EXECUTION_TIMEOUT_SECONDS,
        POOL_FALLBACK_ANNOTATION, PoolRef, SANDBOX_ID_ANNOTATION,
        conditions::{self, Desired, READY, STALLED, desired},
        reasons::ExecutorReason,
    },
};

/// The next step of a live (not deleted) executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Unusable is final: report it and never touch the sandbox again (deletion destroys it).
    ReportUnusable { why: String },
    /// The executor ended for good with a sandbox to give back (setup failed, or idle for its
    /// `idleTimeoutSeconds`): destroy the sandbox if one is still recorded, and report it.
    Conclude {
        reason: ExecutorReason,
        leftover: Option<String>,
        message: String,
    },
    /// No sandbox recorded: create one; when an earlier create has no recorded outcome
    /// (`pending`), first look for the sandbox it may have made.
    CreateSandbox { pending: bool },
    /// The sandbox exists, the kernel is not ready: install the bridge and start the kernel.
    Provision { sandbox: String },
    /// Ready: check that the sandbox still runs.
    Probe { sandbox: String },
    /// No sandbox yet and a `poolRef`: take a Ready member's sandbox, or wait, or fall back to
    /// creating one.
    Claim,
    /// A pool member handed over to the executor with this uid: it runs nothing of its own and
    /// leaves the sandbox alone (the claimer probes it; deletion destroys it).
    HandedOver { claimer: String },
}

impl Step {
    /// Steps whose effect cannot be taken back (a second sandbox, a second setup) are decided
    /// on a fresh read: the watch cache can lag behind this controller's own last write.
    pub fn needs_fresh_read(&self) -> bool {
        matches!(
            self,
            Step::CreateSandbox { .. }
                | Step::Provision { .. }
                | Step::Conclude {
                    leftover: Some(_),
                    ..
                }
        )
    }
}

/// The sandbox an executor records: its status, else the annotation (which survives a lost or
/// rewritten status).
pub fn recorded_sandbox(
    status: &BriqExecutorStatus,
    annotations: &BTreeMap<String, String>,
) -> Option<String> {
    status
        .sandbox_id
        .clone()
        .or_else(|| annotations.get(SANDBOX_ID_ANNOTATION).cloned())
}

fn stalled_reason(status: &BriqExecutorStatus) -> Option<&str> {
    conditions::find(&status.conditions, STALLED)
        .filter(|condition| condition.status == "True")
        .map(|condition| condition.reason.as_str())
}

/// The final states that give the sandbox back (the others keep it until deletion).
const CONCLUSIONS: [ExecutorReason; 3] = [
    ExecutorReason::SetupFailed,
    ExecutorReason::IdleTimeout,
    ExecutorReason::PoolMismatch,
];

/// The next step of a live executor with this status and these annotations; `claims` when its
/// spec has a `poolRef`.
pub fn decide(
    status: &BriqExecutorStatus,
    annotations: &BTreeMap<String, String>,
    claims: bool,
) -> Step {
    // A handed-over member's sandbox is its claimer's, whatever its own status says (an idle
    // expiry decided just before the claim, say).
    if let Some(claimer) = annotations.get(CLAIMED_BY_ANNOTATION) {
        return Step::HandedOver {
            claimer: claimer.clone(),
        };
    }
    if status.unusable {
        let why = status.unusable_reason.as_deref().unwrap_or("unknown");
        return Step::ReportUnusable { why: why.into() };
    }
    let concluded = stalled_reason(status)
        .and_then(ExecutorReason::parse)
        .filter(|reason| CONCLUSIONS.contains(reason));
    if let Some(reason) = concluded {
        let message = conditions::find(&status.conditions, READY)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        return Step::Conclude {
            reason,
            leftover: recorded_sandbox(status, annotations),
            message,
        };
    }
    match recorded_sandbox(status, annotations) {
        None if claims && !annotations.contains_key(POOL_FALLBACK_ANNOTATION) => Step::Claim,
        None => Step::CreateSandbox {
            pending: annotations.contains_key(CREATE_PENDING_ANNOTATION),
        },
        Some(sandbox) if conditions::is_true(&status.conditions, READY) => Step::Probe { sandbox },
        Some(sandbox) => Step::Provision { sandbox },
    }
}

/// What to do with the sandboxes found under the executor's deterministic name after an
/// uncertain create: keep the oldest, destroy the rest. `None`: the create never took effect.
#[derive(Debug, PartialEq, Eq)]
pub struct Adoption {
    pub keep: String,
    pub duplicates: Vec<String>,
}

pub fn adoption(mut found: Vec<briq::Sandbox>) -> Option<Adoption> {
    found.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    let mut ids = found.into_iter().map(|sandbox| sandbox.id);
    let keep = ids.next()?;
    Some(Adoption {
        keep,
        duplicates: ids.collect(),
    })
}

/// How a provisioning attempt ended.
#[derive(Debug, PartialEq, Eq)]
pub enum SetupVerdict {
    Ready(Provisioned),
    /// The sandbox disappeared before it was ready: forget it and create another.
    SandboxGone,
    /// Nothing went wrong for good (briq unavailable, connection lost): try again later.
    Retry,
    /// Setup failed for good, with this message: destroy the sandbox.
    Failed(String),
}

pub fn setup_verdict(outcome: &Result<Provisioned, SetupError>) -> SetupVerdict {
    match outcome {
        Ok(provisioned) => SetupVerdict::Ready(*provisioned),
        Err(SetupError::Call(CallError::Briq(error))) if error.class() == ErrorClass::NotFound => {
            SetupVerdict::SandboxGone
        }
        // A bridge that answers nonsense will not answer better next time.
        Err(SetupError::Call(CallError::Malformed(_) | CallError::UnexpectedKind(_))) => {
            SetupVerdict::Failed(outcome.as_ref().unwrap_err().to_string())
        }
        Err(SetupError::Call(_)) => SetupVerdict::Retry,
        Err(SetupError::Failed { message, pip_tail }) => SetupVerdict::Failed(match pip_tail {
            Some(tail) if !tail.is_empty() => format!("{message}; pip output ends:\n{tail}"),
            _ => message.clone(),
        }),
        Err(error @ SetupError::Kernel(_)) => SetupVerdict::Failed(error.to_string()),
    }
}

/// The fields of a claimer's spec that shape its sandbox and differ from its pool's template
/// (a field left at its default takes the template's value): with any, it claims nothing.
pub fn pool_mismatch(claimer: &BriqExecutorSpec, template: &BriqExecutorSpec) -> Vec<&'static str> {
    let unset = BriqExecutorSpec::default_for_comparison();
    // (field, equal to the template's, left at its default)
    let fields = [
        (
            "image",
            claimer.image == template.image,
            claimer.image == unset.image,
        ),
        (
            "size",
            claimer.size == template.size,
            claimer.size.is_none(),
        ),
        (
            "sleep",
            claimer.sleep == template.sleep,
            claimer.sleep == unset.sleep,
        ),
        (
            "setupTimeoutSeconds",
            claimer.setup_timeout_seconds == template.setup_timeout_seconds,
            claimer.setup_timeout_seconds == unset.setup_timeout_seconds,
        ),
        (
            "packages",
            claimer.packages == template.packages,
            claimer.packages.is_none(),
        ),
        ("env", claimer.env == template.env, claimer.env.is_none()),
        // The member's sandbox was made with the template's key: no default stands in for it.
        (
            "apiKeySecretRef",
            claimer.api_key_secret_ref == template.api_key_secret_ref,
            false,
        ),
        (
            "className",
            claimer.class_name == template.class_name,
            false,
        ),
    ];
    fields
        .into_iter()
        .filter(|(_, same, left_default)| !same && !left_default)
        .map(|(name, _, _)| name)
        .collect()
}

/// What a claimer does now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimPlan {
    /// Try these Ready members, in this order, until one is won.
    Take(Vec<String>),
    /// No Ready member: wait, and look again after this long.
    Wait {
        message: String,
        recheck: std::time::Duration,
    },
    /// Stop waiting: create a sandbox of its own, for this reason.
    FallBack(String),
    /// Its spec cannot take the template's sandbox (final).
    Mismatch(String),
}

/// How long a waiting claimer waits before it looks at its pool again.
pub const CLAIM_RECHECK: std::time::Duration = std::time::Duration::from_millis(250);

pub fn claim_plan(
    claimer: &BriqExecutorSpec,
    pool_ref: &PoolRef,
    pool: Option<&BriqExecutorPoolSpec>,
    ready_members: Vec<String>,
    waited: std::time::Duration,
) -> ClaimPlan {
    let name = &pool_ref.name;
    let Some(pool) = pool else {
        return ClaimPlan::FallBack(format!("BriqExecutorPool {name} does not exist"));
    };
    let mismatch = pool_mismatch(claimer, &pool.template);
    if !mismatch.is_empty() {
        return ClaimPlan::Mismatch(format!(
            "{} differ from the template of BriqExecutorPool {name}; leave them unset or equal \
             to the template's, in a new BriqExecutor",
            mismatch.join(", ")
        ));
    }
    if !ready_members.is_empty() {
        return ClaimPlan::Take(ready_members);
    }
    if pool.replicas == 0 {
        return ClaimPlan::FallBack(format!("BriqExecutorPool {name} is scaled to zero"));
    }
    let patience = std::time::Duration::from_secs(pool_ref.cold_create_after_seconds.into());
    if waited >= patience {
        return ClaimPlan::FallBack(format!(
            "no Ready member of BriqExecutorPool {name} within {}s",
            patience.as_secs()
        ));
    }
    ClaimPlan::Wait {
        message: format!(
            "waiting for a Ready member of BriqExecutorPool {name}; creating a sandbox of its own \
             after {}s",
            patience.as_secs()
        ),
        recheck: CLAIM_RECHECK.min(patience - waited),
    }
}

/// Where a claim's knowledge of the claimer's handovers comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimLookup {
    /// The executor cache and this process's own handovers decide.
    Cache,
    /// A list of the members labelled as the claimer's: a consistent read.
    AskTheApiServer,
}

/// Whether a claim may go by the cache (`plan`, and whether an earlier write of a member to
/// this claimer ended without an answer): the API server is asked only where the cache cannot
/// decide. A write without an answer may have won, and the watch may not show it yet; a fallback
/// makes a sandbox, which cannot be taken back. Taking a member needs no read: its write is
/// conditional, and the claimer's record is too.
pub fn claim_lookup(plan: &ClaimPlan, uncertain_write: bool) -> ClaimLookup {
    if uncertain_write || matches!(plan, ClaimPlan::FallBack(_)) {
        ClaimLookup::AskTheApiServer
    } else {
        ClaimLookup::Cache
    }
}

/// What a claimer that took a member does next, from the member it records (`holds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordStep {
    /// Record the member (conditional on the claimer's version).
    Write,
    /// Recorded already: an earlier attempt's write landed.
    Recorded,
    /// It holds another member (taken by a second operator): the one just taken is too many.
    GiveBack,
    /// It is being deleted: the member it owns is deleted with it.
    LeaveToCollector,
}

pub fn record_step(holds: Option<&str>, taken: &str, deleting: bool) -> RecordStep {
    match holds {
        _ if deleting => RecordStep::LeaveToCollector,
        None => RecordStep::Write,
        Some(held) if held == taken => RecordStep::Recorded,
        Some(_) => RecordStep::GiveBack,
    }
}

/// Where a ready executor stands against its `idleTimeoutSeconds`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Idleness {
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
pub fn idleness(
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

/// The Ready event's note: which sandbox, and whether setup had to pip-install anything (a
/// prebuilt sandbox image makes no pip call; see docs/src/concepts.md, "Sandbox image").
pub fn ready_note(sandbox: &str, provisioned: Provisioned) -> String {
    let setup = if provisioned.pip_installed {
        "setup pip-installed missing requirements"
    } else {
        "setup made no pip call: every requirement was installed already"
    };
    format!("sandbox {sandbox} is ready; {setup}")
}

/// What a probe of a ready executor's sandbox found.
#[derive(Debug, PartialEq, Eq)]
pub enum ProbeVerdict {
    Running,
    /// The recorded id names another object's sandbox.
    NotOwned,
    /// The kernel and its Python state are lost: the executor becomes unusable.
    Lost(String),
    /// briq did not answer (an outage): nothing is concluded; the executor stays Ready and says
    /// that briq is unreachable until a probe gets an answer.
    Unreachable(String),
    /// briq refused to say: ask again later.
    Retry,
}

/// A ready executor's state while briq does not answer its probes: still Ready (the kernel and
/// its state are presumed intact), and `BriqReachable=False` saying why.
pub fn briq_unreachable(ready: [Desired; 2], why: &str) -> Vec<Desired> {
    let unreachable = desired(
        conditions::BRIQ_REACHABLE,
        "False",
        ExecutorReason::BriqUnreachable.as_str(),
        format!("briq did not answer the last probe ({why}); Executions wait for it"),
    );
    ready.into_iter().chain([unreachable]).collect()
}

pub fn probe_verdict(
    sandbox: &str,
    expected_name: &str,
    found: &Result<briq::Sandbox, briq::Error>,
) -> ProbeVerdict {
    match (ownership(expected_name, found), found) {
        (None, Err(error)) if error.unanswered() => ProbeVerdict::Unreachable(error.to_string()),
        (None, _) => ProbeVerdict::Retry,
        (Some(Ownership::Foreign), _) => ProbeVerdict::NotOwned,
        (Some(Ownership::Gone), _) => {
            ProbeVerdict::Lost(format!("sandbox {sandbox} no longer exists"))
        }
        (Some(Ownership::Owned), Ok(found)) if found.state == SandboxState::Running => {
            ProbeVerdict::Running
        }
        (Some(Ownership::Owned), Ok(found)) => ProbeVerdict::Lost(format!(
            "sandbox {sandbox} is {}: its kernel and Python state are lost",
            found.state
        )),
        (Some(Ownership::Owned), Err(_)) => unreachable!("an owned sandbox was found"),
    }
}

/// The sandboxes a deleted executor may own: every recorded id (destroyed only once verified as
/// its own), and those found under its own name.
#[derive(Debug, PartialEq, Eq)]
pub struct Cleanup {
    pub ids: BTreeSet<String>,
    pub look_up_by_name: bool,
}

/// `None`: the executor owns no sandbox; its finalizer can go at once.
pub fn cleanup(
    status: &BriqExecutorStatus,
    annotations: &BTreeMap<String, String>,
) -> Option<Cleanup> {
    let ids: BTreeSet<String> = status
        .sandbox_id
        .iter()
        .chain(annotations.get(SANDBOX_ID_ANNOTATION))
        .cloned()
        .collect();
    // The recorded ids are tenant-writable: the sandbox under this executor's own name is
    // destroyed too, so that a rewritten id cannot leak it.
    let look_up_by_name = annotations.contains_key(CREATE_PENDING_ANNOTATION) || !ids.is_empty();
    look_up_by_name.then_some(Cleanup {
        ids,
        look_up_by_name,
    })
}

/// How long a deleted executor waits for its unfinished Executions before it destroys its
/// sandbox regardless: the longest action, the grace an attempt gets before it counts as
/// interrupted, and a little slack for the result's write.
pub const DRAIN_LIMIT: SignedDuration =
    SignedDuration::from_secs(MAX_EXECUTION_TIMEOUT_SECONDS as i64 + ATTEMPT_GRACE.as_secs() + 5);

/// What a deleted executor does about its Executions that have not concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drain {
    /// Let them conclude first: a queued one fails at once (`ExecutorDeleted`), a running one
    /// when its action ends. Garbage collection removes the executor's Executions with it, so an
    /// Execution that had not concluded would vanish without saying why it never ran.
    Wait {
        unfinished: usize,
        left: SignedDuration,
    },
    /// Destroy the sandbox now: none is left, or they had [`DRAIN_LIMIT`].
    Destroy,
}

/// `unfinished`: the executor's Executions neither concluded nor being deleted.
pub fn drain(unfinished: usize, deleted_at: Option<Timestamp>, now: Timestamp) -> Drain {
    let waited = deleted_at
        .map_or(SignedDuration::ZERO, |at| now.duration_since(at))
        .max(SignedDuration::ZERO);
    if unfinished == 0 || waited >= DRAIN_LIMIT {
        return Drain::Destroy;
    }
    Drain::Wait {
        unfinished,
        left: DRAIN_LIMIT - waited,
    }
}

/// The executor's state as its two conditions say it.
pub fn state(
    ready: &'static str,
    stalled: bool,
    reason: ExecutorReason,
    message: impl Into<String>,
) -> [Desired; 2] {
    let message = message.into();
    let reason = reason.as_str();
    let stalled_condition = if stalled {
        desired(STALLED, "True", reason, message.clone())
    } else {
        desired(STALLED, "False", reason, "")
    };
    [desired(READY, ready, reason, message), stalled_condition]
}

/// The state of a ready executor.
/// Ready; for a claimer, where its kernel came from (kept on every later probe, so that
/// `kubectl describe` keeps saying so).
pub fn kernel_ready(handed_over: Option<&str>) -> [Desired; 2] {
    let message = match handed_over {
        Some(origin) => format!("the kernel answers: {origin}"),
        None => "the kernel answers".to_owned(),
    };
    state("True", false, ExecutorReason::KernelReady, message)
}

/// Where a claimer's sandbox came from, by its own record (`poolRef` and the
/// `claimed-member` annotation); `None` for an executor that made its own.
pub fn handover(
    pool_ref: Option<&PoolRef>,
    annotations: &BTreeMap<String, String>,
) -> Option<String> {
    let pool = pool_ref?;
    let member = annotations.get(CLAIMED_MEMBER_ANNOTATION)?;
    Some(handover_text(&pool.name, member))
}

pub fn handover_text(pool: &str, member: &str) -> String {
    format!("handed over from BriqExecutorPool {pool} (executor {member})")
}

/// The order in which a claimer tries the Ready members: the pool's order (longest Ready
/// first), started at a place that depends on the claimer's uid, so that claimers arriving
/// together mostly try different members instead of all racing for the first.
pub fn take_order<T: Clone>(members: &[T], claimer_uid: &str) -> Vec<T> {
    if members.is_empty() {
        return Vec::new();
    }
    let spread = claimer_uid.bytes().fold(0u64, |hash, byte| {
        hash.wrapping_mul(31).wrapping_add(byte.into())
    });
    let start = (spread % members.len() as u64) as usize;
    members[start..]
        .iter()
        .chain(&members[..start])
        .cloned()
        .collect()
}

/// The state of an unusable executor.
pub fn unusable_state(why: &str) -> [Desired; 2] {
    let message =
        format!("{why}. An unusable executor never runs code again: create a new BriqExecutor");
    state("False", true, ExecutorReason::Unusable, message)
}

/// Fields the executor controller owns besides the conditions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SandboxFields {
    pub id: Option<String>,
    pub created: Option<Time>,
    pub ready: Option<Time>,
}

impl SandboxFields {
    pub fn of(status: &BriqExecutorStatus) -> SandboxFields {
        SandboxFields {
            id: status.sandbox_id.clone(),
            created: status.sandbox_created_time.clone(),
            ready: status.ready_time.clone(),
        }
    }
}

/// The executor controller's part of the status, or `None` when `current` already says it.
pub fn status_update(
    current: &BriqExecutorStatus,
    generation: Option<i64>,
    state: &[Desired],
    sandbox: SandboxFields,
) -> Option<BriqExecutorStatus> {
    if conditions::satisfied(&current.conditions, state, generation)
        && current.observed_generation == generation
        && SandboxFields::of(current) == sandbox
    {
        return None;
    }
    Some(BriqExecutorStatus {
        observed_generation: generation,
        conditions: conditions::merge(&current.conditions, state, generation),
        sandbox_id: sandbox.id,
        sandbox_created_time: sandbox.created,
        ready_time: sandbox.ready,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::{bridge::Malformed, briq::api::ErrorCode};

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn status(conditions: &[Desired], sandbox: Option<&str>) -> BriqExecutorStatus {
        BriqExecutorStatus {
            conditions: conditions::merge(&[], conditions, Some(1)),
            sandbox_id: sandbox.map(str::to_owned),
            ..Default::default()
        }
    }

    fn ready() -> [Desired; 2] {
        state(
            "True",
            false,
            ExecutorReason::KernelReady,
            "the kernel answers",
        )
    }

    fn provisioning() -> [Desired; 2] {
        state("Unknown", false, ExecutorReason::Provisioning, "creating")
    }

    fn setup_failed() -> [Desired; 2] {
        state("False", true, ExecutorReason::SetupFailed, "pip failed")
    }

    fn expired() -> [Desired; 2] {
        state("False", true, ExecutorReason::IdleTimeout, "idle")
    }

    #[test]
    fn idleness_table() {
        let at = |seconds: i64| Timestamp::from_second(1_800_000_000 + seconds).unwrap();
        let time = |seconds: i64| Some(Time(at(seconds)));
        let ready_at_0 = BriqExecutorStatus {
            ready_time: time(0),
            ..status(&ready(), Some("bq_1"))
        };
        let counted_at_50 = BriqExecutorStatus {
            last_execution_time: time(50),
            ..ready_at_0.clone()
        };
        let idle = Activity::default();
        let created_at_80 = Activity {
            last: Some(at(80)),
            unfinished: 0,
        };
        let waiting = Activity {
            last: Some(at(0)),
            unfinished: 1,
        };
        let secs = std::time::Duration::from_secs;
        let expired = Idleness::Expired {
            message: "no Execution for 60s (idleTimeoutSeconds): expired, its sandbox destroyed; \
                      create a new BriqExecutor"
                .into(),
        };
        let cases = [
            ("no timeout", None, &ready_at_0, idle, 1000, Idleness::InUse),
            (
                "an Execution waits or runs, however long",
                Some(60),
                &ready_at_0,
                waiting,
                1000,
                Idleness::InUse,
            ),
            (
                "idle since ready, not long enough",
                Some(60),
                &ready_at_0,
                idle,
                45,
                Idleness::IdleFor {
                    remaining: secs(15),
                },
            ),
            (
                "idle since ready for the timeout",
                Some(60),
                &ready_at_0,
                idle,
                60,
                expired.clone(),
            ),
            (
                "the counted last Execution restarts the clock",
                Some(60),
                &counted_at_50,
                idle,
                100,
                Idleness::IdleFor {
                    remaining: secs(10),
                },
            ),
            (
                "a cached Execution later than the counts (they lag) wins",
                Some(60),
                &counted_at_50,
                created_at_80,
                130,
                Idleness::IdleFor {
                    remaining: secs(10),
                },
            ),
            (
                "every source older than the timeout",
                Some(60),
                &counted_at_50,
                created_at_80,
                140,
                expired,
            ),
            (
                "a time ahead of this clock (skew) counts as now",
                Some(60),
                &counted_at_50,
                Activity {
                    last: Some(at(500)),
                    unfinished: 0,
                },
                400,
                Idleness::IdleFor {
                    remaining: secs(60),
                },
            ),
            (
                "ready without a recorded time: the clock starts now",
                Some(60),
                &status(&ready(), Some("bq_1")),
                idle,
                1000,
                Idleness::IdleFor {
                    remaining: secs(60),
                },
            ),
        ];
        for (name, timeout, status, activity, now, expected) in cases {
            assert_eq!(
                idleness(timeout, status, activity, at(now)),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn decide_table() {
        let unusable = BriqExecutorStatus {
            unusable: true,
            unusable_reason: Some("timed out".into()),
            ..status(&ready(), Some("bq_1"))
        };
        let none = annotations(&[]);
        let pending = annotations(&[(CREATE_PENDING_ANNOTATION, "2026-12-03T00:00:00Z")]);
        let by_annotation = annotations(&[(SANDBOX_ID_ANNOTATION, "bq_a")]);
        let cases: Vec<(&str, BriqExecutorStatus, &BTreeMap<String, String>, Step)> = vec![
            (
                "unusable wins over everything",
                unusable.clone(),
                &by_annotation,
                Step::ReportUnusable {
                    why: "timed out".into(),
                },
            ),
            (
                "unusable without a reason",
                BriqExecutorStatus {
                    unusable_reason: None,
                    ..unusable
                },
                &none,
                Step::ReportUnusable {
                    why: "unknown".into(),
                },
            ),
            (
                "failed setup with a sandbox left",
                status(&setup_failed(), Some("bq_1")),
                &none,
                Step::Conclude {
                    reason: ExecutorReason::SetupFailed,
                    leftover: Some("bq_1".into()),
                    message: "pip failed".into(),
                },
            ),
            (
                "failed setup, sandbox already destroyed",
                status(&setup_failed(), None),
                &none,
                Step::Conclude {
                    reason: ExecutorReason::SetupFailed,
                    leftover: None,
                    message: "pip failed".into(),
                },
            ),
            (
                "expired with its sandbox not yet given back",
                status(&expired(), Some("bq_1")),
                &by_annotation,
                Step::Conclude {
                    reason: ExecutorReason::IdleTimeout,
                    leftover: Some("bq_1".into()),
                    message: "idle".into(),
                },
            ),
            (
                "expired, its sandbox given back",
                status(&expired(), None),
                &none,
                Step::Conclude {
                    reason: ExecutorReason::IdleTimeout,
                    leftover: None,
                    message: "idle".into(),
                },
            ),
            (
                // Stalled for a reason that keeps the sandbox: not concluded.
                "stalled on a foreign sandbox",
                status(
                    &state("False", true, ExecutorReason::SandboxNotOwned, "x"),
                    Some("bq_1"),
                ),
                &none,
                Step::Provision {
                    sandbox: "bq_1".into(),
                },
            ),
            (
                "new executor",
                BriqExecutorStatus::default(),
                &none,
                Step::CreateSandbox { pending: false },
            ),
            (
                "a create without a recorded outcome",
                status(&provisioning(), None),
                &pending,
                Step::CreateSandbox { pending: true },
            ),
            (
                "sandbox recorded in the status, kernel not ready",
                status(&provisioning(), Some("bq_1")),
                &none,
                Step::Provision {
                    sandbox: "bq_1".into(),
                },
            ),
            (
                "status lost, the annotation still names the sandbox",
                BriqExecutorStatus::default(),
                &by_annotation,
                Step::Provision {
                    sandbox: "bq_a".into(),
                },
            ),
            (
                "the status wins over the annotation",
                status(&ready(), Some("bq_1")),
                &by_annotation,
                Step::Probe {
                    sandbox: "bq_1".into(),
                },
            ),
            (
                "ready",
                status(&ready(), Some("bq_1")),
                &none,
                Step::Probe {
                    sandbox: "bq_1".into(),
                },
            ),
        ];
        for (name, status, annotations, expected) in cases {
            assert_eq!(decide(&status, annotations, false), expected, "{name}");
        }
    }

    fn spec(value: serde_json::Value) -> BriqExecutorSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn pool_mismatch_table() {
        let template = spec(serde_json::json!({
            "image": "reg/briq-sandbox:1", "sleep": "2h", "packages": ["pandas==2.2.3"],
            "apiKeySecretRef": { "name": "team-key" },
        }));
        let cases: [(&str, serde_json::Value, Vec<&str>); 8] = [
            (
                "every shaping field left unset: the template's",
                serde_json::json!({ "apiKeySecretRef": { "name": "team-key" } }),
                vec![],
            ),
            (
                "equal to the template",
                serde_json::json!({
                    "image": "reg/briq-sandbox:1", "sleep": "2h", "packages": ["pandas==2.2.3"],
                    "apiKeySecretRef": { "name": "team-key" },
                }),
                vec![],
            ),
            (
                "per-action fields are the claimer's own",
                serde_json::json!({
                    "executionTimeoutSeconds": 5, "maxQueuedExecutions": 3,
                    "idleTimeoutSeconds": 60, "apiKeySecretRef": { "name": "team-key" },
                }),
                vec![],
            ),
            (
                "another image",
                serde_json::json!({ "image": "other:1", "apiKeySecretRef": { "name": "team-key" } }),
                vec!["image"],
            ),
            (
                "other packages and size",
                serde_json::json!({
                    "packages": ["numpy"], "size": "large",
                    "apiKeySecretRef": { "name": "team-key" },
                }),
                vec!["size", "packages"],
            ),
            (
                // The member's sandbox was made with the template's key: no default stands in.
                "no key where the template has one",
                serde_json::json!({}),
                vec!["apiKeySecretRef"],
            ),
            (
                "another key",
                serde_json::json!({ "apiKeySecretRef": { "name": "mine" } }),
                vec!["apiKeySecretRef"],
            ),
            (
                "a class where the template brings its own key",
                serde_json::json!({ "className": "standard" }),
                vec!["apiKeySecretRef", "className"],
            ),
        ];
        for (name, claimer, expected) in cases {
            assert_eq!(pool_mismatch(&spec(claimer), &template), expected, "{name}");
        }
        let classed = spec(serde_json::json!({ "className": "standard" }));
        for (claimer, expected) in [
            (serde_json::json!({ "className": "standard" }), vec![]),
            (
                serde_json::json!({ "className": "premium" }),
                vec!["className"],
            ),
            // The member's sandbox was made with the class's key: no default stands in.
            (serde_json::json!({}), vec!["className"]),
        ] {
            assert_eq!(
                pool_mismatch(&spec(claimer.clone()), &classed),
                expected,
                "{claimer}"
            );
        }
    }

    #[test]
    fn claimers_spread_over_the_ready_members_and_each_tries_them_all() {
        let members = ["a", "b", "c", "d"];
        assert_eq!(take_order::<&str>(&[], "uid"), Vec::<&str>::new());
        let mut firsts = std::collections::BTreeSet::new();
        for uid in [
            "3f1c", "77aa", "b2d0", "0c9e", "e514", "5a5a", "91f3", "c0de",
        ] {
            let order = take_order(&members, uid);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, members, "{uid} tries every member once");
            let start = order[0];
            let rotation: Vec<&str> = members
                .iter()
                .cycle()
                .skip_while(|m| **m != start)
                .take(4)
                .copied()
                .collect();
            assert_eq!(
                order, rotation,
                "{uid} keeps the pool's order from where it starts"
            );
            firsts.insert(start);
        }
        assert!(
            firsts.len() >= 3,
            "claimers start at different members: {firsts:?}"
        );
    }

    #[test]
    fn a_claimer_says_where_its_kernel_came_from_on_every_probe() {
        let pool = PoolRef {
            name: "fast".into(),
            cold_create_after_seconds: 30,
        };
        let claimed = annotations(&[(CLAIMED_MEMBER_ANNOTATION, "fast-x1")]);
        let none = annotations(&[]);
        assert_eq!(
            handover(Some(&pool), &claimed).as_deref(),
            Some("handed over from BriqExecutorPool fast (executor fast-x1)")
        );
        assert_eq!(handover(Some(&pool), &none), None, "fell back to its own");
        assert_eq!(handover(None, &claimed), None, "not a claimer");
        assert_eq!(
            kernel_ready(Some(
                "handed over from BriqExecutorPool fast (executor fast-x1)"
            ))[0]
                .message,
            "the kernel answers: handed over from BriqExecutorPool fast (executor fast-x1)"
        );
        assert_eq!(kernel_ready(None)[0].message, "the kernel answers");
    }

    #[test]
    fn claim_plan_table() {
        let pool_ref = |after: u32| PoolRef {
            name: "fast".into(),
            cold_create_after_seconds: after,
        };
        let pool = |replicas: i32| BriqExecutorPoolSpec {
            replicas,
            template: spec(serde_json::json!({})),
        };
        let claimer = spec(serde_json::json!({}));
        let secs = std::time::Duration::from_secs;
        let members = || vec!["fast-a".to_string(), "fast-b".to_string()];
        let waiting = |recheck| ClaimPlan::Wait {
            message: "waiting for a Ready member of BriqExecutorPool fast; creating a sandbox \
                      of its own after 30s"
                .into(),
            recheck,
        };
        let cases = [
            (
                "ready members: take them in order",
                Some(pool(2)),
                members(),
                secs(0),
                ClaimPlan::Take(members()),
            ),
            (
                "no pool: at once",
                None,
                vec![],
                secs(0),
                ClaimPlan::FallBack("BriqExecutorPool fast does not exist".into()),
            ),
            (
                "scaled to zero: at once",
                Some(pool(0)),
                vec![],
                secs(0),
                ClaimPlan::FallBack("BriqExecutorPool fast is scaled to zero".into()),
            ),
            (
                "none ready yet: wait",
                Some(pool(2)),
                vec![],
                secs(10),
                waiting(CLAIM_RECHECK),
            ),
            (
                "the last moments of the wait are not overshot",
                Some(pool(2)),
                vec![],
                secs(30) - std::time::Duration::from_millis(100),
                waiting(std::time::Duration::from_millis(100)),
            ),
            (
                "waited long enough",
                Some(pool(2)),
                vec![],
                secs(30),
                ClaimPlan::FallBack("no Ready member of BriqExecutorPool fast within 30s".into()),
            ),
        ];
        for (name, pool, ready, waited, expected) in cases {
            assert_eq!(
                claim_plan(&claimer, &pool_ref(30), pool.as_ref(), ready, waited),
                expected,
                "{name}"
            );
        }
        let odd = spec(serde_json::json!({ "image": "other:1" }));
        assert_eq!(
            claim_plan(&odd, &pool_ref(30), Some(&pool(2)), members(), secs(0)),
            ClaimPlan::Mismatch(
                "image differ from the template of BriqExecutorPool fast; leave them unset or \
                 equal to the template's, in a new BriqExecutor"
                    .into()
            ),
            "a mismatch wins over ready members"
        );
    }

    #[test]
    fn a_claim_asks_the_api_server_only_where_the_cache_cannot_decide() {
        let take = ClaimPlan::Take(vec!["m".into()]);
        let wait = ClaimPlan::Wait {
            message: "w".into(),
            recheck: CLAIM_RECHECK,
        };
        let fall_back = ClaimPlan::FallBack("gone".into());
        let mismatch = ClaimPlan::Mismatch("image".into());
        let cases = [
            (
                "taking a member: conditional writes",
                &take,
                false,
                ClaimLookup::Cache,
            ),
            ("waiting", &wait, false, ClaimLookup::Cache),
            ("a mismatch", &mismatch, false, ClaimLookup::Cache),
            (
                "a fallback cannot be taken back",
                &fall_back,
                false,
                ClaimLookup::AskTheApiServer,
            ),
            (
                "a member's write ended without an answer: it may have won",
                &take,
                true,
                ClaimLookup::AskTheApiServer,
            ),
            ("even to wait", &wait, true, ClaimLookup::AskTheApiServer),
        ];
        for (name, plan, uncertain, expected) in cases {
            assert_eq!(claim_lookup(plan, uncertain), expected, "{name}");
        }
    }

    #[test]
    fn record_step_table() {
        let cases = [
            (
                "nothing recorded: record it",
                None,
                "m1",
                false,
                RecordStep::Write,
            ),
            (
                "an earlier attempt's write landed",
                Some("m1"),
                "m1",
                false,
                RecordStep::Recorded,
            ),
            (
                "a second operator's member is recorded",
                Some("m0"),
                "m1",
                false,
                RecordStep::GiveBack,
            ),
            (
                "deleted before the record",
                None,
                "m1",
                true,
                RecordStep::LeaveToCollector,
            ),
            (
                "deleted holding another",
                Some("m0"),
                "m1",
                true,
                RecordStep::LeaveToCollector,
            ),
        ];
        for (name, holds, taken, deleting, expected) in cases {
            assert_eq!(record_step(holds, taken, deleting), expected, "{name}");
        }
    }

    #[test]
    fn decide_table_for_pools() {
        let none = annotations(&[]);
        let fallen_back = annotations(&[(POOL_FALLBACK_ANNOTATION, "pool gone")]);
        let claimed = annotations(&[(CLAIMED_BY_ANNOTATION, "uid-c")]);
        let handed_over = Step::HandedOver {
            claimer: "uid-c".into(),
        };
        let unusable = BriqExecutorStatus {
            unusable: true,
            ..status(&ready(), Some("bq_1"))
        };
        let cases = [
            (
                "a claimer without a sandbox claims",
                BriqExecutorStatus::default(),
                &none,
                true,
                Step::Claim,
            ),
            (
                "a claimer that fell back creates its own",
                BriqExecutorStatus::default(),
                &fallen_back,
                true,
                Step::CreateSandbox { pending: false },
            ),
            (
                "a claimer with its handed-over sandbox probes it",
                status(&ready(), Some("bq_1")),
                &none,
                true,
                Step::Probe {
                    sandbox: "bq_1".into(),
                },
            ),
            (
                "a handed-over member leaves its sandbox to the claimer",
                status(&ready(), Some("bq_1")),
                &claimed,
                false,
                handed_over.clone(),
            ),
            (
                "even when an expiry was decided just before the claim",
                status(&expired(), Some("bq_1")),
                &claimed,
                false,
                handed_over.clone(),
            ),
            (
                "or it was marked unusable",
                unusable,
                &claimed,
                false,
                handed_over,
            ),
            (
                "a mismatched claimer is concluded",
                status(
                    &state("False", true, ExecutorReason::PoolMismatch, "image differs"),
                    None,
                ),
                &none,
                true,
                Step::Conclude {
                    reason: ExecutorReason::PoolMismatch,
                    leftover: None,
                    message: "image differs".into(),
                },
            ),
        ];
        for (name, status, annotations, claims, expected) in cases {
            assert_eq!(decide(&status, annotations, claims), expected, "{name}");
        }
    }

    #[test]
    fn only_irreversible_steps_need_a_fresh_read() {
        let table = [
            (Step::ReportUnusable { why: "x".into() }, false),
            (
                Step::Conclude {
                    reason: ExecutorReason::SetupFailed,
                    leftover: None,
                    message: "x".into(),
                },
                false,
            ),
            (Step::CreateSandbox { pending: false }, true),
            (Step::CreateSandbox { pending: true }, true),
            (
                Step::Provision {
                    sandbox: "x".into(),
                },
                true,
            ),
            (
                Step::Probe {
                    sandbox: "x".into(),
                },
                false,
            ),
            // Its writes are conditional; where the cache cannot decide, see claim_lookup.
            (Step::Claim, false),
        ];
        for (step, fresh) in table {
            assert_eq!(step.needs_fresh_read(), fresh, "{step:?}");
        }
    }

    fn sandbox(id: &str, created: &str) -> briq::Sandbox {
        briq::Sandbox {
            id: id.into(),
            name: "briq-x".into(),
            state: SandboxState::Running,
            image: "python:3.12-slim".into(),
            size: None,
            sleep: "30m".into(),
            created_at: created.parse::<Timestamp>().unwrap(),
        }
    }

    #[test]
    fn adoption_keeps_the_oldest_and_destroys_the_rest() {
        assert_eq!(adoption(vec![]), None);
        assert_eq!(
            adoption(vec![sandbox("bq_b", "2026-12-03T00:00:02Z")]),
            Some(Adoption {
                keep: "bq_b".into(),
                duplicates: vec![]
            })
        );
        assert_eq!(
            adoption(vec![
                sandbox("bq_c", "2026-12-03T00:00:03Z"),
                sandbox("bq_z", "2026-12-03T00:00:01Z"),
                sandbox("bq_a", "2026-12-03T00:00:03Z"),
            ]),
            Some(Adoption {
                keep: "bq_z".into(),
                duplicates: vec!["bq_a".into(), "bq_c".into()]
            }),
            "oldest first, ties broken by id"
        );
    }

    fn not_found() -> briq::Error {
        briq::Error::NotFound {
            message: "no such sandbox".into(),
            request_id: None,
        }
    }

    fn unavailable() -> briq::Error {
        briq::Error::Unavailable {
            status: 503,
            code: ErrorCode::Unavailable,
            message: "busy".into(),
            retry_after: None,
            request_id: None,
        }
    }

    #[test]
    fn setup_verdict_table() {
        let prebuilt = Provisioned {
            pip_installed: false,
        };
        let cases: Vec<(Result<Provisioned, SetupError>, SetupVerdict)> = vec![
            (Ok(prebuilt), SetupVerdict::Ready(prebuilt)),
            (
                Err(SetupError::Call(CallError::Briq(not_found()))),
                SetupVerdict::SandboxGone,
            ),
            (
                Err(SetupError::Call(CallError::Briq(unavailable()))),
                SetupVerdict::Retry,
            ),
            (
                Err(SetupError::Call(CallError::TimedOut(
                    std::time::Duration::from_secs(60),
                ))),
                SetupVerdict::Retry,
            ),
            // Setup is idempotent: an answer lost after it ran costs one more try, not the sandbox.
            (
                Err(SetupError::Call(CallError::ResultUnreadable(not_found()))),
                SetupVerdict::Retry,
            ),
            (
                Err(SetupError::Call(CallError::UnexpectedKind("result"))),
                SetupVerdict::Failed(
                    "the bridge answered with a result envelope where another kind was expected"
                        .into(),
                ),
            ),
            (
                Err(SetupError::Call(CallError::Malformed(Malformed::Missing))),
                SetupVerdict::Failed(Malformed::Missing.to_string()),
            ),
            (
                Err(SetupError::Failed {
                    message: "pip failed".into(),
                    pip_tail: Some("ERROR: no such package".into()),
                }),
                SetupVerdict::Failed("pip failed; pip output ends:\nERROR: no such package".into()),
            ),
            (
                Err(SetupError::Failed {
                    message: "setup did not finish within 55s".into(),
                    pip_tail: Some(String::new()),
                }),
                SetupVerdict::Failed("setup did not finish within 55s".into()),
            ),
            (
                Err(SetupError::Kernel("no ipykernel".into())),
                SetupVerdict::Failed("the kernel did not start: no ipykernel".into()),
            ),
        ];
        for (outcome, expected) in cases {
            assert_eq!(setup_verdict(&outcome), expected, "{outcome:?}");
        }
    }

    #[test]
    fn the_ready_note_says_whether_setup_ran_pip() {
        let cases = [
            (
                false,
                "sandbox bq_1 is ready; setup made no pip call: every requirement was installed \
                 already",
            ),
            (
                true,
                "sandbox bq_1 is ready; setup pip-installed missing requirements",
            ),
        ];
        for (pip_installed, expected) in cases {
            assert_eq!(ready_note("bq_1", Provisioned { pip_installed }), expected);
        }
    }

    fn found(name: &str, state: SandboxState) -> Result<briq::Sandbox, briq::Error> {
        Ok(briq::Sandbox {
            name: name.into(),
            state,
            ..sandbox("bq_1", "2026-12-03T00:00:01Z")
        })
    }

    #[test]
    fn ownership_table() {
        let cases = [
            (
                found("bqe-ns-py-12345678", SandboxState::Running),
                Some(Ownership::Owned),
            ),
            (
                found("bqe-ns-py-12345678", SandboxState::Sleeping),
                Some(Ownership::Owned),
            ),
            (
                found("bqe-other-py-87654321", SandboxState::Running),
                Some(Ownership::Foreign),
            ),
            (
                found("bqe-ns-py-1234567", SandboxState::Running),
                Some(Ownership::Foreign),
            ),
            (Err(not_found()), Some(Ownership::Gone)),
            (Err(unavailable()), None),
        ];
        for (found, expected) in cases {
            assert_eq!(
                ownership("bqe-ns-py-12345678", &found),
                expected,
                "{found:?}"
            );
        }
    }

    #[test]
    fn probe_verdict_table() {
        let mine = "bqe-ns-py-12345678";
        let cases: Vec<(Result<briq::Sandbox, briq::Error>, ProbeVerdict)> = vec![
            (found(mine, SandboxState::Running), ProbeVerdict::Running),
            (
                found(mine, SandboxState::Sleeping),
                ProbeVerdict::Lost(
                    "sandbox bq_1 is sleeping: its kernel and Python state are lost".into(),
                ),
            ),
            (
                found(mine, SandboxState::Starting),
                ProbeVerdict::Lost(
                    "sandbox bq_1 is starting: its kernel and Python state are lost".into(),
                ),
            ),
            (
                found("bqe-victim-py-87654321", SandboxState::Running),
                ProbeVerdict::NotOwned,
            ),
            (
                Err(not_found()),
                ProbeVerdict::Lost("sandbox bq_1 no longer exists".into()),
            ),
            // briq does not answer: nothing is concluded, the outage is said.
            (
                Err(unavailable()),
                ProbeVerdict::Unreachable(unavailable().to_string()),
            ),
            (
                Err(briq::Error::HeldBack {
                    wait: std::time::Duration::from_secs(2),
                }),
                ProbeVerdict::Unreachable(
                    "briq is not answering (an outage?): calls are held back for 2s, then briq \
                     is probed again"
                        .into(),
                ),
            ),
            // briq answers, but refuses to say: asked again after a backoff.
            (
                Err(briq::Error::Unauthorized {
                    status: 401,
                    message: "revoked".into(),
                    request_id: None,
                }),
                ProbeVerdict::Retry,
            ),
        ];
        for (found, expected) in cases {
            assert_eq!(probe_verdict("bq_1", mine, &found), expected, "{found:?}");
        }
        let ready = kernel_ready(None);
        let unreachable = briq_unreachable(ready.clone(), "HTTP 503");
        assert_eq!(unreachable[..2], ready);
        assert_eq!(
            unreachable[2],
            desired(
                conditions::BRIQ_REACHABLE,
                "False",
                "BriqUnreachable",
                "briq did not answer the last probe (HTTP 503); Executions wait for it"
            )
        );
    }

    #[test]
    fn cleanup_table() {
        let both = annotations(&[
            (SANDBOX_ID_ANNOTATION, "bq_a"),
            (CREATE_PENDING_ANNOTATION, "t"),
        ]);
        let cases = [
            (status(&ready(), None), annotations(&[]), None),
            (
                status(&ready(), Some("bq_1")),
                annotations(&[(SANDBOX_ID_ANNOTATION, "bq_1")]),
                Some(Cleanup {
                    ids: ["bq_1".to_owned()].into(),
                    look_up_by_name: true,
                }),
            ),
            (
                status(&ready(), Some("bq_1")),
                both,
                Some(Cleanup {
                    ids: ["bq_1".to_owned(), "bq_a".to_owned()].into(),
                    look_up_by_name: true,
                }),
            ),
            (
                BriqExecutorStatus::default(),
                annotations(&[(CREATE_PENDING_ANNOTATION, "t")]),
                Some(Cleanup {
                    ids: BTreeSet::new(),
                    look_up_by_name: true,
                }),
            ),
        ];
        for (status, annotations, expected) in cases {
            assert_eq!(cleanup(&status, &annotations), expected, "{annotations:?}");
        }
    }

    #[test]
    fn drain_table() {
        let deleted: Timestamp = "2026-12-03T10:00:00Z".parse().unwrap();
        let after = |seconds: i64| deleted + SignedDuration::from_secs(seconds);
        let wait = |unfinished, left: i64| Drain::Wait {
            unfinished,
            left: SignedDuration::from_secs(left),
        };
        assert_eq!(DRAIN_LIMIT, SignedDuration::from_secs(60));
        let cases = [
            (0, Some(deleted), after(0), Drain::Destroy),
            (2, Some(deleted), after(0), wait(2, 60)),
            (1, Some(deleted), after(59), wait(1, 1)),
            (1, Some(deleted), after(60), Drain::Destroy),
            (1, Some(deleted), after(3600), Drain::Destroy),
            // A deletion timestamp ahead of this clock (skew) counts as just deleted.
            (1, Some(after(10)), after(0), wait(1, 60)),
            (1, None, after(0), wait(1, 60)),
        ];
        for (unfinished, deleted_at, now, expected) in cases {
            assert_eq!(
                drain(unfinished, deleted_at, now),
                expected,
                "{unfinished} at {now}"
            );
        }
    }

    #[test]
    fn a_status_that_already_says_it_is_not_written_again() {
        let current = status(&ready(), Some("bq_1"));
        let current = BriqExecutorStatus {
            observed_generation: Some(1),
            ..current
        };
        let same = SandboxFields::of(&current);
        assert_eq!(
            status_update(&current, Some(1), &ready(), same.clone()),
            None
        );
        assert!(
            status_update(&current, Some(2), &ready(), same.clone()).is_some(),
            "a new generation"
        );
        let lost = unusable_state("its kernel was lost");
        let update = status_update(&current, Some(1), &lost, same).expect("a change");
        let ready_condition = conditions::find(&update.conditions, READY).unwrap();
        assert_eq!(
            (
                ready_condition.status.as_str(),
                ready_condition.reason.as_str()
            ),
            ("False", "Unusable")
        );
        assert_eq!(
            ready_condition.message,
            "its kernel was lost. An unusable executor never runs code again: create a new BriqExecutor"
        );
        assert!(conditions::is_true(&update.conditions, STALLED));
        assert_eq!(update.sandbox_id.as_deref(), Some("bq_1"));
    }
}
