//! Scenario 11: cancelling a running action (`spec.cancel`), on real kernels. (a) Code that
//! stops at the interrupt: the time from the cancel to `Cancelled`, and the executor's Python
//! state must survive (`x + 1` answers 42 after each run). (b) Code that swallows the
//! interrupt: its kernel is restarted after the operator's grace, so the figure includes that
//! grace; and the time of the next action, the first on the fresh kernel.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde::Serialize;
use serde_json::json;

use super::{latency::sequential_of, objects, stats::Summary};
use crate::{progress::Progress, stack::Stack, wait};
use briq_operator::crd::{
    BriqExecutor, Execution,
    conditions::{SUCCEEDED, find},
};

const NAMESPACE: &str = "bench-cancel";
const EXECUTOR: &str = "cancel";
/// Stops at the first `KeyboardInterrupt`.
const RUNAWAY: &str = "print('started', flush=True)\nwhile True:\n    pass";
/// Never stops on an interrupt: only a kernel restart ends it.
const SWALLOWS_INTERRUPT: &str = "import time\nprint('started', flush=True)\nwhile True:\n    \
    try:\n        time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass";
/// The longest deadline an Execution may have: a cancel that does nothing lets it run that
/// long, far past any figure measured here, rather than end it as a timeout soon after.
const RUNAWAY_TIMEOUT_SECONDS: u32 = 40;
/// Bound of each wait: the runaway's deadline, with room to spare.
const BOUND: Duration = Duration::from_secs(60);

/// The target for a cancel of code that stops at the interrupt.
pub const TARGET_INTERRUPTED_SECONDS: f64 = 2.0;

#[derive(Debug, Clone, Serialize)]
pub struct Cancel {
    /// `spec.cancel` patched → `Succeeded=False` (`Cancelled`), code that stops at the
    /// interrupt; the kernel and its state kept.
    pub interrupted_ms: Option<Summary>,
    /// The same for code that swallows the interrupt: the kernel restarted after the grace.
    pub restarted_ms: Option<Summary>,
    /// Create → `Succeeded` of the action right after each restart (on the fresh kernel).
    pub next_after_restart_ms: Option<Summary>,
    /// Why the action right after a restart failed: a figure of its own, not the scenario's
    /// failure, so the cancel figures are still reported. The restarted runs stop there (the
    /// executor may be unusable).
    pub next_after_restart_failed: Option<String>,
}

pub async fn run(
    stack: &Stack,
    progress: &Progress,
    interrupted_runs: usize,
    restarted_runs: usize,
) -> anyhow::Result<Cancel> {
    progress.step(format!(
        "11: cancel x{interrupted_runs} of code that stops at the interrupt, \
         x{restarted_runs} of code that ignores it (kernel restarted)"
    ));
    stack.namespace(NAMESPACE).await?;
    let operator = super::setup::controllers(stack, NAMESPACE, stack.server())?;
    let executors: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let executions: Api<Execution> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let measured = measure(
        &executors,
        &executions,
        progress,
        interrupted_runs,
        restarted_runs,
    )
    .await;
    // Deleted whether or not the runs went well: the next scenario finds a clean machine. A
    // failed run's error says more than a failed clean-up's, so it is returned first.
    let deleted = objects::delete_executors(&executors).await;
    operator.stop().await;
    let measured = measured?;
    deleted?;
    Ok(measured)
}

async fn measure(
    executors: &Api<BriqExecutor>,
    executions: &Api<Execution>,
    progress: &Progress,
    interrupted_runs: usize,
    restarted_runs: usize,
) -> anyhow::Result<Cancel> {
    objects::create_ready(executors, &[EXECUTOR.to_owned()], &json!({}), 1).await?;
    let executor = executors.get(EXECUTOR).await?;
    // The state each interrupted run must leave intact (a final expression, so it is checked).
    sequential_of(executions, &executor, "state", 1, "x = 41\nx", "41").await?;

    let mut interrupted = Vec::with_capacity(interrupted_runs);
    for i in 0..interrupted_runs {
        let name = format!("interrupted-{i:03}");
        let took = cancel_running(executions, &executor, &name, RUNAWAY, "Cancelled").await?;
        interrupted.push(took);
        let after = format!("{name}-after");
        next_action(executions, &executor, &after, "x + 1", "42")
            .await
            .context("the kernel's state did not survive the cancel")?;
        progress.step(format!(
            "11: interrupted run {} cancelled in {:.2}s",
            i + 1,
            took.as_secs_f64()
        ));
    }

    let (mut restarted, mut next, mut next_after_restart_failed) = (Vec::new(), Vec::new(), None);
    for i in 0..restarted_runs {
        let name = format!("restarted-{i:03}");
        let code = SWALLOWS_INTERRUPT;
        let took = cancel_running(executions, &executor, &name, code, "KernelRestarted").await?;
        restarted.push(took);
        progress.step(format!(
            "11: restarted run {} cancelled in {:.2}s",
            i + 1,
            took.as_secs_f64()
        ));
        // Sent at once, as an agent's next step would be.
        let after = format!("{name}-after");
        match next_action(executions, &executor, &after, "1 + 1", "2").await {
            Ok(took) => next.push(took),
            Err(error) => {
                next_after_restart_failed = Some(format!("{error:#}"));
                break;
            }
        }
    }
    Ok(Cancel {
        interrupted_ms: Summary::of(&interrupted),
        restarted_ms: Summary::of(&restarted),
        next_after_restart_ms: Summary::of(&next),
        next_after_restart_failed,
    })
}

/// One Execution of `code`, which must answer `expected`: its create → `Succeeded` time. A
/// failure says the Execution's error, which tells a lost kernel from a lost variable.
async fn next_action(
    api: &Api<Execution>,
    executor: &BriqExecutor,
    prefix: &str,
    code: &str,
    expected: &str,
) -> anyhow::Result<Duration> {
    match sequential_of(api, executor, prefix, 1, code, expected).await {
        Ok(runs) => Ok(runs[0].elapsed),
        Err(error) => {
            let name = format!("{prefix}-0000");
            let status = api
                .get_opt(&name)
                .await
                .ok()
                .flatten()
                .and_then(|e| e.status);
            let said = status.and_then(|s| s.error);
            let said = said.map_or("no error".into(), |e| format!("{}: {}", e.name, e.message));
            Err(error.context(format!("{name}: {said}")))
        }
    }
}

fn succeeded(execution: &Execution) -> Option<(String, String, String)> {
    let status = execution.status.as_ref()?;
    let condition = find(&status.conditions, SUCCEEDED)?;
    let error = status.error.as_ref().map(|e| e.name.clone());
    Some((
        condition.status.clone(),
        condition.reason.clone(),
        error.unwrap_or_default(),
    ))
}

/// The code runs in its kernel: recorded `Running` (once an action outlasts 100 ms), with its
/// attempt.
fn running(execution: &Execution) -> bool {
    let attempt = execution
        .status
        .as_ref()
        .and_then(|s| s.attempt_id.as_ref());
    attempt.is_some() && succeeded(execution).is_some_and(|(_, reason, _)| reason == "Running")
}

/// Creates an Execution of `code` (which never ends on its own), waits until it runs, then
/// cancels it; the time from the cancel to `Succeeded=False`. It must end `Cancelled` with
/// error `error_name`.
async fn cancel_running(
    api: &Api<Execution>,
    executor: &BriqExecutor,
    name: &str,
    code: &str,
    error_name: &str,
) -> anyhow::Result<Duration> {
    let mut execution = objects::execution_of(name, executor, code)?;
    execution.spec.timeout_seconds = Some(RUNAWAY_TIMEOUT_SECONDS);
    api.create(&PostParams::default(), &execution).await?;
    let started = wait::for_object(api, name, BOUND, |e| running(e) || objects::finished(e))
        .await
        .with_context(|| format!("{name} did not start running"))?;
    if objects::finished(&started) {
        bail!("{name} ended before it was cancelled: {:?}", started.status);
    }

    // Watching before the patch: the watch's first list does not delay the figure.
    let ended = tokio::spawn({
        let (api, name) = (api.clone(), name.to_owned());
        async move { wait::for_object(&api, &name, BOUND, objects::finished).await }
    });
    let cancelled_at = Instant::now();
    let patch = Patch::Merge(json!({ "spec": { "cancel": true } }));
    api.patch(name, &PatchParams::default(), &patch).await?;
    let ended = ended.await??;
    let took = cancelled_at.elapsed();

    match succeeded(&ended) {
        Some((status, reason, error)) if status == "False" && reason == "Cancelled" => {
            if error != error_name {
                bail!("{name} ended Cancelled with error {error:?}, not {error_name:?}");
            }
        }
        other => bail!(
            "{name} did not end Cancelled after its cancel: (status, reason, error) {other:?}, \
             status {:?}",
            ended.status
        ),
    }
    Ok(took)
}
