//! Sandbox processes: running a command, and finding and killing everything a sandbox started.
//!
//! Every process gets the environment variable [`MARKER`]`=<sandbox id>`, which its children
//! inherit. Processes that detach (setsid, double fork) leave the exec's process group but keep
//! the variable, so scanning `/proc/*/environ` finds them: that is how sleep, restart and destroy
//! reach a background Jupyter kernel. A process that clears its environment escapes this; the
//! local server is no isolation boundary.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};

use briq_operator::briq::api::{ExecOutput, MAX_OUTPUT_BYTES};

pub(crate) const MARKER: &str = "BRIQ_LOCAL_SANDBOX";

/// After the command exits, how long its output pipes may stay open (held by a background
/// child) before the answer goes out with what was read so far.
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
    let Some(program) = command.argv.first() else {
        return failed(126, "empty argv");
    };
    let mut child = match spawn(
        &command.argv,
        &command.cwd,
        &command.env,
        command.stdin.is_some(),
    ) {
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
    let mut stdout = Tail::new(child.stdout.take());
    let mut stderr = Tail::new(child.stderr.take());
    if let (Some(mut pipe), Some(input)) = (child.stdin.take(), command.stdin) {
        // Separate task: a command that never reads its stdin must not stall the exec.
        tokio::spawn(async move {
            let _ = pipe.write_all(input.as_bytes()).await;
        });
    }
    // The pipes are read in this task, not in tasks of their own: whenever it runs, what the
    // command wrote is read before any deadline is looked at, however late a busy runtime
    // gets to it.
    let (exit_code, timed_out) = {
        let reading = async { tokio::join!(stdout.read_to_end(), stderr.read_to_end()) };
        let mut reading = std::pin::pin!(reading);
        let mut read_all = false;
        let waited = tokio::time::timeout(command.timeout, async {
            loop {
                tokio::select! {
                    biased;
                    _ = &mut reading, if !read_all => read_all = true,
                    status = child.wait() => return status,
                }
            }
        })
        .await;
        let ended = match waited {
            Ok(status) => (status.ok().and_then(|s| s.code()), false),
            Err(_) => {
                if let Some(group) = group {
                    kill_group(group);
                }
                let _ = child.wait().await;
                (None, true)
            }
        };
        if !read_all {
            let _ = tokio::time::timeout(DRAIN_GRACE, reading).await;
        }
        ended
    };
    ExecOutput {
        exit_code,
        stdout: stdout.take(),
        stderr: stderr.take(),
        timed_out,
    }
}

/// Starts `argv` in its own process group, in `cwd`, with exactly `env`, its output piped (and
/// its input, when `stdin` is given; else none).
pub(crate) fn spawn(
    argv: &[String],
    cwd: &Path,
    env: &BTreeMap<String, String>,
    stdin: bool,
) -> io::Result<Child> {
    let Some((program, args)) = argv.split_first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty argv"));
    };
    Command::new(program)
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(env)
        .process_group(0)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
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

/// The last [`MAX_OUTPUT_BYTES`] of one output stream. Dropping it closes the read end: a
/// background child still writing gets EPIPE, as it would when briq's exec ends.
struct Tail<P> {
    pipe: Option<P>,
    bytes: VecDeque<u8>,
}

impl<P: AsyncRead + Unpin> Tail<P> {
    fn new(pipe: Option<P>) -> Self {
        Tail {
            pipe,
            bytes: VecDeque::new(),
        }
    }

    /// Reads until end of file (every holder closed the pipe).
    async fn read_to_end(&mut self) {
        let Some(pipe) = self.pipe.as_mut() else {
            return;
        };
        let mut chunk = vec![0; 16 * 1024];
        while let Ok(n @ 1..) = pipe.read(&mut chunk).await {
            self.bytes.extend(&chunk[..n]);
            let excess = self.bytes.len().saturating_sub(MAX_OUTPUT_BYTES);
            self.bytes.drain(..excess);
        }
    }

    fn take(self) -> String {
        let bytes: Vec<u8> = self.bytes.into_iter().collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Live processes carrying the marker, as (pid, sandbox id). Blocking: reads `/proc`.
/// Zombies are not listed: their environment reads empty.
pub(crate) fn marked_processes() -> Vec<(i32, String)> {
    processes_marked(MARKER)
}

/// Live processes whose environment sets `var`, as (pid, its value). Blocking: reads `/proc`.
pub(crate) fn processes_marked(var: &str) -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let prefix = format!("{var}=");
    entries
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let value = environ
                .split(|b| *b == 0)
                .find_map(|setting| setting.strip_prefix(prefix.as_bytes()))?;
            Some((pid, String::from_utf8_lossy(value).into_owned()))
        })
        .collect()
}

/// SIGKILLs every process of the given sandboxes until none is left. Blocking.
pub(crate) fn kill_sandboxes(ids: &HashSet<String>) {
    if ids.is_empty() {
        return;
    }
    kill_where(MARKER, |id| ids.contains(id));
}

/// SIGKILLs every process whose environment sets `var` to `value` until none is left. Blocking.
pub(crate) fn kill_marked(var: &str, value: &str) {
    kill_where(var, |found| found == value);
}

fn kill_where(var: &str, wanted: impl Fn(&str) -> bool) {
    for _ in 0..KILL_ROUNDS {
        let victims: Vec<i32> = processes_marked(var)
            .into_iter()
            .filter(|(_, value)| wanted(value))
            .map(|(pid, _)| pid)
            .collect();
        if victims.is_empty() {
            return;
        }
        for pid in victims {
            // SAFETY: kill only sends a signal; the pid carries one of our markers.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(KILL_PAUSE);
    }
    tracing::warn!(var, "marked processes survived {KILL_ROUNDS} kill rounds");
}
