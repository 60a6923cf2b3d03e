//! Admission: what an executor needs before it gets a sandbox (or claims one). Its API key
//! ([`Actor::credentials`]), and, if it takes a class, the class itself, its consent to the
//! executor's spec and namespace, and a place under its `perNamespace.maxExecutors`
//! ([`Actor::admit`]). Each wait is said in the status, with an Event when it starts.

use std::sync::Arc;

use kube::{
    ResourceExt,
    runtime::{controller::Action, events::EventType},
};

use super::{
    actor::Actor,
    status::{sandbox_fields, state, status_of},
};
use crate::{
    briq::{ApiKey, SandboxApi},
    controller::{
        class,
        context::{Error, Result},
        credentials::{class_of, key_and_secret},
        index::live_neighbours,
        key_guard,
        recheck::{self, Wait},
        requeue::waited,
    },
    crd::{
        BriqExecutor, BriqExecutorClass, CREATE_PENDING_ANNOTATION, SANDBOX_ID_ANNOTATION,
        conditions, reasons::ExecutorReason,
    },
};

impl<S: SandboxApi> Actor<'_, S> {
    /// The executor's API key; `None` (reported in the status) while there is none to use. Its
    /// Secret, if it comes from one, is protected from deletion first: every step that asks for
    /// it has or makes a sandbox, which the finalizer must be able to destroy.
    pub(super) async fn credentials(&self, executor: &BriqExecutor) -> Result<Option<ApiKey>> {
        match key_and_secret(self.shared, executor).await {
            Ok((key, secret)) => {
                if let Some(secret) = &secret {
                    key_guard::protect(self.shared, secret).await?;
                }
                Ok(Some(key))
            }
            Err(Error::ClassMissing(name)) => {
                let message =
                    format!("no BriqExecutorClass {name}, which its sandbox was made under");
                let waiting = state("False", false, ExecutorReason::ClassNotFound, message);
                self.report(executor, waiting, sandbox_fields(executor))
                    .await?;
                Ok(None)
            }
            Err(Error::ApiKey(message)) => {
                let waiting = state("False", false, ExecutorReason::ApiKeyMissing, message);
                self.report(executor, waiting, sandbox_fields(executor))
                    .await?;
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// The class the executor's sandbox is made (or claimed) under, if it takes one: it must
    /// exist and allow the executor's spec and namespace. `Err`: it waits (reported in the
    /// status), woken when a class changes. An executor that has or is making a sandbox is not
    /// asked again (its class may change, and it keeps running) unless it is to get a sandbox
    /// of its own `anew`: then what its annotations say (copied with a manifest) counts for
    /// nothing.
    pub(super) async fn admit(
        &self,
        executor: &BriqExecutor,
        anew: bool,
    ) -> Result<Result<Option<Arc<BriqExecutorClass>>, Action>> {
        let recorded = match anew {
            true => class::Recorded::NotYet,
            false => class::recorded(executor.annotations()),
        };
        let (resolved, labels) = class_of(self.shared, executor, recorded).await?;
        let class = match resolved {
            class::Resolved::Unclassed => return Ok(Ok(None)),
            class::Resolved::Class(class) => class,
            class::Resolved::Missing(name) => {
                let message = format!("no BriqExecutorClass {name}; waiting for it to be created");
                return self
                    .wait_for_class(executor, ExecutorReason::ClassNotFound, message)
                    .await;
            }
        };
        if recorded != class::Recorded::NotYet {
            return Ok(Ok(Some(class)));
        }
        let namespace = executor.namespace().unwrap_or_default();
        let broken = class::violations(
            &class.name_any(),
            &class.spec,
            &executor.spec,
            &namespace,
            &labels,
        );
        if broken.is_empty() {
            if let Some(message) = self.at_capacity(executor, &class, &labels) {
                return self
                    .wait_for_class(executor, ExecutorReason::WaitingForCapacity, message)
                    .await;
            }
            return Ok(Ok(Some(class)));
        }
        let message = format!(
            "{}; no sandbox is made (create an executor within the class's limits)",
            broken.join("; ")
        );
        self.wait_for_class(executor, ExecutorReason::ClassRefused, message)
            .await
    }

    /// Says the executor waits on its class for `reason` (`ClassRefused` is `Stalled`: only a
    /// change of the class ends it), with an Event when it starts to; woken by a change of a
    /// class or of an executor of its namespace, else rechecked.
    async fn wait_for_class<T>(
        &self,
        executor: &BriqExecutor,
        reason: ExecutorReason,
        message: String,
    ) -> Result<Result<T, Action>> {
        let already = conditions::find(&status_of(executor).conditions, conditions::READY)
            .is_some_and(|ready| ready.reason == reason.as_str());
        // The Event first: whoever sees the status can find it.
        if !already {
            let type_ = match reason {
                ExecutorReason::WaitingForCapacity => EventType::Normal,
                _ => EventType::Warning,
            };
            self.event(executor, type_, reason.as_str(), "Admit", message.clone())
                .await;
        }
        let stalled = reason == ExecutorReason::ClassRefused;
        let waiting = state("False", stalled, reason, message);
        self.report(executor, waiting, sandbox_fields(executor))
            .await?;
        Ok(Err(Action::requeue(recheck::recheck(Wait::Class))))
    }

    /// Why `executor`, not made yet, must wait for a place under `class`'s `maxExecutors` in
    /// its namespace (labelled `labels`), if it must: the executors of the class holding a
    /// sandbox there, and those waiting since before it, fill the places.
    fn at_capacity(
        &self,
        executor: &BriqExecutor,
        made_under: &BriqExecutorClass,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Option<String> {
        let max = made_under
            .spec
            .per_namespace
            .as_ref()
            .and_then(|limits| limits.max_executors)?;
        let name = made_under.name_any();
        let namespace = executor.namespace().unwrap_or_default();
        let classes = self.shared.classes.state();
        let others: Vec<class::Holder> = live_neighbours(self.executors, executor)
            .filter(|other| other.claimed_by().is_none())
            .map(|other| holder(&other, &name, &classes, labels))
            .collect();
        let created = creation(executor);
        let ahead = class::executors_ahead(&others, &created, &executor.name_any());
        (ahead >= max as usize).then(|| {
            let holding = others.iter().filter(|o| o.holds).count();
            format!(
                "namespace {namespace} has {holding} executors of class {name} holding a sandbox \
                 and {} waiting before this one, its perNamespace.maxExecutors is {max}; this one \
                 makes its sandbox when one of them goes",
                ahead - holding
            )
        })
    }
}

/// When an executor waiting for its key Secret looks for it again.
pub(super) fn key_recheck(executor: &BriqExecutor) -> Action {
    Action::requeue(recheck::recheck(Wait::KeySecret {
        waited: waited(executor),
    }))
}

/// `other`, as the `maxExecutors` of class `name` counts it (its namespace labelled `labels`).
fn holder(
    other: &BriqExecutor,
    name: &str,
    classes: &[Arc<BriqExecutorClass>],
    labels: &std::collections::BTreeMap<String, String>,
) -> class::Holder {
    let recorded = class::recorded(other.annotations());
    let holds = recorded == class::Recorded::Class(name)
        && (other.annotations().contains_key(SANDBOX_ID_ANNOTATION)
            || other.annotations().contains_key(CREATE_PENDING_ANNOTATION));
    let stalled = conditions::find(&status_of(other).conditions, conditions::STALLED)
        .is_some_and(|c| c.status == "True");
    let of_class = matches!(
        class::resolve(&other.spec, recorded, classes, labels),
        class::Resolved::Class(c) if c.name_any() == name
    );
    let waits = recorded == class::Recorded::NotYet && of_class && !stalled;
    class::Holder {
        holds,
        waits_since: waits.then(|| (creation(other), other.name_any())),
    }
}

/// When `executor` was created, as text that sorts in time.
fn creation(executor: &BriqExecutor) -> String {
    executor
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_default()
}
