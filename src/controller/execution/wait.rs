//! An Execution that cannot run yet says why (Succeeded=Unknown: queued, its executor missing or
//! not ready, no place under its class), once per reason: every step that waits writes it here.

use kube::ResourceExt;

use super::actor::Actor;
use crate::{
    briq::SandboxApi,
    controller::context::Result,
    crd::{
        ExecutionStatus,
        conditions::{self, SUCCEEDED, desired},
        reasons::ExecutionReason,
    },
};

/// The status of an Execution that waits (Succeeded=Unknown), or `None` when `current`
/// already says so.
pub fn waiting_status(
    current: &ExecutionStatus,
    generation: Option<i64>,
    reason: ExecutionReason,
    message: String,
) -> Option<ExecutionStatus> {
    let want = [desired(SUCCEEDED, "Unknown", reason.as_str(), message)];
    if conditions::satisfied(&current.conditions, &want, generation)
        && current.observed_generation == generation
    {
        return None;
    }
    Some(ExecutionStatus {
        observed_generation: generation,
        conditions: conditions::merge(&current.conditions, &want, generation),
        // A recovery may wait on an Execution recorded as running: its attempt stays recorded,
        // or it would look never run and be sent again.
        attempt_id: current.attempt_id.clone(),
        start_time: current.start_time.clone(),
        ..Default::default()
    })
}

impl<'a, S: SandboxApi> Actor<'a, S> {
    /// Reports a not-yet-runnable Execution (Succeeded=Unknown) unless it already says so, or
    /// this process wrote so and its cache does not show it yet: an Execution waiting in a
    /// burst is reconciled on each of its own changes, which arrive after the next decision.
    pub(super) async fn wait(&self, reason: ExecutionReason, message: String) -> Result<()> {
        let generation = self.execution.metadata.generation;
        let uid = self.execution.uid().unwrap_or_default();
        let current = self
            .ctx
            .kept
            .waiting_written(&uid)
            .unwrap_or_else(|| self.status());
        if let Some(waiting) = waiting_status(&current, generation, reason, message) {
            self.write(&waiting).await?;
            self.ctx.kept.wrote_waiting(&uid, waiting);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::execution::{fixtures::time, run::running_status};

    #[test]
    fn a_waiting_status_is_written_once() {
        let first = waiting_status(
            &ExecutionStatus::default(),
            Some(1),
            ExecutionReason::Queued,
            "waiting".into(),
        )
        .expect("a first write");
        assert_eq!(first.observed_generation, Some(1));
        assert_eq!(first.conditions[0].reason, "Queued");
        assert_eq!(first.conditions[0].status, "Unknown");
        assert_eq!(
            waiting_status(&first, Some(1), ExecutionReason::Queued, "waiting".into()),
            None
        );
        assert!(
            waiting_status(
                &first,
                Some(1),
                ExecutionReason::ExecutorNotReady,
                "waiting".into()
            )
            .is_some()
        );
    }

    #[test]
    fn a_waiting_status_over_a_recorded_attempt_keeps_it_so_the_code_is_never_sent_again() {
        // Recovery waits (e.g. the executor's key Secret is gone) on an Execution recorded as
        // running: the status it writes must still name the attempt, or the next reconcile would
        // see an Execution that never ran and send its code again.
        let running = running_status(
            &ExecutionStatus::default(),
            Some(1),
            "py",
            "0123456789abcdef".into(),
            time("20"),
        );
        let waiting = waiting_status(
            &running,
            Some(1),
            ExecutionReason::ExecutorNotReady,
            "no key".into(),
        )
        .expect("a new reason is written");
        assert_eq!(waiting.attempt_id.as_deref(), Some("0123456789abcdef"));
        assert_eq!(waiting.start_time, running.start_time);
        assert_eq!(waiting.conditions[0].reason, "ExecutorNotReady");
    }
}
