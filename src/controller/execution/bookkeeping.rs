//! What the execution controller keeps in memory between reconciles. Every entry belongs to one
//! Execution or one executor (by uid) and goes when that object is deleted, so the bookkeeping
//! never outgrows the objects that exist.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};

use crate::crd::ExecutionStatus;

#[derive(Default)]
pub struct Bookkeeping {
    /// One lock per executor: at most one Execution runs in it at a time.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Executors this process made unusable, before its cache says so.
    unusable: Mutex<HashSet<String>>,
    /// Execution counts per executor, continued from the executor's status.
    counts: Mutex<HashMap<String, u64>>,
    /// The sandbox briq confirmed as each executor's own: the status that names it is
    /// tenant-writable, so it is checked once, not trusted.
    owned: Mutex<HashMap<String, String>>,
    /// Executions this process finished, before its cache says so.
    finished: Mutex<HashSet<String>>,
    /// Results whose status write failed: written on the next reconcile instead of
    /// "Interrupted".
    unwritten: Mutex<HashMap<String, ExecutionStatus>>,
}

impl Bookkeeping {
    pub fn lock(&self, executor: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .expect("poisoned")
            .entry(executor.to_owned())
            .or_default()
            .clone()
    }

    pub fn made_unusable(&self, executor: &str) {
        self.unusable
            .lock()
            .expect("poisoned")
            .insert(executor.to_owned());
    }

    pub fn is_unusable(&self, executor: &str) -> bool {
        self.unusable.lock().expect("poisoned").contains(executor)
    }

    /// The next execution count of `executor`, continued from `recorded` (its status).
    pub fn next_count(&self, executor: &str, recorded: u64) -> u64 {
        let mut counts = self.counts.lock().expect("poisoned");
        let count = counts.entry(executor.to_owned()).or_insert(recorded);
        *count += 1;
        *count
    }

    /// Whether briq confirmed `sandbox` as `executor`'s own.
    pub fn owns(&self, executor: &str, sandbox: &str) -> bool {
        self.owned
            .lock()
            .expect("poisoned")
            .get(executor)
            .is_some_and(|owned| owned == sandbox)
    }

    pub fn confirmed_owner(&self, executor: &str, sandbox: &str) {
        self.owned
            .lock()
            .expect("poisoned")
            .insert(executor.to_owned(), sandbox.to_owned());
    }

    pub fn finished(&self, execution: &str) {
        self.finished
            .lock()
            .expect("poisoned")
            .insert(execution.to_owned());
    }

    /// Whether this process finished `execution`. Once the cache shows it finished
    /// (`cache_says_finished`), the entry is no longer needed.
    pub fn is_finished(&self, execution: &str, cache_says_finished: bool) -> bool {
        let mut finished = self.finished.lock().expect("poisoned");
        if cache_says_finished {
            finished.remove(execution);
            return true;
        }
        finished.contains(execution)
    }

    pub fn keep_unwritten(&self, execution: &str, status: ExecutionStatus) {
        self.unwritten
            .lock()
            .expect("poisoned")
            .insert(execution.to_owned(), status);
    }

    pub fn unwritten(&self, execution: &str) -> Option<ExecutionStatus> {
        self.unwritten
            .lock()
            .expect("poisoned")
            .get(execution)
            .cloned()
    }

    pub fn written(&self, execution: &str) {
        self.unwritten.lock().expect("poisoned").remove(execution);
    }

    pub fn execution_deleted(&self, execution: &str) {
        self.finished.lock().expect("poisoned").remove(execution);
        self.written(execution);
    }

    pub fn executor_deleted(&self, executor: &str) {
        self.locks.lock().expect("poisoned").remove(executor);
        self.unusable.lock().expect("poisoned").remove(executor);
        self.counts.lock().expect("poisoned").remove(executor);
        self.owned.lock().expect("poisoned").remove(executor);
    }

    /// Keeps only the entries of objects that still exist (by uid): what a reconcile that
    /// finished after its object's deletion was handled may have added.
    pub fn retain(
        &self,
        execution_exists: impl Fn(&str) -> bool,
        executor_exists: impl Fn(&str) -> bool,
    ) {
        self.finished
            .lock()
            .expect("poisoned")
            .retain(|uid| execution_exists(uid));
        self.unwritten
            .lock()
            .expect("poisoned")
            .retain(|uid, _| execution_exists(uid));
        self.locks
            .lock()
            .expect("poisoned")
            .retain(|uid, _| executor_exists(uid));
        self.unusable
            .lock()
            .expect("poisoned")
            .retain(|uid| executor_exists(uid));
        self.counts
            .lock()
            .expect("poisoned")
            .retain(|uid, _| executor_exists(uid));
        self.owned
            .lock()
            .expect("poisoned")
            .retain(|uid, _| executor_exists(uid));
    }

    /// How many entries are kept, all maps together.
    pub fn len(&self) -> usize {
        self.locks.lock().expect("poisoned").len()
            + self.unusable.lock().expect("poisoned").len()
            + self.counts.lock().expect("poisoned").len()
            + self.owned.lock().expect("poisoned").len()
            + self.finished.lock().expect("poisoned").len()
            + self.unwritten.lock().expect("poisoned").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deleting_a_thousand_objects_leaves_nothing_behind() {
        let kept = Bookkeeping::default();
        for i in 0..1_000 {
            let (executor, execution) = (format!("executor-{i}"), format!("execution-{i}"));
            drop(kept.lock(&executor));
            kept.made_unusable(&executor);
            kept.next_count(&executor, 7);
            kept.confirmed_owner(&executor, &format!("bq_{i}"));
            kept.finished(&execution);
            kept.keep_unwritten(&execution, ExecutionStatus::default());
        }
        assert_eq!(kept.len(), 6_000);
        for i in 0..1_000 {
            kept.execution_deleted(&format!("execution-{i}"));
            kept.executor_deleted(&format!("executor-{i}"));
        }
        assert_eq!(kept.len(), 0);
    }

    #[test]
    fn entries_added_after_a_deletion_go_at_the_next_sweep() {
        let kept = Bookkeeping::default();
        drop(kept.lock("live-executor"));
        drop(kept.lock("gone-executor"));
        kept.confirmed_owner("gone-executor", "bq_1");
        kept.finished("live-execution");
        kept.keep_unwritten("gone-execution", ExecutionStatus::default());
        kept.retain(|uid| uid == "live-execution", |uid| uid == "live-executor");
        assert_eq!(kept.len(), 2);
        assert!(kept.is_finished("live-execution", false));
    }

    #[test]
    fn counts_continue_from_the_recorded_total() {
        let kept = Bookkeeping::default();
        assert_eq!(kept.next_count("a", 41), 42);
        assert_eq!(kept.next_count("a", 0), 43, "this process's count wins");
        kept.executor_deleted("a");
        assert_eq!(kept.next_count("a", 0), 1);
    }

    #[test]
    fn a_finished_entry_lasts_until_the_cache_catches_up() {
        let kept = Bookkeeping::default();
        assert!(!kept.is_finished("x", false));
        kept.finished("x");
        assert!(kept.is_finished("x", false));
        assert!(kept.is_finished("x", true));
        assert_eq!(kept.len(), 0);
    }
}
