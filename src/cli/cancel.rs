//! `cancel EXECUTION`: sets the Execution's `spec.cancel`. The operator then claims an attempt
//! not sent yet (it never runs) or interrupts the running one in its kernel; the Execution ends
//! `Cancelled`, unless it finished first. With `--wait`, prints the result as `logs` does.

use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;

use super::{
    cluster::ExecutionArg,
    error::Error,
    exit::Exit,
    logs::{await_finished, print},
    status::succeeded,
};
use crate::crd::Execution;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: ExecutionArg,

    /// Wait (on a watch) until the Execution has ended, and print its result as `logs` does.
    #[arg(long)]
    wait: bool,
}

pub async fn run(args: Args) -> Result<Exit, Error> {
    let (cluster, executions, named) = args.target.connect().await?;
    let name = &named;
    let cancelled =
        request_cancel(&executions, name)
            .await?
            .ok_or_else(|| Error::ExecutionNotFound {
                name: name.clone(),
                namespace: cluster.namespace.clone(),
            })?;
    match succeeded(&cancelled).filter(|c| c.status != "Unknown") {
        Some(ended) => eprintln!(
            "execution/{name} had already ended ({}); nothing to cancel",
            ended.reason
        ),
        None => eprintln!("execution/{name} cancel requested"),
    }
    if !args.wait {
        return Ok(Exit::Ok);
    }
    let execution = await_finished(&executions, name, &cluster.namespace).await?;
    Ok(print(&execution, super::live::Shown::Nothing))
}

/// Sets `spec.cancel` (a merge patch: idempotent, and it cannot be withdrawn); `None` when the
/// Execution does not exist.
pub async fn request_cancel(
    executions: &Api<Execution>,
    name: &str,
) -> Result<Option<Execution>, Error> {
    let patch = Patch::Merge(json!({ "spec": { "cancel": true } }));
    match executions
        .patch(name, &PatchParams::default(), &patch)
        .await
    {
        Ok(execution) => Ok(Some(execution)),
        Err(kube::Error::Api(response)) if response.code == 404 => Ok(None),
        Err(error) => Err(error.into()),
    }
}
