//! Two operators on one namespace at once (two chart releases, leader election off, or a cache
//! lagging after a fail-over): every conditional write decided on one version of an object lands
//! only if the object is still at that version, so each action runs once and each executor
//! keeps one sandbox.

mod support;

use briq_dev::{
    local_server::Operation,
    stack::{self, Controllers},
};
use briq_operator::crd::BriqExecutor;
use serde_json::json;
use support::{
    Operator, TestEnv, create_execution, create_executor, finished, output, reason, wait_ready,
};

const RUN_SECONDS: u64 = 120;

#[tokio::test]
async fn two_operators_at_once_create_one_sandbox_per_executor_and_run_each_execution_once() {
    let env = TestEnv::new("two-operators").await;
    let first = Operator::start(&env).await;
    let settings = stack::settings(Some(&env.namespace), &first.server);
    let _second = Controllers::start(env.client.clone(), &first.server, settings)
        .expect("the second operator's controllers");

    let executors: Vec<String> = (0..5).map(|i| format!("py-{i}")).collect();
    for name in &executors {
        create_executor(&env, name, json!({})).await;
    }
    for name in &executors {
        wait_ready(&env, name).await;
    }
    let stats = first.admin().stats().await.unwrap();
    let live = stats.sandboxes;
    assert_eq!(
        live.len(),
        executors.len(),
        "one sandbox per executor: {live:#?}"
    );
    assert_eq!(
        stats.calls[&Operation::Create],
        executors.len() as u64,
        "one create per executor: the other operator waited for the claim's create"
    );
    for name in &executors {
        let executor = env.api::<BriqExecutor>().get(name).await.unwrap();
        let id = executor.status.unwrap().sandbox_id.unwrap();
        assert!(
            live.iter().any(|s| s.id == id),
            "{name} records a live sandbox"
        );
    }

    create_execution(&env, "setup", "py-0", "ran = []").await;
    assert_eq!(
        reason(&finished(&env, "setup", RUN_SECONDS).await),
        "Completed"
    );
    let names: Vec<String> = (0..20).map(|i| format!("run-{i:02}")).collect();
    for name in &names {
        create_execution(&env, name, "py-0", &format!("ran.append({name:?})")).await;
    }
    for name in &names {
        let done = finished(&env, name, RUN_SECONDS).await;
        assert_eq!(reason(&done), "Completed", "{name}: {:?}", done.status);
    }
    create_execution(&env, "count", "py-0", "','.join(sorted(ran))").await;
    let counted = finished(&env, "count", RUN_SECONDS).await;
    let expected = format!("'{}'", names.join(","));
    assert_eq!(output(&counted), expected, "every action ran exactly once");
}
