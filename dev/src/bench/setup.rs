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
