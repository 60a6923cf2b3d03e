//! Scenario 7: scale on simulated sandboxes (the local sandbox server's simulated mode: no
//! kernels, the server answers the bridge's commands itself), so that what is measured is the
//! operator and the API server. Per point: N executors created at once → all Ready; then M
//! Executions on each, all created at once → all finished (a [`scaling::burst`]).

use std::time::Instant;

use serde::Serialize;
use serde_json::json;

use super::{
    objects::{self, FirstSeen},
    scaling::{self, Burst, PointNamespace, Scale, Workload},
    stats::Summary,
};
use crate::{progress::Progress, stack::Stack};
use briq_operator::crd::BriqExecutor;

/// Takes the simulated kernel 5 ms; a simulated run outputs the code's last line.
const CODE: &str = "# sleep-ms: 5\n1 + 1";
const OUTPUT: &str = "1 + 1";

/// The targets of issue 16, shown beside the figures (at 1,000 executors × 10).
pub const TARGET_READY_SECONDS: f64 = 30.0;
pub const TARGET_EXECUTIONS_PER_SECOND: f64 = 200.0;
pub const TARGET_WRITES_PER_EXECUTION: f64 = 3.0;
pub const TARGET_READS_PER_EXECUTION: f64 = 1.0;

#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub executors: usize,
    pub actions_per_executor: usize,
    /// How many executors were Ready within the bound.
    pub ready: usize,
    /// First create sent → last executor Ready (or the bound, when not all were).
    pub ready_seconds: f64,
    /// Create → Ready, per executor.
    pub ready_ms: Option<Summary>,
    /// The Executions, measured once every executor was Ready.
    pub executions: Option<Burst>,
}

pub async fn point(stack: &Stack, progress: &Progress, scale: Scale) -> anyhow::Result<Point> {
    let (count, bound) = (scale.executors, scale.bound);
    progress.step(format!(
        "7/9: {count} executors on simulated sandboxes, then {} Executions each, all created \
         at once",
        scale.actions
    ));
    let name = format!("bench-simulated-{count}");
    let namespace = PointNamespace::create(stack, &name, stack.simulated_server(), count).await?;
    let (executors, names) = (&namespace.executors, &namespace.names);

    let ready = FirstSeen::start(executors.clone(), objects::ready).await?;
    let first_create = Instant::now();
    let plan = names
        .iter()
        .map(|name| objects::executor(name, json!({})))
        .collect::<anyhow::Result<Vec<BriqExecutor>>>()?;
    let created = objects::create_all(executors, plan, Some(first_create + bound)).await?;
    let all_ready = ready.wait_for(count, first_create, bound).await;
    let ended = Instant::now();
    let ready_at = ready.times();
    drop(ready);
    let last_ready = match all_ready {
        true => ready_at.values().max().copied().unwrap_or(first_create),
        false => ended,
    };

    let (executions, operator) = if all_ready {
        let workload = Workload {
            per_executor: scale.actions,
            code: CODE,
            output: OUTPUT,
        };
        let apis = (&namespace.executors, &namespace.executions);
        let (burst, operator) =
            scaling::burst(stack, namespace.operator, apis, names, &workload, bound).await?;
        (Some(burst), operator)
    } else {
        (None, None)
    };
    // The executors stay: deleting a thousand would take the bench's time, and their simulated
    // sandboxes cost nothing (they go with the server). An operator that fell behind was
    // stopped at once; one that kept up finishes what it started.
    if let Some(operator) = operator {
        operator.stop().await;
    }
    Ok(Point {
        executors: count,
        actions_per_executor: scale.actions,
        ready: ready_at.len(),
        ready_seconds: (last_ready - first_create).as_secs_f64(),
        ready_ms: Summary::of_millis(&scaling::latencies(&created, &ready_at)),
        executions,
    })
}

/// What the API server alone sustains of the requests one Execution needs (its create, the
/// turn's LIST and two status writes), issued by the benchmark as fast as it can with no
/// operator running: the ceiling scenario 7's throughput can reach on this machine.
#[derive(Debug, Clone, Serialize)]
pub struct ApiCeiling {
    pub executions: usize,
    /// Requests in flight at once.
    pub concurrency: usize,
    pub seconds: f64,
    pub executions_per_second: f64,
}

/// Requests in flight at once for [`api_ceiling`]: what the operator may have (256 Execution
/// reconciles) is more than the API server takes usefully on 2 CPUs.
const CEILING_CONCURRENCY: usize = 64;

pub async fn api_ceiling(
    stack: &Stack,
    progress: &Progress,
    count: usize,
) -> anyhow::Result<ApiCeiling> {
    use futures::{StreamExt as _, TryStreamExt as _};
    use kube::{
        Api,
        api::{ListParams, PostParams},
    };

    progress.step(format!(
        "7: the API server alone, {count} Executions' requests (create, LIST, 2 status writes)"
    ));
    let name = "bench-api-ceiling";
    stack.namespace(name).await?;
    let executions: Api<briq_operator::crd::Execution> =
        Api::namespaced(stack.admin().clone(), name);
    let executions = &executions;
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| async move {
            let executor = format!("e-{:04}", i % 1_000);
            let execution = objects::execution(&format!("c-{i:05}"), &executor, CODE)?;
            let created = executions
                .create(&PostParams::default(), &execution)
                .await?;
            let selector = format!("spec.executorRef.name={executor}");
            executions
                .list_metadata(&ListParams::default().fields(&selector))
                .await?;
            for reason in ["Running", "Completed"] {
                let status = json!({ "conditions": [{
                    "type": "Succeeded", "status": "Unknown", "reason": reason,
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
                }] });
                let name = created.metadata.name.clone().unwrap_or_default();
                objects::apply_execution_status(executions, &name, status).await?;
            }
            Ok::<_, anyhow::Error>(())
        })
        .buffer_unordered(CEILING_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(ApiCeiling {
        executions: count,
        concurrency: CEILING_CONCURRENCY,
        seconds,
        executions_per_second: count as f64 / seconds.max(1e-9),
    })
}
