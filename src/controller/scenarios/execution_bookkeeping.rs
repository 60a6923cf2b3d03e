//! What the execution controller keeps in memory of an Execution: nothing once it finished and
//! the cache shows it (its code, its cancel, its place under its class all gone), and nothing
//! after the sweep of one deleted while a reconcile of it was still adding to it.

use std::sync::Arc;

use http::Method;
use serde_json::json;

use super::world::{
    CODE, EXECUTION as NAME, EXECUTION_UID as UID, EXECUTOR, NAMESPACE, PLATFORM_NAMESPACE, World,
    assert_concluded, briq_with_sandbox, execution_status_path, new_execution, ready_executor,
};
use crate::controller::scenarios::api_server::ApiServer;
use crate::{
    controller::execution,
    crd::{BriqExecutor, BriqExecutorClass, CLASS_ANNOTATION, Execution},
};

/// A class letting one Execution of its executors run at once per namespace.
fn one_at_a_time() -> BriqExecutorClass {
    serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutorClass",
        "metadata": { "name": "one-at-a-time", "uid": "c1a55000-0000-4000-8000-000000000001" },
        "spec": {
            "apiKeySecretRef": { "name": "key" },
            "perNamespace": { "maxRunningExecutions": 1 },
        },
    }))
    .expect("a class")
}

/// Answers the read of the class's key Secret.
async fn key_secret_read(server: &mut ApiServer) {
    server
        .expect(
            Method::GET,
            &format!("/api/v1/namespaces/{PLATFORM_NAMESPACE}/secrets/key"),
        )
        .await
        .reply(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {
                "name": "key", "namespace": PLATFORM_NAMESPACE,
                "labels": { "briq.cloud/api-key": "true" },
            },
            "data": { "BRIQ_API_KEY": "a2V5" },
        }));
}

/// A ready executor made under [`one_at_a_time`], named `name`.
fn classed_executor(name: &str, uid: &str) -> BriqExecutor {
    let mut executor = ready_executor();
    executor.metadata.name = Some(name.into());
    executor.metadata.uid = Some(uid.into());
    executor
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(CLASS_ANNOTATION.into(), "one-at-a-time".into());
    executor
}

/// `execution` as the API server holds it after `status` was applied.
fn with_status(execution: &Execution, status: &serde_json::Value) -> Execution {
    let mut written = execution.clone();
    written.status = Some(serde_json::from_value(status.clone()).expect("a status"));
    written
}

#[tokio::test]
async fn a_finished_execution_leaves_no_entry_once_the_cache_shows_it() {
    let (mut world, mut server) = World::with_classes(briq_with_sandbox());
    world.cache_class(&one_at_a_time());
    world.cache_executor(&classed_executor(
        EXECUTOR,
        "0c6a4f1e-7d2b-4c3a-9e8f-1a2b3c4d5e6f",
    ));
    let execution = new_execution(NAME, UID, CODE);
    world.watch_execution(&execution);
    let ctx = world.execution_ctx();
    assert_eq!(ctx.kept_of_execution(&execution), 1, "its code, heard");
    let (written_tx, written_rx) = tokio::sync::oneshot::channel();
    let verifier = tokio::spawn(async move {
        key_secret_read(&mut server).await;
        let result = server
            .expect(Method::PATCH, &execution_status_path(NAME))
            .await
            .metadata_only(NAME);
        assert_concluded(&result, "Completed");
        written_tx
            .send(result.body["status"].clone())
            .expect("the test waits");
        server.done().await;
    });
    execution::reconcile(Arc::new(execution.clone()), ctx.clone())
        .await
        .expect("run");
    let finished = with_status(&execution, &written_rx.await.expect("the result"));
    assert_eq!(
        ctx.kept_of_execution(&finished),
        1,
        "only that it finished, until the cache shows it"
    );
    world.watch_execution(&finished);
    execution::reconcile(Arc::new(finished.clone()), ctx.clone())
        .await
        .expect("a finished Execution's reconcile");
    assert_eq!(ctx.kept_of_execution(&finished), 0);
    drop(ctx);
    world.finish(verifier).await;
}

#[tokio::test]
async fn a_wait_for_a_place_begun_after_the_execution_was_deleted_goes_at_the_sweep() {
    let (mut world, mut server) = World::with_classes(briq_with_sandbox());
    world.cache_class(&one_at_a_time());
    let other = "9a9a9a9a-0000-4000-8000-000000000009";
    world.cache_executor(&classed_executor(
        EXECUTOR,
        "0c6a4f1e-7d2b-4c3a-9e8f-1a2b3c4d5e6f",
    ));
    world.cache_executor(&classed_executor("py-2", other));
    // The namespace's one place is taken by an Execution running on the other executor.
    let mut running = new_execution("elsewhere", "7e57c0de-0000-4000-8000-000000000009", "1");
    running.spec.executor_ref.name = "py-2".into();
    running.metadata.owner_references = None;
    let running = with_status(
        &running,
        &json!({ "attemptId": "7e57c0de000040008000000000000009" }),
    );
    world.watch_execution(&running);
    let execution = new_execution(NAME, UID, CODE);
    world.watch_execution(&execution);
    let verifier = tokio::spawn(async move {
        let waiting = server
            .expect(Method::PATCH, &execution_status_path(NAME))
            .await
            .metadata_only(NAME);
        assert_eq!(
            waiting.condition_reason("Succeeded"),
            Some("WaitingForCapacity")
        );
        server.done().await;
    });
    let ctx = world.execution_ctx();
    // The watch hears the deletion while a reconcile of it is still under way, which then
    // tells it to wait for a place.
    ctx.deleted(&execution);
    execution::reconcile(Arc::new(execution.clone()), ctx.clone())
        .await
        .expect("told to wait");
    assert!(ctx.kept_of_execution(&execution) > 0, "its wait is kept");
    world.uncache_execution(&execution);
    ctx.sweep();
    assert_eq!(ctx.kept_of_execution(&execution), 0, "in {NAMESPACE}");
    drop(ctx);
    world.finish(verifier).await;
}
