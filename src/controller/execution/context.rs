//! The execution controller's context: what it shares with the other controllers, its caches and
//! its own bookkeeping, and what the runner (`controller::run`: its watches and background
//! tasks) tells it and asks of it beside reconciles: an Execution heard or gone, an executor
//! gone, the size of the bookkeeping, the execution counts to write, the sweep.

use std::{collections::HashSet, sync::Arc};

use kube::{
    Api, ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::warn;

use super::bookkeeping::Bookkeeping;
use crate::{
    controller::{
        backoff::Backoff,
        cache::Freshness,
        context::{Error, Shared},
        fair::FairShare,
        requeue::{object_key, prune_backoff},
        status::apply_status_of,
    },
    crd::{BriqExecutor, EXECUTIONS_MANAGER, Execution},
};

/// The execution controller's context: what it shares with the other controller, its caches
/// and its own bookkeeping.
pub struct Context<S> {
    pub shared: Arc<Shared<S>>,
    pub(super) store: Store<Execution>,
    /// The executor controller's cache: Executions that cannot run yet are judged from it, so
    /// waiting costs the API server nothing.
    pub(super) executors: Store<BriqExecutor>,
    pub(super) wake: mpsc::UnboundedSender<ObjectRef<Execution>>,
    pub(super) kept: Bookkeeping,
    pub(super) backoff: Backoff,
    /// The controller's work slots, shared fairly across namespaces; a reconcile holds one
    /// except while it only waits (for briq to run its code, for its executor's turn).
    pub(super) work: Arc<FairShare>,
    /// Whether the Execution cache is current: the head's turn is then decided from it, without
    /// a LIST ([`super::step::decide`]).
    pub freshness: Freshness,
}

impl<S> Context<S> {
    pub fn new(
        shared: Arc<Shared<S>>,
        store: Store<Execution>,
        executors: Store<BriqExecutor>,
        wake: mpsc::UnboundedSender<ObjectRef<Execution>>,
    ) -> Self {
        Context {
            backoff: shared.backoff(),
            work: FairShare::new(shared.settings.execution_concurrency.into()),
            shared,
            store,
            executors,
            wake,
            kept: Bookkeeping::default(),
            freshness: Freshness::default(),
        }
    }

    /// An Execution is gone: what was kept of it goes, and the next in its queue may run.
    pub fn deleted(&self, execution: &Execution) {
        // Deleting a running Execution cancels it: the run waiting on it here hears it.
        if let Some(uid) = execution.uid() {
            self.kept.execution_deleted(&uid);
        }
        self.backoff.forget(&object_key(execution));
        self.wake_next(execution);
        self.wake_waiting_for_capacity(execution);
    }

    /// The watch delivered `execution`: its code is kept while it is not sent, and its cancel
    /// request is heard by the run waiting on it.
    pub fn heard(&self, execution: &Execution) {
        self.kept.heard(execution);
    }

    /// An executor is gone: what was kept of it goes.
    pub fn executor_deleted(&self, executor: &BriqExecutor) {
        if let Some(uid) = executor.uid() {
            self.kept.executor_deleted(&uid);
        }
    }

    /// How many things this controller keeps of Execution `uid`, its backoff included.
    #[cfg(test)]
    pub(crate) fn kept_of_execution(&self, execution: &Execution) -> usize {
        self.kept
            .held_for_execution(&execution.uid().unwrap_or_default())
            + usize::from(self.backoff.holds(&object_key(execution)))
    }

    pub fn bookkeeping(&self) -> usize {
        self.kept.len() + self.backoff.len()
    }

    /// Writes the execution counts that changed since the last time, one status write per
    /// executor (`Settings::count_write_interval`).
    pub async fn write_counts(&self) {
        for count in self.kept.take_unwritten_counts() {
            let api = Api::<BriqExecutor>::namespaced(self.shared.client.clone(), &count.namespace);
            let counters = json!({
                "executionsTotal": count.total,
                "lastExecutionTime": count.last_execution,
            });
            match apply_status_of(&api, &count.name, EXECUTIONS_MANAGER, counters).await {
                Ok(()) => {}
                Err(Error::Kube(kube::Error::Api(response))) if response.code == 404 => {}
                Err(error) => {
                    warn!(%error, executor = %count.name, "could not write the execution count");
                    self.kept.unwritten_count(count);
                }
            }
        }
    }

    /// Drops what is kept of objects the caches no longer hold.
    pub fn sweep(&self) {
        let executions: HashSet<String> =
            self.store.state().iter().filter_map(|e| e.uid()).collect();
        let executors: HashSet<String> = self
            .executors
            .state()
            .iter()
            .filter_map(|e| e.uid())
            .collect();
        self.kept.retain(
            |uid| executions.contains(uid),
            |uid| executors.contains(uid),
        );
        prune_backoff(&self.backoff, &self.store);
    }

    pub(super) fn is_finished(&self, execution: &Execution) -> bool {
        match execution.uid() {
            Some(uid) => self.kept.is_finished(&uid, execution.finished()),
            None => execution.finished(),
        }
    }

    pub(super) fn is_unusable(&self, executor: &BriqExecutor) -> bool {
        executor
            .uid()
            .is_some_and(|uid| self.kept.is_unusable(&uid))
    }

    pub(super) fn cached_executor(&self, namespace: &str, name: &str) -> Option<Arc<BriqExecutor>> {
        self.executors.get(&ObjectRef::new(name).within(namespace))
    }
}
