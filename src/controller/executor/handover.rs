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

use std::{
    collections::{HashMap, HashSet},
    sync::{Mutex, MutexGuard},
};

use crate::crd::BriqExecutor;

/// Where a claimer's handover stands in this process.
#[derive(Debug, Clone)]
enum Handover {
    /// The member's write is on its way.
    Taking(String),
    /// The member is the claimer's (as the API server returned it); the claimer's own record
    /// may not be written, or not be in the cache yet.
    Taken(Box<BriqExecutor>),
}

impl Handover {
    fn member(&self) -> String {
        match self {
            Handover::Taking(name) => name.clone(),
            Handover::Taken(member) => kube::ResourceExt::name_any(member.as_ref()),
        }
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
