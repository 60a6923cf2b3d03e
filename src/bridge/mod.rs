//! The operator's side of the bridge: the Python program that runs inside the sandbox and
//! drives the Jupyter kernel (`bridge/sandbox/briq_sandbox.py`, protocol in
//! `bridge/PROTOCOL.md`). This module ships the program, builds its command lines and parses its
//! one framed envelope strictly. Nothing the sandbox prints is ever evaluated.

#[cfg(test)]
mod compat;
#[cfg(test)]
pub(crate) mod fake;
pub mod files;
pub mod fork;
pub mod session;
pub mod state;

pub use files::{FileError, FileErrorCode, FileReport};
pub use state::{StateReport, Unsaved};

use std::time::Duration;

use rand::{Rng, distr::Alphanumeric};
use serde::Deserialize;

/// The bridge program, uploaded staged at setup ([`staged_bridge`]), installed as `.briq/bridge.py`.
pub const SOURCE: &str = include_str!("../../bridge/sandbox/briq_sandbox.py");

/// The run client (`bridge/sandbox/briq_run.py`): the program of every action's exec, passed
/// as `python3 -I -S -c`. It hands the action to the kernel's runner at the interpreter's start
/// cost, and becomes the full bridge's `run` when no runner can take it.
pub const RUN_CLIENT: &str = include_str!("../../bridge/sandbox/briq_run.py");

/// Working directory of every bridge command; all bridge paths are relative to it, so the same
/// commands work on briq and on the local sandbox server.
pub const WORKDIR: &str = "/work";
/// Where [`SOURCE`] is uploaded.
const BRIDGE_ARG: &str = ".briq/bridge.py";

/// Upload path (absolute) and argument (relative to [`WORKDIR`]) of a staged copy of the
/// bridge, unique per provisioning: the bridge itself is only ever replaced by a rename (see
/// [`Command::Setup`]), because a file put may rewrite a file in place while another command
/// (a second operator provisioning the same sandbox) is reading it.
pub fn staged_bridge() -> (String, String) {
    let relative = format!(".briq/bridge-{:016x}.py", rand::random::<u64>());
    (format!("{WORKDIR}/{relative}"), relative)
}
const STATE_DIR: &str = ".briq/state";
/// The environment variable that carries the call's [`Nonce`] to the bridge.
pub const NONCE_ENV: &str = "BRIQ_NONCE";

/// Logs and output share this many characters per action.
pub const TEXT_BUDGET_CHARS: usize = 65_536;
/// A serialized final answer may be this long at most.
pub const FINAL_ANSWER_MAX_CHARS: usize = 65_536;
/// Largest bridge stdout the parser reads. A result is at most two budgets of text, which JSON
/// escaping can grow up to six-fold; anything larger is malformed.
pub const MAX_STDOUT_BYTES: usize = 1 << 20;

/// A fresh per-call token framing the envelope, so code that prints look-alike text cannot
/// forge a result. It reaches the bridge in its environment ([`NONCE_ENV`]), never in argv:
/// every process can read every other's command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nonce(String);

impl Nonce {
    pub fn random() -> Self {
        Nonce(
            rand::rng()
                .sample_iter(&Alphanumeric)
                .take(32)
                .map(char::from)
                .collect(),
        )
    }

    /// The nonce as it goes into the bridge's environment ([`NONCE_ENV`]).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn begin_marker(&self) -> String {
        format!("<<<BRIQ-ENVELOPE {}>>>", self.0)
    }

    fn end_marker(&self) -> String {
        format!("<<<END-BRIQ-ENVELOPE {}>>>", self.0)
    }
}

/// One invocation of the bridge.
#[derive(Clone, Debug)]
pub enum Command<'a> {
    /// Install the bridge's Python dependencies (skipped when importable) and `requirements`.
    /// Run from `staged` (relative to [`WORKDIR`], uploaded just before), which installs
    /// itself as the bridge by rename first ([`staged_bridge`]).
    Setup {
        staged: &'a str,
        deadline: Duration,
        requirements: &'a [String],
    },
    /// Start the kernel unless a live one answers.
    StartKernel { deadline: Duration },
    /// Report whether the kernel is alive; never starts one.
    Probe,
    /// What became of `attempt` (its journaled result, waiting while it runs); runs nothing.
    Recall { attempt: &'a str },
    /// Run the code given on the command's stdin as `attempt`, through the [`RUN_CLIENT`]: the
    /// sandbox's journal runs an attempt at most once, however often it is delivered.
    Run { attempt: &'a str, timeout: Duration },
    /// Cancel `attempt`: claimed as cancelled when never accepted (it never runs), else its
    /// kernel interrupted and, when the code does not stop within `grace`, restarted; answers
    /// the attempt's journaled result. Runs no code.
    Cancel { attempt: &'a str, grace: Duration },
    /// Save the kernel's user namespace inside the sandbox (the kernel pickles it into its own
    /// directory); answers which names were saved and which not, with why.
    SaveState { deadline: Duration },
    /// Restore the namespace saved last into the (new) kernel.
    RestoreState { deadline: Duration },
    /// Give the kernel a claimer's environment, sent on the command's stdin: kept for every
    /// kernel started from then on, and set in the live one within `deadline`.
    SetEnv { deadline: Duration },
    /// Join the parts uploaded to `staged` (relative to [`WORKDIR`]) into `dest`, written with
    /// the kernel user's rights, once their size and SHA-256 are the ones given; `staged` goes
    /// in any case.
    FileWrite {
        staged: &'a str,
        parts: usize,
        dest: &'a str,
        size: u64,
        sha256: &'a str,
        deadline: Duration,
    },
    /// Read `length` bytes of `path` from `offset`, with the kernel user's rights; refused past
    /// `max_size`.
    FileRead {
        path: &'a str,
        offset: u64,
        length: u64,
        max_size: u64,
        deadline: Duration,
    },
    /// Save the kernel's namespace (unless `saved`: a suspended executor's, saved before, its
    /// kernel not running) and pack the kernel user's directory as snapshot `snapshot` in
    /// [`fork::FORKS_DIR`], in parts of [`fork::PART_BYTES`]. A snapshot already there is
    /// answered again.
    ForkSave {
        snapshot: &'a str,
        saved: bool,
        deadline: Duration,
    },
    /// Join the parts of a snapshot uploaded to `staged` and unpack them into the kernel
    /// user's directory with its rights, once their size and SHA-256 are the ones given.
    ForkLoad {
        staged: &'a str,
        parts: u64,
        size: u64,
        sha256: &'a str,
        deadline: Duration,
    },
    /// Print `attempt`'s output as the kernel produces it, one JSON object a line, until the
    /// attempt ends or `deadline` passes; unframed, read by byte offset through an async exec.
    Follow {
        attempt: &'a str,
        deadline: Duration,
    },
}

impl Command<'_> {
    /// The argv to exec with `cwd` = [`WORKDIR`] and the nonce in [`NONCE_ENV`].
    pub fn argv(&self) -> Vec<String> {
        let program: &[&str] = match self {
            Command::Setup { staged, .. } => &[staged],
            // No site, no user environment: the client imports only built-in modules. It hands
            // a claimer's environment to the kernel's runner too (else becomes the bridge).
            Command::Run { .. } | Command::SetEnv { .. } => &["-I", "-S", "-c", RUN_CLIENT],
            _ => &[BRIDGE_ARG],
        };
        let mut argv: Vec<String> = vec!["python3".into()];
        argv.extend(program.iter().map(|part| part.to_string()));
        let seconds = |d: &Duration| format!("{:.3}", d.as_secs_f64());
        match self {
            Command::Setup {
                deadline,
                requirements,
                ..
            } => {
                argv.extend(["setup".into(), "--self-install".into()]);
                argv.extend(["--deadline".into(), seconds(deadline)]);
                for requirement in requirements.iter() {
                    argv.extend(["--requirement".into(), requirement.clone()]);
                }
            }
            Command::StartKernel { deadline } => {
                argv.extend(
                    ["start-kernel", "--state-dir", STATE_DIR, "--deadline"].map(String::from),
                );
                argv.push(seconds(deadline));
            }
            Command::Probe => argv.extend(["probe", "--state-dir", STATE_DIR].map(String::from)),
            Command::Recall { attempt } => {
                argv.extend(["recall".into(), "--attempt".into(), attempt.to_string()]);
            }
            Command::Run { attempt, timeout } => {
                argv.extend(["run", "--state-dir", STATE_DIR].map(String::from));
                argv.extend(["--timeout".into(), seconds(timeout)]);
                argv.extend(["--attempt".into(), attempt.to_string()]);
            }
            Command::SaveState { deadline } | Command::RestoreState { deadline } => {
                let name = match self {
                    Command::SaveState { .. } => "save-state",
                    _ => "restore-state",
                };
                argv.extend([name, "--state-dir", STATE_DIR, "--deadline"].map(String::from));
                argv.push(seconds(deadline));
            }
            Command::SetEnv { deadline } => {
                argv.extend(["set-env", "--state-dir", STATE_DIR, "--deadline"].map(String::from));
                argv.push(seconds(deadline));
            }
            Command::FileWrite {
                staged,
                parts,
                dest,
                size,
                sha256,
                deadline,
            } => {
                argv.extend(["file-write".into(), "--staged".into(), staged.to_string()]);
                argv.extend(["--parts".into(), parts.to_string()]);
                argv.extend(["--dest".into(), dest.to_string()]);
                argv.extend(["--size".into(), size.to_string()]);
                argv.extend(["--sha256".into(), sha256.to_string()]);
                argv.extend(["--deadline".into(), seconds(deadline)]);
            }
            Command::FileRead {
                path,
                offset,
                length,
                max_size,
                deadline,
            } => {
                argv.extend(["file-read".into(), "--path".into(), path.to_string()]);
                argv.extend(["--offset".into(), offset.to_string()]);
                argv.extend(["--length".into(), length.to_string()]);
                argv.extend(["--max-size".into(), max_size.to_string()]);
                argv.extend(["--deadline".into(), seconds(deadline)]);
            }
            Command::ForkSave {
                snapshot,
                saved,
                deadline,
            } => {
                argv.extend(["fork-save", "--state-dir", STATE_DIR].map(String::from));
                argv.extend(["--snapshot".into(), snapshot.to_string()]);
                if *saved {
                    argv.push("--saved".into());
                }
                argv.extend(["--deadline".into(), seconds(deadline)]);
            }
            Command::ForkLoad {
                staged,
                parts,
                size,
                sha256,
                deadline,
            } => {
                argv.extend(["fork-load".into(), "--staged".into(), staged.to_string()]);
                argv.extend(["--parts".into(), parts.to_string()]);
                argv.extend(["--size".into(), size.to_string()]);
                argv.extend(["--sha256".into(), sha256.to_string()]);
                argv.extend(["--deadline".into(), seconds(deadline)]);
            }
            Command::Follow { attempt, deadline } => {
                argv.extend(["follow".into(), "--attempt".into(), attempt.to_string()]);
                argv.extend(["--max-seconds".into(), seconds(deadline)]);
            }
            Command::Cancel { attempt, grace } => {
                argv.extend(["cancel", "--state-dir", STATE_DIR].map(String::from));
                argv.extend(["--attempt".into(), attempt.to_string()]);
                argv.extend(["--grace".into(), seconds(grace)]);
            }
        }
        argv
    }
}

/// What the bridge answered.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Envelope {
    Setup(SetupReport),
    Kernel(KernelReport),
    Result(RunResult),
    /// What `save-state` or `restore-state` did ([`StateReport`]).
    State(StateReport),
    /// What `set-env` did ([`EnvReport`]).
    Env(EnvReport),
    /// What `file-write` or `file-read` did ([`FileReport`]).
    File(FileReport),
    /// What `fork-save` or `fork-load` did ([`fork::ForkReport`]).
    Fork(fork::ForkReport),
    /// The real envelope was too large for briq's stdout and went to [`spill_file`].
    Spilled(Spill),
}

/// Where a spilled envelope is, and how to recognise it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spill {
    pub bytes: u64,
    pub sha256: String,
}

/// The file a spilled envelope of the call framed with `nonce` is written to.
pub fn spill_file(nonce: &Nonce) -> String {
    format!("{WORKDIR}/.briq/results/{}.out", nonce.0)
}

/// Parses the content of a spilled envelope, checked against what the bridge announced. A spill
/// never points at another spill.
pub fn parse_spilled(content: &[u8], spill: &Spill, nonce: &Nonce) -> Result<Envelope, Malformed> {
    use sha2::{Digest, Sha256};
    let digest = format!("{:x}", Sha256::digest(content));
    if content.len() as u64 != spill.bytes || digest != spill.sha256 {
        return Err(Malformed::Invalid(
            "spilled envelope does not match its size and digest".into(),
        ));
    }
    let text = std::str::from_utf8(content).map_err(|e| Malformed::Invalid(e.to_string()))?;
    match parse(text, nonce)? {
        Envelope::Spilled(_) => Err(Malformed::Invalid(
            "a spilled envelope points at another".into(),
        )),
        envelope => Ok(envelope),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetupReport {
    pub ok: bool,
    /// False when everything was importable already and pip was skipped.
    pub installed: bool,
    pub message: String,
    pub pip_tail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelReport {
    pub alive: bool,
    pub started: bool,
    pub pid: Option<i64>,
    pub message: String,
}

/// What `set-env` did: the names it set (sorted), never a value.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvReport {
    pub ok: bool,
    pub names: Vec<String>,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Ok,
    FinalAnswer,
    FinalAnswerRejected,
    Error,
    Timeout,
    KernelLost,
    /// Only from `recall`: the sandbox never accepted the attempt, so its code never ran there.
    NotAccepted,
    /// The attempt was cancelled: never run, or interrupted (the error says which, and whether
    /// the kernel was restarted); logs and output up to then are kept.
    Cancelled,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunResult {
    pub status: RunStatus,
    pub logs: String,
    pub output: Option<String>,
    pub truncated: bool,
    pub final_answer: Option<String>,
    pub error: Option<CodeError>,
    pub display_dropped: u32,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeError {
    pub name: String,
    pub message: String,
    pub traceback: String,
}

/// Why a bridge answer cannot be trusted. Any of these makes the executor unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("bridge output is {0} bytes, over the {MAX_STDOUT_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("bridge output has no envelope for this call")]
    Missing,
    #[error("bridge output has more than one envelope for this call")]
    Repeated,
    #[error("bridge envelope is not terminated")]
    Unterminated,
    #[error("bridge envelope is not valid: {0}")]
    Invalid(String),
}

/// Finds the one envelope framed with `nonce` in `stdout` and decodes it strictly: unknown
/// fields, a second envelope, or results over the budgets are malformed.
pub fn parse(stdout: &str, nonce: &Nonce) -> Result<Envelope, Malformed> {
    if stdout.len() > MAX_STDOUT_BYTES {
        return Err(Malformed::TooLarge(stdout.len()));
    }
    let (begin, end) = (nonce.begin_marker(), nonce.end_marker());
    let mut starts = stdout.match_indices(&begin);
    let (start, _) = starts.next().ok_or(Malformed::Missing)?;
    if starts.next().is_some() || stdout.matches(&end).count() > 1 {
        return Err(Malformed::Repeated);
    }
    let body_start = start + begin.len();
    let body_len = stdout[body_start..]
        .find(&end)
        .ok_or(Malformed::Unterminated)?;
    let body = stdout[body_start..body_start + body_len].trim();
    let envelope: Envelope =
        serde_json::from_str(body).map_err(|e| Malformed::Invalid(e.to_string()))?;
    match &envelope {
        Envelope::Result(result) => check_result(result)?,
        Envelope::State(report) => {
            if let Some(why) = state::problem(report) {
                return Err(Malformed::Invalid(why.into()));
            }
        }
        _ => {}
    }
    Ok(envelope)
}

fn check_result(result: &RunResult) -> Result<(), Malformed> {
    let invalid = |why: &str| Err(Malformed::Invalid(why.to_owned()));
    // The truncation marker may add a line beyond the budget; a bridge that ignores the budget
    // by more than that is not trusted.
    let text_chars =
        result.logs.chars().count() + result.output.as_deref().map_or(0, |o| o.chars().count());
    if text_chars > TEXT_BUDGET_CHARS + 256 {
        return invalid("logs and output exceed their shared budget");
    }
    match (result.status, &result.final_answer, &result.error) {
        (RunStatus::FinalAnswer, Some(answer), None) => {
            if !answer.starts_with("safe:") {
                return invalid("final answer is not in smolagents' safe serialization");
            }
            if answer.chars().count() > FINAL_ANSWER_MAX_CHARS {
                return invalid("final answer exceeds its budget");
            }
            // The bridge turns these into final_answer_rejected; one that got here was forged
            // (or the bridge is broken), and the agent host would decode it.
            match rejected_tag(&answer["safe:".len()..]) {
                Ok(None) => {}
                Ok(Some(tag)) => {
                    return Err(Malformed::Invalid(format!(
                        "final answer carries a {tag:?} value, which the bridge refuses"
                    )));
                }
                Err(why) => {
                    return Err(Malformed::Invalid(format!(
                        "final answer is not JSON: {why}"
                    )));
                }
            }
        }
        (RunStatus::FinalAnswer, _, _) => {
            return invalid("final_answer status without exactly an answer");
        }
        (
            RunStatus::Error | RunStatus::FinalAnswerRejected | RunStatus::Cancelled,
            None,
            Some(_),
        ) => {}
        (RunStatus::Error | RunStatus::FinalAnswerRejected | RunStatus::Cancelled, _, _) => {
            return invalid("error or cancelled status without exactly an error");
        }
        (RunStatus::Ok | RunStatus::Timeout | RunStatus::KernelLost, None, _) => {}
        (RunStatus::NotAccepted, None, None) => {}
        (RunStatus::NotAccepted, _, _) => {
            return invalid("not_accepted status with an answer or an error");
        }
        (_, Some(_), _) => return invalid("a final answer on a status that has none"),
    }
    Ok(())
}

/// smolagents 1.26 serialization tags (`{"__type__": "ndarray", ...}`,
/// `{"__type__": "PIL.Image", ...}`) that the agent host would decode into numpy arrays or PIL
/// images. A final answer must not carry them at any depth.
pub const REJECTED_TAGS: [&str; 2] = ["ndarray", "PIL.Image"];

/// The first [`REJECTED_TAGS`] tag that is the value of a `"__type__"` key anywhere in `json`
/// (keys and values compared after unescaping), or why `json` is not a JSON text.
///
/// Iterative, so depth is unbounded, and lenient where Python's `json` is (NaN, Infinity, lone
/// surrogate escapes), because the answer was accepted by it: what matters is finding every
/// object key and string exactly where Python's parser does. Duplicate keys are all looked at,
/// which is stricter than Python (the last one wins there); smolagents never writes duplicates.
pub fn rejected_tag(json: &str) -> Result<Option<&'static str>, String> {
    #[derive(Clone, Copy, PartialEq)]
    enum Expect {
        /// A value (top level, array element, object member value).
        Value,
        /// A key or `}` right after `{`.
        FirstKey,
        /// A key after `,` in an object.
        Key,
        /// `:` after a key.
        Colon,
        /// `,` or the closing bracket after a value.
        After,
    }
    let bytes = json.as_bytes();
    let mut stack: Vec<u8> = Vec::new(); // b'{' or b'['
    let mut expect = Expect::Value;
    // The current member's key was "__type__": check the string value that follows.
    let mut type_key = false;
    let mut found: Option<&'static str> = None;
    let mut done = false; // the top-level value is complete
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
            continue;
        }
        if done {
            return Err(format!("extra data at byte {i}"));
        }
        match (expect, byte) {
            (Expect::Value | Expect::FirstKey | Expect::Key, b'"') => {
                let (text, end) = json_string(json, i)?;
                i = end;
                match expect {
                    Expect::Value => {
                        if type_key && found.is_none() {
                            found = REJECTED_TAGS.iter().copied().find(|tag| *tag == text);
                        }
                        type_key = false;
                        expect = Expect::After;
                    }
                    _ => {
                        type_key = text == "__type__";
                        expect = Expect::Colon;
                    }
                }
            }
            (Expect::Colon, b':') => {
                expect = Expect::Value;
                i += 1;
            }
            (Expect::Value, b'{' | b'[') => {
                stack.push(byte);
                type_key = false;
                expect = if byte == b'{' {
                    Expect::FirstKey
                } else {
                    Expect::Value
                };
                i += 1;
                // An empty array closes at once.
                if byte == b'[' {
                    let next = json[i..].trim_start_matches([' ', '\t', '\n', '\r']);
                    if next.starts_with(']') {
                        i = bytes.len() - next.len() + 1;
                        stack.pop();
                        expect = Expect::After;
                    }
                }
            }
            (Expect::Value, _) => {
                // A number or a literal: Python also accepts NaN, Infinity and -Infinity.
                let end = json[i..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
                    .map_or(bytes.len(), |n| i + n);
                if end == i {
                    return Err(format!("unexpected {:?} at byte {i}", char::from(byte)));
                }
                type_key = false;
                expect = Expect::After;
                i = end;
            }
            (Expect::FirstKey, b'}') | (Expect::After, b'}' | b']') => {
                let open = if byte == b'}' { b'{' } else { b'[' };
                if stack.pop() != Some(open) {
                    return Err(format!("unbalanced {:?} at byte {i}", char::from(byte)));
                }
                expect = Expect::After;
                i += 1;
            }
            (Expect::After, b',') => {
                expect = match stack.last() {
                    Some(b'{') => Expect::Key,
                    Some(_) => Expect::Value,
                    None => return Err(format!("',' outside any container at byte {i}")),
                };
                i += 1;
            }
            _ => return Err(format!("unexpected {:?} at byte {i}", char::from(byte))),
        }
        if expect == Expect::After && stack.is_empty() {
            done = true;
        }
    }
    if !done {
        return Err("unexpected end of the text".to_owned());
    }
    Ok(found)
}

/// The unescaped text of the JSON string starting at `start` (a `"`) and the index after it.
/// Lone surrogate escapes become U+FFFD: no tag contains one.
fn json_string(json: &str, start: usize) -> Result<(String, usize), String> {
    let bytes = json.as_bytes();
    let mut text = String::new();
    let mut i = start + 1;
    loop {
        let Some(&byte) = bytes.get(i) else {
            return Err(format!("unterminated string at byte {start}"));
        };
        match byte {
            b'"' => return Ok((text, i + 1)),
            b'\\' => {
                let escape = *bytes.get(i + 1).ok_or("unterminated escape")?;
                i += 2;
                text.push(match escape {
                    b'"' => '"',
                    b'\\' => '\\',
                    b'/' => '/',
                    b'b' => '\u{8}',
                    b'f' => '\u{c}',
                    b'n' => '\n',
                    b'r' => '\r',
                    b't' => '\t',
                    b'u' => {
                        let unit = |at: usize| {
                            json.get(at..at + 4)
                                .and_then(|hex| u16::from_str_radix(hex, 16).ok())
                                .ok_or_else(|| format!("bad \\u escape at byte {at}"))
                        };
                        let first = unit(i)?;
                        i += 4;
                        let low = json.get(i..i + 2) == Some("\\u");
                        match first {
                            0xD800..=0xDBFF if low => match unit(i + 2)? {
                                second @ 0xDC00..=0xDFFF => {
                                    i += 6;
                                    let high = u32::from(first - 0xD800) << 10;
                                    let low = u32::from(second - 0xDC00);
                                    char::from_u32(0x10000 + high + low).unwrap_or('\u{fffd}')
                                }
                                _ => '\u{fffd}',
                            },
                            unit => char::from_u32(u32::from(unit)).unwrap_or('\u{fffd}'),
                        }
                    }
                    other => return Err(format!("bad escape {:?}", char::from(other))),
                });
            }
            _ => {
                // Copy the run of plain characters (valid UTF-8: `json` is a str).
                let end = json[i..].find(['"', '\\']).map_or(bytes.len(), |n| i + n);
                text.push_str(&json[i..end]);
                i = end;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The names a claimer's environment may not set: the bridge's list (`ENV_RESERVED`), the
    /// operator's and the schema's rule are one list.
    #[test]
    fn the_bridge_refuses_exactly_the_names_the_schema_refuses() {
        use crate::crd::{CLAIM_ENV_NAME_ALLOWED, CLAIM_ENV_RESERVED};
        let start = SOURCE
            .find("ENV_RESERVED = frozenset(")
            .expect("the bridge lists ENV_RESERVED");
        let listed = &SOURCE[start..start + SOURCE[start..].find(')').unwrap()];
        let mut bridge: Vec<&str> = listed.split('"').skip(1).step_by(2).collect();
        let mut operator = CLAIM_ENV_RESERVED.to_vec();
        bridge.sort_unstable();
        operator.sort_unstable();
        assert_eq!(bridge, operator);
        for name in CLAIM_ENV_RESERVED {
            assert!(
                CLAIM_ENV_NAME_ALLOWED.contains(&format!("'{name}'")),
                "the schema's rule refuses {name}"
            );
        }
        assert!(SOURCE.contains("ENV_RESERVED_PREFIX = \"BRIQ_\""));
        assert!(CLAIM_ENV_NAME_ALLOWED.contains("!self.name.startsWith('BRIQ_')"));
    }

    fn frame(nonce: &Nonce, body: &str) -> String {
        format!("{}\n{body}\n{}\n", nonce.begin_marker(), nonce.end_marker())
    }

    const OK: &str = r#"{"kind":"result","status":"ok","logs":"hi\n","output":"42","truncated":false,"final_answer":null,"error":null,"display_dropped":0,"duration_ms":3}"#;

    #[test]
    fn parses_a_result_among_other_output() {
        let nonce = Nonce::random();
        let stdout = format!("pip noise\n{}trailing\n", frame(&nonce, OK));
        let Envelope::Result(result) = parse(&stdout, &nonce).unwrap() else {
            panic!()
        };
        assert_eq!(result.status, RunStatus::Ok);
        assert_eq!(result.output.as_deref(), Some("42"));
        assert_eq!(result.logs, "hi\n");
    }

    #[test]
    fn parses_setup_and_kernel_reports() {
        let nonce = Nonce::random();
        let setup = r#"{"kind":"setup","ok":false,"installed":true,"message":"pip exited 1","pip_tail":"E: no"}"#;
        assert!(matches!(
            parse(&frame(&nonce, setup), &nonce),
            Ok(Envelope::Setup(SetupReport { ok: false, .. }))
        ));
        let kernel =
            r#"{"kind":"kernel","alive":true,"started":false,"pid":7,"message":"running"}"#;
        assert!(matches!(
            parse(&frame(&nonce, kernel), &nonce),
            Ok(Envelope::Kernel(KernelReport { pid: Some(7), .. }))
        ));
    }

    #[test]
    fn forged_or_broken_envelopes_are_malformed() {
        let nonce = Nonce::random();
        let other = Nonce::random();
        assert_eq!(parse(&frame(&other, OK), &nonce), Err(Malformed::Missing));
        assert_eq!(parse("", &nonce), Err(Malformed::Missing));
        let twice = format!("{}{}", frame(&nonce, OK), frame(&nonce, OK));
        assert_eq!(parse(&twice, &nonce), Err(Malformed::Repeated));
        let open = format!("{}\n{OK}\n", nonce.begin_marker());
        assert_eq!(parse(&open, &nonce), Err(Malformed::Unterminated));
        let unknown = OK.replace(
            r#""duration_ms":3"#,
            r#""duration_ms":3,"eval":"os.system('x')""#,
        );
        assert!(matches!(
            parse(&frame(&nonce, &unknown), &nonce),
            Err(Malformed::Invalid(_))
        ));
        let missing = OK.replace(r#","display_dropped":0"#, "");
        assert!(matches!(
            parse(&frame(&nonce, &missing), &nonce),
            Err(Malformed::Invalid(_))
        ));
        let huge = "x".repeat(MAX_STDOUT_BYTES + 1);
        assert_eq!(
            parse(&huge, &nonce),
            Err(Malformed::TooLarge(MAX_STDOUT_BYTES + 1))
        );
    }

    #[test]
    fn results_that_break_the_protocol_rules_are_malformed() {
        let nonce = Nonce::random();
        let pickle = OK
            .replace(r#""status":"ok""#, r#""status":"final_answer""#)
            .replace(r#""final_answer":null"#, r#""final_answer":"pickle:gASV""#);
        assert!(matches!(
            parse(&frame(&nonce, &pickle), &nonce),
            Err(Malformed::Invalid(_))
        ));
        let error_without_error = OK.replace(r#""status":"ok""#, r#""status":"error""#);
        assert!(matches!(
            parse(&frame(&nonce, &error_without_error), &nonce),
            Err(Malformed::Invalid(_))
        ));
        let over_budget = OK.replace(
            r#""logs":"hi\n""#,
            &format!(r#""logs":"{}""#, "y".repeat(TEXT_BUDGET_CHARS + 300)),
        );
        assert!(matches!(
            parse(&frame(&nonce, &over_budget), &nonce),
            Err(Malformed::Invalid(_))
        ));
        let answer = OK
            .replace(r#""status":"ok""#, r#""status":"final_answer""#)
            .replace(r#""final_answer":null"#, r#""final_answer":"safe:[1, 2]""#);
        assert!(parse(&frame(&nonce, &answer), &nonce).is_ok());
    }

    #[test]
    fn spilled_envelopes_are_checked_against_their_digest() {
        use sha2::{Digest, Sha256};
        let nonce = Nonce::random();
        let content = frame(&nonce, OK);
        let spill = Spill {
            bytes: content.len() as u64,
            sha256: format!("{:x}", Sha256::digest(&content)),
        };
        let pointer = format!(
            r#"{{"kind":"spilled","bytes":{},"sha256":"{}"}}"#,
            spill.bytes, spill.sha256
        );
        assert_eq!(
            parse(&frame(&nonce, &pointer), &nonce),
            Ok(Envelope::Spilled(spill.clone()))
        );
        assert!(matches!(
            parse_spilled(content.as_bytes(), &spill, &nonce),
            Ok(Envelope::Result(_))
        ));
        let tampered = content.replace("42", "43");
        assert!(parse_spilled(tampered.as_bytes(), &spill, &nonce).is_err());
        let nested = frame(&nonce, &pointer);
        let nested_spill = Spill {
            bytes: nested.len() as u64,
            sha256: format!("{:x}", Sha256::digest(&nested)),
        };
        assert!(parse_spilled(nested.as_bytes(), &nested_spill, &nonce).is_err());
    }

    #[test]
    fn argv_has_relative_paths_and_never_the_nonce() {
        let argv = Command::Run {
            attempt: "0123456789abcdef",
            timeout: Duration::from_secs(30),
        }
        .argv();
        assert_eq!(&argv[..5], ["python3", "-I", "-S", "-c", RUN_CLIENT]);
        assert_eq!(&argv[5..8], ["run", "--state-dir", ".briq/state"]);
        assert_eq!(&argv[argv.len() - 2..], ["--attempt", "0123456789abcdef"]);
        assert!(argv.contains(&"30.000".to_owned()));
        assert!(!argv.iter().any(|a| a.starts_with("--nonce")), "{argv:?}");
        let requirements = ["pandas==2.2.3".to_owned()];
        let argv = Command::Setup {
            staged: ".briq/bridge-0123456789abcdef.py",
            deadline: Duration::from_secs(60),
            requirements: &requirements,
        }
        .argv();
        assert!(
            argv.windows(2)
                .any(|w| w == ["--requirement", "pandas==2.2.3"])
        );
    }

    fn final_answer(answer: &str) -> String {
        let answer = serde_json::to_string(answer).unwrap();
        OK.replace(r#""status":"ok""#, r#""status":"final_answer""#)
            .replace(r#""output":"42""#, r#""output":null"#)
            .replace(
                r#""final_answer":null"#,
                &format!(r#""final_answer":{answer}"#),
            )
    }

    fn parse_answer(answer: &str) -> Result<Envelope, Malformed> {
        let nonce = Nonce::random();
        parse(&frame(&nonce, &final_answer(answer)), &nonce)
    }

    #[test]
    fn forged_ndarray_final_answer_is_malformed() {
        for answer in [
            r#"safe:{"__type__": "ndarray", "data": [1, 2], "dtype": "int64"}"#,
            r#"safe:[1, {"a": {"__type__":"ndarray","data":[],"dtype":"float64"}}]"#,
            r#"safe:{"__type__": "tuple", "data": [{"__type__": "ndarray", "data": [1]}]}"#,
            // Escaped spellings decode to the same key and tag in Python.
            r#"safe:{"\u005f\u005ftype__": "nd\u0061rray", "data": []}"#,
            r#"safe:{"x": NaN, "__type__": "ndarray"}"#,
        ] {
            assert!(
                matches!(parse_answer(answer), Err(Malformed::Invalid(_))),
                "{answer}"
            );
        }
    }

    #[test]
    fn forged_pil_image_final_answer_is_malformed() {
        for answer in [
            r#"safe:{"__type__": "PIL.Image", "data": "iVBORw0KGgo="}"#,
            r#"safe:{"images": [[[{"__type__" : "PIL.Image", "data": ""}]]]}"#,
            r#"safe:{"__type__": "dict_with_complex_keys", "data": [[{"__type__": "PIL.Image", "data": ""}, 1]]}"#,
            r#"safe:{"__type__": "PIL\u002eImage", "data": ""}"#,
        ] {
            assert!(
                matches!(parse_answer(answer), Err(Malformed::Invalid(_))),
                "{answer}"
            );
        }
    }

    #[test]
    fn forged_tag_deeper_than_any_parser_recursion_limit_is_malformed() {
        let depth = 10_000;
        let answer = format!(
            r#"safe:{}{{"__type__": "ndarray", "data": []}}{}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        assert!(matches!(parse_answer(&answer), Err(Malformed::Invalid(_))));
        let deep_object = format!(
            r#"safe:{}{{"__type__": "PIL.Image"}}{}"#,
            r#"{"k": "#.repeat(depth),
            "}".repeat(depth)
        );
        assert!(matches!(
            parse_answer(&deep_object),
            Err(Malformed::Invalid(_))
        ));
    }

    #[test]
    fn final_answers_without_those_tags_stay_valid() {
        for answer in [
            "safe:42",
            "safe:NaN",
            r#"safe:[-Infinity, 1e-3, true, null, "\ud800"]"#,
            r#"safe:{"__type__": "tuple", "data": [1, "ndarray"]}"#,
            r#"safe:{"text": "{\"__type__\": \"ndarray\"}", "__type__x": "PIL.Image"}"#,
            r#"safe:{"ndarray": {"PIL.Image": "__type__"}, "e": {}, "l": [ ], "s": ""}"#,
            r#"safe:{"__type__": ["ndarray"]}"#,
        ] {
            assert!(
                matches!(parse_answer(answer), Ok(Envelope::Result(_))),
                "{answer}: {:?}",
                parse_answer(answer)
            );
        }
    }

    #[test]
    fn final_answers_that_are_not_json_are_malformed() {
        for answer in [
            "safe:",
            "safe:[1,",
            r#"safe:{"a" 1}"#,
            "safe:[1] 2",
            r#"safe:{"a": 1]"#,
            r#"safe:"open"#,
        ] {
            assert!(
                matches!(parse_answer(answer), Err(Malformed::Invalid(_))),
                "{answer}"
            );
        }
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_output(stdout in ".{0,2000}") {
            let _ = parse(&stdout, &Nonce::random());
        }

        #[test]
        fn user_text_around_a_real_envelope_cannot_change_it(
            before in ".{0,500}", after in ".{0,500}", forged in "[a-zA-Z0-9]{32}",
        ) {
            let nonce = Nonce::random();
            prop_assume!(forged != nonce.0);
            let fake = frame(&Nonce(forged), &OK.replace("42", "forged"));
            let stdout = format!("{before}{fake}{}{after}", frame(&nonce, OK));
            let Ok(Envelope::Result(result)) = parse(&stdout, &nonce) else {
                return Err(TestCaseError::fail("the real envelope was not found"));
            };
            prop_assert_eq!(result.output.as_deref(), Some("42"));
        }

        #[test]
        fn a_rejected_tag_at_any_depth_is_malformed(
            path in proptest::collection::vec((any::<bool>(), "[a-z]{0,3}", 0usize..3), 0..60),
            tag in proptest::sample::select(REJECTED_TAGS.to_vec()),
            escape_key in any::<bool>(), space in "[ \t\n\r]{0,2}",
        ) {
            // The tagged object inside a random path of arrays (with siblings before it) and
            // objects (under random keys), as smolagents or a forger might nest it.
            let key = if escape_key { r#""\u005f_type__""# } else { r#""__type__""# };
            let mut json = format!(r#"{{{key}{space}:{space}"{tag}", "data": []}}"#);
            for (in_array, name, siblings) in path.iter().rev() {
                json = if *in_array {
                    format!("[{}{json}]", "0, ".repeat(*siblings))
                } else {
                    format!(r#"{{"{name}": {json}}}"#)
                };
            }
            let result = parse_answer(&format!("safe:{json}"));
            prop_assert!(matches!(result, Err(Malformed::Invalid(_))), "{}", json);
        }

        #[test]
        fn answers_python_would_accept_without_tags_are_kept(
            values in proptest::collection::vec(any::<f64>(), 0..5),
            text in ".{0,40}",
            nested in 0usize..40,
        ) {
            // Serialized the way Python's json.dumps does (NaN and infinities included), with a
            // string that may mention the tags.
            let numbers: Vec<String> = values.iter().map(|v| match v {
                v if v.is_nan() => "NaN".to_owned(),
                v if v.is_infinite() => if *v > 0.0 { "Infinity".into() } else { "-Infinity".into() },
                v => format!("{v:?}"),
            }).collect();
            let text = serde_json::to_string(&format!("__type__ ndarray PIL.Image {text}")).unwrap();
            let json = format!(
                r#"{}{{"__type__": "tuple", "data": [{}], "s": {text}}}{}"#,
                "[".repeat(nested), numbers.join(", "), "]".repeat(nested),
            );
            let result = parse_answer(&format!("safe:{json}"));
            prop_assert!(matches!(result, Ok(Envelope::Result(_))), "{} {:?}", json, result);
        }

        #[test]
        fn any_single_corruption_of_the_body_is_rejected_or_parsed_strictly(
            position in 0usize..OK.len(), byte in any::<u8>(),
        ) {
            let nonce = Nonce::random();
            let mut body = OK.as_bytes().to_vec();
            body[position] = byte;
            if let Ok(body) = String::from_utf8(body)
                && let Ok(Envelope::Result(result)) = parse(&frame(&nonce, &body), &nonce)
            {
                // A corruption that still decodes must still satisfy every protocol rule.
                prop_assert!(check_result(&result).is_ok());
            }
        }
    }
}
