//! Commands started with `briq_exec` `async`, as briq publishes them: the call answers at once
//! with an exec id; `briq_exec_result` reports where the command stands with the last 64 KB of
//! each stream, or, with an offset, the stream from that byte and the offset to pass next; and
//! `briq_exec_stop` stops it with every process it started. The whole output is kept in the
//! sandbox (`/.briq-exec/<id>/stdout` and `stderr`).
//!
//! The server copies the command's pipes into those files and announces every chunk on a watch
//! channel, so a read waiting for new output (or for the end) is woken by the copy itself, never
//! by a poll; its `waitMs` bounds the wait.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

use super::http::{ApiError, random_token};
use super::paths::resolve;
use super::process;
use briq_operator::briq::api::{
    DEFAULT_READ_BYTES, DEFAULT_WAIT_MS, ExecResult, ExecResultArgs, ExecState, ExecStopArgs,
    LOCAL_ROOT_ENV, MAX_OUTPUT_BYTES, MAX_READ_BYTES, MAX_WAIT_MS, Stream,
};

/// Set on every process of an async exec (inherited by its children, detached ones too): how
/// `briq_exec_stop` finds every process the command started.
pub(crate) const EXEC_MARKER: &str = "BRIQ_LOCAL_EXEC";

/// How long a stop waits for the command's end to be recorded before it answers.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A command to start in a sandbox (resolved by `sandbox_io::exec_async`).
pub(crate) struct Start {
    pub(crate) sandbox: String,
    /// The host directory that is the sandbox's `/`.
    pub(crate) fs: PathBuf,
    pub(crate) argv: Vec<String>,
    /// Complete: nothing is inherited from the server.
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) stdin: Option<String>,
}

/// The async execs of every sandbox, by exec id.
#[derive(Default)]
pub(crate) struct AsyncExecs {
    by_id: Mutex<HashMap<String, Arc<AsyncExec>>>,
}

struct AsyncExec {
    id: String,
    sandbox: String,
    /// Host paths of the output files.
    stdout: PathBuf,
    stderr: PathBuf,
    /// Bytes written to each file so far, and how the command ended.
    progress: watch::Sender<Progress>,
    stop_requested: AtomicBool,
    group: Option<i32>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    stdout: u64,
    stderr: u64,
    ended: Option<Ended>,
}

#[derive(Debug, Clone, Copy)]
enum Ended {
    Exited(i32),
    Stopped,
    /// Killed by something else (the sandbox stopped, slept or was destroyed).
    Lost,
}

fn sandbox_path(id: &str, stream: Stream) -> String {
    let name = match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    };
    format!("/.briq-exec/{id}/{name}")
}

impl AsyncExecs {
    fn get(&self, sandbox: &str, id: &str) -> Result<Arc<AsyncExec>, ApiError> {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .filter(|exec| exec.sandbox == sandbox)
            .cloned()
            .ok_or_else(|| ApiError::not_found(format!("no exec {id} in sandbox {sandbox}")))
    }

    /// Starts `start`; its exec id. `still_wanted` is asked once the command runs: a sandbox
    /// destroyed in between has been scanned for processes already, so this one is killed here.
    pub(crate) async fn start(
        &self,
        start: Start,
        still_wanted: impl FnOnce() -> bool,
    ) -> Result<String, ApiError> {
        let Start {
            sandbox,
            fs,
            argv,
            mut env,
            stdin,
        } = start;
        if argv.is_empty() {
            return Err(ApiError::invalid("the command is empty"));
        }
        let id = format!("ex_{}", random_token(16));
        let dir = resolve(&fs, &format!("/.briq-exec/{id}"))
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| ApiError::invalid(format!("cannot make the exec's directory: {e}")))?;
        env.insert(LOCAL_ROOT_ENV.to_owned(), fs.display().to_string());
        env.insert(EXEC_MARKER.to_owned(), id.clone());
        let mut child = process::spawn(&argv, &fs, &env, stdin.is_some())
            .map_err(|e| ApiError::invalid(format!("{}: {e}", argv[0])))?;
        if !still_wanted() {
            let id = id.clone();
            tokio::task::spawn_blocking(move || process::kill_marked(EXEC_MARKER, &id));
            return Err(ApiError::not_found(format!("no sandbox {sandbox}")));
        }
        if let (Some(mut pipe), Some(input)) = (child.stdin.take(), stdin) {
            tokio::spawn(async move {
                let _ = pipe.write_all(input.as_bytes()).await;
            });
        }
        let exec = Arc::new(AsyncExec {
            id: id.clone(),
            sandbox,
            stdout: dir.join("stdout"),
            stderr: dir.join("stderr"),
            progress: watch::Sender::new(Progress::default()),
            stop_requested: AtomicBool::new(false),
            group: child.id().and_then(|pid| i32::try_from(pid).ok()),
        });
        let copies = (
            copy(child.stdout.take(), exec.clone(), Stream::Stdout),
            copy(child.stderr.take(), exec.clone(), Stream::Stderr),
        );
        let waiting = exec.clone();
        tokio::spawn(async move {
            let (_, _, status) = tokio::join!(copies.0, copies.1, child.wait());
            let ended = match status.ok().and_then(|s| s.code()) {
                Some(code) => Ended::Exited(code),
                None if waiting.stop_requested.load(Ordering::SeqCst) => Ended::Stopped,
                None => Ended::Lost,
            };
            waiting.progress.send_modify(|p| p.ended = Some(ended));
        });
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), exec);
        Ok(id)
    }

    /// Forgets the execs of a destroyed sandbox (their processes went with it).
    pub(crate) fn forget_sandbox(&self, sandbox: &str) {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, exec| exec.sandbox != sandbox);
    }

    /// `briq_exec_result`: waits up to `waitMs` for the end (or, with `offset`, for output past
    /// it), then answers.
    pub(crate) async fn result(&self, args: ExecResultArgs) -> Result<ExecResult, ApiError> {
        let exec = self.get(&args.briq, &args.exec)?;
        let wait = Duration::from_millis(args.wait_ms.unwrap_or(DEFAULT_WAIT_MS).min(MAX_WAIT_MS));
        let mut progress = exec.progress.subscribe();
        let Some(offset) = args.offset else {
            let _ = tokio::time::timeout(wait, progress.wait_for(|p| p.ended.is_some())).await;
            return exec.answer().await;
        };
        let stream = args.stream;
        let written = move |p: &Progress| match stream {
            Stream::Stdout => p.stdout,
            Stream::Stderr => p.stderr,
        };
        let _ = tokio::time::timeout(
            wait,
            progress.wait_for(|p| written(p) > offset || p.ended.is_some()),
        )
        .await;
        let most = args
            .max_bytes
            .unwrap_or(DEFAULT_READ_BYTES)
            .min(MAX_READ_BYTES);
        let path = match stream {
            Stream::Stdout => &exec.stdout,
            Stream::Stderr => &exec.stderr,
        };
        // The state read with the bytes available, so a read that says `exited` holds the end.
        let progress = *exec.progress.borrow();
        let (output, next) = read_from(path, offset, most, written(&progress)).await?;
        let mut answer = exec.standing(progress);
        answer.output = Some(output);
        answer.next_offset = Some(next);
        Ok(answer)
    }

    /// `briq_exec_stop`: kills the command and every process it started, then answers as
    /// `briq_exec_result` does, without waiting.
    pub(crate) async fn stop(&self, args: ExecStopArgs) -> Result<ExecResult, ApiError> {
        let exec = self.get(&args.briq, &args.exec)?;
        let mut progress = exec.progress.subscribe();
        if progress.borrow().ended.is_none() {
            exec.stop_requested.store(true, Ordering::SeqCst);
            let (group, id) = (exec.group, exec.id.clone());
            tokio::task::spawn_blocking(move || {
                if let Some(group) = group {
                    // SAFETY: killpg only sends a signal; the group is this exec's.
                    unsafe {
                        libc::killpg(group, libc::SIGKILL);
                    }
                }
                process::kill_marked(EXEC_MARKER, &id);
            })
            .await
            .map_err(|e| ApiError::invalid(format!("stopping exec {}: {e}", exec.id)))?;
            let _ =
                tokio::time::timeout(STOP_GRACE, progress.wait_for(|p| p.ended.is_some())).await;
        }
        exec.answer().await
    }
}

impl AsyncExec {
    /// Where it stands, with the last [`MAX_OUTPUT_BYTES`] of each stream.
    async fn answer(&self) -> Result<ExecResult, ApiError> {
        let progress = *self.progress.borrow();
        let mut answer = self.standing(progress);
        answer.stdout = Some(tail(&self.stdout, progress.stdout).await?);
        answer.stderr = Some(tail(&self.stderr, progress.stderr).await?);
        Ok(answer)
    }

    /// Where it stands at `progress`, without output.
    fn standing(&self, progress: Progress) -> ExecResult {
        let (state, exit_code) = match progress.ended {
            None => (ExecState::Running, None),
            Some(Ended::Exited(code)) => (ExecState::Exited, Some(code)),
            Some(Ended::Stopped) => (ExecState::Stopped, None),
            Some(Ended::Lost) => (ExecState::Lost, None),
        };
        ExecResult {
            exec: self.id.clone(),
            state,
            exit_code,
            stdout: None,
            stderr: None,
            output: None,
            next_offset: None,
            stdout_path: sandbox_path(&self.id, Stream::Stdout),
            stderr_path: sandbox_path(&self.id, Stream::Stderr),
        }
    }
}

/// Copies `pipe` into the exec's file for `stream`, announcing each chunk once it is written.
async fn copy(pipe: Option<impl AsyncRead + Unpin>, exec: Arc<AsyncExec>, stream: Stream) {
    let Some(mut pipe) = pipe else {
        return;
    };
    let path = match stream {
        Stream::Stdout => &exec.stdout,
        Stream::Stderr => &exec.stderr,
    };
    let Ok(mut file) = tokio::fs::File::create(path).await else {
        return;
    };
    let mut chunk = vec![0; 16 * 1024];
    while let Ok(n @ 1..) = pipe.read(&mut chunk).await {
        if file.write_all(&chunk[..n]).await.is_err() || file.flush().await.is_err() {
            return;
        }
        exec.progress.send_modify(|p| match stream {
            Stream::Stdout => p.stdout += n as u64,
            Stream::Stderr => p.stderr += n as u64,
        });
    }
}

/// The last [`MAX_OUTPUT_BYTES`] of the first `written` bytes of `path`, as text.
async fn tail(path: &Path, written: u64) -> Result<String, ApiError> {
    let start = written.saturating_sub(MAX_OUTPUT_BYTES as u64);
    let (text, _) = read_from(path, start, written - start, written).await?;
    Ok(text)
}

/// Up to `most` bytes of `path` from `offset`, within its first `available`, cut to whole UTF-8
/// characters (unless that leaves nothing: a character longer than `most`); and the offset to
/// read from next.
async fn read_from(
    path: &Path,
    offset: u64,
    most: u64,
    available: u64,
) -> Result<(String, u64), ApiError> {
    let end = available.min(offset.saturating_add(most));
    if end <= offset {
        return Ok((String::new(), offset));
    }
    let mut file = match tokio::fs::File::open(path).await {
        Ok(file) => file,
        Err(_) => return Ok((String::new(), offset)),
    };
    use tokio::io::AsyncSeekExt as _;
    file.seek(std::io::SeekFrom::Start(offset))
        .await
        .map_err(|e| ApiError::invalid(format!("reading the exec's output: {e}")))?;
    let mut bytes = vec![0; (end - offset) as usize];
    file.read_exact(&mut bytes)
        .await
        .map_err(|e| ApiError::invalid(format!("reading the exec's output: {e}")))?;
    let whole = match std::str::from_utf8(&bytes) {
        Ok(_) => bytes.len(),
        Err(error) if error.error_len().is_none() && error.valid_up_to() > 0 => error.valid_up_to(),
        Err(_) => bytes.len(),
    };
    bytes.truncate(whole);
    let next = offset + whole as u64;
    Ok((String::from_utf8_lossy(&bytes).into_owned(), next))
}
