//! briq's MCP tools as the operator calls them: every tool name, argument and answer shape in
//! one place, each marked published or assumed.
//!
//! **Published** (`shared/reference/briq-mcp-tools.md`, Glama's per-tool pages): the endpoint
//! (`https://api.briq.cloud/mcp`, Streamable HTTP, bearer key), the tool names, the argument
//! names of `briq_list`, `briq_status`, `briq_exec_result`, `briq_exec_stop`, `briq_files_put`,
//! `briq_files_get`, `briq_stop`, `briq_start` and `briq_destroy`, the captured part of
//! `briq_exec`'s (`briq`, `cmd`, `env`, `stdin`, `async`, `clearEnv`), `bq_` and `ex_` ids, the
//! state names, sleep as a string, the 60 s synchronous exec, the last 64 KB of output, 1 MB per
//! file with its SHA-256, a PNG/JPEG/GIF/WebP read answered as an image content item, and the
//! captured part of `briq_fork`'s (`briq`, `into`, `name`, `wait`, `sleep`): a fork keeps its
//! source's config, credentials and boot files, not the disk of a briq without a volume.
//!
//! **Assumed** (the reference has a gap): `briq_run`'s arguments (`image`, `name`, `size`,
//! `sleep`, `env`, `wait` are named in its description, its schema was not captured), and the
//! shape of every answer: a tool's result is read from `structuredContent`, else from its first
//! text item as JSON ([`Sandbox`], also for `briq_fork`'s answer, [`BriqList`], [`ExecAnswer`], [`FilesPutAnswer`],
//! [`FilesGetAnswer`]), and a tool error's text as `{"error": {"code", "message"}}`
//! ([`ToolErrorBody`]). The client and the local sandbox server both use these definitions, and
//! the live conformance check ([`super::conformance`]) compares the argument names with what the
//! server declares, so a wrong guess is named at start, never met as a loop of refusals.
//!
//! Two things briq's exec does not take travel in the command instead: the working directory
//! (`cd`) and the command's own time limit (coreutils `timeout`, whose exit status 124 says the
//! limit was reached), see [`ExecArgs::from_request`].

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
// jiff as re-exported by k8s-openapi: the same version the CRDs use, no second copy.
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Where briq's MCP server answers unless configured otherwise (published).
pub const DEFAULT_BASE_URL: &str = "https://api.briq.cloud/mcp";

/// Response header carrying a request id, kept in errors and traces when a server sends one
/// (assumed name: briq publishes none).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Longest synchronous exec briq allows (published: `briq_exec` blocks at most 60 s).
pub const MAX_EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest file briq accepts or returns in one call (published: 1 MB per file).
pub const MAX_FILE_BYTES: usize = 1024 * 1024;

/// How much of each output stream briq keeps (published: the last 64 KB).
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// The exit status of coreutils `timeout` when the command outlived its limit.
pub const TIMED_OUT_STATUS: i32 = 124;

/// The tools the operator calls (published names).
pub mod tools {
    pub const RUN: &str = "briq_run";
    pub const LIST: &str = "briq_list";
    pub const STATUS: &str = "briq_status";
    pub const EXEC: &str = "briq_exec";
    pub const FILES_PUT: &str = "briq_files_put";
    pub const FILES_GET: &str = "briq_files_get";
    pub const STOP: &str = "briq_stop";
    pub const START: &str = "briq_start";
    pub const DESTROY: &str = "briq_destroy";
    pub const EXEC_RESULT: &str = "briq_exec_result";
    pub const EXEC_STOP: &str = "briq_exec_stop";
    pub const FORK: &str = "briq_fork";
}

/// Every tool the operator calls with every argument it may send: what the conformance check
/// holds against the server's `tools/list` (a test keeps it equal to the argument types).
pub const SENT: &[(&str, &[&str])] = &[
    (
        tools::RUN,
        &["image", "name", "size", "sleep", "env", "wait"],
    ),
    (tools::LIST, &["all"]),
    (tools::STATUS, &["briq"]),
    (tools::EXEC, &["briq", "cmd", "env", "stdin", "async"]),
    (
        tools::EXEC_RESULT,
        &["briq", "exec", "offset", "stream", "waitMs", "maxBytes"],
    ),
    (tools::EXEC_STOP, &["briq", "exec"]),
    (tools::FILES_PUT, &["briq", "path", "contentBase64"]),
    (tools::FILES_GET, &["briq", "path"]),
    (tools::STOP, &["briq"]),
    (tools::START, &["briq"]),
    (tools::DESTROY, &["briq"]),
    (tools::FORK, &["briq", "name", "sleep", "wait"]),
];

/// Lifecycle states of a briq (published names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    Creating,
    Running,
    Stopping,
    Stopped,
    Starting,
    Sleeping,
    Resizing,
    Moving,
    Destroying,
    Destroyed,
}

impl std::fmt::Display for SandboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The wire name is the one people read in briq's own tools.
        let name = serde_json::to_value(self).map_err(|_| std::fmt::Error)?;
        f.write_str(name.as_str().ok_or(std::fmt::Error)?)
    }
}

/// A briq as `briq_run`, `briq_status`, `briq_stop`, `briq_start` and each item of `briq_list`
/// describe it (assumed shape; the state names are published).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// `bq_…`
    pub id: String,
    pub name: String,
    pub state: SandboxState,
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    pub sleep: String,
    pub created_at: Timestamp,
}

/// Answer of `briq_list` (assumed shape).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BriqList {
    pub briqs: Vec<Sandbox>,
}

/// Arguments of `briq_run` (assumed: named in its description, schema not captured).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateSandbox {
    /// Not unique at briq: look-ups by name can answer several sandboxes.
    pub name: String,
    pub image: String,
    /// A named size (`small`, …), passed through; omitted means the plan default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Idle time before the sandbox sleeps: `30m`, `3h`, `7d` or `never`.
    pub sleep: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// `briq_run`'s arguments: the create plus `wait: true` (block until it runs).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunArgs {
    #[serde(flatten)]
    pub create: CreateSandbox,
    pub wait: bool,
}

/// Arguments of `briq_fork` for one briq (published names; the answer is assumed to describe
/// the fork as `briq_run`'s does). A fork keeps its source's config, credentials and boot
/// files; its disk is copied only from a volume, so what a briq without one wrote stays with
/// the source (published).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkArgs {
    /// The source, `bq_…`.
    pub briq: String,
    /// The fork's name: the operator's deterministic name, so that a fork made just before a
    /// crash is found again.
    pub name: String,
    /// Idle time before the fork sleeps, as `briq_run`'s `sleep`.
    pub sleep: String,
    /// Block until the fork runs.
    pub wait: bool,
}

/// Arguments of `briq_list` (published).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ListArgs {
    /// Include destroyed briqs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

/// The one argument of `briq_status`, `briq_stop`, `briq_start` and `briq_destroy`
/// (published).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BriqArgs {
    pub briq: String,
}

/// A command to run synchronously in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// Run as is, never through a shell: use `["sh", "-c", …]` for shell features.
    pub argv: Vec<String>,
    /// Absolute path inside the sandbox; briq's default when `None`.
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    /// At most [`MAX_EXEC_TIMEOUT`]; enforced in the sandbox, rounded up to whole seconds.
    pub timeout: Duration,
    pub stdin: Option<String>,
}

/// Arguments of `briq_exec` (published names).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecArgs {
    pub briq: String,
    /// argv, run without a shell.
    pub cmd: Vec<String>,
    /// For this command only; kept out of briq's status and audit log.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
}

/// The shell prelude that gives a command its working directory (made when missing) and its
/// time limit: `$0` is the limit in seconds, `$1` the directory, the rest the command. A
/// command that ignores the TERM at its limit is killed a second later; either way `timeout`
/// answers 124. [`LOCAL_ROOT_ENV`] is empty on briq.
pub const EXEC_PRELUDE: &str = "d=\"${BRIQ_LOCAL_SANDBOX_ROOT-}$1\"; mkdir -p \"$d\" && cd \"$d\" || exit 126; \
     shift; exec timeout -k 1 \"$0\" \"$@\"";

/// Set by the local sandbox server only, whose sandboxes are directories of the host rather
/// than machines of their own: the host path of the sandbox's `/`, so that the prelude's `cd`
/// lands inside it.
pub const LOCAL_ROOT_ENV: &str = "BRIQ_LOCAL_SANDBOX_ROOT";

/// A command made by [`ExecArgs::from_request`], taken apart again (for the local server's
/// simulated sandboxes, which answer bridge commands without running them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unwrapped<'a> {
    pub timeout: Duration,
    pub cwd: &'a str,
    pub argv: &'a [String],
}

impl<'a> Unwrapped<'a> {
    pub fn of(cmd: &'a [String]) -> Option<Self> {
        match cmd {
            [sh, c, prelude, seconds, cwd, argv @ ..]
                if sh == "sh" && c == "-c" && prelude == EXEC_PRELUDE =>
            {
                Some(Self {
                    timeout: Duration::from_secs(seconds.parse().ok()?),
                    cwd,
                    argv,
                })
            }
            _ => None,
        }
    }
}

impl ExecArgs {
    /// `briq_exec`'s arguments for `request` on `briq`: the working directory and the time
    /// limit travel in the command ([`EXEC_PRELUDE`]), since briq's exec takes neither.
    pub fn from_request(briq: &str, request: &ExecRequest) -> Self {
        // Rounding down could turn a sub-second timeout into 0, which means "no limit".
        let seconds = request.timeout.as_secs() + u64::from(request.timeout.subsec_nanos() > 0);
        let mut cmd = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            EXEC_PRELUDE.to_owned(),
            seconds.to_string(),
            request.cwd.clone().unwrap_or_else(|| "/".to_owned()),
        ];
        cmd.extend(request.argv.iter().cloned());
        Self {
            briq: briq.to_owned(),
            cmd,
            env: request.env.clone(),
            stdin: request.stdin.clone(),
        }
    }
}

/// Answer of a synchronous `briq_exec` (assumed shape; stdout, stderr and the exit code are
/// published).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecAnswer {
    /// `None` when the command was killed rather than exiting.
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// How long `briq_exec_result` waits by default, and at most (published: 30 s, 45 s).
pub const DEFAULT_WAIT_MS: u64 = 30_000;
pub const MAX_WAIT_MS: u64 = 45_000;
/// How much a read by offset gives by default, and at most (published: 32768, 262144).
pub const DEFAULT_READ_BYTES: u64 = 32_768;
pub const MAX_READ_BYTES: u64 = 262_144;
/// The largest byte offset a JSON number carries exactly.
pub const MAX_OFFSET: u64 = (1 << 53) - 1;

/// Arguments of `briq_exec` started with `async` (published).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AsyncExecArgs {
    #[serde(flatten)]
    pub exec: ExecArgs,
    #[serde(rename = "async")]
    pub started_async: bool,
}

/// Answer of `briq_exec` with `async` (assumed shape; published: "an exec id").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecStarted {
    pub exec: String,
}

/// Which stream of an async exec a read by offset follows (published: `stream`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    #[default]
    Stdout,
    Stderr,
}

/// Arguments of `briq_exec_result` (published).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecResultArgs {
    pub briq: String,
    pub exec: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(default)]
    pub stream: Stream,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// Arguments of `briq_exec_stop` (published).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecStopArgs {
    pub briq: String,
    pub exec: String,
}

/// Where an async exec stands (published: these five).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecState {
    Running,
    Exited,
    TimedOut,
    Stopped,
    Lost,
}

/// Answer of `briq_exec_result` and `briq_exec_stop` (assumed shape; published: the state,
/// the exit code, the last 64 KB of each stream, the path of the whole output, and with
/// `offset` the output from that byte and the offset to pass next).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecResult {
    pub exec: String,
    pub state: ExecState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The last [`MAX_OUTPUT_BYTES`] of each stream (without `offset`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// With `offset`: the stream's bytes from it (whole characters), and the offset to pass
    /// next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// Where the whole output is kept in the briq.
    pub stdout_path: String,
    pub stderr_path: String,
}

/// Outcome of a synchronous exec, as the client gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutput {
    /// `None` when the command was killed (its time limit, a signal) rather than exiting.
    pub exit_code: Option<i32>,
    /// The last [`MAX_OUTPUT_BYTES`] of each stream.
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
}

impl From<ExecAnswer> for ExecOutput {
    fn from(answer: ExecAnswer) -> Self {
        let timed_out = answer.exit_code == Some(TIMED_OUT_STATUS);
        Self {
            exit_code: answer.exit_code.filter(|_| !timed_out),
            stdout: answer.stdout,
            stderr: answer.stderr,
            timed_out,
        }
    }
}

/// Arguments of `briq_files_put` (published names).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FilesPutArgs {
    pub briq: String,
    /// Absolute, inside the briq.
    pub path: String,
    pub content_base64: String,
}

impl FilesPutArgs {
    pub fn new(briq: &str, path: &str, content: &[u8]) -> Self {
        Self {
            briq: briq.to_owned(),
            path: path.to_owned(),
            content_base64: BASE64.encode(content),
        }
    }

    pub fn content(&self) -> Result<Vec<u8>, base64::DecodeError> {
        BASE64.decode(&self.content_base64)
    }
}

/// Answer of `briq_files_put` (assumed shape; the SHA-256 is published).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FilesPutAnswer {
    pub path: String,
    pub size: u64,
    /// Lowercase hex SHA-256 of the bytes briq stored.
    pub sha256: String,
}

/// Arguments of `briq_files_get` (published names).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FilesGetArgs {
    pub briq: String,
    pub path: String,
}

/// Answer of `briq_files_get` for a file that is not an image (assumed shape; base64 is
/// published). An image comes back as an image content item instead (published), whose
/// `data` is the same base64.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FilesGetAnswer {
    pub path: String,
    pub content_base64: String,
}

impl FilesGetAnswer {
    pub fn new(path: &str, content: &[u8]) -> Self {
        Self {
            path: path.to_owned(),
            content_base64: BASE64.encode(content),
        }
    }
}

/// Decodes base64 content as briq sends it.
pub fn decode_base64(content: &str) -> Result<Vec<u8>, base64::DecodeError> {
    BASE64.decode(content)
}

/// The text of a tool error (`isError: true`), assumed to be `{"error": {"code", "message"}}`;
/// any other text is kept as the message with the code [`ErrorCode::Other`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
}

/// Error codes of a tool error (assumed: briq publishes no catalogue), plus the JSON-RPC
/// errors every MCP server answers for a request it refuses before acting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    NotFound,
    Unauthorized,
    Forbidden,
    InvalidRequest,
    PaymentRequired,
    PlanLimit,
    QuotaExceeded,
    PolicyViolation,
    RateLimited,
    Unavailable,
    Internal,
    /// JSON-RPC -32700, -32600, -32601, -32602: the message, the method or the arguments were
    /// refused before any tool ran.
    InvalidParams,
    /// A code this build does not know; the layer it came from still classifies the error.
    #[serde(other)]
    Other,
}

impl ErrorCode {
    /// Refusals that no retry can fix: they need a plan change or a different request.
    pub fn is_account_refusal(self) -> bool {
        matches!(
            self,
            Self::PaymentRequired | Self::PlanLimit | Self::QuotaExceeded | Self::PolicyViolation
        )
    }

    /// Refusals made before the tool acted: a command refused with one never ran.
    pub fn refused_before_acting(self) -> bool {
        matches!(
            self,
            Self::NotFound
                | Self::Unauthorized
                | Self::Forbidden
                | Self::InvalidRequest
                | Self::InvalidParams
                | Self::RateLimited
        )
    }

    /// The code of a JSON-RPC error: the standard refusals, else a server error.
    pub fn of_json_rpc(code: i64) -> Self {
        match code {
            -32700 | -32600 | -32601 | -32602 => Self::InvalidParams,
            _ => Self::Internal,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = serde_json::to_value(self).map_err(|_| std::fmt::Error)?;
        f.write_str(name.as_str().ok_or(std::fmt::Error)?)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn request(timeout: Duration) -> ExecRequest {
        ExecRequest {
            argv: vec!["python3".into(), "x y".into()],
            cwd: Some("/work".into()),
            env: BTreeMap::from([("A".into(), "1".into())]),
            timeout,
            stdin: Some("in".into()),
        }
    }

    #[test]
    fn the_working_directory_and_the_limit_travel_in_the_command() {
        let args = ExecArgs::from_request("bq_1", &request(Duration::from_millis(1500)));
        assert_eq!(
            args.cmd,
            ["sh", "-c", EXEC_PRELUDE, "2", "/work", "python3", "x y"]
        );
        assert_eq!(args.env, BTreeMap::from([("A".into(), "1".into())]));
        assert_eq!(args.stdin.as_deref(), Some("in"));
        let unwrapped = Unwrapped::of(&args.cmd).unwrap();
        assert_eq!(unwrapped.timeout, Duration::from_secs(2));
        assert_eq!(unwrapped.cwd, "/work");
        assert_eq!(unwrapped.argv, ["python3", "x y"]);
        assert_eq!(Unwrapped::of(&["python3".to_owned()]), None);
    }

    #[test]
    fn the_prelude_runs_in_its_directory_within_its_limit() {
        let root = tempfile::tempdir().unwrap();
        let run = |request: &ExecRequest| {
            let args = ExecArgs::from_request("bq_1", request);
            std::process::Command::new(&args.cmd[0])
                .args(&args.cmd[1..])
                .env(LOCAL_ROOT_ENV, root.path())
                .output()
                .unwrap()
        };
        let mut pwd = request(Duration::from_secs(5));
        pwd.argv = vec!["pwd".into()];
        pwd.cwd = Some("/work/new".into());
        let out = run(&pwd);
        let expected = root.path().join("work/new").canonicalize().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            expected.display().to_string()
        );
        let mut slow = request(Duration::from_secs(1));
        slow.argv = vec!["sleep".into(), "30".into()];
        let started = std::time::Instant::now();
        let out = run(&slow);
        assert_eq!(out.status.code(), Some(TIMED_OUT_STATUS));
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn the_timeout_status_reads_as_timed_out() {
        let answer = |code| ExecAnswer {
            exit_code: code,
            stdout: String::new(),
            stderr: String::new(),
        };
        let out = ExecOutput::from(answer(Some(TIMED_OUT_STATUS)));
        assert!(out.timed_out);
        assert_eq!(out.exit_code, None);
        let out = ExecOutput::from(answer(Some(1)));
        assert!(!out.timed_out);
        assert_eq!(out.exit_code, Some(1));
        assert!(!ExecOutput::from(answer(None)).timed_out);
    }

    /// The argument names each tool's type serializes, all optional fields set.
    fn serialized_names(value: impl Serialize) -> BTreeSet<String> {
        serde_json::to_value(value)
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    }

    #[test]
    fn what_the_conformance_check_holds_is_what_the_types_send() {
        let create = CreateSandbox {
            name: "n".into(),
            image: "i".into(),
            size: Some("small".into()),
            sleep: "30m".into(),
            env: BTreeMap::from([("A".into(), "1".into())]),
        };
        let briq = || BriqArgs {
            briq: "bq_1".into(),
        };
        let sent: BTreeMap<&str, BTreeSet<String>> = BTreeMap::from([
            (tools::RUN, serialized_names(RunArgs { create, wait: true })),
            (tools::LIST, serialized_names(ListArgs { all: true })),
            (tools::STATUS, serialized_names(briq())),
            (
                tools::EXEC,
                // The async exec's arguments are the synchronous exec's and `async`.
                serialized_names(AsyncExecArgs {
                    exec: ExecArgs::from_request("bq_1", &request(Duration::ZERO)),
                    started_async: true,
                }),
            ),
            (
                tools::EXEC_RESULT,
                serialized_names(ExecResultArgs {
                    briq: "bq_1".into(),
                    exec: "ex_1".into(),
                    offset: Some(0),
                    stream: Stream::Stdout,
                    wait_ms: Some(1),
                    max_bytes: Some(1),
                }),
            ),
            (
                tools::EXEC_STOP,
                serialized_names(ExecStopArgs {
                    briq: "bq_1".into(),
                    exec: "ex_1".into(),
                }),
            ),
            (
                tools::FILES_PUT,
                serialized_names(FilesPutArgs::new("bq_1", "/p", b"x")),
            ),
            (
                tools::FILES_GET,
                serialized_names(FilesGetArgs {
                    briq: "bq_1".into(),
                    path: "/p".into(),
                }),
            ),
            (tools::STOP, serialized_names(briq())),
            (tools::START, serialized_names(briq())),
            (tools::DESTROY, serialized_names(briq())),
            (
                tools::FORK,
                serialized_names(ForkArgs {
                    briq: "bq_1".into(),
                    name: "n".into(),
                    sleep: "1h".into(),
                    wait: true,
                }),
            ),
        ]);
        let declared: BTreeMap<&str, BTreeSet<String>> = SENT
            .iter()
            .map(|(tool, names)| (*tool, names.iter().map(|n| n.to_string()).collect()))
            .collect();
        assert_eq!(declared, sent);
    }

    #[test]
    fn omitted_size_and_empty_env_are_not_sent() {
        let args = RunArgs {
            create: CreateSandbox {
                name: "n".into(),
                image: "python".into(),
                size: None,
                sleep: "30m".into(),
                env: BTreeMap::new(),
            },
            wait: true,
        };
        assert_eq!(
            serde_json::to_value(&args).unwrap(),
            serde_json::json!({"name": "n", "image": "python", "sleep": "30m", "wait": true})
        );
    }

    #[test]
    fn unknown_error_codes_still_parse() {
        let body: ToolErrorBody =
            serde_json::from_str(r#"{"error":{"code":"brand_new","message":"m"}}"#).unwrap();
        assert_eq!(body.error.code, ErrorCode::Other);
    }

    #[test]
    fn json_rpc_refusals_are_made_before_acting() {
        for code in [-32700, -32600, -32601, -32602] {
            assert!(
                ErrorCode::of_json_rpc(code).refused_before_acting(),
                "{code}"
            );
        }
        for code in [-32603, -32000, 1] {
            assert!(
                !ErrorCode::of_json_rpc(code).refused_before_acting(),
                "{code}"
            );
        }
    }

    #[test]
    fn names_print_as_on_the_wire() {
        assert_eq!(SandboxState::Sleeping.to_string(), "sleeping");
        assert_eq!(ErrorCode::QuotaExceeded.to_string(), "quota_exceeded");
    }
}
