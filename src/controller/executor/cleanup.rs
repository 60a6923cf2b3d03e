//! Destroying sandboxes: every one a deleted executor may own ([`cleanup`]), verified as its
//! own first, then its key Secret released; and the sandbox of an executor that ended for good
//! ([`Actor::give_back`]).

use std::collections::{BTreeMap, BTreeSet};

use kube::{
    ResourceExt,
    api::ListParams,
    runtime::{controller::Action, events::EventType},
};
use serde_json::json;
use tracing::{info, warn};

use super::{
    actor::Actor,
    status::{sandbox_fields, state, status_of},
};
use crate::{
    briq::{DestroyOutcome, SandboxApi, sandbox_name},
    controller::{
        context::{Error, Result},
        credentials::api_key,
        key_guard,
        ownership::{Ownership, not_owned_message},
    },
    crd::{
        BriqExecutor, BriqExecutorStatus, CREATE_PENDING_ANNOTATION, SANDBOX_ID_ANNOTATION,
        conditions, reasons::ExecutorReason,
    },
};

/// The sandboxes a deleted executor may own: every recorded id (destroyed only once verified as
/// its own), and those found under its own name.
#[derive(Debug, PartialEq, Eq)]
struct Cleanup {
    ids: BTreeSet<String>,
    look_up_by_name: bool,
}

/// `None`: the executor owns no sandbox; its finalizer can go at once.
fn cleanup(status: &BriqExecutorStatus, annotations: &BTreeMap<String, String>) -> Option<Cleanup> {
    let ids: BTreeSet<String> = status
        .sandbox_id
        .iter()
        .chain(annotations.get(SANDBOX_ID_ANNOTATION))
        .cloned()
        .collect();
    // The recorded ids are tenant-writable: the sandbox under this executor's own name is
    // destroyed too, so that a rewritten id cannot leak it.
    let look_up_by_name = annotations.contains_key(CREATE_PENDING_ANNOTATION) || !ids.is_empty();
    look_up_by_name.then_some(Cleanup {
        ids,
        look_up_by_name,
    })
}

impl<S: SandboxApi> Actor<'_, S> {
    /// Destroys every sandbox this executor may own. The finalizer is removed only when all are
    /// confirmed gone; each failure is an Event and a condition, and is retried with backoff.
    pub(super) async fn cleanup(&self, executor: &BriqExecutor) -> Result<Action> {
        let Some(plan) = cleanup(&status_of(executor), executor.annotations()) else {
            return Ok(Action::await_change());
        };
        let sandbox = sandbox_fields(executor);
        let mut ids = plan.ids;
        let listed = ids.iter().cloned().collect::<Vec<_>>().join(", ");
        let terminating = state(
            "False",
            false,
            ExecutorReason::Terminating,
            format!("destroying sandbox {listed}"),
        );
        // A failed destroy keeps saying so while it is retried.
        let ready_reason = conditions::find(&status_of(executor).conditions, conditions::READY)
            .map(|c| c.reason.clone());
        if ready_reason.as_deref() != Some(ExecutorReason::DestroyFailed.as_str()) {
            self.report(executor, terminating, sandbox.clone()).await?;
        }
        let outcome = async {
            let key = api_key(self.shared, executor).await?;
            if plan.look_up_by_name {
                let name = sandbox_name(
                    &executor.namespace().unwrap_or_default(),
                    &executor.name_any(),
                    &executor.uid().unwrap_or_default(),
                );
                let found = self.shared.sandboxes.find_sandboxes_by_name(&key, &name);
                ids.extend(found.await?.into_iter().map(|s| s.id));
            }
            for id in ids.clone() {
                if self.ownership(executor, &key, &id).await? == Ownership::Foreign {
                    ids.remove(&id);
                    let note = not_owned_message(&id);
                    self.event(
                        executor,
                        EventType::Warning,
                        "SandboxNotOwned",
                        "Destroy",
                        note,
                    )
                    .await;
                }
            }
            for id in &ids {
                match self.shared.sandboxes.destroy_sandbox(&key, id).await? {
                    DestroyOutcome::Destroyed => info!(sandbox = %id, "sandbox destroyed"),
                    DestroyOutcome::AlreadyGone => info!(sandbox = %id, "sandbox was already gone"),
                }
            }
            Ok::<_, Error>(())
        }
        .await;
        match outcome {
            Ok(()) => {
                self.release_key(executor).await;
                let note = format!(
                    "destroyed sandbox {}",
                    ids.into_iter().collect::<Vec<_>>().join(", ")
                );
                self.event(
                    executor,
                    EventType::Normal,
                    "SandboxDestroyed",
                    "Destroy",
                    note,
                )
                .await;
                Ok(Action::await_change())
            }
            Err(error) => {
                let message = format!("destroying the sandbox failed, retrying: {error}");
                self.event(
                    executor,
                    EventType::Warning,
                    "DestroyFailed",
                    "Destroy",
                    message.clone(),
                )
                .await;
                let failed = state("False", false, ExecutorReason::DestroyFailed, message);
                if let Err(report_error) = self.report(executor, failed, sandbox).await {
                    warn!(%report_error, "could not report the failed destroy");
                }
                Err(error)
            }
        }
    }

    /// After a confirmed destroy: the executor's key Secret is released unless another executor
    /// of the namespace uses it. Two executors finishing at once may each still see the other;
    /// the sweeper, woken by their deletion, releases it then. A failure is only logged.
    async fn release_key(&self, executor: &BriqExecutor) {
        let Some(reference) = &executor.spec.api_key_secret_ref else {
            return;
        };
        let released = async {
            let others = self.api.list(&ListParams::default()).await?;
            let uid = executor.uid().unwrap_or_default();
            if key_guard::secret_used_by_others(&others.items, &reference.name, &uid) {
                return Ok(());
            }
            let namespace = executor.namespace().unwrap_or_default();
            key_guard::release(self.shared, &namespace, &reference.name).await
        }
        .await;
        if let Err(error) = released {
            warn!(%error, secret = %reference.name, "could not release the API key Secret; the sweeper will");
        }
    }

    /// Destroys the sandbox of an executor that ended for good (`why`), if it is the
    /// executor's own, and forgets it.
    pub(super) async fn give_back(
        &self,
        executor: &BriqExecutor,
        id: &str,
        why: ExecutorReason,
    ) -> Result<()> {
        let key = api_key(self.shared, executor).await?;
        if self.ownership(executor, &key, id).await? == Ownership::Owned {
            self.shared.sandboxes.destroy_sandbox(&key, id).await?;
        }
        self.annotate(executor, json!({ SANDBOX_ID_ANNOTATION: null }))
            .await?;
        info!(sandbox = %id, reason = %why, "destroyed the sandbox of a concluded executor");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::executor::fixtures::{annotations, ready, status};

    #[test]
    fn cleanup_table() {
        let both = annotations(&[
            (SANDBOX_ID_ANNOTATION, "bq_a"),
            (CREATE_PENDING_ANNOTATION, "t"),
        ]);
        let cases = [
            (status(&ready(), None), annotations(&[]), None),
            (
                status(&ready(), Some("bq_1")),
                annotations(&[(SANDBOX_ID_ANNOTATION, "bq_1")]),
                Some(Cleanup {
                    ids: ["bq_1".to_owned()].into(),
                    look_up_by_name: true,
                }),
            ),
            (
                status(&ready(), Some("bq_1")),
                both,
                Some(Cleanup {
                    ids: ["bq_1".to_owned(), "bq_a".to_owned()].into(),
                    look_up_by_name: true,
                }),
            ),
            (
                BriqExecutorStatus::default(),
                annotations(&[(CREATE_PENDING_ANNOTATION, "t")]),
                Some(Cleanup {
                    ids: BTreeSet::new(),
                    look_up_by_name: true,
                }),
            ),
        ];
        for (status, annotations, expected) in cases {
            assert_eq!(cleanup(&status, &annotations), expected, "{annotations:?}");
        }
    }
}
