//! The pool members this process is handing to claimers, until the executor cache shows each
//! claim recorded on its claimer.
//!
//! A claim is two writes: the member's (its claimer, with the member's resourceVersion as
//! precondition, so exactly one claimer wins it) and then the claimer's (the member it took, with
//! the claimer's resourceVersion as precondition). Between them, and until the cache shows the
//! second, the cache alone would say two wrong things: that the claimer holds nothing (it would
//! take a second member) and that the member is still free (the next claimer would try it and
//! lose). This bookkeeping answers both for this process's own claims, without asking the API
//! server; what another process did is caught by the claimer's precondition.
//!
//! It also remembers a claimer this process recorded, reported Ready and settled until the cache
//! shows it so: the watch delivers the record with its Ready (a status write) before the
//! finalizer and annotations that settle it, so a reconcile between them would settle it again
//! or go back to the claim ([`after_claim`]).

use std::{
    collections::{HashMap, HashSet},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use crate::controller::recheck::CACHE_LAG;

use crate::controller::executor::step::Step;
use crate::crd::BriqExecutor;

/// Where a claimer's handover stands in this process.
#[derive(Debug, Clone)]
enum Handover {
    /// The member's write is on its way.
    Taking(String),
    /// The member is the claimer's (as the API server returned it); the claimer's own record
    /// may not be written, or not be in the cache yet.
    Taken(Box<BriqExecutor>),
    /// The claimer was recorded, reported Ready and settled at this instant; the cache may not
    /// show it yet.
    Reported { member: String, at: Instant },
}

impl Handover {
    fn member(&self) -> String {
        match self {
            Handover::Taking(name) | Handover::Reported { member: name, .. } => name.clone(),
            Handover::Taken(member) => kube::ResourceExt::name_any(member.as_ref()),
        }
    }
}

/// What a reconcile of a claimer does about its handover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterClaim {
    /// Nothing is remembered of the handover (any more), or it is the claim's own step: take
    /// the step.
    Go,
    /// Nothing to do before this long: the cache has not caught up with what this process
    /// wrote (the writes' own watch events come sooner), or it has and the kernel, which
    /// answered when the claim was reported, is not due for a probe yet.
    Recheck(Duration),
    /// Its status records its claim, and the finalizer and annotations that settle it are
    /// missing: write them before anything else (record.rs).
    Settle,
}

/// Decides for a claimer whose cached copy leads to `step`, `unsettled` when that copy records
/// its claim in its status only, reported Ready and settled `since` ago by this process (`None`:
/// not by this process, or settled), probed every `probe_interval`. Whether the handover is
/// settled: it is not while the claim step may still be taking a member, or while the cache lags
/// behind this process's own writes.
pub fn after_claim(
    since: Option<Duration>,
    step: &Step,
    unsettled: bool,
    probe_interval: Duration,
) -> (AfterClaim, bool) {
    let lag_left = since
        .map(|since| CACHE_LAG.saturating_sub(since))
        .filter(|left| !left.is_zero());
    let probe_due = since
        .map(|since| probe_interval.saturating_sub(since))
        .filter(|due| !due.is_zero());
    match (step, lag_left) {
        // Neither the record nor what settles it is cached yet: the claim would take a fresh
        // read to learn what this process already knows.
        (Step::Claim, Some(left)) => (AfterClaim::Recheck(left), false),
        // The claim's own step: a handover may be under way in this process.
        (Step::Claim, None) => (AfterClaim::Go, false),
        (_, Some(left)) if unsettled => (AfterClaim::Recheck(left), false),
        (_, None) if unsettled => (AfterClaim::Settle, true),
        (Step::Probe { .. }, _) if probe_due.is_some() => {
            (AfterClaim::Recheck(probe_due.unwrap_or_default()), true)
        }
        _ => (AfterClaim::Go, true),
    }
}

/// Claimers (by uid) and the member each is being handed, in this process.
#[derive(Debug, Default)]
pub struct Handovers {
    by_claimer: Mutex<HashMap<String, Handover>>,
}

impl Handovers {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Handover>> {
        self.by_claimer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves `member` for `claimer` before its write; `false` when another claimer of this
    /// process is taking or took it.
    pub fn reserve(&self, claimer: &str, member: &str) -> bool {
        let mut handovers = self.lock();
        let spoken_for = handovers
            .iter()
            .any(|(other, handover)| other != claimer && handover.member() == member);
        if spoken_for {
            return false;
        }
        handovers.insert(claimer.to_owned(), Handover::Taking(member.to_owned()));
        true
    }

    /// The member's write lost (another claimer's, or gone): it is free to try another.
    pub fn lost(&self, claimer: &str) {
        self.lock().remove(claimer);
    }

    /// The member's write won: `member` is the claimer's from now on.
    pub fn won(&self, claimer: &str, member: BriqExecutor) {
        self.lock()
            .insert(claimer.to_owned(), Handover::Taken(Box::new(member)));
    }

    /// The member this process handed to `claimer`, if its write won.
    pub fn taken(&self, claimer: &str) -> Option<BriqExecutor> {
        match self.lock().get(claimer) {
            Some(Handover::Taken(member)) => Some(member.as_ref().clone()),
            _ => None,
        }
    }

    /// `claimer` is recorded, reported Ready and settled: remembered until the cache shows it
    /// so.
    pub fn reported(&self, claimer: &str, member: &str) {
        let reported = Handover::Reported {
            member: member.to_owned(),
            at: Instant::now(),
        };
        self.lock().insert(claimer.to_owned(), reported);
    }

    /// How long ago this process reported `claimer` Ready, if it did and the handover is not
    /// settled.
    pub fn reported_since(&self, claimer: &str) -> Option<Duration> {
        match self.lock().get(claimer) {
            Some(Handover::Reported { at, .. }) => Some(at.elapsed()),
            _ => None,
        }
    }

    /// Whether a member's write to `claimer` ended without an answer (it may have won): its
    /// reservation outlived the reconcile that made it.
    pub fn uncertain(&self, claimer: &str) -> bool {
        matches!(self.lock().get(claimer), Some(Handover::Taking(_)))
    }

    /// Members other claimers of this process are taking or took.
    pub fn spoken_for(&self, claimer: &str) -> HashSet<String> {
        self.lock()
            .iter()
            .filter(|(other, _)| other.as_str() != claimer)
            .map(|(_, handover)| handover.member())
            .collect()
    }

    /// The cache shows `claimer`'s record (or it is gone): nothing to remember of it.
    pub fn settled(&self, claimer: &str) {
        self.lock().remove(claimer);
    }

    /// Keeps only the claimers in `live`.
    pub fn retain(&self, live: &HashSet<String>) {
        self.lock().retain(|claimer, _| live.contains(claimer));
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str) -> BriqExecutor {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "briq.cloud/v1alpha1",
            "kind": "BriqExecutor",
            "metadata": { "name": name, "namespace": "ns" },
            "spec": {},
        }))
        .unwrap()
    }

    fn sorted(set: HashSet<String>) -> Vec<String> {
        let mut names: Vec<String> = set.into_iter().collect();
        names.sort();
        names
    }

    #[test]
    fn a_member_reserved_by_one_claimer_is_not_offered_to_another() {
        let handovers = Handovers::default();
        assert!(handovers.reserve("a", "m1"));
        assert!(!handovers.reserve("b", "m1"));
        assert!(handovers.reserve("b", "m2"));
        assert_eq!(sorted(handovers.spoken_for("c")), ["m1", "m2"]);
        assert_eq!(sorted(handovers.spoken_for("a")), ["m2"]);
        // A lost write frees the member; a claimer reserving again moves its reservation.
        handovers.lost("a");
        assert!(handovers.reserve("c", "m1"));
        assert!(handovers.reserve("c", "m3"));
        assert_eq!(sorted(handovers.spoken_for("x")), ["m2", "m3"]);
    }

    #[test]
    fn a_claimer_seen_before_the_cache_shows_its_settled_claim_is_left_alone_until_it_does() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let provision = Step::Provision {
            sandbox: "bq_1".into(),
        };
        let probe = Step::Probe {
            sandbox: "bq_1".into(),
        };
        let unusable = Step::ReportUnusable { why: "lost".into() };
        let interval = s(30);
        let table = [
            // (settled this long ago, the cached copy's step, its claim in its status only)
            //   → (what, settled)
            // Not settled by this process: a restart, another operator, or forgotten already.
            (None, &provision, false, (AfterClaim::Go, true)),
            (None, &probe, false, (AfterClaim::Go, true)),
            // The claim's own step: its handover may be under way here; nothing is forgotten.
            (None, &Step::Claim, false, (AfterClaim::Go, false)),
            // Recorded and Ready, not settled (a crash or an error between the two writes,
            // or another process's claim): settled first, whatever the step.
            (None, &probe, true, (AfterClaim::Settle, true)),
            (None, &provision, true, (AfterClaim::Settle, true)),
            // Settled here, the cache shows neither write, or the record without what settles
            // it: no fresh read, no second settling; the writes' own watch events come first,
            // the recheck bounds them.
            (
                Some(ms(40)),
                &Step::Claim,
                false,
                (AfterClaim::Recheck(ms(4960)), false),
            ),
            (
                Some(ms(40)),
                &probe,
                true,
                (AfterClaim::Recheck(ms(4960)), false),
            ),
            // A cache that never showed them within its lag: the fresh read decides.
            (Some(s(5)), &Step::Claim, false, (AfterClaim::Go, false)),
            (Some(s(9)), &probe, true, (AfterClaim::Settle, true)),
            // Settled and cached: the kernel answered when the claim was reported; it is probed
            // when its interval is up, not at once.
            (
                Some(ms(60)),
                &probe,
                false,
                (AfterClaim::Recheck(ms(29940)), true),
            ),
            (Some(s(30)), &probe, false, (AfterClaim::Go, true)),
            // Anything else is taken as it comes.
            (Some(ms(60)), &unusable, false, (AfterClaim::Go, true)),
            (Some(ms(60)), &provision, false, (AfterClaim::Go, true)),
        ];
        for (since, step, unsettled, expected) in table {
            assert_eq!(
                after_claim(since, step, unsettled, interval),
                expected,
                "{since:?} {step:?} {unsettled}"
            );
        }
    }

    #[test]
    fn a_reported_claimer_keeps_its_member_spoken_for_until_settled() {
        let handovers = Handovers::default();
        assert!(handovers.reserve("a", "m1"));
        handovers.won("a", member("m1"));
        assert_eq!(handovers.reported_since("a"), None);
        handovers.reported("a", "m1");
        assert!(handovers.reported_since("a").is_some());
        assert!(
            handovers.taken("a").is_none(),
            "recorded: nothing to record again"
        );
        assert!(!handovers.uncertain("a"));
        assert!(!handovers.reserve("b", "m1"));
        handovers.settled("a");
        assert_eq!(handovers.reported_since("a"), None);
        assert!(handovers.reserve("b", "m1"));
    }

    #[test]
    fn a_won_member_stays_the_claimers_until_its_record_is_seen() {
        let handovers = Handovers::default();
        assert!(handovers.reserve("a", "m1"));
        assert!(handovers.taken("a").is_none());
        assert!(
            handovers.uncertain("a"),
            "a reservation alone: the write may have won"
        );
        handovers.won("a", member("m1"));
        assert_eq!(
            handovers
                .taken("a")
                .map(|m| kube::ResourceExt::name_any(&m)),
            Some("m1".to_owned())
        );
        assert!(!handovers.reserve("b", "m1"));
        assert!(!handovers.uncertain("a"));
        handovers.settled("a");
        assert!(handovers.taken("a").is_none());
        assert!(handovers.reserve("b", "m1"));
        handovers.retain(&HashSet::new());
        assert_eq!(handovers.len(), 0);
    }
}
