//! Shared test support: one real control plane (etcd + kube-apiserver) per test binary, the CRDs
//! installed once, and a fresh namespace per test.
//!
//! `BRIQ_TEST_KUBECONFIG` points the tests at a control plane the caller already runs instead.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock},
};

use briq_operator::control_plane::{self, ControlPlane};
use briq_operator::crd::{BriqExecutor, Execution};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client, api::PostParams};
use serde_json::{Value, json};

/// Cold setup of a local sandbox (bridge upload, import check, kernel start) on a busy machine.
pub const READY_SECONDS: u64 = 90;

struct Cluster {
    kubeconfig: PathBuf,
    kubectl: PathBuf,
    // Keeps etcd and kube-apiserver alive for the whole test binary.
    _plane: Option<ControlPlane>,
}

pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        // Each #[tokio::test] has a runtime of its own that ends with the test: start the control
        // plane on a runtime of its own too, so nothing it needs dies with the first test.
        std::thread::spawn(|| {
            tokio::runtime::Runtime::new()
                .expect("tokio runtime")
                .block_on(start_cluster())
        })
        .join()
        .expect("control plane start panicked")
    })
}

async fn start_cluster() -> Cluster {
    let bin_dir = control_plane::binaries(repo_root()).expect("control-plane binaries");
    let kubectl = bin_dir.join("kubectl");
    let (kubeconfig, plane) = match std::env::var_os("BRIQ_TEST_KUBECONFIG") {
        Some(path) => (PathBuf::from(path), None),
        None => {
            let plane = ControlPlane::start(&bin_dir)
                .await
                .expect("starting the control plane");
            (plane.kubeconfig().to_owned(), Some(plane))
        }
    };
    let client = client_for(&kubeconfig).await;
    briq_operator::crd::install(&client)
        .await
        .expect("installing the CRDs");
    Cluster {
        kubeconfig,
        kubectl,
        _plane: plane,
    }
}

async fn config_for(kubeconfig: &Path) -> kube::Config {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kube config")
}

async fn client_for(kubeconfig: &Path) -> Client {
    Client::try_from(config_for(kubeconfig).await).expect("kube client")
}

/// Every request a client sent, as `METHOD path?query`: what an operator asked of the API server.
#[derive(Clone, Default)]
pub struct RequestLog(Arc<Mutex<Vec<String>>>);

impl RequestLog {
    /// An admin client, like [`TestEnv::client`], whose requests land in this log.
    pub async fn client(&self, env: &TestEnv) -> Client {
        let log = self.clone();
        let record = tower::util::MapRequestLayer::new(move |request: http::Request<_>| {
            log.0.lock().expect("request log").push(format!(
                "{} {}",
                request.method(),
                request.uri()
            ));
            request
        });
        kube::client::ClientBuilder::try_from(config_for(&env.kubeconfig).await)
            .expect("kube client")
            .with_layer(&record)
            .build()
    }

    pub fn len(&self) -> usize {
        self.0.lock().expect("request log").len()
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

/// One test's view of the cluster: an admin client and a namespace of its own. Without
/// kube-controller-manager namespaces never finish deleting, so they are left behind.
pub struct TestEnv {
    pub client: Client,
    pub namespace: String,
    pub kubeconfig: PathBuf,
    pub kubectl: PathBuf,
}

impl TestEnv {
    pub async fn new(prefix: &str) -> TestEnv {
        let cluster = cluster();
        let client = client_for(&cluster.kubeconfig).await;
        let namespace = format!("{prefix}-{:08x}", rand::random::<u32>());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": namespace }
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("creating the test namespace");
        TestEnv {
            client,
            namespace,
            kubeconfig: cluster.kubeconfig.clone(),
            kubectl: cluster.kubectl.clone(),
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

/// The venv whose Python runs the local sandboxes (it has the bridge's dependencies, so setup
/// skips pip and no test reaches a package index).
pub fn sandbox_venv() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        if let Some(venv) = std::env::var_os("BRIQ_SANDBOX_VENV") {
            return PathBuf::from(venv);
        }
        let out = std::process::Command::new("bash")
            .arg(repo_root().join(".ci/python-env.sh"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("running .ci/python-env.sh");
        assert!(out.status.success(), ".ci/python-env.sh failed");
        PathBuf::from(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap_or_default()
                .trim(),
        )
    })
    .clone()
}

/// A local sandbox server and the operator's controllers, both in this test's process and
/// scoped to the test's namespace, so tests running at once never see each other's objects.
pub struct Operator {
    pub server: briq_operator::local_server::LocalServer,
    pub settings: briq_operator::controller::Settings,
    client: Client,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Operator {
    pub async fn start(env: &TestEnv) -> Operator {
        Operator::start_with(env, |_| {}).await
    }

    pub async fn start_with(
        env: &TestEnv,
        adjust: impl FnOnce(&mut briq_operator::controller::Settings),
    ) -> Operator {
        Operator::start_as(env, env.client.clone(), adjust).await
    }

    /// [`Operator::start_with`], with `client` as the operator's client.
    pub async fn start_as(
        env: &TestEnv,
        client: Client,
        adjust: impl FnOnce(&mut briq_operator::controller::Settings),
    ) -> Operator {
        use briq_operator::{briq::ApiKey, controller::Settings, local_server};
        // The operator's logs go to stderr, past the test harness's capture: only when asked.
        if std::env::var_os("RUST_LOG").is_some() {
            briq_operator::telemetry::init(briq_operator::telemetry::LogFormat::Text, "info");
        }
        let key = ApiKey::new(format!("test-key-{:016x}", rand::random::<u64>())).unwrap();
        let mut config = local_server::Config::new(key.clone());
        config.python_venv = Some(sandbox_venv());
        let server = local_server::spawn(config)
            .await
            .expect("starting the local sandbox server");
        let mut settings = Settings {
            default_api_key: Some(key),
            namespace: Some(env.namespace.clone()),
            backoff_base: std::time::Duration::from_millis(200),
            backoff_max: std::time::Duration::from_secs(5),
            ..Settings::default()
        };
        adjust(&mut settings);
        let mut operator = Operator {
            server,
            settings,
            client,
            task: None,
        };
        operator.resume();
        operator
    }

    /// Starts the controllers (again).
    pub fn resume(&mut self) {
        assert!(self.task.is_none(), "the operator is already running");
        let sandboxes = briq_operator::briq::BriqClient::new(
            briq_operator::briq::ClientOptions::new(self.server.url()),
        )
        .expect("briq client");
        let run = briq_operator::controller::run(
            self.client.clone(),
            sandboxes,
            self.settings.clone(),
            std::future::pending(),
        );
        self.task = Some(tokio::spawn(run));
    }

    /// Stops the controllers abruptly, like a crashed or killed operator process.
    pub async fn kill(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    pub fn admin(&self) -> briq_operator::local_server::AdminClient {
        self.server.admin()
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

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Waits until `condition` holds for the named object, or panics after `seconds`.
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    seconds: u64,
    condition: impl Fn(&K) -> bool,
) -> K
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let wait =
        kube::runtime::wait::await_condition(api.clone(), name, move |object: Option<&K>| {
            object.is_some_and(&condition)
        });
    match tokio::time::timeout(std::time::Duration::from_secs(seconds), wait).await {
        Ok(Ok(Some(object))) => object,
        Ok(other) => panic!("waiting for {name}: {other:?}"),
        Err(_) => panic!(
            "{name} did not reach the expected state within {seconds}s: {:#?}",
            api.get_opt(name).await
        ),
    }
}

/// Waits until the named object is gone.
pub async fn wait_deleted<K>(api: &Api<K>, name: &str, seconds: u64)
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let uid = match api.get_opt(name).await.expect("get") {
        Some(object) => object.meta().uid.clone().unwrap_or_default(),
        None => return,
    };
    let wait = kube::runtime::wait::await_condition(
        api.clone(),
        name,
        kube::runtime::wait::conditions::is_deleted(&uid),
    );
    if tokio::time::timeout(std::time::Duration::from_secs(seconds), wait)
        .await
        .is_err()
    {
        panic!(
            "{name} still exists after {seconds}s: {:#?}",
            api.get_opt(name).await
        );
    }
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
