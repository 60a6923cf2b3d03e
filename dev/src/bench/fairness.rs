//! Scenario 10: tenants share the operator fairly. At the default work slots
//! (`--max-concurrent-executions`, 256), on simulated sandboxes: a noisy namespace with more
//! long actions (20 s) than there are slots, and once a slot's worth of them is in flight, a
//! quiet namespace's one-line actions, one after another: how long each takes from its create
//! to its end, while the noisy ones run. One operator serves both
//! namespaces (all namespaces): the scenario runs first, while no other scenario's objects
//! exist, and deletes what it made.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::{
    objects::{self, FirstSeen},
    setup::OPERATOR_USER,
    stats::Summary,
};
use crate::{
    progress::Progress,
    stack::{self, Controllers, Stack},
};
use briq_operator::crd::{BriqExecutor, Execution};

/// Each noisy action takes the simulated kernel 20 s.
const NOISY_CODE: &str = "# sleep-ms: 20000\n'noisy'";
const QUIET_CODE: &str = "# sleep-ms: 5\n1 + 1";
/// The bound of every wait of the scenario.
const BOUND: Duration = Duration::from_secs(90);

/// The target of issue 27: the quiet action within a second of its create.
pub const TARGET_QUIET_MS: f64 = 1000.0;

#[derive(Debug, Clone, Serialize)]
pub struct Fairness {
    /// The operator's work slots (the default).
    pub work_slots: u16,
    /// Noisy actions created, and how many were in flight (attempt recorded, not finished)
    /// when the quiet actions were created.
    pub noisy_actions: usize,
    pub noisy_in_flight: usize,
    /// Create → finished of each quiet action.
    pub quiet_ms: Option<Summary>,
}

fn running(execution: &Execution) -> bool {
    execution
        .status
        .as_ref()
        .is_some_and(|s| s.attempt_id.is_some())
        && !objects::finished(execution)
}

pub async fn run(
    stack: &Stack,
    progress: &Progress,
    noisy: usize,
    quiet: usize,
) -> anyhow::Result<Fairness> {
    progress.step(format!(
        "10/10: {noisy} long actions of one namespace in flight, then {quiet} one-line actions \
         of another, on simulated sandboxes"
    ));
    let server = stack.simulated_server();
    let (noisy_ns, quiet_ns) = ("bench-fair-noisy", "bench-fair-quiet");
    stack.namespace(noisy_ns).await?;
    stack.namespace(quiet_ns).await?;
    let settings = stack::settings(None, server);
    let work_slots = settings.execution_concurrency;
    let operator = Controllers::start(stack.user_client(OPERATOR_USER).clone(), server, settings)?;
    let api = |namespace: &str| -> (kube::Api<BriqExecutor>, kube::Api<Execution>) {
        (
            kube::Api::namespaced(stack.admin().clone(), namespace),
            kube::Api::namespaced(stack.admin().clone(), namespace),
        )
    };
    let (noisy_executors, noisy_executions) = api(noisy_ns);
    let (quiet_executors, quiet_executions) = api(quiet_ns);

    let names: Vec<String> = (0..noisy).map(|i| format!("noisy-{i:04}")).collect();
    let ready = FirstSeen::start(noisy_executors.clone(), objects::ready).await?;
    let quiet_ready = FirstSeen::start(quiet_executors.clone(), objects::ready).await?;
    let started = Instant::now();
    let plan = names
        .iter()
        .map(|name| objects::executor(name, json!({})))
        .collect::<anyhow::Result<Vec<_>>>()?;
    objects::create_all(&noisy_executors, plan, None).await?;
    let quiet_executor = objects::executor("quiet", json!({}))?;
    objects::create_all(&quiet_executors, [quiet_executor], None).await?;
    anyhow::ensure!(
        ready.wait_for(noisy, started, BOUND).await
            && quiet_ready.wait_for(1, started, BOUND).await,
        "the executors were not all Ready within {BOUND:?}"
    );

    let in_flight = FirstSeen::start(noisy_executions.clone(), running).await?;
    let noisy_done = FirstSeen::start(noisy_executions.clone(), objects::finished).await?;
    let plan = names
        .iter()
        .map(|name| objects::execution(&format!("{name}-long"), name, NOISY_CODE))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let sent = Instant::now();
    objects::create_all(&noisy_executions, plan, None).await?;
    // Every work slot's worth of noisy actions in flight (reached whether or not a running
    // action holds a slot); the quiet actions come now, long before the first noisy one ends.
    let wanted = noisy.min(work_slots as usize);
    in_flight.wait_for(wanted, sent, BOUND).await;
    let noisy_in_flight = in_flight.count().saturating_sub(noisy_done.count());

    let done = FirstSeen::start(quiet_executions.clone(), objects::finished).await?;
    let mut quiet_ms = Vec::new();
    for i in 0..quiet {
        let name = format!("quiet-{i:03}");
        let created = Instant::now();
        let plan = [objects::execution(&name, "quiet", QUIET_CODE)?];
        objects::create_all(&quiet_executions, plan, None).await?;
        if !done
            .wait_for_names(std::slice::from_ref(&name), created + BOUND)
            .await
        {
            anyhow::bail!("quiet action {name} did not finish within {BOUND:?}");
        }
        let ended = done.seen(&name).unwrap_or_else(Instant::now);
        quiet_ms.push(super::stats::millis(ended - created));
    }
    drop(noisy_done);
    drop((ready, quiet_ready, in_flight, done));

    objects::delete_executors(&noisy_executors).await?;
    objects::delete_executors(&quiet_executors).await?;
    operator.stop().await;
    Ok(Fairness {
        work_slots,
        noisy_actions: noisy,
        noisy_in_flight,
        quiet_ms: Summary::of_millis(&quiet_ms),
    })
}
