//! Scenario 9: what exporting traces costs. One `briq-operator run` process at a time (the
//! release binary, as in scenario 5) on the simulated sandboxes, where an action costs the
//! sandbox almost nothing, so the operator's own work is what is measured: Executions one after
//! another with traces off, then with every span exported over OTLP/HTTP to a local receiver,
//! in alternating rounds on the same executor so that drift hits both alike.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::bail;
use axum::{Router, body::Bytes, extract::State, routing::post};
use kube::{Api, api::PostParams};
use serde::Serialize;
use serde_json::json;

use super::{
    latency::sequential_of,
    memory::{Operator, operator_binary},
    objects::{self, FirstSeen},
    stats::Summary,
};
use crate::{progress::Progress, stack::Stack};
use briq_operator::crd::{BriqExecutor, Execution};

const NAMESPACE: &str = "bench-traces";
/// Rounds per setting; they alternate (off, on, off, on, …).
const ROUNDS: usize = 3;

#[derive(Debug, Clone, Serialize)]
pub struct Traces {
    /// Create → Succeeded of one Execution, traces off.
    pub off_ms: Option<Summary>,
    /// The same with every span exported.
    pub on_ms: Option<Summary>,
    /// Export requests the receiver took, and their bytes, over the runs with traces on.
    pub exports: u64,
    pub export_bytes: u64,
    pub executions_traced: usize,
}

/// An OTLP/HTTP endpoint that takes every export and counts it.
#[derive(Default)]
struct Received {
    requests: AtomicU64,
    bytes: AtomicU64,
}

async fn receive(State(received): State<Arc<Received>>, body: Bytes) -> &'static [u8] {
    received.requests.fetch_add(1, Ordering::Relaxed);
    received
        .bytes
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    // An empty ExportTraceServiceResponse: everything accepted.
    b""
}

pub async fn run(stack: &Stack, progress: &Progress, per_round: usize) -> anyhow::Result<Traces> {
    let binary = operator_binary()?;
    let logs = tempfile::Builder::new().prefix("briq-bench-").tempdir()?;
    stack.namespace(NAMESPACE).await?;

    let received = Arc::new(Received::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let app = Router::new()
        .route("/v1/traces", post(receive))
        .with_state(received.clone());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let executors: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let executions: Api<Execution> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let mut executor = None;
    for round in 0..ROUNDS * 2 {
        let traced = round % 2 == 1;
        let env: Vec<(&str, String)> = if traced {
            vec![("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone())]
        } else {
            Vec::new()
        };
        let log = logs.path().join(format!("operator-{round}.log"));
        let operator = Operator::start_in(stack, &binary, &log, NAMESPACE, &env)?;
        let ready = match executor.take() {
            Some(ready) => ready,
            None => {
                let seen = FirstSeen::start(executors.clone(), objects::ready).await?;
                let plan = objects::executor("traced", json!({}))?;
                executors.create(&PostParams::default(), &plan).await?;
                if !seen
                    .wait_for(1, Instant::now(), Duration::from_secs(60))
                    .await
                {
                    operator.alive()?;
                    bail!("the executor was not Ready within 60 s");
                }
                executors.get("traced").await?
            }
        };
        let prefix = format!("r{round}");
        let measured = sequential_of(&executions, &ready, &prefix, per_round, "2", "2").await;
        if round + 1 == ROUNDS * 2 {
            // Its finalizer needs a running operator to destroy the sandbox.
            executors.delete("traced", &Default::default()).await?;
            let deadline = Instant::now() + Duration::from_secs(60);
            while executors.get_opt("traced").await?.is_some() {
                if Instant::now() > deadline {
                    bail!("the executor was not deleted within 60 s");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        operator.stop().await;
        let measured = measured?;
        progress.step(format!(
            "9/9: round {}/{}: {per_round} Executions, traces {}",
            round + 1,
            ROUNDS * 2,
            if traced { "exported" } else { "off" }
        ));
        if traced { &mut on } else { &mut off }.extend(measured.iter().map(|run| run.elapsed));
        executor = Some(ready);
    }
    server.abort();
    Ok(Traces {
        off_ms: Summary::of(&off),
        on_ms: Summary::of(&on),
        exports: received.requests.load(Ordering::Relaxed),
        export_bytes: received.bytes.load(Ordering::Relaxed),
        executions_traced: on.len(),
    })
}
