//! What the controllers keep of the objects they watch. Their caches hold every watched object
//! for the operator's lifetime, so what no reconcile reads is dropped on the way in:
//! server-side apply's bookkeeping, kubectl's copy of the last applied manifest, the code of
//! every Execution (up to 64 Ki characters each, and up to `maxQueuedExecutions` of them wait
//! per executor: those not sent yet keep theirs beside the cache within a byte budget, in the
//! execution controller's bookkeeping (`execution::bookkeeping`), and beyond it the run takes
//! it from the write that records its attempt), and the results of finished Executions (which
//! are never written again).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use kube::{
    ResourceExt,
    runtime::{reflector::Store, watcher},
};

use crate::crd::Execution;

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

pub fn compact<K: ResourceExt>(object: &mut K) {
    object.managed_fields_mut().clear();
    object.annotations_mut().remove(LAST_APPLIED);
}

pub fn compact_execution(execution: &mut Execution) {
    compact(execution);
    execution.spec.code = String::new();
    if !execution.finished() {
        return;
    }
    if let Some(status) = &mut execution.status {
        status.logs = None;
        status.output = None;
        status.final_answer = None;
        status.error = None;
    }
}

/// Whether a watch's cache is known to be current: listed, and its watch delivering. It is
/// not while the first list or a relist is under way (the store keeps its old state until the
/// list ends), nor after the watch failed until it delivers again. Then a cache may lag behind
/// the API server by more than the watch's own delay, and what only the API server can decide
/// is asked of it.
#[derive(Debug, Clone, Default)]
pub struct Freshness(Arc<AtomicBool>);

impl Freshness {
    /// What the watch delivered (after the store applied it).
    pub fn heard<K>(&self, event: &watcher::Result<watcher::Event<K>>) {
        let current = match event {
            Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                true
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) | Err(_) => false,
        };
        self.0.store(current, Ordering::Release);
    }

    pub fn current(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Whether `store` got its first full list (false: its writer is gone). The applier waits on the
/// same store, and a store wakes only its latest waiter: ask again every 100 ms instead of
/// relying on a wake-up.
pub async fn until_ready<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    loop {
        let wait = store.wait_until_ready();
        if let Ok(result) = tokio::time::timeout(Duration::from_millis(100), wait).await {
            return result.is_ok();
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use serde_json::json;

    use super::*;

    fn execution(succeeded: &str) -> Execution {
        let mut execution: Execution = serde_json::from_value(json!({
            "apiVersion": "briq.cloud/v1alpha1",
            "kind": "Execution",
            "metadata": {
                "name": "step", "namespace": "ns",
                "annotations": { LAST_APPLIED: "{…}", "team": "a" },
            },
            "spec": { "executorRef": { "name": "py" }, "code": "x = 1" },
            "status": {
                "conditions": [{
                    "type": "Succeeded", "status": succeeded, "reason": "Completed",
                    "message": "", "lastTransitionTime": "2026-12-02T00:00:00Z",
                }],
                "logs": "hello", "output": "1", "finalAnswer": "safe:1",
                "error": { "name": "E", "message": "m" },
            },
        }))
        .unwrap();
        execution
            .managed_fields_mut()
            .push(ManagedFieldsEntry::default());
        execution
    }

    #[test]
    fn finished_executions_keep_only_what_the_controller_reads() {
        let mut finished = execution("True");
        compact_execution(&mut finished);
        assert!(finished.managed_fields().is_empty());
        assert_eq!(finished.annotations().len(), 1, "only kubectl's copy goes");
        assert_eq!(finished.spec.code, "");
        assert_eq!(finished.spec.executor_ref.name, "py");
        let status = finished.status.unwrap();
        assert_eq!(
            (
                status.logs,
                status.output,
                status.final_answer,
                status.error
            ),
            (None, None, None, None)
        );
        assert_eq!(status.conditions.len(), 1);
    }

    #[test]
    fn a_cache_is_current_once_listed_and_while_its_watch_delivers() {
        use watcher::Event;
        let freshness = Freshness::default();
        let step = |event: watcher::Result<Event<Execution>>| {
            freshness.heard(&event);
            freshness.current()
        };
        assert!(!freshness.current(), "not listed yet");
        assert!(!step(Ok(Event::Init)));
        assert!(!step(Ok(Event::InitApply(execution("Unknown")))));
        assert!(step(Ok(Event::InitDone)), "listed");
        assert!(step(Ok(Event::Apply(execution("Unknown")))));
        let failed = watcher::Error::NoResourceVersion;
        assert!(!step(Err(failed)), "the watch failed");
        assert!(
            step(Ok(Event::Delete(execution("True")))),
            "delivering again"
        );
        assert!(!step(Ok(Event::Init)), "relisting");
        assert!(step(Ok(Event::InitDone)));
    }

    #[test]
    fn unfinished_executions_keep_their_status_but_not_their_code() {
        let mut running = execution("Unknown");
        compact_execution(&mut running);
        assert!(running.managed_fields().is_empty());
        assert_eq!(running.spec.code, "", "the run reads it afresh");
        assert_eq!(running.spec.executor_ref.name, "py");
        assert_eq!(running.status.unwrap().logs.as_deref(), Some("hello"));
    }
}
