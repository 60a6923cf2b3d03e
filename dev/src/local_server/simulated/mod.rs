//! Simulated sandboxes (`--simulate`), the way KWOK simulates nodes: no process runs, the server
//! answers the bridge's commands itself, so a benchmark can drive a thousand executors on a
//! laptop. A benchmark harness only: never a default, never used by behaviour tests, which
//! need real kernels.
//!
//! What a simulated sandbox does per bridge command (see [`command::parse`]):
//! - `setup` answers ok after [`Simulation::setup`]; with `--self-install` it first renames the
//!   staged script to `.briq/bridge.py`, as the bridge does.
//! - `start-kernel` "starts" a kernel after [`Simulation::kernel_start`] (a made-up pid) unless
//!   one is alive; `probe` reports it. Sleep, restart and destroy kill it.
//! - `run` takes the code from stdin, waits as long as its `# sleep-ms: N` comment says (none by
//!   default; past `--timeout` it answers `timeout`) and answers `ok` with the code's last line
//!   as output, or `kernel_lost` without a kernel. An attempt runs at most once per sandbox: a
//!   second delivery gets the first one's result, waiting while it runs; `recall` does the same,
//!   or answers `not_accepted`.
//! - Anything else exits 127. A script that is not there exits 2, as Python would.
//!
//! Files are still kept on disk (an operator uploads the ~130 KB bridge per provisioning, and the
//! self-install rename keeps one copy per sandbox), so file puts and gets work unchanged.

mod command;
mod envelope;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::watch;

use briq_operator::briq::api::ExecOutput;
use command::{BridgeCall, Invocation};

/// Where the bridge installs itself, relative to the working directory.
const INSTALLED_BRIDGE: &str = ".briq/bridge.py";
/// Made-up kernel pids count up from here, so that no two kernels of a server share one.
const FIRST_PID: u32 = 100_000;

/// How long the simulated provisioning steps take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Simulation {
    pub setup: Duration,
    pub kernel_start: Duration,
}

impl Default for Simulation {
    fn default() -> Self {
        Self {
            setup: Duration::from_millis(50),
            kernel_start: Duration::from_millis(20),
        }
    }
}

/// The server's simulation: its timings and the pids it handed out.
pub(crate) struct Simulator {
    timings: Simulation,
    next_pid: AtomicU32,
}

/// A simulated sandbox's state: its kernel, and the journal of attempts it accepted.
#[derive(Default)]
pub(crate) struct SimulatedSandbox {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    kernel: Option<u32>,
    /// Every accepted attempt; its result once it has one (kept for the sandbox's life, as the
    /// bridge's journal is).
    attempts: HashMap<String, watch::Receiver<Option<Value>>>,
}

impl SimulatedSandbox {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sleep, restart and destroy kill every process, the kernel included.
    pub(crate) fn kill_kernel(&self) {
        self.lock().kernel = None;
    }
}

/// How a run delivery relates to the journal.
enum Delivery {
    /// The first delivery: it runs the code and publishes the result.
    First(watch::Sender<Option<Value>>),
    /// Already accepted: the first delivery's result, once there is one.
    Again(watch::Receiver<Option<Value>>),
}

impl Simulator {
    pub(crate) fn new(timings: Simulation) -> Self {
        Self {
            timings,
            next_pid: AtomicU32::new(FIRST_PID),
        }
    }

    /// Answers one exec in `sandbox`, whose working directory is `cwd` (on the host), within
    /// `timeout` (past it the answer is `timed_out`, as for a real command).
    pub(crate) async fn exec(
        &self,
        sandbox: &Arc<SimulatedSandbox>,
        cwd: &Path,
        argv: &[String],
        nonce: Option<&str>,
        stdin: Option<&str>,
        timeout: Duration,
    ) -> ExecOutput {
        let invocation = match command::parse(argv) {
            Ok(invocation) => invocation,
            Err(why) => {
                return exited(
                    127,
                    format!("simulated sandbox: {why}: it answers bridge commands only\n"),
                );
            }
        };
        if let Some(script) = invocation.script
            && !(command::is_inside(script) && is_file(&cwd.join(script)).await)
        {
            return exited(
                2,
                format!(
                    "python3: can't open file {script:?}: [Errno 2] No such file or directory\n"
                ),
            );
        }
        let Some(nonce) = nonce.filter(|n| valid_nonce(n)) else {
            return exited(
                2,
                "bridge error: BRIQ_NONCE must hold [A-Za-z0-9]{16,64}\n".to_owned(),
            );
        };
        let answering = self.answer(sandbox, cwd, invocation, stdin.unwrap_or_default());
        match tokio::time::timeout(timeout, answering).await {
            Ok(Ok(envelope)) => ExecOutput {
                exit_code: Some(0),
                stdout: envelope::frame(nonce, &envelope),
                stderr: String::new(),
                timed_out: false,
            },
            Ok(Err(message)) => exited(1, format!("bridge error: {message}\n")),
            Err(_) => ExecOutput {
                exit_code: None,
                stdout: String::new(),
                stderr: String::new(),
                timed_out: true,
            },
        }
    }

    /// The envelope of one bridge command; an error is the bridge's "no envelope" case.
    async fn answer(
        &self,
        sandbox: &Arc<SimulatedSandbox>,
        cwd: &Path,
        invocation: Invocation<'_>,
        code: &str,
    ) -> Result<Value, String> {
        match invocation.call {
            BridgeCall::Setup { self_install } => {
                if let (true, Some(script)) = (self_install, invocation.script) {
                    tokio::fs::rename(cwd.join(script), cwd.join(INSTALLED_BRIDGE))
                        .await
                        .map_err(|e| format!("cannot install {script}: {e}"))?;
                }
                tokio::time::sleep(self.timings.setup).await;
                Ok(envelope::setup("simulated: nothing to install"))
            }
            BridgeCall::StartKernel => Ok(self.start_kernel(sandbox).await),
            BridgeCall::Probe => Ok(match sandbox.lock().kernel {
                Some(pid) => envelope::kernel(Some(pid), false, "kernel is answering"),
                None => envelope::kernel(None, false, "no kernel state in .briq/state"),
            }),
            BridgeCall::Run { attempt, timeout } => match attempt {
                None => Ok(run(sandbox, code, timeout).await),
                Some(attempt) => {
                    let recorded = match deliver(sandbox, &attempt) {
                        Delivery::First(publish) => {
                            // In a task of its own, as the bridge's runner: the result is
                            // journaled even when this exec is abandoned (its timeout).
                            let (sandbox, code) = (Arc::clone(sandbox), code.to_owned());
                            let recorded = publish.subscribe();
                            tokio::spawn(async move {
                                let result = run(&sandbox, &code, timeout).await;
                                publish.send_replace(Some(result));
                            });
                            recorded
                        }
                        Delivery::Again(recorded) => recorded,
                    };
                    recorded_result(recorded, &attempt).await
                }
            },
            BridgeCall::Recall { attempt } => {
                let recorded = sandbox.lock().attempts.get(&attempt).cloned();
                match recorded {
                    None => Ok(envelope::result("not_accepted", None, None, 0)),
                    Some(recorded) => recorded_result(recorded, &attempt).await,
                }
            }
        }
    }

    async fn start_kernel(&self, sandbox: &SimulatedSandbox) -> Value {
        if let Some(pid) = sandbox.lock().kernel {
            return envelope::kernel(Some(pid), false, "kernel is answering");
        }
        tokio::time::sleep(self.timings.kernel_start).await;
        let mut inner = sandbox.lock();
        // Two concurrent start-kernels start one kernel, as the bridge's lock ensures.
        if let Some(pid) = inner.kernel {
            return envelope::kernel(Some(pid), false, "kernel is answering");
        }
        let pid = self.next_pid.fetch_add(1, Ordering::Relaxed);
        inner.kernel = Some(pid);
        envelope::kernel(Some(pid), true, "simulated kernel started")
    }
}

/// Accepts `attempt` unless it was accepted before.
fn deliver(sandbox: &SimulatedSandbox, attempt: &str) -> Delivery {
    let mut inner = sandbox.lock();
    if let Some(recorded) = inner.attempts.get(attempt) {
        return Delivery::Again(recorded.clone());
    }
    let (publish, recorded) = watch::channel(None);
    inner.attempts.insert(attempt.to_owned(), recorded);
    Delivery::First(publish)
}

/// The result of an accepted attempt, waited for while it runs.
async fn recorded_result(
    mut recorded: watch::Receiver<Option<Value>>,
    attempt: &str,
) -> Result<Value, String> {
    match recorded.wait_for(Option::is_some).await {
        Ok(result) => Ok(result.clone().unwrap_or_default()),
        // The first delivery ended without a result (it cannot, short of a panic).
        Err(_) => Err(format!(
            "attempt {attempt} was accepted and has no result; the code may or may not have run"
        )),
    }
}

/// Runs `code` in the sandbox's simulated kernel: it takes its `# sleep-ms`, cut at `timeout`.
async fn run(sandbox: &SimulatedSandbox, code: &str, timeout: Duration) -> Value {
    let Some(pid) = sandbox.lock().kernel else {
        let lost = (
            "KernelLost",
            "no live kernel in .briq/state (run start-kernel)",
        );
        return envelope::result("kernel_lost", None, Some(lost), 0);
    };
    let started = Instant::now();
    let wanted = command::sleep_of(code);
    tokio::time::sleep(wanted.min(timeout)).await;
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    if sandbox.lock().kernel != Some(pid) {
        let message = format!("kernel process {pid} died during execution");
        return envelope::result(
            "kernel_lost",
            None,
            Some(("KernelLost", &message)),
            duration_ms,
        );
    }
    if wanted > timeout {
        let message = format!(
            "execution exceeded {:.3} s; kernel interrupted (SIGINT), it is idle again",
            timeout.as_secs_f64()
        );
        return envelope::result("timeout", None, Some(("Timeout", &message)), duration_ms);
    }
    let output = command::output_of(code);
    envelope::result("ok", output.as_deref(), None, duration_ms)
}

async fn is_file(path: &Path) -> bool {
    tokio::fs::metadata(path).await.is_ok_and(|m| m.is_file())
}

/// The bridge's nonce rule: 16 to 64 ASCII letters and digits.
fn valid_nonce(nonce: &str) -> bool {
    (16..=64).contains(&nonce.len()) && nonce.bytes().all(|b| b.is_ascii_alphanumeric())
}

fn exited(code: i32, stderr: String) -> ExecOutput {
    ExecOutput {
        exit_code: Some(code),
        stdout: String::new(),
        stderr,
        timed_out: false,
    }
}

#[cfg(test)]
mod tests;
