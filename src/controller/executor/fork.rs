//! Forks (`spec.forkFrom`): a source saves a snapshot for the forks that wait for one, and a
//! fork reads it into its own sandbox.
//!
//! The source's side ([`Actor::snapshot`]): with forks waiting, it writes `Forking`
//! (`Ready=False`, so Executions wait, as for a suspension), lets a running Execution finish,
//! then has its bridge save the namespace and pack the kernel user's directory as one snapshot
//! in its sandbox (`fork-save`), and is Ready again with `status.snapshot` naming the forks it
//! served: one save for every fork waiting at that moment. A suspended source packs the state
//! it saved without starting its kernel; its sandbox runs only until its forks have read it.
//!
//! The fork's side: it records the snapshot it was served ([`Actor::record_fork`]), so a later
//! snapshot of the source changes nothing for it; briq forks the source's sandbox under the
//! fork's own deterministic name (create.rs); and once its kernel runs, the parts are copied from
//! the source's sandbox into its own, unpacked with the kernel user's rights and the namespace
//! restored, before it reports Ready ([`Actor::load_fork`]). Every step can be taken again after
//! a crash: a snapshot taken twice is a new one, a fork's sandbox is found by its name, and the
//! parts are copied and loaded again into a kernel that is not Ready yet.

use std::sync::Arc;

use kube::{
    ResourceExt,
    runtime::{controller::Action, events::EventType},
};
use rand::Rng as _;
use tracing::info;

use super::{
    actor::Actor,
    admit::key_recheck,
    status::{SandboxFields, kernel_ready_of, sandbox_fields, state, status_of},
    step::ForkSource,
    suspend::{Cause, not_saved, suspended_state},
};
use crate::{
    bridge::{
        WORKDIR,
        files::UPLOADS_DIR,
        fork::{ForkReport, part_path},
        session::Session,
        state::problem,
    },
    briq::{ApiKey, SandboxApi},
    controller::{
        context::Result,
        recheck::{self, STATE_DEADLINE},
    },
    crd::{
        BriqExecutor, ForkOrigin, POOL_MEMBER_ANNOTATION, Snapshot, SnapshotParts, UnsavedName,
        conditions::{self, READY, STALLED},
        reasons::ExecutorReason,
    },
};

/// The forks in `executors` that wait for `source` to save a snapshot for them: forks of it
/// (same namespace, `spec.forkFrom`) that say so (`WaitingForSnapshot`, written once they are
/// admitted: a fork that waits for its key or a place under its class costs its source
/// nothing), are not being deleted or stalled, and are not served by its last snapshot. Their
/// uids, sorted.
pub(super) fn waiting(source: &BriqExecutor, executors: &[Arc<BriqExecutor>]) -> Vec<String> {
    let served = status_of(source)
        .snapshot
        .map(|s| s.forks)
        .unwrap_or_default();
    let mut uids: Vec<String> = forks_of(source, executors)
        .filter(|fork| {
            let status = status_of(fork);
            let asks = conditions::find(&status.conditions, READY)
                .is_some_and(|ready| ready.reason == ExecutorReason::WaitingForSnapshot.as_str());
            status.fork.is_none() && asks
        })
        .filter_map(|fork| fork.uid())
        .filter(|uid| !served.contains(uid))
        .collect();
    uids.sort();
    uids
}

/// Whether a fork in `executors` still has `source`'s last snapshot to read.
pub(super) fn reading(source: &BriqExecutor, executors: &[Arc<BriqExecutor>]) -> bool {
    let Some(snapshot) = status_of(source).snapshot else {
        return false;
    };
    forks_of(source, executors).any(|fork| {
        let uid = fork.uid().unwrap_or_default();
        match status_of(fork).fork {
            Some(origin) => {
                origin.snapshot.id == snapshot.parts.id && origin.restored_time.is_none()
            }
            None => snapshot.forks.contains(&uid),
        }
    })
}

/// The live forks of `source` in `executors`.
fn forks_of<'a>(
    source: &'a BriqExecutor,
    executors: &'a [Arc<BriqExecutor>],
) -> impl Iterator<Item = &'a BriqExecutor> {
    executors
        .iter()
        .map(AsRef::as_ref)
        .filter(move |fork| {
            fork.namespace() == source.namespace()
                && fork
                    .spec
                    .fork_from
                    .as_ref()
                    .is_some_and(|from| from.name == source.name_any())
        })
        .filter(|fork| fork.metadata.deletion_timestamp.is_none() && !stalled(fork))
}

fn stalled(executor: &BriqExecutor) -> bool {
    conditions::is_true(&status_of(executor).conditions, STALLED)
}

/// What a fork without a recorded origin finds of its source in `executors`; `None` for an
/// executor that is not such a fork.
pub(super) fn asked(fork: &BriqExecutor, executors: &[Arc<BriqExecutor>]) -> Option<ForkSource> {
    let from = fork.spec.fork_from.as_ref()?;
    if status_of(fork).fork.is_some() {
        return None;
    }
    let source = executors
        .iter()
        .find(|e| e.namespace() == fork.namespace() && e.name_any() == from.name);
    Some(source_for(fork, source.map(AsRef::as_ref)))
}

/// What `fork` finds of `source` (`None`: not in its namespace).
pub(super) fn source_for(fork: &BriqExecutor, source: Option<&BriqExecutor>) -> ForkSource {
    let Some(source) = source else {
        return ForkSource::Missing;
    };
    let name = source.name_any();
    if source.uid() == fork.uid() {
        return ForkSource::Refused("an executor cannot fork itself".into());
    }
    if source.annotations().contains_key(POOL_MEMBER_ANNOTATION) || source.spec.pool_ref.is_some() {
        return ForkSource::Refused(format!(
            "{name} is a pool member or takes one: its sandbox is the pool's, never forked"
        ));
    }
    if source.spec.class_name != fork.spec.class_name
        || source.spec.api_key_secret_ref != fork.spec.api_key_secret_ref
    {
        return ForkSource::Refused(format!(
            "a fork uses its source's className and apiKeySecretRef (briq forks a sandbox with \
             the key that made it); {name} has others"
        ));
    }
    let status = status_of(source);
    if source.metadata.deletion_timestamp.is_some() || status.unusable || stalled(source) {
        return ForkSource::Refused(format!(
            "{name} is being deleted, unusable or stalled: it has no state to fork"
        ));
    }
    let uid = fork.uid().unwrap_or_default();
    match status.snapshot {
        Some(snapshot) if snapshot.forks.contains(&uid) => match snapshot.failure {
            Some(failure) => ForkSource::Failed(format!(
                "{name} could not save a snapshot for its forks: {failure}"
            )),
            None => ForkSource::Taken(ForkOrigin {
                from: name,
                source_sandbox: status.sandbox_id.unwrap_or_default(),
                snapshot: snapshot.parts,
                saved_names: snapshot.saved_names,
                unsaved: snapshot.unsaved,
                restored_time: None,
            }),
        },
        _ => ForkSource::Waiting,
    }
}

/// A fresh snapshot id: 32 lowercase hex digits.
fn snapshot_id() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
}

/// The snapshot a `fork-save` report describes, saved for `forks`; a report that cannot stand
/// becomes a failed snapshot, which its forks report.
fn snapshot_of(report: &ForkReport, forks: Vec<String>, started: bool) -> Snapshot {
    let state = report.state();
    let failure = report
        .failure()
        .or_else(|| problem(&state).map(str::to_owned));
    Snapshot {
        parts: SnapshotParts {
            id: report.snapshot.clone(),
            parts: report.parts,
            size: report.size,
            sha256: report.sha256.to_lowercase(),
        },
        taken_time: Some(conditions::now()),
        saved_names: report.saved.len() as u32,
        unsaved: state
            .unsaved
            .iter()
            .map(|u| UnsavedName {
                name: u.name.clone(),
                why: u.why.clone(),
            })
            .collect(),
        failure,
        forks,
        sandbox_started: started,
    }
}

impl<S: SandboxApi> Actor<'_, S> {
    /// The source's side for a Ready (or forking) executor: its Executions paused (`Forking`),
    /// then one snapshot for every fork waiting, and Ready again.
    pub(super) async fn snapshot(&self, executor: &BriqExecutor, id: &str) -> Result<Action> {
        let forks = waiting(executor, &self.executors.state());
        let phase = conditions::find(&status_of(executor).conditions, READY)
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        let forking = phase == ExecutorReason::Forking.as_str();
        if forks.is_empty() {
            if forking {
                // Its forks went (or were served) before it saved: the pause ends.
                self.report(
                    executor,
                    kernel_ready_of(executor),
                    sandbox_fields(executor),
                )
                .await?;
            }
            return Ok(Action::requeue(self.shared.settings.probe_interval));
        }
        let message = format!(
            "saving the kernel's namespace and working files for {} fork(s); Executions wait \
             until it is saved",
            forks.len()
        );
        if let Some(wait) = self
            .pause(executor, ExecutorReason::Forking, message)
            .await?
        {
            return Ok(wait);
        }
        let Some(key) = self.credentials(executor).await? else {
            return Ok(key_recheck(executor));
        };
        let session = Session::new(&self.shared.sandboxes, &key, id);
        let saving = self
            .slot
            .without(session.fork_save(&snapshot_id(), false, STATE_DEADLINE))
            .await;
        let snapshot = match saving {
            Ok(report) => snapshot_of(&report, forks, false),
            // A bridge that cannot save (an older one, say) fails its forks rather than keeping
            // the source paused; briq not carrying the call is tried again.
            Err(error) => match not_saved(&error) {
                Some(why) => Snapshot {
                    failure: Some(why),
                    forks,
                    taken_time: Some(conditions::now()),
                    ..Snapshot::default()
                },
                None => return Err(error.into()),
            },
        };
        let note = snapshot_note(&snapshot);
        let fields = SandboxFields {
            snapshot: Some(snapshot),
            ..sandbox_fields(executor)
        };
        self.report(executor, kernel_ready_of(executor), fields)
            .await?;
        self.event(executor, EventType::Normal, "Snapshot", "Fork", note)
            .await;
        Ok(Action::requeue(self.shared.settings.probe_interval))
    }

    /// The source's side for a suspended executor: its sandbox started (never its kernel) and
    /// the state it saved packed for the forks waiting; once they have read it, the sandbox
    /// stopped again.
    pub(super) async fn snapshot_suspended(
        &self,
        executor: &BriqExecutor,
        id: &str,
    ) -> Result<Action> {
        let Some(key) = self.credentials(executor).await? else {
            return Ok(key_recheck(executor));
        };
        let forks = waiting(executor, &self.executors.state());
        let status = status_of(executor);
        let suspension = status.suspension.clone().unwrap_or_default();
        // Still suspended, as it says: its kernel is never started.
        let suspended = suspended_state(&suspension, Cause::of(executor));
        let started = status.snapshot.as_ref().is_some_and(|s| s.sandbox_started);
        if !forks.is_empty() && !started {
            // Recorded before the start, so that an operator that dies after it knows to stop
            // the sandbox again; its own write wakes the next step.
            let marked = Snapshot {
                sandbox_started: true,
                ..status.snapshot.clone().unwrap_or_default()
            };
            let fields = SandboxFields {
                snapshot: Some(marked),
                ..sandbox_fields(executor)
            };
            self.report(executor, suspended, fields).await?;
            return Ok(Action::await_change());
        }
        let snapshot = if forks.is_empty() {
            self.shared.sandboxes.stop_sandbox(&key, id).await?;
            info!(sandbox = %id, "stopped the suspended sandbox again: its forks read their snapshot");
            status.snapshot.map(|snapshot| Snapshot {
                sandbox_started: false,
                ..snapshot
            })
        } else {
            self.shared.sandboxes.start_sandbox(&key, id).await?;
            let session = Session::new(&self.shared.sandboxes, &key, id);
            let report = self
                .slot
                .without(session.fork_save(&snapshot_id(), true, STATE_DEADLINE))
                .await?;
            let mut snapshot = snapshot_of(&report, forks, true);
            // The names are the suspension's: the kernel that saved them is gone.
            if let Some(suspension) = &status.suspension {
                snapshot.saved_names = suspension.saved_names;
                snapshot.unsaved = suspension.unsaved.clone();
            }
            let note = snapshot_note(&snapshot);
            self.event(executor, EventType::Normal, "Snapshot", "Fork", note)
                .await;
            Some(snapshot)
        };
        let fields = SandboxFields {
            snapshot,
            ..sandbox_fields(executor)
        };
        self.report(executor, suspended, fields).await?;
        // Its forks' reads end in their own writes, which wake it (wake.rs).
        Ok(Action::requeue(recheck::SAFETY_NET))
    }

    /// A fork records the snapshot it was served, with a state saying what comes next.
    pub(super) async fn record_fork(
        &self,
        executor: &BriqExecutor,
        origin: ForkOrigin,
    ) -> Result<Action> {
        let message = format!(
            "forking {}'s sandbox {} with its snapshot ({} bytes)",
            origin.from, origin.source_sandbox, origin.snapshot.size
        );
        let next = state("Unknown", false, ExecutorReason::Provisioning, message);
        let fields = SandboxFields {
            fork: Some(origin),
            ..sandbox_fields(executor)
        };
        self.report(executor, next, fields).await?;
        Ok(Action::await_change())
    }

    /// A fork waits for its source, saying why.
    pub(super) async fn await_snapshot(
        &self,
        executor: &BriqExecutor,
        reason: ExecutorReason,
        message: String,
    ) -> Result<Action> {
        let waiting = state("False", false, reason, message);
        self.report(executor, waiting, sandbox_fields(executor))
            .await?;
        // Its source's changes wake it (wake.rs).
        Ok(Action::requeue(recheck::SAFETY_NET))
    }

    /// Copies the fork's snapshot from its source's sandbox into `id`, unpacks it and restores
    /// the namespace into the kernel: the origin as it then stands (names that failed to
    /// restore join those never saved), or why it failed for good.
    pub(super) async fn load_fork(
        &self,
        key: &ApiKey,
        id: &str,
        origin: &ForkOrigin,
    ) -> Result<std::result::Result<ForkOrigin, String>> {
        let snapshot = &origin.snapshot;
        let staged = format!("{UPLOADS_DIR}/{}", snapshot_id());
        for index in 0..snapshot.parts {
            let from = format!("{WORKDIR}/{}", part_path(&snapshot.id, index));
            let part = match self
                .shared
                .sandboxes
                .read_file(key, &origin.source_sandbox, &from)
                .await
            {
                Ok(part) => part,
                Err(error) if error.class() == crate::briq::ErrorClass::NotFound => {
                    return Ok(Err(format!(
                        "the snapshot is gone from {}'s sandbox {} ({error}): the source was \
                         deleted, or its sandbox replaced",
                        origin.from, origin.source_sandbox
                    )));
                }
                Err(error) => return Err(error.into()),
            };
            let to = format!("{WORKDIR}/{staged}/part-{index:05}");
            self.shared
                .sandboxes
                .write_file(key, id, &to, &part)
                .await?;
        }
        let session = Session::new(&self.shared.sandboxes, key, id);
        let loaded = self
            .slot
            .without(session.fork_load(
                &staged,
                snapshot.parts,
                snapshot.size,
                &snapshot.sha256,
                STATE_DEADLINE,
            ))
            .await?;
        if let Some(failure) = loaded.failure() {
            return Ok(Err(format!(
                "the snapshot could not be unpacked: {failure}"
            )));
        }
        let restored = self
            .slot
            .without(session.restore_state(STATE_DEADLINE))
            .await?;
        if let Some(failure) = problem(&restored)
            .map(str::to_owned)
            .or_else(|| (!restored.ok).then(|| restored.message.clone()))
        {
            return Ok(Err(format!(
                "the namespace could not be restored: {failure}"
            )));
        }
        let mut origin = origin.clone();
        origin
            .unsaved
            .extend(restored.unsaved.iter().map(|u| UnsavedName {
                name: u.name.clone(),
                why: u.why.clone(),
            }));
        origin.restored_time = Some(conditions::now());
        Ok(Ok(origin))
    }
}

/// The Snapshot event's note.
fn snapshot_note(snapshot: &Snapshot) -> String {
    match &snapshot.failure {
        Some(failure) => format!(
            "no snapshot for {} fork(s): {failure}",
            snapshot.forks.len()
        ),
        None => format!(
            "snapshot {} for {} fork(s): {} names, {} names not saved, {} bytes in {} parts",
            snapshot.parts.id,
            snapshot.forks.len(),
            snapshot.saved_names,
            snapshot.unsaved.len(),
            snapshot.parts.size,
            snapshot.parts.parts
        ),
    }
}

#[cfg(test)]
mod tests;
