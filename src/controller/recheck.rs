//! The operator's timings, in one place: how long each wait may last without a trigger (every
//! wait has a trigger that cannot be lost or a bounded recheck; `wake` says which), the grace
//! periods that decide when an uncertain state is given up on, and the deadlines and pauses of
//! the steps that wait on briq or on the caches.

use std::time::Duration;

use k8s_openapi::jiff::SignedDuration;

use crate::crd::MAX_EXECUTION_TIMEOUT_SECONDS;

/// The recheck of a wait that has a trigger: should the trigger ever be missed, the wait ends
/// this long after. It reads the caches only.
pub const SAFETY_NET: Duration = Duration::from_secs(10);
/// The recheck after a conditional write lost to a conflict, decided again on the object as it
/// is now should nothing else wake it.
pub const CONFLICT_RECHECK: Duration = Duration::from_secs(1);
/// The recheck of an Execution queued behind others (woken by the one before it ending).
pub const TURN: Duration = Duration::from_secs(5);
/// The recheck of a pool whose members are being made or provisioned.
pub const POOL_FILLING: Duration = Duration::from_secs(1);
/// How often a deleted executor looks whether its Executions have concluded.
pub const DRAIN: Duration = Duration::from_millis(500);
/// The recheck of an executor waiting for its class (woken by any change of a class).
pub const CLASS_RECHECK: Duration = Duration::from_secs(60);
/// The longest recheck of a missing key Secret.
pub const KEY_RECHECK_MAX: Duration = Duration::from_secs(30);
/// The longest pause between two questions to briq about an outcome it left unknown: the
/// longest an Execution waits once briq answers again.
pub const BRIQ_RECHECK_MAX: Duration = Duration::from_secs(15);

/// A wait, as [`recheck`] tells how long it may last without a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// An Execution whose executor does not exist; `left` until it gives up.
    ExecutorMissing { left: Duration },
    /// An Execution whose executor exists but is not Ready.
    ExecutorNotReady,
    /// An Execution behind others in its executor's queue.
    Turn,
    /// An executor or Execution whose key Secret is missing, `waited` since it was created.
    KeySecret { waited: Duration },
    /// A pool whose members are being made or provisioned.
    PoolFilling,
    /// An executor waiting for its class to be created, or to allow it.
    Class,
    /// An Execution waiting for a place under its class's `maxRunningExecutions`.
    Capacity,
    /// A deleted executor whose Executions have not concluded, `left` of its drain limit.
    Drain { left: Duration },
    /// An Execution whose outcome briq left unknown, `waited` since its attempt started and
    /// `left` of its patience; briq may have asked for a pause (`Retry-After`).
    Briq {
        waited: Duration,
        left: Duration,
        retry_after: Option<Duration>,
    },
}

/// When to look again at what waits, should nothing wake it first.
pub fn recheck(wait: Wait) -> Duration {
    match wait {
        Wait::ExecutorMissing { left } => SAFETY_NET.min(left),
        Wait::ExecutorNotReady => SAFETY_NET,
        Wait::Turn => TURN,
        Wait::KeySecret { waited } => key_recheck(waited),
        Wait::PoolFilling => POOL_FILLING,
        Wait::Class => CLASS_RECHECK,
        Wait::Capacity => SAFETY_NET,
        Wait::Drain { left } => DRAIN.min(left),
        Wait::Briq {
            waited,
            left,
            retry_after,
        } => briq_recheck(waited, retry_after).min(left),
    }
}

/// Nothing signals that briq answers again: an outcome it left unknown is asked for soon at
/// first (most failures are blips), then less often, a quarter of the time waited, up to
/// [`BRIQ_RECHECK_MAX`], and never before the pause briq asked for.
pub fn briq_recheck(waited: Duration, retry_after: Option<Duration>) -> Duration {
    (waited / 4)
        .clamp(Duration::from_secs(1), BRIQ_RECHECK_MAX)
        .max(retry_after.unwrap_or_default())
}

/// A Secret is not watched (the operator reads keys one by one, never lists them): a missing
/// one is read again soon at first, since it is often created right after its executor, then
/// less often, a quarter of the time waited, up to [`KEY_RECHECK_MAX`].
pub fn key_recheck(waited: Duration) -> Duration {
    (waited / 4).clamp(Duration::from_secs(1), KEY_RECHECK_MAX)
}

/// How long after an attempt's deadline its result may still arrive: the bridge's own margin
/// and the status write.
pub const ATTEMPT_GRACE: SignedDuration = SignedDuration::from_secs(15);

// The Execution's path.

/// How long an action sent with its code at hand runs before `Running` is written beside it:
/// most agents' steps end sooner, and their result write is then the only one. Whoever watches
/// sees `Running` this much later on longer actions.
pub const RUNNING_WRITE_AFTER: Duration = Duration::from_millis(100);

/// How long after its creationTimestamp (whole seconds) the head of a burst of Executions
/// created in one second waits before it runs: siblings of that second may still be arriving.
pub const BURST_WINDOW: SignedDuration = SignedDuration::from_secs(2);

/// How long interrupted code gets to stop before its kernel is restarted (its state lost).
pub const CANCEL_GRACE: Duration = Duration::from_secs(3);

/// The pauses between cancels of a running attempt that briq did not carry: the first, and the
/// longest.
pub const FIRST_CANCEL_PAUSE: Duration = Duration::from_millis(500);
pub const MAX_CANCEL_PAUSE: Duration = Duration::from_secs(5);

// Executors, claims and pools.

/// How long a waiting claimer waits before it looks at its pool again: a safety net, as a
/// member that becomes Ready wakes the claimers it can serve at once (wake.rs).
pub const CLAIM_RECHECK: Duration = Duration::from_secs(1);

/// When a claimer whose environment the claimed kernel did not take looks again (its next
/// step provisions the sandbox, which gives it).
pub const ENV_RETRY: Duration = Duration::from_secs(1);

/// How long the cache may take to show a status this process wrote before a reconcile that
/// does not see it acts on what it sees (a fresh read then decides).
pub const CACHE_LAG: Duration = Duration::from_secs(5);

/// How long saving or restoring the namespace may take inside the sandbox.
pub const STATE_DEADLINE: Duration = Duration::from_secs(60);

/// How long a deleted executor waits for its unfinished Executions before it destroys its
/// sandbox regardless: the longest action, the grace an attempt gets before it counts as
/// interrupted, and a little slack for the result's write.
pub const DRAIN_LIMIT: SignedDuration =
    SignedDuration::from_secs(MAX_EXECUTION_TIMEOUT_SECONDS as i64 + ATTEMPT_GRACE.as_secs() + 5);

/// How long a created member is counted without the cache showing it.
pub const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(60);

// The runtime.

/// How long a reconcile waits for the first list of classes.
pub const CLASSES_WAIT: Duration = Duration::from_secs(10);

/// How often the bookkeeping is checked against the caches.
pub const BOOKKEEPING_SWEEP: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    fn briq(waited: Duration, left: Duration, retry_after: Option<Duration>) -> Wait {
        Wait::Briq {
            waited,
            left,
            retry_after,
        }
    }

    #[test]
    fn every_wait_has_a_recheck_of_seconds() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let table = [
            (Wait::ExecutorMissing { left: s(590) }, s(10)),
            (Wait::ExecutorMissing { left: s(3) }, s(3)),
            (Wait::ExecutorNotReady, s(10)),
            (Wait::Turn, s(5)),
            (Wait::KeySecret { waited: s(0) }, s(1)),
            (Wait::KeySecret { waited: s(2) }, s(1)),
            (Wait::KeySecret { waited: s(6) }, ms(1500)),
            (Wait::KeySecret { waited: s(20) }, s(5)),
            (Wait::KeySecret { waited: s(3600) }, s(30)),
            (Wait::PoolFilling, s(1)),
            (Wait::Drain { left: s(60) }, ms(500)),
            (Wait::Drain { left: ms(120) }, ms(120)),
            (briq(s(0), s(600), None), s(1)),
            (briq(s(8), s(600), None), s(2)),
            (briq(s(40), s(600), None), s(10)),
            (briq(s(400), s(600), None), s(15)),
            (briq(s(8), s(600), Some(s(30))), s(30)),
            (briq(s(400), ms(300), None), ms(300)),
            (briq(s(8), s(5), Some(s(30))), s(5)),
        ];
        for (wait, expected) in table {
            assert_eq!(recheck(wait), expected, "{wait:?}");
        }
    }
}
