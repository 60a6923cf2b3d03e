//! Nothing leaks when an executor goes without its finalizer having run.
//!
//! Two parts:
//! - **Key protection**: a Secret that holds the API key of an executor with a sandbox carries
//!   [`KEY_IN_USE_FINALIZER`](crate::crd::KEY_IN_USE_FINALIZER) ([`super::key_guard`]) (as Kubernetes protects a PVC in use), so deleting a namespace,
//!   which deletes the executor and its key at once, cannot take the key away from the
//!   executor's finalizer. The last executor using the Secret releases it after a confirmed
//!   destroy; the sweeper releases it when no executor uses it and no sandbox of its key waits.
//! - **The sweeper**: every [`Settings::orphan_sweep_interval`](super::context::Settings) (and whenever an
//!   executor is deleted), with every key the operator uses, it lists briq's sandboxes and
//!   destroys those named like an executor of its scope that no live executor is named like,
//!   once older than the grace period.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{api::core::v1::Secret, jiff::Timestamp};
use kube::{
    ResourceExt,
    runtime::{events::EventType, reflector::Store},
};
use tokio::sync::Notify;
use tracing::{info, warn};

use super::{
    context::{Error, Result, Shared},
    credentials::secret_key,
    key_guard,
    publish::publish,
};
use crate::{
    briq::{ApiKey, DestroyOutcome, Sandbox, SandboxApi, SandboxState, sandbox_name},
    crd::BriqExecutor,
};

/// Sandboxes named like an executor of the scope (`prefix`) that no live executor is named like:
/// not (or no longer) anyone's, but possibly a create in flight whose executor the cache has not
/// caught up with yet. Sandboxes being destroyed are left alone.
pub fn unowned<'a>(
    sandboxes: &'a [Sandbox],
    prefix: &str,
    live_names: &BTreeSet<String>,
) -> impl Iterator<Item = &'a Sandbox> {
    sandboxes.iter().filter(move |sandbox| {
        sandbox.name.starts_with(prefix)
            && !live_names.contains(&sandbox.name)
            && !matches!(
                sandbox.state,
                SandboxState::Destroying | SandboxState::Destroyed
            )
    })
}

/// The ids of the orphans among `sandboxes`: `unowned` and created at least `grace` before
/// `now`.
pub fn orphans(
    sandboxes: &[Sandbox],
    prefix: &str,
    live_names: &BTreeSet<String>,
    now: Timestamp,
    grace: Duration,
) -> Vec<String> {
    unowned(sandboxes, prefix, live_names)
        .filter(|sandbox| {
            now.duration_since(sandbox.created_at)
                .try_into()
                .is_ok_and(|age: Duration| age >= grace)
        })
        .map(|sandbox| sandbox.id.clone())
        .collect()
}

/// Where a key comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum KeySource {
    Default,
    Secret {
        namespace: String,
        name: String,
        field: String,
    },
}

/// The names of every executor in `executors` (terminating ones too: their finalizer destroys
/// their sandbox), and the Secrets they take keys from.
fn observe(executors: &[Arc<BriqExecutor>]) -> (BTreeSet<String>, BTreeSet<KeySource>) {
    let mut names = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    for executor in executors {
        let namespace = executor.namespace().unwrap_or_default();
        names.insert(sandbox_name(
            &namespace,
            &executor.name_any(),
            &executor.uid().unwrap_or_default(),
        ));
        if let Some(reference) = &executor.spec.api_key_secret_ref {
            secrets.insert(KeySource::Secret {
                namespace,
                name: reference.name.clone(),
                field: reference.key.clone(),
            });
        }
    }
    (names, secrets)
}

/// The sweeper's state: Secrets seen in use by executors since gone (their orphans may still
/// wait for the grace period), and a bell rung when an executor is deleted.
pub struct Sweeper<S> {
    shared: Arc<Shared<S>>,
    store: Store<BriqExecutor>,
    remembered: Mutex<BTreeSet<KeySource>>,
    wake: Notify,
}

impl<S: SandboxApi> Sweeper<S> {
    pub fn new(shared: Arc<Shared<S>>, store: Store<BriqExecutor>) -> Self {
        Sweeper {
            shared,
            store,
            remembered: Mutex::default(),
            wake: Notify::new(),
        }
    }

    /// An executor is gone: sweep soon with its key (the Secret may be released, its sandbox
    /// may be orphaned), even if no sweep saw the executor while it existed.
    pub fn deleted(&self, executor: &BriqExecutor) {
        let (_, secrets) = observe(&[Arc::new(executor.clone())]);
        self.remembered
            .lock()
            .expect("sweeper state")
            .extend(secrets);
        self.wake.notify_one();
    }

    /// Sweeps every `interval` and when woken, until dropped.
    pub async fn run(self: Arc<Self>, interval: Duration) {
        // An empty cache would make every sandbox look orphaned: wait for the first full list.
        if !super::cache::until_ready(&self.store).await {
            return;
        }
        let mut every = tokio::time::interval(interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = self.wake.notified() => {}
            }
            self.sweep().await;
        }
    }

    /// One sweep with every key in use; only once the cache is synced ([`Sweeper::run`]).
    async fn sweep(&self) {
        let executors = self.store.state();
        let (live_names, mut in_use) = observe(&executors);
        // Every class's key (in the operator's namespace) may have made sandboxes.
        if let Some(namespace) = &self.shared.settings.platform_namespace {
            in_use.extend(self.shared.classes.state().iter().map(|class| {
                let reference = &class.spec.api_key_secret_ref;
                KeySource::Secret {
                    namespace: namespace.clone(),
                    name: reference.name.clone(),
                    field: reference.key.clone(),
                }
            }));
        }
        let sources: BTreeSet<KeySource> = {
            let mut remembered = self.remembered.lock().expect("sweeper state");
            remembered.extend(in_use.iter().cloned());
            let mut sources = remembered.clone();
            if self.shared.settings.default_api_key.is_some() {
                sources.insert(KeySource::Default);
            }
            sources
        };
        let prefix = crate::briq::sandbox_name_prefix(self.shared.settings.namespace.as_deref());
        let grace = self.shared.settings.orphan_grace;
        for source in sources {
            match self.sweep_with(&source, &prefix, &live_names, grace).await {
                Ok(waiting) => {
                    if let KeySource::Secret {
                        namespace, name, ..
                    } = &source
                        && waiting == 0
                        && !in_use.iter().any(|used| same_secret(used, namespace, name))
                    {
                        match key_guard::release(&self.shared, namespace, name).await {
                            Ok(()) => {
                                self.remembered
                                    .lock()
                                    .expect("sweeper state")
                                    .remove(&source);
                            }
                            Err(error) => {
                                warn!(%namespace, secret = %name, %error, "could not release the API key Secret")
                            }
                        }
                    }
                }
                Err(Error::ApiKey(message)) => {
                    // The Secret is gone or no longer a key: nothing more can be swept with it.
                    info!(%message, "no longer sweeping with a key that is gone");
                    self.remembered
                        .lock()
                        .expect("sweeper state")
                        .remove(&source);
                }
                Err(error) => warn!(%error, "orphan sweep failed; trying again next time"),
            }
        }
    }

    /// Destroys the orphans `source`'s key can see; answers how many unowned sandboxes remain.
    async fn sweep_with(
        &self,
        source: &KeySource,
        prefix: &str,
        live_names: &BTreeSet<String>,
        grace: Duration,
    ) -> Result<usize> {
        let (key, secret): (ApiKey, Option<Secret>) = match source {
            KeySource::Default => match &self.shared.settings.default_api_key {
                Some(key) => (key.clone(), None),
                None => return Ok(0),
            },
            KeySource::Secret {
                namespace,
                name,
                field,
            } => {
                let (key, secret) = secret_key(&self.shared, namespace, name, field).await?;
                (key, Some(secret))
            }
        };
        let sandboxes = self.shared.sandboxes.list_sandboxes(&key).await?;
        let unowned = unowned(&sandboxes, prefix, live_names).count();
        let found = orphans(&sandboxes, prefix, live_names, Timestamp::now(), grace);
        let mut destroyed = 0;
        for id in &found {
            let name = sandboxes
                .iter()
                .find(|s| &s.id == id)
                .map(|s| s.name.clone())
                .unwrap_or_default();
            match self.shared.sandboxes.destroy_sandbox(&key, id).await? {
                DestroyOutcome::Destroyed => {
                    self.shared.metrics.orphan_destroyed();
                    warn!(sandbox = %id, %name, "destroyed an orphaned sandbox: no executor of that name exists");
                    if let Some(secret) = &secret {
                        let note = format!(
                            "destroyed orphaned sandbox {id} ({name}), made with this Secret's key: \
                             no executor of that name exists any more"
                        );
                        publish(
                            &self.shared,
                            secret,
                            EventType::Warning,
                            "OrphanDestroyed",
                            "Sweep",
                            note,
                        )
                        .await;
                    }
                }
                DestroyOutcome::AlreadyGone => {}
            }
            destroyed += 1;
        }
        Ok(unowned - destroyed)
    }
}

fn same_secret(source: &KeySource, namespace: &str, name: &str) -> bool {
    matches!(source, KeySource::Secret { namespace: n, name: s, .. } if n == namespace && s == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::controller::key_guard::secret_used_by_others;

    const NOW: &str = "2026-01-01T12:00:00Z";
    const GRACE: Duration = Duration::from_secs(300);

    fn sandbox(id: &str, name: &str, minutes_old: i64, state: SandboxState) -> Sandbox {
        let now: Timestamp = NOW.parse().unwrap();
        Sandbox {
            id: id.into(),
            name: name.into(),
            state,
            image: "python".into(),
            size: None,
            sleep: "30m".into(),
            created_at: now - k8s_openapi::jiff::SignedDuration::from_mins(minutes_old),
        }
    }

    fn names(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn orphans_are_old_unowned_sandboxes_of_the_scope() {
        use SandboxState::*;
        let live = names(&["bqe-team-a-py-11111111"]);
        let cases: &[(&str, Sandbox, Option<&str>, bool)] = &[
            // (what, sandbox, scope namespace, orphan?)
            (
                "a live executor's sandbox",
                sandbox("bq_1", "bqe-team-a-py-11111111", 60, Running),
                None,
                false,
            ),
            (
                "an old one nobody is named like",
                sandbox("bq_2", "bqe-team-a-gone-22222222", 60, Running),
                None,
                true,
            ),
            (
                "asleep, still an orphan",
                sandbox("bq_3", "bqe-team-a-gone-33333333", 60, Sleeping),
                None,
                true,
            ),
            (
                "younger than the grace: maybe a create in flight",
                sandbox("bq_4", "bqe-team-a-new-44444444", 4, Running),
                None,
                false,
            ),
            (
                "exactly the grace old",
                sandbox("bq_5", "bqe-team-a-gone-55555555", 5, Running),
                None,
                true,
            ),
            (
                "not the operator's name pattern",
                sandbox("bq_6", "my-notebook", 600, Running),
                None,
                false,
            ),
            (
                "another prefix that merely contains bqe",
                sandbox("bq_7", "xbqe-team-a-gone-77777777", 600, Running),
                None,
                false,
            ),
            (
                "already being destroyed",
                sandbox("bq_8", "bqe-team-a-gone-88888888", 60, Destroying),
                None,
                false,
            ),
            (
                "another namespace, for an operator scoped to team-a",
                sandbox("bq_9", "bqe-team-b-gone-99999999", 60, Running),
                Some("team-a"),
                false,
            ),
            (
                "its own namespace, for an operator scoped to team-a",
                sandbox("bq_10", "bqe-team-a-gone-10101010", 60, Running),
                Some("team-a"),
                true,
            ),
        ];
        let now: Timestamp = NOW.parse().unwrap();
        for (what, sandbox, scope, orphan) in cases {
            let prefix = crate::briq::sandbox_name_prefix(*scope);
            let found = orphans(std::slice::from_ref(sandbox), &prefix, &live, now, GRACE);
            let expected = if *orphan {
                vec![sandbox.id.clone()]
            } else {
                vec![]
            };
            assert_eq!(found, expected, "{what}");
        }
    }

    #[test]
    fn a_sandbox_from_the_future_is_not_old() {
        let now: Timestamp = NOW.parse().unwrap();
        let ahead = sandbox("bq_1", "bqe-a-b-12345678", -10, SandboxState::Running);
        assert!(orphans(&[ahead], "bqe-", &BTreeSet::new(), now, GRACE).is_empty());
    }

    #[test]
    fn unowned_counts_what_waits_for_the_grace_too() {
        let sandboxes = [
            sandbox("bq_1", "bqe-a-new-11111111", 1, SandboxState::Running),
            sandbox("bq_2", "bqe-a-live-22222222", 60, SandboxState::Running),
        ];
        let live = names(&["bqe-a-live-22222222"]);
        assert_eq!(unowned(&sandboxes, "bqe-", &live).count(), 1);
    }

    #[test]
    fn executors_name_their_sandboxes_and_secrets() {
        let executor: BriqExecutor = serde_json::from_value(json!({
            "metadata": { "name": "py", "namespace": "ns", "uid": "abcdef12-3456" },
            "spec": { "apiKeySecretRef": { "name": "key" } },
        }))
        .unwrap();
        let (names, secrets) = observe(&[Arc::new(executor.clone())]);
        assert_eq!(names, self::names(&["bqe-ns-py-abcdef12"]));
        assert!(secrets.iter().any(|s| same_secret(s, "ns", "key")));
        assert!(!secret_used_by_others(
            std::slice::from_ref(&executor),
            "key",
            "abcdef12-3456"
        ));
        assert!(secret_used_by_others(&[executor], "key", "other-uid"));
    }
}
