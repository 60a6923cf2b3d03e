//! The views of the caches that more than one controller reads: an executor's Executions (what
//! waits on it, what runs in it, how recently it was used) and a pool's members. Reads of the
//! stores only, no writes, no API calls: a controller that needs another's objects asks here,
//! never that controller.

use std::{hash::Hash, sync::Arc};

use k8s_openapi::jiff::Timestamp;
use kube::{
    Resource, ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};

use crate::crd::{
    BriqExecutor, BriqExecutorPool, Execution, POOL_LABEL, POOL_MEMBER_ANNOTATION,
    TEMPLATE_HASH_LABEL, conditions, template_hash,
};

/// The other objects of `of`'s namespace in `store` that are not being deleted: what a limit
/// per namespace counts.
pub fn live_neighbours<K>(store: &Store<K>, of: &K) -> impl Iterator<Item = Arc<K>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    let (namespace, uid) = (of.namespace(), of.uid());
    store.state().into_iter().filter(move |other| {
        other.namespace() == namespace
            && other.uid() != uid
            && other.meta().deletion_timestamp.is_none()
    })
}

// An executor's Executions.

/// The Executions a change of `executor` concerns (for the watch on executors): the unfinished
/// ones, which wait on it, and the finished ones whose time to live is the executor's (the
/// executor cache may have been empty when they were last reconciled, or the TTL changed).
pub fn waiting_on(store: &Store<Execution>, executor: &BriqExecutor) -> Vec<ObjectRef<Execution>> {
    let namespace = executor.namespace().unwrap_or_default();
    let ttl = executor.spec.execution_ttl_seconds_after_finished.is_some();
    of_executor(store, &namespace, &executor.name_any())
        .filter(|e| !e.finished() || (ttl && e.spec.ttl_seconds_after_finished.is_none()))
        .map(|e| ObjectRef::from_obj(e.as_ref()))
        .collect()
}

/// How many cached Executions of executor `namespace/name` have neither concluded nor are being
/// deleted: what a deleted executor waits for.
pub fn unfinished(store: &Store<Execution>, namespace: &str, name: &str) -> usize {
    of_executor(store, namespace, name)
        .filter(|e| e.metadata.deletion_timestamp.is_none() && !e.finished())
        .count()
}

/// How many cached Executions of executor `namespace/name` have their attempt recorded and have
/// not concluded: code that may be running in its sandbox.
pub fn running(store: &Store<Execution>, namespace: &str, name: &str) -> usize {
    of_executor(store, namespace, name)
        .filter(|e| e.running())
        .count()
}

/// The use of executor `namespace/name` the cache shows: its latest Execution creation or
/// completion, and how many Executions wait or run.
pub fn activity(store: &Store<Execution>, namespace: &str, name: &str) -> Activity {
    let mut activity = Activity::default();
    for execution in of_executor(store, namespace, name) {
        if execution.metadata.deletion_timestamp.is_none() && !execution.finished() {
            activity.unfinished += 1;
        }
        let created = execution.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let completed = execution
            .status
            .as_ref()
            .and_then(|s| s.completion_time.as_ref())
            .map(|t| t.0);
        activity.last = activity.last.max(created).max(completed);
    }
    activity
}

/// Every cached Execution of executor `namespace/name`, finished or not.
pub fn of_executor<'a>(
    store: &Store<Execution>,
    namespace: &'a str,
    name: &'a str,
) -> impl Iterator<Item = Arc<Execution>> + 'a {
    store.state().into_iter().filter(move |e| {
        e.namespace().as_deref() == Some(namespace) && e.spec.executor_ref.name == name
    })
}

/// What the executor's Executions say about its use, from the watch cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    /// The latest creation or completion of any of its Executions.
    pub last: Option<Timestamp>,
    /// Executions that neither concluded nor are being deleted (waiting or running).
    pub unfinished: usize,
}

// A pool's members.

/// One unclaimed member, as the pool sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// Made from the pool's current template.
    pub current: bool,
    pub ready: bool,
    /// Never usable again (unusable, setup failed, expired): replaced.
    pub broken: bool,
    /// Being deleted already: neither counted nor deleted again.
    pub deleting: bool,
    pub created: Option<Timestamp>,
}

/// The pool's unclaimed members, as the cache shows them: made by the operator for this pool
/// (the guarded member annotation), still owned by it, still labelled, never claimed.
pub fn members(executors: &Store<BriqExecutor>, pool: &BriqExecutorPool) -> Vec<Arc<BriqExecutor>> {
    let namespace = pool.namespace();
    let name = pool.name_any();
    let uid = pool.uid();
    executors
        .state()
        .into_iter()
        .filter(|e| {
            e.namespace() == namespace
                && e.annotations().get(POOL_MEMBER_ANNOTATION) == Some(&name)
                && e.labels().get(POOL_LABEL) == Some(&name)
                && e.claimed_by().is_none()
                && e.owner_references()
                    .iter()
                    .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
        })
        .collect()
}

/// Ready and usable.
pub fn is_ready(executor: &BriqExecutor) -> bool {
    executor
        .status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, conditions::READY) && !s.unusable)
}

/// How the pool sees `executor`, whose pool's current template hashes to `hash`.
pub fn view(executor: &BriqExecutor, hash: &str) -> Member {
    let status = executor.status.clone().unwrap_or_default();
    Member {
        name: executor.name_any(),
        current: executor
            .labels()
            .get(TEMPLATE_HASH_LABEL)
            .map(String::as_str)
            == Some(hash),
        ready: is_ready(executor),
        broken: status.unusable || conditions::is_true(&status.conditions, conditions::STALLED),
        deleting: executor.metadata.deletion_timestamp.is_some(),
        created: executor.metadata.creation_timestamp.as_ref().map(|t| t.0),
    }
}

/// The members a claimer may take now, longest Ready first: current template, Ready, not being
/// deleted.
pub fn ready_members(
    executors: &Store<BriqExecutor>,
    pool: &BriqExecutorPool,
) -> Vec<BriqExecutor> {
    let hash = template_hash(pool);
    let mut ready: Vec<BriqExecutor> = members(executors, pool)
        .into_iter()
        .filter(|e| {
            let member = view(e, &hash);
            member.current && member.ready && !member.broken && !member.deleting
        })
        .map(|e| e.as_ref().clone())
        .collect();
    let since = |e: &BriqExecutor| {
        e.status
            .as_ref()
            .and_then(|s| s.ready_time.as_ref())
            .map(|t| t.0)
            .unwrap_or(Timestamp::MAX)
    };
    ready.sort_by(|a, b| {
        since(a)
            .cmp(&since(b))
            .then(a.name_any().cmp(&b.name_any()))
    });
    ready
}
