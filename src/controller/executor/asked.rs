//! What an executor is asked beside its status ([`Asked`]): by its spec and class (a pool to
//! claim from, a suspension), by its Executions (whether any waits or runs) and by its forks
//! (whether any waits for a snapshot of it, or is one waiting for its source), read from the
//! caches for [`decide`](super::step::decide).

use kube::{ResourceExt, runtime::reflector::Store};

use super::{
    actor::{Actor, Context},
    fork,
    idle::{Idleness, idle_policy},
    step::Asked,
    suspend::suspend_wanted,
};
use crate::{
    briq::SandboxApi,
    controller::{context::Shared, index},
    crd::{BriqExecutor, Execution},
};

/// What `executor`'s spec, its class, its Executions in `executions` and its forks in
/// `executors` ask of it.
fn asked<S>(
    shared: &Shared<S>,
    executions: &Store<Execution>,
    executors: &Store<BriqExecutor>,
    executor: &BriqExecutor,
) -> Asked {
    let namespace = executor.namespace().unwrap_or_default();
    let activity = index::activity(executions, &namespace, &executor.name_any());
    let (idleness, suspends_when_idle) = idle_policy(shared, executor, activity);
    let idle_over = suspends_when_idle && matches!(idleness, Idleness::Expired { .. });
    let cached = executors.state();
    Asked {
        claims: executor.spec.pool_ref.is_some(),
        suspend: suspend_wanted(executor, activity, idle_over),
        forks_waiting: !fork::waiting(executor, &cached).is_empty(),
        forks_reading: fork::reading(executor, &cached),
        fork: fork::asked(executor, &cached),
    }
}

impl<S> Context<S> {
    pub(super) fn asked(&self, executor: &BriqExecutor) -> Asked {
        asked(&self.shared, &self.executions, &self.store, executor)
    }
}

impl<S: SandboxApi> Actor<'_, S> {
    pub(super) fn asked(&self, executor: &BriqExecutor) -> Asked {
        asked(self.shared, self.executions, self.executors, executor)
    }
}
