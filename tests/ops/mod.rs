//! Support for the tests of running the operator in a cluster (chart, RBAC, leader election,
//! metrics, GitOps): the tools from `tests/tools/build.sh`, the rendered chart, and whole
//! operator processes (`operator::serve`: HTTP endpoints, leader election, controllers) started
//! in this test process against the shared control plane.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
    time::Duration,
};

use briq_operator::{
    briq::{ApiKey, BriqClient, ClientOptions},
    controller::{Observer, Settings},
    http::{Health, Role},
    leader::LeaseConfig,
    local_server::{self, LocalServer},
    metrics::Metrics,
    operator::{self, Options},
};
use serde_json::Value;
use tokio::{sync::oneshot, task::JoinHandle};

use crate::support::{self, TestEnv};

/// The directory holding `bin/helm` and `bin/kstatus`: `BRIQ_TOOLS_DIR`, else what
/// `tests/tools/build.sh --cached` prints (it never builds; `make test` and `.ci/run` do).
pub fn tools_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("BRIQ_TOOLS_DIR") {
            return PathBuf::from(dir);
        }
        let out = std::process::Command::new("bash")
            .arg(support::repo_root().join("tests/tools/build.sh"))
            .arg("--cached")
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("running tests/tools/build.sh --cached");
        assert!(
            out.status.success(),
            "helm and kstatus are not built: run `bash tests/tools/build.sh` (make test does)"
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
    })
}

pub fn tool(name: &str) -> PathBuf {
    tools_dir().join("bin").join(name)
}

pub fn chart_dir() -> PathBuf {
    support::repo_root().join("charts/briq-operator")
}

/// Runs helm; returns (success, stdout, stderr).
pub fn helm(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(tool("helm"))
        // No user configuration, cache or repositories: only what this test hands in.
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("briq-helm-config"),
        )
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("briq-helm-cache"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("briq-helm-data"),
        )
        .args(args)
        .output()
        .expect("running helm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `helm template` of the chart, as YAML text; panics when helm fails.
pub fn template_text(release: &str, namespace: &str, extra: &[&str]) -> String {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        release,
        chart.to_str().unwrap(),
        "--namespace",
        namespace,
    ];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = helm(&args);
    assert!(ok, "helm template {extra:?} failed: {stderr}");
    stdout
}

/// `helm template` of the chart, one JSON value per document.
pub fn template(release: &str, namespace: &str, extra: &[&str]) -> Vec<Value> {
    documents(&template_text(release, namespace, extra))
}

pub fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|document| {
            <Value as serde::Deserialize>::deserialize(document).expect("rendered YAML parses")
        })
        .filter(|document| !document.is_null())
        .collect()
}

pub fn find<'a>(documents: &'a [Value], kind: &str) -> Vec<&'a Value> {
    documents.iter().filter(|d| d["kind"] == kind).collect()
}

/// The admin kube::Config of the test cluster.
pub async fn kube_config(env: &TestEnv) -> kube::Config {
    let kubeconfig = kube::config::Kubeconfig::read_from(&env.kubeconfig).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kube config");
    config.default_namespace = env.namespace.clone();
    config
}

/// A local sandbox server whose sandboxes use the test venv.
pub async fn sandbox_server() -> LocalServer {
    // The operator's logs go to stderr, past the test harness's capture: only when asked.
    if std::env::var_os("RUST_LOG").is_some() {
        briq_operator::telemetry::init(briq_operator::telemetry::LogFormat::Text, "info");
    }
    let key = ApiKey::new(format!("test-key-{:016x}", rand::random::<u64>())).unwrap();
    let mut config = local_server::Config::new(key);
    config.python_venv = Some(support::sandbox_venv());
    local_server::spawn(config)
        .await
        .expect("starting the local sandbox server")
}

/// Controller settings for `env`: its namespace only, the server's key as default, quick retries.
pub fn settings(env: &TestEnv, server: &LocalServer) -> Settings {
    Settings {
        default_api_key: Some(server.api_key().clone()),
        namespace: Some(env.namespace.clone()),
        backoff_base: Duration::from_millis(200),
        backoff_max: Duration::from_secs(5),
        ..Settings::default()
    }
}

/// A short lease in the test namespace, so that fail-overs take seconds.
pub fn lease(env: &TestEnv, name: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        name: name.into(),
        namespace: env.namespace.clone(),
        identity: identity.into(),
        duration_seconds: LEASE_SECONDS,
        grace_seconds: 1,
    }
}

pub const LEASE_SECONDS: u64 = 4;

/// One operator process, as `briq-operator run` runs it, inside this test process.
pub struct Instance {
    pub observer: Observer,
    pub address: SocketAddr,
    pub identity: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Instance {
    pub async fn start(
        config: kube::Config,
        server: &LocalServer,
        settings: Settings,
        lease: Option<LeaseConfig>,
    ) -> Instance {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let role = if lease.is_some() {
            Role::Standby
        } else {
            Role::Single
        };
        let observer = Observer {
            metrics: Arc::new(Metrics::default()),
            health: Arc::new(Health::new(role)),
        };
        let identity = lease
            .as_ref()
            .map(|l| l.identity.clone())
            .unwrap_or_default();
        let sandboxes = BriqClient::new(ClientOptions::new(server.url())).expect("briq client");
        let (stop, stopped) = oneshot::channel::<()>();
        let options = Options {
            settings,
            lease,
            http: Some(listener),
        };
        let task = tokio::spawn(operator::serve(
            config,
            sandboxes,
            options,
            observer.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Instance {
            observer,
            address,
            identity,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Runs the controllers with synced caches (leader, or no leader election).
    pub fn leading(&self) -> bool {
        self.task.is_some() && self.observer.health.controllers_ready()
    }

    /// Stops abruptly, like a killed pod: no lease release, no draining.
    pub async fn kill(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        // A dead process leads nothing (its health is only read by these tests now).
        self.observer.health.set_role(Role::Standby);
        self.observer.health.set_synced(false);
    }

    /// Stops as on SIGTERM and waits until the process would exit.
    pub async fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await
                .expect("the operator task panicked")
                .expect("the operator failed");
        }
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let response = reqwest::get(format!("http://{}{path}", self.address))
            .await
            .expect("HTTP request to the operator");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Waits until `check` holds, polling; panics with `what` after `timeout`.
pub async fn until(timeout: Duration, what: &str, mut check: impl FnMut() -> bool) -> Duration {
    let started = tokio::time::Instant::now();
    while !check() {
        assert!(
            started.elapsed() < timeout,
            "{what}: not within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}
