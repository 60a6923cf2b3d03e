//! Creating the executor's one sandbox: under a pending create (pending_create.rs), so that of
//! several operators only one creates; adopting the sandbox an uncertain create left
//! ([`adoption`]); recording it, so that a second one is destroyed at once.

use std::{sync::Arc, time::Duration};

use k8s_openapi::jiff::Timestamp;
use kube::{ResourceExt, runtime::events::EventType};
use serde_json::json;
use tracing::{info, warn};

use super::{
    actor::Actor,
    class_status::Interface,
    pending_create::{self, PendingCreate},
    status::{sandbox_fields, state, status_of},
    step::recorded_sandbox,
};
use crate::{
    briq::{self, ApiKey, CreateSandbox, ErrorClass, SandboxApi, sandbox_name},
    controller::{
        class,
        context::{Error, Result},
        ownership::Ownership,
        recheck::CONFLICT_RECHECK,
        status::{Retried, retry_on_conflict},
    },
    crd::{
        BriqExecutor, BriqExecutorClass, CLASS_ANNOTATION, CREATE_PENDING_ANNOTATION,
        SANDBOX_ID_ANNOTATION, reasons::ExecutorReason,
    },
};

/// What to do with the sandboxes found under the executor's deterministic name after an
/// uncertain create: keep the oldest, destroy the rest. `None`: the create never took effect.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Adoption {
    pub(super) keep: String,
    pub(super) duplicates: Vec<String>,
}

pub(super) fn adoption(mut found: Vec<briq::Sandbox>) -> Option<Adoption> {
    found.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    let mut ids = found.into_iter().map(|sandbox| sandbox.id);
    let keep = ids.next()?;
    Some(Adoption {
        keep,
        duplicates: ids.collect(),
    })
}

/// What became of a create step.
pub(super) enum Created {
    /// The executor's sandbox, created or adopted and recorded.
    Sandbox(String),
    /// None (yet): decide again after this long.
    Not(Duration),
}

impl<S: SandboxApi> Actor<'_, S> {
    /// Creates the executor's one sandbox, or adopts the one an uncertain create left; or says
    /// when to look again (another operator marked the create pending, or briq refused for good, which
    /// is reported in the status).
    pub(super) async fn create_sandbox(
        &self,
        executor: &BriqExecutor,
        key: &ApiKey,
        pending: bool,
        class: Option<Arc<BriqExecutorClass>>,
    ) -> Result<Created> {
        let name = sandbox_name(
            &executor.namespace().unwrap_or_default(),
            &executor.name_any(),
            &executor.uid().unwrap_or_default(),
        );
        let mark = executor
            .annotations()
            .get(CREATE_PENDING_ANNOTATION)
            .map(String::as_str)
            .filter(|_| pending);
        if let Some(mark) = mark {
            let expiry = self.shared.settings.pending_create_expiry;
            let now = Timestamp::now();
            if let PendingCreate::Wait(left) =
                pending_create::pending_create(mark, &self.shared.holder, now, expiry)
            {
                info!(
                    mark,
                    ?left,
                    "another operator marked the sandbox's create pending"
                );
                return Ok(Created::Not(left));
            }
            // An earlier create has no recorded outcome. The name is deterministic, so look.
            let found = self
                .shared
                .sandboxes
                .find_sandboxes_by_name(key, &name)
                .await?;
            if let Some(Adoption { keep, duplicates }) = adoption(found) {
                for duplicate in &duplicates {
                    self.shared
                        .sandboxes
                        .destroy_sandbox(key, duplicate)
                        .await?;
                    warn!(sandbox = %duplicate, "destroyed a duplicate sandbox left by an uncertain create");
                }
                if !self.record_created(executor, key, &keep).await? {
                    return Ok(Created::Not(CONFLICT_RECHECK));
                }
                let note = format!("found sandbox {keep} created before a restart");
                self.event(
                    executor,
                    EventType::Normal,
                    "SandboxAdopted",
                    "Create",
                    note,
                )
                .await;
                return Ok(Created::Sandbox(keep));
            }
            // Nothing by that name, and no create under that mark is in flight: it never took
            // effect. Claimed anew below, so that only one operator creates now.
        }
        // The pending-create mark is conditional on the version the decision was made on: of two
        // operators that decided at once, one marks and the other decides again.
        let mark = pending_create::mark_value(Timestamp::now(), &self.shared.holder);
        // With the mark, the class: the sandbox is made with its key, whatever becomes the
        // default later (none: a class a copied manifest brought goes).
        let annotations = json!({
            CREATE_PENDING_ANNOTATION: mark,
            CLASS_ANNOTATION: class.as_ref().map(|c| c.name_any()),
        });
        if !self.annotate_at(executor, annotations).await? {
            return Ok(Created::Not(CONFLICT_RECHECK));
        }
        self.report_provisioning(executor, "creating the sandbox")
            .await?;
        let effective = class::effective(&executor.spec, class.as_ref().map(|c| &c.spec));
        let request = CreateSandbox {
            name,
            image: effective.image,
            size: effective.size,
            sleep: effective.sleep,
            env: executor
                .spec
                .env
                .iter()
                .flatten()
                .map(|var| (var.name.clone(), var.value.clone()))
                .collect(),
        };
        // On any error the pending marker stays, and the next attempt looks before it creates.
        // A fork is briq's fork of its source's sandbox, under the fork's own name.
        let made = match status_of(executor).fork {
            Some(origin) => {
                self.shared
                    .sandboxes
                    .fork_sandbox(key, &origin.source_sandbox, &request.name, &request.sleep)
                    .await
            }
            None => self.shared.sandboxes.create_sandbox(key, &request).await,
        };
        let sandbox = match made {
            Ok(sandbox) => sandbox,
            Err(error) if error.class() == ErrorClass::Terminal => {
                let reason = match &error {
                    briq::Error::InterfaceMismatch { mismatches } => {
                        if let Some(class) = &class {
                            let found =
                                Interface::Mismatch(briq::conformance::describe(mismatches));
                            self.report_class_interface(class, found).await;
                        }
                        ExecutorReason::BriqInterfaceMismatch
                    }
                    _ => ExecutorReason::BriqRefused,
                };
                let refused = state("False", false, reason, error.to_string());
                self.report(executor, refused, sandbox_fields(executor))
                    .await?;
                return Err(error.into());
            }
            Err(error)
                if error.class() == ErrorClass::NotFound && status_of(executor).fork.is_some() =>
            {
                let failure = format!("briq could not fork the source's sandbox: {error}");
                let failed = state("False", true, ExecutorReason::ForkFailed, failure);
                self.report(executor, failed, sandbox_fields(executor))
                    .await?;
                return Ok(Created::Not(CONFLICT_RECHECK));
            }
            Err(error) => return Err(error.into()),
        };
        if let Some(class) = &class {
            self.report_class_interface(class, Interface::Matches).await;
        }
        if !self.record_created(executor, key, &sandbox.id).await? {
            return Ok(Created::Not(CONFLICT_RECHECK));
        }
        let note = format!("created sandbox {}", sandbox.id);
        self.event(
            executor,
            EventType::Normal,
            "SandboxCreated",
            "Create",
            note,
        )
        .await;
        info!(sandbox = %sandbox.id, "sandbox created");
        Ok(Created::Sandbox(sandbox.id))
    }

    /// Records `id`, a sandbox of this executor's own that this process just created or found,
    /// unless another one got recorded meanwhile (another operator's create won): then `id` is
    /// a duplicate, destroyed at once, and the answer is false.
    async fn record_created(
        &self,
        executor: &BriqExecutor,
        key: &ApiKey,
        id: &str,
    ) -> Result<bool> {
        let fresh = self.api.get(&executor.name_any()).await?;
        let recorded = retry_on_conflict(self.api, fresh, |fresh: BriqExecutor| async move {
            match recorded_sandbox(&status_of(&fresh), fresh.annotations()) {
                Some(recorded) if recorded == id => return Ok(Some(true)),
                // Only a sandbox of this executor's own can have won; a foreign id (a copied
                // manifest) is overwritten.
                Some(recorded)
                    if self.ownership(executor, key, &recorded).await? == Ownership::Owned =>
                {
                    self.shared.sandboxes.destroy_sandbox(key, id).await?;
                    let note = format!(
                        "destroyed sandbox {id}: sandbox {recorded} was recorded first by another create"
                    );
                    warn!(sandbox = %id, %recorded, "destroyed a sandbox that lost the race to be recorded");
                    self.event(
                        executor,
                        EventType::Normal,
                        "SandboxDestroyed",
                        "Create",
                        note,
                    )
                    .await;
                    return Ok(Some(false));
                }
                _ => {}
            }
            let annotations = json!({ SANDBOX_ID_ANNOTATION: id, CREATE_PENDING_ANNOTATION: null });
            Ok(self.annotate_at(&fresh, annotations).await?.then_some(true))
        })
        .await?;
        if let Retried::Done(won) = recorded {
            return Ok(won);
        }
        Err(Error::Invariant(format!(
            "sandbox {id} could not be recorded: the executor kept changing"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::executor::fixtures::sandbox;

    #[test]
    fn adoption_keeps_the_oldest_and_destroys_the_rest() {
        assert_eq!(adoption(vec![]), None);
        assert_eq!(
            adoption(vec![sandbox("bq_b", "2026-12-03T00:00:02Z")]),
            Some(Adoption {
                keep: "bq_b".into(),
                duplicates: vec![]
            })
        );
        assert_eq!(
            adoption(vec![
                sandbox("bq_c", "2026-12-03T00:00:03Z"),
                sandbox("bq_z", "2026-12-03T00:00:01Z"),
                sandbox("bq_a", "2026-12-03T00:00:03Z"),
            ]),
            Some(Adoption {
                keep: "bq_z".into(),
                duplicates: vec!["bq_a".into(), "bq_c".into()]
            }),
            "oldest first, ties broken by id"
        );
    }
}
