//! What the execution controller keeps in memory between reconciles, in one structure: each
//! Execution's entry and each executor's entry, by uid. An entry goes when its object is
//! deleted ([`Bookkeeping::execution_deleted`], [`Bookkeeping::executor_deleted`]), when it
//! holds nothing any more (a finished Execution the cache shows finished holds nothing), and at
//! the sweep for objects the caches no longer hold ([`Bookkeeping::retain`]): the bookkeeping
//! never outgrows the objects that exist.
//!
//! An Execution's entry holds: that this process finished it (before the cache shows it), a
//! result whose write failed, the waiting status last written, its code not sent yet (within a
//! byte budget: the cache drops every Execution's code, see `controller::cache`), the cancel
//! request its run listens for, and its place under its class's `maxRunningExecutions` (taken
//! before the cache shows it running) or its wait for one. An executor's entry holds its lock
//! (one Execution runs in it at a time), that this process made it unusable, its execution
//! count not written yet, and the sandbox briq confirmed as its own.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{ResourceExt, runtime::reflector::ObjectRef};
use tokio::sync::watch;

use crate::crd::{Execution, ExecutionStatus};

/// The bytes of code kept at most: 16 MiB, e.g. 4,096 actions of 4 KiB (agents' steps are
/// mostly shorter), or 64 of the largest (65,536 four-byte characters).
pub const CODE_BUDGET_BYTES: usize = 16 << 20;

/// An executor's execution count and the time of its latest Execution, not yet in its status.
#[derive(Debug, Clone, PartialEq)]
pub struct UnwrittenCount {
    pub executor_uid: String,
    pub namespace: String,
    pub name: String,
    pub total: u64,
    pub last_execution: Time,
}

/// What is kept of one Execution.
#[derive(Default)]
struct OfExecution {
    /// This process finished it; the cache does not show it yet.
    finished: bool,
    /// A result whose status write failed: written on the next reconcile instead of
    /// "Interrupted".
    unwritten: Option<ExecutionStatus>,
    /// The waiting status this process last wrote while it does not run yet, before the cache
    /// shows it.
    waiting: Option<ExecutionStatus>,
    /// Its code, not sent yet. With it at hand, an Execution is sent at once and its `Running`
    /// status written beside the exec; without it (beyond the budget), the `Running` write
    /// comes first and brings the code back. The attempt id derives from the Execution either
    /// way, so the sandbox's journal runs any delivery at most once.
    code: Option<Arc<str>>,
    /// The cancel request its run listens for, heard before or during the wait.
    cancel: Option<Arc<watch::Sender<bool>>>,
    /// The namespace whose place under the class's `maxRunningExecutions` this process let it
    /// take, while the cache does not show it running: two turns taken at once in one
    /// namespace never both take the last place.
    starting_in: Option<String>,
    /// Told to wait for a place: woken when an Execution of its namespace ends.
    waits_for_place: Option<ObjectRef<Execution>>,
}

impl OfExecution {
    fn held(&self) -> usize {
        usize::from(self.finished)
            + usize::from(self.unwritten.is_some())
            + usize::from(self.waiting.is_some())
            + usize::from(self.code.is_some())
            + usize::from(self.cancel.is_some())
            + usize::from(self.starting_in.is_some())
            + usize::from(self.waits_for_place.is_some())
    }
}

/// What is kept of one executor.
#[derive(Default)]
struct OfExecutor {
    /// At most one Execution runs in it at a time.
    lock: Option<Arc<tokio::sync::Mutex<()>>>,
    /// This process made it unusable; the cache does not show it yet.
    unusable: bool,
    /// Its execution count, continued from its status, with what is not written to it yet.
    count: Option<Count>,
    /// The sandbox briq confirmed as its own: the status that names it is tenant-writable, so
    /// it is checked once, not trusted.
    owned: Option<String>,
}

impl OfExecutor {
    fn held(&self) -> usize {
        usize::from(self.lock.is_some())
            + usize::from(self.unusable)
            + usize::from(self.count.is_some())
            + usize::from(self.owned.is_some())
    }
}

struct Count {
    total: u64,
    unwritten: Option<UnwrittenCount>,
}

#[derive(Default)]
struct Kept {
    executions: HashMap<String, OfExecution>,
    executors: HashMap<String, OfExecutor>,
    code_bytes: usize,
}

impl Kept {
    fn execution(&mut self, uid: &str) -> &mut OfExecution {
        self.executions.entry(uid.to_owned()).or_default()
    }

    fn executor(&mut self, uid: &str) -> &mut OfExecutor {
        self.executors.entry(uid.to_owned()).or_default()
    }

    /// Drops `uid`'s entry once it holds nothing.
    fn tidy(&mut self, uid: &str) {
        if self.executions.get(uid).is_some_and(|e| e.held() == 0) {
            self.executions.remove(uid);
        }
    }

    fn drop_code(&mut self, uid: &str) {
        if let Some(code) = self.executions.get_mut(uid).and_then(|e| e.code.take()) {
            self.code_bytes -= code.len();
        }
    }
}

/// The execution controller's memory between reconciles (see the module's opening).
pub struct Bookkeeping {
    code_budget: usize,
    kept: Mutex<Kept>,
}

impl Default for Bookkeeping {
    fn default() -> Self {
        Bookkeeping::with_code_budget(CODE_BUDGET_BYTES)
    }
}

impl Bookkeeping {
    pub fn with_code_budget(code_budget: usize) -> Self {
        Bookkeeping {
            code_budget,
            kept: Mutex::default(),
        }
    }

    fn kept(&self) -> MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    // Executors.

    pub fn lock(&self, executor: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.kept()
            .executor(executor)
            .lock
            .get_or_insert_default()
            .clone()
    }

    pub fn made_unusable(&self, executor: &str) {
        self.kept().executor(executor).unusable = true;
    }

    pub fn is_unusable(&self, executor: &str) -> bool {
        self.kept()
            .executors
            .get(executor)
            .is_some_and(|e| e.unusable)
    }

    /// Counts one more Execution of the executor `uid` (`namespace`/`name`), continuing from
    /// `recorded` (its status), to be written by [`Bookkeeping::take_unwritten_counts`]; returns
    /// the new total.
    pub fn count_execution(&self, uid: &str, namespace: &str, name: &str, recorded: u64) -> u64 {
        let mut kept = self.kept();
        let count = kept.executor(uid).count.get_or_insert(Count {
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
        self.kept()
            .executors
            .values_mut()
            .filter_map(|e| e.count.as_mut()?.unwritten.take())
            .collect()
    }

    /// A count whose write failed, to be written next time unless a newer one came meanwhile
    /// (or its executor is gone).
    pub fn unwritten_count(&self, unwritten: UnwrittenCount) {
        let mut kept = self.kept();
        let count = kept
            .executors
            .get_mut(&unwritten.executor_uid)
            .and_then(|e| e.count.as_mut());
        if let Some(count) = count {
            count.unwritten.get_or_insert(unwritten);
        }
    }

    /// Whether briq confirmed `sandbox` as `executor`'s own.
    pub fn owns(&self, executor: &str, sandbox: &str) -> bool {
        self.kept()
            .executors
            .get(executor)
            .and_then(|e| e.owned.as_deref())
            .is_some_and(|owned| owned == sandbox)
    }

    pub fn confirmed_owner(&self, executor: &str, sandbox: &str) {
        self.kept().executor(executor).owned = Some(sandbox.to_owned());
    }

    // Executions.

    /// This process finished `execution`: what it kept to run it goes.
    pub fn finished(&self, execution: &str) {
        let mut kept = self.kept();
        kept.drop_code(execution);
        let entry = kept.execution(execution);
        entry.finished = true;
        entry.waiting = None;
        entry.cancel = None;
    }

    /// Whether this process finished `execution`. Once the cache shows it finished
    /// (`cache_says_finished`), the entry is no longer needed.
    pub fn is_finished(&self, execution: &str, cache_says_finished: bool) -> bool {
        let mut kept = self.kept();
        if cache_says_finished {
            if let Some(entry) = kept.executions.get_mut(execution) {
                entry.finished = false;
                kept.tidy(execution);
            }
            return true;
        }
        kept.executions.get(execution).is_some_and(|e| e.finished)
    }

    pub fn wrote_waiting(&self, execution: &str, status: ExecutionStatus) {
        self.kept().execution(execution).waiting = Some(status);
    }

    pub fn waiting_written(&self, execution: &str) -> Option<ExecutionStatus> {
        self.kept().executions.get(execution)?.waiting.clone()
    }

    /// The Execution runs (or ran): no waiting status is written for it any more.
    pub fn forget_waiting(&self, execution: &str) {
        let mut kept = self.kept();
        if let Some(entry) = kept.executions.get_mut(execution) {
            entry.waiting = None;
            kept.tidy(execution);
        }
    }

    pub fn keep_unwritten(&self, execution: &str, status: ExecutionStatus) {
        self.kept().execution(execution).unwritten = Some(status);
    }

    pub fn unwritten(&self, execution: &str) -> Option<ExecutionStatus> {
        self.kept().executions.get(execution)?.unwritten.clone()
    }

    pub fn written(&self, execution: &str) {
        let mut kept = self.kept();
        if let Some(entry) = kept.executions.get_mut(execution) {
            entry.unwritten = None;
            kept.tidy(execution);
        }
    }

    /// The watch delivered `execution`: its code is kept while it is not sent (within the
    /// budget), and a cancel request is heard.
    pub fn heard(&self, execution: &Execution) {
        let Some(uid) = execution.uid() else {
            return;
        };
        if execution.spec.cancel && !execution.finished() {
            self.request_cancel(&uid);
        }
        let sent = execution
            .status
            .as_ref()
            .is_some_and(|s| s.attempt_id.is_some());
        let mut kept = self.kept();
        if sent || execution.finished() || execution.metadata.deletion_timestamp.is_some() {
            kept.drop_code(&uid);
            kept.tidy(&uid);
            return;
        }
        let size = execution.spec.code.len();
        let known = kept.executions.get(&uid).is_some_and(|e| e.code.is_some());
        if known || kept.code_bytes + size > self.code_budget {
            return;
        }
        kept.code_bytes += size;
        kept.execution(&uid).code = Some(execution.spec.code.as_str().into());
    }

    pub fn code(&self, execution: &str) -> Option<Arc<str>> {
        self.kept().executions.get(execution)?.code.clone()
    }

    /// Cancels `execution`'s run, whether it waits already or begins waiting later.
    pub fn request_cancel(&self, execution: &str) {
        self.cancel_sender(execution).send_replace(true);
    }

    /// Resolves once `execution`'s cancel is requested.
    pub async fn cancel_requested(&self, execution: &str) {
        let mut heard = self.cancel_sender(execution).subscribe();
        if heard.wait_for(|cancelled| *cancelled).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    fn cancel_sender(&self, execution: &str) -> Arc<watch::Sender<bool>> {
        self.kept()
            .execution(execution)
            .cancel
            .get_or_insert_with(|| Arc::new(watch::Sender::new(false)))
            .clone()
    }

    /// Whether Execution `uid` of `namespace` may start, `max` at once allowed and `running`
    /// the uids the cache shows running there; `cache_shows(uid)`: the cache shows it running
    /// or finished (no longer only this process's to count). Allowed, it takes a place.
    /// `cache_shows` may read this bookkeeping: it is asked with no lock held.
    pub fn take_place(
        &self,
        namespace: &str,
        uid: &str,
        max: usize,
        running: &HashSet<String>,
        cache_shows: impl Fn(&str) -> bool,
    ) -> bool {
        let in_namespace = |entry: &OfExecution| entry.starting_in.as_deref() == Some(namespace);
        let starting: Vec<String> = self
            .kept()
            .executions
            .iter()
            .filter(|(_, entry)| in_namespace(entry))
            .map(|(started, _)| started.clone())
            .collect();
        let shown: Vec<&String> = starting
            .iter()
            .filter(|started| running.contains(*started) || cache_shows(started))
            .collect();
        let mut kept = self.kept();
        for started in shown {
            if let Some(entry) = kept.executions.get_mut(started) {
                entry.starting_in = None;
            }
        }
        kept.executions.retain(|_, e| e.held() > 0);
        let holds = kept.executions.get(uid).is_some_and(in_namespace);
        if running.contains(uid) || holds {
            return true;
        }
        let others = kept.executions.values().filter(|e| in_namespace(e)).count();
        if running.len() + others >= max {
            return false;
        }
        kept.execution(uid).starting_in = Some(namespace.to_owned());
        true
    }

    /// Execution `uid` waits for a place in its namespace.
    pub fn wait_for_place(&self, uid: &str, execution: ObjectRef<Execution>) {
        self.kept().execution(uid).waits_for_place = Some(execution);
    }

    /// Execution `uid` of `namespace` ended (or went): its place is free, and those waiting
    /// there look again.
    pub fn place_freed(&self, namespace: &str, uid: &str) -> Vec<ObjectRef<Execution>> {
        let mut kept = self.kept();
        if let Some(entry) = kept.executions.get_mut(uid) {
            entry.starting_in = None;
        }
        let woken = kept
            .executions
            .values_mut()
            .filter(|e| {
                e.waits_for_place
                    .as_ref()
                    .is_some_and(|w| w.namespace.as_deref() == Some(namespace))
            })
            .filter_map(|e| e.waits_for_place.take())
            .collect();
        kept.executions.retain(|_, e| e.held() > 0);
        woken
    }

    // Cleanup.

    /// `execution` is gone: nothing of it is kept but its cancel, which a run still waiting
    /// on it (or beginning to) hears; the sweep drops that.
    pub fn execution_deleted(&self, execution: &str) {
        self.request_cancel(execution);
        let mut kept = self.kept();
        kept.drop_code(execution);
        if let Some(entry) = kept.executions.get_mut(execution) {
            *entry = OfExecution {
                cancel: entry.cancel.take(),
                ..OfExecution::default()
            };
        }
    }

    pub fn executor_deleted(&self, executor: &str) {
        self.kept().executors.remove(executor);
    }

    /// Keeps only the entries of objects that still exist (by uid): what a reconcile that
    /// finished after its object's deletion was handled may have added.
    pub fn retain(
        &self,
        execution_exists: impl Fn(&str) -> bool,
        executor_exists: impl Fn(&str) -> bool,
    ) {
        let mut kept = self.kept();
        let Kept {
            executions,
            executors,
            code_bytes,
        } = &mut *kept;
        executions.retain(|uid, entry| {
            let keep = execution_exists(uid);
            if !keep && let Some(code) = &entry.code {
                *code_bytes -= code.len();
            }
            keep
        });
        executors.retain(|uid, _| executor_exists(uid));
    }

    /// How many things are kept, all entries together.
    pub fn len(&self) -> usize {
        let kept = self.kept();
        kept.executions
            .values()
            .map(OfExecution::held)
            .sum::<usize>()
            + kept.executors.values().map(OfExecutor::held).sum::<usize>()
    }

    /// How many things are kept of Execution `uid`.
    #[cfg(test)]
    pub fn held_for_execution(&self, uid: &str) -> usize {
        self.kept().executions.get(uid).map_or(0, OfExecution::held)
    }

    #[cfg(test)]
    fn code_bytes(&self) -> usize {
        self.kept().code_bytes
    }
}

#[cfg(test)]
mod tests;
