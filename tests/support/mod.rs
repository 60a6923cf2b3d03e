//! Shared test support: one real control plane (etcd + kube-apiserver) per test binary, the CRDs
//! installed once, and a fresh namespace per test.
//!
//! `BRIQ_TEST_KUBECONFIG` points the tests at a control plane the caller already runs instead.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use briq_dev::{
    local_server::{AdminClient, LocalServer},
    stack::{self, Controllers, Stack},
    wait,
};
use briq_operator::controller::Settings;
use briq_operator::crd::{BriqExecutor, Execution};
use kube::{Api, Client, api::PostParams};
use serde_json::{Value, json};

#[allow(unused_imports)] // not every test binary reads repository files
pub use briq_dev::repo::repo_root;

/// Cold setup of a local sandbox (bridge upload, import check, kernel start) on a busy machine.
pub const READY_SECONDS: u64 = 90;

/// The test binary's control plane (or the caller's, `BRIQ_TEST_KUBECONFIG`), kept alive for the
/// whole binary; nothing else of the stack (each test has its own server and controllers).
fn cluster() -> &'static Stack {
    static CLUSTER: OnceLock<Stack> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        // Each #[tokio::test] has a runtime of its own that ends with the test: start the control
        // plane on a runtime of its own too, so nothing it needs dies with the first test. (The
        // stack's own admin client belongs to that runtime: tests make clients of their own.)
        std::thread::spawn(|| {
            tokio::runtime::Runtime::new()
                .expect("tokio runtime")
                .block_on(
                    Stack::builder()
                        .external(std::env::var_os("BRIQ_TEST_KUBECONFIG").map(PathBuf::from))
                        .start(),
                )
                .expect("starting the control plane")
        })
        .join()
        .expect("control plane start panicked")
    })
}

/// The test binary's own control plane; `None` on a cluster the caller gave
/// (`BRIQ_TEST_KUBECONFIG`).
#[allow(dead_code)] // only the binaries that reach the control plane's processes or CAs
pub fn plane() -> Option<&'static briq_dev::control_plane::ControlPlane> {
    cluster().plane()
}

async fn config_for(kubeconfig: &Path) -> kube::Config {
    stack::kube_config(kubeconfig).await.expect("kube config")
}

async fn client_for(kubeconfig: &Path) -> Client {
    stack::client_for(kubeconfig).await.expect("kube client")
}

/// The operator's logs go to stderr, past the test harness's capture: only when asked.
pub fn init_logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        briq_operator::telemetry::init(briq_operator::telemetry::LogFormat::Text, "info");
    }
}

/// Every request a client sent, as `METHOD path?query`: what an operator asked of the API server.
#[derive(Clone, Default)]
pub struct RequestLog(Arc<Mutex<Vec<String>>>);

impl RequestLog {
    /// An admin client, like [`TestEnv::client`], whose requests land in this log.
    pub async fn client(&self, env: &TestEnv) -> Client {
        self.build(env, None).await
    }

    /// [`RequestLog::client`], whose lists of `resource` (GET of the collection, not a watch)
    /// answer `delay` late: a cache that takes its time to show what exists, as after an API
    /// server restart or a CRD update, or with many objects.
    pub async fn client_with_slow_lists(
        &self,
        env: &TestEnv,
        resource: &'static str,
        delay: Duration,
    ) -> Client {
        self.build(env, Some((resource, delay))).await
    }

    /// A client logging here, with the lists of one resource slowed down when `slow` says so.
    async fn build(&self, env: &TestEnv, slow: Option<(&'static str, Duration)>) -> Client {
        let log = self.clone();
        let record = tower::util::MapRequestLayer::new(move |request: http::Request<_>| {
            log.0.lock().expect("request log").push(format!(
                "{} {}",
                request.method(),
                request.uri()
            ));
            request
        });
        let slow = tower::layer::layer_fn(move |inner| SlowLists { inner, slow });
        briq_operator::kube_client::builder(config_for(&env.kubeconfig).await)
            .expect("kube client")
            .with_layer(&record)
            .with_layer(&slow)
            .build()
    }

    /// The creates (POST) of `resource` logged so far.
    pub fn creates(&self, resource: &str) -> Vec<String> {
        self.0
            .lock()
            .expect("request log")
            .iter()
            .filter(|request| {
                request.strip_prefix("POST ").is_some_and(|target| {
                    let path = target.split_once('?').map_or(target, |(path, _)| path);
                    path.ends_with(&format!("/{resource}"))
                })
            })
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.0.lock().expect("request log").len()
    }

    /// The requests sent after the first `skip`.
    pub fn since(&self, skip: usize) -> Vec<String> {
        self.0.lock().expect("request log")[skip..].to_vec()
    }

    /// The reads (get, list; not watches) of `resource` since the first `skip` requests.
    pub fn reads_since(&self, skip: usize, resource: &str) -> Vec<String> {
        self.0.lock().expect("request log")[skip..]
            .iter()
            .filter(|request| {
                let Some(target) = request.strip_prefix("GET ") else {
                    return false;
                };
                let (path, query) = target.split_once('?').unwrap_or((target, ""));
                !query.contains("watch=true") && path.split('/').any(|part| part == resource)
            })
            .cloned()
            .collect()
    }
}

#[derive(Clone)]
struct SlowLists<S> {
    inner: S,
    /// Which resource's lists answer late, and by how much.
    slow: Option<(&'static str, Duration)>,
}

impl<S, B> tower::Service<http::Request<B>> for SlowLists<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let uri = request.uri();
        let delay = self.slow.filter(|(resource, _)| {
            request.method() == http::Method::GET
                && uri.path().ends_with(&format!("/{resource}"))
                && !uri.query().unwrap_or_default().contains("watch=true")
        });
        let answer = self.inner.call(request);
        match delay {
            None => Box::pin(answer),
            Some((_, delay)) => Box::pin(async move {
                tokio::time::sleep(delay).await;
                answer.await
            }),
        }
    }
}

/// One test's view of the cluster: an admin client and a namespace of its own. Namespaces are
/// left behind (the control plane, and kube-controller-manager which could delete them, end
/// with the test binary); a test may delete its own (see `tests/orphans.rs`).
pub struct TestEnv {
    pub client: Client,
    pub namespace: String,
    pub kubeconfig: PathBuf,
    pub kubectl: PathBuf,
}

impl TestEnv {
    pub async fn new(prefix: &str) -> TestEnv {
        let cluster = cluster();
        let client = client_for(cluster.kubeconfig()).await;
        let namespace = format!("{prefix}-{:08x}", rand::random::<u32>());
        stack::create_namespace(&client, &namespace)
            .await
            .expect("creating the test namespace");
        TestEnv {
            client,
            namespace,
            kubeconfig: cluster.kubeconfig().to_owned(),
            kubectl: cluster.kubectl(),
        }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Runs the control plane's own kubectl against this test's namespace; returns
    /// (success, stdout, stderr).
    pub fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        let out = std::process::Command::new(&self.kubectl)
            .env("KUBECONFIG", &self.kubeconfig)
            .args(["--namespace", &self.namespace])
            .args(args)
            .output()
            .expect("running kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// Controller settings for `env`: its namespace only, `server`'s key as default, quick retries.
pub fn settings(env: &TestEnv, server: &LocalServer) -> Settings {
    Settings {
        backoff_base: Duration::from_millis(200),
        backoff_max: Duration::from_secs(5),
        // The local server answers a create within a second, so a pending-create mark this old has
        // no create in flight any more: a restarted operator looks behind it soon.
        pending_create_expiry: Duration::from_secs(5),
        ..stack::settings(Some(&env.namespace), server)
    }
}

/// A local sandbox server (on the sandbox venv, so setup skips pip and no test reaches a package
/// index) and the operator's controllers, both in this test's process and scoped to the test's
/// namespace, so tests running at once never see each other's objects.
pub struct Operator {
    pub server: LocalServer,
    controllers: Controllers,
}

impl Operator {
    pub async fn start(env: &TestEnv) -> Operator {
        Operator::start_with(env, |_| {}).await
    }

    pub async fn start_with(env: &TestEnv, adjust: impl FnOnce(&mut Settings)) -> Operator {
        Operator::start_as(env, env.client.clone(), adjust).await
    }

    /// [`Operator::start_with`], with `client` as the operator's client.
    pub async fn start_as(
        env: &TestEnv,
        client: Client,
        adjust: impl FnOnce(&mut Settings),
    ) -> Operator {
        Operator::start_on(env, client, sandbox_server().await, adjust)
    }

    /// [`Operator::start_as`], on a sandbox server the test prepared.
    pub fn start_on(
        env: &TestEnv,
        client: Client,
        server: LocalServer,
        adjust: impl FnOnce(&mut Settings),
    ) -> Operator {
        let mut settings = settings(env, &server);
        adjust(&mut settings);
        let controllers = Controllers::start(client, &server, settings).expect("controllers");
        Operator {
            server,
            controllers,
        }
    }

    /// Starts the controllers again.
    pub fn resume(&mut self) {
        self.controllers.resume();
    }

    /// Stops the controllers gracefully, as on SIGTERM; the sandbox server stays up.
    pub async fn stop(self) -> LocalServer {
        self.controllers.stop().await;
        self.server
    }

    /// Stops the controllers abruptly, like a crashed or killed operator process.
    pub async fn kill(&mut self) {
        self.controllers.kill().await;
    }

    pub fn admin(&self) -> AdminClient {
        self.server.admin()
    }

    /// How many API keys briq answers no call of now, as the operator sees it (what the
    /// `briq_operator_briq_unreachable_keys` gauge reads).
    pub fn briq_unreachable_keys(&self) -> usize {
        use briq_operator::briq::SandboxApi as _;
        self.controllers.briq().unreachable_keys()
    }

    pub async fn live_sandboxes(&self) -> usize {
        self.admin()
            .stats()
            .await
            .expect("local server stats")
            .sandboxes
            .len()
    }
}

/// A local sandbox server whose sandboxes use the sandbox venv.
pub async fn sandbox_server() -> LocalServer {
    init_logs();
    let venv = briq_dev::repo::sandbox_venv().expect("the sandbox venv");
    stack::spawn_server(Some(venv))
        .await
        .expect("starting the local sandbox server")
}

/// A local sandbox server that also serves the previous release's REST surface, which the
/// previous release's operator speaks (the upgrade test only).
pub async fn sandbox_server_with_the_previous_surface() -> LocalServer {
    init_logs();
    let venv = briq_dev::repo::sandbox_venv().expect("the sandbox venv");
    let key = briq_operator::briq::ApiKey::new(format!("local-{:016x}", rand::random::<u64>()))
        .expect("a key");
    let mut config = briq_dev::local_server::Config::new(key);
    config.python_venv = Some(venv);
    config.legacy_rest = true;
    briq_dev::local_server::spawn(config)
        .await
        .expect("starting the local sandbox server")
}

/// Waits until `condition` holds for the named object, or panics after `seconds`.
pub async fn wait_for<K: wait::Watched>(
    api: &Api<K>,
    name: &str,
    seconds: u64,
    condition: impl Fn(&K) -> bool,
) -> K {
    wait::for_object(api, name, Duration::from_secs(seconds), condition)
        .await
        .unwrap_or_else(|error| panic!("waiting for {name}: {error:#}"))
}

/// Waits until the named object is gone.
pub async fn wait_deleted<K: wait::Watched>(api: &Api<K>, name: &str, seconds: u64) {
    wait::deleted(api, name, Duration::from_secs(seconds))
        .await
        .unwrap_or_else(|error| panic!("waiting for {name} to be deleted: {error:#}"));
}

/// Creates the `BriqExecutorPool` `name` of `replicas` members made from `template`.
pub async fn create_pool(env: &TestEnv, name: &str, replicas: i32, template: Value) {
    let pool: briq_operator::crd::BriqExecutorPool = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "replicas": replicas, "template": template },
    }))
    .unwrap();
    env.api::<briq_operator::crd::BriqExecutorPool>()
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
}

pub async fn create_executor(env: &TestEnv, name: &str, spec: Value) -> BriqExecutor {
    let executor: BriqExecutor =
        serde_json::from_value(json!({ "metadata": { "name": name }, "spec": spec })).unwrap();
    env.api::<BriqExecutor>()
        .create(&PostParams::default(), &executor)
        .await
        .unwrap()
}

pub async fn wait_ready(env: &TestEnv, name: &str) -> BriqExecutor {
    wait_for(
        &env.api::<BriqExecutor>(),
        name,
        READY_SECONDS,
        |executor| condition(executor, "Ready").0 == "True",
    )
    .await
}

pub async fn create_execution(env: &TestEnv, name: &str, executor: &str, code: &str) {
    let spec = json!({ "executorRef": { "name": executor }, "code": code });
    create_execution_from(env, name, spec).await;
}

pub async fn create_execution_from(env: &TestEnv, name: &str, spec: Value) {
    let execution: Execution =
        serde_json::from_value(json!({ "metadata": { "name": name }, "spec": spec })).unwrap();
    env.api::<Execution>()
        .create(&PostParams::default(), &execution)
        .await
        .unwrap();
}

/// Creates an Execution of `code` on `executor` and waits (up to a minute) until it finished.
pub async fn run(env: &TestEnv, name: &str, executor: &str, code: &str) -> Execution {
    create_execution(env, name, executor, code).await;
    finished(env, name, 60).await
}

pub async fn finished(env: &TestEnv, name: &str, seconds: u64) -> Execution {
    wait_for(&env.api::<Execution>(), name, seconds, |execution| {
        ["True", "False"].contains(&condition(execution, "Succeeded").0.as_str())
    })
    .await
}

/// (status, reason, message) of a condition, or empty strings.
pub fn condition<K: serde::Serialize>(object: &K, type_: &str) -> (String, String, String) {
    let value = serde_json::to_value(object).unwrap();
    let found = value["status"]["conditions"]
        .as_array()
        .and_then(|conditions| conditions.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or_default();
    let text = |key: &str| found[key].as_str().unwrap_or_default().to_owned();
    (text("status"), text("reason"), text("message"))
}

/// The sandbox id an executor's status records (empty before it has one).
pub fn sandbox_of(executor: &BriqExecutor) -> String {
    executor
        .status
        .as_ref()
        .and_then(|s| s.sandbox_id.clone())
        .unwrap_or_default()
}

pub fn reason(execution: &Execution) -> String {
    condition(execution, "Succeeded").1
}

pub fn output(execution: &Execution) -> String {
    execution
        .status
        .as_ref()
        .and_then(|s| s.output.clone())
        .unwrap_or_default()
}

/// Exec calls the sandbox server behind `admin` has received.
pub async fn execs(admin: &AdminClient) -> u64 {
    admin
        .stats()
        .await
        .expect("sandbox server stats")
        .calls(briq_dev::local_server::Operation::Exec)
}

/// Waits until the sandbox server behind `admin` has received an exec beyond the first `before`:
/// the code has reached the sandbox.
pub async fn code_reached_sandbox(admin: &AdminClient, before: u64) {
    wait::poll(
        Duration::from_secs(30),
        Duration::from_millis(20),
        "the code reaches the sandbox",
        || async { Ok(execs(admin).await > before) },
    )
    .await
    .unwrap_or_else(|error| panic!("{error}"));
}

/// Creates a Secret holding `key` as `BRIQ_API_KEY`, labelled as an API key (opted in) or not.
pub async fn create_api_key_secret(env: &TestEnv, name: &str, key: &str, labelled: bool) {
    let labels = if labelled {
        json!({ briq_operator::crd::API_KEY_LABEL: briq_operator::crd::API_KEY_LABEL_VALUE })
    } else {
        json!({})
    };
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": labels },
        "stringData": { "BRIQ_API_KEY": key },
    }))
    .unwrap();
    env.api::<k8s_openapi::api::core::v1::Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the Secret");
}

/// Creates a Secret holding `token` under the key `token`, labelled for claimers' environments
/// (opted in) or not.
pub async fn create_claim_env_secret(env: &TestEnv, name: &str, labelled: bool, token: &str) {
    let labels = if labelled {
        json!({ briq_operator::crd::CLAIM_ENV_LABEL: briq_operator::crd::CLAIM_ENV_LABEL_VALUE })
    } else {
        json!({})
    };
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": labels },
        "stringData": { "token": token },
    }))
    .unwrap();
    env.api::<k8s_openapi::api::core::v1::Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the Secret");
}

/// Asks the API server whether `user` may do `verb` on `resource` (`group/resource[/sub]`).
pub async fn may(
    client: &kube::Client,
    user: &str,
    namespace: &str,
    verb: &str,
    group: &str,
    resource: &str,
    name: &str,
) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((resource, sub)) => (resource, sub),
        None => (resource, ""),
    };
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let review: SubjectAccessReview = serde_json::from_value(serde_json::json!({
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "resourceAttributes": {
                "namespace": namespace, "verb": verb, "group": group,
                "resource": resource, "subresource": subresource, "name": name,
            }
        }
    }))
    .unwrap();
    let answer = kube::Api::<SubjectAccessReview>::all(client.clone())
        .create(&kube::api::PostParams::default(), &review)
        .await
        .expect("SubjectAccessReview");
    answer.status.is_some_and(|s| s.allowed)
}

/// Code that runs in its kernel until the test lets it end ([`Gate::open`]): an action that
/// cannot end on its own while the test looks at what happens meanwhile.
pub struct Gate {
    dir: tempfile::TempDir,
}

impl Gate {
    pub fn new() -> Gate {
        Gate {
            dir: tempfile::tempdir().expect("a directory for the gate"),
        }
    }

    /// Python that waits until the gate opens, then evaluates `result`.
    pub fn code(&self, result: &str) -> String {
        let marker = self.dir.path().join("open");
        format!(
            "import os, time\nwhile not os.path.exists({:?}):\n    time.sleep(0.05)\n{result}",
            marker.to_str().expect("a UTF-8 path")
        )
    }

    pub fn open(&self) {
        std::fs::write(self.dir.path().join("open"), b"").expect("opening the gate");
    }
}

/// Two operators on `env`'s namespace, leader election off: an operator process and a second
/// set of controllers on the same sandbox server.
pub async fn two_operators(env: &TestEnv) -> (Operator, Controllers) {
    let first = Operator::start(env).await;
    let settings = stack::settings(Some(&env.namespace), &first.server);
    let second = Controllers::start(env.client.clone(), &first.server, settings)
        .expect("the second operator's controllers");
    (first, second)
}
