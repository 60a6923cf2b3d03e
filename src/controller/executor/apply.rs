//! A live executor's next step, performed: [`decide`] names it, and each arm hands it to the
//! methods of the step's own file.

use kube::{ResourceExt, runtime::controller::Action};

use super::{
    actor::Actor,
    admit::key_recheck,
    create::Created,
    idle::Idleness,
    status::{SandboxFields, sandbox_fields, state, status_of, unusable_state},
    step::{Step, decide},
};
use crate::{
    briq::SandboxApi,
    controller::{context::Result, index, ownership::Ownership, recheck},
    crd::{BriqExecutor, conditions, reasons::ExecutorReason},
    traces,
};

impl<S: SandboxApi> Actor<'_, S> {
    /// Performs `step`, decided on `cached`; a step that cannot be taken back is decided again on
    /// a fresh read. The steps that reach briq are boxed: inline, each would sit in this future,
    /// and a debug build's poll frames copy them (test threads have 2 MiB of stack).
    pub(super) async fn apply(&self, cached: &BriqExecutor, mut step: Step) -> Result<Action> {
        let fresh;
        let executor = if step.needs_fresh_read() {
            fresh = self.api.get(&cached.name_any()).await?;
            step = decide(&status_of(&fresh), fresh.annotations(), &self.asked(&fresh));
            &fresh
        } else {
            cached
        };
        match step {
            Step::ReportUnusable { why } => {
                self.report(executor, unusable_state(&why), sandbox_fields(executor))
                    .await?;
                Ok(Action::await_change())
            }
            Step::Conclude {
                reason,
                leftover,
                message,
            } => {
                if let Some(id) = leftover {
                    // Never under a running Execution: one that took its turn before the
                    // executor concluded finishes first; no turn starts after.
                    let namespace = executor.namespace().unwrap_or_default();
                    if index::running(self.executions, &namespace, &executor.name_any()) > 0 {
                        return Ok(Action::requeue(recheck::DRAIN));
                    }
                    self.give_back(executor, &id, reason).await?;
                }
                let concluded = state("False", true, reason, message);
                self.report(executor, concluded, SandboxFields::default())
                    .await?;
                Ok(Action::await_change())
            }
            Step::CreateSandbox { pending } => {
                let class = match self.admit(executor, false).await? {
                    Ok(class) => class,
                    Err(wait) => return Ok(wait),
                };
                let Some(key) = self.credentials(executor).await? else {
                    return Ok(key_recheck(executor));
                };
                let (created, create) = traces::noted(Box::pin(
                    self.create_sandbox(executor, &key, pending, class),
                ))
                .await;
                let id = match created? {
                    Created::Sandbox(id) => id,
                    Created::Not(recheck) => return Ok(Action::requeue(recheck)),
                };
                let sandbox = SandboxFields::created(id, executor);
                Box::pin(self.provision(executor, &key, sandbox, Some(create))).await
            }
            Step::Provision { sandbox } => {
                let Some(key) = self.credentials(executor).await? else {
                    return Ok(key_recheck(executor));
                };
                match self.ownership(executor, &key, &sandbox).await? {
                    Ownership::Owned => {}
                    Ownership::Foreign => {
                        return self.disown(executor, &key, &sandbox, false).await;
                    }
                    Ownership::Gone => {
                        // Before it was ready: its kernel held nothing yet; create another.
                        self.forget_sandbox(executor).await?;
                        return Ok(Action::await_change());
                    }
                }
                let current = sandbox_fields(executor);
                let fields = SandboxFields {
                    id: Some(sandbox),
                    created: current.created.or_else(|| Some(conditions::now())),
                    ready: current.ready,
                    suspension: current.suspension,
                    claimed_member: current.claimed_member,
                    fork: current.fork,
                    snapshot: current.snapshot,
                };
                Box::pin(self.provision(executor, &key, fields, None)).await
            }
            Step::Claim => Box::pin(self.claim_step(executor)).await,
            Step::HandedOver { claimer } => {
                let to = executor
                    .owner_references()
                    .iter()
                    .find(|owner| owner.uid == claimer)
                    .map_or(claimer.clone(), |owner| owner.name.clone());
                let message = format!(
                    "handed over to BriqExecutor {to}: its sandbox and kernel are that executor's"
                );
                let claimed = state("False", false, ExecutorReason::Claimed, message);
                self.report(executor, claimed, sandbox_fields(executor))
                    .await?;
                Ok(Action::await_change())
            }
            Step::Suspend { sandbox } => Box::pin(self.suspend(executor, &sandbox)).await,
            Step::Resume { sandbox } => Box::pin(self.resume(executor, &sandbox)).await,
            // Its own changes and its Executions' creation (wake.rs) wake it.
            Step::StaySuspended => Ok(Action::await_change()),
            Step::Snapshot { sandbox } => Box::pin(self.snapshot(executor, &sandbox)).await,
            Step::SnapshotSuspended { sandbox } => {
                Box::pin(self.snapshot_suspended(executor, &sandbox)).await
            }
            // A fork is admitted (its key, its class's limits) before its source is asked to
            // pause for it: one that waits for a place costs its source nothing.
            Step::AwaitSnapshot { reason, message } => match self.admit(executor, false).await? {
                Ok(_) => self.await_snapshot(executor, reason, message).await,
                Err(wait) => Ok(wait),
            },
            Step::RecordFork { origin } => match self.admit(executor, false).await? {
                Ok(_) => self.record_fork(executor, origin).await,
                Err(wait) => Ok(wait),
            },
            Step::RefuseFork { reason, message } => {
                let refused = state("False", true, reason, message.clone());
                self.report(executor, refused, sandbox_fields(executor))
                    .await?;
                self.event(
                    executor,
                    kube::runtime::events::EventType::Warning,
                    reason.as_str(),
                    "Fork",
                    message,
                )
                .await;
                Ok(Action::await_change())
            }
            Step::Probe { sandbox } => {
                let recheck = match self.idleness(executor) {
                    Idleness::Expired { .. } => return self.expire(executor).await,
                    Idleness::IdleFor { remaining } => {
                        remaining.min(self.shared.settings.probe_interval)
                    }
                    Idleness::InUse => self.shared.settings.probe_interval,
                };
                let Some(key) = self.credentials(executor).await? else {
                    return Ok(key_recheck(executor));
                };
                let fields = SandboxFields {
                    id: Some(sandbox.clone()),
                    ..sandbox_fields(executor)
                };
                Box::pin(self.probe(executor, &key, &sandbox, fields, recheck)).await
            }
        }
    }
}
