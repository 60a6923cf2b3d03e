//! The operator under test, inside this process: [`Controllers`] (the controllers alone, for one
//! namespace or all, stopped gracefully, killed, resumed) and [`OperatorProcess`] (a whole
//! operator as `briq-operator run` runs it). [`crate::stack`] starts them beside its control
//! plane and sandbox server.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context as _;
use kube::Client;
use tokio::{sync::oneshot, task::JoinHandle};

use briq_operator::{
    briq::{BriqClient, ClientOptions},
    controller::{self, Observer, Settings},
    http::{Health, Role},
    leader::LeaseConfig,
    metrics::Metrics,
    operator::{self, Options},
};

use crate::local_server::LocalServer;

/// How long stopped controllers may take to finish what they started.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// The controllers, run inside this process; aborted when dropped.
pub struct Controllers {
    client: Client,
    sandboxes: BriqClient,
    settings: Settings,
    running: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl Controllers {
    /// Starts the controllers as `client` on `server`, for `settings.namespace` (all when
    /// `None`).
    pub fn start(
        client: Client,
        server: &LocalServer,
        settings: Settings,
    ) -> anyhow::Result<Controllers> {
        let mut controllers = Controllers {
            client,
            sandboxes: BriqClient::new(ClientOptions::local(server.url()))?,
            settings,
            running: None,
        };
        controllers.resume();
        Ok(controllers)
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The briq client the controllers use (clones share its connections and briq's health).
    pub fn briq(&self) -> &BriqClient {
        &self.sandboxes
    }

    /// Starts the controllers (again).
    pub fn resume(&mut self) {
        assert!(
            self.running.is_none(),
            "the controllers are already running"
        );
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(controller::run(
            self.client.clone(),
            self.sandboxes.clone(),
            self.settings.clone(),
            async {
                let _ = stopped.await;
            },
        ));
        self.running = Some((stop, task));
    }

    /// Stops the controllers abruptly, like a crashed or killed operator process.
    pub async fn kill(&mut self) {
        if let Some((_, task)) = self.running.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Lets the controllers finish what they started (15 s at most), then stops them.
    pub async fn stop(mut self) {
        if let Some((stop, mut task)) = self.running.take() {
            let _ = stop.send(());
            if tokio::time::timeout(STOP_GRACE, &mut task).await.is_err() {
                task.abort();
            }
        }
    }
}

impl Drop for Controllers {
    fn drop(&mut self) {
        if let Some((_, task)) = self.running.take() {
            task.abort();
        }
    }
}

/// One operator process, as `briq-operator run` runs it (`operator::serve`: HTTP endpoints,
/// leader election, controllers), inside this process; aborted when dropped.
pub struct OperatorProcess {
    pub observer: Observer,
    /// Where it serves /healthz, /readyz and /metrics.
    pub address: SocketAddr,
    /// Its lease identity (empty without leader election).
    pub identity: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl OperatorProcess {
    /// Serves on a free loopback port, with `server` as its briq API; leader election when
    /// `lease` is given.
    pub async fn start(
        config: kube::Config,
        server: &LocalServer,
        settings: Settings,
        lease: Option<LeaseConfig>,
    ) -> anyhow::Result<OperatorProcess> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
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
        let sandboxes = BriqClient::new(ClientOptions::local(server.url()))?;
        let (stop, stopped) = oneshot::channel::<()>();
        let options = Options {
            settings,
            lease,
            http: Some(listener),
            subresources: None,
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
        Ok(OperatorProcess {
            observer,
            address,
            identity,
            stop: Some(stop),
            task: Some(task),
        })
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
        // A dead process leads nothing (its health is only read by its owner now).
        self.observer.health.set_role(Role::Standby);
        self.observer.health.set_synced(false);
    }

    /// Stops as on SIGTERM and waits until the process would exit; its error, if it failed.
    pub async fn shutdown(&mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.context("the operator task panicked")?,
            None => Ok(()),
        }
    }

    /// GET `path` from its HTTP endpoints: (status, body).
    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let response = reqwest::get(format!("http://{}{path}", self.address)).await?;
        let status = response.status().as_u16();
        Ok((status, response.text().await.unwrap_or_default()))
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
