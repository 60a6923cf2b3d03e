//! The executor's sandbox, before any code goes to it (a run or a recovery): its API key, and
//! briq's word that the sandbox the executor's (tenant-writable) status names is its own.

use kube::{ResourceExt, runtime::controller::Action};

use super::{actor::Actor, conclude::Verdict};
use crate::{
    bridge::session::Session,
    briq::SandboxApi,
    controller::{
        context::{Error, Result},
        credentials::api_key,
        ownership::{
            Ownership, claimed_member, expected_sandbox_name, not_owned_message, ownership,
        },
        recheck::{self, Wait},
        requeue::waited,
    },
    crd::{BriqExecutor, ExecutionStatus, reasons::ExecutionReason},
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
        Session {
            api: &self.ctx.shared.sandboxes,
            key,
            sandbox_id,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_is_sent_only_to_a_sandbox_briq_confirms_as_the_executors_own() {
        assert_eq!(ownership_verdict("bq_1", &Ownership::Owned), None);
        let foreign = ownership_verdict("bq_victim", &Ownership::Foreign).unwrap();
        assert_eq!(foreign.reason, ExecutionReason::SandboxNotOwned);
        assert_eq!(
            foreign.unusable, None,
            "the executor's own sandbox is untouched"
        );
        assert!(foreign.message.contains("bq_victim") && foreign.message.contains("not sent"));
        let gone = ownership_verdict("bq_1", &Ownership::Gone).unwrap();
        assert_eq!(gone.reason, ExecutionReason::KernelLost);
        assert!(gone.unusable.is_some());
    }
}
