//! The briq key of any executor, for readers beside the controllers (the aggregated API): a
//! class watch of their own, so that they answer on every replica, the leader's or not.

use std::sync::Arc;

use futures::StreamExt;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, reflector, watcher},
};
use tokio::sync::watch;

use crate::task::AbortOnDrop;
use crate::{
    briq::{ApiKey, SandboxApi},
    controller::{
        context::{Result, Settings, Shared, event_recorder},
        credentials::api_key,
    },
    crd::{BriqExecutor, BriqExecutorClass},
    metrics::Metrics,
};

/// The key of an executor, as its controller would take it.
pub struct ExecutorKeys<S> {
    shared: Arc<Shared<S>>,
    _classes: AbortOnDrop,
}

impl<S: SandboxApi + 'static> ExecutorKeys<S> {
    /// Starts the class watch the keys are taken through.
    pub fn start(client: Client, sandboxes: S, settings: Settings) -> Self {
        let (classes, writer) = reflector::store::<BriqExecutorClass>();
        let (listed_tx, classes_listed) = watch::channel(false);
        let api: Api<BriqExecutorClass> = Api::all(client.clone());
        let task = tokio::spawn(async move {
            let events = watcher(api, watcher::Config::default().any_semantic())
                .default_backoff()
                .reflect(writer);
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::InitDone) = event {
                    listed_tx.send_replace(true);
                }
            }
        });
        let shared = Arc::new(Shared {
            recorder: event_recorder(client.clone()),
            client,
            sandboxes,
            settings,
            classes,
            classes_listed,
            metrics: Arc::new(Metrics::default()),
            stopping: Arc::default(),
            holder: String::new(),
        });
        ExecutorKeys {
            shared,
            _classes: AbortOnDrop(task),
        }
    }

    pub async fn key(&self, executor: &BriqExecutor) -> Result<ApiKey> {
        api_key(&self.shared, executor).await
    }

    pub fn client(&self) -> &Client {
        &self.shared.client
    }

    pub fn sandboxes(&self) -> &S {
        &self.shared.sandboxes
    }
}
