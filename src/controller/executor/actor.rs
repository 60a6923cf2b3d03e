//! What every step of an executor shares: the controller's [`Context`], kept between reconciles,
//! and the [`Actor`] that performs one reconcile's steps with it.

use std::sync::Arc;

use kube::{Api, ResourceExt, runtime::reflector::Store};

use super::claim::handover::Handovers;
use crate::{
    controller::{
        backoff::Backoff,
        context::Shared,
        fair::{FairShare, Held},
        requeue::{object_key, prune_backoff},
    },
    crd::{BriqExecutor, BriqExecutorPool, Execution},
};

/// The executor controller's context: what it shares with the other controller, and its own
/// bookkeeping.
pub struct Context<S> {
    pub shared: Arc<Shared<S>>,
    pub(super) store: Store<BriqExecutor>,
    /// Read only: a deleted executor waits for its Executions to conclude.
    pub(super) executions: Store<Execution>,
    pub(super) backoff: Backoff,
    /// The controller's work slots, shared fairly across namespaces (see fair.rs).
    pub(super) work: Arc<FairShare>,
    /// Read only: the pools claimers take members of.
    pub(super) pools: Store<BriqExecutorPool>,
    /// Members this process is handing to claimers, until the cache shows the claims.
    pub(super) handovers: Handovers,
}

impl<S> Context<S> {
    pub fn new(
        shared: Arc<Shared<S>>,
        store: Store<BriqExecutor>,
        executions: Store<Execution>,
        pools: Store<BriqExecutorPool>,
    ) -> Self {
        Context {
            backoff: shared.backoff(),
            work: FairShare::new(shared.settings.executor_concurrency.into()),
            shared,
            store,
            executions,
            pools,
            handovers: Handovers::default(),
        }
    }

    /// Drops what is kept of executors the cache no longer holds.
    pub fn sweep(&self) {
        prune_backoff(&self.backoff, &self.store);
        let live = self.store.state().iter().filter_map(|e| e.uid()).collect();
        self.handovers.retain(&live);
    }

    /// The executor is gone: nothing kept of it may outlive it.
    pub fn deleted(&self, executor: &BriqExecutor) {
        self.backoff.forget(&object_key(executor));
        if let Some(uid) = executor.uid() {
            self.handovers.settled(&uid);
        }
    }

    pub fn bookkeeping(&self) -> usize {
        self.backoff.len() + self.handovers.len()
    }
}

/// Performs the executor's steps.
pub(super) struct Actor<'a, S> {
    pub(super) shared: &'a Shared<S>,
    pub(super) api: &'a Api<BriqExecutor>,
    pub(super) executions: &'a Store<Execution>,
    pub(super) executors: &'a Store<BriqExecutor>,
    pub(super) pools: &'a Store<BriqExecutorPool>,
    pub(super) handovers: &'a Handovers,
    /// Its work slot ([`FairShare`]), given back while a sandbox is set up.
    pub(super) slot: Held,
}
