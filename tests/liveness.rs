//! Liveness: objects that depend on each other, created in any order and in bursts, all conclude,
//! and soon after what they wait for has happened. Every wait in the operator has a trigger that
//! cannot be lost or a bounded recheck; these tests create the orders in which a lost wake-up
//! shows (`src/controller/wake.rs` lists the waits and what wakes each).

mod support;

use briq_operator::crd::{BriqExecutor, BriqExecutorPool, Execution};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{Api, api::DeleteParams};
use serde_json::{Value, json};
use support::{
    Operator, READY_SECONDS, TestEnv, condition, create_api_key_secret, create_execution,
    create_executor, finished, output, reason, wait_for, wait_ready,
};

/// How long after its executor's Ready an Execution created with it may take to finish: a few
/// reconciles, one exec of trivial code and a status write (none of it waits on a recheck).
const AFTER_READY: SignedDuration = SignedDuration::from_secs(10);

/// An executor and an Execution of `x = {i}` on it, as one manifest would hold them.
fn pair(name: &str, i: usize) -> [Value; 2] {
    [
        json!({
            "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
            "metadata": { "name": name }, "spec": {},
        }),
        json!({
            "apiVersion": "briq.cloud/v1alpha1", "kind": "Execution",
            "metadata": { "name": format!("{name}-step") },
            "spec": { "executorRef": { "name": name }, "code": format!("x = {i}\nx") },
        }),
    ]
}

/// `kubectl create -f` of one `List` holding `items`, as a user or a GitOps sync applies a
/// manifest.
fn create_list(env: &TestEnv, items: Vec<Value>) {
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": items });
    let file = tempfile::NamedTempFile::new().expect("a temporary manifest");
    std::fs::write(file.path(), list.to_string()).expect("writing the manifest");
    let path = file.path().to_str().expect("a UTF-8 path");
    let (ok, _, stderr) = env.kubectl(&["create", "-f", path]);
    assert!(ok, "kubectl create: {stderr}");
}

fn time(at: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Timestamp {
    at.expect("a recorded time").0
}

/// Waits for the Execution `name` of the Ready executor `executor` and returns how long after the
/// executor's Ready it finished.
async fn finished_after_ready(env: &TestEnv, executor: &str, name: &str) -> SignedDuration {
    let execution = finished(env, name, READY_SECONDS).await;
    assert_eq!(
        reason(&execution),
        "Completed",
        "{name}: {:?}",
        condition(&execution, "Succeeded")
    );
    let executor: BriqExecutor = env.api().get(executor).await.unwrap();
    let ready = time(executor.status.as_ref().and_then(|s| s.ready_time.as_ref()));
    let done = time(
        execution
            .status
            .as_ref()
            .and_then(|s| s.completion_time.as_ref()),
    );
    done.duration_since(ready)
}

/// Asserts that every Execution finished within [`AFTER_READY`] of its executor's Ready.
fn assert_prompt(lags: &[(String, SignedDuration)]) {
    let late: Vec<_> = lags.iter().filter(|(_, lag)| *lag > AFTER_READY).collect();
    assert!(
        late.is_empty(),
        "Executions that finished more than {AFTER_READY:?} after their executor's Ready: {late:?}"
    );
}

async fn delete_executors(env: &TestEnv, names: &[String]) {
    let api: Api<BriqExecutor> = env.api();
    for name in names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

/// The flow of docs/src/concepts.md under load: `kubectl create -f` of executors and their
/// Executions in one manifest, 8 rounds of 4 pairs. The executor controller's Ready write wakes
/// the Executions waiting on it; the wake-up must not be spent before the executor cache shows
/// Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_created_in_one_request_with_their_executors_run_as_soon_as_each_is_ready() {
    let env = TestEnv::new("live-pairs").await;
    let _operator = Operator::start(&env).await;
    let mut lags = Vec::new();
    for round in 0..8 {
        let names: Vec<String> = (0..4).map(|i| format!("w-{round}-{i}")).collect();
        let items = names
            .iter()
            .enumerate()
            .flat_map(|(i, name)| pair(name, i))
            .collect();
        create_list(&env, items);
        for name in &names {
            let lag = finished_after_ready(&env, name, &format!("{name}-step")).await;
            lags.push((name.clone(), lag));
        }
        delete_executors(&env, &names).await;
    }
    assert_prompt(&lags);
}

/// The other orders: Executions created before their executors exist (they wait,
/// `ExecutorNotFound`), and after their executors are Ready, in one burst each.
#[tokio::test]
async fn executions_created_before_or_after_their_executors_all_run() {
    let env = TestEnv::new("live-orders").await;
    let _operator = Operator::start(&env).await;
    let early: Vec<String> = (0..4).map(|i| format!("early-{i}")).collect();
    for (i, name) in early.iter().enumerate() {
        create_execution(&env, &format!("{name}-step"), name, &format!("x = {i}\nx")).await;
    }
    for name in &early {
        wait_for(&env.api::<Execution>(), &format!("{name}-step"), 30, |e| {
            reason(e) == "ExecutorNotFound"
        })
        .await;
    }
    let executors = early
        .iter()
        .map(|name| {
            json!({
                "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
                "metadata": { "name": name }, "spec": {},
            })
        })
        .collect();
    create_list(&env, executors);
    let mut lags = Vec::new();
    for name in &early {
        let lag = finished_after_ready(&env, name, &format!("{name}-step")).await;
        lags.push((name.clone(), lag));
    }
    assert_prompt(&lags);

    // After Ready: the executors above, a burst of one Execution each.
    for (i, name) in early.iter().enumerate() {
        create_execution(&env, &format!("{name}-again"), name, &format!("x + {i}")).await;
    }
    for (i, name) in early.iter().enumerate() {
        let again = finished(&env, &format!("{name}-again"), READY_SECONDS).await;
        assert_eq!(output(&again), (2 * i).to_string(), "{name}: state kept");
    }
}

/// Claimers created before their pool fall back to sandboxes of their own; the pool, created
/// after, fills; claimers created with the pool take its members or fall back. Everything is
/// Ready and runs code.
#[tokio::test]
async fn claimers_created_before_with_and_after_their_pool_all_become_ready() {
    let env = TestEnv::new("live-pool").await;
    let _operator = Operator::start(&env).await;
    let claimer = |name: &str| {
        json!({
            "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
            "metadata": { "name": name },
            "spec": { "poolRef": { "name": "warm", "coldCreateAfterSeconds": 20 } },
        })
    };
    let pool = json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutorPool",
        "metadata": { "name": "warm" }, "spec": { "replicas": 2, "template": {} },
    });
    let before = ["before-0", "before-1"];
    create_list(&env, before.iter().map(|name| claimer(name)).collect());
    let with = ["with-0", "with-1"];
    let mut items: Vec<Value> = with.iter().map(|name| claimer(name)).collect();
    items.push(pool);
    create_list(&env, items);
    wait_for(
        &env.api::<BriqExecutorPool>(),
        "warm",
        READY_SECONDS,
        |pool| condition(pool, "Ready").0 == "True",
    )
    .await;
    let after = ["after-0", "after-1"];
    create_list(&env, after.iter().map(|name| claimer(name)).collect());
    for name in before.iter().chain(&with).chain(&after) {
        wait_ready(&env, name).await;
        create_execution(&env, &format!("{name}-step"), name, "6 * 7").await;
    }
    for name in before.iter().chain(&with).chain(&after) {
        let step = finished(&env, &format!("{name}-step"), READY_SECONDS).await;
        assert_eq!(
            output(&step),
            "42",
            "{name}: {:?}",
            condition(&step, "Succeeded")
        );
    }
}

/// An executor whose key Secret does not exist yet waits (`ApiKeyMissing`); the Secret created
/// a moment later is found within seconds, not at a recheck minutes or half a minute away, and
/// the executor's Execution runs.
#[tokio::test]
async fn an_executor_created_before_its_key_secret_is_ready_seconds_after_the_secret() {
    let env = TestEnv::new("live-secret").await;
    let operator = Operator::start(&env).await;
    let executors: Vec<String> = (0..3).map(|i| format!("keyed-{i}")).collect();
    for name in &executors {
        create_executor(
            &env,
            name,
            json!({ "apiKeySecretRef": { "name": "briq-key" } }),
        )
        .await;
        create_execution(&env, &format!("{name}-step"), name, "1 + 1").await;
    }
    for name in &executors {
        wait_for(&env.api::<BriqExecutor>(), name, 30, |e| {
            condition(e, "Ready").1 == "ApiKeyMissing"
        })
        .await;
    }
    let key = operator.server.api_key().expose().to_owned();
    create_api_key_secret(&env, "briq-key", &key, true).await;
    let created = Timestamp::now();
    for name in &executors {
        let ready = wait_ready(&env, name).await;
        let at = time(ready.status.as_ref().and_then(|s| s.ready_time.as_ref()));
        // Setup itself takes a few seconds here; the recheck that finds the Secret adds at most
        // a few more.
        let waited = at.duration_since(created);
        assert!(
            waited <= SignedDuration::from_secs(20),
            "{name} was Ready {waited:?} after its Secret appeared"
        );
        let step = finished(&env, &format!("{name}-step"), READY_SECONDS).await;
        assert_eq!(output(&step), "2", "{:?}", condition(&step, "Succeeded"));
    }
}
