//! Scenario 2: agent step overhead. The Python executor's `run_code_raise_errors("1 + 1")`
//! (`tests/bench/agent_step.py`, with the default venv) on a warm executor, against a direct
//! bridge call (`Session::run`) on the same sandbox right after.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kube::Api;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{
    objects,
    stats::{Summary, ratio},
};
use crate::{progress::Progress, stack::Stack};
use briq_operator::{bridge::RunStatus, bridge::session::Session, crd::BriqExecutor};

const NAMESPACE: &str = "bench-agent";
const EXECUTOR: &str = "agent";

#[derive(Debug, Clone, Serialize)]
pub struct AgentStep {
    pub steps: usize,
    /// Why there is no Python executor figure.
    pub unavailable: Option<String>,
    pub executor_ms: Option<Summary>,
    pub direct_ms: Option<Summary>,
    pub ratio_median: Option<f64>,
}

#[derive(Deserialize)]
struct ScriptOutput {
    available: bool,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    steps_ms: Vec<f64>,
}

pub async fn run(stack: &Stack, progress: &Progress, steps: usize) -> anyhow::Result<AgentStep> {
    progress.step(format!(
        "2/9: {steps} agent steps through the Python KubernetesExecutor, then {steps} direct"
    ));
    stack.namespace(NAMESPACE).await?;
    let operator = super::setup::controllers(stack, NAMESPACE, stack.server())?;
    let executors: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    objects::create_ready(&executors, &[EXECUTOR.to_owned()], &json!({}), 1).await?;
    let sandbox_id = executors
        .get(EXECUTOR)
        .await?
        .status
        .and_then(|s| s.sandbox_id)
        .context("the ready executor has no sandbox id")?;

    let args = ["--namespace", NAMESPACE, "--executor", EXECUTOR, "--steps"].map(str::to_owned);
    let mut args: Vec<String> = args.into();
    args.push(steps.to_string());
    let parsed: ScriptOutput =
        super::setup::python_script(stack, "tests/bench/agent_step.py", &args).await?;
    let (executor_ms, unavailable) = match parsed {
        out if out.available => (Summary::of_millis(&out.steps_ms), None),
        out => (None, Some(out.reason.unwrap_or_default())),
    };

    let session = Session {
        api: stack.sandbox_client(),
        key: stack.key(),
        sandbox_id: &sandbox_id,
    };
    let mut direct = Vec::with_capacity(steps);
    for _ in 0..steps {
        let started = Instant::now();
        let result = session
            .run(
                &format!("{:016x}", rand::random::<u64>()),
                "1 + 1",
                Duration::from_secs(30),
            )
            .await?;
        direct.push(started.elapsed());
        if result.status != RunStatus::Ok {
            bail!("a direct bridge call failed: {result:?}");
        }
    }
    objects::delete_executors(&executors).await?;
    operator.stop().await;
    let direct_ms = Summary::of(&direct);
    Ok(AgentStep {
        steps,
        ratio_median: ratio(
            executor_ms.as_ref().map(|s| s.median),
            direct_ms.as_ref().map(|s| s.median),
        ),
        unavailable,
        executor_ms,
        direct_ms,
    })
}
