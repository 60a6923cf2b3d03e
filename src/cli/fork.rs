//! `fork SOURCE [--count N]`: creates N BriqExecutors with `spec.forkFrom: SOURCE`, each with
//! the source's spec (its class, key, image and limits: a fork is briq's fork of the source's
//! sandbox) and a name the API server generates (`SOURCE-fork-xxxxx`), and prints their names.
//! With `--wait`, waits until every fork is Ready with its source's Python state.

use std::time::Duration;

use kube::api::PostParams;

use super::{
    cluster::{Cluster, NamespaceArg},
    error::Error,
    exec::await_ready,
    exit::Exit,
};
use crate::crd::BriqExecutor;

/// The most forks one command makes (E2B's fork allows 100).
const MAX_COUNT: u32 = 100;

#[derive(clap::Args)]
pub struct Args {
    /// The BriqExecutor to fork.
    pub source: String,

    /// How many forks to make (1 to 100), all from one snapshot of the source.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_COUNT as i64))]
    pub count: u32,

    /// Wait until every fork is Ready, at most this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub wait: Option<u64>,

    #[command(flatten)]
    pub namespace: NamespaceArg,
}

pub async fn run(args: Args) -> Result<Exit, Error> {
    let cluster = Cluster::connect(args.namespace).await?;
    let executors = cluster.api::<BriqExecutor>();
    let source = executors
        .get_opt(&args.source)
        .await?
        .ok_or_else(|| Error::ExecutorNotFound {
            name: args.source.clone(),
            namespace: cluster.namespace.clone(),
        })?;
    let fork = source.fork();
    let mut names = Vec::new();
    for _ in 0..args.count {
        match executors.create(&PostParams::default(), &fork).await {
            Ok(created) => {
                let name = created.metadata.name.unwrap_or_default();
                println!("briqexecutor/{name}");
                names.push(name);
            }
            Err(error) => {
                return Err(Error::Fork(format!(
                    "created {} of {} forks of {}: {}",
                    names.len(),
                    args.count,
                    args.source,
                    Error::from(error)
                )));
            }
        }
    }
    if let Some(seconds) = args.wait {
        let timeout = Duration::from_secs(seconds);
        for name in &names {
            await_ready(&cluster, name, timeout, false).await?;
        }
        eprintln!("{} fork(s) of {} Ready", names.len(), args.source);
    }
    Ok(Exit::Ok)
}
