//! Two operators on one namespace at once (two chart releases, leader election off, or a cache
//! lagging after a fail-over): every conditional write decided on one version of an object lands
//! only if the object is still at that version, so each action runs once and each executor
//! keeps one sandbox.

mod support;

use std::time::Duration;

use briq_dev::local_server::{Fault, FaultRule, Operation};
use briq_operator::crd::BriqExecutor;
use serde_json::json;
use support::{
    TestEnv, create_execution, create_executor, finished, output, reason, two_operators, wait_ready,
};

const RUN_SECONDS: u64 = 120;

#[tokio::test]
async fn two_operators_at_once_create_one_sandbox_per_executor_and_run_each_execution_once() {
    let env = TestEnv::new("two-operators").await;
    let (first, _second) = two_operators(&env).await;

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

#[tokio::test]
async fn two_operators_sending_the_same_executions_attempt_at_the_same_moment_run_it_once() {
    // briq holds every exec a second before it acts, so that both operators' deliveries of an
    // action are in flight together: neither learns from the other's status write first, and
    // only the attempt id, the same for any delivery of one Execution, keeps the sandbox's
    // journal from running it twice.
    let env = TestEnv::new("same-attempt").await;
    let (first, _second) = two_operators(&env).await;
    create_executor(&env, "py", json!({})).await;
    wait_ready(&env, "py").await;
    create_execution(&env, "setup", "py", "ran = []").await;
    assert_eq!(
        reason(&finished(&env, "setup", RUN_SECONDS).await),
        "Completed"
    );

    let admin = first.admin();
    let before = admin.stats().await.unwrap().calls(Operation::Exec);
    let names: Vec<String> = (0..5).map(|i| format!("run-{i}")).collect();
    let slow = FaultRule::on(Operation::Exec, Fault::delay(Duration::from_secs(1)))
        .times(4 * names.len() as u32);
    admin.add_fault(&slow).await.unwrap();
    for name in &names {
        create_execution(&env, name, "py", &format!("ran.append({name:?})")).await;
    }
    for name in &names {
        let done = finished(&env, name, RUN_SECONDS).await;
        assert_eq!(reason(&done), "Completed", "{name}: {:?}", done.status);
    }
    admin.clear_faults().await.unwrap();
    let delivered = admin.stats().await.unwrap().calls(Operation::Exec) - before;
    create_execution(&env, "count", "py", "','.join(ran)").await;
    let counted = finished(&env, "count", RUN_SECONDS).await;
    assert_eq!(
        output(&counted),
        format!("'{}'", names.join(",")),
        "each action ran once, in order ({delivered} execs delivered {} actions)",
        names.len()
    );
}
