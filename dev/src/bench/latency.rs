//! Scenarios 1 and 4: per-action latency on a warm executor (through the operator, directly
//! through the bridge, and the raw sandbox exec floor), and what each Execution costs the API
//! server, counted in the audit log and by a watch of our own.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, bail};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
    runtime::wait::await_condition,
};
use serde::Serialize;
use serde_json::json;

use super::{
    audit::{self, RequestCounts},
    objects::{self, WatchCounter},
    setup::OPERATOR_USER,
    stats::{Summary, ratio},
};
use crate::{progress::Progress, stack::Stack};
use briq_operator::{
    bridge::RunStatus,
    bridge::session::Session,
    briq::{ExecRequest, SandboxApi},
    crd::{BriqExecutor, Execution},
};

const NAMESPACE: &str = "bench-latency";
const EXECUTOR: &str = "warm";
const CODE: &str = "1 + 1";
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
const WARM_UP: usize = 3;
/// Runs of each Python start-up probe.
const PYTHON_RUNS: usize = 50;
/// What the bridge imports to talk to the kernel.
const IMPORT_JUPYTER_CLIENT: &str =
    "from jupyter_client.blocking.client import BlockingKernelClient";

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub actions: usize,
    /// Create → `Succeeded` seen through a watch.
    pub operator_ms: Option<Summary>,
    /// `Session::run` on the same sandbox: one exec of the run client, no Kubernetes.
    pub direct_ms: Option<Summary>,
    /// The sandbox exec of `true`.
    pub raw_exec_true_ms: Option<Summary>,
    /// Where a direct call's time goes: the kernel's own time for the code (the bridge's
    /// `duration_ms`), a sandbox exec of `python3 -c pass`, and one that imports the Jupyter
    /// client, as every bridge `run` does.
    pub kernel_duration_ms: Option<Summary>,
    pub python_start_ms: Option<Summary>,
    /// `python3 -I -S -c pass`: how the run client starts (no site, built-in modules only).
    pub python_isolated_start_ms: Option<Summary>,
    pub python_import_jupyter_client_ms: Option<Summary>,
    /// Operator path over direct call.
    pub ratio_median: Option<f64>,
    pub ratio_p95: Option<f64>,
    /// What an action cannot avoid: the raw exec of `true` plus the kernel's own time for the
    /// code (medians), and the direct call's median over it.
    pub floor_ms: Option<f64>,
    pub direct_over_floor: Option<f64>,
    /// What the operator path adds at the least, measured on this API server: one status write
    /// (the result; the attempt's `Running` goes beside the exec or folds into it, and the turn
    /// comes from the cache). A field-selected LIST is measured beside it, for comparison with
    /// what the path cost before.
    pub list_ms: Option<Summary>,
    pub status_write_ms: Option<Summary>,
    pub operator_api_floor_ms: Option<f64>,
    /// Where the operator path's time went, by the API server's clock (its audit log) and the
    /// benchmark's (one machine, one clock).
    pub path_parts: Option<PathParts>,
}

/// One action's time on the operator path, in parts, each over the Executions measured.
#[derive(Debug, Clone, Serialize)]
pub struct PathParts {
    /// The create call sent → the API server received it, and received → answered.
    pub create_sent_ms: Option<Summary>,
    pub create_ms: Option<Summary>,
    /// Created → the operator's result write received: its watch, its reconcile, the exec.
    pub created_to_result_write_ms: Option<Summary>,
    /// The result write, received → answered.
    pub result_write_ms: Option<Summary>,
    /// Answered → the benchmark's watch saw it.
    pub written_to_seen_ms: Option<Summary>,
}

/// An Execution run by [`sequential_of`]: when its create was sent and its end seen.
pub(super) struct Run {
    name: String,
    sent: SystemTime,
    seen: SystemTime,
    pub(super) elapsed: Duration,
}

/// [`PathParts`] of `runs`, from the audit log's `timed` requests (an Execution missing any of
/// them is left out).
fn path_parts(runs: &[Run], timed: &[audit::Timed]) -> PathParts {
    let mut parts: [Vec<Duration>; 5] = Default::default();
    let between = |from: SystemTime, to: SystemTime| to.duration_since(from).ok();
    for run in runs {
        let created = timed
            .iter()
            .find(|t| t.verb == "create" && t.what == "executions" && t.name == run.name);
        let written = timed.iter().rev().find(|t| {
            t.user == OPERATOR_USER
                && t.verb == "patch"
                && t.what == "executions/status"
                && t.name == run.name
        });
        let (Some(created), Some(written)) = (created, written) else {
            continue;
        };
        let measured = [
            between(run.sent, created.received),
            between(created.received, created.completed),
            between(created.completed, written.received),
            between(written.received, written.completed),
            between(written.completed, run.seen),
        ];
        if let [Some(a), Some(b), Some(c), Some(d), Some(e)] = measured {
            for (part, value) in parts.iter_mut().zip([a, b, c, d, e]) {
                part.push(value);
            }
        }
    }
    let [sent, create, operator, write, seen] = parts;
    PathParts {
        create_sent_ms: Summary::of(&sent),
        create_ms: Summary::of(&create),
        created_to_result_write_ms: Summary::of(&operator),
        result_write_ms: Summary::of(&write),
        written_to_seen_ms: Summary::of(&seen),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ApiCost {
    pub executions: usize,
    pub reads_per_execution: f64,
    pub writes_per_execution: f64,
    /// Watch requests the operator started during the run (its watches are long-lived).
    pub watch_requests: u64,
    pub watch_requests_per_execution: f64,
    /// Events a watch of the namespace received, per Execution.
    pub watch_events_per_execution: WatchEvents,
    /// Every operator request of the run, by verb and resource, per Execution.
    pub requests_per_execution: BTreeMap<String, f64>,
    pub totals: RequestCounts,
}

#[derive(Debug, Clone, Serialize)]
pub struct WatchEvents {
    pub executions: f64,
    pub executors: f64,
    pub total: f64,
}

pub async fn run(
    stack: &Stack,
    progress: &Progress,
    actions: usize,
) -> anyhow::Result<(Latency, ApiCost)> {
    stack.namespace(NAMESPACE).await?;
    let operator = super::setup::controllers(stack, NAMESPACE, stack.server())?;
    let executors: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let executions: Api<Execution> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    objects::create_ready(&executors, &[EXECUTOR.to_owned()], &json!({}), 1).await?;
    let executor = executors.get(EXECUTOR).await?;
    let sandbox_id = executor
        .status
        .clone()
        .and_then(|s| s.sandbox_id)
        .context("the ready executor has no sandbox id")?;
    sequential_of(&executions, &executor, "warmup", WARM_UP, CODE, "2").await?;
    progress.step(format!(
        "1/9: executor ready; {actions} Executions of `{CODE}`, one after another"
    ));

    let audit_log = stack
        .plane()
        .and_then(|plane| plane.audit_log())
        .context("the control plane has no audit log")?
        .to_owned();
    let counter = WatchCounter::start(stack.admin(), NAMESPACE).await?;
    let from = audit::offset(&audit_log)?;
    let runs = sequential_of(&executions, &executor, "lat", actions, CODE, "2").await?;
    let operator_times: Vec<Duration> = runs.iter().map(|run| run.elapsed).collect();
    // Anything the last Execution still triggers (executor reconcile after the counters).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let to = audit::offset(&audit_log)?;
    let (execution_events, executor_events) = counter.counts();
    drop(counter);
    let totals = audit::count(&audit_log, from, to, OPERATOR_USER)?;
    let path_parts = path_parts(&runs, &audit::timed(&audit_log, from, to)?);

    progress.step(format!(
        "1: {actions} direct bridge calls and {actions} execs of `true` on the same sandbox"
    ));
    let session = Session {
        api: stack.sandbox_client(),
        key: stack.key(),
        sandbox_id: &sandbox_id,
    };
    let mut direct_times = Vec::with_capacity(actions);
    let mut kernel_times = Vec::with_capacity(actions);
    for _ in 0..actions {
        let started = Instant::now();
        let result = session
            .run(
                &format!("{:016x}", rand::random::<u64>()),
                CODE,
                Duration::from_secs(30),
            )
            .await?;
        direct_times.push(started.elapsed());
        kernel_times.push(result.duration_ms as f64);
        if result.status != RunStatus::Ok || result.output.as_deref() != Some("2") {
            bail!("a direct bridge call did not give 2: {result:?}");
        }
    }
    let exec = |argv: &[&str], count: usize| {
        let request = ExecRequest {
            argv: argv.iter().map(|a| a.to_string()).collect(),
            cwd: Some(briq_operator::bridge::WORKDIR.into()),
            env: BTreeMap::new(),
            timeout: Duration::from_secs(10),
            stdin: None,
        };
        let sandbox_id = &sandbox_id;
        async move {
            let mut times = Vec::with_capacity(count);
            for _ in 0..count {
                let started = Instant::now();
                let output = stack
                    .sandbox_client()
                    .exec(stack.key(), sandbox_id, &request)
                    .await?;
                times.push(started.elapsed());
                if output.exit_code != Some(0) {
                    bail!("{:?} exited with {:?}", request.argv, output.exit_code);
                }
            }
            Ok::<_, anyhow::Error>(times)
        }
    };
    let raw_times = exec(&["true"], actions).await?;
    let python_runs = actions.min(PYTHON_RUNS);
    let python_start = exec(&["python3", "-c", "pass"], python_runs).await?;
    let python_isolated = exec(&["python3", "-I", "-S", "-c", "pass"], python_runs).await?;
    let python_import = exec(&["python3", "-c", IMPORT_JUPYTER_CLIENT], python_runs).await?;
    objects::delete_executors(&executors).await?;
    operator.stop().await;
    let (list_ms, status_write_ms) = api_round_trips(&executions, python_runs).await?;

    let operator_ms = Summary::of(&operator_times);
    let direct_ms = Summary::of(&direct_times);
    let raw_exec_true_ms = Summary::of(&raw_times);
    let kernel_duration_ms = Summary::of_millis(&kernel_times);
    let floor_ms = raw_exec_true_ms
        .as_ref()
        .zip(kernel_duration_ms.as_ref())
        .map(|(raw, kernel)| raw.median + kernel.median);
    let latency = Latency {
        direct_over_floor: ratio(direct_ms.as_ref().map(|s| s.median), floor_ms),
        floor_ms,
        actions,
        ratio_median: ratio(
            operator_ms.as_ref().map(|s| s.median),
            direct_ms.as_ref().map(|s| s.median),
        ),
        ratio_p95: ratio(
            operator_ms.as_ref().map(|s| s.p95),
            direct_ms.as_ref().map(|s| s.p95),
        ),
        operator_ms,
        direct_ms,
        raw_exec_true_ms,
        kernel_duration_ms,
        python_start_ms: Summary::of(&python_start),
        python_isolated_start_ms: Summary::of(&python_isolated),
        operator_api_floor_ms: status_write_ms.as_ref().map(|write| write.median),
        list_ms,
        status_write_ms,
        python_import_jupyter_client_ms: Summary::of(&python_import),
        path_parts: Some(path_parts),
    };
    let per = |count: u64| count as f64 / actions.max(1) as f64;
    let cost = ApiCost {
        executions: actions,
        reads_per_execution: per(totals.reads),
        writes_per_execution: per(totals.writes),
        watch_requests: totals.watches,
        watch_requests_per_execution: per(totals.watches),
        watch_events_per_execution: WatchEvents {
            executions: per(execution_events),
            executors: per(executor_events),
            total: per(execution_events + executor_events),
        },
        requests_per_execution: totals
            .by_request
            .iter()
            .map(|(what, count)| (what.clone(), per(*count)))
            .collect(),
        totals,
    };
    Ok((latency, cost))
}

/// The API calls every Execution needs from the operator, timed alone, `count` times each: the
/// turn's LIST (metadata, by executor) and a status write (server-side apply), on an Execution of an executor that does not exist (the controllers are stopped).
async fn api_round_trips(
    api: &Api<Execution>,
    count: usize,
) -> anyhow::Result<(Option<Summary>, Option<Summary>)> {
    let name = "api-round-trips";
    api.create(
        &PostParams::default(),
        &objects::execution(name, "none", CODE)?,
    )
    .await?;
    let selector = ListParams::default().fields("spec.executorRef.name=none");
    let (mut lists, mut writes) = (Vec::with_capacity(count), Vec::with_capacity(count));
    for i in 0..count {
        let started = Instant::now();
        api.list_metadata(&selector).await?;
        lists.push(started.elapsed());
        let status = json!({ "attemptId": format!("{i:016x}") });
        let started = Instant::now();
        objects::apply_execution_status(api, name, status).await?;
        writes.push(started.elapsed());
    }
    api.delete(name, &DeleteParams::default()).await?;
    Ok((Summary::of(&lists), Summary::of(&writes)))
}

/// Creates `count` Executions of `code` in `executor` one after another, as the agent client
/// does, each timed from the create call to its `Succeeded` condition seen through a watch;
/// each output must be `expected`.
pub(super) async fn sequential_of(
    api: &Api<Execution>,
    executor: &BriqExecutor,
    prefix: &str,
    count: usize,
    code: &str,
    expected: &str,
) -> anyhow::Result<Vec<Run>> {
    let mut runs = Vec::with_capacity(count);
    for i in 0..count {
        let name = format!("{prefix}-{i:04}");
        let execution = objects::execution_of(&name, executor, code)?;
        // Watching before the create costs nothing extra: the watch starts from a list.
        let done = tokio::spawn({
            let (api, name) = (api.clone(), name.clone());
            async move {
                let finished = |e: Option<&Execution>| e.is_some_and(objects::finished);
                await_condition(api, &name, finished).await
            }
        });
        let (started, sent) = (Instant::now(), SystemTime::now());
        api.create(&PostParams::default(), &execution).await?;
        let finished = tokio::time::timeout(RUN_TIMEOUT, done)
            .await
            .with_context(|| format!("Execution {name} did not finish within {RUN_TIMEOUT:?}"))???
            .with_context(|| format!("Execution {name} disappeared"))?;
        let (elapsed, seen) = (started.elapsed(), SystemTime::now());
        objects::check_output(&finished, expected)?;
        runs.push(Run {
            name,
            sent,
            seen,
            elapsed,
        });
    }
    Ok(runs)
}
