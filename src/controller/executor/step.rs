//! The next step of a live executor, decided from its status and annotations alone
//! ([`decide`]): pure, tested with exact expected outputs. [`Actor::apply`](super::actor::Actor)
//! performs it, with the effects of each step in that step's own file.

use std::collections::BTreeMap;

use crate::crd::{
    BriqExecutorStatus, CLAIMED_BY_ANNOTATION, CREATE_PENDING_ANNOTATION, ForkOrigin,
    POOL_FALLBACK_ANNOTATION, SANDBOX_ID_ANNOTATION,
    conditions::{self, READY, STALLED},
    reasons::ExecutorReason,
};

/// The next step of a live (not deleted) executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
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
    /// Ready (or suspending) and asked to suspend with nothing waiting for it: save the
    /// kernel's namespace in the sandbox and stop the sandbox.
    Suspend { sandbox: String },
    /// Suspended (or suspending, or resuming) and needed again: start the sandbox and a
    /// kernel, restore the namespace.
    Resume { sandbox: String },
    /// Suspended and still asked to be: nothing to do (no probe: the sandbox is stopped).
    StaySuspended,
    /// Ready (or forking) with forks waiting for a snapshot: pause Executions, save the
    /// namespace and pack the working files for them, then be Ready again.
    Snapshot { sandbox: String },
    /// Suspended with forks waiting for a snapshot, or done reading the one its sandbox was
    /// started for: start the sandbox and pack the saved state, or stop it again.
    SnapshotSuspended { sandbox: String },
    /// A fork without a sandbox whose source has no snapshot for it yet: wait, saying why.
    AwaitSnapshot {
        reason: ExecutorReason,
        message: String,
    },
    /// A fork whose source saved a snapshot for it: record it, then create the sandbox.
    RecordFork { origin: ForkOrigin },
    /// A fork that can never be made: say so for good (nothing was created).
    RefuseFork {
        reason: ExecutorReason,
        message: String,
    },
}

/// What a fork without a sandbox or a recorded origin finds of its source
/// ([`fork::source`](super::fork::source)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ForkSource {
    /// Not in the namespace (yet).
    Missing,
    /// It can never be forked into this one.
    Refused(String),
    /// It has not saved a snapshot for this fork yet.
    Waiting,
    /// It saved one, which failed.
    Failed(String),
    /// It saved one for this fork.
    Taken(ForkOrigin),
}

/// What the executor's spec, its Executions and its forks ask of it, beside its status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Asked {
    /// Its spec has a `poolRef`.
    pub(super) claims: bool,
    /// It should be suspended now: `spec.suspend`, and no Execution waits or runs
    /// ([`suspend_wanted`](super::suspend::suspend_wanted)).
    pub(super) suspend: bool,
    /// A fork of it waits for a snapshot ([`fork::waiting`](super::fork::waiting)).
    pub(super) forks_waiting: bool,
    /// A fork of it is still reading its last snapshot.
    pub(super) forks_reading: bool,
    /// A fork (`spec.forkFrom`) without a recorded origin: what it finds of its source.
    pub(super) fork: Option<ForkSource>,
}

impl Step {
    /// Steps whose effect cannot be taken back (a second sandbox, a second setup) are decided
    /// on a fresh read: the watch cache can lag behind this controller's own last write.
    pub(super) fn needs_fresh_read(&self) -> bool {
        matches!(
            self,
            Step::CreateSandbox { .. }
                | Step::Provision { .. }
                | Step::Snapshot { .. }
                | Step::SnapshotSuspended { .. }
                | Step::RecordFork { .. }
                | Step::Suspend { .. }
                | Step::Resume { .. }
                | Step::Conclude {
                    leftover: Some(_),
                    ..
                }
        )
    }
}

/// The sandbox an executor records: its status, else the annotation (which survives a lost or
/// rewritten status).
pub(super) fn recorded_sandbox(
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
const CONCLUSIONS: [ExecutorReason; 5] = [
    ExecutorReason::SetupFailed,
    ExecutorReason::IdleTimeout,
    ExecutorReason::PoolMismatch,
    ExecutorReason::ForkRefused,
    ExecutorReason::ForkFailed,
];

/// Where a suspension stands, by the `Ready` condition's reason.
fn suspension_phase(status: &BriqExecutorStatus) -> Option<ExecutorReason> {
    let reason = conditions::find(&status.conditions, READY)
        .filter(|ready| ready.status == "False")
        .and_then(|ready| ExecutorReason::parse(&ready.reason))?;
    let phases = [
        ExecutorReason::Suspending,
        ExecutorReason::Suspended,
        ExecutorReason::Resuming,
        ExecutorReason::Forking,
    ];
    phases.contains(&reason).then_some(reason)
}

/// The next step of a live executor with this status and these annotations, given what it is
/// asked.
pub(super) fn decide(
    status: &BriqExecutorStatus,
    annotations: &BTreeMap<String, String>,
    asked: &Asked,
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
    let Some(sandbox) = recorded_sandbox(status, annotations) else {
        match asked.fork.clone() {
            None => {}
            Some(ForkSource::Taken(origin)) => return Step::RecordFork { origin },
            Some(ForkSource::Missing) => {
                return Step::AwaitSnapshot {
                    reason: ExecutorReason::ForkSourceNotFound,
                    message: "waiting for spec.forkFrom's executor, which does not exist in this \
                              namespace"
                        .into(),
                };
            }
            Some(ForkSource::Waiting) => {
                return Step::AwaitSnapshot {
                    reason: ExecutorReason::WaitingForSnapshot,
                    message: "waiting for the source to save its namespace and working files \
                              between two of its Executions"
                        .into(),
                };
            }
            Some(ForkSource::Refused(message)) => {
                return Step::RefuseFork {
                    reason: ExecutorReason::ForkRefused,
                    message,
                };
            }
            Some(ForkSource::Failed(message)) => {
                return Step::RefuseFork {
                    reason: ExecutorReason::ForkFailed,
                    message,
                };
            }
        }
        if asked.claims && !annotations.contains_key(POOL_FALLBACK_ANNOTATION) {
            return Step::Claim;
        }
        return Step::CreateSandbox {
            pending: annotations.contains_key(CREATE_PENDING_ANNOTATION),
        };
    };
    let started_for_forks = status.snapshot.as_ref().is_some_and(|s| s.sandbox_started);
    match (suspension_phase(status), asked.suspend) {
        // A resume once begun is finished first: its new kernel may not hold the namespace
        // yet, and a save now would write an empty one over it.
        (Some(ExecutorReason::Resuming), _) => Step::Resume { sandbox },
        // A snapshot once begun is finished (or its pause ended) before anything else.
        (Some(ExecutorReason::Forking), _) => Step::Snapshot { sandbox },
        (Some(_), false) => Step::Resume { sandbox },
        (Some(ExecutorReason::Suspended), true)
            if asked.forks_waiting || (started_for_forks && !asked.forks_reading) =>
        {
            Step::SnapshotSuspended { sandbox }
        }
        (Some(ExecutorReason::Suspended), true) => Step::StaySuspended,
        (Some(_), true) => Step::Suspend { sandbox },
        (None, suspend) if conditions::is_true(&status.conditions, READY) => {
            if suspend {
                Step::Suspend { sandbox }
            } else if asked.forks_waiting {
                Step::Snapshot { sandbox }
            } else {
                Step::Probe { sandbox }
            }
        }
        (None, _) => Step::Provision { sandbox },
    }
}

#[cfg(test)]
mod tests;
