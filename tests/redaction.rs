//! The API key never reaches what people and tools read: a gateway page that echoes the key at
//! many offsets (across the length limits of error messages, Event notes and conditions) leaves
//! no 8-character piece of it in statuses, Events or the operator's logs.

mod support;

use std::{
    io::Write,
    sync::{Arc, Mutex, OnceLock},
};

use briq_dev::local_server::{Fault, FaultRule, Operation};
use briq_operator::briq::leaked_pieces;
use briq_operator::crd::{BriqExecutor, Execution};
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use serde_json::json;
use support::{
    Operator, TestEnv, condition, create_execution, create_executor, finished, reason, wait_for,
    wait_ready,
};

/// Everything the operator logs in this test binary (it runs in this process).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs() -> &'static Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        let writer = logs.clone();
        tracing_subscriber::fmt()
            .with_env_filter("info")
            .with_writer(move || writer.clone())
            .init();
        logs
    })
}

#[tokio::test]
async fn a_gateway_page_echoing_the_key_leaves_no_piece_of_it_in_status_events_or_logs() {
    let logs = logs();
    let env = TestEnv::new("redaction").await;
    let operator = Operator::start(&env).await;
    let secret = operator.server.api_key().expose().to_owned();
    create_executor(&env, "py", json!({})).await;
    wait_ready(&env, "py").await;

    // The exec's answer is the page, with the key all over it: the Execution reports it.
    operator
        .admin()
        .add_fault(&FaultRule::on(Operation::Exec, Fault::echo_page(502)).times(5))
        .await
        .unwrap();
    create_execution(&env, "echoed", "py", "1 + 1").await;
    // Waiting for briq, it says what briq answered: the page, scrubbed.
    let waiting = wait_for(&env.api::<Execution>(), "echoed", 60, |e| {
        reason(e) == "WaitingForBriq"
    })
    .await;
    let message = condition(&waiting, "Succeeded").2;
    assert!(
        message.contains("Authorization: Bearer <redact"),
        "the page reached the status, scrubbed: {message}"
    );
    let echoed = finished(&env, "echoed", 60).await;
    assert_eq!(reason(&echoed), "Completed", "{:?}", echoed.status);

    // A refused create: the page goes into the executor's condition, and into the logs of every
    // retry.
    operator
        .admin()
        .add_fault(&FaultRule::on(Operation::Create, Fault::echo_page(403)).times(100))
        .await
        .unwrap();
    create_executor(&env, "refused", json!({})).await;
    let refused = wait_for(&env.api::<BriqExecutor>(), "refused", 60, |e| {
        condition(e, "Ready").1 == "BriqRefused"
    })
    .await;
    let message = condition(&refused, "Ready").2;
    assert!(
        message.contains("Authorization: Bearer <redact"),
        "the page reached the status, scrubbed: {message}"
    );

    let executors = env
        .api::<BriqExecutor>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let executions = env
        .api::<Execution>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let events = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let logged = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(
        logged.contains("reconcile failed"),
        "the retries were logged"
    );
    for (what, text) in [
        (
            "executors",
            serde_json::to_string(&executors.items).unwrap(),
        ),
        (
            "executions",
            serde_json::to_string(&executions.items).unwrap(),
        ),
        (
            "a waiting execution",
            serde_json::to_string(&waiting).unwrap(),
        ),
        ("events", serde_json::to_string(&events.items).unwrap()),
        ("logs", logged),
    ] {
        assert_eq!(
            leaked_pieces(&secret, &text),
            Vec::<String>::new(),
            "in {what}"
        );
    }
}
