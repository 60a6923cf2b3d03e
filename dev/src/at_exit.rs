//! Cleanup when the process exits normally, for what a static holds: a static is never dropped,
//! so without this the control plane the tests share per test binary (in a `OnceLock`) would
//! leave its directory, etcd's data included (over 100 MB), in the temp directory on every run
//! of every test binary. A control plane registers its directory and processes here; a dropped
//! one forgets them (its own `Drop` cleans up, and a pid may be reused afterwards).

use std::{
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard, Once},
};

struct Entry {
    dir: PathBuf,
    pids: Vec<u32>,
}

static ENTRIES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
static HOOK: Once = Once::new();

fn entries() -> MutexGuard<'static, Vec<Entry>> {
    ENTRIES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Removes `dir` when the process exits, after killing the processes [`kill_at_exit`] names
/// for it, unless [`forget`] is called first.
pub fn clean_at_exit(dir: &Path) {
    HOOK.call_once(|| {
        // SAFETY: `run` is an `extern "C" fn()` that does not unwind.
        unsafe {
            libc::atexit(run);
        }
    });
    entries().push(Entry {
        dir: dir.to_owned(),
        pids: Vec::new(),
    });
}

/// Kills `pid` (a child of this process) when the process exits, before `dir` is removed.
pub fn kill_at_exit(dir: &Path, pid: u32) {
    if let Some(entry) = entries().iter_mut().find(|entry| entry.dir == dir) {
        entry.pids.push(pid);
    }
}

/// `dir` was cleaned up already: nothing of it is touched at exit.
pub fn forget(dir: &Path) {
    entries().retain(|entry| entry.dir != dir);
}

extern "C" fn run() {
    let entries = std::mem::take(&mut *entries());
    for entry in entries {
        for pid in entry.pids {
            let Ok(pid) = libc::pid_t::try_from(pid) else {
                continue;
            };
            // SAFETY: plain system calls on our own child; a child that is gone already
            // makes them fail harmlessly.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
        let _ = std::fs::remove_dir_all(&entry.dir);
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    const CHILD: &str = "BRIQ_AT_EXIT_TEST_DIR";

    /// Run again as a child process of its own (the same test binary, this test only): there it
    /// registers a directory and a sleeping child process, and exits as a test binary does.
    #[test]
    fn a_static_control_planes_directory_and_processes_go_when_the_process_exits() {
        if let Some(dir) = std::env::var_os(CHILD) {
            let dir = PathBuf::from(dir);
            clean_at_exit(&dir);
            let sleeper = Command::new("sleep").arg("300").spawn().unwrap();
            std::fs::write(dir.with_extension("pid"), sleeper.id().to_string()).unwrap();
            kill_at_exit(&dir, sleeper.id());
            // Held as a static would hold it: never dropped.
            std::mem::forget(sleeper);
            return;
        }
        let dir = std::env::temp_dir().join(format!("briq-at-exit-{:016x}", rand::random::<u64>()));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("etcd-data"), "x").unwrap();
        let status = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "at_exit::tests::a_static_control_planes_directory_and_processes_go_when_the_process_exits",
                "--quiet",
            ])
            .env(CHILD, &dir)
            .status()
            .unwrap();
        assert!(status.success());
        assert!(!dir.exists(), "{} was left behind", dir.display());
        let pid_file = dir.with_extension("pid");
        let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().parse().unwrap();
        std::fs::remove_file(pid_file).unwrap();
        // SAFETY: signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        assert!(!alive, "the child process {pid} outlived its parent");
    }

    #[test]
    fn a_forgotten_directory_is_left_alone() {
        let dir = std::env::temp_dir().join(format!("briq-at-exit-{:016x}", rand::random::<u64>()));
        clean_at_exit(&dir);
        // No such process (above any pid_max), should the forgetting fail.
        kill_at_exit(&dir, 4_000_000);
        forget(&dir);
        assert!(entries().iter().all(|entry| entry.dir != dir));
    }
}
