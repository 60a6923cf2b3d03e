//! Provisioning: the bridge and its dependencies installed in the sandbox and the kernel
//! started ([`Actor::provision`]), judged by [`setup_verdict`]; a setup that failed for good
//! gives the sandbox back. Traced from the executor's creation (trace.rs).

use std::time::{Duration, SystemTime};

use kube::{
    ResourceExt,
    runtime::{controller::Action, events::EventType},
};
use tracing::info;

use super::{
    actor::Actor,
    admit::key_recheck,
    status::{SandboxFields, kernel_ready_of, state},
    trace,
};
use crate::{
    bridge::session::{CallError, Provisioned, Session, SetupError},
    briq::{ApiKey, ErrorClass, SandboxApi},
    controller::context::{Error, Result},
    crd::{BriqExecutor, conditions, reasons::ExecutorReason},
    traces,
};

/// How a provisioning attempt ended.
#[derive(Debug, PartialEq, Eq)]
enum SetupVerdict {
    Ready(Provisioned),
    /// The sandbox disappeared before it was ready: forget it and create another.
    SandboxGone,
    /// Nothing went wrong for good (briq unavailable, connection lost): try again later.
    Retry,
    /// Setup failed for good, with this message: destroy the sandbox.
    Failed(String),
}

fn setup_verdict(outcome: &Result<Provisioned, SetupError>) -> SetupVerdict {
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
        Err(error @ (SetupError::Kernel(_) | SetupError::Env(_))) => {
            SetupVerdict::Failed(error.to_string())
        }
    }
}

/// The Ready event's note: which sandbox, and whether setup had to pip-install anything (a
/// prebuilt sandbox image makes no pip call; see docs/src/concepts.md, "Sandbox image").
fn ready_note(sandbox: &str, provisioned: Provisioned) -> String {
    let setup = if provisioned.pip_installed {
        "setup pip-installed missing requirements"
    } else {
        "setup made no pip call: every requirement was installed already"
    };
    format!("sandbox {sandbox} is ready; {setup}")
}

impl<S: SandboxApi> Actor<'_, S> {
    /// Installs the bridge and its dependencies, starts the kernel and gives it a claimer's
    /// environment (claim/env.rs); a failed setup destroys the sandbox.
    pub(super) async fn provision(
        &self,
        executor: &BriqExecutor,
        key: &ApiKey,
        sandbox: SandboxFields,
        create: Option<traces::Noted>,
    ) -> Result<Action> {
        let Some(env) = self.claim_env(executor).await? else {
            return Ok(key_recheck(executor));
        };
        let id = sandbox.id.clone().unwrap_or_default();
        let provisioning = state(
            "Unknown",
            false,
            ExecutorReason::Provisioning,
            "installing the bridge and starting the kernel",
        );
        self.report(executor, provisioning, sandbox.clone()).await?;
        let session = Session::new(&self.shared.sandboxes, key, &id);
        let deadline = Duration::from_secs(executor.spec.setup_timeout_seconds.into());
        let packages = executor.spec.packages.clone().unwrap_or_default();
        let (outcome, setup) = self
            .slot
            .without(traces::noted(session.provision(deadline, &packages, &env)))
            .await;
        let emit_trace = |failure: Option<&str>| {
            if traces::enabled() {
                let (namespace, name) = (
                    executor.namespace().unwrap_or_default(),
                    executor.name_any(),
                );
                let subject = trace::Subject {
                    namespace: &namespace,
                    executor: &name,
                    sandbox: &id,
                    created: executor
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map_or_else(SystemTime::now, |t| t.0.into()),
                };
                let spans = trace::spans(
                    &subject,
                    create.as_ref(),
                    &setup,
                    failure,
                    SystemTime::now(),
                );
                traces::emit(None, &spans);
            }
        };
        match setup_verdict(&outcome) {
            SetupVerdict::Ready(provisioned) => {
                let fork = match sandbox.fork.clone() {
                    Some(origin) if origin.restored_time.is_none() => {
                        match self.load_fork(key, &id, &origin).await? {
                            Ok(loaded) => Some(loaded),
                            Err(failure) => {
                                return self.fork_failed(executor, &id, sandbox, failure).await;
                            }
                        }
                    }
                    other => other,
                };
                let ready = SandboxFields {
                    ready: Some(conditions::now()),
                    fork,
                    ..sandbox
                };
                self.report(executor, kernel_ready_of(executor), ready)
                    .await?;
                let note = ready_note(&id, provisioned);
                self.event(executor, EventType::Normal, "Ready", "Provision", note)
                    .await;
                emit_trace(None);
                info!(sandbox = %id, "executor ready");
                self.shared
                    .metrics
                    .executor_ready(executor.metadata.creation_timestamp.as_ref());
                Ok(Action::requeue(self.shared.settings.probe_interval))
            }
            SetupVerdict::SandboxGone => {
                self.forget_sandbox(executor).await?;
                Err(retry_error(outcome))
            }
            SetupVerdict::Retry => Err(retry_error(outcome)),
            SetupVerdict::Failed(failure) => {
                // Say so first, so that a failed destroy is retried.
                self.event(
                    executor,
                    EventType::Warning,
                    "SetupFailed",
                    "Provision",
                    failure.clone(),
                )
                .await;
                emit_trace(Some(&failure));
                let failed = state("False", true, ExecutorReason::SetupFailed, failure);
                self.report(executor, failed, sandbox).await?;
                self.shared
                    .metrics
                    .executor_ended(ExecutorReason::SetupFailed);
                self.give_back(executor, &id, ExecutorReason::SetupFailed)
                    .await?;
                Ok(Action::await_change())
            }
        }
    }
}

impl<S: SandboxApi> Actor<'_, S> {
    /// A fork whose snapshot could not be read into its sandbox: it says why, for good, and
    /// gives the sandbox back.
    async fn fork_failed(
        &self,
        executor: &BriqExecutor,
        id: &str,
        sandbox: SandboxFields,
        failure: String,
    ) -> Result<Action> {
        self.event(
            executor,
            EventType::Warning,
            "ForkFailed",
            "Provision",
            failure.clone(),
        )
        .await;
        let failed = state("False", true, ExecutorReason::ForkFailed, failure);
        self.report(executor, failed, sandbox).await?;
        self.shared
            .metrics
            .executor_ended(ExecutorReason::ForkFailed);
        self.give_back(executor, id, ExecutorReason::ForkFailed)
            .await?;
        Ok(Action::await_change())
    }
}

/// The error of a setup attempt that is retried: always a failed bridge call.
fn retry_error(outcome: Result<Provisioned, SetupError>) -> Error {
    match outcome {
        Err(SetupError::Call(error)) => error.into(),
        other => Error::Invariant(format!("setup retried after {other:?}")),
    }
}

#[cfg(test)]
mod tests;
