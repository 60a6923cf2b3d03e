//! `usage [-n NAMESPACE]`: what a namespace uses of each BriqExecutorClass, against the class's
//! per-namespace limits, counted as the operator counts it (`usage::usage`).

use std::{collections::BTreeMap, sync::Arc};

use kube::{Api, api::ListParams};

use super::{
    cluster::{Cluster, NamespaceArg},
    error::Error,
    exit::Exit,
    output::emit,
    table,
};
use crate::{
    crd::{BriqExecutor, BriqExecutorClass, Execution, NamespaceLimits},
    usage::{self, Usage},
};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    namespace: NamespaceArg,
}

/// What is known of a class's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limits {
    Known(NamespaceLimits),
    /// The class does not exist (any more).
    Missing,
    /// This user may not read classes.
    Unreadable,
}

/// One per column of [`rows`]: a header for every column, or the table drops the last.
const HEADERS: &[&str] = &[
    "CLASS",
    "EXECUTORS",
    "WAITING",
    "RUNNING",
    "WAITING",
    "QUEUED",
];

/// Every object `api` lists, as the operator's usage count takes them.
async fn listed<K>(api: Api<K>) -> Result<Vec<Arc<K>>, Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api.list(&ListParams::default()).await?;
    Ok(list.items.into_iter().map(Arc::new).collect())
}

pub async fn run(args: Args) -> Result<Exit, Error> {
    let cluster = Cluster::connect(args.namespace).await?;
    let executors: Vec<Arc<BriqExecutor>> = listed(cluster.api()).await?;
    let executions: Vec<Arc<Execution>> = listed(cluster.api()).await?;
    let usage = usage::usage(&executors, &executions);
    if usage.is_empty() {
        let note = format!(
            "No BriqExecutor in namespace {} uses a BriqExecutorClass.\n",
            cluster.namespace
        );
        emit("", &note);
        return Ok(Exit::Ok);
    }
    let classes: Api<BriqExecutorClass> = Api::all(cluster.client.clone());
    let mut limits = BTreeMap::new();
    for name in usage.keys() {
        let known = match classes.get_opt(name).await {
            Ok(Some(class)) => Limits::Known(class.spec.per_namespace.unwrap_or_default()),
            Ok(None) => Limits::Missing,
            Err(kube::Error::Api(status)) if status.code == 403 => Limits::Unreadable,
            Err(error) => return Err(error.into()),
        };
        limits.insert(name.clone(), known);
    }
    emit(&table::render(HEADERS, &rows(&usage, &limits)), "");
    Ok(Exit::Ok)
}

/// One row per class: executors holding a sandbox (of the most allowed), those waiting for a
/// place, Executions running (of the most allowed), those waiting for a place, and those not
/// started yet (of the most allowed).
pub fn rows(
    usage: &BTreeMap<String, Usage>,
    limits: &BTreeMap<String, Limits>,
) -> Vec<Vec<String>> {
    usage
        .iter()
        .map(|(name, used)| {
            let limit = limits.get(name).unwrap_or(&Limits::Unreadable);
            let of = |count: usize, max: fn(&NamespaceLimits) -> Option<u32>| match limit {
                Limits::Known(known) => match max(known) {
                    Some(max) => format!("{count}/{max}"),
                    None => count.to_string(),
                },
                Limits::Missing => format!("{count} (no such class)"),
                Limits::Unreadable => format!("{count}/?"),
            };
            vec![
                name.clone(),
                of(used.executors, |l| l.max_executors),
                used.executors_waiting.to_string(),
                of(used.running, |l| l.max_running_executions),
                used.executions_waiting.to_string(),
                of(used.queued, |l| l.max_queued_executions),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_against_its_limits() {
        let usage = BTreeMap::from([
            (
                "capped".to_owned(),
                Usage {
                    executors: 2,
                    executors_waiting: 1,
                    running: 4,
                    executions_waiting: 3,
                    queued: 5,
                },
            ),
            ("gone".to_owned(), Usage::default()),
            ("hidden".to_owned(), Usage::default()),
            (
                "open".to_owned(),
                Usage {
                    running: 7,
                    ..Usage::default()
                },
            ),
        ]);
        let limits = BTreeMap::from([
            (
                "capped".to_owned(),
                Limits::Known(NamespaceLimits {
                    max_executors: Some(2),
                    max_running_executions: Some(4),
                    max_queued_executions: Some(10),
                }),
            ),
            ("gone".to_owned(), Limits::Missing),
            ("hidden".to_owned(), Limits::Unreadable),
            ("open".to_owned(), Limits::Known(NamespaceLimits::default())),
        ]);
        let got = rows(&usage, &limits);
        assert!(got.iter().all(|row| row.len() == HEADERS.len()));
        let got: Vec<Vec<&str>> = got
            .iter()
            .map(|r| r.iter().map(String::as_str).collect())
            .collect();
        assert_eq!(
            got,
            vec![
                vec!["capped", "2/2", "1", "4/4", "3", "5/10"],
                vec![
                    "gone",
                    "0 (no such class)",
                    "0",
                    "0 (no such class)",
                    "0",
                    "0 (no such class)"
                ],
                vec!["hidden", "0/?", "0", "0/?", "0", "0/?"],
                vec!["open", "0", "0", "7", "0", "0"],
            ]
        );
    }
}
