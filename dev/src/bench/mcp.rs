//! Scenario 16: the MCP endpoint, with the official MCP SDK through kube-apiserver and a
//! ServiceAccount token (`tests/bench/mcp_endpoint.py`), each figure beside its floor in the
//! same run: `run_python("1 + 1")` against the same action through the Python client
//! (`KubernetesExecutor`), a print's way to an MCP client against its way to a follower of the
//! log subresource; and many sessions at once, with this process's CPU and RSS (the operator's
//! controllers and aggregated API, and the local sandbox server, all run here).

use std::time::Instant;

use kube::Api;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::json;

use super::{
    live::{cpu_ms, rss_kib},
    objects,
    stats::{Summary, ratio},
};
use crate::{progress::Progress, stack::Stack};
use briq_operator::crd::BriqExecutor;

const NAMESPACE: &str = "bench-mcp";

/// How much scenario 16 does.
#[derive(Debug, Clone, Serialize)]
pub struct McpCounts {
    /// `run_python` calls, and as many through the Python client.
    pub actions: usize,
    pub sessions: usize,
    pub session_actions: usize,
    /// Executors the sessions share (one action at a time each).
    pub executors: usize,
    pub prints: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Mcp {
    pub run_python_ms: Option<Summary>,
    pub client_ms: Option<Summary>,
    pub ratio_median: Option<f64>,
    pub ratio_p95: Option<f64>,
    pub sessions: usize,
    pub session_actions: usize,
    pub executors: usize,
    pub completed: usize,
    pub failed: usize,
    pub failures: Vec<String>,
    pub sessions_wall_ms: f64,
    pub session_action_ms: Option<Summary>,
    /// This process's CPU time (utime + stime) while the sessions ran, and its RSS before
    /// and after.
    pub sessions_cpu_ms: f64,
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    pub notification_lag_ms: Option<Summary>,
    pub log_lag_ms: Option<Summary>,
    pub lag_ratio_median: Option<f64>,
}

#[derive(Deserialize)]
struct Latency {
    mcp_ms: Vec<f64>,
    client_ms: Vec<f64>,
}

#[derive(Deserialize)]
struct Sessions {
    wall_ms: f64,
    action_ms: Vec<f64>,
    completed: usize,
    failed: usize,
    failures: Vec<String>,
}

#[derive(Deserialize)]
struct Lag {
    mcp_ms: Vec<f64>,
    log_ms: Vec<f64>,
}

/// Runs one phase of the client script; its JSON line.
async fn phase<T: DeserializeOwned>(
    stack: &Stack,
    executors: &[String],
    phase: &str,
    args: &[String],
) -> anyhow::Result<T> {
    let mut all: Vec<String> = ["--namespace", NAMESPACE, "--phase", phase, "--executors"]
        .map(str::to_owned)
        .into();
    all.push(executors.join(","));
    all.extend_from_slice(args);
    super::setup::python_script(stack, "tests/bench/mcp_endpoint.py", &all).await
}

pub async fn run(stack: &Stack, progress: &Progress, counts: &McpCounts) -> anyhow::Result<Mcp> {
    progress.step(format!(
        "16: MCP: {} run_python beside the Python client, {} sessions × {} actions on {} \
         executors, a print's lag beside the log's",
        counts.actions, counts.sessions, counts.session_actions, counts.executors
    ));
    stack.namespace(NAMESPACE).await?;
    let operator = super::setup::controllers(stack, NAMESPACE, stack.server())?;
    let executors: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let names: Vec<String> = (0..counts.executors).map(|i| format!("mcp-{i}")).collect();
    objects::create_ready(&executors, &names, &json!({}), counts.executors).await?;

    let latency: Latency = phase(
        stack,
        &names,
        "latency",
        &["--actions".into(), counts.actions.to_string()],
    )
    .await?;
    let (rss_before_kib, cpu_before) = (rss_kib(), cpu_ms());
    let started = Instant::now();
    let sessions: Sessions = phase(
        stack,
        &names,
        "sessions",
        &[
            "--sessions".into(),
            counts.sessions.to_string(),
            "--actions".into(),
            counts.session_actions.to_string(),
        ],
    )
    .await?;
    let sessions_cpu_ms = cpu_ms() - cpu_before;
    let rss_after_kib = rss_kib();
    progress.step(format!(
        "16: {} sessions done in {:.1} s",
        counts.sessions,
        started.elapsed().as_secs_f64()
    ));
    let lag: Lag = phase(
        stack,
        &names[..1],
        "lag",
        &["--prints".into(), counts.prints.to_string()],
    )
    .await?;

    objects::delete_executors(&executors).await?;
    operator.stop().await;
    let run_python_ms = Summary::of_millis(&latency.mcp_ms);
    let client_ms = Summary::of_millis(&latency.client_ms);
    let notification_lag_ms = Summary::of_millis(&lag.mcp_ms);
    let log_lag_ms = Summary::of_millis(&lag.log_ms);
    Ok(Mcp {
        ratio_median: ratio(
            run_python_ms.as_ref().map(|s| s.median),
            client_ms.as_ref().map(|s| s.median),
        ),
        ratio_p95: ratio(
            run_python_ms.as_ref().map(|s| s.p95),
            client_ms.as_ref().map(|s| s.p95),
        ),
        lag_ratio_median: ratio(
            notification_lag_ms.as_ref().map(|s| s.median),
            log_lag_ms.as_ref().map(|s| s.median),
        ),
        run_python_ms,
        client_ms,
        sessions: counts.sessions,
        session_actions: counts.session_actions,
        executors: counts.executors,
        completed: sessions.completed,
        failed: sessions.failed,
        failures: sessions.failures,
        sessions_wall_ms: sessions.wall_ms,
        session_action_ms: Summary::of_millis(&sessions.action_ms),
        sessions_cpu_ms,
        rss_before_kib,
        rss_after_kib,
        notification_lag_ms,
        log_lag_ms,
    })
}
