//! What runs in a sandbox and what it stores: exec, file writes and file reads, as both surfaces
//! perform them (each surface only reads its arguments and words its answer).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest as _, Sha256};

use super::async_exec::Start;
use super::http::ApiError;
use super::paths::resolve;
use super::process::{self, CommandSpec};
use super::state::Shared;
use briq_operator::bridge::NONCE_ENV;
use briq_operator::briq::api::{ExecOutput, LOCAL_ROOT_ENV, MAX_FILE_BYTES};

/// A command to run in a sandbox.
pub(crate) struct Command {
    pub(crate) argv: Vec<String>,
    /// Absolute path inside the sandbox, made when missing.
    pub(crate) cwd: String,
    /// Laid over the sandbox's own environment.
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) stdin: Option<String>,
    /// Past it the process group is killed and the output says `timed_out`.
    pub(crate) timeout: Duration,
    /// Tell the command where the sandbox's `/` is on the host ([`LOCAL_ROOT_ENV`]): the MCP
    /// exec prelude `cd`s there, since a sandbox here is a directory, not a machine.
    pub(crate) tell_root: bool,
}

/// Runs `command` in sandbox `id` (woken if asleep), or answers it from the simulation.
pub(crate) async fn exec(
    shared: &Arc<Shared>,
    id: &str,
    mut command: Command,
) -> Result<ExecOutput, ApiError> {
    if command.argv.is_empty() {
        return Err(ApiError::invalid("the command is empty"));
    }
    let entry = shared.entry(id)?;
    entry.wake()?;
    let cwd = resolve(&entry.fs, &command.cwd).map_err(|e| ApiError::invalid(e.to_string()))?;
    tokio::fs::create_dir_all(&cwd)
        .await
        .map_err(|e| ApiError::invalid(format!("cannot create cwd: {e}")))?;
    if let Some(simulator) = &shared.simulator {
        let nonce = command.env.get(NONCE_ENV).map(String::as_str);
        return Ok(simulator
            .exec(
                &entry.simulated,
                &cwd,
                &command.argv,
                nonce,
                command.stdin.as_deref(),
                command.timeout,
            )
            .await);
    }
    if command.tell_root {
        command.env.insert(
            LOCAL_ROOT_ENV.to_owned(),
            entry.fs.to_string_lossy().into_owned(),
        );
    }
    let spec = CommandSpec {
        argv: command.argv,
        cwd,
        env: entry.command_env(shared, &command.env),
        stdin: command.stdin,
        timeout: command.timeout,
    };
    Ok(process::run(spec, || !entry.is_destroyed()).await)
}

/// Starts `argv` as an async exec in sandbox `id` (woken if asleep); its exec id.
pub(crate) async fn exec_async(
    shared: &Arc<Shared>,
    id: &str,
    argv: Vec<String>,
    env: &BTreeMap<String, String>,
    stdin: Option<String>,
) -> Result<String, ApiError> {
    if shared.simulator.is_some() {
        return Err(ApiError::invalid(
            "async exec runs real processes; simulated sandboxes do not have them",
        ));
    }
    let entry = shared.entry(id)?;
    entry.wake()?;
    let start = Start {
        sandbox: id.to_owned(),
        fs: entry.fs.clone(),
        argv,
        env: entry.command_env(shared, env),
        stdin,
    };
    shared.execs.start(start, || !entry.is_destroyed()).await
}

/// What a file write stored.
pub(crate) struct Written {
    pub(crate) size: u64,
    /// Lowercase hex SHA-256 of the bytes stored.
    pub(crate) sha256: String,
}

/// Writes `content` at `path` in sandbox `id`, making its parent directories.
pub(crate) async fn write_file(
    shared: &Shared,
    id: &str,
    path: &str,
    content: &[u8],
) -> Result<Written, ApiError> {
    if content.len() > MAX_FILE_BYTES {
        return Err(ApiError::invalid(format!(
            "file is {} bytes, the limit is {MAX_FILE_BYTES}",
            content.len()
        )));
    }
    let entry = shared.entry(id)?;
    entry.wake()?;
    let host = resolve(&entry.fs, path).map_err(|e| ApiError::invalid(e.to_string()))?;
    if let Some(parent) = host.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| ApiError::invalid(format!("cannot create parent directory: {e}")))?;
    }
    tokio::fs::write(&host, content)
        .await
        .map_err(|e| ApiError::invalid(format!("cannot write {path}: {e}")))?;
    Ok(Written {
        size: content.len() as u64,
        sha256: format!("{:x}", Sha256::digest(content)),
    })
}

/// The content of the file at `path` in sandbox `id`.
pub(crate) async fn read_file(shared: &Shared, id: &str, path: &str) -> Result<Vec<u8>, ApiError> {
    let entry = shared.entry(id)?;
    entry.wake()?;
    let host = resolve(&entry.fs, path).map_err(|e| ApiError::invalid(e.to_string()))?;
    let metadata = tokio::fs::metadata(&host)
        .await
        .map_err(|_| ApiError::not_found(format!("no file {path}")))?;
    if !metadata.is_file() {
        return Err(ApiError::invalid(format!("{path} is not a file")));
    }
    if metadata.len() > MAX_FILE_BYTES as u64 {
        return Err(ApiError::invalid(format!(
            "{path} is {} bytes, the limit is {MAX_FILE_BYTES}",
            metadata.len()
        )));
    }
    tokio::fs::read(&host)
        .await
        .map_err(|e| ApiError::invalid(format!("cannot read {path}: {e}")))
}
