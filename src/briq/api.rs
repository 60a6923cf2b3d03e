//! The briq REST surface: every path, query parameter and JSON body, in one place.
//!
//! **Assumed, not confirmed.** briq publishes its Python SDK and MCP tools, not its REST paths
//! or field names (see `shared/reference/briq-api.md`). What is confirmed: bearer auth, the base
//! URL, `bq_` ids, the state names, sleep as a string, exec as argv + env + stdin with a 60 s
//! synchronous limit and the last 64 KiB of output kept, files as absolute path + base64 (≤ 1 MB)
//! answered with their SHA-256, a request id on every answer and the error codes named in
//! [`ErrorCode`]. Everything else here — paths, field names, the error body, how timeout and cwd
//! travel, the create answer — is a guess. The client and the local sandbox server both use these
//! definitions, so matching the live service is a change to this file only.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
// jiff as re-exported by k8s-openapi: the same version the CRDs use, no second copy.
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Where briq answers unless configured otherwise (confirmed).
pub const DEFAULT_BASE_URL: &str = "https://api.briq.cloud";

/// Response header carrying briq's request id (assumed name; the id itself is confirmed).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Longest synchronous exec briq allows (confirmed: the MCP exec tool blocks at most 60 s).
pub const MAX_EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest file briq accepts or returns in one call (confirmed: 1 MB per file).
pub const MAX_FILE_BYTES: usize = 1024 * 1024;

/// How much of each output stream briq keeps (confirmed: the last 64 KB).
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// Route templates, in axum's `{param}` syntax so the local server routes on the very strings
/// the client fills in.
pub mod paths {
    pub const SANDBOXES: &str = "/v1/sandboxes";
    pub const SANDBOX: &str = "/v1/sandboxes/{id}";
    pub const EXEC: &str = "/v1/sandboxes/{id}/exec";
    pub const FILES: &str = "/v1/sandboxes/{id}/files";
    pub const PREVIEW: &str = "/v1/sandboxes/{id}/preview/{port}";
    pub const STOP: &str = "/v1/sandboxes/{id}/stop";
    pub const START: &str = "/v1/sandboxes/{id}/start";
}

/// Lifecycle states of a sandbox (the names are confirmed).
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

/// A sandbox as briq describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// `POST /v1/sandboxes`.
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
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// Answer of `GET /v1/sandboxes?name=…`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}

/// Query of `GET /v1/sandboxes`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListQuery {
    pub name: Option<String>,
}

/// A command to run synchronously in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// Run as is, never through a shell: use `["sh", "-c", …]` for shell features.
    pub argv: Vec<String>,
    /// Absolute path inside the sandbox; briq's default when `None`.
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    /// At most [`MAX_EXEC_TIMEOUT`]; sent rounded up to whole seconds.
    pub timeout: Duration,
    pub stdin: Option<String>,
}

/// Body of `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecBody {
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub timeout_seconds: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
}

impl From<&ExecRequest> for ExecBody {
    fn from(request: &ExecRequest) -> Self {
        // Rounding down could turn a sub-second timeout into 0, which means "no time at all".
        let timeout_seconds =
            request.timeout.as_secs() + u64::from(request.timeout.subsec_nanos() > 0);
        Self {
            argv: request.argv.clone(),
            cwd: request.cwd.clone(),
            env: request.env.clone(),
            timeout_seconds,
            stdin: request.stdin.clone(),
        }
    }
}

/// Outcome of a synchronous exec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutput {
    /// `None` when the command was killed (timeout, signal) rather than exiting.
    pub exit_code: Option<i32>,
    /// The last [`MAX_OUTPUT_BYTES`] of each stream.
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
}

/// A file as it travels: the body of `PUT /v1/sandboxes/{id}/files` and the answer of
/// `GET /v1/sandboxes/{id}/files`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileContent {
    pub path: String,
    pub content_base64: String,
}

impl FileContent {
    pub fn new(path: &str, content: &[u8]) -> Self {
        Self {
            path: path.to_owned(),
            content_base64: BASE64.encode(content),
        }
    }

    pub fn content(&self) -> Result<Vec<u8>, base64::DecodeError> {
        BASE64.decode(&self.content_base64)
    }
}

/// Answer of `PUT /v1/sandboxes/{id}/files`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriteFileAnswer {
    pub path: String,
    pub size: u64,
    /// Lowercase hex SHA-256 of the bytes briq stored.
    pub sha256: String,
}

/// Query of `GET /v1/sandboxes/{id}/files`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileQuery {
    pub path: String,
}

/// Answer of `GET /v1/sandboxes/{id}/preview/{port}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreviewAnswer {
    pub url: String,
}

/// Body of every error answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// Error codes; the four plan/policy ones are confirmed, the rest assumed.
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
    /// A code this build does not know; the HTTP status still classifies the error.
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
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = serde_json::to_value(self).map_err(|_| std::fmt::Error)?;
        f.write_str(name.as_str().ok_or(std::fmt::Error)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_timeout_rounds_up_to_whole_seconds() {
        let request = ExecRequest {
            argv: vec!["true".into()],
            cwd: None,
            env: BTreeMap::new(),
            timeout: Duration::from_millis(1500),
            stdin: None,
        };
        assert_eq!(ExecBody::from(&request).timeout_seconds, 2);
    }

    #[test]
    fn omitted_size_is_not_sent() {
        let body = CreateSandbox {
            name: "n".into(),
            image: "python".into(),
            size: None,
            sleep: "30m".into(),
            env: BTreeMap::new(),
        };
        let json = serde_json::to_value(&body).unwrap();
        assert!(json.get("size").is_none());
    }

    #[test]
    fn unknown_error_codes_still_parse() {
        let body: ErrorBody =
            serde_json::from_str(r#"{"error":{"code":"brand_new","message":"m"}}"#).unwrap();
        assert_eq!(body.error.code, ErrorCode::Other);
    }

    #[test]
    fn names_print_as_on_the_wire() {
        assert_eq!(SandboxState::Sleeping.to_string(), "sleeping");
        assert_eq!(ErrorCode::QuotaExceeded.to_string(), "quota_exceeded");
    }
}
