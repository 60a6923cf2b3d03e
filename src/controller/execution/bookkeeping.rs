//! What the execution controller keeps in memory between reconciles. Every entry belongs to one
//! Execution or one executor (by uid) and goes when that object is deleted, so the bookkeeping
//! never outgrows the objects that exist.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::crd::ExecutionStatus;

/// An executor's execution count and the time of its latest Execution, not yet in its status.
#[derive(Debug, Clone, PartialEq)]
pub struct UnwrittenCount {
    pub executor_uid: String,
    pub namespace: String,
    pub name: String,
    pub total: u64,
    pub last_execution: Time,
}

#[derive(Default)]
struct Count {
    total: u64,
    unwritten: Option<UnwrittenCount>,
}

#[derive(Default)]
pub struct Bookkeeping {
    /// One lock per executor: at most one Execution runs in it at a time.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Executors this process made unusable, before its cache says so.
    unusable: Mutex<HashSet<String>>,
    /// Execution counts per executor, continued from the executor's status, with what is not
    /// written to it yet.
    counts: Mutex<HashMap<String, Count>>,
    /// The sandbox briq confirmed as each executor's own: the status that names it is
    /// tenant-writable, so it is checked once, not trusted.
    owned: Mutex<HashMap<String, String>>,
    /// Executions this process finished, before its cache says so.
    finished: Mutex<HashSet<String>>,
    /// Results whose status write failed: written on the next reconcile instead of
    /// "Interrupted".
    unwritten: Mutex<HashMap<String, ExecutionStatus>>,
    /// The waiting status this process last wrote for each Execution not running yet, before
    /// its cache shows it.
    waiting: Mutex<HashMap<String, ExecutionStatus>>,
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

    /// Counts one more Execution of the executor `uid` (`namespace`/`name`), continuing from
    /// `recorded` (its status), to be written by [`Bookkeeping::take_unwritten_counts`]; returns
    /// the new total.
    pub fn count_execution(&self, uid: &str, namespace: &str, name: &str, recorded: u64) -> u64 {
        let mut counts = self.counts.lock().expect("poisoned");
        let count = counts.entry(uid.to_owned()).or_insert_with(|| Count {
            total: recorded,
            unwritten: None,
        });
        count.total += 1;
        count.unwritten = Some(UnwrittenCount {
            executor_uid: uid.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            total: count.total,
            last_execution: Time(k8s_openapi::jiff::Timestamp::now()),
        });
        count.total
    }

    /// The counts not written yet, each once: a failed write gives its count back with
    /// [`Bookkeeping::unwritten_count`].
    pub fn take_unwritten_counts(&self) -> Vec<UnwrittenCount> {
        let mut counts = self.counts.lock().expect("poisoned");
        counts
            .values_mut()
            .filter_map(|count| count.unwritten.take())
            .collect()
    }

    /// A count whose write failed, to be written next time unless a newer one came meanwhile
    /// (or its executor is gone).
    pub fn unwritten_count(&self, unwritten: UnwrittenCount) {
        let mut counts = self.counts.lock().expect("poisoned");
        if let Some(count) = counts.get_mut(&unwritten.executor_uid) {
            count.unwritten.get_or_insert(unwritten);
        }
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
        self.forget_waiting(execution);
        self.finished
            .lock()
            .expect("poisoned")
            .insert(execution.to_owned());
    }

    pub fn wrote_waiting(&self, execution: &str, status: ExecutionStatus) {
        self.waiting
            .lock()
            .expect("poisoned")
            .insert(execution.to_owned(), status);
    }

    pub fn waiting_written(&self, execution: &str) -> Option<ExecutionStatus> {
        self.waiting
            .lock()
            .expect("poisoned")
            .get(execution)
            .cloned()
    }

    /// The Execution runs (or ran): no waiting status is written for it any more.
    pub fn forget_waiting(&self, execution: &str) {
        self.waiting.lock().expect("poisoned").remove(execution);
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
        self.forget_waiting(execution);
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
        self.waiting
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
            + self.waiting.lock().expect("poisoned").len()
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
            kept.count_execution(&executor, "ns", "name", 7);
            kept.confirmed_owner(&executor, &format!("bq_{i}"));
            kept.finished(&execution);
            kept.keep_unwritten(&execution, ExecutionStatus::default());
            kept.wrote_waiting(&execution, ExecutionStatus::default());
        }
        assert_eq!(kept.len(), 7_000);
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
        assert_eq!(kept.count_execution("a", "ns", "x", 41), 42);
        assert_eq!(
            kept.count_execution("a", "ns", "x", 0),
            43,
            "this process's count wins"
        );
        kept.executor_deleted("a");
        assert_eq!(kept.count_execution("a", "ns", "x", 0), 1);
    }

    fn totals(unwritten: &[UnwrittenCount]) -> Vec<(&str, u64)> {
        let mut totals: Vec<_> = unwritten
            .iter()
            .map(|count| (count.executor_uid.as_str(), count.total))
            .collect();
        totals.sort();
        totals
    }

    #[test]
    fn many_executions_make_one_count_write_per_executor() {
        let kept = Bookkeeping::default();
        for _ in 0..10 {
            kept.count_execution("a", "ns", "x", 0);
        }
        kept.count_execution("b", "ns", "y", 5);
        assert_eq!(totals(&kept.take_unwritten_counts()), [("a", 10), ("b", 6)]);
        assert!(
            kept.take_unwritten_counts().is_empty(),
            "each is taken once"
        );
    }

    #[test]
    fn a_failed_count_write_is_retried_unless_a_newer_count_came() {
        let kept = Bookkeeping::default();
        kept.count_execution("a", "ns", "x", 0);
        kept.count_execution("b", "ns", "y", 0);
        let failed = kept.take_unwritten_counts();
        kept.count_execution("a", "ns", "x", 0);
        for count in failed {
            kept.unwritten_count(count);
        }
        assert_eq!(totals(&kept.take_unwritten_counts()), [("a", 2), ("b", 1)]);
    }

    #[test]
    fn a_deleted_executors_count_is_never_written() {
        let kept = Bookkeeping::default();
        kept.count_execution("a", "ns", "x", 0);
        let failed = kept.take_unwritten_counts();
        kept.count_execution("b", "ns", "y", 0);
        kept.executor_deleted("a");
        kept.executor_deleted("b");
        for count in failed {
            kept.unwritten_count(count);
        }
        assert!(kept.take_unwritten_counts().is_empty());
    }

    #[test]
    fn a_waiting_status_is_remembered_until_the_execution_runs_finishes_or_goes() {
        let kept = Bookkeeping::default();
        for uid in ["runs", "finishes", "goes"] {
            kept.wrote_waiting(uid, ExecutionStatus::default());
        }
        assert!(kept.waiting_written("runs").is_some());
        kept.forget_waiting("runs");
        kept.finished("finishes");
        kept.execution_deleted("goes");
        for uid in ["runs", "finishes", "goes"] {
            assert_eq!(kept.waiting_written(uid), None, "{uid}");
        }
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
