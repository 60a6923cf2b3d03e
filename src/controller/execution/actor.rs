//! One reconcile of one Execution ([`Actor`]): what every step of its life uses (its status, the
//! status write, its trace's notes). The steps are `impl Actor` blocks in their own files.

use std::sync::Mutex;

use kube::{Api, ResourceExt};

use super::{context::Context, trace};
use crate::{
    briq::SandboxApi,
    controller::{context::Result, fair::Held, status::apply_status},
    crd::{BriqExecutor, EXECUTOR_MANAGER, Execution, ExecutionStatus},
    traces,
};

/// Performs one Execution's steps.
pub(super) struct Actor<'a, S> {
    pub(super) execution: &'a Execution,
    pub(super) ctx: &'a Context<S>,
    pub(super) api: Api<Execution>,
    pub(super) executors: Api<BriqExecutor>,
    pub(super) namespace: String,
    /// What this reconcile's run noted for its trace.
    pub(super) timeline: Mutex<trace::Timeline>,
    /// Its work slot ([`FairShare`](crate::controller::fair::FairShare)), given back while it
    /// only waits.
    pub(super) slot: Held,
}

impl<'a, S: SandboxApi> Actor<'a, S> {
    pub(super) fn new(execution: &'a Execution, ctx: &'a Context<S>, slot: Held) -> Self {
        let namespace = execution.namespace().unwrap_or_default();
        let client = ctx.shared.client.clone();
        Actor {
            execution,
            ctx,
            api: Api::namespaced(client.clone(), &namespace),
            executors: Api::namespaced(client, &namespace),
            namespace,
            timeline: Mutex::default(),
            slot,
        }
    }

    pub(super) fn executor_name(&self) -> &str {
        &self.execution.spec.executor_ref.name
    }

    pub(super) fn status(&self) -> ExecutionStatus {
        self.execution.status.clone().unwrap_or_default()
    }

    pub(super) async fn write(&self, status: &ExecutionStatus) -> Result<()> {
        let status = serde_json::to_value(status).expect("status serializes");
        apply_status(&self.api, self.execution, EXECUTOR_MANAGER, status).await
    }

    /// Notes a step of this run for its trace (when traces are exported).
    pub(super) fn note(&self, step: impl FnOnce(&mut trace::Timeline)) {
        if traces::enabled() {
            step(&mut self.timeline.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }
}
