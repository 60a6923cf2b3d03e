//! Client for the briq sandbox API.
//!
//! [`BriqClient`] is the one implementation of [`SandboxApi`], in production and in the tests,
//! which run it against the local sandbox server of the `briq-dev` crate. The controllers'
//! decisions are unit-tested as pure functions, without any sandbox. The wire format lives in
//! [`api`], most of it assumed.
//!
//! Retries: `get`, `list`, `destroy`, `write_file`, `read_file` and `preview_url` are repeated on
//! [`ErrorClass::Retryable`] errors (3 attempts, exponential backoff with jitter, Retry-After
//! honoured). `create_sandbox` and `exec` are never repeated: a failed create may have created a
//! sandbox (look it up by [`sandbox_name`]), a failed exec may have run: whether it can have is
//! [`Error::exec_outcome`], not [`ErrorClass`] (a 5xx is worth retrying for a GET, yet a gateway
//! may answer it after the sandbox ran the command).

pub mod api;
mod client;
mod error;
pub mod health;
mod key;
mod name;
mod retry;

pub use api::{CreateSandbox, ExecOutput, ExecRequest, Sandbox, SandboxState};
pub use client::{BriqClient, ClientOptions, NewClientError};
pub use error::{Error, ErrorClass, ExecOutcome};
pub use key::{ApiKey, InvalidApiKey, leaked_pieces};
pub use name::{sandbox_name, sandbox_name_prefix};

use url::Url;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What `destroy_sandbox` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestroyOutcome {
    Destroyed,
    /// briq answered 404: destroyed earlier, by us or someone else.
    AlreadyGone,
}

/// The briq operations the operator uses. Every call takes the key, because keys come from a
/// Secret per executor rather than from the client.
pub trait SandboxApi: Send + Sync {
    /// Creates a sandbox and waits until it runs. Never retried: on an `Uncertain` or
    /// `Malformed` error the sandbox may exist.
    fn create_sandbox(
        &self,
        key: &ApiKey,
        request: &CreateSandbox,
    ) -> impl Future<Output = Result<Sandbox>> + Send;

    /// Sandboxes named exactly `name`; names are not unique.
    fn find_sandboxes_by_name(
        &self,
        key: &ApiKey,
        name: &str,
    ) -> impl Future<Output = Result<Vec<Sandbox>>> + Send;

    /// Every sandbox the key's account holds (the orphan sweeper picks its own by name).
    fn list_sandboxes(&self, key: &ApiKey) -> impl Future<Output = Result<Vec<Sandbox>>> + Send;

    fn get_sandbox(&self, key: &ApiKey, id: &str) -> impl Future<Output = Result<Sandbox>> + Send;

    fn destroy_sandbox(
        &self,
        key: &ApiKey,
        id: &str,
    ) -> impl Future<Output = Result<DestroyOutcome>> + Send;

    /// Runs a command synchronously. Never retried: on an `Uncertain` error it may have run.
    fn exec(
        &self,
        key: &ApiKey,
        id: &str,
        request: &ExecRequest,
    ) -> impl Future<Output = Result<ExecOutput>> + Send;

    /// Writes a file (parents created) and checks briq's SHA-256 of it against ours.
    fn write_file(
        &self,
        key: &ApiKey,
        id: &str,
        path: &str,
        content: &[u8],
    ) -> impl Future<Output = Result<()>> + Send;

    fn read_file(
        &self,
        key: &ApiKey,
        id: &str,
        path: &str,
    ) -> impl Future<Output = Result<Vec<u8>>> + Send;

    fn preview_url(
        &self,
        key: &ApiKey,
        id: &str,
        port: u16,
    ) -> impl Future<Output = Result<Url>> + Send;

    /// How many API keys briq does not answer now ([`health`]).
    fn unreachable_keys(&self) -> usize {
        0
    }
}
