//! The operator's HTTP endpoints: `/healthz` (liveness), `/readyz` (readiness) and `/metrics`
//! (Prometheus, OpenMetrics text).

use std::sync::{Arc, Mutex};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};

use crate::metrics::Metrics;

/// Which part this replica plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Leader election is off: this replica always runs the controllers.
    Single,
    /// Waiting for the lease another replica holds (or for the first try to take it).
    Standby,
    /// Holds the lease and runs the controllers.
    Leader,
}

#[derive(Clone, Copy, Debug)]
struct Snapshot {
    role: Role,
    /// The controllers run and their caches are synced.
    synced: bool,
    /// SIGTERM was received: finishing the running Execution, then exiting.
    stopping: bool,
}

/// What `/readyz` reports, updated by the leader elector and the controllers.
#[derive(Debug)]
pub struct Health {
    state: Mutex<Snapshot>,
}

impl Health {
    pub fn new(role: Role) -> Self {
        Health {
            state: Mutex::new(Snapshot {
                role,
                synced: false,
                stopping: false,
            }),
        }
    }

    fn update(&self, change: impl FnOnce(&mut Snapshot)) {
        change(&mut self.state.lock().expect("health poisoned"));
    }

    pub fn set_role(&self, role: Role) {
        self.update(|state| state.role = role);
    }

    pub fn set_synced(&self, synced: bool) {
        self.update(|state| state.synced = synced);
    }

    pub fn set_stopping(&self) {
        self.update(|state| state.stopping = true);
    }

    pub fn is_stopping(&self) -> bool {
        self.state.lock().expect("health poisoned").stopping
    }

    pub fn role(&self) -> Role {
        self.state.lock().expect("health poisoned").role
    }

    /// Whether this replica runs the controllers with synced caches.
    pub fn controllers_ready(&self) -> bool {
        let state = self.state.lock().expect("health poisoned");
        state.role != Role::Standby && state.synced
    }

    /// Readiness and why: a standby replica is ready (it can take over at once), a leader once
    /// its caches are synced and its controllers run.
    pub fn readiness(&self) -> (bool, &'static str) {
        let state = *self.state.lock().expect("health poisoned");
        match state {
            Snapshot { stopping: true, .. } => (false, "shutting down"),
            Snapshot {
                role: Role::Standby,
                ..
            } => (
                true,
                "ok: standby, another replica holds the lease and runs the controllers",
            ),
            Snapshot { synced: true, .. } => (true, "ok: controllers running, caches synced"),
            Snapshot {
                role: Role::Leader, ..
            } => (
                false,
                "leading: waiting for the controllers' caches to sync",
            ),
            Snapshot {
                role: Role::Single, ..
            } => (false, "waiting for the controllers' caches to sync"),
        }
    }
}

impl Default for Health {
    fn default() -> Self {
        Health::new(Role::Single)
    }
}

#[derive(Clone)]
struct Shared {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
}

pub fn router(health: Arc<Health>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(Shared { health, metrics })
}

async fn readyz(State(shared): State<Shared>) -> impl IntoResponse {
    let (ready, why) = shared.health.readiness();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, format!("{why}\n"))
}

async fn metrics_text(State(shared): State<Shared>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared.metrics.render(),
    )
}

/// Serves the endpoints on `listener` until the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
) -> std::io::Result<()> {
    axum::serve(listener, router(health, metrics)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_follows_role_and_sync() {
        let health = Health::new(Role::Standby);
        assert!(health.readiness().0, "a standby is ready");
        assert!(health.readiness().1.contains("standby"));
        health.set_role(Role::Leader);
        assert!(!health.readiness().0, "a leader waits for its caches");
        health.set_synced(true);
        assert!(health.readiness().0);
        assert!(health.controllers_ready());
        health.set_stopping();
        assert!(!health.readiness().0);
    }
}
