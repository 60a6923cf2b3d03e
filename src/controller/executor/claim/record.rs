//! The second half of a handover: the claimer records the member it took, and the member's
//! sandbox, in the same conditional status write that reports it Ready ([`record_step`] says
//! what to do with what it finds), so that a claim is two writes to its Ready: the member's and
//! this one. Its finalizer, and the record's copy in its annotations (which survives a lost
//! status), follow in one more write ([`Actor::settle_claim`]), off the claim's path: no
//! Execution runs on an executor without its finalizer (execution/step.rs, `admit`), so every one that
//! runs is drained on deletion, and until then the member, which the claimer owns, keeps the
//! sandbox from leaking (the garbage collector deletes it with the claimer, and its finalizer
//! destroys the sandbox).

use kube::{ResourceExt, api::DeleteParams, runtime::controller::Action};
use tracing::{info, warn};

use super::marks::{Claim, settled};
use crate::controller::executor::{
    actor::Actor,
    status::{SandboxFields, handover_text, kernel_ready, state, status_of},
    step::recorded_sandbox,
};
use crate::{
    bridge::session::{ClaimEnv, Session},
    briq::SandboxApi,
    controller::{
        context::{Error, Result},
        ownership::claimed_member,
        recheck::{CONFLICT_RECHECK, ENV_RETRY},
        status::{Retried, is_conflict, landed, retry_on_conflict},
    },
    crd::{BriqExecutor, CLASS_ANNOTATION, conditions, reasons::ExecutorReason},
    metrics::ClaimOutcome,
};

/// What a claimer that took a member does next, from the member it records (`holds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecordStep {
    /// Record the member (conditional on the claimer's version).
    Write,
    /// Recorded already: an earlier attempt's write landed.
    Recorded,
    /// It holds another member (taken by a second operator): the one just taken is too many.
    GiveBack,
    /// It is being deleted: the member it owns is deleted with it.
    LeaveToCollector,
}

fn record_step(holds: Option<&str>, taken: &str, deleting: bool) -> RecordStep {
    match holds {
        _ if deleting => RecordStep::LeaveToCollector,
        None => RecordStep::Write,
        Some(held) if held == taken => RecordStep::Recorded,
        Some(_) => RecordStep::GiveBack,
    }
}

impl<S: SandboxApi> Actor<'_, S> {
    /// The second half of a handover: the claimer records the member and its sandbox in its
    /// status, with its Ready, in one write conditional on the version it was decided on (the
    /// member's kernel answered; the first Execution confirms the sandbox with briq before any
    /// code goes there); then it settles the claim ([`Actor::settle_claim`]). A claimer with
    /// environment variables has them set in the kernel first: without them it is not Ready,
    /// and provisioning gives them.
    ///
    /// A claimer that changed meanwhile is read afresh: recorded already (an earlier attempt),
    /// it only settles; holding another member (a second operator's claim), the member taken
    /// here is one too many and is deleted, sandbox and all, by its own finalizer.
    pub(crate) async fn record_claim(
        &self,
        executor: &BriqExecutor,
        pool: &str,
        member: BriqExecutor,
        env: &ClaimEnv,
    ) -> Result<Action> {
        let member_status = status_of(&member);
        let Some(id) = recorded_sandbox(&member_status, member.annotations()) else {
            return Err(Error::Invariant(format!(
                "pool member {} was claimed without a sandbox",
                member.name_any()
            )));
        };
        let uid = executor.uid().unwrap_or_default();
        let record = Claim {
            member: member.name_any(),
            sandbox: id.clone(),
            class: member.annotations().get(CLASS_ANNOTATION).cloned(),
        };
        let origin = handover_text(pool, &record.member);
        let env_taken = tokio::sync::OnceCell::new();
        // `Some(claimer)`: recorded; `None`: the claim ends here, the member given back or left
        // to the collector with its deleted claimer.
        let recorded = retry_on_conflict(self.api, executor.clone(), |claimer| async {
            match record_step(
                claimer.claimed_member(),
                &record.member,
                claimer.metadata.deletion_timestamp.is_some(),
            ) {
                RecordStep::Write => {}
                RecordStep::Recorded => return Ok(Some(Some(claimer))),
                RecordStep::GiveBack => {
                    self.handovers.settled(&uid);
                    self.give_back_member(&member).await?;
                    return Ok(Some(None));
                }
                RecordStep::LeaveToCollector => {
                    // Deleted before the record: the member it owns goes with it.
                    self.handovers.settled(&uid);
                    return Ok(Some(None));
                }
            }
            let taken = *env_taken
                .get_or_try_init(async || {
                    Ok::<_, Error>(
                        env.is_empty()
                            || self
                                .deliver_env(&record.applied_to(&claimer), &id, env)
                                .await?,
                    )
                })
                .await?;
            let (state, ready) = if taken {
                (kernel_ready(Some(&origin)), Some(conditions::now()))
            } else {
                let message = format!("{origin}; its environment is given as it is provisioned");
                (
                    state("Unknown", false, ExecutorReason::Provisioning, message),
                    None,
                )
            };
            let fields = SandboxFields {
                id: Some(id.clone()),
                created: member_status.sandbox_created_time.clone(),
                ready,
                suspension: None,
                claimed_member: Some(record.member.clone()),
                fork: None,
                snapshot: None,
            };
            match self.report_at_version(&claimer, state, fields).await {
                Ok(written) => {
                    self.shared.metrics.pool_claimed(ClaimOutcome::Warm);
                    Ok(Some(Some(written)))
                }
                Err(error) if is_conflict(&error) => Ok(None),
                Err(error) => Err(error),
            }
        })
        .await?;
        let claimer = match recorded {
            Retried::Done(Some(claimer)) => claimer,
            Retried::Done(None) => return Ok(Action::await_change()),
            Retried::Gone => {
                self.handovers.settled(&uid);
                return Ok(Action::await_change());
            }
            Retried::KeptChanging => return Ok(Action::requeue(CONFLICT_RECHECK)),
        };
        if !self.settle_claim(&claimer, &record).await? {
            self.handovers.settled(&uid);
            return Ok(Action::requeue(CONFLICT_RECHECK));
        }
        if !conditions::is_true(&status_of(&claimer).conditions, conditions::READY) {
            // Not Ready without its environment: provisioning gives it instead (the recorded
            // sandbox's next step), after installing this release's bridge, which a member made
            // by an older release lacks.
            self.handovers.settled(&uid);
            return Ok(Action::requeue(ENV_RETRY));
        }
        self.handovers.reported(&uid, &record.member);
        // No Event: the Ready condition says where the kernel came from (publish.rs).
        info!(sandbox = %id, member = %record.member, "claimed a pool member");
        Ok(Action::requeue(self.shared.settings.probe_interval))
    }

    /// A claimer whose status records its claim but which does not hold its finalizer and the
    /// record's annotations ([`unsettled_member`]): settles it, with the class of the member it
    /// records (a member gone took its sandbox with it: the claimer's probe finds that).
    pub(crate) async fn settle_recorded(
        &self,
        claimer: &BriqExecutor,
        member: String,
    ) -> Result<Action> {
        let Some(sandbox) = recorded_sandbox(&status_of(claimer), claimer.annotations()) else {
            return Ok(Action::await_change());
        };
        let class = claimed_member(claimer, self.executors, &self.shared.client)
            .await?
            .and_then(|m| m.annotations().get(CLASS_ANNOTATION).cloned());
        let record = Claim {
            member,
            sandbox,
            class,
        };
        if !self.settle_claim(claimer, &record).await? {
            return Ok(Action::requeue(CONFLICT_RECHECK));
        }
        Ok(Action::await_change())
    }

    /// Gives a recorded claimer its finalizer and the record's annotations, in one write
    /// conditional on its version: whether it holds them now (`false`: it is being deleted,
    /// and the member it owns goes with it, or it kept changing).
    async fn settle_claim(&self, claimer: &BriqExecutor, record: &Claim) -> Result<bool> {
        let settled = retry_on_conflict(self.api, claimer.clone(), |claimer| async move {
            if claimer.metadata.deletion_timestamp.is_some() {
                return Ok(Some(false));
            }
            if settled(&claimer, &record.member) {
                return Ok(Some(true));
            }
            let patch = record.settling(&claimer);
            let patched = self.merge(&claimer.name_any(), &patch).await;
            Ok(landed(patched)?.then_some(true))
        })
        .await?;
        Ok(settled == Retried::Done(true))
    }

    /// Gives the claimed kernel the claimer's environment: whether it took it. A failure is
    /// logged without a value; what the bridge said names variables only.
    async fn deliver_env(
        &self,
        claimer: &BriqExecutor,
        sandbox: &str,
        env: &ClaimEnv,
    ) -> Result<bool> {
        let Some(key) = self.credentials(claimer).await? else {
            return Ok(false);
        };
        let session = Session::new(&self.shared.sandboxes, &key, sandbox);
        match session.set_env(env).await {
            Ok(report) if report.ok => Ok(true),
            Ok(report) => {
                warn!(%sandbox, message = %report.message, "the claimed kernel did not take the claimer's environment");
                Ok(false)
            }
            Err(error) => {
                warn!(%sandbox, %error, "giving the claimed kernel the claimer's environment failed");
                Ok(false)
            }
        }
    }

    /// Deletes a member this claimer took one too many of; its finalizer destroys its sandbox.
    async fn give_back_member(&self, member: &BriqExecutor) -> Result<()> {
        warn!(member = %member.name_any(), "a claimer that holds another member took this one too: deleting it");
        match self
            .api
            .delete(&member.name_any(), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
