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
        "7/7: {count} executors on simulated sandboxes, then {} Executions each, all created \
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
        let (operator, executions) = (namespace.operator, &namespace.executions);
        let (burst, operator) =
            scaling::burst(stack, operator, executions, names, &workload, bound).await?;
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
