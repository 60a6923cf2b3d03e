//! The fast tier's briq: [`FakeBriq`] implements [`SandboxApi`] in memory. Its sandboxes keep
//! files, answer each bridge command with the envelope the test scripted for it (a plausible
//! default otherwise), framed with the call's nonce as the bridge frames it, and every call is
//! recorded as data ([`Call`]) for the test to compare with the exact sequence it expects.
//! Milliseconds, no process: beside the contract and end-to-end tests, never instead of them.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::{NONCE_ENV, Nonce};
use crate::briq::{
    self, ApiKey, CreateSandbox, DestroyOutcome, ExecOutput, ExecRequest, ExecResult,
    ExecResultArgs, ExecState, Sandbox, SandboxApi, SandboxState,
};

/// The bridge's subcommands, as they appear in a command's argv.
const SUBCOMMANDS: [&str; 12] = [
    "setup",
    "start-kernel",
    "probe",
    "recall",
    "run",
    "cancel",
    "save-state",
    "restore-state",
    "set-env",
    "follow",
    "fork-save",
    "fork-load",
];

/// One call the code under test made, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Create {
        name: String,
    },
    /// `briq_fork` of `source` under `name`.
    Fork {
        source: String,
        name: String,
    },
    FindByName {
        name: String,
    },
    List,
    Get {
        id: String,
    },
    Destroy {
        id: String,
    },
    Stop {
        id: String,
    },
    Start {
        id: String,
    },
    /// A bridge command: its subcommand, and what it was sent on stdin.
    Exec {
        id: String,
        command: String,
        stdin: Option<String>,
    },
    WriteFile {
        id: String,
        path: String,
    },
    ReadFile {
        id: String,
        path: String,
    },
    /// A command started with `async`: its bridge subcommand, and the exec id answered.
    ExecAsync {
        id: String,
        command: String,
        exec: String,
    },
    ExecResult {
        exec: String,
        offset: Option<u64>,
    },
    ExecStop {
        exec: String,
    },
}

impl Call {
    pub fn exec(id: &str, command: &str) -> Self {
        Self::Exec {
            id: id.to_owned(),
            command: command.to_owned(),
            stdin: None,
        }
    }

    pub fn exec_with(id: &str, command: &str, stdin: &str) -> Self {
        Self::Exec {
            id: id.to_owned(),
            command: command.to_owned(),
            stdin: Some(stdin.to_owned()),
        }
    }
}

/// What a scripted bridge command answers.
pub enum Reply {
    /// This envelope (its JSON), framed with the call's nonce.
    Envelope(Value),
    /// This envelope spilled to the result file, the exec answering only where it is.
    Spilled(Value),
    /// The exec fails with this error.
    Fails(briq::Error),
}

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    sandboxes: BTreeMap<String, Sandbox>,
    files: BTreeMap<(String, String), Vec<u8>>,
    script: BTreeMap<String, VecDeque<Reply>>,
    /// The whole stdout each next async command writes (it has exited when read).
    async_outputs: VecDeque<String>,
    /// The stdout of each async command started, by exec id.
    async_runs: BTreeMap<String, String>,
}

/// An in-memory briq (see the module documentation).
#[derive(Default)]
pub struct FakeBriq {
    state: Mutex<State>,
}

impl FakeBriq {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A running sandbox named `name` with id `id`, as if made earlier.
    pub fn with_sandbox(self, id: &str, name: &str) -> Self {
        self.state()
            .sandboxes
            .insert(id.to_owned(), sandbox(id, name));
        self
    }

    /// The next `command` answers `reply` (replies to one command are used in order).
    pub fn answer(&self, command: &str, reply: Reply) {
        self.state()
            .script
            .entry(command.to_owned())
            .or_default()
            .push_back(reply);
    }

    /// The next async command's whole stdout (it reads as exited).
    pub fn async_output(&self, stdout: &str) {
        self.state().async_outputs.push_back(stdout.to_owned());
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    fn record(&self, call: Call) {
        self.state().calls.push(call);
    }

    fn running(&self, id: &str) -> Result<(), briq::Error> {
        match self.state().sandboxes.get(id).map(|s| s.state) {
            Some(SandboxState::Running) => Ok(()),
            Some(state) => Err(refused(&format!("briq {id} is {state}"))),
            None => Err(not_found(id)),
        }
    }

    /// The stdout of `command`'s exec: its scripted envelope, framed with `nonce`.
    fn bridge_answer(&self, id: &str, command: &str, nonce: &Nonce) -> Result<String, briq::Error> {
        let reply = self
            .state()
            .script
            .get_mut(command)
            .and_then(VecDeque::pop_front)
            .unwrap_or_else(|| Reply::Envelope(default_envelope(command)));
        match reply {
            Reply::Envelope(envelope) => Ok(frame(nonce, &envelope)),
            Reply::Spilled(envelope) => {
                use sha2::{Digest as _, Sha256};
                let content = frame(nonce, &envelope).into_bytes();
                let spill = json!({
                    "kind": "spilled",
                    "bytes": content.len(),
                    "sha256": format!("{:x}", Sha256::digest(&content)),
                });
                self.state()
                    .files
                    .insert((id.to_owned(), super::spill_file(nonce)), content);
                Ok(frame(nonce, &spill))
            }
            Reply::Fails(error) => Err(error),
        }
    }
}

fn sandbox(id: &str, name: &str) -> Sandbox {
    Sandbox {
        id: id.to_owned(),
        name: name.to_owned(),
        state: SandboxState::Running,
        image: "python:3.12-slim".to_owned(),
        size: None,
        sleep: "30m".to_owned(),
        created_at: Timestamp::UNIX_EPOCH,
    }
}

fn frame(nonce: &Nonce, envelope: &Value) -> String {
    format!(
        "{}\n{envelope}\n{}\n",
        nonce.begin_marker(),
        nonce.end_marker()
    )
}

fn not_found(what: &str) -> briq::Error {
    briq::Error::NotFound {
        message: format!("no {what}"),
        request_id: None,
    }
}

fn refused(message: &str) -> briq::Error {
    briq::Error::Rejected {
        status: 200,
        code: briq::api::ErrorCode::InvalidRequest,
        message: message.to_owned(),
        request_id: None,
    }
}

/// The bridge subcommand `request` runs, or its whole argv when it runs none.
fn subcommand(request: &ExecRequest) -> String {
    request
        .argv
        .iter()
        .find(|arg| SUBCOMMANDS.contains(&arg.as_str()))
        .cloned()
        .unwrap_or_else(|| request.argv.join(" "))
}

/// An exited async command's answer: its output from `offset`, when asked by offset.
fn async_result(exec: &str, stdout: &str, offset: Option<u64>) -> ExecResult {
    let from = |offset: u64| stdout.get(offset as usize..).unwrap_or_default().to_owned();
    ExecResult {
        exec: exec.to_owned(),
        state: ExecState::Exited,
        exit_code: Some(0),
        stdout: offset.is_none().then(|| stdout.to_owned()),
        stderr: offset.is_none().then(String::new),
        output: offset.map(from),
        next_offset: offset.map(|_| stdout.len() as u64),
        stdout_path: format!("/.briq-exec/{exec}/stdout"),
        stderr_path: format!("/.briq-exec/{exec}/stderr"),
    }
}

/// What a healthy bridge answers `command` with.
pub fn default_envelope(command: &str) -> Value {
    match command {
        "setup" => {
            json!({"kind": "setup", "ok": true, "installed": false, "message": "", "pip_tail": null})
        }
        "start-kernel" | "probe" => {
            json!({"kind": "kernel", "alive": true, "started": command == "start-kernel", "pid": 7, "message": ""})
        }
        "save-state" | "restore-state" => {
            json!({"kind": "state", "ok": true, "saved": ["x"], "unsaved": [], "bytes": 10, "message": ""})
        }
        "set-env" => json!({"kind": "env", "ok": true, "names": [], "message": ""}),
        "fork-save" | "fork-load" => json!({
            "kind": "fork", "ok": true, "message": "", "snapshot": "", "parts": 1, "size": 10,
            "sha256": "0".repeat(64), "files": 1, "skipped": 0, "saved": ["x"], "unsaved": [],
            "state_bytes": 10, "error": null,
        }),
        "cancel" => {
            let mut cancelled = result("cancelled", "");
            cancelled["output"] = Value::Null;
            cancelled["error"] =
                json!({"name": "KeyboardInterrupt", "message": "cancelled", "traceback": ""});
            cancelled
        }
        _ => result("ok", "2"),
    }
}

/// A run's result envelope with `status` and `output`.
pub fn result(status: &str, output: &str) -> Value {
    json!({
        "kind": "result", "status": status, "logs": "", "output": output, "truncated": false,
        "final_answer": null, "error": null, "display_dropped": 0, "duration_ms": 1,
    })
}

impl SandboxApi for FakeBriq {
    async fn create_sandbox(
        &self,
        _key: &ApiKey,
        request: &CreateSandbox,
    ) -> briq::Result<Sandbox> {
        self.record(Call::Create {
            name: request.name.clone(),
        });
        let mut state = self.state();
        let id = format!("bq_{}", state.sandboxes.len() + 1);
        let created = sandbox(&id, &request.name);
        state.sandboxes.insert(id, created.clone());
        Ok(created)
    }

    async fn fork_sandbox(
        &self,
        _key: &ApiKey,
        source: &str,
        name: &str,
        _sleep: &str,
    ) -> briq::Result<Sandbox> {
        self.record(Call::Fork {
            source: source.to_owned(),
            name: name.to_owned(),
        });
        let mut state = self.state();
        if !state.sandboxes.contains_key(source) {
            return Err(not_found(source));
        }
        let id = format!("bq_{}", state.sandboxes.len() + 1);
        let forked = sandbox(&id, name);
        state.sandboxes.insert(id, forked.clone());
        Ok(forked)
    }

    async fn find_sandboxes_by_name(
        &self,
        _key: &ApiKey,
        name: &str,
    ) -> briq::Result<Vec<Sandbox>> {
        self.record(Call::FindByName {
            name: name.to_owned(),
        });
        Ok(self
            .state()
            .sandboxes
            .values()
            .filter(|s| s.name == name && s.state != SandboxState::Destroyed)
            .cloned()
            .collect())
    }

    async fn list_sandboxes(&self, _key: &ApiKey) -> briq::Result<Vec<Sandbox>> {
        self.record(Call::List);
        Ok(self.state().sandboxes.values().cloned().collect())
    }

    async fn get_sandbox(&self, _key: &ApiKey, id: &str) -> briq::Result<Sandbox> {
        self.record(Call::Get { id: id.to_owned() });
        self.state()
            .sandboxes
            .get(id)
            .cloned()
            .ok_or_else(|| not_found(id))
    }

    async fn destroy_sandbox(&self, _key: &ApiKey, id: &str) -> briq::Result<DestroyOutcome> {
        self.record(Call::Destroy { id: id.to_owned() });
        Ok(match self.state().sandboxes.remove(id) {
            Some(_) => DestroyOutcome::Destroyed,
            None => DestroyOutcome::AlreadyGone,
        })
    }

    async fn stop_sandbox(&self, _key: &ApiKey, id: &str) -> briq::Result<Sandbox> {
        self.record(Call::Stop { id: id.to_owned() });
        let mut state = self.state();
        let sandbox = state.sandboxes.get_mut(id).ok_or_else(|| not_found(id))?;
        sandbox.state = SandboxState::Stopped;
        Ok(sandbox.clone())
    }

    async fn start_sandbox(&self, _key: &ApiKey, id: &str) -> briq::Result<Sandbox> {
        self.record(Call::Start { id: id.to_owned() });
        let mut state = self.state();
        let sandbox = state.sandboxes.get_mut(id).ok_or_else(|| not_found(id))?;
        sandbox.state = SandboxState::Running;
        Ok(sandbox.clone())
    }

    async fn exec(
        &self,
        _key: &ApiKey,
        id: &str,
        request: &ExecRequest,
    ) -> briq::Result<ExecOutput> {
        let command = subcommand(request);
        self.record(Call::Exec {
            id: id.to_owned(),
            command: command.clone(),
            stdin: request.stdin.clone(),
        });
        self.running(id)?;
        let nonce = Nonce(request.env.get(NONCE_ENV).cloned().unwrap_or_default());
        let stdout = self.bridge_answer(id, &command, &nonce)?;
        Ok(ExecOutput {
            exit_code: Some(0),
            stdout,
            stderr: String::new(),
            timed_out: false,
        })
    }

    async fn exec_async(
        &self,
        _key: &ApiKey,
        id: &str,
        request: &ExecRequest,
    ) -> briq::Result<String> {
        self.running(id)?;
        let mut state = self.state();
        let exec = format!("ex_{}", state.async_runs.len() + 1);
        let stdout = state.async_outputs.pop_front().unwrap_or_default();
        state.async_runs.insert(exec.clone(), stdout);
        state.calls.push(Call::ExecAsync {
            id: id.to_owned(),
            command: subcommand(request),
            exec: exec.clone(),
        });
        Ok(exec)
    }

    async fn exec_result(
        &self,
        _key: &ApiKey,
        arguments: &ExecResultArgs,
    ) -> briq::Result<ExecResult> {
        self.record(Call::ExecResult {
            exec: arguments.exec.clone(),
            offset: arguments.offset,
        });
        let stdout = self
            .state()
            .async_runs
            .get(&arguments.exec)
            .cloned()
            .ok_or_else(|| not_found(&arguments.exec))?;
        Ok(async_result(&arguments.exec, &stdout, arguments.offset))
    }

    async fn exec_stop(&self, _key: &ApiKey, _id: &str, exec: &str) -> briq::Result<ExecResult> {
        self.record(Call::ExecStop {
            exec: exec.to_owned(),
        });
        let stdout = self
            .state()
            .async_runs
            .get(exec)
            .cloned()
            .ok_or_else(|| not_found(exec))?;
        Ok(async_result(exec, &stdout, None))
    }

    async fn write_file(
        &self,
        _key: &ApiKey,
        id: &str,
        path: &str,
        content: &[u8],
    ) -> briq::Result<()> {
        self.record(Call::WriteFile {
            id: id.to_owned(),
            path: path.to_owned(),
        });
        self.running(id)?;
        self.state()
            .files
            .insert((id.to_owned(), path.to_owned()), content.to_vec());
        Ok(())
    }

    async fn read_file(&self, _key: &ApiKey, id: &str, path: &str) -> briq::Result<Vec<u8>> {
        self.record(Call::ReadFile {
            id: id.to_owned(),
            path: path.to_owned(),
        });
        self.running(id)?;
        self.state()
            .files
            .get(&(id.to_owned(), path.to_owned()))
            .cloned()
            .ok_or_else(|| not_found(path))
    }
}
