//! Scenario 7: scale on simulated sandboxes (the local sandbox server's simulated mode: no
//! kernels, the server answers the bridge's commands itself), so that what is measured is the
//! operator and the API server. Per point: N executors created at once → all Ready; then M
//! Executions on each, all created at once → all finished (a [`scaling::burst`]).

use std::time::Instant;

use anyhow::Context as _;
use kube::Api;
use serde::Serialize;
use serde_json::json;

use super::{
    memory::{self, Operator},
    objects::{self, FirstSeen},
    scaling::{self, Burst, Scale, Workload},
    stats::Summary,
};
use crate::{progress::Progress, stack::Stack};
use briq_operator::crd::{BriqExecutor, Execution};

/// Takes the simulated kernel 5 ms; a simulated run outputs the code's last line.
const CODE: &str = "# sleep-ms: 5\n1 + 1";
const OUTPUT: &str = "1 + 1";

/// The targets shown beside the figures (at 1,000 executors × 10): issue 16's Ready time and
/// throughput, issue 28's API cost and share of the API server's ceiling.
pub const TARGET_READY_SECONDS: f64 = 30.0;
pub const TARGET_EXECUTIONS_PER_SECOND: f64 = 200.0;
pub const TARGET_WRITES_PER_EXECUTION: f64 = 2.0;
pub const TARGET_READS_PER_EXECUTION: f64 = 0.1;
pub const TARGET_CEILING_SHARE: f64 = 0.9;
/// One replica is not the limit: the operator spends less CPU per Execution than the API
/// server it drives, and keeps less than this many cores busy at 1,000 × 10.
pub const TARGET_OPERATOR_CORES: f64 = 1.0;

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
    /// The CPU the operator process and the API server (kube-apiserver + etcd) used while the
    /// executors got Ready.
    pub ready_cpu: Cpu,
    /// The Executions, measured once every executor was Ready.
    pub executions: Option<Burst>,
    /// The CPU used while they ran.
    pub executions_cpu: Option<Cpu>,
}

/// CPU time (user + system, from `/proc`) over a phase, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Cpu {
    /// The operator process (`briq-operator run`, the release binary).
    pub operator_ms: f64,
    /// kube-apiserver and etcd.
    pub api_server_ms: f64,
    /// The phase's wall time, for the cores each kept busy.
    pub wall_ms: f64,
}

impl Cpu {
    /// The operator's CPU per object of the phase (an executor made Ready, an Execution run).
    pub fn operator_per(&self, count: usize) -> f64 {
        self.operator_ms / count.max(1) as f64
    }

    pub fn api_server_per(&self, count: usize) -> f64 {
        self.api_server_ms / count.max(1) as f64
    }

    /// The cores the operator kept busy on average.
    pub fn operator_cores(&self) -> f64 {
        self.operator_ms / self.wall_ms.max(1e-9)
    }
}

/// Where a phase's CPU is read from: the operator process and the API server's processes.
struct CpuMeter {
    operator: u32,
    api_server: Vec<u32>,
}

/// A reading of [`CpuMeter`]: ticks of each, and when.
struct CpuReading {
    operator: u64,
    api_server: u64,
    at: Instant,
}

impl CpuMeter {
    fn read(&self) -> CpuReading {
        CpuReading {
            operator: memory::cpu_ticks(self.operator),
            api_server: self
                .api_server
                .iter()
                .map(|pid| memory::cpu_ticks(*pid))
                .sum(),
            at: Instant::now(),
        }
    }

    fn since(&self, start: &CpuReading) -> Cpu {
        let now = self.read();
        let ms = |ticks: u64| ticks as f64 * 1000.0 / memory::ticks_per_second();
        Cpu {
            operator_ms: ms(now.operator.saturating_sub(start.operator)),
            api_server_ms: ms(now.api_server.saturating_sub(start.api_server)),
            wall_ms: (now.at - start.at).as_secs_f64() * 1000.0,
        }
    }
}

pub async fn point(stack: &Stack, progress: &Progress, scale: Scale) -> anyhow::Result<Point> {
    let (count, bound) = (scale.executors, scale.bound);
    progress.step(format!(
        "7/9: {count} executors on simulated sandboxes, then {} Executions each, all created \
         at once",
        scale.actions
    ));
    let name = format!("bench-simulated-{count}");
    stack.namespace(&name).await?;
    // A process of its own, the release binary as a platform runs it, so that its CPU can be
    // read apart from the benchmark's.
    let logs = tempfile::tempdir()?;
    let operator = Operator::start_in(
        stack,
        &memory::operator_binary()?,
        &logs.path().join("operator.log"),
        &name,
        &[],
    )?;
    let plane = stack
        .plane()
        .context("scenario 7 needs the local control plane")?;
    let meter = CpuMeter {
        operator: operator.pid(),
        api_server: ["kube-apiserver", "etcd"]
            .iter()
            .filter_map(|process| plane.pid(process))
            .collect(),
    };
    let executors: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), &name);
    let executions: Api<Execution> = Api::namespaced(stack.admin().clone(), &name);
    let names: Vec<String> = (0..count).map(|i| format!("e-{i:04}")).collect();

    let ready = FirstSeen::start(executors.clone(), objects::ready).await?;
    let before_ready = meter.read();
    let first_create = Instant::now();
    let plan = names
        .iter()
        .map(|name| objects::executor(name, json!({})))
        .collect::<anyhow::Result<Vec<BriqExecutor>>>()?;
    let created = objects::create_all(&executors, plan, Some(first_create + bound)).await?;
    let all_ready = ready.wait_for(count, first_create, bound).await;
    let ready_cpu = meter.since(&before_ready);
    let ended = Instant::now();
    let ready_at = ready.times();
    drop(ready);
    let last_ready = match all_ready {
        true => ready_at.values().max().copied().unwrap_or(first_create),
        false => ended,
    };

    let (executions, executions_cpu) = if all_ready {
        let workload = Workload {
            per_executor: scale.actions,
            code: CODE,
            output: OUTPUT,
        };
        let before = meter.read();
        let burst =
            scaling::burst(stack, (&executors, &executions), &names, &workload, bound).await?;
        (Some(burst), Some(meter.since(&before)))
    } else {
        (None, None)
    };
    operator.alive()?;
    // The executors stay: deleting a thousand would take the bench's time, and their simulated
    // sandboxes cost nothing (they go with the server).
    operator.stop().await;
    Ok(Point {
        executors: count,
        actions_per_executor: scale.actions,
        ready: ready_at.len(),
        ready_seconds: (last_ready - first_create).as_secs_f64(),
        ready_ms: Summary::of_millis(&scaling::latencies(&created, &ready_at)),
        ready_cpu,
        executions,
        executions_cpu,
    })
}

/// What the API server alone sustains of the requests one Execution needs (its create and two
/// status writes: `Running`, the result), issued by the benchmark as fast as it can with no
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
    use kube::api::PostParams;

    progress.step(format!(
        "7: the API server alone, {count} Executions' requests (create, 2 status writes)"
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
