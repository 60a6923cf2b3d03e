//! MCP sessions: an id handed out by `initialize`, bound to the user who asked and the
//! namespace of its endpoint, and nothing else (every call is authorized again). Bounded in
//! number, per user and in all, and forgotten when idle, so clients that open sessions and
//! never come back cost a few bytes each and never grow the operator's memory.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

/// A session unused this long is forgotten (its client then gets 404 and initializes again).
pub const IDLE_LIMIT: Duration = Duration::from_secs(3600);
/// The sessions one user may hold; a new one beyond it replaces their least recently used.
pub const PER_USER: usize = 256;
/// The sessions held in all.
pub const IN_ALL: usize = 16_384;

struct Entry {
    user: String,
    namespace: String,
    version: &'static str,
    used: Instant,
}

#[derive(Default)]
pub struct Sessions {
    entries: Mutex<HashMap<String, Entry>>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{IN_ALL} MCP sessions are open: end some (DELETE) or retry later")]
pub struct Full;

impl Sessions {
    /// A new session of `user` on `namespace`'s endpoint, at protocol `version`.
    pub fn open(
        &self,
        user: &str,
        namespace: &str,
        version: &'static str,
        now: Instant,
    ) -> Result<String, Full> {
        let mut entries = self.entries.lock().expect("sessions lock");
        entries.retain(|_, e| now.duration_since(e.used) < IDLE_LIMIT);
        let theirs: Vec<(&String, Instant)> = entries
            .iter()
            .filter(|(_, e)| e.user == user)
            .map(|(id, e)| (id, e.used))
            .collect();
        if theirs.len() >= PER_USER
            && let Some(oldest) = theirs
                .iter()
                .min_by_key(|(_, used)| *used)
                .map(|(id, _)| (*id).clone())
        {
            entries.remove(&oldest);
        }
        if entries.len() >= IN_ALL {
            return Err(Full);
        }
        let id = format!("{:032x}", rand::random::<u128>());
        entries.insert(
            id.clone(),
            Entry {
                user: user.to_owned(),
                namespace: namespace.to_owned(),
                version,
                used: now,
            },
        );
        Ok(id)
    }

    /// The protocol version of session `id` when it is `user`'s on `namespace` (another's
    /// session is as unknown as one never opened).
    pub fn find(
        &self,
        id: &str,
        user: &str,
        namespace: &str,
        now: Instant,
    ) -> Option<&'static str> {
        let mut entries = self.entries.lock().expect("sessions lock");
        let entry = entries
            .get_mut(id)
            .filter(|e| e.user == user && e.namespace == namespace)
            .filter(|e| now.duration_since(e.used) < IDLE_LIMIT)?;
        entry.used = now;
        Some(entry.version)
    }

    /// Ends session `id` of `user` on `namespace`; false when there was none.
    pub fn close(&self, id: &str, user: &str, namespace: &str) -> bool {
        let mut entries = self.entries.lock().expect("sessions lock");
        let theirs = entries
            .get(id)
            .is_some_and(|e| e.user == user && e.namespace == namespace);
        theirs && entries.remove(id).is_some()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().expect("sessions lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_only_by_its_user_on_its_namespace() {
        let sessions = Sessions::default();
        let now = Instant::now();
        let id = sessions.open("alice", "team-a", "2025-11-25", now).unwrap();
        assert_eq!(
            sessions.find(&id, "alice", "team-a", now),
            Some("2025-11-25")
        );
        assert_eq!(sessions.find(&id, "mallory", "team-a", now), None);
        assert_eq!(sessions.find(&id, "alice", "team-b", now), None);
        assert!(!sessions.close(&id, "mallory", "team-a"));
        assert!(sessions.close(&id, "alice", "team-a"));
        assert_eq!(sessions.find(&id, "alice", "team-a", now), None);
    }

    #[test]
    fn idle_sessions_are_forgotten() {
        let sessions = Sessions::default();
        let now = Instant::now();
        let id = sessions.open("alice", "a", "2025-11-25", now).unwrap();
        let later = now + IDLE_LIMIT;
        assert_eq!(sessions.find(&id, "alice", "a", later), None);
        sessions.open("bob", "a", "2025-11-25", later).unwrap();
        assert_eq!(
            sessions.len(),
            1,
            "the idle one is dropped on the next open"
        );
    }

    #[test]
    fn a_client_opening_sessions_without_end_holds_at_most_its_share() {
        let sessions = Sessions::default();
        let now = Instant::now();
        let first = sessions.open("flood", "a", "2025-11-25", now).unwrap();
        for i in 1..(PER_USER * 3) {
            sessions
                .open(
                    "flood",
                    "a",
                    "2025-11-25",
                    now + Duration::from_millis(i as u64),
                )
                .unwrap();
        }
        assert_eq!(sessions.len(), PER_USER);
        assert_eq!(
            sessions.find(&first, "flood", "a", now),
            None,
            "the oldest went first"
        );
        let other = sessions.open("alice", "a", "2025-11-25", now).unwrap();
        assert!(sessions.find(&other, "alice", "a", now).is_some());
    }
}
