//! The first step of a deleted executor: its Executions conclude before its sandbox is
//! destroyed, within [`DRAIN_LIMIT`] ([`drain`]).

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{ResourceExt, runtime::controller::Action};

use super::{
    actor::Actor,
    status::{sandbox_fields, state},
};
use crate::{
    briq::SandboxApi,
    controller::{
        context::Result,
        index,
        recheck::{self, DRAIN_LIMIT, Wait},
    },
    crd::{BriqExecutor, reasons::ExecutorReason},
};

/// What a deleted executor does about its Executions that have not concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Drain {
    /// Let them conclude first: a queued one fails at once (`ExecutorDeleted`), a running one
    /// when its action ends. Garbage collection removes the executor's Executions with it, so an
    /// Execution that had not concluded would vanish without saying why it never ran.
    Wait {
        unfinished: usize,
        left: SignedDuration,
    },
    /// Destroy the sandbox now: none is left, or they had [`DRAIN_LIMIT`].
    Destroy,
}

/// `unfinished`: the executor's Executions neither concluded nor being deleted.
fn drain(unfinished: usize, deleted_at: Option<Timestamp>, now: Timestamp) -> Drain {
    let waited = deleted_at
        .map_or(SignedDuration::ZERO, |at| now.duration_since(at))
        .max(SignedDuration::ZERO);
    if unfinished == 0 || waited >= DRAIN_LIMIT {
        return Drain::Destroy;
    }
    Drain::Wait {
        unfinished,
        left: DRAIN_LIMIT - waited,
    }
}

impl<S: SandboxApi> Actor<'_, S> {
    /// While a deleted executor's Executions have not concluded (see [`drain`]): says
    /// so and when to look again.
    pub(super) async fn drain(&self, executor: &BriqExecutor) -> Result<Option<Action>> {
        let unfinished = index::unfinished(
            self.executions,
            &executor.namespace().unwrap_or_default(),
            &executor.name_any(),
        );
        let deleted_at = executor.metadata.deletion_timestamp.as_ref().map(|t| t.0);
        let Drain::Wait { unfinished, left } = drain(unfinished, deleted_at, Timestamp::now())
        else {
            return Ok(None);
        };
        let waiting = state(
            "False",
            false,
            ExecutorReason::Terminating,
            format!("waiting for {unfinished} Execution(s) to conclude"),
        );
        self.report(executor, waiting, sandbox_fields(executor))
            .await?;
        // Nothing wakes an executor when its Executions change: look again soon, within the limit.
        let left = left.unsigned_abs();
        Ok(Some(Action::requeue(recheck::recheck(Wait::Drain {
            left,
        }))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_table() {
        let deleted: Timestamp = "2026-12-03T10:00:00Z".parse().unwrap();
        let after = |seconds: i64| deleted + SignedDuration::from_secs(seconds);
        let wait = |unfinished, left: i64| Drain::Wait {
            unfinished,
            left: SignedDuration::from_secs(left),
        };
        assert_eq!(DRAIN_LIMIT, SignedDuration::from_secs(60));
        let cases = [
            (0, Some(deleted), after(0), Drain::Destroy),
            (2, Some(deleted), after(0), wait(2, 60)),
            (1, Some(deleted), after(59), wait(1, 1)),
            (1, Some(deleted), after(60), Drain::Destroy),
            (1, Some(deleted), after(3600), Drain::Destroy),
            // A deletion timestamp ahead of this clock (skew) counts as just deleted.
            (1, Some(after(10)), after(0), wait(1, 60)),
            (1, None, after(0), wait(1, 60)),
        ];
        for (unfinished, deleted_at, now, expected) in cases {
            assert_eq!(
                drain(unfinished, deleted_at, now),
                expected,
                "{unfinished} at {now}"
            );
        }
    }
}
