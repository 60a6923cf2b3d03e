//! Is the recorded sandbox the executor's own, and does it still run? Every sandbox id is
//! tenant-writable, so it is verified with briq before it is used ([`Actor::ownership`]); one
//! that is someone else's is left alone and the executor goes back to its own
//! ([`Actor::disown`]). A ready executor's sandbox is probed ([`Actor::probe`], judged by
//! [`probe_verdict`]): a lost kernel makes the executor unusable.

use std::time::Duration;

use kube::runtime::{controller::Action, events::EventType};
use tracing::warn;

use super::{
    actor::Actor,
    create::{Adoption, Created, adoption},
    status::{SandboxFields, kernel_ready_of, sandbox_fields, state, unusable_state},
};
use crate::{
    briq::{self, ApiKey, SandboxApi, SandboxState},
    controller::{
        context::Result,
        credentials::{class_key, own_key},
        ownership::{
            Ownership, claimed_member, expected_sandbox_name, not_owned_message, ownership,
        },
        status::mark_unusable,
    },
    crd::{
        BriqExecutor,
        conditions::{self, Desired, desired},
        reasons::ExecutorReason,
    },
};

/// What a probe of a ready executor's sandbox found.
#[derive(Debug, PartialEq, Eq)]
enum ProbeVerdict {
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
fn briq_unreachable(ready: [Desired; 2], why: &str) -> Vec<Desired> {
    let unreachable = desired(
        conditions::BRIQ_REACHABLE,
        "False",
        ExecutorReason::BriqUnreachable.as_str(),
        format!("briq did not answer the last probe ({why}); Executions wait for it"),
    );
    ready.into_iter().chain([unreachable]).collect()
}

fn probe_verdict(
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

impl<S: SandboxApi> Actor<'_, S> {
    /// A sleeping, restarted or vanished sandbox has lost its kernel, and with it the Python
    /// state the Executions rely on: the executor becomes unusable. The probe is a GET, which
    /// does not count as use, so it does not keep an idle sandbox awake.
    pub(super) async fn probe(
        &self,
        executor: &BriqExecutor,
        key: &ApiKey,
        id: &str,
        sandbox: SandboxFields,
        recheck: Duration,
    ) -> Result<Action> {
        let found = self.shared.sandboxes.get_sandbox(key, id).await;
        let expected = self.expected_name(executor).await?;
        match probe_verdict(id, &expected, &found) {
            ProbeVerdict::Running => {
                self.report(executor, kernel_ready_of(executor), sandbox)
                    .await?;
                Ok(Action::requeue(recheck))
            }
            ProbeVerdict::NotOwned => self.disown(executor, key, id, true).await,
            ProbeVerdict::Unreachable(why) => {
                // Concludes nothing: probed again as usual, once briq's pause allows.
                let unreachable = briq_unreachable(kernel_ready_of(executor), &why);
                self.report(executor, unreachable, sandbox).await?;
                Ok(Action::requeue(recheck))
            }
            ProbeVerdict::Retry => Err(found.expect_err("a retry follows an error").into()),
            ProbeVerdict::Lost(lost) => {
                // Its Warning Event (`Unusable`, with why) comes with the mark.
                mark_unusable(self.shared, executor, &lost).await?;
                self.report(executor, unusable_state(&lost), sandbox)
                    .await?;
                Ok(Action::await_change())
            }
        }
    }

    /// Whose the sandbox `id`, named in a tenant-writable field, is, as briq tells it.
    pub(super) async fn ownership(
        &self,
        executor: &BriqExecutor,
        key: &ApiKey,
        id: &str,
    ) -> Result<Ownership> {
        let found = self.shared.sandboxes.get_sandbox(key, id).await;
        let expected = self.expected_name(executor).await?;
        match ownership(&expected, &found) {
            Some(ownership) => Ok(ownership),
            None => Err(found.expect_err("briq did not say").into()),
        }
    }

    /// The name briq must show for this executor's sandbox (a claimer's is its member's).
    pub(super) async fn expected_name(&self, executor: &BriqExecutor) -> Result<String> {
        let member = claimed_member(executor, self.executors, &self.shared.client).await?;
        Ok(expected_sandbox_name(executor, member.as_ref()))
    }

    /// The executor names someone else's sandbox (a copied manifest, a restored backup, or a
    /// tenant trying to reach another's kernel): say so, never touch it, and go back to the
    /// executor's own sandbox, found under its own name. A ready executor whose own sandbox
    /// cannot be found has lost its kernel.
    pub(super) async fn disown(
        &self,
        executor: &BriqExecutor,
        key: &ApiKey,
        foreign: &str,
        was_ready: bool,
    ) -> Result<Action> {
        let message = not_owned_message(foreign);
        warn!(sandbox = %foreign, "refused a sandbox that belongs to another object");
        self.event(
            executor,
            EventType::Warning,
            "SandboxNotOwned",
            "Verify",
            message.clone(),
        )
        .await;
        let found = self
            .shared
            .sandboxes
            .find_sandboxes_by_name(key, &self.expected_name(executor).await?)
            .await?;
        match adoption(found) {
            Some(Adoption { keep, .. }) => {
                // Duplicates, if any, are the create path's to resolve; here only the record is
                // put right.
                self.record_sandbox(executor, &keep).await?;
                let fields = SandboxFields {
                    id: Some(keep),
                    ..sandbox_fields(executor)
                };
                let state = if was_ready {
                    kernel_ready_of(executor)
                } else {
                    state("Unknown", false, ExecutorReason::SandboxNotOwned, message)
                };
                self.report(executor, state, fields).await?;
                Ok(Action::await_change())
            }
            None if was_ready => {
                let lost = format!("{message}; its own sandbox no longer exists");
                mark_unusable(self.shared, executor, &lost).await?;
                self.report(executor, unusable_state(&lost), SandboxFields::default())
                    .await?;
                Ok(Action::await_change())
            }
            None => {
                // Nothing of its own yet (a copied manifest): it gets a sandbox of its own.
                let class = match self.admit(executor, true).await? {
                    Ok(class) => class,
                    Err(wait) => return Ok(wait),
                };
                // Its key is that of the class it gets now, not of what its annotations said.
                let key = &match &class {
                    Some(class) => class_key(self.shared, class).await?,
                    None => own_key(self.shared, executor).await?.0,
                };
                let id = match self.create_sandbox(executor, key, false, class).await? {
                    Created::Sandbox(id) => id,
                    Created::Not(recheck) => return Ok(Action::requeue(recheck)),
                };
                let fields = SandboxFields::created(id, executor);
                self.provision(executor, key, fields, None).await
            }
        }
    }
}

#[cfg(test)]
mod tests;
