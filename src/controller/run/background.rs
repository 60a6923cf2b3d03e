//! What runs beside the controllers: what the process around them reads of them ([`Reporting`]:
//! the live counts from the caches, [`live`], and whether the caches are synced), and the
//! periodic tasks ([`Tasks`]): the bookkeeping sweep, the execution count writes and the orphan
//! sweeper.

use std::sync::Arc;

use kube::{ResourceExt, runtime::reflector::Store};
use tracing::info;

use super::{controllers::Contexts, watches::Caches};
use crate::{
    briq::SandboxApi,
    controller::{cache, execution, recheck::BOOKKEEPING_SWEEP},
    crd::{BriqExecutor, CLAIMED_BY_ANNOTATION, Execution, conditions},
    http::Health,
    metrics::{Live, Metrics},
    task::AbortOnDrop,
};

/// Unfinished Executions (queued, running) and executors holding a sandbox, from the caches;
/// `bookkeeping` entries held by the controllers.
fn live(
    executors: &Store<BriqExecutor>,
    executions: &Store<Execution>,
    bookkeeping: usize,
    briq: BriqKeys,
) -> Live {
    let mut live = Live {
        bookkeeping: bookkeeping as i64,
        briq_unreachable_keys: briq.unreachable as i64,
        briq_mismatched_keys: briq.mismatched as i64,
        ..Live::default()
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    for execution in executions.state() {
        let status = execution.status.clone().unwrap_or_default();
        if execution.finished() || execution.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if status.attempt_id.is_some() {
            live.running += 1;
            let waiting =
                conditions::find(&status.conditions, conditions::SUCCEEDED).is_some_and(|c| {
                    c.reason == crate::crd::reasons::ExecutionReason::WaitingForBriq.as_str()
                });
            live.waiting_for_briq += i64::from(waiting);
        } else {
            live.queued += 1;
            if let Some(created) = &execution.metadata.creation_timestamp {
                let age = now.duration_since(created.0).as_secs().max(0);
                live.oldest_queued_seconds = live.oldest_queued_seconds.max(age);
            }
        }
    }
    live.classes = crate::usage::usage(&executors.state(), &executions.state());
    // A handed-over member records its claimer's sandbox too: counted once, with the claimer.
    live.sandboxes = executors
        .state()
        .iter()
        .filter(|e| e.status.as_ref().is_some_and(|s| s.sandbox_id.is_some()))
        .filter(|e| !e.annotations().contains_key(CLAIMED_BY_ANNOTATION))
        .count() as i64;
    live.suspended = executors
        .state()
        .iter()
        .filter(|e| {
            e.status.as_ref().is_some_and(|s| {
                conditions::find(&s.conditions, conditions::READY).is_some_and(|ready| {
                    ready.reason == crate::crd::reasons::ExecutorReason::Suspended.as_str()
                })
            })
        })
        .count() as i64;
    live
}

/// The API keys briq answers no call with, and those whose server's interface does not match.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct BriqKeys {
    unreachable: usize,
    mismatched: usize,
}

/// Reports the controllers' state to the observer (its metrics and health); undoes it when the
/// controllers stop (or are dropped, as when the lease is lost).
pub struct Reporting {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    synced: tokio::task::JoinHandle<()>,
}

impl Reporting {
    pub fn start<S: SandboxApi + 'static>(
        metrics: &Arc<Metrics>,
        health: &Arc<Health>,
        caches: &Caches,
        contexts: &Contexts<S>,
    ) -> Reporting {
        let (executor_ctx, execution_ctx) = (contexts.executor.clone(), contexts.execution.clone());
        let (pool_ctx, shared) = (contexts.pool.clone(), contexts.shared.clone());
        let (cached_executors, cached_executions) =
            (caches.executors.clone(), caches.executions.clone());
        metrics.set_live(Some(Box::new(move || {
            let bookkeeping =
                executor_ctx.bookkeeping() + execution_ctx.bookkeeping() + pool_ctx.bookkeeping();
            let briq_keys = BriqKeys {
                unreachable: shared.sandboxes.unreachable_keys(),
                mismatched: shared.sandboxes.mismatched_keys(),
            };
            live(
                &cached_executors,
                &cached_executions,
                bookkeeping,
                briq_keys,
            )
        })));
        let (executors, executions) = (caches.executors.clone(), caches.executions.clone());
        let synced_health = health.clone();
        let synced = tokio::spawn(async move {
            if cache::until_ready(&executors).await && cache::until_ready(&executions).await {
                info!("controller caches synced");
                synced_health.set_synced(true);
            }
        });
        Reporting {
            metrics: metrics.clone(),
            health: health.clone(),
            synced,
        }
    }
}

impl Drop for Reporting {
    fn drop(&mut self) {
        self.synced.abort();
        self.health.set_synced(false);
        self.metrics.set_live(None);
    }
}

/// The periodic tasks beside the controllers, each ending when this is dropped or stopped.
pub struct Tasks<S> {
    orphan_sweeper: Option<AbortOnDrop>,
    bookkeeping_sweep: AbortOnDrop,
    count_writer: AbortOnDrop,
    execution_ctx: Arc<execution::Context<S>>,
}

impl<S: SandboxApi + 'static> Tasks<S> {
    pub fn start(contexts: &Contexts<S>) -> Tasks<S> {
        let orphan_sweeper = contexts
            .shared
            .settings
            .orphan_sweep_interval
            .map(|interval| AbortOnDrop(tokio::spawn(contexts.orphans.clone().run(interval))));
        // Deletions prune the bookkeeping at once; a reconcile still running then may add an entry
        // after that, which this sweep removes.
        let bookkeeping_sweep = {
            let (executor_ctx, execution_ctx) =
                (contexts.executor.clone(), contexts.execution.clone());
            let pool_ctx = contexts.pool.clone();
            AbortOnDrop(tokio::spawn(async move {
                let mut every = tokio::time::interval(BOOKKEEPING_SWEEP);
                loop {
                    every.tick().await;
                    executor_ctx.sweep();
                    execution_ctx.sweep();
                    pool_ctx.sweep();
                }
            }))
        };
        let count_writer = {
            let execution_ctx = contexts.execution.clone();
            let interval = contexts.shared.settings.count_write_interval;
            AbortOnDrop(tokio::spawn(async move {
                let mut every =
                    tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
                loop {
                    every.tick().await;
                    execution_ctx.write_counts().await;
                }
            }))
        };
        Tasks {
            orphan_sweeper,
            bookkeeping_sweep,
            count_writer,
            execution_ctx: contexts.execution.clone(),
        }
    }

    /// Stops the tasks once the controllers have stopped, with the counts written once more:
    /// what the last reconciles counted since the last periodic write is not lost.
    pub async fn stop(self) {
        let Tasks {
            orphan_sweeper,
            bookkeeping_sweep,
            count_writer,
            execution_ctx,
        } = self;
        drop(count_writer);
        execution_ctx.write_counts().await;
        drop(bookkeeping_sweep);
        drop(orphan_sweeper);
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::{reflector, watcher};
    use serde_json::json;

    use crate::crd::POOL_MEMBER_ANNOTATION;

    use super::*;

    fn executor(name: &str, sandbox: Option<&str>, annotations: serde_json::Value) -> BriqExecutor {
        serde_json::from_value(json!({
            "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
            "metadata": { "name": name, "namespace": "team", "annotations": annotations },
            "spec": {},
            "status": { "sandboxId": sandbox },
        }))
        .unwrap()
    }

    #[test]
    fn suspended_executors_are_counted_by_their_ready_reason() {
        let (executors, mut writer) = reflector::store::<BriqExecutor>();
        for (name, reason) in [
            ("a", "Suspended"),
            ("b", "Suspending"),
            ("c", "KernelReady"),
        ] {
            let mut object = executor(name, Some("bq_1"), json!({}));
            object.status.as_mut().unwrap().conditions = conditions::merge(
                &[],
                &[conditions::desired(conditions::READY, "False", reason, "")],
                None,
            );
            writer.apply_watcher_event(&watcher::Event::Apply(object));
        }
        let (executions, _) = reflector::store::<Execution>();
        assert_eq!(
            live(&executors, &executions, 0, BriqKeys::default()).suspended,
            1
        );
    }

    #[test]
    fn a_handed_over_sandbox_counts_once_among_the_live_sandboxes() {
        let (executors, mut writer) = reflector::store::<BriqExecutor>();
        for object in [
            executor("own", Some("bq_1"), json!({})),
            executor(
                "fast-m1",
                Some("bq_2"),
                json!({ CLAIMED_BY_ANNOTATION: "uid-c" }),
            ),
            executor("agent", Some("bq_2"), json!({})),
            executor(
                "fast-m2",
                Some("bq_3"),
                json!({ POOL_MEMBER_ANNOTATION: "fast" }),
            ),
            executor("waiting", None, json!({})),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(object));
        }
        let (executions, _) = reflector::store::<Execution>();
        assert_eq!(
            live(&executors, &executions, 0, BriqKeys::default()).sandboxes,
            3
        );
    }

    #[test]
    fn the_oldest_queued_age_is_that_of_the_oldest_unstarted_unfinished_execution() {
        let ago = |minutes: i64| {
            let at = k8s_openapi::jiff::Timestamp::now()
                - k8s_openapi::jiff::SignedDuration::from_mins(minutes);
            at.to_string()
        };
        let execution = |name: &str, created: String, status: serde_json::Value| -> Execution {
            serde_json::from_value(json!({
                "apiVersion": "briq.cloud/v1alpha1", "kind": "Execution",
                "metadata": { "name": name, "namespace": "team", "creationTimestamp": created },
                "spec": { "executorRef": { "name": "py" }, "code": "1" },
                "status": status,
            }))
            .unwrap()
        };
        let (executions, mut writer) = reflector::store::<Execution>();
        let (executors, _) = reflector::store::<BriqExecutor>();
        assert_eq!(
            live(&executors, &executions, 0, BriqKeys::default()).oldest_queued_seconds,
            0
        );
        let done = json!({ "conditions": [{
            "type": "Succeeded", "status": "True", "reason": "Completed", "message": "",
            "lastTransitionTime": ago(1),
        }]});
        for object in [
            execution("finished", ago(120), done),
            execution("running", ago(60), json!({ "attemptId": "a1" })),
            execution(
                "waiting-for-briq",
                ago(2),
                json!({ "attemptId": "a2", "conditions": [{
                    "type": "Succeeded", "status": "Unknown", "reason": "WaitingForBriq",
                    "message": "", "lastTransitionTime": ago(1),
                }]}),
            ),
            execution("queued-long", ago(20), json!({})),
            execution("queued-new", ago(1), json!({})),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(object));
        }
        let briq = BriqKeys {
            unreachable: 1,
            mismatched: 2,
        };
        let now = live(&executors, &executions, 0, briq);
        assert_eq!((now.queued, now.running), (2, 2));
        assert_eq!((now.waiting_for_briq, now.briq_unreachable_keys), (1, 1));
        assert_eq!(now.briq_mismatched_keys, 2);
        assert!(
            (20 * 60..20 * 60 + 30).contains(&now.oldest_queued_seconds),
            "{now:?}"
        );
    }
}
