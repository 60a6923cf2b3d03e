//! What the bridge's `fork-save` and `fork-load` answer (PROTOCOL.md "Forks"): a source's
//! namespace saved and its kernel user's directory packed into parts inside its sandbox, and
//! those parts unpacked in a fork's sandbox with the kernel user's rights.

use serde::Deserialize;

use super::state::{StateReport, Unsaved};

/// The most one part of a snapshot holds: what briq moves in one file call (published: 1 MB).
pub const PART_BYTES: u64 = 1024 * 1024;
/// Where a source keeps its snapshots, relative to the bridge's directory.
pub const FORKS_DIR: &str = ".briq/forks";
/// The largest snapshot a source packs (its kernel user's directory, the namespace included).
pub const MAX_SNAPSHOT_BYTES: u64 = 64 * 1024 * 1024;

/// What `fork-save` or `fork-load` did.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ForkReport {
    pub ok: bool,
    #[serde(default)]
    pub message: String,
    /// `fork-save`: the snapshot's id (its directory under [`FORKS_DIR`]).
    #[serde(default)]
    pub snapshot: String,
    #[serde(default)]
    pub parts: u64,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub sha256: String,
    /// Files and directories packed (or unpacked).
    #[serde(default)]
    pub files: u64,
    /// Entries left out: FIFOs, sockets, devices.
    #[serde(default)]
    pub skipped: u64,
    /// `fork-save`: the namespace's save, as `save-state` reports it.
    #[serde(default)]
    pub saved: Vec<String>,
    #[serde(default)]
    pub unsaved: Vec<Unsaved>,
    #[serde(default)]
    pub state_bytes: u64,
    #[serde(default)]
    pub error: Option<ForkError>,
}

/// Why `fork-save` or `fork-load` did nothing.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ForkError {
    pub code: String,
    pub message: String,
}

impl ForkReport {
    /// The namespace's save as a state report, to be judged as a suspension's is.
    pub fn state(&self) -> StateReport {
        StateReport {
            ok: self.ok,
            saved: self.saved.clone(),
            unsaved: self.unsaved.clone(),
            bytes: self.state_bytes,
            message: self.message.clone(),
        }
    }

    /// Why the report cannot stand, if it cannot: the bridge said it failed, or it describes
    /// parts that do not add up to its size.
    pub fn failure(&self) -> Option<String> {
        if !self.ok {
            return Some(match &self.error {
                Some(error) => format!("{} ({})", error.message, error.code),
                None => self.message.clone(),
            });
        }
        if self.parts != self.size.div_ceil(PART_BYTES).max(1) {
            return Some(format!(
                "the bridge reported {} parts for {} bytes",
                self.parts, self.size
            ));
        }
        if self.sha256.len() != 64 || !self.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Some("the bridge reported no SHA-256 of the snapshot".into());
        }
        None
    }
}

/// The path of part `index` of `snapshot` in its source's sandbox, relative to the bridge's
/// directory.
pub fn part_path(snapshot: &str, index: u64) -> String {
    format!("{FORKS_DIR}/{snapshot}/part-{index:05}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(parts: u64, size: u64) -> ForkReport {
        ForkReport {
            ok: true,
            message: String::new(),
            snapshot: "ab".repeat(8),
            parts,
            size,
            sha256: "0".repeat(64),
            files: 1,
            skipped: 0,
            saved: vec!["x".into()],
            unsaved: vec![],
            state_bytes: 10,
            error: None,
        }
    }

    #[test]
    fn parts_must_add_up_to_the_size() {
        assert_eq!(report(1, 10).failure(), None);
        assert_eq!(report(1, PART_BYTES).failure(), None);
        assert_eq!(report(2, PART_BYTES + 1).failure(), None);
        assert!(report(1, PART_BYTES + 1).failure().is_some());
        assert!(report(3, PART_BYTES + 1).failure().is_some());
    }

    #[test]
    fn a_failed_save_says_why_with_its_code() {
        let failed = ForkReport {
            ok: false,
            error: Some(ForkError {
                code: "too_large".into(),
                message: "over 64 MiB".into(),
            }),
            ..report(0, 0)
        };
        assert_eq!(failed.failure().unwrap(), "over 64 MiB (too_large)");
    }

    #[test]
    fn part_paths_are_numbered_as_the_bridge_writes_them() {
        assert_eq!(part_path("abcd", 3), ".briq/forks/abcd/part-00003");
    }
}
