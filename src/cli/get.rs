//! `get [executors|executions|pools] [-n NAMESPACE | -A]`: tables with the columns worth
//! reading.

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
use crate::crd::{BriqExecutor, BriqExecutorPool, Execution};

#[derive(clap::Args)]
pub struct Args {
    /// What to list [default: executors and executions].
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
    #[value(aliases = ["pool", "briqexecutorpools", "briqexecutorpool", "bqp"])]
    Pools,
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

impl Listed for BriqExecutorPool {
    const PLURAL: &str = "BriqExecutorPools";
    const HEADERS: &[&str] = &[
        "NAME", "SIZED BY", "TARGET", "CURRENT", "READY", "CLAIMS", "COLD", "AGE",
    ];

    fn row(&self, now: Timestamp) -> Vec<String> {
        pool_row(self, &age(self, now))
    }
}

/// A pool's row: how it is sized (`replicas N`, or `demand MIN-MAX`), what it aims for and
/// holds, and, sized by demand, the claims of its window and how many of them went cold.
fn pool_row(pool: &BriqExecutorPool, age: &str) -> Vec<String> {
    let status = pool.status.clone().unwrap_or_default();
    let sized_by = match pool.spec.max_ready {
        Some(max) => format!("demand {}-{max}", pool.spec.min_ready.unwrap_or(0)),
        None => format!("replicas {}", pool.spec.replicas),
    };
    let demand = status.demand.as_ref();
    vec![
        pool.name_any(),
        sized_by,
        or_dash(status.target_replicas.map(|t| t.to_string())),
        status.replicas.to_string(),
        status.ready_replicas.to_string(),
        or_dash(demand.map(|d| d.claims_in_window.to_string())),
        or_dash(demand.map(|d| d.cold_in_window.to_string())),
        age.to_owned(),
    ]
}

pub async fn run(args: Args) -> Result<Exit, Error> {
    let cluster = Cluster::connect(args.namespace).await?;
    let scope = match args.all_namespaces {
        true => None,
        false => Some(cluster.namespace.as_str()),
    };
    let kinds = match args.kind {
        Some(kind) => vec![kind],
        None => vec![Kind::Executors, Kind::Executions],
    };
    let mut listings = Vec::new();
    for kind in kinds {
        listings.push(match kind {
            Kind::Executors => list::<BriqExecutor>(&cluster, scope).await?,
            Kind::Executions => list::<Execution>(&cluster, scope).await?,
            Kind::Pools => list::<BriqExecutorPool>(&cluster, scope).await?,
        });
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(spec: serde_json::Value, status: serde_json::Value) -> BriqExecutorPool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutorPool",
            "metadata": { "name": "warm", "namespace": "team" },
            "spec": spec, "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_pool_row_says_how_it_is_sized_what_it_aims_for_and_how_many_claims_went_cold() {
        let fixed = pool(
            serde_json::json!({ "replicas": 3, "template": {} }),
            serde_json::json!({ "replicas": 3, "readyReplicas": 2, "targetReplicas": 3 }),
        );
        assert_eq!(
            pool_row(&fixed, "5m"),
            ["warm", "replicas 3", "3", "3", "2", "-", "-", "5m"]
        );
        let by_demand = pool(
            serde_json::json!({ "replicas": 0, "maxReady": 8, "minReady": 1, "template": {} }),
            serde_json::json!({
                "replicas": 4, "readyReplicas": 4, "targetReplicas": 4,
                "demand": { "claimsInWindow": 12, "coldInWindow": 1, "peakPerRefill": 4,
                            "refillMillis": 1500 },
            }),
        );
        assert_eq!(
            pool_row(&by_demand, "1h"),
            ["warm", "demand 1-8", "4", "4", "4", "12", "1", "1h"]
        );
        let new = pool(
            serde_json::json!({ "replicas": 2, "template": {} }),
            serde_json::json!({}),
        );
        assert_eq!(
            pool_row(&new, "1s"),
            ["warm", "replicas 2", "-", "0", "0", "-", "-", "1s"]
        );
    }
}
