//! What every scenario stands on: the stack, the operator's user in it, and the in-process
//! controllers acting as that user.

use crate::{
    local_server::LocalServer,
    progress::Progress,
    stack::{self, Controllers, Stack},
};

/// The operator's user name in the audit log: the in-process controllers and the memory
/// scenario's operator process act as this user (in `system:masters`).
pub const OPERATOR_USER: &str = "briq-operator";

/// What every scenario stands on: a local control plane with an audit log and a kubeconfig of
/// [`OPERATOR_USER`], the local sandbox server on the default venv, and one with simulated
/// sandboxes; the operator's aggregated API (live output, files) served in this process.
pub(super) async fn start_stack(progress: &Progress) -> anyhow::Result<Stack> {
    Stack::builder()
        .audit_log()
        .user(OPERATOR_USER, &["system:masters"])
        .sandbox_server()
        .simulated_sandbox_server()
        .aggregated_api()
        .progress(progress)
        .start()
        .await
}

/// The controllers, in this process as [`OPERATOR_USER`], for `namespace`, on `server`.
pub(super) fn controllers(
    stack: &Stack,
    namespace: &str,
    server: &LocalServer,
) -> anyhow::Result<Controllers> {
    let client = stack.user_client(OPERATOR_USER).clone();
    Controllers::start(client, server, stack::settings(Some(namespace), server))
}

/// Runs the client-side script `script` (relative to the repo) with the sandboxes' venv, the
/// stack's kubeconfig (`--kubeconfig` and `KUBECONFIG`) and `args`; the last line of its stdout
/// that parses as `T`, else its failure with the tail of its stderr.
pub(super) async fn python_script<T: serde::de::DeserializeOwned>(
    stack: &Stack,
    script: &str,
    args: &[String],
) -> anyhow::Result<T> {
    use anyhow::Context as _;
    let script = crate::repo::repo_root().join(script);
    let output = tokio::process::Command::new(stack.venv().join("bin/python"))
        .arg(&script)
        .arg("--kubeconfig")
        .arg(stack.kubeconfig())
        .args(args)
        .env("KUBECONFIG", stack.kubeconfig())
        .output()
        .await
        .with_context(|| format!("running {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if let Some(parsed) = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
    {
        return Ok(parsed);
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(12).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    anyhow::bail!(
        "{} {} failed ({}):\n{}",
        script.display(),
        args.join(" "),
        output.status,
        tail.join("\n")
    )
}
