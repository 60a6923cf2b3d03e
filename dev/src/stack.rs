//! The one harness that puts "control plane + local sandbox server + operator" together on this
//! machine, for `briq-dev demo`, `local-stack` and `bench` and for the integration tests:
//!
//! - [`Stack::builder`]: a local control plane with the CRDs installed (or the API server of a
//!   kubeconfig someone else runs), optionally with an audit log and kubeconfigs for more users;
//!   optionally a local sandbox server on the sandbox venv, a second one with simulated
//!   sandboxes (benchmarks only) and the controllers in this process.
//! - [`Controllers`]: the controllers in this process for one namespace or all, on a given
//!   sandbox server, as a given client; stopped gracefully, killed, resumed.
//! - [`OperatorProcess`]: a whole operator as `briq-operator run` runs it (`operator::serve`: HTTP
//!   endpoints, leader election, controllers), inside this process.
//! - [`Stack::stop`]: deletes every executor through the stack's own controllers, counts the
//!   sandboxes left behind, stops everything.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, bail};
use futures::{StreamExt as _, TryStreamExt as _, stream};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt as _,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;

use briq_operator::{
    briq::{ApiKey, BriqClient, ClientOptions},
    controller::Settings,
    crd::{self, BriqExecutor, BriqExecutorPool},
};

pub use crate::operators::{Controllers, OperatorProcess};
use crate::{
    aggregated::AggregatedApi,
    control_plane::{self, ControlPlane},
    local_server::{self, LocalServer},
    progress::Progress,
    repo, wait,
};

/// How long deleting the executors (their finalizers destroy the sandboxes) may take.
const DELETE_TIMEOUT: Duration = Duration::from_secs(180);

/// What [`Stack::builder`] starts.
#[must_use]
pub struct Builder {
    audit_log: bool,
    users: Vec<(String, Vec<String>)>,
    external: Option<PathBuf>,
    sandbox_server: bool,
    simulated_sandbox_server: bool,
    controllers: bool,
    aggregated_api: bool,
    /// A release whose CRDs to install instead of this tree's (`compat/<version>/`).
    released_crds: Option<String>,
    progress: Progress,
}

impl Builder {
    /// Installs the CRDs of release `version` as `compat/<version>/briq.cloud.yaml` holds them
    /// instead of this tree's: a cluster that runs that release, for the upgrade test.
    pub fn released_crds(mut self, version: &str) -> Self {
        self.released_crds = Some(version.to_owned());
        self
    }

    /// kube-apiserver writes an audit log ([`ControlPlane::audit_log`]).
    pub fn audit_log(mut self) -> Self {
        self.audit_log = true;
        self
    }

    /// A kubeconfig for user `name` in `groups` too ([`Stack::user_kubeconfig`],
    /// [`Stack::user_client`]): the audit log tells its requests apart.
    pub fn user(mut self, name: &str, groups: &[&str]) -> Self {
        self.users.push((
            name.to_owned(),
            groups.iter().map(|g| g.to_string()).collect(),
        ));
        self
    }

    /// Use the API server of this kubeconfig (when given) instead of starting a control plane.
    pub fn external(mut self, kubeconfig: Option<PathBuf>) -> Self {
        self.external = kubeconfig;
        self
    }

    /// A local sandbox server whose sandboxes run the sandbox venv ([`repo::sandbox_venv`]).
    pub fn sandbox_server(mut self) -> Self {
        self.sandbox_server = true;
        self
    }

    /// A second local sandbox server, whose sandboxes are simulated
    /// ([`local_server::Simulation`]; [`Stack::simulated_server`]): for benchmarks at scale, never
    /// for tests of behaviour.
    pub fn simulated_sandbox_server(mut self) -> Self {
        self.simulated_sandbox_server = true;
        self
    }

    /// The controllers, in this process, for all namespaces, on the sandbox server (implies
    /// [`Builder::sandbox_server`]), as the admin user. [`Stack::stop`] then deletes every
    /// executor through them first.
    pub fn controllers(mut self) -> Self {
        self.sandbox_server = true;
        self.controllers = true;
        self
    }

    /// The operator's aggregated API (live output, files) on the sandbox server for all
    /// namespaces, without the controllers (which [`Builder::controllers`] serves it with); needs
    /// a control plane of our own.
    pub fn aggregated_api(mut self) -> Self {
        self.sandbox_server = true;
        self.aggregated_api = true;
        self
    }

    /// Progress lines of the start and of [`Stack::stop`] (none by default).
    pub fn progress(mut self, progress: &Progress) -> Self {
        self.progress = progress.clone();
        self
    }

    pub async fn start(self) -> anyhow::Result<Stack> {
        let progress = self.progress;
        if self.external.is_none() {
            progress
                .step("building or reusing the local control plane (first run: several minutes)");
        }
        let bin_dir = tokio::task::spawn_blocking(control_plane::binaries).await??;
        let (plane, kubeconfig) = match self.external {
            Some(kubeconfig) => (None, kubeconfig),
            None => {
                let options = control_plane::Options {
                    audit_log: self.audit_log,
                    ..control_plane::Options::default()
                };
                let plane = ControlPlane::start_with(&bin_dir, options).await?;
                let kubeconfig = plane.kubeconfig().to_owned();
                (Some(plane), kubeconfig)
            }
        };
        let admin = client_for(&kubeconfig).await?;
        match &self.released_crds {
            None => crd::install(&admin).await?,
            Some(version) => crd::install_these(&admin, repo::released_crds(version)?).await?,
        }
        let mut users = BTreeMap::new();
        for (name, groups) in &self.users {
            let plane = plane
                .as_ref()
                .context("kubeconfigs for more users need a control plane of our own")?;
            let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
            let path = plane.kubeconfig_for(name, &groups)?;
            let client = client_for(&path).await?;
            users.insert(name.clone(), (path, client));
        }
        if let Some(plane) = &plane {
            let audit = if self.audit_log {
                " (audit log on)"
            } else {
                ""
            };
            progress.step(format!("kube-apiserver ready at {}{audit}", plane.server()));
        }

        let mut stack = Stack {
            plane,
            kubeconfig,
            bin_dir,
            admin,
            users,
            sandboxes: None,
            simulated: None,
            controllers: None,
            aggregated: None,
            progress,
        };
        if self.sandbox_server {
            let venv = tokio::task::spawn_blocking(repo::sandbox_venv).await??;
            let server = spawn_server(Some(venv.clone())).await?;
            let client = BriqClient::new(ClientOptions::local(server.url()))?;
            stack.progress.step(format!(
                "local sandbox server at {} (sandboxes are host processes)",
                server.url()
            ));
            stack.sandboxes = Some(Sandboxes {
                server,
                client,
                venv,
            });
        }
        if self.simulated_sandbox_server {
            let server = spawn_simulated_server().await?;
            stack.progress.step(format!(
                "local sandbox server with simulated sandboxes at {}",
                server.url()
            ));
            stack.simulated = Some(server);
        }
        if self.controllers {
            let server = stack.server();
            let controllers =
                Controllers::start(stack.admin.clone(), server, settings(None, server))?;
            stack.controllers = Some(controllers);
            stack.progress.step("operator running");
        }
        // The controllers come with their aggregated API wherever it can be registered.
        if self.aggregated_api || (self.controllers && stack.plane.is_some()) {
            let plane = stack
                .plane
                .as_ref()
                .context("the aggregated API needs a control plane of our own")?;
            let server = stack.server();
            let aggregated =
                AggregatedApi::start(&stack.admin, plane, server, settings(None, server)).await?;
            stack.progress.step(format!(
                "the operator's aggregated API at {}",
                aggregated.address
            ));
            stack.aggregated = Some(aggregated);
        }
        Ok(stack)
    }
}

/// The default sandbox server, a client of it, and its sandboxes' Python.
struct Sandboxes {
    server: LocalServer,
    client: BriqClient,
    venv: PathBuf,
}

/// A running stack; see the module documentation.
pub struct Stack {
    /// `None` when the API server is someone else's ([`Builder::external`]).
    plane: Option<ControlPlane>,
    kubeconfig: PathBuf,
    bin_dir: PathBuf,
    admin: Client,
    users: BTreeMap<String, (PathBuf, Client)>,
    sandboxes: Option<Sandboxes>,
    simulated: Option<LocalServer>,
    controllers: Option<Controllers>,
    /// With the controllers on a control plane of our own.
    aggregated: Option<AggregatedApi>,
    progress: Progress,
}

impl Stack {
    /// A local control plane with the CRDs; nothing else unless asked for.
    pub fn builder() -> Builder {
        Builder {
            audit_log: false,
            users: Vec::new(),
            external: None,
            sandbox_server: false,
            simulated_sandbox_server: false,
            controllers: false,
            aggregated_api: false,
            released_crds: None,
            progress: Progress::quiet(),
        }
    }

    /// An admin (`system:masters`) client, on the runtime that started the stack.
    pub fn admin(&self) -> &Client {
        &self.admin
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The control plane's own `kubectl`.
    pub fn kubectl(&self) -> PathBuf {
        self.bin_dir.join("kubectl")
    }

    /// The control plane, unless the API server is someone else's.
    pub fn plane(&self) -> Option<&ControlPlane> {
        self.plane.as_ref()
    }

    /// The kubeconfig of a user asked for with [`Builder::user`].
    pub fn user_kubeconfig(&self, user: &str) -> &Path {
        &self.user(user).0
    }

    /// A client of a user asked for with [`Builder::user`].
    pub fn user_client(&self, user: &str) -> &Client {
        &self.user(user).1
    }

    fn user(&self, user: &str) -> &(PathBuf, Client) {
        self.users
            .get(user)
            .unwrap_or_else(|| panic!("the stack was built without .user({user:?}, …)"))
    }

    fn sandboxes(&self) -> &Sandboxes {
        self.sandboxes
            .as_ref()
            .expect("the stack was built without .sandbox_server()")
    }

    /// The default local sandbox server ([`Builder::sandbox_server`]).
    pub fn server(&self) -> &LocalServer {
        &self.sandboxes().server
    }

    /// The sandbox server with simulated sandboxes ([`Builder::simulated_sandbox_server`]).
    pub fn simulated_server(&self) -> &LocalServer {
        self.simulated
            .as_ref()
            .expect("the stack was built without .simulated_sandbox_server()")
    }

    /// A briq client of the default sandbox server.
    pub fn sandbox_client(&self) -> &BriqClient {
        &self.sandboxes().client
    }

    /// The default sandbox server's key.
    pub fn key(&self) -> &ApiKey {
        self.server().api_key()
    }

    /// The Python of the default sandbox server's sandboxes.
    pub fn venv(&self) -> &Path {
        &self.sandboxes().venv
    }

    /// Creates namespace `name`.
    pub async fn namespace(&self, name: &str) -> anyhow::Result<()> {
        create_namespace(&self.admin, name).await
    }

    /// With the stack's own controllers ([`Builder::controllers`]): deletes every executor
    /// through them (so finalizers destroy the sandboxes) and counts the sandboxes left behind.
    /// Then stops the controllers, the sandbox server (destroying what is left) and the control
    /// plane. Fails if a sandbox was left.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let mut leaked = None;
        drop(self.aggregated.take());
        if let Some(controllers) = self.controllers.take() {
            // Pools first: they would make members again as fast as their executors go.
            delete_pools(&Api::all(self.admin.clone())).await?;
            delete_executors(&Api::all(self.admin.clone()), DELETE_TIMEOUT).await?;
            leaked = Some(self.server().admin().stats().await?.sandboxes.len());
            controllers.stop().await;
        }
        if let Some(sandboxes) = self.sandboxes.take() {
            sandboxes.server.shutdown().await;
        }
        if let Some(simulated) = self.simulated.take() {
            simulated.shutdown().await;
        }
        drop(self.plane.take());
        match leaked {
            Some(leaked) => {
                self.progress.step(format!(
                    "torn down: executors deleted, {leaked} sandboxes left, control plane stopped"
                ));
                if leaked > 0 {
                    bail!("{leaked} sandboxes were left behind");
                }
            }
            None => self
                .progress
                .step("torn down: sandboxes destroyed, control plane stopped"),
        }
        Ok(())
    }
}

/// A `kube::Config` for `kubeconfig`.
pub async fn kube_config(kubeconfig: &Path) -> anyhow::Result<kube::Config> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?)
}

/// A client for `kubeconfig`, on the current runtime.
pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<Client> {
    Ok(briq_operator::kube_client::client(
        kube_config(kubeconfig).await?,
    )?)
}

pub async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(json!({ "metadata": { "name": name } }))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

/// A local sandbox server with a fresh key; `venv` is its sandboxes' Python.
pub async fn spawn_server(venv: Option<PathBuf>) -> anyhow::Result<LocalServer> {
    let mut config = fresh_config()?;
    config.python_venv = venv;
    local_server::spawn(config).await
}

/// A local sandbox server with a fresh key whose sandboxes are simulated, with the default
/// timings: for benchmarks at scale only.
pub async fn spawn_simulated_server() -> anyhow::Result<LocalServer> {
    let mut config = fresh_config()?;
    config.simulation = Some(local_server::Simulation::default());
    local_server::spawn(config).await
}

fn fresh_config() -> anyhow::Result<local_server::Config> {
    let key = ApiKey::new(format!("local-{:016x}", rand::random::<u64>()))?;
    Ok(local_server::Config::new(key))
}

/// Controller settings for `namespace` (all when `None`) with `server`'s key as the default.
pub fn settings(namespace: Option<&str>, server: &LocalServer) -> Settings {
    Settings {
        default_api_key: Some(server.api_key().clone()),
        namespace: namespace.map(str::to_owned),
        ..Settings::default()
    }
}

/// Deletes every pool `api` lists; its members go with the executors.
pub async fn delete_pools(api: &Api<BriqExecutorPool>) -> anyhow::Result<()> {
    for pool in api.list_metadata(&ListParams::default()).await?.items {
        let namespaced: Api<BriqExecutorPool> = Api::namespaced(
            api.clone().into_client(),
            &pool.namespace().unwrap_or_default(),
        );
        match namespaced
            .delete(&pool.name_any(), &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// Deletes every executor `api` lists (its finalizer destroys the sandbox) and waits until they
/// are gone. One already gone is fine: garbage collection deletes a deleted pool's members, and
/// a claimed member with its claimer, while this runs.
pub async fn delete_executors(api: &Api<BriqExecutor>, timeout: Duration) -> anyhow::Result<()> {
    let executors = api.list_metadata(&ListParams::default()).await?.items;
    stream::iter(&executors)
        .map(|executor| async move {
            let namespaced: Api<BriqExecutor> = Api::namespaced(
                api.clone().into_client(),
                &executor.namespace().unwrap_or_default(),
            );
            match namespaced
                .delete(&executor.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                Err(error) => Err(error),
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    wait::poll(
        timeout,
        Duration::from_millis(250),
        "deleting the executors",
        || async {
            Ok(api
                .list_metadata(&ListParams::default())
                .await?
                .items
                .is_empty())
        },
    )
    .await?;
    Ok(())
}
