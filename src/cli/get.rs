//! `get [executors|executions] [-n NAMESPACE | -A]`: tables with the columns worth reading.

use k8s_openapi::{NamespaceResourceScope, jiff::Timestamp};
use kube::{Api, Resource, ResourceExt, api::ListParams};

use super::{
    cluster::{Cluster, NamespaceArg},
    error::Error,
    exit::Exit,
    output::emit,
    status::{condition, succeeded},
    table::{self, age, duration, or_dash},
};
use crate::crd::{BriqExecutor, Execution};

#[derive(clap::Args)]
pub struct Args {
    /// What to list [default: both].
    kind: Option<Kind>,

    #[command(flatten)]
    namespace: NamespaceArg,

    /// List across all namespaces.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    all_namespaces: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Kind {
    #[value(aliases = ["executor", "briqexecutors", "briqexecutor", "bqe"])]
    Executors,
    #[value(aliases = ["execution", "bqx"])]
    Executions,
}

/// A kind listed as a table.
pub(super) trait Listed: Resource<Scope = NamespaceResourceScope, DynamicType = ()> {
    /// Plural, as in "No BriqExecutors found".
    const PLURAL: &str;
    const HEADERS: &[&str];
    fn row(&self, now: Timestamp) -> Vec<String>;
}

impl Listed for BriqExecutor {
    const PLURAL: &str = "BriqExecutors";
    const HEADERS: &[&str] = &["NAME", "READY", "REASON", "SANDBOX", "EXECUTIONS", "AGE"];

    fn row(&self, now: Timestamp) -> Vec<String> {
        let status = self.status.clone().unwrap_or_default();
        let ready = condition(&status.conditions, "Ready");
        vec![
            self.name_any(),
            or_dash(ready.map(|c| c.status.clone())),
            or_dash(ready.map(|c| c.reason.clone())),
            or_dash(status.sandbox_id),
            status.executions_total.unwrap_or(0).to_string(),
            age(self, now),
        ]
    }
}

impl Listed for Execution {
    const PLURAL: &str = "Executions";
    const HEADERS: &[&str] = &["NAME", "EXECUTOR", "SUCCEEDED", "REASON", "DURATION", "AGE"];

    fn row(&self, now: Timestamp) -> Vec<String> {
        let succeeded = succeeded(self);
        vec![
            self.name_any(),
            self.spec.executor_ref.name.clone(),
            or_dash(succeeded.map(|c| c.status.clone())),
            or_dash(succeeded.map(|c| c.reason.clone())),
            duration(self, now),
            age(self, now),
        ]
    }
}

pub async fn run(args: Args) -> Result<Exit, Error> {
    let cluster = Cluster::connect(args.namespace).await?;
    let scope = match args.all_namespaces {
        true => None,
        false => Some(cluster.namespace.as_str()),
    };
    let mut listings = Vec::new();
    if args.kind != Some(Kind::Executions) {
        listings.push(list::<BriqExecutor>(&cluster, scope).await?);
    }
    if args.kind != Some(Kind::Executors) {
        listings.push(list::<Execution>(&cluster, scope).await?);
    }
    let mut tables = Vec::new();
    let mut notes = String::new();
    for listing in listings {
        match listing {
            Listing::Table(table) => tables.push(table),
            Listing::Empty(note) => notes.push_str(&note),
        }
    }
    emit(&tables.join("\n"), &notes);
    Ok(Exit::Ok)
}

enum Listing {
    Table(String),
    /// Nothing to list: a line for stderr, as kubectl does.
    Empty(String),
}

async fn list<K>(cluster: &Cluster, namespace: Option<&str>) -> Result<Listing, Error>
where
    K: Listed + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let api: Api<K> = match namespace {
        Some(namespace) => Api::namespaced(cluster.client.clone(), namespace),
        None => Api::all(cluster.client.clone()),
    };
    let objects = api.list(&ListParams::default()).await?.items;
    if objects.is_empty() {
        let place = namespace.map_or("any namespace".into(), |ns| format!("namespace {ns}"));
        return Ok(Listing::Empty(format!(
            "No {} found in {place}.\n",
            K::PLURAL
        )));
    }
    let now = Timestamp::now();
    let mut headers = K::HEADERS.to_vec();
    let rows: Vec<Vec<String>> = objects
        .iter()
        .map(|object| {
            let mut row = object.row(now);
            if namespace.is_none() {
                row.insert(0, object.namespace().unwrap_or_default());
            }
            row
        })
        .collect();
    if namespace.is_none() {
        headers.insert(0, "NAMESPACE");
    }
    Ok(Listing::Table(table::render(&headers, &rows)))
}
