//! Scenario 12: suspending an idle executor and resuming it (`spec.suspend`), on real kernels,
//! with the kernel holding a given amount of user state. For each state size: `suspend: true`
//! → `Suspended` (the namespace saved inside the sandbox, the sandbox stopped), then an
//! Execution created while suspended → its result (the sandbox started, a new kernel, the
//! namespace restored, the action run), which must read the state back.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde::Serialize;
use serde_json::json;

use super::{latency::sequential_of, objects, stats::Summary};
use crate::{progress::Progress, stack::Stack, wait};
use briq_operator::crd::{
    BriqExecutor,
    conditions::{READY, find},
};

const NAMESPACE: &str = "bench-suspend";
/// Bound of each wait: saving or restoring 100 MB, with room to spare.
const BOUND: Duration = Duration::from_secs(180);

/// The target: resume → first result with 10 MB of user state, on the local server.
pub const TARGET_RESUME_SECONDS: f64 = 2.0;
/// The state size the target is stated for.
pub const TARGET_STATE_MB: usize = 10;

/// The figures at one state size.
#[derive(Debug, Clone, Serialize)]
pub struct SuspendPoint {
    /// User state in the kernel, in MB (a bytes object of that size and a small int).
    pub state_mb: usize,
    /// What the operator reported saved (`status.suspension.savedBytes`).
    pub saved_bytes: u64,
    /// `spec.suspend: true` → `Ready` reason `Suspended`.
    pub suspend_ms: Option<Summary>,
    /// An Execution created while suspended: create → `Succeeded` (resume, then the action).
    pub resume_ms: Option<Summary>,
}

pub async fn run(
    stack: &Stack,
    progress: &Progress,
    sizes_mb: &[usize],
    runs: usize,
) -> anyhow::Result<Vec<SuspendPoint>> {
    progress.step(format!(
        "12: suspend → Suspended and resume → first result, x{runs} at {sizes_mb:?} MB of state"
    ));
    stack.namespace(NAMESPACE).await?;
    let operator = super::setup::controllers(stack, NAMESPACE, stack.server())?;
    let executors: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let mut measured = Ok(Vec::new());
    for &size in sizes_mb {
        match point(stack, &executors, progress, size, runs).await {
            Ok(point) => {
                if let Ok(points) = &mut measured {
                    points.push(point);
                }
            }
            Err(error) => {
                measured = Err(error.context(format!("at {size} MB of state")));
                break;
            }
        }
    }
    // Deleted whether or not the runs went well: the next scenario finds a clean machine.
    let deleted = objects::delete_executors(&executors).await;
    operator.stop().await;
    let measured = measured?;
    deleted?;
    Ok(measured)
}

fn ready_reason(executor: &BriqExecutor) -> Option<String> {
    let status = executor.status.as_ref()?;
    find(&status.conditions, READY).map(|ready| format!("{}/{}", ready.status, ready.reason))
}

async fn set_suspend(api: &Api<BriqExecutor>, name: &str, suspend: bool) -> anyhow::Result<()> {
    let patch = Patch::Merge(json!({ "spec": { "suspend": suspend } }));
    api.patch(name, &PatchParams::default(), &patch).await?;
    Ok(())
}

async fn wait_reason(
    api: &Api<BriqExecutor>,
    name: &str,
    reason: &'static str,
) -> anyhow::Result<BriqExecutor> {
    wait::for_object(api, name, BOUND, |e| {
        ready_reason(e).is_some_and(|r| r.ends_with(reason))
    })
    .await
    .with_context(|| format!("{name} did not reach {reason}"))
}

async fn point(
    stack: &Stack,
    executors: &Api<BriqExecutor>,
    progress: &Progress,
    size_mb: usize,
    runs: usize,
) -> anyhow::Result<SuspendPoint> {
    let name = format!("state-{size_mb}mb");
    objects::create_ready(executors, std::slice::from_ref(&name), &json!({}), 1).await?;
    let executor = executors.get(&name).await?;
    let executions = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let bytes = size_mb * 1024 * 1024;
    let code = format!("blob = b'x' * {bytes}\nx = 41\nlen(blob)");
    sequential_of(
        &executions,
        &executor,
        &format!("{name}-set"),
        1,
        &code,
        &bytes.to_string(),
    )
    .await?;

    let (mut suspends, mut resumes, mut saved_bytes) = (Vec::new(), Vec::new(), 0);
    for i in 0..runs {
        let asked = Instant::now();
        set_suspend(executors, &name, true).await?;
        let suspended = wait_reason(executors, &name, "Suspended").await?;
        suspends.push(asked.elapsed());
        saved_bytes = suspended
            .status
            .and_then(|s| s.suspension)
            .map_or(0, |s| s.saved_bytes);
        if saved_bytes < bytes as u64 {
            bail!("{name} saved {saved_bytes} bytes of a {bytes}-byte state");
        }
        // The state must come back: a final expression of both names.
        let check = "x + 1 if len(blob) > 0 else None";
        let took = sequential_of(
            &executions,
            &executor,
            &format!("{name}-{i:02}"),
            1,
            check,
            "42",
        )
        .await
        .context("the state did not come back after the resume")?;
        resumes.push(took[0].elapsed);
        progress.step(format!(
            "12: {size_mb} MB: suspended in {:.2}s, resumed to a result in {:.2}s",
            suspends[i].as_secs_f64(),
            took[0].elapsed.as_secs_f64()
        ));
        // Awake again for the next run: spec.suspend, still true, suspends it after the action
        // first.
        wait_reason(executors, &name, "Suspended").await?;
        set_suspend(executors, &name, false).await?;
        wait_reason(executors, &name, "KernelReady").await?;
    }
    Ok(SuspendPoint {
        state_mb: size_mb,
        saved_bytes,
        suspend_ms: Summary::of(&suspends),
        resume_ms: Summary::of(&resumes),
    })
}
