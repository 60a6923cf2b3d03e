//! One Execution on a ready executor through the real `execution::reconcile`: run once and
//! concluded, and, when briq loses the run's answer, concluded from the sandbox's journal
//! without sending the code again.

use std::sync::Arc;

use http::Method;
use kube::runtime::controller::Action;
use serde_json::json;

use super::world::{
    ATTEMPT, CODE, EXECUTION as NAME, EXECUTION_UID as UID, SANDBOX, World, assert_concluded,
    briq_with_sandbox, execution_status_path, new_execution, path_begins, ready_executor, to_json,
};
use crate::{
    bridge::fake::{Call, Reply},
    briq,
    controller::execution,
    crd::{EXECUTOR_MANAGER, Execution},
};

#[tokio::test]
async fn an_execution_with_its_code_at_hand_sends_it_once_and_writes_only_its_result() {
    let (mut world, mut server) = World::new(briq_with_sandbox());
    world.cache_executor(&ready_executor());
    let execution = new_execution(NAME, UID, CODE);
    path_begins();
    world.watch_execution(&execution);
    let verifier = tokio::spawn(async move {
        // No Running write: the run answered within 100 ms (always: the fake answers on the
        // exec's first poll, so no timer can fire first).
        let result = server
            .expect(Method::PATCH, &execution_status_path(NAME))
            .await
            .metadata_only(NAME);
        assert_concluded(&result, "Completed");
        assert_eq!(result.body["status"]["output"], "2");
        assert_eq!(result.body["metadata"], json!(null), "unconditional");
        server.done().await;
    });
    let action = execution::reconcile(Arc::new(execution), world.execution_ctx()).await;
    assert_eq!(
        world.woken(),
        Vec::<String>::new(),
        "no Execution waits behind it"
    );
    let calls = world.finish(verifier).await;

    assert_eq!(action.unwrap(), Action::await_change());
    assert_eq!(
        calls,
        [
            // The sandbox confirmed as the executor's own before any code goes to it.
            Call::Get { id: SANDBOX.into() },
            Call::exec_with(SANDBOX, "run", CODE),
        ]
    );
}

#[tokio::test]
async fn an_execution_without_its_code_at_hand_records_running_first_and_sends_the_code_it_brings()
{
    let (mut world, mut server) = World::new(briq_with_sandbox());
    world.cache_executor(&ready_executor());
    let execution = new_execution(NAME, UID, CODE);
    world.cache_execution_without_code(&execution);
    let verifier = {
        let execution = execution.clone();
        tokio::spawn(async move {
            let running = server
                .expect(Method::PATCH, &execution_status_path(NAME))
                .await;
            // The server answers with the object as written: its code comes with it.
            let mut recorded = execution.clone();
            recorded.status = Some(
                serde_json::from_value(running.seen.body["status"].clone()).expect("a status"),
            );
            recorded.metadata.resource_version = Some("11".into());
            let running = running.reply(to_json(&recorded));
            running.assert_applied_by(EXECUTOR_MANAGER);
            assert_eq!(running.condition_reason("Succeeded"), Some("Running"));
            assert_eq!(running.body["status"]["attemptId"], ATTEMPT);
            assert_eq!(
                running.body["metadata"],
                json!({"resourceVersion": "10"}),
                "recorded only on the version the turn was decided on"
            );
            let result = server
                .expect(Method::PATCH, &execution_status_path(NAME))
                .await
                .metadata_only(NAME);
            assert_concluded(&result, "Completed");
            server.done().await;
        })
    };
    let mut compacted = execution;
    compacted.spec.code = String::new();
    let action = execution::reconcile(Arc::new(compacted), world.execution_ctx()).await;
    let calls = world.finish(verifier).await;

    assert_eq!(action.unwrap(), Action::await_change());
    assert_eq!(
        calls,
        [
            Call::Get { id: SANDBOX.into() },
            Call::exec_with(SANDBOX, "run", CODE),
        ]
    );
}

#[tokio::test]
async fn a_run_whose_answer_was_lost_is_concluded_from_the_journal_and_never_sent_twice() {
    let (mut world, mut server) = World::new(briq_with_sandbox());
    world.briq().answer(
        "run",
        Reply::Fails(briq::Error::Malformed {
            detail: "the answer was cut off".into(),
            request_id: None,
        }),
    );
    world.cache_executor(&ready_executor());
    let execution = new_execution(NAME, UID, CODE);
    world.watch_execution(&execution);
    let (written_tx, written_rx) = tokio::sync::oneshot::channel();
    let verifier = tokio::spawn(async move {
        // Reconcile 1: the outcome is unknown; said so, with the attempt it waits on.
        let waiting = server
            .expect(Method::PATCH, &execution_status_path(NAME))
            .await
            .metadata_only(NAME);
        waiting.assert_applied_by(EXECUTOR_MANAGER);
        assert_eq!(
            waiting.condition_reason("Succeeded"),
            Some("WaitingForBriq")
        );
        assert_eq!(waiting.body["status"]["attemptId"], ATTEMPT);
        written_tx
            .send(waiting.body["status"].clone())
            .expect("the test waits");
        // Reconcile 2: the journal's answer concludes it.
        let result = server
            .expect(Method::PATCH, &execution_status_path(NAME))
            .await
            .metadata_only(NAME);
        assert_concluded(&result, "Completed");
        server.done().await;
    });
    let first = execution::reconcile(Arc::new(execution.clone()), world.execution_ctx()).await;
    // The watch brings the status written: the attempt, waiting for briq.
    let status = written_rx.await.expect("the waiting status was written");
    let waiting = Execution {
        status: Some(serde_json::from_value(status).expect("a status")),
        ..execution
    };
    world.watch_execution(&waiting);
    let second = execution::reconcile(Arc::new(waiting), world.execution_ctx()).await;
    let calls = world.finish(verifier).await;

    assert_ne!(
        first.unwrap(),
        Action::await_change(),
        "a wait for briq is rechecked"
    );
    assert_eq!(second.unwrap(), Action::await_change());
    assert_eq!(
        calls,
        [
            Call::Get { id: SANDBOX.into() },
            Call::exec_with(SANDBOX, "run", CODE),
            // Ownership already confirmed; the journal asked, the code not sent again.
            Call::exec(SANDBOX, "recall"),
        ]
    );
}
