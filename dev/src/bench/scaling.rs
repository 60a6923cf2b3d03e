//! Scenario 3: throughput and scaling. N ready executors, M Executions each, all created at
//! once; executions per second and the latency of each (create → `Succeeded` seen by one watch
//! over the namespace).

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use kube::{Api, ResourceExt, api::ListParams};
use serde::Serialize;
use serde_json::json;

use super::{
    audit,
    objects::{self, FirstSeen},
    setup::OPERATOR_USER,
    stats::{Summary, millis},
};
use crate::{
    local_server::LocalServer,
    progress::Progress,
    stack::{Controllers, Stack},
};
use briq_operator::{
    briq::SandboxApi,
    crd::{BriqExecutor, Execution},
};

/// What every Execution runs here, on real kernels.
const CODE: &str = "1 + 1";
/// Executors provisioned at once, per CPU (kernel start-ups compete for the CPU, and have a
/// deadline).
const PROVISION_AT_ONCE_PER_CPU: usize = 2;

#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub executors: usize,
    pub actions_per_executor: usize,
    #[serde(flatten)]
    pub burst: Burst,
    /// Not part of the figures: how long getting the executors ready took, and how many setups
    /// failed on the way (and were repeated).
    pub provision_seconds: f64,
    pub setup_failures: usize,
}

/// What a burst runs: so many Executions of `code` per executor, each to give `output`.
pub struct Workload<'a> {
    pub per_executor: usize,
    pub code: &'a str,
    pub output: &'a str,
}

/// Executions created all at once on ready executors, and how they went.
#[derive(Debug, Clone, Serialize)]
pub struct Burst {
    pub executions: usize,
    /// How many finished within the bound (`--point-bound`); `complete` when all did.
    pub finished: usize,
    pub complete: bool,
    /// First create sent → last `Succeeded` seen (or the bound, for a partial burst).
    pub wall_seconds: f64,
    pub executions_per_second: f64,
    pub latency_ms: Option<Summary>,
    /// The operator's API requests (audit log) from the first create to the last result, per
    /// Execution: queued Executions are reconciled again as their predecessors finish.
    pub reads_per_execution: f64,
    pub writes_per_execution: f64,
    /// Those requests by verb and resource, per Execution (in the JSON only).
    pub requests_per_execution: BTreeMap<String, f64>,
    /// The operator's requests the API server answered with a 5xx or 429 meanwhile.
    pub api_errors: u64,
    /// Why the finished Executions' outputs could not be checked, if they could not.
    pub unverified: Option<String>,
}

/// One point of a scaling scenario: so many executors, so many Executions on each, each phase
/// of the point within `bound`.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub executors: usize,
    pub actions: usize,
    pub bound: Duration,
}

impl Scale {
    /// A point per number of executors.
    pub fn each(executors: &[usize], actions: usize, bound_seconds: u64) -> Vec<Scale> {
        let bound = Duration::from_secs(bound_seconds);
        executors
            .iter()
            .map(|&executors| Scale {
                executors,
                actions,
                bound,
            })
            .collect()
    }
}

/// A point's namespace with the controllers (in this process) scoped to it, the APIs of its
/// objects and the names of its executors.
pub struct PointNamespace {
    pub operator: Controllers,
    pub executors: Api<BriqExecutor>,
    pub executions: Api<Execution>,
    pub names: Vec<String>,
}

impl PointNamespace {
    /// Namespace `name`, its controllers on `server`, names for `count` executors.
    pub async fn create(
        stack: &Stack,
        name: &str,
        server: &LocalServer,
        count: usize,
    ) -> anyhow::Result<PointNamespace> {
        stack.namespace(name).await?;
        Ok(PointNamespace {
            operator: super::setup::controllers(stack, name, server)?,
            executors: Api::namespaced(stack.admin().clone(), name),
            executions: Api::namespaced(stack.admin().clone(), name),
            names: (0..count).map(|i| format!("e-{i:04}")).collect(),
        })
    }
}

pub async fn point(stack: &Stack, progress: &Progress, scale: Scale) -> anyhow::Result<Point> {
    let (count, actions) = (scale.executors, scale.actions);
    progress.step(format!(
        "3/9: {count} executors x {actions} Executions, all created at once"
    ));
    let name = format!("bench-scale-{count}");
    let namespace = PointNamespace::create(stack, &name, stack.server(), count).await?;
    let (executors, names) = (&namespace.executors, &namespace.names);
    let provision = Instant::now();
    let at_once =
        PROVISION_AT_ONCE_PER_CPU * std::thread::available_parallelism().map_or(1, |n| n.get());
    let setup_failures = objects::create_ready(executors, names, &json!({}), at_once).await?;
    let provision_seconds = provision.elapsed().as_secs_f64();

    let workload = Workload {
        per_executor: actions,
        code: CODE,
        output: "2",
    };
    let executions = &namespace.executions;
    let burst = burst(
        stack,
        (executors, executions),
        names,
        &workload,
        scale.bound,
    )
    .await?;
    if burst.complete {
        objects::delete_executors(executors).await?;
        namespace.operator.stop().await;
    } else {
        // Behind (the API server likely saturated): stopped at once.
        drop(namespace.operator);
        // Destroy the sandboxes directly, so that their kernels do not outlive the point.
        let all = ListParams::default();
        for executor in retried(|| executors.list(&all)).await? {
            if let Some(id) = executor.status.and_then(|s| s.sandbox_id) {
                let _ = stack
                    .sandbox_client()
                    .destroy_sandbox(stack.key(), &id)
                    .await;
            }
        }
    }
    Ok(Point {
        executors: count,
        actions_per_executor: actions,
        burst,
        provision_seconds,
        setup_failures,
    })
}

/// Creates the workload's Executions on the ready `executors` (round-robin, so that each has
/// its first action early), all at once, and measures until every one finished or `bound`
/// passed; checks that the finished ones gave the workload's output. An operator that did not
/// finish them all (`complete` false) is behind, the API server likely saturated: the caller
/// stops it at once.
pub async fn burst(
    stack: &Stack,
    (executor_api, executions): (&Api<BriqExecutor>, &Api<Execution>),
    names: &[String],
    workload: &Workload<'_>,
    bound: Duration,
) -> anyhow::Result<Burst> {
    let seen = FirstSeen::start(executions.clone(), objects::finished).await?;
    let total = names.len() * workload.per_executor;
    // Created as the agent client creates them: owned by their executor from the start.
    let mut executors = std::collections::HashMap::new();
    for executor in executor_api.list(&ListParams::default()).await? {
        executors.insert(executor.name_any(), executor);
    }
    let executors = &executors;
    let plan = (0..workload.per_executor).flat_map(|k| {
        names.iter().map(move |name| {
            let executor = executors
                .get(name)
                .with_context(|| format!("executor {name} is not listed"))?;
            objects::execution_of(&format!("x-{name}-{k:03}"), executor, workload.code)
        })
    });
    let plan = plan.collect::<anyhow::Result<Vec<Execution>>>()?;
    let audit_log = stack
        .plane()
        .and_then(|plane| plane.audit_log())
        .context("the control plane has no audit log")?
        .to_owned();
    let from = audit::offset(&audit_log)?;
    let first_create = Instant::now();
    // Past the bound, what is not created yet counts as unfinished.
    let started = objects::create_all(executions, plan, Some(first_create + bound)).await?;
    let complete = seen.wait_for(total, first_create, bound).await;
    let ended = Instant::now();
    let seen = {
        let times = seen.times();
        drop(seen);
        times
    };
    let requests = audit::count(&audit_log, from, audit::offset(&audit_log)?, OPERATOR_USER)?;
    let last = match complete {
        true => seen.values().max().copied().unwrap_or(first_create),
        false => ended,
    };
    let latencies = latencies(&started, &seen);
    let unverified = verify(executions, workload.output)
        .await
        .err()
        .map(|e| format!("{e:#}"));
    let wall_seconds = (last - first_create).as_secs_f64();
    let finished = seen.len();
    let per_execution = |count: u64| count as f64 / finished.max(1) as f64;
    let burst = Burst {
        executions: total,
        finished,
        complete,
        wall_seconds,
        executions_per_second: finished as f64 / wall_seconds.max(1e-9),
        latency_ms: Summary::of_millis(&latencies),
        reads_per_execution: per_execution(requests.reads),
        writes_per_execution: per_execution(requests.writes),
        requests_per_execution: requests
            .by_request
            .iter()
            .map(|(what, count)| (what.clone(), per_execution(*count)))
            .collect(),
        api_errors: requests.errors,
        unverified,
    };
    Ok(burst)
}

/// Start → end in milliseconds of every object that has both.
pub fn latencies(started: &HashMap<String, Instant>, ended: &HashMap<String, Instant>) -> Vec<f64> {
    started
        .iter()
        .filter_map(|(name, at)| ended.get(name).map(|done| millis(*done - *at)))
        .collect()
}

/// Checks that every finished Execution of the namespace gave `expected` (listed in pages).
async fn verify(api: &Api<Execution>, expected: &str) -> anyhow::Result<()> {
    let mut params = ListParams::default().limit(500);
    loop {
        let page = retried(|| api.list(&params)).await?;
        for execution in &page.items {
            if objects::finished(execution) {
                objects::check_output(execution, expected)?;
            }
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(()),
        }
    }
}

/// `call`, repeated twice on failure after a pause (the API server may still be catching up).
async fn retried<T, F, Fut>(call: F) -> kube::Result<T>
where
    F: Fn() -> Fut,
    Fut: Future<Output = kube::Result<T>>,
{
    let mut attempt = 0;
    loop {
        match call().await {
            Err(_) if attempt < 2 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            other => return other,
        }
    }
}
