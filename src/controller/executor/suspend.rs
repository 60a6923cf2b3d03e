//! Suspend and resume (`spec.suspend`): a Ready executor asked to suspend, with no Execution
//! waiting or running, saves its kernel's namespace inside the sandbox and stops the sandbox
//! ([`Actor::suspend`]); an Execution created meanwhile, or `suspend: false`, starts the sandbox
//! and a new kernel and restores the namespace ([`Actor::resume`]). The saved namespace never
//! leaves the sandbox: the operator reads only the bridge's report of names and sizes.
//!
//! Every step can be taken again after a crash: `Suspending` is written before anything is
//! saved (Executions wait from then on, and the probe leaves the sandbox alone), a sandbox found
//! stopped is not saved again, a resume restores only into a kernel it had to start, and a
//! resume once begun is finished before any new suspension (step.rs).

use kube::{
    ResourceExt,
    runtime::{controller::Action, events::EventType},
};
use tracing::info;

use super::{
    actor::Actor,
    admit::key_recheck,
    status::{SandboxFields, kernel_ready_of, sandbox_fields, state, status_of},
};
use crate::{
    bridge::{
        session::{CallError, Session},
        state::{StateReport, problem},
    },
    briq::{ApiKey, SandboxApi, SandboxState},
    controller::{
        context::{Error, Result},
        index::{self, Activity},
        ownership::{Ownership, ownership},
        recheck,
        recheck::STATE_DEADLINE,
        status::mark_unusable,
    },
    crd::{
        BriqExecutor, BriqExecutorStatus, POOL_MEMBER_ANNOTATION, Suspension, UnsavedName,
        conditions::{self, Desired, READY, SUSPENDED, desired},
        reasons::ExecutorReason,
    },
};

/// Whether `executor`, whose Executions the cache shows as `activity`, should be suspended now:
/// its spec asks it (`suspend`, or `idleAction: Suspend` once `idle_over`, its idle timeout
/// passed), no Execution waits for it or runs, it is not an unclaimed pool member (a pool keeps
/// its members warm) and saving its namespace has not failed under this very spec (then an idle
/// one expires instead).
pub(super) fn suspend_wanted(executor: &BriqExecutor, activity: Activity, idle_over: bool) -> bool {
    (executor.spec.suspend || idle_over)
        && activity.unfinished == 0
        && !executor.annotations().contains_key(POOL_MEMBER_ANNOTATION)
        && !save_failed(&status_of(executor), executor.metadata.generation)
}

/// The namespace could not be saved under this generation of the spec: not tried again until
/// the spec changes (else every reconcile would save and fail again).
fn save_failed(status: &BriqExecutorStatus, generation: Option<i64>) -> bool {
    conditions::find(&status.conditions, SUSPENDED).is_some_and(|suspended| {
        suspended.status == "False"
            && suspended.reason == ExecutorReason::SuspendFailed.as_str()
            && suspended.observed_generation == generation
    })
}

/// The suspension a save reported, or why it cannot stand: the bridge said it failed, or its
/// report breaks the protocol. Names beyond the status's room are counted in the message, never
/// dropped in silence.
fn saved(report: &StateReport) -> std::result::Result<Suspension, String> {
    if let Some(problem) = problem(report) {
        return Err(problem.to_owned());
    }
    if !report.ok {
        return Err(report.message.clone());
    }
    Ok(Suspension {
        suspended_time: Some(conditions::now()),
        resumed_time: None,
        saved_bytes: report.bytes,
        saved_names: report.saved.len() as u32,
        unsaved: unsaved_names(report),
    })
}

/// Why a save that ended in `error` did not happen, when it is known that it did not: the
/// bridge answered nothing it could mean (a sandbox adopted from release 0.1.0 runs a bridge
/// without save-state) or did not finish in time. `None`: briq did not carry the call (an
/// outage), or the answer was lost; it is tried again.
pub(super) fn not_saved(error: &CallError) -> Option<String> {
    match error {
        CallError::Malformed(_) | CallError::UnexpectedKind(_) | CallError::TimedOut(_) => {
            Some(format!("the sandbox's bridge did not save it: {error}"))
        }
        CallError::Briq(_) | CallError::ResultUnreadable(_) => None,
    }
}

fn unsaved_names(report: &StateReport) -> Vec<UnsavedName> {
    report
        .unsaved
        .iter()
        .map(|unsaved| UnsavedName {
            name: unsaved.name.clone(),
            why: unsaved.why.clone(),
        })
        .collect()
}

/// The names a suspension left behind, as a message says them.
fn names_left(unsaved: &[UnsavedName]) -> String {
    if unsaved.is_empty() {
        return "every name was saved".to_owned();
    }
    const SHOWN: usize = 10;
    let names: Vec<&str> = unsaved
        .iter()
        .take(SHOWN)
        .map(|u| u.name.as_str())
        .collect();
    let more = match unsaved.len().saturating_sub(SHOWN) {
        0 => String::new(),
        more => format!(" and {more} more"),
    };
    format!(
        "not saved (status.suspension says why): {}{more}",
        names.join(", ")
    )
}

/// What asked for a suspension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cause {
    /// `spec.suspend: true`.
    Spec,
    /// `idleAction: Suspend`, idle for its `idleTimeoutSeconds`.
    Idle,
}

impl Cause {
    pub(super) fn of(executor: &BriqExecutor) -> Cause {
        if executor.spec.suspend {
            Cause::Spec
        } else {
            Cause::Idle
        }
    }
}

/// The state of a suspended executor: `Ready=False` (Executions wait; the next resumes it),
/// `Suspended=True`.
pub(super) fn suspended_state(suspension: &Suspension, cause: Cause) -> [Desired; 3] {
    let resumes = match cause {
        Cause::Spec => "The next Execution, or spec.suspend: false, resumes it",
        Cause::Idle => {
            "Suspended after its idleTimeoutSeconds without an Execution (idleAction: Suspend); \
             the next Execution resumes it"
        }
    };
    let message = format!(
        "suspended: its sandbox is stopped with {} names of the kernel's namespace saved in it \
         ({} bytes); {}. {resumes}",
        suspension.saved_names,
        suspension.saved_bytes,
        names_left(&suspension.unsaved)
    );
    let [ready, stalled] = state("False", false, ExecutorReason::Suspended, message.clone());
    let suspended = desired(
        SUSPENDED,
        "True",
        ExecutorReason::Suspended.as_str(),
        message,
    );
    [ready, stalled, suspended]
}

/// The last suspension, resumed with `restored` (the restore's report; `None` when the kernel
/// kept running, so nothing had to be restored).
fn resumed(last: Option<Suspension>, restored: Option<&StateReport>) -> (Suspension, String) {
    let mut suspension = last.unwrap_or_default();
    suspension.resumed_time = Some(conditions::now());
    let message = match restored {
        None => "resumed: its kernel had kept running with its namespace".to_owned(),
        Some(report) if report.ok && problem(report).is_none() => {
            // Names that failed to restore join those never saved.
            suspension.unsaved.extend(unsaved_names(report));
            format!(
                "resumed: {} names restored into a new kernel; {}",
                report.saved.len(),
                names_left(&suspension.unsaved)
            )
        }
        Some(report) => format!(
            "resumed into a new kernel WITHOUT its namespace: the restore failed ({})",
            problem(report).unwrap_or(&report.message)
        ),
    };
    (suspension, message)
}

impl<S: SandboxApi> Actor<'_, S> {
    /// Suspends a Ready executor: `Suspending` first (its own write wakes the next step, with
    /// every cache showing that Executions must wait), then, once no Execution runs, the
    /// namespace saved and the sandbox stopped.
    pub(super) async fn suspend(&self, executor: &BriqExecutor, id: &str) -> Result<Action> {
        let status = status_of(executor);
        let message = "saving the kernel's namespace inside the sandbox, then stopping it";
        if let Some(wait) = self
            .pause(executor, ExecutorReason::Suspending, message.into())
            .await?
        {
            return Ok(wait);
        }
        let Some(key) = self.credentials(executor).await? else {
            return Ok(key_recheck(executor));
        };
        let Some(sandbox) = self.own_sandbox(executor, &key, id).await? else {
            return Ok(Action::await_change());
        };
        let suspension = if sandbox == SandboxState::Stopped {
            // Saved and stopped by a reconcile that ended before it could say so.
            let mut last = status.suspension.clone().unwrap_or_default();
            last.suspended_time = Some(conditions::now());
            last.resumed_time = None;
            last
        } else {
            let session = Session::new(&self.shared.sandboxes, &key, id);
            let saving = self
                .slot
                .without(session.save_state(STATE_DEADLINE))
                .await
                .map_err(|error| (not_saved(&error), error));
            match saving.map(|report| saved(&report)) {
                Ok(Ok(suspension)) => suspension,
                Ok(Err(why)) | Err((Some(why), _)) => return self.save_failed(executor, why).await,
                Err((None, error)) => return Err(error.into()),
            }
        };
        self.shared.sandboxes.stop_sandbox(&key, id).await?;
        let fields = SandboxFields {
            suspension: Some(suspension.clone()),
            ..sandbox_fields(executor)
        };
        let suspended = suspended_state(&suspension, Cause::of(executor));
        self.report(executor, &suspended, fields).await?;
        let note = suspended[0].message.clone();
        self.event(executor, EventType::Normal, "Suspended", "Suspend", note)
            .await;
        info!(sandbox = %id, bytes = suspension.saved_bytes, "suspended");
        Ok(Action::await_change())
    }

    /// Pauses `executor`'s Executions for `phase` (`Suspending`, `Forking`): the phase written
    /// first (its own write wakes the next step, with every cache showing that Executions must
    /// wait), then an Execution that took its turn before it finishing. `Some`: what to do until
    /// both hold.
    pub(super) async fn pause(
        &self,
        executor: &BriqExecutor,
        phase: ExecutorReason,
        message: String,
    ) -> Result<Option<Action>> {
        let status = status_of(executor);
        let current = conditions::find(&status.conditions, READY).map(|c| c.reason.as_str());
        if current != Some(phase.as_str()) {
            let paused = state("False", false, phase, message);
            self.report(executor, paused, sandbox_fields(executor))
                .await?;
            return Ok(Some(Action::await_change()));
        }
        let namespace = executor.namespace().unwrap_or_default();
        if index::running(self.executions, &namespace, &executor.name_any()) > 0 {
            return Ok(Some(Action::requeue(recheck::DRAIN)));
        }
        Ok(None)
    }

    /// The namespace could not be saved: the sandbox keeps running, the kernel keeps its
    /// state, and the executor is Ready again, saying why it is not suspended.
    async fn save_failed(&self, executor: &BriqExecutor, why: String) -> Result<Action> {
        let next = match Cause::of(executor) {
            Cause::Spec => "Change the spec to try again",
            Cause::Idle => "Idle for its idleTimeoutSeconds, it expires instead",
        };
        let message = format!(
            "not suspended: the kernel's namespace could not be saved ({why}); the kernel keeps \
             running with its state. {next}"
        );
        let [ready, stalled] = kernel_ready_of(executor);
        let failed = desired(
            SUSPENDED,
            "False",
            ExecutorReason::SuspendFailed.as_str(),
            message.clone(),
        );
        self.report(executor, [ready, stalled, failed], sandbox_fields(executor))
            .await?;
        self.event(
            executor,
            EventType::Warning,
            "SuspendFailed",
            "Suspend",
            message,
        )
        .await;
        Ok(Action::requeue(self.shared.settings.probe_interval))
    }

    /// Resumes a suspended (or suspending) executor: the sandbox started, a kernel started,
    /// and the namespace restored into it if it is a new one.
    pub(super) async fn resume(&self, executor: &BriqExecutor, id: &str) -> Result<Action> {
        let resuming = state(
            "False",
            false,
            ExecutorReason::Resuming,
            "starting the sandbox and a new kernel, then restoring the namespace",
        );
        self.report(executor, resuming, sandbox_fields(executor))
            .await?;
        let Some(key) = self.credentials(executor).await? else {
            return Ok(key_recheck(executor));
        };
        if self.own_sandbox(executor, &key, id).await?.is_none() {
            return Ok(Action::await_change());
        }
        self.shared.sandboxes.start_sandbox(&key, id).await?;
        let session = Session::new(&self.shared.sandboxes, &key, id);
        let kernel = self.slot.without(session.start_kernel()).await?;
        let restored = if kernel.started {
            Some(
                self.slot
                    .without(session.restore_state(STATE_DEADLINE))
                    .await?,
            )
        } else {
            None
        };
        let (suspension, message) = resumed(status_of(executor).suspension, restored.as_ref());
        let [_, stalled] = kernel_ready_of(executor);
        let ready = desired(
            READY,
            "True",
            ExecutorReason::KernelReady.as_str(),
            message.clone(),
        );
        let back = desired(
            SUSPENDED,
            "False",
            ExecutorReason::Resumed.as_str(),
            message.clone(),
        );
        let fields = SandboxFields {
            suspension: Some(suspension),
            ..sandbox_fields(executor)
        };
        self.report(executor, [ready, stalled, back], fields)
            .await?;
        let kind = if restored.as_ref().is_some_and(|r| !r.ok) {
            EventType::Warning
        } else {
            EventType::Normal
        };
        self.event(executor, kind, "Resumed", "Resume", message)
            .await;
        info!(sandbox = %id, "resumed");
        Ok(Action::requeue(self.shared.settings.probe_interval))
    }

    /// The state of sandbox `id` if it is this executor's own; `None` once that is known
    /// otherwise (someone else's sandbox: disowned; gone: the kernel and its saved namespace
    /// are lost, the executor unusable).
    async fn own_sandbox(
        &self,
        executor: &BriqExecutor,
        key: &ApiKey,
        id: &str,
    ) -> Result<Option<SandboxState>> {
        let found = self.shared.sandboxes.get_sandbox(key, id).await;
        let expected = self.expected_name(executor).await?;
        match ownership(&expected, &found) {
            Some(Ownership::Owned) => Ok(found.ok().map(|sandbox| sandbox.state)),
            Some(Ownership::Foreign) => {
                self.disown(executor, key, id, true).await?;
                Ok(None)
            }
            Some(Ownership::Gone) => {
                let lost = format!(
                    "its sandbox {id} is gone while suspended, and the saved namespace with it"
                );
                mark_unusable(self.shared, executor, &lost).await?;
                let unusable = super::status::unusable_state(&lost);
                self.report(executor, unusable, SandboxFields::default())
                    .await?;
                Ok(None)
            }
            None => Err(Error::from(found.expect_err("briq did not say"))),
        }
    }
}

#[cfg(test)]
mod tests;
