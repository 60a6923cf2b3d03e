//! Whether the kernel of a sandbox can reach the sandbox root. A server running as root runs
//! sandboxes whose bridge runs the kernel as uid/gid 65534 (the bridge's `KERNEL_UID`), which
//! must be able to traverse every directory down to the sandbox root; a root under a private
//! directory (a `mkdtemp`, mode 0700) would let every executor fail 30 s after its sandbox was
//! created ("kernel did not answer … PermissionError"). The server refuses such a root at start.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// The user and group the bridge runs the kernel as when it runs as root.
pub const KERNEL_UID: u32 = 65534;
pub const KERNEL_GID: u32 = 65534;

/// A directory's owner and mode, as far as traversing it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// The first directory from `/` down to `root` (itself included) that the kernel's user cannot
/// traverse, judged by mode bits as the kernel would be; `stat` gives each directory's entry
/// (`None`: it does not exist yet, and is made by the server, traversable).
pub fn untraversable(
    root: &Path,
    stat: impl Fn(&Path) -> Option<Entry>,
) -> Option<(PathBuf, Entry)> {
    let mut directories: Vec<&Path> = root.ancestors().collect();
    directories.reverse();
    directories.into_iter().find_map(|directory| {
        let entry = stat(directory)?;
        let search = if entry.uid == KERNEL_UID {
            0o100
        } else if entry.gid == KERNEL_GID {
            0o010
        } else {
            0o001
        };
        (entry.mode & search == 0).then(|| (directory.to_path_buf(), entry))
    })
}

/// Whether this process runs as root, so that the bridges of its sandboxes run their kernels as
/// [`KERNEL_UID`].
pub fn splits_users() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Why the sandbox root `root` cannot serve sandboxes, if it cannot: only when the kernel runs
/// as a user of its own (`split_users`, see [`splits_users`]).
pub fn refusal(root: &Path, split_users: bool) -> Option<String> {
    if !split_users {
        return None;
    }
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let (directory, entry) = untraversable(&root, |path| {
        std::fs::metadata(path).ok().map(|m| Entry {
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
        })
    })?;
    Some(format!(
        "sandbox root {root}: the kernel's user (uid {KERNEL_UID}, as which the bridge runs the \
         kernel when the server runs as root) cannot enter {directory} (mode {mode:o}, uid {uid}), \
         so every executor would fail when its kernel starts; give other users search permission \
         (chmod o+x {directory}) or choose a root under a directory they can enter",
        root = root.display(),
        directory = directory.display(),
        mode = entry.mode,
        uid = entry.uid,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(mode: u32, uid: u32, gid: u32) -> Entry {
        Entry { mode, uid, gid }
    }

    #[test]
    fn the_first_directory_the_kernel_user_cannot_enter_is_named() {
        let layout = |private: Entry| {
            move |path: &Path| match path.to_str().unwrap() {
                "/" => Some(entry(0o755, 0, 0)),
                "/tmp" => Some(entry(0o1777, 0, 0)),
                "/tmp/t" => Some(private),
                "/tmp/t/root" => Some(entry(0o711, 0, 0)),
                _ => None,
            }
        };
        let root = Path::new("/tmp/t/root/sandboxes");
        // (the private directory's entry, what is refused)
        let table = [
            (entry(0o700, 0, 0), Some("/tmp/t")),
            (entry(0o711, 0, 0), None),
            (entry(0o701, 0, 0), None),
            (entry(0o700, KERNEL_UID, 0), None),
            (entry(0o600, KERNEL_UID, 0), Some("/tmp/t")),
            (entry(0o710, 0, KERNEL_GID), None),
            (entry(0o770, 0, 5), Some("/tmp/t")),
        ];
        for (private, refused) in table {
            let found = untraversable(root, layout(private));
            assert_eq!(
                found.as_ref().map(|(path, _)| path.to_str().unwrap()),
                refused,
                "{private:?}"
            );
        }
    }

    #[test]
    fn a_root_under_a_private_temporary_directory_is_refused_with_the_fix() {
        use std::os::unix::fs::PermissionsExt as _;
        let private = tempfile::tempdir().unwrap();
        std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let root = private.path().join("sandboxes");
        std::fs::create_dir(&root).unwrap();
        let refused = refusal(&root, true).expect("refused");
        let directory = std::fs::canonicalize(private.path()).unwrap();
        assert!(
            refused.contains(&format!("cannot enter {} (mode 700", directory.display())),
            "{refused}"
        );
        assert!(
            refused.contains(&format!("chmod o+x {}", directory.display())),
            "{refused}"
        );
        assert_eq!(
            refusal(&root, false),
            None,
            "a kernel running as the server's user enters it"
        );
        std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(refusal(&root, true), None);
    }
}
