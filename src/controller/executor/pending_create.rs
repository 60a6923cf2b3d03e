//! The pending-create mark on an executor (`briq.cloud/sandbox-create-pending`), so that of
//! several operators (two releases without leader election, a lagging cache after a fail-over)
//! only one creates its sandbox: pure functions, tested with exact expected outputs.
//!
//! The mark is written with a `resourceVersion` precondition before the create and names when
//! and by which operator process it was made. Another process that finds the mark and no sandbox
//! by the executor's deterministic name cannot tell a create still in flight from one that never
//! took effect, so it waits until the mark is older than the longest a create request can take
//! ([`Settings::pending_create_expiry`](crate::controller::Settings)) before it looks again and
//! marks anew. The process that made the mark knows its own create has returned (a reconcile of
//! one object never runs twice at once), so it looks and marks anew at once.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// A mark's value: when, then by whom (`<RFC 3339 time> <holder>`).
pub fn mark_value(at: Timestamp, holder: &str) -> String {
    format!("{at} {holder}")
}

/// What to do about a pending-create mark found without a recorded sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingCreate {
    /// No create under that mark can still be in flight: look the sandbox up by name, and
    /// create it under a new mark if it is not there.
    Look,
    /// Another process's create may still be in flight: look again after this long (its
    /// sandbox id is recorded meanwhile, which wakes the executor, if it succeeds).
    Wait(Duration),
}

/// Decides on the mark `value` found at `now` by the process `holder`; `expiry` is the longest a
/// create request can take. A mark that does not parse (an older operator's is a bare time)
/// counts as made by another process; one without a time, as expired.
pub fn pending_create(
    value: &str,
    holder: &str,
    now: Timestamp,
    expiry: Duration,
) -> PendingCreate {
    let mut parts = value.split_whitespace();
    let marked_at = parts.next().and_then(|at| at.parse::<Timestamp>().ok());
    if parts.next() == Some(holder) {
        return PendingCreate::Look;
    }
    let Some(marked_at) = marked_at else {
        return PendingCreate::Look;
    };
    let expiry = SignedDuration::try_from(expiry).unwrap_or(SignedDuration::MAX);
    let left = expiry - now.duration_since(marked_at).max(SignedDuration::ZERO);
    if left.is_positive() {
        PendingCreate::Wait(left.unsigned_abs())
    } else {
        PendingCreate::Look
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: &str) -> Timestamp {
        format!("2026-12-03T00:00:{seconds}Z").parse().unwrap()
    }

    #[test]
    fn a_mark_names_its_time_and_holder() {
        assert_eq!(mark_value(at("07"), "op-a1"), "2026-12-03T00:00:07Z op-a1");
    }

    #[test]
    fn only_an_expired_or_own_mark_is_looked_behind() {
        let expiry = Duration::from_secs(60);
        let s = Duration::from_secs;
        let mine = mark_value(at("00"), "me");
        let theirs = mark_value(at("00"), "them");
        let table = [
            (
                "my own mark, just made",
                mine.as_str(),
                "01",
                PendingCreate::Look,
            ),
            (
                "another's mark, just made",
                &theirs,
                "01",
                PendingCreate::Wait(s(59)),
            ),
            (
                "another's mark, expired",
                &theirs,
                "59",
                PendingCreate::Wait(s(1)),
            ),
            (
                "an older operator's bare time",
                "2026-12-03T00:00:00Z",
                "30",
                PendingCreate::Wait(s(30)),
            ),
            (
                "a mark from a clock ahead",
                &mark_value(at("40"), "them"),
                "10",
                PendingCreate::Wait(s(60)),
            ),
            ("no time at all", "garbage", "00", PendingCreate::Look),
            ("empty", "", "00", PendingCreate::Look),
        ];
        for (name, value, now, expected) in table {
            assert_eq!(
                pending_create(value, "me", at(now), expiry),
                expected,
                "{name}"
            );
        }
        let later: Timestamp = "2026-12-03T00:01:00Z".parse().unwrap();
        assert_eq!(
            pending_create(&theirs, "me", later, expiry),
            PendingCreate::Look,
            "expired exactly"
        );
    }
}
