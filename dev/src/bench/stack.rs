//! What every scenario stands on: a local control plane (with an audit log), the local sandbox
//! server on the default venv, an operator identity of its own (`CN=briq-operator`, so the audit
//! log tells its requests apart) and helpers to run the controllers in-process per namespace.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams},
    runtime::wait::await_condition,
};
use serde_json::json;

use crate::{
    briq::{ApiKey, BriqClient, ClientOptions},
    control_plane::{self, ControlPlane},
    controller::{self, Settings},
    crd::{self, BriqExecutor, Execution},
    demo::sandbox_venv,
    local_server::{self, LocalServer},
};

/// The operator's user name in the audit log.
pub const OPERATOR_USER: &str = "briq-operator";
const READY_TIMEOUT: Duration = Duration::from_secs(180);
const DELETE_TIMEOUT: Duration = Duration::from_secs(180);

pub use crate::demo::Progress;

pub struct Stack {
    pub repo: PathBuf,
    pub plane: ControlPlane,
    /// Admin (`system:masters`) client: the benchmark's own requests.
    pub admin: Client,
    /// Kubeconfig of [`OPERATOR_USER`] (also in `system:masters`).
    pub operator_kubeconfig: PathBuf,
    operator_client: Client,
    /// The local sandbox server on the default venv (the bridge's dependencies installed).
    pub server: LocalServer,
    pub sandboxes: BriqClient,
    pub venv: PathBuf,
}

impl Stack {
    pub async fn start(progress: &Progress) -> anyhow::Result<Stack> {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).to_owned();
        progress.step("building or reusing the local control plane (first run: several minutes)");
        let bin_dir = tokio::task::spawn_blocking({
            let repo = repo.clone();
            move || control_plane::binaries(&repo)
        })
        .await??;
        let options = control_plane::Options { audit_log: true };
        let plane = ControlPlane::start_with(&bin_dir, options).await?;
        let admin = Client::try_from(plane.client_config().await?)?;
        crd::install(&admin).await?;
        let operator_kubeconfig = plane.kubeconfig_for(OPERATOR_USER, &["system:masters"])?;
        let operator_client = client_for(&operator_kubeconfig).await?;
        progress.step(format!(
            "kube-apiserver ready at {} (audit log on)",
            plane.server()
        ));
        let venv = tokio::task::spawn_blocking({
            let repo = repo.clone();
            move || sandbox_venv(&repo)
        })
        .await??;
        let server = spawn_server(Some(venv.clone())).await?;
        let sandboxes = BriqClient::new(ClientOptions::new(server.url()))?;
        progress.step(format!("local sandbox server at {}", server.url()));
        Ok(Stack {
            repo,
            plane,
            admin,
            operator_kubeconfig,
            operator_client,
            server,
            sandboxes,
            venv,
        })
    }

    pub fn key(&self) -> &ApiKey {
        self.server.api_key()
    }

    pub async fn namespace(&self, name: &str) -> anyhow::Result<()> {
        let ns: Namespace = serde_json::from_value(json!({ "metadata": { "name": name } }))?;
        Api::<Namespace>::all(self.admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        Ok(())
    }

    /// The controllers, in this process, for `namespace`, on the default sandbox server.
    pub fn operator(&self, namespace: &str) -> anyhow::Result<InProcessOperator> {
        self.operator_on(namespace, &self.server)
    }

    /// The controllers, in this process, for `namespace`, on `server`.
    pub fn operator_on(
        &self,
        namespace: &str,
        server: &LocalServer,
    ) -> anyhow::Result<InProcessOperator> {
        let settings = Settings {
            default_api_key: Some(server.api_key().clone()),
            namespace: Some(namespace.to_owned()),
            ..Settings::default()
        };
        let sandboxes = BriqClient::new(ClientOptions::new(server.url()))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(controller::run(
            self.operator_client.clone(),
            sandboxes,
            settings,
            async {
                let _ = stopped.await;
            },
        ));
        Ok(InProcessOperator {
            stop: Some(stop),
            task,
        })
    }

    /// Stops serving sandboxes (every sandbox process is killed) and the control plane.
    pub async fn stop(self) {
        self.server.shutdown().await;
        drop(self.plane);
    }
}

/// A controller run inside this process; aborted when dropped.
pub struct InProcessOperator {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl InProcessOperator {
    /// Lets the controllers finish what they started, then stops them.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(Duration::from_secs(15), &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }
}

impl Drop for InProcessOperator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(Client::try_from(config)?)
}

/// A local sandbox server with a fresh key; `venv` is its sandboxes' Python.
pub async fn spawn_server(venv: Option<PathBuf>) -> anyhow::Result<LocalServer> {
    let key = ApiKey::new(format!("bench-{:016x}", rand::random::<u64>()))?;
    let mut config = local_server::Config::new(key);
    config.python_venv = venv;
    local_server::spawn(config).await
}

pub fn executor(name: &str, spec: serde_json::Value) -> anyhow::Result<BriqExecutor> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1",
        "kind": "BriqExecutor",
        "metadata": { "name": name },
        "spec": spec,
    }))?)
}

pub fn execution(name: &str, executor: &str, code: &str) -> anyhow::Result<Execution> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1",
        "kind": "Execution",
        "metadata": { "name": name },
        "spec": { "executorRef": { "name": executor }, "code": code },
    }))?)
}

fn condition<'a>(
    conditions: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// `Succeeded` is True or False.
pub fn finished(execution: &Execution) -> bool {
    execution
        .status
        .as_ref()
        .and_then(|s| condition(&s.conditions, "Succeeded"))
        .is_some_and(|c| c.status != "Unknown")
}

/// Checks that a finished Execution of `1 + 1` succeeded with output `2`.
pub fn check_two(execution: &Execution) -> anyhow::Result<()> {
    let status = execution.status.clone().unwrap_or_default();
    let succeeded = condition(&status.conditions, "Succeeded");
    if succeeded.is_none_or(|c| c.status != "True") || status.output.as_deref() != Some("2") {
        bail!(
            "Execution {} did not give 2: {:?}, output {:?}",
            execution.name_any(),
            succeeded.map(|c| (&c.reason, &c.message)),
            status.output
        );
    }
    Ok(())
}

/// Ready=True, Ready=False with a final reason (Stalled=True, or `reason`), else still going.
pub fn ready_reason(executor: &BriqExecutor) -> Option<(bool, String, String)> {
    let status = executor.status.as_ref()?;
    let ready = condition(&status.conditions, "Ready")?;
    let stalled = condition(&status.conditions, "Stalled").is_some_and(|c| c.status == "True");
    (ready.status == "True" || stalled || ready.status == "False").then(|| {
        (
            ready.status == "True",
            ready.reason.clone(),
            ready.message.clone(),
        )
    })
}

/// Waits until the executor is Ready (an error if it stalls or fails).
pub async fn wait_ready(api: &Api<BriqExecutor>, name: &str) -> anyhow::Result<BriqExecutor> {
    let decided = |e: Option<&BriqExecutor>| {
        e.and_then(ready_reason)
            .is_some_and(|(ready, reason, _)| ready || reason != "Provisioning")
    };
    let found = tokio::time::timeout(READY_TIMEOUT, await_condition(api.clone(), name, decided))
        .await
        .with_context(|| format!("executor {name} was not ready within {READY_TIMEOUT:?}"))??
        .with_context(|| format!("executor {name} disappeared"))?;
    match ready_reason(&found) {
        Some((true, _, _)) => Ok(found),
        Some((false, reason, message)) => bail!("executor {name}: {reason}: {message}"),
        None => bail!("executor {name} has no Ready condition"),
    }
}

/// Creates executors `names` (spec `spec`), `at_once` at a time, each waited on until Ready.
/// One whose setup fails (a kernel start-up past its deadline on a busy machine, say) is
/// deleted and created again, twice at most; returns how many setups failed so.
pub async fn create_ready(
    api: &Api<BriqExecutor>,
    names: &[String],
    spec: &serde_json::Value,
    at_once: usize,
) -> anyhow::Result<usize> {
    let failures = AtomicU64::new(0);
    stream::iter(names)
        .map(|name| {
            let failures = &failures;
            async move {
                for attempt in 0.. {
                    api.create(&PostParams::default(), &executor(name, spec.clone())?)
                        .await?;
                    match wait_ready(api, name).await {
                        Ok(_) => return Ok(()),
                        Err(error) if attempt >= 2 => return Err(error),
                        Err(_) => {
                            failures.fetch_add(1, Ordering::SeqCst);
                            api.delete(name, &DeleteParams::default()).await?;
                            wait_gone(api, name).await?;
                        }
                    }
                }
                unreachable!("the loop returns")
            }
        })
        .buffer_unordered(at_once.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(failures.load(Ordering::SeqCst) as usize)
}

async fn wait_gone(api: &Api<BriqExecutor>, name: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + DELETE_TIMEOUT;
    while api.get_opt(name).await?.is_some() {
        if Instant::now() > deadline {
            bail!("executor {name} was not deleted within {DELETE_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Deletes every executor of the namespace (their finalizers destroy the sandboxes) and waits
/// until they are gone.
pub async fn delete_executors(api: &Api<BriqExecutor>) -> anyhow::Result<()> {
    let names: Vec<String> = api
        .list_metadata(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|e| e.name_any())
        .collect();
    stream::iter(&names)
        .map(|name| async move { api.delete(name, &DeleteParams::default()).await })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    let deadline = Instant::now() + DELETE_TIMEOUT;
    loop {
        let left = api.list_metadata(&ListParams::default()).await?.items.len();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{left} executors were not deleted within {DELETE_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Counts the watch events anyone watching a namespace receives, per kind, from the moment
/// [`WatchCounter::start`] returns.
pub struct WatchCounter {
    executions: Arc<AtomicU64>,
    executors: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl WatchCounter {
    pub async fn start(client: &Client, namespace: &str) -> anyhow::Result<WatchCounter> {
        let (executions, executors) = (Arc::default(), Arc::default());
        let tasks = vec![
            count_events::<Execution>(
                Api::namespaced(client.clone(), namespace),
                Arc::clone(&executions),
            )
            .await?,
            count_events::<BriqExecutor>(
                Api::namespaced(client.clone(), namespace),
                Arc::clone(&executors),
            )
            .await?,
        ];
        Ok(WatchCounter {
            executions,
            executors,
            tasks,
        })
    }

    /// (Execution events, BriqExecutor events) so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.executions.load(Ordering::SeqCst),
            self.executors.load(Ordering::SeqCst),
        )
    }
}

impl Drop for WatchCounter {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Starts a raw watch from the current resource version; returns once it is established.
async fn count_events<K>(
    api: Api<K>,
    counter: Arc<AtomicU64>,
) -> anyhow::Result<tokio::task::JoinHandle<()>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    async fn from_now<K>(api: &Api<K>) -> kube::Result<String>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let list = api.list_metadata(&ListParams::default().limit(1)).await?;
        Ok(list.metadata.resource_version.unwrap_or_default())
    }
    let params = WatchParams::default().timeout(290);
    let mut version = from_now(&api).await?;
    let mut events = api.watch(&params, &version).await?.boxed();
    Ok(tokio::spawn(async move {
        loop {
            while let Some(event) = events.next().await {
                match event {
                    Ok(WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o)) => {
                        counter.fetch_add(1, Ordering::SeqCst);
                        version = o.resource_version().unwrap_or(version);
                    }
                    Ok(WatchEvent::Bookmark(b)) => version = b.metadata.resource_version,
                    // Too old a version: start again from now (events in between are lost,
                    // which a benchmark of minutes does not see in practice).
                    Ok(WatchEvent::Error(_)) | Err(_) => {
                        version = from_now(&api).await.unwrap_or(version);
                        break;
                    }
                }
            }
            match api.watch(&params, &version).await {
                Ok(next) => events = next.boxed(),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }))
}
