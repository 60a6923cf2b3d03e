//! The server's sandboxes: records, directories and lifecycle.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use briq_operator::briq::ApiKey;
use briq_operator::briq::api::{CreateSandbox, ErrorCode, Sandbox, SandboxState};
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::async_exec::AsyncExecs;
use super::faults::Faults;
use super::http::{ApiError, random_token};
use super::mcp::declared::Declared;
use super::mcp::session::Sessions;
use super::process::{self, MARKER};
use super::simulated::{SimulatedSandbox, Simulator};

/// Used when the server itself has no PATH.
const FALLBACK_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

pub(crate) struct Shared {
    pub(crate) api_key: ApiKey,
    pub(crate) faults: Faults,
    /// The MCP sessions `initialize` gave out.
    pub(crate) sessions: Sessions,
    /// What `tools/list` declares, as the admin API changed it.
    pub(crate) declared: Declared,
    /// Answer every `tools/call` as an event stream rather than one JSON body.
    pub(crate) sse_answers: bool,
    /// Host for the legacy surface's preview URLs: where the server listens, so where sandbox
    /// ports are too.
    pub(crate) preview_host: IpAddr,
    root: PathBuf,
    /// PATH of sandbox processes: the venv's bin first, then the server's PATH.
    path: OsString,
    sandboxes: Mutex<BTreeMap<String, Arc<Entry>>>,
    /// Destroyed sandboxes as they were last, for `briq_list` with `all`.
    destroyed: Mutex<Vec<Sandbox>>,
    /// `Some` in simulated mode: no sandbox runs a process, the server answers for them.
    pub(crate) simulator: Option<Simulator>,
    /// Commands started with `briq_exec` async.
    pub(crate) execs: AsyncExecs,
}

pub(crate) struct Entry {
    sandbox: Mutex<Sandbox>,
    env: BTreeMap<String, String>,
    dir: PathBuf,
    /// Canonical `<root>/<id>/fs`: sandbox `/`.
    pub(crate) fs: PathBuf,
    destroyed: AtomicBool,
    /// The simulated kernel and journal (simulated mode only; empty otherwise).
    pub(crate) simulated: Arc<SimulatedSandbox>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveSandbox {
    pub id: String,
    pub name: String,
    pub state: SandboxState,
    /// Live processes carrying the sandbox's marker, detached ones included.
    pub processes: usize,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking handler must not take every later call down with it.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Entry {
    pub(crate) fn snapshot(&self) -> Sandbox {
        lock(&self.sandbox).clone()
    }

    /// Any use of a sleeping sandbox wakes it, as on briq; a stopped one answers no use until
    /// it is started, with an error saying so (published: exec on a stopped briq says why; 409
    /// on the legacy REST surface).
    pub(crate) fn wake(&self) -> Result<(), ApiError> {
        let mut sandbox = lock(&self.sandbox);
        match sandbox.state {
            SandboxState::Sleeping => sandbox.state = SandboxState::Running,
            SandboxState::Stopped => {
                return Err(ApiError::new(
                    axum::http::StatusCode::CONFLICT,
                    ErrorCode::InvalidRequest,
                    format!("sandbox {} is stopped: start it first", sandbox.id),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    pub(crate) fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::SeqCst)
    }

    /// The complete environment of a command: nothing leaks in from the server (its own
    /// BRIQ_API_KEY least of all), and the marker cannot be overridden.
    pub(crate) fn command_env(
        &self,
        shared: &Shared,
        request: &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        let id = lock(&self.sandbox).id.clone();
        let mut env = BTreeMap::from([
            (
                "PATH".to_owned(),
                shared.path.to_string_lossy().into_owned(),
            ),
            (
                "HOME".to_owned(),
                self.fs.join("root").display().to_string(),
            ),
            (
                "TMPDIR".to_owned(),
                self.fs.join("tmp").display().to_string(),
            ),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ]);
        env.extend(self.env.clone());
        env.extend(request.clone());
        env.insert(MARKER.to_owned(), id);
        env
    }
}

/// briq's sleep values: `<n>m`, `<n>h`, `<n>d` or `never`.
fn valid_sleep(sleep: &str) -> bool {
    sleep == "never"
        || sleep
            .strip_suffix(['m', 'h', 'd'])
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n > 0)
}

impl Shared {
    pub(crate) fn new(
        api_key: ApiKey,
        root: PathBuf,
        python_venv: Option<&Path>,
        preview_host: IpAddr,
        simulator: Option<Simulator>,
        sse_answers: bool,
    ) -> Self {
        let host_path = std::env::var_os("PATH").unwrap_or_else(|| FALLBACK_PATH.into());
        let mut dirs: Vec<PathBuf> = python_venv.map(|v| v.join("bin")).into_iter().collect();
        dirs.extend(std::env::split_paths(&host_path));
        Self {
            api_key,
            faults: Faults::default(),
            sessions: Sessions::default(),
            declared: Declared::default(),
            sse_answers,
            preview_host,
            root,
            path: std::env::join_paths(dirs).unwrap_or(host_path),
            sandboxes: Mutex::new(BTreeMap::new()),
            destroyed: Mutex::new(Vec::new()),
            simulator,
            execs: AsyncExecs::default(),
        }
    }

    /// Creates the sandbox, running at once. The answer says `running` when the caller `waited`
    /// for it (`briq_run`'s `wait`), else `creating`, as a create answered before the sandbox
    /// runs; every later look says `running`.
    pub(crate) async fn create(
        &self,
        request: CreateSandbox,
        waited: bool,
    ) -> Result<Sandbox, ApiError> {
        if request.name.is_empty() || request.image.is_empty() {
            return Err(ApiError::invalid("name and image are required"));
        }
        if !valid_sleep(&request.sleep) {
            return Err(ApiError::invalid(format!(
                "sleep {:?} is not <n>m, <n>h, <n>d or never",
                request.sleep
            )));
        }
        let id = format!("bq_{}", random_token(16));
        let dir = self.root.join(&id);
        let fs = dir.join("fs");
        // As in an image: `/root` is root's, `/tmp` is writable by every user (sticky), and the
        // directories down to `/` are traversable by the kernel's unprivileged user.
        for (sub, mode) in [("root", 0o700), ("tmp", 0o1777)] {
            let path = fs.join(sub);
            tokio::fs::create_dir_all(&path)
                .await
                .map_err(|e| ApiError::internal(format!("cannot create sandbox directory: {e}")))?;
            tokio::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .await
                .map_err(|e| ApiError::internal(format!("cannot set sandbox permissions: {e}")))?;
        }
        let fs = tokio::fs::canonicalize(&fs)
            .await
            .map_err(|e| ApiError::internal(format!("cannot resolve sandbox directory: {e}")))?;
        let sandbox = Sandbox {
            id: id.clone(),
            name: request.name,
            state: SandboxState::Running,
            image: request.image,
            size: request.size,
            sleep: request.sleep,
            created_at: Timestamp::now(),
        };
        let answer = Sandbox {
            state: if waited {
                SandboxState::Running
            } else {
                SandboxState::Creating
            },
            ..sandbox.clone()
        };
        let entry = Entry {
            sandbox: Mutex::new(sandbox),
            env: request.env,
            dir,
            fs,
            destroyed: AtomicBool::new(false),
            simulated: Arc::default(),
        };
        lock(&self.sandboxes).insert(id, Arc::new(entry));
        Ok(answer)
    }

    /// Forks sandbox `source` as briq does for a briq without a volume: a new sandbox with the
    /// source's image, size, environment and sleep (`sleep` when given), named `name` (else
    /// `<name>-fork`), its processes fresh and its disk new: what the source wrote stays with it.
    pub(crate) async fn fork(
        &self,
        source: &str,
        name: Option<String>,
        sleep: Option<String>,
        waited: bool,
    ) -> Result<Sandbox, ApiError> {
        let entry = self.entry(source)?;
        if entry.destroyed.load(Ordering::SeqCst) {
            return Err(ApiError::not_found(format!("no sandbox {source}")));
        }
        let of = lock(&entry.sandbox).clone();
        let request = CreateSandbox {
            name: name.unwrap_or_else(|| format!("{}-fork", of.name)),
            image: of.image,
            size: of.size,
            sleep: sleep.unwrap_or(of.sleep),
            env: entry.env.clone(),
        };
        self.create(request, waited).await
    }

    pub(crate) fn entry(&self, id: &str) -> Result<Arc<Entry>, ApiError> {
        lock(&self.sandboxes)
            .get(id)
            .cloned()
            .ok_or_else(|| ApiError::not_found(format!("no sandbox {id}")))
    }

    /// The sandboxes, oldest first; the destroyed ones too when asked.
    pub(crate) fn list(&self, with_destroyed: bool) -> Vec<Sandbox> {
        let mut sandboxes: Vec<Sandbox> = lock(&self.sandboxes)
            .values()
            .map(|entry| entry.snapshot())
            .collect();
        if with_destroyed {
            sandboxes.extend(lock(&self.destroyed).iter().cloned());
        }
        sandboxes.sort_by_key(|s| s.created_at);
        sandboxes
    }

    /// Kills everything the sandbox runs and removes its directory; from then on it is listed
    /// as destroyed only when asked, and every other call on it answers not found.
    pub(crate) async fn destroy(&self, id: &str) -> Result<(), ApiError> {
        let entry = lock(&self.sandboxes)
            .remove(id)
            .ok_or_else(|| ApiError::not_found(format!("no sandbox {id}")))?;
        // Set before the scan: an exec starting concurrently either sees it or is scanned.
        entry.destroyed.store(true, Ordering::SeqCst);
        let gone = {
            let mut sandbox = lock(&entry.sandbox);
            sandbox.state = SandboxState::Destroyed;
            sandbox.clone()
        };
        lock(&self.destroyed).push(gone);
        self.kill_what_runs(&entry, id).await;
        self.execs.forget_sandbox(id);
        match tokio::fs::remove_dir_all(&entry.dir).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ApiError::internal(format!(
                "cannot remove sandbox directory: {e}"
            ))),
        }
    }

    /// Sleep and restart: processes die, files stay.
    pub(crate) async fn kill_processes(
        &self,
        id: &str,
        state: SandboxState,
    ) -> Result<Sandbox, ApiError> {
        let entry = self.entry(id)?;
        self.kill_what_runs(&entry, id).await;
        let mut sandbox = lock(&entry.sandbox);
        sandbox.state = state;
        Ok(sandbox.clone())
    }

    /// Starts a stopped (or sleeping) sandbox: it runs again, its files as they were, no
    /// process of before. Starting a running sandbox changes nothing.
    pub(crate) fn start(&self, id: &str) -> Result<Sandbox, ApiError> {
        let entry = self.entry(id)?;
        let mut sandbox = lock(&entry.sandbox);
        sandbox.state = SandboxState::Running;
        Ok(sandbox.clone())
    }

    /// Kills the sandbox's processes, or its simulated kernel (a simulated sandbox has no
    /// processes: the scan of `/proc` is skipped, which matters at a thousand sandboxes).
    async fn kill_what_runs(&self, entry: &Entry, id: &str) {
        match self.simulator {
            Some(_) => entry.simulated.kill_kernel(),
            None => kill(HashSet::from([id.to_owned()])).await,
        }
    }

    pub(crate) async fn live(&self) -> Vec<LiveSandbox> {
        let processes = tokio::task::spawn_blocking(process::marked_processes)
            .await
            .unwrap_or_default();
        self.list(false)
            .into_iter()
            .map(|sandbox| LiveSandbox {
                processes: processes.iter().filter(|(_, id)| *id == sandbox.id).count(),
                id: sandbox.id,
                name: sandbox.name,
                state: sandbox.state,
            })
            .collect()
    }

    /// Destroys every sandbox: processes killed, directories removed. Blocking, so it can run
    /// from `Drop`.
    pub(crate) fn destroy_all_blocking(&self) {
        let entries: Vec<Arc<Entry>> = std::mem::take(&mut *lock(&self.sandboxes))
            .into_values()
            .collect();
        for entry in &entries {
            entry.destroyed.store(true, Ordering::SeqCst);
        }
        let ids = entries
            .iter()
            .map(|e| lock(&e.sandbox).id.clone())
            .collect();
        process::kill_sandboxes(&ids);
        for entry in entries {
            let _ = std::fs::remove_dir_all(&entry.dir);
        }
    }
}

async fn kill(ids: HashSet<String>) {
    let _ = tokio::task::spawn_blocking(move || process::kill_sandboxes(&ids)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleep_values() {
        for ok in ["30m", "3h", "7d", "never"] {
            assert!(valid_sleep(ok), "{ok}");
        }
        for bad in ["", "0m", "30", "m", "30s", "-1h", "1.5h"] {
            assert!(!valid_sleep(bad), "{bad}");
        }
    }
}
