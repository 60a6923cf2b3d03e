//! The briq operations the operator uses, as a trait ([`SandboxApi`]) apart from the MCP client
//! that implements it.

use super::api::{CreateSandbox, ExecOutput, ExecRequest, ExecResult, ExecResultArgs, Sandbox};
use super::error::Result;
use super::key::ApiKey;

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

    /// Forks sandbox `source` under `name` and waits until the fork runs: the source's image,
    /// size, environment and boot files, its own address, fresh processes; what the source wrote
    /// to its own disk stays with it. Never retried: on an `Uncertain` or `Malformed` error the
    /// fork may exist.
    fn fork_sandbox(
        &self,
        key: &ApiKey,
        source: &str,
        name: &str,
        sleep: &str,
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

    /// Stops a sandbox: its processes end, its disk is kept, and it answers no exec or file
    /// call until started again. Idempotent (stopping a stopped sandbox is done), so retried.
    fn stop_sandbox(&self, key: &ApiKey, id: &str) -> impl Future<Output = Result<Sandbox>> + Send;

    /// Starts a stopped sandbox and waits until it runs (its processes start over, its disk as
    /// it was). Idempotent, so retried.
    fn start_sandbox(&self, key: &ApiKey, id: &str)
    -> impl Future<Output = Result<Sandbox>> + Send;

    /// Runs a command synchronously. Never retried: on an `Uncertain` error it may have run.
    fn exec(
        &self,
        key: &ApiKey,
        id: &str,
        request: &ExecRequest,
    ) -> impl Future<Output = Result<ExecOutput>> + Send;

    /// Starts a command that goes on after the call answers, and answers its exec id. Never
    /// retried: on an `Uncertain` error it may have started.
    fn exec_async(
        &self,
        key: &ApiKey,
        id: &str,
        request: &ExecRequest,
    ) -> impl Future<Output = Result<String>> + Send;

    /// Where a command started by [`exec_async`](Self::exec_async) stands and, with
    /// `offset`, its output from that byte, waiting up to `wait_ms` for output to come.
    /// Reads only, so retried.
    fn exec_result(
        &self,
        key: &ApiKey,
        arguments: &ExecResultArgs,
    ) -> impl Future<Output = Result<ExecResult>> + Send;

    /// Stops a command started by [`exec_async`](Self::exec_async) and every process it
    /// started. Idempotent, so retried.
    fn exec_stop(
        &self,
        key: &ApiKey,
        id: &str,
        exec: &str,
    ) -> impl Future<Output = Result<ExecResult>> + Send;

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

    /// How many API keys briq does not answer now ([`health`](super::health)).
    fn unreachable_keys(&self) -> usize {
        0
    }

    /// How many API keys meet a server whose MCP interface differs from what the operator
    /// sends ([`conformance`](super::conformance)).
    fn mismatched_keys(&self) -> usize {
        0
    }
}
