//! Tenants share the operator's capacity fairly: a noisy namespace with more long actions in
//! flight than the operator has work slots does not make a quiet namespace's one-line action
//! wait for them. One operator serves both namespaces (all namespaces: this binary holds this one
//! test, so that no other test's objects meet it).

mod support;

use briq_dev::stack::Controllers;
use briq_operator::crd::Execution;
use serde_json::json;
use support::{
    Gate, TestEnv, condition, create_execution, create_execution_from, create_executor, finished,
    output, reason, sandbox_server, settings, wait_for, wait_ready,
};

/// The operator's work slots (`--max-concurrent-executions`), fewer than the noisy actions.
const WORK_SLOTS: u16 = 2;
const NOISY: usize = 3;

fn running(execution: &Execution) -> bool {
    execution
        .status
        .as_ref()
        .is_some_and(|status| status.attempt_id.is_some())
        && condition(execution, "Succeeded").0 == "Unknown"
}

#[tokio::test]
async fn long_actions_of_a_noisy_namespace_beyond_the_work_slots_do_not_hold_up_a_quiet_one() {
    let noisy = TestEnv::new("fair-noisy").await;
    let quiet = TestEnv::new("fair-quiet").await;
    let server = sandbox_server().await;
    let mut all = settings(&noisy, &server);
    all.namespace = None;
    all.execution_concurrency = WORK_SLOTS;
    let _controllers = Controllers::start(noisy.client.clone(), &server, all).expect("controllers");

    // Each noisy action runs until the test lets it end: it cannot end on its own while the
    // quiet one is looked at.
    let gate = Gate::new();
    let blocking = gate.code("'done'");
    for i in 0..NOISY {
        create_executor(&noisy, &format!("py-{i}"), json!({})).await;
    }
    create_executor(&quiet, "py", json!({})).await;
    for i in 0..NOISY {
        wait_ready(&noisy, &format!("py-{i}")).await;
    }
    wait_ready(&quiet, "py").await;
    for i in 0..NOISY {
        let spec = json!({
            "executorRef": { "name": format!("py-{i}") }, "code": blocking, "timeoutSeconds": 40,
        });
        create_execution_from(&noisy, &format!("long-{i}"), spec).await;
    }
    for i in 0..NOISY {
        wait_for(&noisy.api::<Execution>(), &format!("long-{i}"), 30, running).await;
    }

    // More actions in flight than work slots: the quiet namespace's action still runs now.
    create_execution(&quiet, "one-line", "py", "1 + 1").await;
    let done = finished(&quiet, "one-line", 30).await;
    assert_eq!(
        (reason(&done), output(&done)),
        ("Completed".into(), "2".into())
    );
    for i in 0..NOISY {
        let long = noisy
            .api::<Execution>()
            .get(&format!("long-{i}"))
            .await
            .unwrap();
        assert!(
            running(&long),
            "long-{i} is still running: {:?}",
            long.status
        );
    }

    gate.open();
    for i in 0..NOISY {
        let long = finished(&noisy, &format!("long-{i}"), 30).await;
        assert_eq!(
            (reason(&long), output(&long)),
            ("Completed".into(), "'done'".into())
        );
    }
}
