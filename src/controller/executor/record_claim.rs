//! The second half of a handover: the claimer records the member it took, and the member's
//! sandbox, in one conditional write ([`record_step`] says what to do with what it finds), and
//! is Ready at once.

use kube::{
    ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    runtime::controller::Action,
};
use serde_json::json;
use tracing::{info, warn};

use super::{
    actor::{Actor, CONFLICT_RECHECK, RECORD_ATTEMPTS},
    status::{SandboxFields, handover_text, kernel_ready, status_of},
    step::recorded_sandbox,
};
use crate::{
    bridge::session::{ClaimEnv, Session},
    briq::SandboxApi,
    controller::{
        context::{Error, Result},
        status::is_conflict,
    },
    crd::{
        BriqExecutor, CLAIMED_MEMBER_ANNOTATION, CLASS_ANNOTATION, FINALIZER,
        SANDBOX_ID_ANNOTATION, conditions,
    },
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

/// When a claimer whose environment the claimed kernel did not take looks again (its next
/// step provisions the sandbox, which gives it).
const ENV_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

fn record_step(holds: Option<&str>, taken: &str, deleting: bool) -> RecordStep {
    match holds {
        _ if deleting => RecordStep::LeaveToCollector,
        None => RecordStep::Write,
        Some(held) if held == taken => RecordStep::Recorded,
        Some(_) => RecordStep::GiveBack,
    }
}

impl<S: SandboxApi> Actor<'_, S> {
    /// The second half of a handover: the claimer records the member and its sandbox, with its
    /// finalizer, in one write conditional on the version it was decided on, and is Ready at
    /// once (the member's kernel answered; the first Execution confirms the sandbox with briq
    /// before any code goes there).
    ///
    /// A claimer that changed meanwhile is read afresh: recorded already (an earlier attempt),
    /// it only reports; holding another member (a second operator's claim), the member taken
    /// here is one too many and is deleted, sandbox and all, by its own finalizer.
    pub(super) async fn record_claim(
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
        // The member's sandbox was made with its class's key, which is the claimer's from now on.
        let made_under = member.annotations().get(CLASS_ANNOTATION);
        let mut claimer = executor.clone();
        let mut recorded = None;
        for _ in 0..RECORD_ATTEMPTS {
            let holds = claimer
                .annotations()
                .get(CLAIMED_MEMBER_ANNOTATION)
                .cloned();
            match record_step(
                holds.as_deref(),
                &member.name_any(),
                claimer.metadata.deletion_timestamp.is_some(),
            ) {
                RecordStep::Write => {}
                RecordStep::Recorded => {
                    recorded = Some(claimer);
                    break;
                }
                RecordStep::GiveBack => {
                    self.handovers.settled(&uid);
                    self.give_back_member(&member).await?;
                    return Ok(Action::await_change());
                }
                RecordStep::LeaveToCollector => {
                    // Deleted before the record: the member it owns goes with it.
                    self.handovers.settled(&uid);
                    return Ok(Action::await_change());
                }
            }
            let mut finalizers = claimer.finalizers().to_vec();
            if !finalizers.iter().any(|f| f == FINALIZER) {
                finalizers.push(FINALIZER.to_owned());
            }
            let patch = json!({ "metadata": {
                "resourceVersion": claimer.resource_version(),
                "finalizers": finalizers,
                "annotations": {
                    CLAIMED_MEMBER_ANNOTATION: member.name_any(),
                    SANDBOX_ID_ANNOTATION: id,
                    CLASS_ANNOTATION: made_under,
                },
            } });
            let patched = self
                .api
                .patch(
                    &claimer.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(Error::from);
            match patched {
                Ok(written) => {
                    self.shared.metrics.pool_claimed(ClaimOutcome::Warm);
                    recorded = Some(written);
                    break;
                }
                Err(error) if is_conflict(&error) => {
                    match self.api.get_opt(&claimer.name_any()).await? {
                        Some(fresh) => claimer = fresh,
                        None => {
                            self.handovers.settled(&uid);
                            return Ok(Action::await_change());
                        }
                    }
                }
                Err(error) => return Err(error),
            }
        }
        let Some(claimer) = recorded else {
            return Ok(Action::requeue(CONFLICT_RECHECK));
        };
        if !env.is_empty() && !self.deliver_env(&claimer, &id, env).await? {
            // Not Ready without its environment: provisioning gives it instead (the recorded
            // sandbox's next step), after installing this release's bridge, which a member made
            // by an older release lacks.
            self.handovers.settled(&uid);
            return Ok(Action::requeue(ENV_RETRY));
        }
        let origin = handover_text(pool, &member.name_any());
        let ready = kernel_ready(Some(&origin));
        let fields = SandboxFields {
            id: Some(id.clone()),
            created: member_status.sandbox_created_time.clone(),
            ready: Some(conditions::now()),
            suspension: None,
        };
        self.report(&claimer, ready, fields).await?;
        self.handovers.reported(&uid, &member.name_any());
        // No Event: the Ready condition says where the kernel came from (publish.rs).
        info!(sandbox = %id, member = %member.name_any(), "claimed a pool member");
        Ok(Action::requeue(self.shared.settings.probe_interval))
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
        let session = Session {
            api: &self.shared.sandboxes,
            key: &key,
            sandbox_id: sandbox,
        };
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
