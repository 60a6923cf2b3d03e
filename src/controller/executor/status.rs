//! What an executor says of itself, and the writes that say it: the state its `Ready` and
//! `Stalled` conditions give ([`state`], [`kernel_ready`], [`unusable_state`]) with the sandbox
//! fields ([`SandboxFields`]), written only when the status does not say it already
//! ([`status_update`]); its annotations; its Events.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{
    ResourceExt,
    api::{Patch, PatchParams},
    runtime::events::EventType,
};
use serde_json::json;

use super::actor::Actor;
use crate::{
    briq::SandboxApi,
    controller::{
        context::Result,
        publish::publish,
        status::{apply_status, apply_status_at, landed},
    },
    crd::{
        BriqExecutor, BriqExecutorStatus, CREATE_PENDING_ANNOTATION, EXECUTOR_MANAGER, ForkOrigin,
        PoolRef, SANDBOX_ID_ANNOTATION, Snapshot, Suspension,
        conditions::{self, Desired, READY, STALLED, desired},
        reasons::ExecutorReason,
    },
};

/// The executor's state as its two conditions say it.
pub(super) fn state(
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
pub(super) fn kernel_ready(handed_over: Option<&str>) -> [Desired; 2] {
    let message = match handed_over {
        Some(origin) => format!("the kernel answers: {origin}"),
        None => "the kernel answers".to_owned(),
    };
    state("True", false, ExecutorReason::KernelReady, message)
}

/// Where a claimer's sandbox came from, by its own record (`poolRef` and the member it
/// records, [`BriqExecutor::claimed_member`]); `None` for an executor that made its own.
fn handover(pool_ref: Option<&PoolRef>, member: Option<&str>) -> Option<String> {
    Some(handover_text(&pool_ref?.name, member?))
}

pub(super) fn handover_text(pool: &str, member: &str) -> String {
    format!("handed over from BriqExecutorPool {pool} (executor {member})")
}

/// The state of an unusable executor.
pub(super) fn unusable_state(why: &str) -> [Desired; 2] {
    let message =
        format!("{why}. An unusable executor never runs code again: create a new BriqExecutor");
    state("False", true, ExecutorReason::Unusable, message)
}

/// Fields the executor controller owns besides the conditions.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct SandboxFields {
    pub(super) id: Option<String>,
    pub(super) created: Option<Time>,
    pub(super) ready: Option<Time>,
    /// The last suspension; it goes with the sandbox.
    pub(super) suspension: Option<Suspension>,
    /// The pool member whose sandbox a claimer took; it goes with the sandbox.
    pub(super) claimed_member: Option<String>,
    /// A fork's origin; it stays with the executor.
    pub(super) fork: Option<ForkOrigin>,
    /// The last snapshot saved for forks; it goes with the sandbox.
    pub(super) snapshot: Option<Snapshot>,
}

impl SandboxFields {
    fn of(status: &BriqExecutorStatus) -> SandboxFields {
        SandboxFields {
            id: status.sandbox_id.clone(),
            created: status.sandbox_created_time.clone(),
            ready: status.ready_time.clone(),
            suspension: status.suspension.clone(),
            claimed_member: status.claimed_member.clone(),
            fork: status.fork.clone(),
            snapshot: status.snapshot.clone(),
        }
    }

    /// The fields of the sandbox `id` just created for `executor`: everything that went with
    /// its previous sandbox goes; a fork's origin stays with the executor.
    pub(super) fn created(id: String, executor: &BriqExecutor) -> SandboxFields {
        SandboxFields {
            id: Some(id),
            created: Some(conditions::now()),
            ready: None,
            suspension: None,
            claimed_member: None,
            fork: status_of(executor).fork,
            snapshot: None,
        }
    }
}

/// The executor controller's part of the status, or `None` when `current` already says it.
fn status_update(
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
        suspension: sandbox.suspension,
        claimed_member: sandbox.claimed_member,
        fork: sandbox.fork,
        snapshot: sandbox.snapshot,
        ..Default::default()
    })
}

/// The status to write so that `executor`'s says `state` and `sandbox`, as the server-side
/// apply's body; `None` when it already says so.
fn written_status(
    executor: &BriqExecutor,
    state: &[conditions::Desired],
    sandbox: SandboxFields,
) -> Option<serde_json::Value> {
    let status = status_update(
        &status_of(executor),
        executor.metadata.generation,
        state,
        sandbox,
    )?;
    Some(serde_json::to_value(status).expect("status serializes"))
}

impl<S: SandboxApi> Actor<'_, S> {
    /// Applies the executor controller's part of the status, unless it already says that.
    pub(super) async fn report(
        &self,
        executor: &BriqExecutor,
        state: impl AsRef<[conditions::Desired]>,
        sandbox: SandboxFields,
    ) -> Result<()> {
        let Some(status) = written_status(executor, state.as_ref(), sandbox) else {
            return Ok(());
        };
        apply_status(self.api, executor, EXECUTOR_MANAGER, status).await
    }

    /// Reports a claimer's state if it is still as the cache showed it; `false` when it
    /// changed (decide again on the change).
    pub(super) async fn report_at(
        &self,
        executor: &BriqExecutor,
        state: impl AsRef<[conditions::Desired]>,
    ) -> Result<bool> {
        let written = self
            .report_at_version(executor, state, SandboxFields::default())
            .await;
        landed(written)
    }

    /// [`Actor::report`], only if the executor is still at the version `executor` was read at:
    /// the executor as written (or as it was, when its status already says it); a conflict is
    /// [`is_conflict`](crate::controller::status::is_conflict).
    pub(super) async fn report_at_version(
        &self,
        executor: &BriqExecutor,
        state: impl AsRef<[conditions::Desired]>,
        sandbox: SandboxFields,
    ) -> Result<BriqExecutor> {
        let Some(status) = written_status(executor, state.as_ref(), sandbox) else {
            return Ok(executor.clone());
        };
        let version = executor.resource_version();
        apply_status_at(
            self.api,
            executor,
            EXECUTOR_MANAGER,
            status,
            version.as_deref(),
        )
        .await
    }

    /// Says `Provisioning` once, when the executor has no `Ready` condition yet.
    pub(super) async fn report_provisioning(
        &self,
        executor: &BriqExecutor,
        message: &str,
    ) -> Result<()> {
        // A wait for its class has ended once it provisions.
        let class_waits = [
            ExecutorReason::ClassNotFound.as_str(),
            ExecutorReason::ClassRefused.as_str(),
            ExecutorReason::WaitingForCapacity.as_str(),
        ];
        if conditions::find(&status_of(executor).conditions, conditions::READY)
            .is_some_and(|ready| !class_waits.contains(&ready.reason.as_str()))
        {
            return Ok(());
        }
        let provisioning = state("Unknown", false, ExecutorReason::Provisioning, message);
        self.report(executor, provisioning, sandbox_fields(executor))
            .await
    }

    /// Merge-patches the executor's annotations (`null` removes one).
    pub(super) async fn annotate(
        &self,
        executor: &BriqExecutor,
        annotations: serde_json::Value,
    ) -> Result<()> {
        let patch = json!({ "metadata": { "annotations": annotations } });
        self.api
            .patch(
                &executor.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        Ok(())
    }

    /// Merges `annotations` into the executor's only if it is still at the version `executor`
    /// was read at: `false` when someone wrote it since.
    pub(super) async fn annotate_at(
        &self,
        executor: &BriqExecutor,
        annotations: serde_json::Value,
    ) -> Result<bool> {
        let patch = json!({ "metadata": {
            "annotations": annotations,
            "resourceVersion": executor.resource_version(),
        } });
        landed(self.merge(&executor.name_any(), &patch).await)
    }

    /// A JSON merge patch of the executor (or member) `name`.
    pub(super) async fn merge(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<BriqExecutor> {
        let patched = self
            .api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await;
        Ok(patched?)
    }

    pub(super) async fn record_sandbox(&self, executor: &BriqExecutor, id: &str) -> Result<()> {
        self.annotate(
            executor,
            json!({ SANDBOX_ID_ANNOTATION: id, CREATE_PENDING_ANNOTATION: null }),
        )
        .await
    }

    pub(super) async fn forget_sandbox(&self, executor: &BriqExecutor) -> Result<()> {
        self.annotate(
            executor,
            json!({ SANDBOX_ID_ANNOTATION: null, CREATE_PENDING_ANNOTATION: null }),
        )
        .await?;
        let message = "the sandbox disappeared before it was ready; creating another";
        let provisioning = state("Unknown", false, ExecutorReason::Provisioning, message);
        self.report(executor, provisioning, SandboxFields::default())
            .await
    }

    pub(super) async fn event(
        &self,
        executor: &BriqExecutor,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        publish(self.shared, executor, type_, reason, action, note).await;
    }
}

/// Ready, saying where a claimer's kernel came from.
pub(super) fn kernel_ready_of(executor: &BriqExecutor) -> [conditions::Desired; 2] {
    let origin = handover(executor.spec.pool_ref.as_ref(), executor.claimed_member());
    kernel_ready(origin.as_deref())
}

pub(super) fn status_of(executor: &BriqExecutor) -> crate::crd::BriqExecutorStatus {
    executor.status.clone().unwrap_or_default()
}

pub(super) fn sandbox_fields(executor: &BriqExecutor) -> SandboxFields {
    SandboxFields::of(&status_of(executor))
}

#[cfg(test)]
mod tests;
