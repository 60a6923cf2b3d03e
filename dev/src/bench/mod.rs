//! `briq-dev bench` (`make bench`): starts a local control plane (audit log on), the local sandbox
//! server and the operator, measures per-action latency, agent step overhead, throughput and
//! scaling, API cost per Execution, the operator's memory and cold start, scale on simulated
//! sandboxes, claims from warm pools against cold creates, what exporting traces costs,
//! fairness between namespaces, cancels of running actions, suspend and resume, pools sized by
//! demand, live output and files through the aggregated API, and forks of an executor
//! (scenarios 1 to 15), prints the figures as a Markdown table and writes them as JSON
//! (`--out`), so two runs can be compared.
//!
//! Nothing here asserts a timing: it measures and reports. Every scenario runs in a namespace of
//! its own with the controllers (in this process, as user `briq-operator`) scoped to it, except
//! fairness, whose controllers serve every namespace, and memory and traces, which measure a
//! separate `briq-operator run` process. The memory, simulated-scale, traces and fairness
//! scenarios use the local sandbox server's simulated sandboxes (no kernels), so that a thousand
//! executors are really Ready; the warm-pool scenario uses them for its pools of 10 and of a
//! burst's size, and real kernels for a small pool; the demand-sized pool scenario uses a
//! simulated server of its own whose provisioning takes a real kernel's time; the others use
//! real kernels.

mod agent;
mod audit;
mod burst_floor;
mod cancel;
mod cold_start;
mod counts;
mod demand;
mod fairness;
mod fork;
mod latency;
mod live;
mod mcp;
mod memory;
mod objects;
mod pools;
mod report;
mod rows;
mod scaling;
mod setup;
mod simulated;
mod stats;
mod suspend;
mod table;
mod traces;

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::Context as _;

pub use counts::Counts;
pub use report::{Machine, Report};
pub use setup::OPERATOR_USER;
pub use stats::Summary;

use crate::{progress::Progress, stack::Stack};

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

    /// Only these scenarios (1-16, comma separated; 4 is measured within 1) [default: all].
    #[arg(long, value_delimiter = ',', value_name = "N,…")]
    pub only: Vec<u8>,
}

/// What one scenario measured.
enum Outcome {
    Latency(Box<(latency::Latency, latency::ApiCost)>),
    Agent(agent::AgentStep),
    /// The points measured, and the labelled errors of those that failed.
    Scaling(Vec<scaling::Point>, Vec<(String, String)>),
    ColdStart(cold_start::ColdStart),
    Cancel(cancel::Cancel),
    Suspend(Vec<suspend::SuspendPoint>),
    Memory(memory::Memory),
    /// Scenario 7's points, the labelled errors of those that failed, and the API ceiling.
    Simulated(
        Vec<simulated::Point>,
        Vec<(String, String)>,
        Option<simulated::ApiCeiling>,
    ),
    /// Scenario 8's phases, and the labelled errors of those that failed.
    Pools(Box<pools::Pools>, Vec<(String, String)>),
    Demand(Box<demand::Demand>),
    /// Scenario 14's figures, and the labelled errors of its parts that failed.
    Live(Box<live::LiveFiles>, Vec<(String, String)>),
    /// Scenario 15's figures, and the labelled errors of its parts that failed.
    Fork(Box<fork::Forks>, Vec<(String, String)>),
    Mcp(Box<mcp::Mcp>),
    Traces(traces::Traces),
    Fairness(fairness::Fairness),
}

/// The order scenarios run in. Fairness watches every namespace: it comes first, while no other
/// scenario's objects exist, and deletes what it made. Simulated scale and memory leave
/// thousands of objects behind and scaling can leave the API server saturated: they come last.
/// Warm pools, demand-sized pools, cancel, live output and forks delete what they made.
const ORDER: [u8; 15] = [10, 1, 2, 16, 6, 11, 12, 8, 13, 14, 15, 9, 7, 5, 3];

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
        11 => Outcome::Cancel(
            cancel::run(
                stack,
                progress,
                counts.cancel_runs,
                counts.cancel_restart_runs,
            )
            .await?,
        ),
        12 => Outcome::Suspend(
            suspend::run(
                stack,
                progress,
                &counts.suspend_sizes_mb,
                counts.suspend_runs,
            )
            .await?,
        ),
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
        13 => Outcome::Demand(Box::new(
            demand::run(stack, progress, counts.demand()).await?,
        )),
        14 => {
            let (live, failures) = live::run(stack, progress, &counts.live()).await;
            Outcome::Live(Box::new(live), failures)
        }
        15 => {
            let (forks, failures) = fork::run(stack, progress, &counts.fork()).await;
            Outcome::Fork(Box::new(forks), failures)
        }
        16 => Outcome::Mcp(Box::new(mcp::run(stack, progress, &counts.mcp()).await?)),
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
        cancel: None,
        suspend: None,
        live: None,
        fork: None,
        mcp: None,
        simulated: None,
        api_ceiling: None,
        pools: None,
        demand: None,
        traces: None,
        fairness: None,
        errors: BTreeMap::new(),
    };
    let mut interrupt = std::pin::pin!(interrupted());
    let stack = tokio::select! {
        stack = setup::start_stack(&progress) => stack?,
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
            Ok(Outcome::Mcp(mcp)) => report.mcp = Some(*mcp),
            Ok(Outcome::Scaling(points, failures)) => {
                report.scaling = Some(points);
                report.errors.extend(failures);
            }
            Ok(Outcome::ColdStart(cold)) => report.cold_start = Some(cold),
            Ok(Outcome::Cancel(cancel)) => {
                if let Some(why) = &cancel.next_after_restart_failed {
                    let label = "11 (the action right after a kernel restart)";
                    report.errors.insert(label.into(), why.clone());
                }
                report.cancel = Some(cancel);
            }
            Ok(Outcome::Suspend(points)) => report.suspend = Some(points),
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
            Ok(Outcome::Demand(demand)) => report.demand = Some(*demand),
            Ok(Outcome::Live(live, failures)) => {
                report.live = Some(*live);
                report.errors.extend(failures);
            }
            Ok(Outcome::Fork(forks, failures)) => {
                report.fork = Some(*forks);
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

    print!("\n{}", table::table(&report));
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
