//! The `state` envelope of `save-state` and `restore-state` (PROTOCOL.md "Saving and restoring
//! the namespace"): which names of the kernel's namespace were saved (or restored) inside the
//! sandbox, and which were not, with why. The saved file itself never leaves the sandbox.

use serde::Deserialize;

/// At most this many names in each list (the bridge refuses a summary with more).
pub const MAX_NAMES: usize = 256;
/// A name is an identifier of at most this many characters.
const MAX_NAME_CHARS: usize = 256;
/// Why a name was not saved, at most this many characters.
const MAX_WHY_CHARS: usize = 200;

/// What `save-state` or `restore-state` did.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateReport {
    pub ok: bool,
    /// Names saved (or restored).
    pub saved: Vec<String>,
    /// Names left out (or that failed to restore), with why.
    pub unsaved: Vec<Unsaved>,
    /// The size of the saved file.
    pub bytes: u64,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unsaved {
    pub name: String,
    pub why: String,
}

/// Why a state envelope breaks the protocol, if it does: more names than the bridge sends, or
/// names that are not identifiers (they end up in status and events).
pub fn problem(report: &StateReport) -> Option<&'static str> {
    if report.saved.len() > MAX_NAMES || report.unsaved.len() > MAX_NAMES {
        return Some("a state envelope lists more names than the bridge sends");
    }
    let names = report
        .saved
        .iter()
        .chain(report.unsaved.iter().map(|u| &u.name));
    if !names.into_iter().all(|name| identifier(name)) {
        return Some("a state envelope names something that is not a Python identifier");
    }
    if report
        .unsaved
        .iter()
        .any(|u| u.why.chars().count() > MAX_WHY_CHARS)
    {
        return Some("a state envelope's reason is longer than the bridge sends");
    }
    None
}

/// A Python identifier as the bridge checks it (ASCII, or any letter; not starting with a
/// digit), at most [`MAX_NAME_CHARS`] characters.
fn identifier(name: &str) -> bool {
    let mut chars = name.chars();
    name.chars().count() <= MAX_NAME_CHARS
        && chars
            .next()
            .is_some_and(|first| first == '_' || first.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(saved: &[&str], unsaved: &[(&str, &str)]) -> StateReport {
        StateReport {
            ok: true,
            saved: saved.iter().map(|s| s.to_string()).collect(),
            unsaved: unsaved
                .iter()
                .map(|(name, why)| Unsaved {
                    name: name.to_string(),
                    why: why.to_string(),
                })
                .collect(),
            bytes: 10,
            message: String::new(),
        }
    }

    #[test]
    fn a_state_envelope_names_identifiers_within_the_bridges_limits() {
        assert_eq!(
            problem(&report(&["x", "_f", "np", "été"], &[("sock", "no")])),
            None
        );
        for bad in ["", "1x", "a b", "x\n", "<script>"] {
            assert!(problem(&report(&[bad], &[])).is_some(), "{bad:?}");
            assert!(problem(&report(&[], &[(bad, "why")])).is_some(), "{bad:?}");
        }
        let many: Vec<String> = (0..=MAX_NAMES).map(|i| format!("x{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(problem(&report(&many, &[])).is_some());
        let long_why = "w".repeat(MAX_WHY_CHARS + 1);
        assert!(problem(&report(&[], &[("x", &long_why)])).is_some());
    }
}
