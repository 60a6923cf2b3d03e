//! Deterministic sandbox names.
//!
//! briq has no labels or idempotency keys, so the name is what lets the operator find a sandbox
//! it created just before a crash: the same executor always maps to the same name. The allowed
//! alphabet and length of briq names are not documented; a DNS label (`[a-z0-9-]`, at most 63)
//! is assumed as the safe choice.

use sha2::{Digest as _, Sha256};

const PREFIX: &str = "bqe";
const MAX_LEN: usize = 63;
const UID_CHARS: usize = 8;
const HASH_CHARS: usize = 10;

/// `bqe-<namespace>-<name>-<first 8 of uid>`, lowercased to `[a-z0-9-]`. When that is longer
/// than 63 characters, the namespace and name part is cut and a hash of all three is added, so
/// long names that share a prefix still differ.
pub fn sandbox_name(namespace: &str, name: &str, uid: &str) -> String {
    let short_uid: String = sanitize(uid)
        .chars()
        .filter(|c| *c != '-')
        .take(UID_CHARS)
        .collect();
    let readable = sanitize(&format!("{namespace}-{name}"));
    let full = format!("{PREFIX}-{readable}-{short_uid}");
    if full.len() <= MAX_LEN {
        return full;
    }
    let digest = format!("{:x}", Sha256::digest(format!("{namespace}/{name}/{uid}")));
    let room = MAX_LEN - (PREFIX.len() + 1) - (1 + HASH_CHARS) - (1 + short_uid.len());
    let head = readable[..room].trim_end_matches('-');
    format!("{PREFIX}-{head}-{}-{short_uid}", &digest[..HASH_CHARS])
}

/// What every sandbox name of executors in `namespace` (all namespaces: `None`) starts with.
/// A namespace prefix is not exclusive (namespace `a` also prefixes `a-b`'s names), and a long
/// namespace's hashed names may be cut before its end: a filter, never proof of ownership.
pub fn sandbox_name_prefix(namespace: Option<&str>) -> String {
    match namespace {
        None => format!("{PREFIX}-"),
        Some(namespace) => format!("{PREFIX}-{}-", sanitize(namespace)),
    }
}

/// Every character outside `[a-z0-9-]` becomes `-`, so the result is ASCII.
fn sanitize(raw: &str) -> String {
    raw.chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const UID: &str = "3f2a9c1e-7b4d-4e2a-9f1c-0a1b2c3d4e5f";

    #[test]
    fn short_names_stay_readable() {
        assert_eq!(sandbox_name("team-a", "py", UID), "bqe-team-a-py-3f2a9c1e");
    }

    #[test]
    fn names_start_with_their_scope_prefix() {
        let name = sandbox_name("Team.A", "py", UID);
        assert!(name.starts_with(&sandbox_name_prefix(None)));
        assert!(name.starts_with(&sandbox_name_prefix(Some("Team.A"))));
        assert_eq!(sandbox_name_prefix(Some("Team.A")), "bqe-team-a-");
        assert!(!name.starts_with(&sandbox_name_prefix(Some("team-b"))));
    }

    #[test]
    fn dots_and_case_are_mapped() {
        assert_eq!(
            sandbox_name("NS", "my.exec", UID),
            "bqe-ns-my-exec-3f2a9c1e"
        );
    }

    #[test]
    fn long_names_are_cut_and_hashed_apart() {
        let long = "x".repeat(200);
        let a = sandbox_name("ns", &format!("{long}a"), UID);
        let b = sandbox_name("ns", &format!("{long}b"), UID);
        assert_eq!(a.len(), MAX_LEN);
        assert_ne!(a, b);
        assert!(
            a.starts_with("bqe-ns-xxx") && a.ends_with("-3f2a9c1e"),
            "{a}"
        );
    }

    proptest! {
        #[test]
        fn deterministic_and_within_limits(ns in "\\PC{0,80}", name in "\\PC{0,260}", uid in "[0-9a-f-]{0,36}") {
            let first = sandbox_name(&ns, &name, &uid);
            prop_assert_eq!(&first, &sandbox_name(&ns, &name, &uid));
            prop_assert!(first.len() <= MAX_LEN);
            prop_assert!(first.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
        }
    }
}
