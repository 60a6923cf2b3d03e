//! `briq-dev bench` (`make bench`): starts a local control plane (audit log on), the local sandbox
//! server and the operator, measures per-action latency, agent step overhead, throughput and
//! scaling, API cost per Execution, the operator's memory and cold start, scale on simulated
//! sandboxes, and claims from warm pools against cold creates, prints the figures as a Markdown
//! table and writes them as JSON (`--out`), so two runs can be compared.
//!
//! Nothing here asserts a timing: it measures and reports. Every scenario runs in a namespace of
//! its own with the controllers (in this process, as user `briq-operator`) scoped to it, except
//! the memory scenario, which measures a separate `briq-operator run` process. The memory and
//! simulated-scale scenarios use the local sandbox server's simulated sandboxes (no kernels), so
//! that a thousand executors are really Ready; the warm-pool scenario uses them for its pools of
//! 10 and of a burst's size, and real kernels for a small pool; the others use real kernels.

mod agent;
mod audit;
mod cold_start;
mod fairness;
mod latency;
mod memory;
mod objects;
mod pools;
mod report;
mod scaling;
mod simulated;
mod stats;
mod traces;

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::Context as _;
use serde::Serialize;

pub use report::Machine;
pub use stats::Summary;

use crate::{
    local_server::LocalServer,
    progress::Progress,
    stack::{self, Controllers, Stack},
};

/// The operator's user name in the audit log: the in-process controllers and the memory
/// scenario's operator process act as this user (in `system:masters`).
pub const OPERATOR_USER: &str = "briq-operator";

/// What every scenario stands on: a local control plane with an audit log and a kubeconfig of
/// [`OPERATOR_USER`], the local sandbox server on the default venv, and one with simulated
/// sandboxes.
async fn start_stack(progress: &Progress) -> anyhow::Result<Stack> {
    Stack::builder()
        .audit_log()
        .user(OPERATOR_USER, &["system:masters"])
        .sandbox_server()
        .simulated_sandbox_server()
        .progress(progress)
        .start()
        .await
}

/// The controllers, in this process as [`OPERATOR_USER`], for `namespace`, on `server`.
fn controllers(
    stack: &Stack,
    namespace: &str,
    server: &LocalServer,
) -> anyhow::Result<Controllers> {
    let client = stack.user_client(OPERATOR_USER).clone();
    Controllers::start(client, server, stack::settings(Some(namespace), server))
}

/// Measure briq-operator on this machine and print the figures.
#[derive(Debug, clap::Parser)]
#[command(version)]
pub struct Args {
    /// Also write the figures as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,

    /// Scaled-down counts, for a smoke run of a few minutes.
    #[arg(long)]
    pub quick: bool,

    /// Scenario 3: a point ends at the latest this many seconds after its first create; what
    /// finished by then is reported as a partial point.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub point_bound: u64,

    /// Only these scenarios (1-10, comma separated; 4 is measured within 1) [default: all].
    #[arg(long, value_delimiter = ',', value_name = "N,…")]
    pub only: Vec<u8>,
}

/// How much each scenario does.
#[derive(Debug, Clone, Serialize)]
pub struct Counts {
    pub sequential_actions: usize,
    pub agent_steps: usize,
    pub scaling_executors: Vec<usize>,
    pub scaling_actions: usize,
    pub scaling_bound_seconds: u64,
    pub memory_executors: usize,
    pub memory_executions: usize,
    pub cold_start_runs: usize,
    /// Executions per round of scenario 9 (three rounds with traces off, three exported).
    pub traces_per_round: usize,
    pub simulated_executors: Vec<usize>,
    pub simulated_actions: usize,
    /// Scenario 7's bound of each phase of a point (executors getting Ready, Executions
    /// finishing): its targets need 1,000 Ready within 30 s and 10,000 Executions within 50 s,
    /// and a shorter bound keeps `make bench` within its budget when the operator is slower.
    pub simulated_bound_seconds: u64,
    /// Executions' worth of requests the API server is sent alone (scenario 7's ceiling).
    pub api_ceiling_executions: usize,
    /// Scenario 8: the simulated pool that claims come from one at a time, and how many claims
    /// (with as many cold creates beside).
    pub pool_replicas: usize,
    pub pool_claims: usize,
    /// Scenario 8: claims at once against a simulated pool as large.
    pub pool_burst: usize,
    /// Scenario 8: claims at once against a pool as large, on real kernels.
    pub pool_real_kernels: usize,
    /// Scenario 8's bound of every wait (the pool filling, a claim, a refill).
    pub pool_bound_seconds: u64,
    /// Scenario 10: long actions of one namespace in flight (more than the work slots), and
    /// one-line actions of another, one at a time.
    pub fairness_noisy: usize,
    pub fairness_quiet: usize,
}

impl Counts {
    pub fn new(quick: bool) -> Counts {
        if quick {
            Counts {
                sequential_actions: 20,
                agent_steps: 10,
                scaling_executors: vec![1, 3, 10],
                scaling_actions: 5,
                scaling_bound_seconds: 120,
                memory_executors: 100,
                memory_executions: 1_000,
                cold_start_runs: 1,
                traces_per_round: 5,
                simulated_executors: vec![10, 50, 100],
                simulated_actions: 10,
                simulated_bound_seconds: 60,
                api_ceiling_executions: 500,
                pool_replicas: 10,
                pool_claims: 10,
                pool_burst: 20,
                pool_real_kernels: 3,
                pool_bound_seconds: 120,
                fairness_noisy: 300,
                fairness_quiet: 5,
            }
        } else {
            Counts {
                sequential_actions: 200,
                agent_steps: 50,
                scaling_executors: vec![1, 10, 100],
                scaling_actions: 20,
                scaling_bound_seconds: 120,
                memory_executors: 1_000,
                memory_executions: 10_000,
                cold_start_runs: 5,
                traces_per_round: 50,
                simulated_executors: vec![10, 100, 1_000],
                simulated_actions: 10,
                simulated_bound_seconds: 60,
                api_ceiling_executions: 3_000,
                pool_replicas: 10,
                pool_claims: 50,
                pool_burst: 100,
                pool_real_kernels: 3,
                pool_bound_seconds: 120,
                fairness_noisy: 300,
                fairness_quiet: 20,
            }
        }
    }
}

impl Counts {
    fn scaling(&self) -> Vec<scaling::Scale> {
        let (executors, actions) = (&self.scaling_executors, self.scaling_actions);
        scaling::Scale::each(executors, actions, self.scaling_bound_seconds)
    }

    fn simulated(&self) -> Vec<scaling::Scale> {
        let (executors, actions) = (&self.simulated_executors, self.simulated_actions);
        scaling::Scale::each(executors, actions, self.simulated_bound_seconds)
    }

    fn pools(&self) -> pools::Sizes {
        pools::Sizes {
            pool: self.pool_replicas,
            claims: self.pool_claims,
            burst: self.pool_burst,
            real_kernels: self.pool_real_kernels,
            bound: std::time::Duration::from_secs(self.pool_bound_seconds),
        }
    }
}

/// Everything one run measured (the JSON of `--out`).
#[derive(Debug, Serialize)]
pub struct Report {
    /// Bumped when a field changes meaning.
    pub format: u32,
    pub quick: bool,
    pub machine: Machine,
    pub counts: Counts,
    pub wall_seconds: f64,
    pub latency: Option<latency::Latency>,
    pub agent_step: Option<agent::AgentStep>,
    pub scaling: Option<Vec<scaling::Point>>,
    pub api_cost: Option<latency::ApiCost>,
    pub memory: Option<memory::Memory>,
    pub cold_start: Option<cold_start::ColdStart>,
    pub simulated: Option<Vec<simulated::Point>>,
    pub api_ceiling: Option<simulated::ApiCeiling>,
    pub pools: Option<pools::Pools>,
    pub traces: Option<traces::Traces>,
    pub fairness: Option<fairness::Fairness>,
    /// Scenarios that failed, with why; the others still ran.
    pub errors: BTreeMap<String, String>,
}

/// What one scenario measured.
enum Outcome {
    Latency(Box<(latency::Latency, latency::ApiCost)>),
    Agent(agent::AgentStep),
    /// The points measured, and the labelled errors of those that failed.
    Scaling(Vec<scaling::Point>, Vec<(String, String)>),
    ColdStart(cold_start::ColdStart),
    Memory(memory::Memory),
    /// Scenario 7's points, the labelled errors of those that failed, and the API ceiling.
    Simulated(
        Vec<simulated::Point>,
        Vec<(String, String)>,
        Option<simulated::ApiCeiling>,
    ),
    /// Scenario 8's phases, and the labelled errors of those that failed.
    Pools(Box<pools::Pools>, Vec<(String, String)>),
    Traces(traces::Traces),
    Fairness(fairness::Fairness),
}

/// The order scenarios run in. Fairness watches every namespace: it comes first, while no other
/// scenario's objects exist, and deletes what it made. Simulated scale and memory leave
/// thousands of objects behind and scaling can leave the API server saturated: they come last.
/// Warm pools delete what they made.
const ORDER: [u8; 9] = [10, 1, 2, 6, 8, 9, 7, 5, 3];

/// Measures scenario `n` at each number of executors in turn; a failed point does not stop the
/// next. The points measured, and the others' errors labelled for [`Report::errors`].
async fn each_point<P, Fut>(
    n: u8,
    progress: &Progress,
    scales: Vec<scaling::Scale>,
    measure: impl Fn(scaling::Scale) -> Fut,
) -> (Vec<P>, Vec<(String, String)>)
where
    Fut: Future<Output = anyhow::Result<P>>,
{
    let (mut points, mut failures) = (Vec::new(), Vec::new());
    for scale in scales {
        let executors = scale.executors;
        match measure(scale).await {
            Ok(point) => points.push(point),
            Err(error) => {
                progress.step(format!(
                    "{n}: the {executors}-executor point failed: {error:#}"
                ));
                failures.push((format!("{n} ({executors} executors)"), format!("{error:#}")));
            }
        }
    }
    (points, failures)
}

async fn scenario(
    n: u8,
    stack: &Stack,
    progress: &Progress,
    counts: &Counts,
) -> anyhow::Result<Outcome> {
    Ok(match n {
        1 => {
            let (latency, cost) = latency::run(stack, progress, counts.sequential_actions).await?;
            Outcome::Latency(Box::new((latency, cost)))
        }
        2 => Outcome::Agent(agent::run(stack, progress, counts.agent_steps).await?),
        3 => {
            let measure = |scale| scaling::point(stack, progress, scale);
            let (points, failures) = each_point(n, progress, counts.scaling(), measure).await;
            Outcome::Scaling(points, failures)
        }
        5 => Outcome::Memory(
            memory::run(
                stack,
                progress,
                counts.memory_executors,
                counts.memory_executions,
            )
            .await?,
        ),
        6 => Outcome::ColdStart(cold_start::run(stack, progress, counts.cold_start_runs).await?),
        7 => {
            let measure = |scale| simulated::point(stack, progress, scale);
            let (points, mut failures) = each_point(n, progress, counts.simulated(), measure).await;
            let ceiling = simulated::api_ceiling(stack, progress, counts.api_ceiling_executions)
                .await
                .map_err(|error| failures.push(("7 (API ceiling)".into(), format!("{error:#}"))))
                .ok();
            Outcome::Simulated(points, failures, ceiling)
        }
        8 => {
            let (pools, failures) = pools::run(stack, progress, counts.pools()).await;
            Outcome::Pools(Box::new(pools), failures)
        }
        9 => Outcome::Traces(traces::run(stack, progress, counts.traces_per_round).await?),
        10 => Outcome::Fairness(
            fairness::run(
                stack,
                progress,
                counts.fairness_noisy,
                counts.fairness_quiet,
            )
            .await?,
        ),
        other => anyhow::bail!("no scenario {other}"),
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn interrupted() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async {
            match terminate.as_mut() {
                Some(terminate) => { terminate.recv().await; }
                None => std::future::pending::<()>().await,
            }
        } => {}
    }
}

/// Runs the scenarios, prints the table, writes the JSON (also after each scenario, so an
/// interrupted run keeps what it measured). Fails when a scenario failed or the run was
/// interrupted (SIGINT, SIGTERM: the sandboxes and the control plane are stopped first).
pub async fn run(args: Args) -> anyhow::Result<()> {
    // Progress on stderr: stdout holds only the table.
    let progress = Progress::start_on_stderr();
    let counts = Counts {
        scaling_bound_seconds: args.point_bound,
        ..Counts::new(args.quick)
    };
    let mut report = Report {
        format: 2,
        quick: args.quick,
        machine: Machine::describe(),
        counts: counts.clone(),
        wall_seconds: 0.0,
        latency: None,
        agent_step: None,
        scaling: None,
        api_cost: None,
        memory: None,
        cold_start: None,
        simulated: None,
        api_ceiling: None,
        pools: None,
        traces: None,
        fairness: None,
        errors: BTreeMap::new(),
    };
    let mut interrupt = std::pin::pin!(interrupted());
    let stack = tokio::select! {
        stack = start_stack(&progress) => stack?,
        _ = &mut interrupt => anyhow::bail!("interrupted"),
    };
    let wanted = |n: u8| {
        args.only.is_empty() || args.only.contains(&n) || (n == 1 && args.only.contains(&4))
    };
    for n in ORDER.into_iter().filter(|n| wanted(*n)) {
        let label = if n == 1 {
            "1+4".to_owned()
        } else {
            n.to_string()
        };
        let outcome = tokio::select! {
            outcome = scenario(n, &stack, &progress, &counts) => outcome,
            _ = &mut interrupt => {
                progress.step("interrupted: stopping the sandboxes and the control plane");
                report.errors.insert(label, "interrupted".into());
                break;
            }
        };
        match outcome {
            Ok(Outcome::Latency(measured)) => {
                let (latency, cost) = *measured;
                report.latency = Some(latency);
                report.api_cost = Some(cost);
            }
            Ok(Outcome::Agent(agent)) => report.agent_step = Some(agent),
            Ok(Outcome::Scaling(points, failures)) => {
                report.scaling = Some(points);
                report.errors.extend(failures);
            }
            Ok(Outcome::ColdStart(cold)) => report.cold_start = Some(cold),
            Ok(Outcome::Traces(traces)) => report.traces = Some(traces),
            Ok(Outcome::Fairness(fairness)) => report.fairness = Some(fairness),
            Ok(Outcome::Memory(memory)) => report.memory = Some(memory),
            Ok(Outcome::Simulated(points, failures, ceiling)) => {
                report.simulated = Some(points);
                report.api_ceiling = ceiling;
                report.errors.extend(failures);
            }
            Ok(Outcome::Pools(pools, failures)) => {
                report.pools = Some(*pools);
                report.errors.extend(failures);
            }
            Err(error) => {
                progress.step(format!("scenario {label} failed: {error:#}"));
                report.errors.insert(label, format!("{error:#}"));
            }
        }
        report.wall_seconds = progress.elapsed().as_secs_f64();
        if let Some(out) = &args.out {
            write_json(out, &report)?;
        }
    }
    stack.stop().await?;
    report.wall_seconds = progress.elapsed().as_secs_f64();

    print!("\n{}", report::table(&report));
    if let Some(out) = &args.out {
        write_json(out, &report)?;
        eprintln!("figures written to {}", out.display());
    }
    if !report.errors.is_empty() {
        anyhow::bail!("{} scenario(s) failed or did not run", report.errors.len());
    }
    Ok(())
}

fn write_json(out: &std::path::Path, report: &Report) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(report)?;
    std::fs::write(out, json + "\n").with_context(|| format!("writing {}", out.display()))
}
