//! A source executor with a fork waiting, through the real `executor::reconcile`: `Forking`
//! first, written before anything in the sandbox is touched, then one `fork-save` and the
//! snapshot recorded for that fork with `KernelReady` again.

use std::sync::Arc;

use http::Method;
use kube::runtime::controller::Action;
use serde_json::json;
use tokio::sync::mpsc;

use super::world::{
    EVENTS_PATH, NAMESPACE, SANDBOX, Served, World, briq_with_sandbox, ready_executor,
};
use crate::{
    bridge::fake::{Call, FakeBriq, Reply, result},
    controller::executor,
    crd::BriqExecutor,
};

const FORK_UID: &str = "f0f0f0f0-0000-4000-8000-000000000001";

/// A fork of the ready executor, admitted and waiting for a snapshot.
fn waiting_fork() -> BriqExecutor {
    serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
        "metadata": {
            "name": "py-fork-a", "namespace": NAMESPACE, "uid": FORK_UID,
            "resourceVersion": "9", "generation": 1,
        },
        "spec": { "forkFrom": { "name": "py" } },
        "status": { "conditions": [
            {"type": "Ready", "status": "False", "reason": "WaitingForSnapshot",
             "message": "waiting for the source", "lastTransitionTime": "2026-12-07T07:00:03Z"},
        ] },
    }))
    .expect("a fork")
}

#[tokio::test]
async fn a_source_pauses_before_it_touches_its_sandbox_then_saves_once_for_its_waiting_fork() {
    let snapshot = pause_and_save(briq_with_sandbox()).await;
    assert_eq!(
        (&snapshot["parts"], &snapshot["size"]),
        (&1.into(), &10.into())
    );
    assert!(snapshot.get("failure").is_none(), "{snapshot}");
}

/// A bridge that answers a fork-save with something else (an older bridge has no fork-save)
/// does not keep the source paused: its forks get the failure, and it is Ready again.
#[tokio::test]
async fn a_source_whose_bridge_cannot_save_fails_its_forks_instead_of_staying_paused() {
    let briq = briq_with_sandbox();
    briq.answer("fork-save", Reply::Envelope(result("ok", "1")));
    let snapshot = pause_and_save(briq).await;
    let failure = snapshot["failure"].as_str().unwrap_or_default();
    assert!(failure.contains("did not save it"), "{snapshot}");
}

/// Runs the ready source's two reconciles with a fork waiting (`Forking`, then the save), checks
/// what each writes and calls, and answers the snapshot it recorded.
async fn pause_and_save(briq: FakeBriq) -> serde_json::Value {
    let (mut world, mut server) = World::new(briq);
    let source = ready_executor();
    world.cache_executor(&source);
    world.cache_executor(&waiting_fork());
    let (delivered, mut watch) = mpsc::unbounded_channel::<BriqExecutor>();
    let verifier = {
        let mut served = Served {
            executor: source.clone(),
            version: 5,
        };
        tokio::spawn(async move {
            // Reconcile 1: Forking, and nothing touched yet.
            served.read(&mut server).await;
            let forking = served.status_write(&mut server).await;
            assert_eq!(forking.condition_reason("Ready"), Some("Forking"));
            delivered.send(served.executor.clone()).unwrap();
            // Reconcile 2: saved, Ready again with the snapshot for that fork.
            served.read(&mut server).await;
            let saved = served.status_write(&mut server).await;
            assert_eq!(saved.condition_reason("Ready"), Some("KernelReady"));
            let snapshot = saved.body["status"]["snapshot"].clone();
            assert_eq!(snapshot["forks"], json!([FORK_UID]), "{saved:?}");
            let event = server.expect(Method::POST, EVENTS_PATH).await.created();
            assert_eq!(event.body["reason"], "Snapshot");
            server.done().await;
            snapshot
        })
    };
    let pause = executor::reconcile(Arc::new(source), world.executor_ctx()).await;
    let touched_when_pausing = world.briq().calls().len();
    let forking = watch.recv().await.expect("the watch delivers Forking");
    world.cache_executor(&forking);
    let save = executor::reconcile(Arc::new(forking), world.executor_ctx()).await;
    let (all, snapshot) = world.finish_with(verifier).await;

    assert_eq!(pause.unwrap(), Action::await_change());
    assert_eq!(
        save.unwrap(),
        Action::requeue(std::time::Duration::from_secs(30))
    );
    assert_eq!(
        touched_when_pausing, 0,
        "Forking is written before anything is touched"
    );
    assert_eq!(all, [Call::exec(SANDBOX, "fork-save")]);
    snapshot
}
