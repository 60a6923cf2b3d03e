//! A namespace's share of a class: `perNamespace.maxQueuedExecutions` Executions of the class's
//! executors wait, and `perNamespace.maxRunningExecutions` run, at once in one namespace. The
//! queue is counted from the cache for [`admit`](super::admit::namespace_queue_full); a place to
//! run is taken at the turn ([`Actor::take_turn`](super::actor::Actor::take_turn)), counted
//! with what this process let start ([`Bookkeeping::take_place`]), and freed when an Execution
//! ends or goes.
//!
//! [`Bookkeeping::take_place`]: super::bookkeeping::Bookkeeping::take_place

use std::sync::Arc;

use kube::{ResourceExt, runtime::reflector::ObjectRef};

use super::{context::Context, observed::NamespaceQueue};
use crate::{
    controller::credentials::made_under,
    crd::{BriqExecutor, Execution},
};

impl<S> Context<S> {
    /// `execution` ended or went: the Executions of its namespace waiting for a place under
    /// their class's `maxRunningExecutions` look again.
    pub(super) fn wake_waiting_for_capacity(&self, execution: &Execution) {
        let namespace = execution.namespace().unwrap_or_default();
        let uid = execution.uid().unwrap_or_default();
        for waiting in self.kept.place_freed(&namespace, &uid) {
            let _ = self.wake.send(waiting);
        }
    }

    /// `execution`'s namespace queue under `executor`'s class, when the class limits it and
    /// `execution` has not started: how many of the namespace's Executions on executors of the
    /// class wait (not started, not finished) before it: before it in run order, or placed
    /// already.
    pub(super) fn namespace_queue(
        &self,
        execution: &Execution,
        executor: &BriqExecutor,
    ) -> Option<NamespaceQueue> {
        if execution
            .status
            .as_ref()
            .is_some_and(|s| s.attempt_id.is_some())
        {
            return None;
        }
        let shared = self.shared.as_ref();
        let class = made_under(shared, executor)?;
        let max = class
            .spec
            .per_namespace
            .as_ref()
            .and_then(|limits| limits.max_queued_executions)?;
        let namespace = execution.namespace().unwrap_or_default();
        let class_name = class.name_any();
        let order = execution.run_order();
        let waiting_before = self
            .store
            .state()
            .iter()
            .filter(|e| {
                e.namespace().as_deref() == Some(namespace.as_str())
                    && e.uid() != execution.uid()
                    && e.metadata.deletion_timestamp.is_none()
                    && e.status.as_ref().is_none_or(|s| s.attempt_id.is_none())
                    && !self.is_finished(e)
                    && (e.run_order() < order || e.holds_a_place())
                    && self
                        .cached_executor(&namespace, &e.spec.executor_ref.name)
                        .and_then(|executor| made_under(shared, &executor))
                        .is_some_and(|c| c.name_any() == class_name)
            })
            .count();
        Some(NamespaceQueue {
            class: class_name,
            max,
            waiting_before,
        })
    }

    /// Whether `execution`, on `executor`, may start now under its class's
    /// `maxRunningExecutions` in its namespace: `Err(message)` when the namespace has no place.
    pub(super) fn place(
        &self,
        execution: &Execution,
        executor: &BriqExecutor,
    ) -> Result<(), String> {
        let shared = self.shared.as_ref();
        let Some(class) = made_under(shared, executor) else {
            return Ok(());
        };
        let Some(max) = class
            .spec
            .per_namespace
            .as_ref()
            .and_then(|limits| limits.max_running_executions)
        else {
            return Ok(());
        };
        let namespace = execution.namespace().unwrap_or_default();
        let class_name = class.name_any();
        let of_class = |e: &Execution| {
            self.cached_executor(&namespace, &e.spec.executor_ref.name)
                .and_then(|executor| made_under(shared, &executor))
                .is_some_and(|c| c.name_any() == class_name)
        };
        let executions: Vec<Arc<Execution>> = self
            .store
            .state()
            .into_iter()
            .filter(|e| e.namespace().as_deref() == Some(namespace.as_str()))
            .collect();
        let running: std::collections::HashSet<String> = executions
            .iter()
            .filter(|e| {
                e.status.as_ref().is_some_and(|s| s.attempt_id.is_some())
                    && !self.is_finished(e)
                    && of_class(e)
            })
            .filter_map(|e| e.uid())
            .collect();
        let cache_shows = |uid: &str| {
            executions
                .iter()
                .find(|e| e.uid().as_deref() == Some(uid))
                .is_none_or(|e| self.is_finished(e))
        };
        let uid = execution.uid().unwrap_or_default();
        if self
            .kept
            .take_place(&namespace, &uid, max as usize, &running, cache_shows)
        {
            return Ok(());
        }
        self.kept
            .wait_for_place(&uid, ObjectRef::from_obj(execution));
        Err(format!(
            "namespace {namespace} runs {} Executions of class {class_name} at once, its \
             perNamespace.maxRunningExecutions; this one runs when one of them ends",
            running.len().max(max as usize)
        ))
    }
}
