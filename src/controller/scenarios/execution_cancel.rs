//! `spec.cancel` through the real `execution::reconcile`: the sandbox's journal claims an
//! attempt never sent, or interrupts one running; its answer, not the request, decides the
//! reason (a run that finished first stays finished).

use std::sync::Arc;

use http::Method;
use kube::runtime::controller::Action;
use serde_json::json;

use super::world::{
    ATTEMPT, CODE, EXECUTION, EXECUTION_UID, SANDBOX, World, assert_concluded, briq_with_sandbox,
    execution_status_path, new_execution, ready_executor,
};
use crate::{
    bridge::fake::{Call, Reply, result},
    controller::execution,
    crd::{EXECUTOR_MANAGER, Execution},
};

fn cancelled(mut execution: Execution) -> Execution {
    execution.spec.cancel = true;
    execution
}

/// The Execution as `Running` left it: its attempt recorded, sent, no result yet.
fn running() -> Execution {
    let mut execution = new_execution(EXECUTION, EXECUTION_UID, CODE);
    execution.status = Some(
        serde_json::from_value(json!({
            "observedGeneration": 1,
            "attemptId": ATTEMPT,
            "startTime": crate::crd::conditions::now(),
            "conditions": [{
                "type": "Succeeded", "status": "Unknown", "reason": "Running",
                "message": "running in BriqExecutor py", "observedGeneration": 1,
                "lastTransitionTime": crate::crd::conditions::now(),
            }],
        }))
        .expect("a status"),
    );
    execution
}

#[tokio::test]
async fn a_queued_execution_cancelled_is_claimed_by_the_journal_and_its_code_never_sent() {
    let (mut world, mut server) = World::new(briq_with_sandbox());
    world.cache_executor(&ready_executor());
    let execution = cancelled(new_execution(EXECUTION, EXECUTION_UID, CODE));
    world.watch_execution(&execution);
    let verifier = tokio::spawn(async move {
        let result = server
            .expect(Method::PATCH, &execution_status_path(EXECUTION))
            .await
            .metadata_only(EXECUTION);
        result.assert_applied_by(EXECUTOR_MANAGER);
        assert_eq!(result.condition_reason("Succeeded"), Some("Cancelled"));
        assert_eq!(
            result.body["status"]["attemptId"],
            json!(null),
            "no attempt was ever recorded"
        );
        server.done().await;
    });
    let action = execution::reconcile(Arc::new(execution), world.execution_ctx()).await;
    let calls = world.finish(verifier).await;

    assert_eq!(action.unwrap(), Action::await_change());
    assert_eq!(
        calls,
        [
            Call::Get { id: SANDBOX.into() },
            // The journal takes the attempt id as cancelled: a late delivery never runs it.
            Call::exec(SANDBOX, "cancel"),
        ]
    );
}

#[tokio::test]
async fn a_running_execution_cancelled_is_interrupted_in_its_kernel_and_concluded_cancelled() {
    let (mut world, mut server) = World::new(briq_with_sandbox());
    world.cache_executor(&ready_executor());
    let execution = cancelled(running());
    world.watch_execution(&execution);
    let verifier = tokio::spawn(async move {
        let result = server
            .expect(Method::PATCH, &execution_status_path(EXECUTION))
            .await
            .metadata_only(EXECUTION);
        assert_concluded(&result, "Cancelled");
        assert_eq!(
            result.body["status"]["error"]["name"], "KeyboardInterrupt",
            "{result:?}"
        );
        server.done().await;
    });
    let action = execution::reconcile(Arc::new(execution), world.execution_ctx()).await;
    let calls = world.finish(verifier).await;

    assert_eq!(action.unwrap(), Action::await_change());
    assert_eq!(
        calls,
        [
            Call::Get { id: SANDBOX.into() },
            Call::exec(SANDBOX, "cancel")
        ]
    );
}

#[tokio::test]
async fn a_cancel_that_comes_after_the_run_finished_keeps_the_runs_own_result() {
    let (mut world, mut server) = World::new(briq_with_sandbox());
    world
        .briq()
        .answer("cancel", Reply::Envelope(result("ok", "42")));
    world.cache_executor(&ready_executor());
    let execution = cancelled(running());
    world.watch_execution(&execution);
    let verifier = tokio::spawn(async move {
        let result = server
            .expect(Method::PATCH, &execution_status_path(EXECUTION))
            .await
            .metadata_only(EXECUTION);
        assert_concluded(&result, "Completed");
        assert_eq!(result.body["status"]["output"], "42");
        server.done().await;
    });
    let action = execution::reconcile(Arc::new(execution), world.execution_ctx()).await;
    let calls = world.finish(verifier).await;

    assert_eq!(action.unwrap(), Action::await_change());
    assert_eq!(
        calls,
        [
            Call::Get { id: SANDBOX.into() },
            Call::exec(SANDBOX, "cancel")
        ]
    );
}
