//! The previous release's REST wire types, exactly as its client sends and reads them. This
//! tree's operator speaks briq's MCP tools ([`briq_operator::briq::api`]); only this surface
//! uses these.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use briq_operator::briq::api::{self, ErrorCode, SandboxState};

/// Route templates, in axum's `{param}` syntax.
pub(crate) mod paths {
    pub const SANDBOXES: &str = "/v1/sandboxes";
    pub const SANDBOX: &str = "/v1/sandboxes/{id}";
    pub const EXEC: &str = "/v1/sandboxes/{id}/exec";
    pub const FILES: &str = "/v1/sandboxes/{id}/files";
    pub const PREVIEW: &str = "/v1/sandboxes/{id}/preview/{port}";
    pub const STOP: &str = "/v1/sandboxes/{id}/stop";
    pub const START: &str = "/v1/sandboxes/{id}/start";
}

/// A sandbox (snake_case, unlike the MCP answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sandbox {
    pub id: String,
    pub name: String,
    pub state: SandboxState,
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    pub sleep: String,
    pub created_at: Timestamp,
}

impl From<api::Sandbox> for Sandbox {
    fn from(sandbox: api::Sandbox) -> Self {
        Self {
            id: sandbox.id,
            name: sandbox.name,
            state: sandbox.state,
            image: sandbox.image,
            size: sandbox.size,
            sleep: sandbox.sleep,
            created_at: sandbox.created_at,
        }
    }
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateSandbox {
    pub name: String,
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    pub sleep: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

impl From<CreateSandbox> for api::CreateSandbox {
    fn from(create: CreateSandbox) -> Self {
        Self {
            name: create.name,
            image: create.image,
            size: create.size,
            sleep: create.sleep,
            env: create.env,
        }
    }
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

/// Answer of `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutput {
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
}

impl From<api::ExecOutput> for ExecOutput {
    fn from(output: api::ExecOutput) -> Self {
        Self {
            exit_code: output.exit_code,
            stdout: output.stdout,
            stderr: output.stderr,
            timed_out: output.timed_out,
        }
    }
}

/// Body of `PUT /v1/sandboxes/{id}/files` and answer of `GET /v1/sandboxes/{id}/files`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileContent {
    pub path: String,
    pub content_base64: String,
}

/// Answer of `PUT /v1/sandboxes/{id}/files`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriteFileAnswer {
    pub path: String,
    pub size: u64,
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

/// Body of every error answer (of the admin API too).
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
