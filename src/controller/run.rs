//! The controllers' entry: [`run`] starts the watches and the caches they fill, then the three
//! controllers, then the tasks beside them, and stops them together when `shutdown` resolves;
//! [`Observer`] is what the process around them learns. The parts are modules of their own,
//! each importing only those above it in this table:
//!
//! | module | what it holds |
//! | --- | --- |
//! | `watches` | the caches, the watches that fill them and the wake-ups each event sends |
//! | `controllers` | the contexts kept between reconciles, the three `Controller`s, their stop signal |
//! | `background` | the reporting to the [`Observer`], the bookkeeping sweep, the count writes, the orphan sweeper |
//! | `keys` | an executor's briq key for readers beside the controllers, through a class watch of their own |

mod background;
mod controllers;
mod keys;
mod watches;

use std::sync::Arc;

pub use self::keys::ExecutorKeys;

use kube::Client;
use tracing::info;

use super::context::Settings;
use crate::{briq::SandboxApi, http::Health, metrics::Metrics};

/// What the process around the controllers learns from them: metrics, and whether their caches
/// are synced (for `/readyz`).
#[derive(Clone, Debug, Default)]
pub struct Observer {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
}

/// Runs the controllers until `shutdown` resolves.
pub async fn run<S>(
    client: Client,
    sandboxes: S,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) where
    S: SandboxApi + 'static,
{
    run_observed(client, sandboxes, settings, shutdown, Observer::default()).await
}

/// [`run`], reporting metrics and cache sync to `observer`.
pub async fn run_observed<S>(
    client: Client,
    sandboxes: S,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    observer: Observer,
) where
    S: SandboxApi + 'static,
{
    let (stop, stopping) = controllers::stop_on(shutdown);
    let (caches, watches) = watches::caches(&client, settings.namespace.as_deref());
    let contexts = controllers::Contexts::new(
        &client,
        sandboxes,
        settings,
        &observer.metrics,
        stopping,
        &caches,
    );
    let started = watches.start(
        &caches,
        &contexts.execution,
        &contexts.executor,
        &contexts.orphans,
    );
    let controllers = controllers::run(started.feeds, &caches, &contexts, stop);
    let _reporting =
        background::Reporting::start(&observer.metrics, &observer.health, &caches, &contexts);
    let tasks = background::Tasks::start(&contexts);
    info!("controllers started");
    controllers.await;
    drop(started.class_watch);
    tasks.stop().await;
    info!("controllers stopped");
}
