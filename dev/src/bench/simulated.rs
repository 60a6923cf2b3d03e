//! Scenario 7: scale on simulated sandboxes (the local sandbox server's simulated mode: no
//! kernels, the server answers the bridge's commands itself), so that what is measured is the
//! operator and the API server. Per point: N executors created at once → all Ready; then M
//! Executions on each, all created at once → all finished (a [`scaling::burst`]).

use std::time::{Duration, Instant};

use kube::Api;
use serde::Serialize;
use serde_json::json;

use super::{
    objects::{self, FirstSeen},
    scaling::{self, Action, Burst},
    stats::Summary,
};
use crate::{progress::Progress, stack::Stack};
use briq_operator::crd::{BriqExecutor, Execution};

/// Takes the simulated kernel 5 ms; a simulated run outputs the code's last line.
const ACTION: Action = Action {
    code: "# sleep-ms: 5\n1 + 1",
    output: "1 + 1",
};

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

/// The points measured, and why the others failed (a failed point does not stop the next).
pub async fn run(
    stack: &Stack,
    progress: &Progress,
    points: &[usize],
    actions: usize,
    bound: Duration,
) -> (Vec<Point>, Vec<(usize, anyhow::Error)>) {
    let (mut results, mut failures) = (Vec::new(), Vec::new());
    for &executors in points {
        progress.step(format!(
            "7/7: {executors} executors on simulated sandboxes, then {actions} Executions each, \
             all created at once"
        ));
        match point(stack, executors, actions, bound).await {
            Ok(point) => results.push(point),
            Err(error) => {
                progress.step(format!(
                    "7: the {executors}-executor point failed: {error:#}"
                ));
                failures.push((executors, error));
            }
        }
    }
    (results, failures)
}

async fn point(
    stack: &Stack,
    count: usize,
    actions: usize,
    bound: Duration,
) -> anyhow::Result<Point> {
    let namespace = format!("bench-simulated-{count}");
    stack.namespace(&namespace).await?;
    let operator = super::controllers(stack, &namespace, stack.simulated_server())?;
    let executors: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), &namespace);
    let executions: Api<Execution> = Api::namespaced(stack.admin().clone(), &namespace);
    let names: Vec<String> = (0..count).map(|i| format!("s-{i:04}")).collect();

    let ready = FirstSeen::start(executors.clone(), objects::ready).await?;
    let first_create = Instant::now();
    let plan = names
        .iter()
        .map(|name| objects::executor(name, json!({})))
        .collect::<anyhow::Result<Vec<BriqExecutor>>>()?;
    let created = objects::create_all(&executors, plan, Some(first_create + bound)).await?;
    let all_ready = ready.wait_for(count, first_create, bound).await;
    let ended = Instant::now();
    let ready_at = ready.times();
    drop(ready);
    let last_ready = match all_ready {
        true => ready_at.values().max().copied().unwrap_or(first_create),
        false => ended,
    };

    let (executions, operator) = if all_ready {
        let (burst, operator) = scaling::burst(
            stack,
            operator,
            &executions,
            &names,
            actions,
            &ACTION,
            bound,
        )
        .await?;
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
        actions_per_executor: actions,
        ready: ready_at.len(),
        ready_seconds: (last_ready - first_create).as_secs_f64(),
        ready_ms: Summary::of_millis(&scaling::latencies(&created, &ready_at)),
        executions,
    })
}
