//! Nothing leaks when a namespace goes, or when an executor goes without its finalizer: tried as
//! it happens, with kube-controller-manager deleting the namespace and a tenant stripping the
//! finalizer by hand.

mod support;

use std::time::Duration;

use briq_dev::wait;
use briq_operator::{
    controller::{self, Observer},
    crd::{BriqExecutor, FINALIZER, KEY_IN_USE_FINALIZER},
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};
use serde_json::json;
use support::{
    Operator, TestEnv, create_execution, create_executor, finished, reason, wait_deleted,
    wait_ready,
};
use tokio::task::JoinHandle;

/// Deleting a namespace deletes its executors and their key Secret at once, in no set order.
/// The worst order is forced: the operator is down while kube-controller-manager deletes
/// everything it can, so the Secret would go before any finalizer runs. It is protected while
/// its key is in use, so every finalizer can still destroy its sandbox, and then the namespace
/// goes.
#[tokio::test]
async fn deleting_a_namespace_with_executors_and_their_key_secret_leaves_no_sandbox() {
    let env = TestEnv::new("orph-ns").await;
    let mut operator = Operator::start(&env).await;
    let key = operator.server.api_key().expose().to_owned();
    support::create_api_key_secret(&env, "briq-key", &key, true).await;
    let names = ["a", "b", "c"];
    for name in names {
        let spec = json!({ "apiKeySecretRef": { "name": "briq-key" } });
        create_executor(&env, name, spec).await;
    }
    for name in names {
        wait_ready(&env, name).await;
    }
    assert_eq!(operator.live_sandboxes().await, 3);
    let secret = env.api::<Secret>().get("briq-key").await.unwrap();
    assert!(
        secret
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&KEY_IN_USE_FINALIZER.to_owned()),
        "the key Secret is protected while its key is in use"
    );

    operator.kill().await;
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    namespaces
        .delete(&env.namespace, &DeleteParams::default())
        .await
        .unwrap();
    // kube-controller-manager has deleted what it could: the Secret is gone or held, and every
    // executor waits on its finalizer.
    let secrets = env.api::<Secret>();
    let executors = env.api::<BriqExecutor>();
    wait::poll(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "the namespace controller deleted the Secret and the executors",
        || async {
            let secret_deleted = secrets
                .get_opt("briq-key")
                .await?
                .is_none_or(|s| s.metadata.deletion_timestamp.is_some());
            let executors = executors.list(&Default::default()).await?.items;
            Ok(secret_deleted
                && executors.len() == 3
                && executors
                    .iter()
                    .all(|e| e.metadata.deletion_timestamp.is_some()))
        },
    )
    .await
    .unwrap();
    operator.resume();
    let gone = wait::poll(
        Duration::from_secs(60),
        Duration::from_millis(250),
        "the namespace is gone",
        || async { Ok(namespaces.get_opt(&env.namespace).await?.is_none()) },
    )
    .await;
    let left = operator.admin().stats().await.unwrap().sandboxes;
    if gone.is_err() {
        let secret = secrets
            .get_opt("briq-key")
            .await
            .unwrap()
            .map(|s| s.metadata);
        let executors: Vec<_> = executors
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|e| (e.metadata.name, e.metadata.finalizers, e.status))
            .collect();
        let namespace = namespaces.get_opt(&env.namespace).await.unwrap();
        panic!(
            "the namespace is still there after 60 s; sandboxes left: {left:?}; key Secret: \
             {secret:?}; executors: {executors:?}; namespace: {namespace:?}"
        );
    }
    assert!(left.is_empty(), "sandboxes left behind: {left:?}");
}

/// A tenant deletes a key Secret two Ready executors use: it stays (Terminating) while either
/// holds a sandbox, the executors keep working with it, and it goes when the last of them has
/// destroyed its sandbox.
#[tokio::test]
async fn deleting_a_key_secret_in_use_waits_until_the_last_sandbox_using_it_is_destroyed() {
    let env = TestEnv::new("orph-key").await;
    let operator = Operator::start(&env).await;
    let key = operator.server.api_key().expose().to_owned();
    support::create_api_key_secret(&env, "briq-key", &key, true).await;
    for name in ["a", "b"] {
        let spec = json!({ "apiKeySecretRef": { "name": "briq-key" } });
        create_executor(&env, name, spec).await;
    }
    wait_ready(&env, "a").await;
    wait_ready(&env, "b").await;
    let secrets = env.api::<Secret>();
    secrets
        .delete("briq-key", &DeleteParams::default())
        .await
        .unwrap();
    let held = secrets.get("briq-key").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(held.finalizers(), [KEY_IN_USE_FINALIZER.to_owned()]);

    let executors = env.api::<BriqExecutor>();
    executors
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    wait_deleted(&executors, "a", 30).await;
    assert_eq!(operator.live_sandboxes().await, 1);
    assert!(
        secrets.get_opt("briq-key").await.unwrap().is_some(),
        "b still needs the key"
    );
    create_execution(&env, "still", "b", "2 * 21").await;
    assert_eq!(reason(&finished(&env, "still", 60).await), "Completed");

    executors
        .delete("b", &DeleteParams::default())
        .await
        .unwrap();
    wait_deleted(&executors, "b", 30).await;
    wait_deleted(&secrets, "briq-key", 30).await;
    assert_eq!(operator.live_sandboxes().await, 0);
}

/// The controllers of `env`'s namespace, reporting to `observer`, until aborted.
fn run_controllers(
    env: &TestEnv,
    server: &briq_dev::local_server::LocalServer,
    observer: &Observer,
) -> JoinHandle<()> {
    let mut settings = support::settings(env, server);
    settings.orphan_sweep_interval = Some(Duration::from_secs(2));
    settings.orphan_grace = Duration::from_secs(5);
    let sandboxes = briq_operator::briq::BriqClient::new(
        briq_operator::briq::ClientOptions::local(server.url()),
    )
    .unwrap();
    tokio::spawn(controller::run_observed(
        env.client.clone(),
        sandboxes,
        settings,
        std::future::pending(),
        observer.clone(),
    ))
}

/// A tenant strips the finalizer of a Ready executor and deletes it: its sandbox is orphaned.
/// The sweeper destroys it within its interval and grace, counts it, and leaves the sandbox of
/// the executor that still exists alone.
#[tokio::test]
async fn stripping_the_finalizer_of_a_ready_executor_leaves_an_orphan_the_sweeper_destroys() {
    let env = TestEnv::new("orph-strip").await;
    let server = support::sandbox_server().await;
    let observer = Observer::default();
    let controllers = run_controllers(&env, &server, &observer);
    create_executor(&env, "doomed", json!({})).await;
    create_executor(&env, "keep", json!({})).await;
    let doomed = wait_ready(&env, "doomed").await;
    let kept = wait_ready(&env, "keep").await;
    let doomed_sandbox = doomed.status.unwrap().sandbox_id.unwrap();
    let kept_sandbox = kept.status.unwrap().sandbox_id.unwrap();

    // With the operator down (else it puts its finalizer right back), the finalizer goes by
    // hand and the executor with it.
    controllers.abort();
    let _ = controllers.await;
    let executors = env.api::<BriqExecutor>();
    let strip = json!({ "metadata": { "finalizers": null } });
    executors
        .patch("doomed", &PatchParams::default(), &Patch::Merge(&strip))
        .await
        .unwrap();
    executors
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    wait_deleted(&executors, "doomed", 10).await;
    let live = stack_sandboxes(&server).await;
    assert!(
        live.contains(&doomed_sandbox),
        "the orphan outlives its executor"
    );

    let _controllers = AbortOnDrop(run_controllers(&env, &server, &observer));
    // Interval 2 s + grace 5 s + a destroy. The server forgets a sandbox before it answers the
    // DELETE, so wait for the count, which follows the answer.
    let counted = wait::poll(
        Duration::from_secs(20),
        Duration::from_millis(250),
        "the orphan is destroyed and counted",
        || async {
            let text = observer.metrics.render();
            Ok(text.contains("briq_operator_orphans_destroyed_total 1"))
        },
    )
    .await;
    assert!(
        counted.is_ok(),
        "{counted:?}: {}",
        observer.metrics.render()
    );
    let live = stack_sandboxes(&server).await;
    assert_eq!(live, vec![kept_sandbox.clone()], "only the live executor's");
    // The executor that still exists is untouched and still runs code.
    let kept = executors.get("keep").await.unwrap();
    assert!(kept.finalizers().contains(&FINALIZER.to_owned()));
    create_execution(&env, "still", "keep", "1 + 1").await;
    assert_eq!(reason(&finished(&env, "still", 60).await), "Completed");
    // Another sweep or two changes nothing.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(stack_sandboxes(&server).await, vec![kept_sandbox]);
    assert!(
        observer
            .metrics
            .render()
            .contains("briq_operator_orphans_destroyed_total 1")
    );
}

async fn stack_sandboxes(server: &briq_dev::local_server::LocalServer) -> Vec<String> {
    server
        .admin()
        .stats()
        .await
        .unwrap()
        .sandboxes
        .into_iter()
        .map(|s| s.id)
        .collect()
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
