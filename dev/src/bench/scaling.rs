//! Scenario 3: throughput and scaling. N ready executors, M Executions each, all created at
//! once; executions per second and the latency of each (create → `Succeeded` seen by one watch
//! over the namespace).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt, stream};
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
    runtime::watcher,
};
use serde::Serialize;
use serde_json::json;

use super::{
    OPERATOR_USER, audit, objects,
    stats::{Summary, millis},
};
use crate::{progress::Progress, stack::Stack};
use briq_operator::{
    briq::SandboxApi,
    crd::{BriqExecutor, Execution},
};

const CODE: &str = "1 + 1";
/// Executors provisioned at once, per CPU (kernel start-ups compete for the CPU, and have a
/// deadline).
const PROVISION_AT_ONCE_PER_CPU: usize = 2;
/// Create calls in flight at once.
const CREATES_AT_ONCE: usize = 32;

#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub executors: usize,
    pub actions_per_executor: usize,
    pub executions: usize,
    /// How many finished within the bound (`--point-bound`); `complete` when all did.
    pub finished: usize,
    pub complete: bool,
    /// First create sent → last `Succeeded` seen (or the bound, for a partial point).
    pub wall_seconds: f64,
    pub executions_per_second: f64,
    pub latency_ms: Option<Summary>,
    /// The operator's API requests (audit log) from the first create to the last result, per
    /// Execution: queued Executions are reconciled again as their predecessors finish.
    pub reads_per_execution: f64,
    pub writes_per_execution: f64,
    /// The operator's requests the API server answered with a 5xx or 429 meanwhile.
    pub api_errors: u64,
    /// Why the finished Executions' outputs could not be checked, if they could not.
    pub unverified: Option<String>,
    /// Not part of the figures: how long getting the executors ready took, and how many setups
    /// failed on the way (and were repeated).
    pub provision_seconds: f64,
    pub setup_failures: usize,
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
            "3/6: {executors} executors x {actions} Executions, all created at once"
        ));
        match point(stack, executors, actions, bound).await {
            Ok(point) => results.push(point),
            Err(error) => {
                progress.step(format!(
                    "3: the {executors}-executor point failed: {error:#}"
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
    let namespace = format!("bench-scale-{count}");
    stack.namespace(&namespace).await?;
    let operator = super::controllers(stack, &namespace, stack.server())?;
    let executors: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), &namespace);
    let executions: Api<Execution> = Api::namespaced(stack.admin().clone(), &namespace);
    let names: Vec<String> = (0..count).map(|i| format!("e-{i:03}")).collect();
    let provision = Instant::now();
    let at_once =
        PROVISION_AT_ONCE_PER_CPU * std::thread::available_parallelism().map_or(1, |n| n.get());
    let setup_failures = objects::create_ready(&executors, &names, &json!({}), at_once).await?;
    let provision_seconds = provision.elapsed().as_secs_f64();

    // One watch sees every Execution finish; it is running before the first create.
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let (synced_tx, synced) = tokio::sync::oneshot::channel::<()>();
    let observer = tokio::spawn({
        let (api, seen) = (executions.clone(), Arc::clone(&seen));
        async move {
            let mut synced_tx = Some(synced_tx);
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                let object = match event {
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = synced_tx.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
                    _ => continue,
                };
                if objects::finished(&object) {
                    let now = Instant::now();
                    seen.lock()
                        .expect("poisoned")
                        .entry(object.name_any())
                        .or_insert(now);
                }
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), synced)
        .await
        .context("the watch of Executions did not start")??;

    // Round-robin over the executors, so that each has its first action early.
    let total = count * actions;
    let plan: Vec<(String, String)> = (0..actions)
        .flat_map(|k| {
            names
                .iter()
                .map(move |executor| (format!("x-{executor}-{k:03}"), executor.clone()))
        })
        .collect();
    let audit_log = stack
        .plane()
        .and_then(|plane| plane.audit_log())
        .context("the control plane has no audit log")?
        .to_owned();
    let from = audit::offset(&audit_log)?;
    let first_create = Instant::now();
    let started: HashMap<String, Instant> = stream::iter(&plan)
        .map(|(name, executor)| {
            let api = executions.clone();
            async move {
                let object = objects::execution(name, executor, CODE)?;
                let at = Instant::now();
                api.create(&PostParams::default(), &object).await?;
                Ok::<_, anyhow::Error>((name.clone(), at))
            }
        })
        .buffer_unordered(CREATES_AT_ONCE)
        .try_collect()
        .await?;
    let complete = loop {
        if seen.lock().expect("poisoned").len() >= total {
            break true;
        }
        if first_create.elapsed() > bound {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    observer.abort();
    // When the operator is behind (and the API server likely saturated), stop it at once.
    let operator = complete.then_some(operator);
    let requests = audit::count(&audit_log, from, audit::offset(&audit_log)?, OPERATOR_USER)?;
    let seen = seen.lock().expect("poisoned").clone();
    let last = match complete {
        true => seen.values().max().copied().unwrap_or(first_create),
        false => Instant::now(),
    };
    let latencies: Vec<f64> = started
        .iter()
        .filter_map(|(name, at)| seen.get(name).map(|done| millis(*done - *at)))
        .collect();
    let unverified = verify(&executions).await.err().map(|e| format!("{e:#}"));
    if let Some(operator) = operator {
        objects::delete_executors(&executors).await?;
        operator.stop().await;
    } else {
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
    let wall_seconds = (last - first_create).as_secs_f64();
    let finished = seen.len();
    Ok(Point {
        executors: count,
        actions_per_executor: actions,
        executions: total,
        finished,
        complete,
        wall_seconds,
        executions_per_second: finished as f64 / wall_seconds.max(1e-9),
        latency_ms: Summary::of_millis(&latencies),
        reads_per_execution: requests.reads as f64 / finished.max(1) as f64,
        writes_per_execution: requests.writes as f64 / finished.max(1) as f64,
        api_errors: requests.errors,
        unverified,
        provision_seconds,
        setup_failures,
    })
}

/// Checks that every finished Execution of the namespace gave `2` (listed in pages).
async fn verify(api: &Api<Execution>) -> anyhow::Result<()> {
    let mut params = ListParams::default().limit(500);
    loop {
        let page = retried(|| api.list(&params)).await?;
        for execution in &page.items {
            if objects::finished(execution) {
                objects::check_two(execution)?;
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
