//! A namespace's share of a class: at most `perNamespace.maxRunningExecutions` Executions of
//! the class's executors run at once in one namespace. The cache shows the Executions running
//! (their attempt recorded); this process also counts those it let start and its cache does
//! not show yet, so that two turns taken at once in one namespace never both take the last
//! place.

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
};

use kube::runtime::reflector::ObjectRef;

use crate::crd::Execution;

#[derive(Debug, Default)]
pub struct Capacity {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// By namespace: uids this process let start that its cache did not show running yet.
    starting: HashMap<String, HashSet<String>>,
    /// By namespace: Executions told to wait for a place, woken when one ends.
    waiting: HashMap<String, HashSet<ObjectRef<Execution>>>,
}

impl Capacity {
    /// Whether Execution `uid` of `namespace` may start, `max` at once allowed and `running`
    /// the uids the cache shows running there; `settled(uid)`: the cache shows it running or
    /// finished (no longer only this process's to count). Allowed, it counts as starting.
    pub fn admit(
        &self,
        namespace: &str,
        uid: &str,
        max: usize,
        running: &HashSet<String>,
        settled: impl Fn(&str) -> bool,
    ) -> bool {
        let mut inner = self.inner.lock().expect("capacity");
        let starting = inner.starting.entry(namespace.to_owned()).or_default();
        starting.retain(|started| !settled(started) && !running.contains(started));
        if running.contains(uid) || starting.contains(uid) {
            return true;
        }
        if running.len() + starting.len() >= max {
            return false;
        }
        starting.insert(uid.to_owned());
        true
    }

    /// `execution` waits for a place in `namespace`.
    pub fn wait(&self, namespace: &str, execution: ObjectRef<Execution>) {
        let mut inner = self.inner.lock().expect("capacity");
        inner
            .waiting
            .entry(namespace.to_owned())
            .or_default()
            .insert(execution);
    }

    /// An Execution of `namespace` ended (or went): those waiting there look again.
    pub fn ended(&self, namespace: &str, uid: &str) -> Vec<ObjectRef<Execution>> {
        let mut inner = self.inner.lock().expect("capacity");
        if let Some(starting) = inner.starting.get_mut(namespace) {
            starting.remove(uid);
        }
        inner
            .waiting
            .remove(namespace)
            .map(|waiting| waiting.into_iter().collect())
            .unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        let inner = self.inner.lock().expect("capacity");
        inner.starting.values().map(HashSet::len).sum::<usize>()
            + inner.waiting.values().map(HashSet::len).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uids(items: &[&str]) -> HashSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn two_turns_at_once_never_both_take_the_last_place() {
        let capacity = Capacity::default();
        let running = uids(&["r1"]);
        let nothing_settled = |_: &str| false;
        assert!(capacity.admit("team", "a", 2, &running, nothing_settled));
        // The cache does not show `a` running yet: it still counts.
        assert!(!capacity.admit("team", "b", 2, &running, nothing_settled));
        // Another namespace has places of its own.
        assert!(capacity.admit("other", "c", 2, &running, nothing_settled));
        // Asking again, `a` keeps its place.
        assert!(capacity.admit("team", "a", 2, &running, nothing_settled));
    }

    #[test]
    fn a_start_the_cache_shows_counts_once_and_an_end_frees_its_place() {
        let capacity = Capacity::default();
        let none = uids(&[]);
        assert!(capacity.admit("team", "a", 1, &none, |_| false));
        // Now running in the cache: counted there, not twice.
        let running = uids(&["a"]);
        assert!(!capacity.admit("team", "b", 1, &running, |_| false));
        // `a` finished: settled, and the cache no longer shows it running.
        assert!(capacity.admit("team", "b", 1, &none, |uid| uid == "a"));
    }

    #[test]
    fn those_waiting_in_a_namespace_look_again_when_one_there_ends() {
        let capacity = Capacity::default();
        capacity.wait("team", ObjectRef::new("w1").within("team"));
        capacity.wait("team", ObjectRef::new("w2").within("team"));
        capacity.wait("other", ObjectRef::new("o1").within("other"));
        let mut woken: Vec<String> = capacity
            .ended("team", "x")
            .into_iter()
            .map(|r| r.name)
            .collect();
        woken.sort();
        assert_eq!(woken, vec!["w1", "w2"]);
        assert!(capacity.ended("team", "y").is_empty());
        assert_eq!(capacity.len(), 1, "other's waiter stays");
    }
}
