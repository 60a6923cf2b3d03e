//! A `BriqExecutor`'s life through the real `executor::reconcile`: created (finalizer, then the
//! sandbox made, provisioned and `KernelReady`) and deleted (sandbox destroyed, finalizer
//! removed).

use std::{sync::Arc, time::Duration};

use http::Method;
use kube::runtime::controller::Action;
use serde_json::json;

use super::{
    api_server::{JSON_PATCH, MERGE_PATCH},
    world::{
        EVENTS_PATH, EXECUTOR_PATH, EXECUTOR_STATUS_PATH, SANDBOX, World, briq_with_sandbox,
        new_executor, ready_executor, sandbox_name_of_executor, to_json, with_finalizer,
    },
};
use crate::{
    bridge::fake::{Call, FakeBriq},
    controller::executor,
    crd::{
        CLASS_ANNOTATION, CREATE_PENDING_ANNOTATION, EXECUTOR_MANAGER, FINALIZER,
        SANDBOX_ID_ANNOTATION,
    },
};

#[tokio::test]
async fn a_new_executor_gets_its_finalizer_then_one_sandbox_provisioned_and_reports_kernel_ready() {
    let (mut world, mut server) = World::new(FakeBriq::default());
    let created = new_executor("1");
    let finalized = with_finalizer(created.clone(), "2");
    world.cache_executor(&created);
    let verifier = {
        let finalized = finalized.clone();
        tokio::spawn(async move {
            // Reconcile 1: the finalizer, and nothing else, before anything is made.
            let patch = server
                .expect(Method::PATCH, EXECUTOR_PATH)
                .await
                .reply(to_json(&finalized));
            assert_eq!(patch.content_type.as_deref(), Some(JSON_PATCH));
            assert_eq!(
                patch.body,
                json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": null},
                    {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
                ])
            );
            // Reconcile 2: a fresh read before a create, which cannot be taken back.
            server
                .expect(Method::GET, EXECUTOR_PATH)
                .await
                .reply(to_json(&finalized));
            // The pending-create mark, conditional on the version read.
            let mut claimed = with_finalizer(finalized.clone(), "3");
            let claim = server.expect(Method::PATCH, EXECUTOR_PATH).await;
            let pending = claim.seen.body["metadata"]["annotations"][CREATE_PENDING_ANNOTATION]
                .as_str()
                .expect("a pending-create mark")
                .to_owned();
            claimed.metadata.annotations =
                Some([(CREATE_PENDING_ANNOTATION.to_owned(), pending.clone())].into());
            let claim = claim.reply(to_json(&claimed));
            assert_eq!(claim.content_type.as_deref(), Some(MERGE_PATCH));
            assert!(pending.ends_with("op-scenario"), "{pending}");
            assert_eq!(
                claim.body,
                json!({"metadata": {
                    "annotations": {CREATE_PENDING_ANNOTATION: pending, CLASS_ANNOTATION: null},
                    "resourceVersion": "2",
                }})
            );
            let provisioning = server
                .expect(Method::PATCH, EXECUTOR_STATUS_PATH)
                .await
                .metadata_only("py");
            provisioning.assert_applied_by(EXECUTOR_MANAGER);
            assert_eq!(provisioning.condition_reason("Ready"), Some("Provisioning"));
            assert_eq!(provisioning.body["status"]["sandboxId"], json!(null));
            // The sandbox made: recorded on a fresh read, conditionally.
            server
                .expect(Method::GET, EXECUTOR_PATH)
                .await
                .reply(to_json(&claimed));
            let mut recorded = with_finalizer(claimed.clone(), "4");
            recorded.metadata.annotations =
                Some([(SANDBOX_ID_ANNOTATION.to_owned(), SANDBOX.to_owned())].into());
            let record = server
                .expect(Method::PATCH, EXECUTOR_PATH)
                .await
                .reply(to_json(&recorded));
            assert_eq!(
                record.body,
                json!({"metadata": {
                    "annotations": {SANDBOX_ID_ANNOTATION: SANDBOX, CREATE_PENDING_ANNOTATION: null},
                    "resourceVersion": "3",
                }})
            );
            let event = server.expect(Method::POST, EVENTS_PATH).await.created();
            assert_eq!(event.body["reason"], "SandboxCreated");
            // Provisioning, now with the sandbox; then Ready.
            let installing = server
                .expect(Method::PATCH, EXECUTOR_STATUS_PATH)
                .await
                .metadata_only("py");
            assert_eq!(installing.condition_reason("Ready"), Some("Provisioning"));
            assert_eq!(installing.body["status"]["sandboxId"], SANDBOX);
            let ready = server
                .expect(Method::PATCH, EXECUTOR_STATUS_PATH)
                .await
                .metadata_only("py");
            ready.assert_applied_by(EXECUTOR_MANAGER);
            assert_eq!(ready.condition_reason("Ready"), Some("KernelReady"));
            assert_eq!(ready.condition_reason("Stalled"), Some("KernelReady"));
            assert_eq!(ready.body["status"]["sandboxId"], SANDBOX);
            assert!(ready.body["status"]["readyTime"].is_string(), "{ready:?}");
            let event = server.expect(Method::POST, EVENTS_PATH).await.created();
            assert_eq!(event.body["reason"], "Ready");
            server.done().await;
        })
    };
    let first = executor::reconcile(Arc::new(created), world.executor_ctx()).await;
    let briq_after_first = world.briq().calls();
    world.cache_executor(&finalized);
    let second = executor::reconcile(Arc::new(finalized), world.executor_ctx()).await;
    let calls = world.finish(verifier).await;

    assert_eq!(first.unwrap(), Action::await_change());
    assert_eq!(briq_after_first, [], "nothing is made before the finalizer");
    assert_eq!(
        second.unwrap(),
        Action::requeue(Duration::from_secs(30)),
        "a ready executor probes its sandbox every probe interval"
    );
    let [create, upload, setup, kernel] = &calls[..] else {
        panic!("{calls:#?}");
    };
    assert_eq!(
        create,
        &Call::Create {
            name: sandbox_name_of_executor()
        }
    );
    assert!(
        matches!(upload, Call::WriteFile { id, path }
            if id == SANDBOX && path.starts_with("/work/.briq/bridge-")),
        "{upload:?}"
    );
    assert_eq!(
        [setup, kernel],
        [
            &Call::exec(SANDBOX, "setup"),
            &Call::exec(SANDBOX, "start-kernel")
        ]
    );
}

#[tokio::test]
async fn deleting_a_ready_executor_destroys_its_sandbox_then_removes_the_finalizer() {
    let (mut world, mut server) = World::new(briq_with_sandbox());
    let mut deleted = ready_executor();
    deleted.metadata.deletion_timestamp = Some(crate::crd::conditions::now());
    world.cache_executor(&deleted);
    let verifier = {
        let mut gone = deleted.clone();
        gone.metadata.finalizers = None;
        tokio::spawn(async move {
            let terminating = server
                .expect(Method::PATCH, EXECUTOR_STATUS_PATH)
                .await
                .metadata_only("py");
            terminating.assert_applied_by(EXECUTOR_MANAGER);
            assert_eq!(terminating.condition_reason("Ready"), Some("Terminating"));
            let event = server.expect(Method::POST, EVENTS_PATH).await.created();
            assert_eq!(event.body["reason"], "SandboxDestroyed");
            // Only once the sandbox is gone: the finalizer, checked to be ours at its index.
            let removal = server
                .expect(Method::PATCH, EXECUTOR_PATH)
                .await
                .reply(to_json(&gone));
            assert_eq!(removal.content_type.as_deref(), Some(JSON_PATCH));
            assert_eq!(
                removal.body,
                json!([
                    {"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER},
                    {"op": "remove", "path": "/metadata/finalizers/0"},
                ])
            );
            server.done().await;
        })
    };
    let action = executor::reconcile(Arc::new(deleted), world.executor_ctx()).await;
    let calls = world.finish(verifier).await;

    assert_eq!(action.unwrap(), Action::await_change());
    assert_eq!(
        calls,
        [
            // Also whatever an uncertain create may have left under its name.
            Call::FindByName {
                name: sandbox_name_of_executor()
            },
            // Never destroyed unless briq confirms it is this executor's own.
            Call::Get { id: SANDBOX.into() },
            Call::Destroy { id: SANDBOX.into() },
        ]
    );
}
