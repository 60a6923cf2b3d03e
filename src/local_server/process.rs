//! Sandbox processes: running a command, and finding and killing everything a sandbox started.
//!
//! Every process gets the environment variable [`MARKER`]`=<sandbox id>`, which its children
//! inherit. Processes that detach (setsid, double fork) leave the exec's process group but keep
//! the variable, so scanning `/proc/*/environ` finds them: that is how sleep, restart and destroy
//! reach a background Jupyter kernel. A process that clears its environment escapes this; the
//! local server is no isolation boundary.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::Command;

use crate::briq::api::{ExecOutput, MAX_OUTPUT_BYTES};

pub(crate) const MARKER: &str = "BRIQ_LOCAL_SANDBOX";

/// After the command exits, how long its output pipes may stay open (held by a background
/// child) before the answer goes out with what was read so far. Generous: on a loaded machine
/// the readers may not run for a while after the exit, and output the command wrote before it
/// exited must not be lost (100 ms lost whole envelopes with 100 sandboxes busy).
const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// Kill rounds before giving up on processes that keep forking.
const KILL_ROUNDS: usize = 50;
const KILL_PAUSE: Duration = Duration::from_millis(10);

/// A command ready to run; `env` is complete (nothing is inherited from the server).
pub(crate) struct CommandSpec {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub env: BTreeMap<String, String>,
    pub stdin: Option<String>,
    pub timeout: Duration,
}

/// Runs `command` in its own process group. At the timeout the whole group is killed; children
/// that left the group keep running. `still_wanted` is asked right after the command has been
/// exec'd (when its marker is visible in `/proc`): a sandbox destroyed in between has already
/// been scanned for processes, so this one is killed here instead.
pub(crate) async fn run(command: CommandSpec, still_wanted: impl FnOnce() -> bool) -> ExecOutput {
    let Some((program, args)) = command.argv.split_first() else {
        return failed(126, "empty argv");
    };
    let mut child = match Command::new(program)
        .args(args)
        .current_dir(&command.cwd)
        .env_clear()
        .envs(&command.env)
        .process_group(0)
        .stdin(if command.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            // What a shell would answer, so callers see the usual codes.
            let code = if e.kind() == io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return failed(code, &format!("{program}: {e}"));
        }
    };
    let group = child.id().and_then(|id| i32::try_from(id).ok());
    if let Some(group) = group
        && !still_wanted()
    {
        kill_group(group);
    }
    let mut stdout = Tail::spawn(child.stdout.take());
    let mut stderr = Tail::spawn(child.stderr.take());
    if let (Some(mut pipe), Some(input)) = (child.stdin.take(), command.stdin) {
        // Separate task: a command that never reads its stdin must not stall the exec.
        tokio::spawn(async move {
            let _ = pipe.write_all(input.as_bytes()).await;
        });
    }
    let (exit_code, timed_out) = match tokio::time::timeout(command.timeout, child.wait()).await {
        Ok(status) => (status.ok().and_then(|s| s.code()), false),
        Err(_) => {
            if let Some(group) = group {
                kill_group(group);
            }
            let _ = child.wait().await;
            (None, true)
        }
    };
    let _ = tokio::time::timeout(DRAIN_GRACE, async {
        stdout.finished().await;
        stderr.finished().await;
    })
    .await;
    ExecOutput {
        exit_code,
        stdout: stdout.take(),
        stderr: stderr.take(),
        timed_out,
    }
}

fn failed(code: i32, message: &str) -> ExecOutput {
    ExecOutput {
        exit_code: Some(code),
        stdout: String::new(),
        stderr: format!("exec: {message}\n"),
        timed_out: false,
    }
}

fn kill_group(group: i32) {
    // SAFETY: killpg only sends a signal; the group is ours (its leader is not reaped yet).
    unsafe {
        libc::killpg(group, libc::SIGKILL);
    }
}

/// The last [`MAX_OUTPUT_BYTES`] of one output stream, read by a background task.
struct Tail {
    bytes: Arc<Mutex<VecDeque<u8>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Tail {
    fn spawn(pipe: Option<impl AsyncRead + Unpin + Send + 'static>) -> Self {
        let bytes = Arc::new(Mutex::new(VecDeque::new()));
        let sink = Arc::clone(&bytes);
        let reader = tokio::spawn(async move {
            let Some(mut pipe) = pipe else { return };
            let mut chunk = vec![0; 16 * 1024];
            while let Ok(n @ 1..) = pipe.read(&mut chunk).await {
                let mut tail = sink.lock().unwrap_or_else(|p| p.into_inner());
                tail.extend(&chunk[..n]);
                let excess = tail.len().saturating_sub(MAX_OUTPUT_BYTES);
                tail.drain(..excess);
            }
        });
        Self { bytes, reader }
    }

    /// Waits for end of file on the pipe (every holder closed it).
    async fn finished(&mut self) {
        let _ = (&mut self.reader).await;
    }

    fn take(self) -> String {
        // Dropping the read end: a background child still writing gets EPIPE, as it would when
        // briq's exec ends.
        self.reader.abort();
        let tail = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        let bytes: Vec<u8> = tail.iter().copied().collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Live processes carrying the marker, as (pid, sandbox id). Blocking: reads `/proc`.
/// Zombies are not listed: their environment reads empty.
pub(crate) fn marked_processes() -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let prefix = format!("{MARKER}=");
    entries
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let id = environ
                .split(|b| *b == 0)
                .find_map(|var| var.strip_prefix(prefix.as_bytes()))?;
            Some((pid, String::from_utf8_lossy(id).into_owned()))
        })
        .collect()
}

/// SIGKILLs every process of the given sandboxes until none is left. Blocking.
pub(crate) fn kill_sandboxes(ids: &HashSet<String>) {
    if ids.is_empty() {
        return;
    }
    for _ in 0..KILL_ROUNDS {
        let victims: Vec<i32> = marked_processes()
            .into_iter()
            .filter(|(_, id)| ids.contains(id))
            .map(|(pid, _)| pid)
            .collect();
        if victims.is_empty() {
            return;
        }
        for pid in victims {
            // SAFETY: kill only sends a signal; the pid carries one of our sandbox markers.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(KILL_PAUSE);
    }
    tracing::warn!(?ids, "sandbox processes survived {KILL_ROUNDS} kill rounds");
}
