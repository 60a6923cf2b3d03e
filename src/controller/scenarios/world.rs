//! What a scenario runs in: both controllers' contexts as `run/controllers.rs` builds them, over a
//! [`FakeBriq`] and the in-memory API server ([`api_server`](super::api_server)), with caches
//! the test fills itself (as the watches would); and the objects the scenarios start from.

use std::{
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use http::Method;
use kube::runtime::{
    reflector::{self, ObjectRef, store::Writer},
    watcher,
};
use serde_json::json;
use tokio::{sync::mpsc, task::JoinHandle};

use super::api_server::{self, ApiServer, Seen};
use crate::{
    bridge::fake::{Call, FakeBriq},
    briq::{ApiKey, sandbox_name},
    controller::{
        context::{Settings, Shared, event_recorder},
        execution, executor,
    },
    crd::{
        BriqExecutor, BriqExecutorClass, BriqExecutorPool, EXECUTOR_MANAGER, Execution, FINALIZER,
        POOL_LABEL, POOL_MEMBER_ANNOTATION, SANDBOX_ID_ANNOTATION, TEMPLATE_HASH_LABEL,
        template_hash,
    },
    metrics::Metrics,
};

pub(super) const NAMESPACE: &str = "team";
/// Where classes' key Secrets are ([`World::with_classes`]).
pub(super) const PLATFORM_NAMESPACE: &str = "briq-system";
pub(super) const EXECUTOR: &str = "py";
pub(super) const EXECUTOR_UID: &str = "0c6a4f1e-7d2b-4c3a-9e8f-1a2b3c4d5e6f";
pub(super) const EXECUTOR_PATH: &str = "/apis/briq.cloud/v1alpha1/namespaces/team/briqexecutors/py";
pub(super) const EXECUTOR_STATUS_PATH: &str =
    "/apis/briq.cloud/v1alpha1/namespaces/team/briqexecutors/py/status";
pub(super) const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/team/events";
/// The sandbox a ready executor records.
pub(super) const SANDBOX: &str = "bq_1";

/// The pool a claimer names, and its Ready member (holding [`SANDBOX`]).
pub(super) const POOL: &str = "fast";
pub(super) const POOL_UID: &str = "9b1f0c2d-3e4a-4b5c-8d6e-7f8091a2b3c4";
pub(super) const MEMBER: &str = "fast-x7k2q";
pub(super) const MEMBER_UID: &str = "5d4c3b2a-1f0e-4d9c-8b7a-695847362514";
pub(super) const MEMBER_PATH: &str =
    "/apis/briq.cloud/v1alpha1/namespaces/team/briqexecutors/fast-x7k2q";

/// The Execution the scenarios run, its uid, its attempt id (the uid's hex digits) and its code.
pub(super) const EXECUTION: &str = "step-1";
pub(super) const EXECUTION_UID: &str = "7e57c0de-0000-4000-8000-000000000002";
pub(super) const ATTEMPT: &str = "7e57c0de000040008000000000000002";
pub(super) const CODE: &str = "x = 1 + 1\nx";

/// How long the verifier may take once the client is gone: a guard against a hang, never a
/// wait the scenario needs (the verifier ends as soon as the last request is answered).
const VERIFIER_GUARD: Duration = Duration::from_secs(10);

pub(super) struct World {
    shared: Arc<Shared<FakeBriq>>,
    executor_ctx: Arc<executor::Context<FakeBriq>>,
    execution_ctx: Arc<execution::Context<FakeBriq>>,
    executors: Writer<BriqExecutor>,
    executions: Writer<Execution>,
    pools: Writer<BriqExecutorPool>,
    classes: Writer<BriqExecutorClass>,
    /// Which Executions the execution controller woke.
    woken: mpsc::UnboundedReceiver<ObjectRef<Execution>>,
    _classes_listed: tokio::sync::watch::Sender<bool>,
}

impl World {
    /// Both controllers over `briq` and a new API server, with no class (listed), the default
    /// API key and default settings.
    pub(super) fn new(briq: FakeBriq) -> (World, ApiServer) {
        World::with_settings(briq, Settings::default())
    }

    /// As [`World::new`], with classes' key Secrets in [`PLATFORM_NAMESPACE`].
    pub(super) fn with_classes(briq: FakeBriq) -> (World, ApiServer) {
        let settings = Settings {
            platform_namespace: Some(PLATFORM_NAMESPACE.into()),
            ..Settings::default()
        };
        World::with_settings(briq, settings)
    }

    fn with_settings(briq: FakeBriq, settings: Settings) -> (World, ApiServer) {
        let (client, server) = api_server::pair();
        let (classes_listed_tx, classes_listed) = tokio::sync::watch::channel(true);
        let (classes, class_writer) = reflector::store::<BriqExecutorClass>();
        let settings = Settings {
            default_api_key: Some(ApiKey::new("k").expect("a key")),
            ..settings
        };
        let recorder = event_recorder(client.clone());
        let shared = Arc::new(Shared {
            client,
            sandboxes: briq,
            settings,
            classes,
            classes_listed,
            recorder,
            metrics: Arc::new(Metrics::default()),
            stopping: Arc::new(AtomicBool::new(false)),
            holder: "op-scenario".into(),
        });
        let (execution_store, executions) = reflector::store::<Execution>();
        let (executor_store, executors) = reflector::store::<BriqExecutor>();
        let (pool_store, pools) = reflector::store::<BriqExecutorPool>();
        let (wake, woken) = mpsc::unbounded_channel();
        let execution_ctx = Arc::new(execution::Context::new(
            shared.clone(),
            execution_store.clone(),
            executor_store.clone(),
            wake,
        ));
        // The execution cache is current, as after the watch's first list.
        execution_ctx
            .freshness
            .heard::<Execution>(&Ok(watcher::Event::InitDone));
        let executor_ctx = Arc::new(executor::Context::new(
            shared.clone(),
            executor_store,
            execution_store,
            pool_store,
        ));
        let world = World {
            shared,
            executor_ctx,
            execution_ctx,
            executors,
            executions,
            pools,
            classes: class_writer,
            woken,
            _classes_listed: classes_listed_tx,
        };
        (world, server)
    }

    pub(super) fn executor_ctx(&self) -> Arc<executor::Context<FakeBriq>> {
        self.executor_ctx.clone()
    }

    pub(super) fn execution_ctx(&self) -> Arc<execution::Context<FakeBriq>> {
        self.execution_ctx.clone()
    }

    pub(super) fn briq(&self) -> &FakeBriq {
        &self.shared.sandboxes
    }

    /// The executor cache shows `executor`.
    pub(super) fn cache_executor(&mut self, executor: &BriqExecutor) {
        self.executors
            .apply_watcher_event(&watcher::Event::Apply(executor.clone()));
    }

    /// The pool cache shows `pool`.
    pub(super) fn cache_pool(&mut self, pool: &BriqExecutorPool) {
        self.pools
            .apply_watcher_event(&watcher::Event::Apply(pool.clone()));
    }

    /// The class cache shows `class`.
    pub(super) fn cache_class(&mut self, class: &BriqExecutorClass) {
        self.classes
            .apply_watcher_event(&watcher::Event::Apply(class.clone()));
    }

    /// The Execution cache no longer holds `execution`.
    pub(super) fn uncache_execution(&mut self, execution: &Execution) {
        self.executions
            .apply_watcher_event(&watcher::Event::Delete(execution.clone()));
    }

    /// The Execution watch delivers `execution`: its code is kept beside the cache (as long as
    /// it is not sent), the cache holds it compacted, as `controller::run` does.
    pub(super) fn watch_execution(&mut self, execution: &Execution) {
        let ctx = &self.execution_ctx;
        ctx.heard(execution);
        let mut cached = execution.clone();
        crate::controller::cache::compact_execution(&mut cached);
        self.executions
            .apply_watcher_event(&watcher::Event::Apply(cached));
    }

    /// The Execution cache shows `execution` (compacted), but its code was never heard (a
    /// restart, or the code beyond the budget kept beside the cache).
    pub(super) fn cache_execution_without_code(&mut self, execution: &Execution) {
        let mut cached = execution.clone();
        crate::controller::cache::compact_execution(&mut cached);
        self.executions
            .apply_watcher_event(&watcher::Event::Apply(cached));
    }

    /// The Executions the controller woke so far.
    pub(super) fn woken(&mut self) -> Vec<String> {
        let mut woken = Vec::new();
        while let Ok(object) = self.woken.try_recv() {
            woken.push(object.name);
        }
        woken
    }

    /// Ends the scenario: drops every client, so that the verifier sees the last request was
    /// the last; propagates the verifier's failure. Returns briq's calls.
    pub(super) async fn finish(self, verifier: JoinHandle<()>) -> Vec<Call> {
        self.finish_with(verifier).await.0
    }

    /// [`World::finish`], with what the verifier found.
    pub(super) async fn finish_with<T>(self, verifier: JoinHandle<T>) -> (Vec<Call>, T) {
        let calls = self.shared.sandboxes.calls();
        drop(self);
        match tokio::time::timeout(VERIFIER_GUARD, verifier).await {
            Ok(Ok(found)) => (calls, found),
            Ok(Err(error)) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Ok(Err(error)) => panic!("the verifier failed: {error}"),
            Err(_) => panic!(
                "the verifier did not end within {VERIFIER_GUARD:?}: is a context still held?"
            ),
        }
    }
}

/// The server's copy of the executor, which its status writes change, as the API server's does.
pub(super) struct Served {
    pub(super) executor: BriqExecutor,
    pub(super) version: u64,
}

impl Served {
    /// The fresh read of a step that cannot be taken back.
    pub(super) async fn read(&mut self, server: &mut ApiServer) {
        server
            .expect(Method::GET, EXECUTOR_PATH)
            .await
            .reply(to_json(&self.executor));
    }

    /// A status write of the executor controller, applied to the server's copy.
    pub(super) async fn status_write(&mut self, server: &mut ApiServer) -> Seen {
        let write = server
            .expect(Method::PATCH, EXECUTOR_STATUS_PATH)
            .await
            .metadata_only("py");
        write.assert_applied_by(EXECUTOR_MANAGER);
        self.executor.status =
            Some(serde_json::from_value(write.body["status"].clone()).expect("a status"));
        self.bump();
        write
    }

    pub(super) fn bump(&mut self) {
        self.version += 1;
        self.executor.metadata.resource_version = Some(self.version.to_string());
    }
}

/// The name briq knows the executor's sandbox by.
pub(super) fn sandbox_name_of_executor() -> String {
    sandbox_name(NAMESPACE, EXECUTOR, EXECUTOR_UID)
}

/// A briq with the ready executor's sandbox.
pub(super) fn briq_with_sandbox() -> FakeBriq {
    FakeBriq::default().with_sandbox(SANDBOX, &sandbox_name_of_executor())
}

/// A new executor, as `kubectl apply` makes it (no finalizer yet), at resourceVersion `version`.
/// Where the path `dev/execution-path.sh` counts begins: the coverage counted so far (the
/// world's making) is dropped. Does nothing unless built with `--cfg execution_path`.
pub(super) fn path_begins() {
    #[cfg(execution_path)]
    {
        unsafe extern "C" {
            fn __llvm_profile_reset_counters();
        }
        // SAFETY: compiler-rt's profile runtime, linked by `-C instrument-coverage`, resets this
        // process's counters; the scenario runs alone, on one thread.
        unsafe { __llvm_profile_reset_counters() }
    }
}

pub(super) fn new_executor(version: &str) -> BriqExecutor {
    serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
        "metadata": {
            "name": EXECUTOR, "namespace": NAMESPACE, "uid": EXECUTOR_UID,
            "resourceVersion": version, "generation": 1,
            "creationTimestamp": "2026-12-07T07:00:00Z",
        },
        "spec": {},
    }))
    .expect("an executor")
}

/// `executor`, with the finalizer, at `version`.
pub(super) fn with_finalizer(mut executor: BriqExecutor, version: &str) -> BriqExecutor {
    executor.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
    executor.metadata.resource_version = Some(version.to_owned());
    executor
}

/// The executor once ready: finalizer, sandbox recorded (annotation and status), `Ready`.
pub(super) fn ready_executor() -> BriqExecutor {
    let mut executor = with_finalizer(new_executor("5"), "5");
    executor.metadata.annotations =
        Some([(SANDBOX_ID_ANNOTATION.to_owned(), SANDBOX.to_owned())].into());
    executor.status = Some(
        serde_json::from_value(json!({
            "observedGeneration": 1,
            "sandboxId": SANDBOX,
            "sandboxCreatedTime": "2026-12-07T07:00:01Z",
            "readyTime": "2026-12-07T07:00:02Z",
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KernelReady",
                 "message": "the kernel answers", "observedGeneration": 1,
                 "lastTransitionTime": "2026-12-07T07:00:02Z"},
                {"type": "Stalled", "status": "False", "reason": "KernelReady", "message": "",
                 "observedGeneration": 1, "lastTransitionTime": "2026-12-07T07:00:02Z"},
            ],
        }))
        .expect("a status"),
    );
    executor
}

/// A pool of one member, its template left at every default.
pub(super) fn pool() -> BriqExecutorPool {
    serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutorPool",
        "metadata": {
            "name": POOL, "namespace": NAMESPACE, "uid": POOL_UID,
            "resourceVersion": "3", "generation": 1,
            "creationTimestamp": "2026-12-07T06:58:00Z",
        },
        "spec": { "replicas": 1, "template": {} },
    }))
    .expect("a pool")
}

/// `pool`'s member as the pool controller makes it (owned, labelled and annotated as the
/// pool's, of its current template) once Ready on its own sandbox [`SANDBOX`], at `version`.
pub(super) fn ready_member(pool: &BriqExecutorPool, version: &str) -> BriqExecutor {
    let mut member: BriqExecutor = serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
        "metadata": {
            "name": MEMBER, "namespace": NAMESPACE, "uid": MEMBER_UID,
            "resourceVersion": version, "generation": 1,
            "creationTimestamp": "2026-12-07T06:59:00Z",
            "finalizers": [FINALIZER],
            "labels": { POOL_LABEL: POOL, TEMPLATE_HASH_LABEL: template_hash(pool) },
            "annotations": { POOL_MEMBER_ANNOTATION: POOL, SANDBOX_ID_ANNOTATION: SANDBOX },
            "ownerReferences": [{
                "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutorPool",
                "name": POOL, "uid": POOL_UID, "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {},
    }))
    .expect("a member");
    member.status = ready_executor().status;
    member
}

/// A briq with the member's sandbox.
pub(super) fn briq_with_member_sandbox() -> FakeBriq {
    FakeBriq::default().with_sandbox(SANDBOX, &sandbox_name(NAMESPACE, MEMBER, MEMBER_UID))
}

pub(super) fn executions_path(name: &str) -> String {
    format!("/apis/briq.cloud/v1alpha1/namespaces/{NAMESPACE}/executions/{name}")
}

pub(super) fn execution_status_path(name: &str) -> String {
    format!("{}/status", executions_path(name))
}

/// A new Execution of the executor (owned by it, as the Python client and kubectl-briq make
/// them), running `code`.
pub(super) fn new_execution(name: &str, uid: &str, code: &str) -> Execution {
    serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "Execution",
        "metadata": {
            "name": name, "namespace": NAMESPACE, "uid": uid, "resourceVersion": "10",
            "generation": 1, "creationTimestamp": "2026-12-07T07:01:00Z",
            "ownerReferences": [{
                "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
                "name": EXECUTOR, "uid": EXECUTOR_UID,
            }],
        },
        "spec": { "executorRef": { "name": EXECUTOR }, "code": code },
    }))
    .expect("an Execution")
}

/// JSON of `object`, for the server's answers.
pub(super) fn to_json(object: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(object).expect("JSON")
}

/// `write` is the final status of [`EXECUTION`]'s attempt, with this `Succeeded` reason.
pub(super) fn assert_concluded(write: &Seen, reason: &str) {
    write.assert_applied_by(EXECUTOR_MANAGER);
    assert_eq!(
        write.condition_reason("Succeeded"),
        Some(reason),
        "{write:?}"
    );
    let status = &write.body["status"];
    assert_eq!(status["attemptId"], ATTEMPT, "{write:?}");
    assert!(status["completionTime"].is_string(), "{write:?}");
}
