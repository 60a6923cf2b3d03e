//! The API key never reaches what people and tools read: a gateway page that echoes the key at
//! many offsets (across the length limits of error messages, Event notes and conditions) leaves
//! no 8-character piece of it in statuses, Events or the operator's logs. Nor does a claimer's
//! Secret (`poolRef.env`), which reaches its own kernel only.

mod support;

use std::{
    io::Write,
    sync::{Arc, Mutex, OnceLock},
};

use briq_dev::local_server::{Fault, FaultRule, Operation};
use briq_operator::briq::leaked_pieces;
use briq_operator::crd::{BriqExecutor, BriqExecutorPool, Execution};
use k8s_openapi::api::{core::v1::Secret, events::v1::Event};
use kube::{
    ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;
use support::{
    Operator, READY_SECONDS, TestEnv, condition, create_claim_env_secret, create_execution,
    create_executor, create_pool, finished, output, reason, run, sandbox_of, wait_for, wait_ready,
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

/// Everything a tenant who may read the namespace's custom resources and Events (not its
/// Secrets) can read there, as text.
async fn readable_without_secrets(env: &TestEnv) -> Vec<(&'static str, String)> {
    let all = ListParams::default();
    let executors = env.api::<BriqExecutor>().list(&all).await.unwrap().items;
    let pools = env
        .api::<BriqExecutorPool>()
        .list(&all)
        .await
        .unwrap()
        .items;
    let executions = env.api::<Execution>().list(&all).await.unwrap().items;
    let events = env.api::<Event>().list(&all).await.unwrap().items;
    vec![
        ("executors", serde_json::to_string(&executors).unwrap()),
        ("pools", serde_json::to_string(&pools).unwrap()),
        ("executions", serde_json::to_string(&executions).unwrap()),
        ("events", serde_json::to_string(&events).unwrap()),
    ]
}

/// A claimer whose environment names the Secret `secret` (as `TOOL_TOKEN`) and a plain value.
fn claimer_with_env(pool: &str, secret: &str) -> serde_json::Value {
    json!({ "poolRef": { "name": pool, "coldCreateAfterSeconds": 600, "env": [
        { "name": "TOOL_TOKEN", "valueFrom": { "secretKeyRef": { "name": secret, "key": "token" } } },
        { "name": "REGION", "value": "eu" },
    ] } })
}

/// Whether the kernel of `executor` has exactly `token` as TOOL_TOKEN (compared by digest, so
/// that the value is in no Execution) and REGION eu; or, with `None`, neither.
async fn kernel_env_is(env: &TestEnv, run_name: &str, executor: &str, token: Option<&str>) {
    use sha2::{Digest, Sha256};
    let expected = match token {
        Some(token) => format!("('{:x}', 'eu')", Sha256::digest(token.as_bytes())),
        None => "(None, None)".to_owned(),
    };
    let code = "import hashlib, os\n\
                t = os.environ.get('TOOL_TOKEN')\n\
                (t and hashlib.sha256(t.encode()).hexdigest(), os.environ.get('REGION'))";
    let ran = run(env, run_name, executor, code).await;
    assert_eq!(
        (reason(&ran), output(&ran)),
        ("Completed".to_owned(), expected),
        "the environment of {executor}'s kernel"
    );
}

#[tokio::test]
async fn a_claimers_secret_reaches_its_own_kernel_only_and_no_object_event_or_log() {
    let logs = logs();
    let env = TestEnv::new("claim-env").await;
    let _operator = Operator::start(&env).await;
    let token = format!("tok-{}", briq_operator::bridge::Nonce::random().as_str());
    let private = format!("priv-{}", briq_operator::bridge::Nonce::random().as_str());
    create_claim_env_secret(&env, "tools", true, &token).await;
    create_claim_env_secret(&env, "private", false, &private).await;
    for (name, replicas) in [("fast", 2), ("empty", 0)] {
        create_pool(&env, name, replicas, json!({})).await;
    }
    wait_for(
        &env.api::<BriqExecutorPool>(),
        "fast",
        READY_SECONDS,
        |pool| pool.status.as_ref().is_some_and(|s| s.ready_replicas == 2),
    )
    .await;

    // Warm: the claimer's kernel has its Secret and value; another claimer of the same pool has
    // neither.
    create_executor(&env, "agent", claimer_with_env("fast", "tools")).await;
    create_executor(&env, "other", json!({ "poolRef": { "name": "fast" } })).await;
    for name in ["agent", "other"] {
        let claimer = wait_ready(&env, name).await;
        let message = condition(&claimer, "Ready").2;
        assert!(
            message.contains("handed over from BriqExecutorPool fast"),
            "{message}"
        );
    }
    kernel_env_is(&env, "agent-env", "agent", Some(&token)).await;
    // Delivered at the handover itself: the claimer was not provisioned (which says `Ready` in
    // an Event of its own).
    assert_eq!(
        event_reasons_about(&env, "agent").await,
        Vec::<String>::new(),
        "Events about the warm claimer"
    );
    kernel_env_is(&env, "other-env", "other", None).await;

    // Cold (a pool scaled to zero): the sandbox of its own gets it too.
    create_executor(&env, "cold", claimer_with_env("empty", "tools")).await;
    wait_ready(&env, "cold").await;
    kernel_env_is(&env, "cold-env", "cold", Some(&token)).await;

    // The confused deputy: a Secret not labelled for claims is missing; the claimer says so and
    // takes no member. Labelled, it is delivered.
    create_executor(&env, "thief", claimer_with_env("fast", "private")).await;
    let waiting = wait_for(&env.api::<BriqExecutor>(), "thief", 60, |e| {
        condition(e, "Ready").1 == "EnvUnavailable"
    })
    .await;
    let message = condition(&waiting, "Ready").2;
    assert!(
        message.contains("no Secret") && message.contains("briq.cloud/claim-env=true"),
        "{message}"
    );
    assert!(
        waiting
            .status
            .as_ref()
            .and_then(|s| s.sandbox_id.as_ref())
            .is_none()
            && !waiting
                .annotations()
                .contains_key(briq_operator::crd::SANDBOX_ID_ANNOTATION),
        "it took no sandbox: {:?}",
        waiting.metadata
    );
    let label = json!({ "metadata": { "labels": { "briq.cloud/claim-env": "true" } } });
    env.api::<Secret>()
        .patch("private", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    wait_ready(&env, "thief").await;
    kernel_env_is(&env, "thief-env", "thief", Some(&private)).await;

    let logged = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    let mut readable = readable_without_secrets(&env).await;
    readable.push(("logs", logged));
    for (what, text) in readable {
        for value in [&token, &private] {
            assert_eq!(
                leaked_pieces(value, &text),
                Vec::<String>::new(),
                "in {what}"
            );
        }
    }
}

/// The reasons of the Events about the executor `name`.
async fn event_reasons_about(env: &TestEnv, name: &str) -> Vec<String> {
    let events = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap();
    events
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|e| e.reason)
        .collect()
}

#[tokio::test]
async fn a_gateway_page_echoing_the_claimers_variables_leaves_no_piece_of_them_in_status_events_or_logs()
 {
    let logs = logs();
    let env = TestEnv::new("claim-env-echo").await;
    let operator = Operator::start(&env).await;
    let token = format!("tok-{}", briq_operator::bridge::Nonce::random().as_str());
    create_claim_env_secret(&env, "tools", true, &token).await;
    create_pool(&env, "fast", 1, json!({})).await;
    let pool = wait_for(
        &env.api::<BriqExecutorPool>(),
        "fast",
        READY_SECONDS,
        |pool| pool.status.as_ref().is_some_and(|s| s.ready_replicas == 1),
    )
    .await;
    let members = env
        .api::<BriqExecutor>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(members.len(), 1, "{:?}", pool.status);
    // The handover's `set-env` reaches a gateway that answers with the request's body.
    let page = FaultRule::on(Operation::Exec, Fault::echo_request(502))
        .for_sandbox(sandbox_of(&members[0]))
        .times(1);
    operator.admin().add_fault(&page).await.unwrap();

    create_executor(&env, "agent", claimer_with_env("fast", "tools")).await;
    wait_ready(&env, "agent").await;
    kernel_env_is(&env, "agent-env", "agent", Some(&token)).await;
    // The page was the handover's answer: the claimer was provisioned instead, which gave it.
    let reasons = event_reasons_about(&env, "agent").await;
    assert!(reasons.contains(&"Ready".to_owned()), "{reasons:?}");

    let logged = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(
        logged.contains("<not kept: the request carried secrets>"),
        "the failed handover was logged"
    );
    let mut readable = readable_without_secrets(&env).await;
    readable.push(("logs", logged));
    for (what, text) in readable {
        assert_eq!(
            leaked_pieces(&token, &text),
            Vec::<String>::new(),
            "in {what}"
        );
    }
}
