//! The admin API (`/_admin/…`, same bearer key) and a typed client for it: faults, call counts,
//! live sandboxes, simulated sleep and restart, and changes to what the MCP endpoint declares.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};
use url::Url;

use super::faults::{FaultRule, Operation, Outage};
use super::http::{ApiError, RequestId};
use super::mcp::DeclaredChange;
use super::rest::error_response;
use super::state::{LiveSandbox, Shared};
use briq_operator::briq::ApiKey;
use briq_operator::briq::api::{Sandbox, SandboxState};

const FAULTS: &str = "/_admin/faults";
const OUTAGE: &str = "/_admin/outage";
const STATS: &str = "/_admin/stats";
const SLEEP: &str = "/_admin/sandboxes/{id}/sleep";
const RESTART: &str = "/_admin/sandboxes/{id}/restart";
const DECLARED: &str = "/_admin/declared";

/// Answer of `GET /_admin/stats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Every authenticated call per operation, including those a fault answered.
    pub calls: BTreeMap<Operation, u64>,
    pub sandboxes: Vec<LiveSandbox>,
}

impl Stats {
    pub fn calls(&self, operation: Operation) -> u64 {
        self.calls.get(&operation).copied().unwrap_or(0)
    }
}

pub(crate) fn router() -> Router<Arc<Shared>> {
    Router::new()
        .route(FAULTS, post(add_fault).delete(clear_faults))
        .route(OUTAGE, post(begin_outage))
        .route(STATS, get(stats))
        .route(SLEEP, post(sleep))
        .route(RESTART, post(restart))
        .route(DECLARED, post(declare).delete(restore_declared))
}

async fn add_fault(
    State(shared): State<Arc<Shared>>,
    Extension(rid): Extension<RequestId>,
    body: Result<Json<FaultRule>, JsonRejection>,
) -> Response {
    applied(&rid, body, |rule| {
        shared.faults.add(rule);
        Ok(())
    })
}

async fn begin_outage(
    State(shared): State<Arc<Shared>>,
    Extension(rid): Extension<RequestId>,
    body: Result<Json<Outage>, JsonRejection>,
) -> Response {
    applied(&rid, body, |outage| {
        shared.faults.begin_outage(outage);
        Ok(())
    })
}

async fn declare(
    State(shared): State<Arc<Shared>>,
    Extension(rid): Extension<RequestId>,
    body: Result<Json<DeclaredChange>, JsonRejection>,
) -> Response {
    applied(&rid, body, |change| {
        shared.declared.change(change).map_err(ApiError::invalid)
    })
}

async fn restore_declared(State(shared): State<Arc<Shared>>) -> StatusCode {
    shared.declared.restore();
    StatusCode::NO_CONTENT
}

/// Applies a parsed admin request body: 204, or 400 saying why it did not parse or apply.
fn applied<T>(
    rid: &RequestId,
    body: Result<Json<T>, JsonRejection>,
    apply: impl FnOnce(T) -> Result<(), ApiError>,
) -> Response {
    match body
        .map_err(|e| ApiError::invalid(e.body_text()))
        .and_then(|Json(body)| apply(body))
    {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => error_response(e, Some(rid)),
    }
}

async fn clear_faults(State(shared): State<Arc<Shared>>) -> StatusCode {
    shared.faults.clear();
    StatusCode::NO_CONTENT
}

async fn stats(State(shared): State<Arc<Shared>>) -> Json<Stats> {
    Json(Stats {
        calls: shared.faults.calls(),
        sandboxes: shared.live().await,
    })
}

async fn sleep(
    State(shared): State<Arc<Shared>>,
    Extension(rid): Extension<RequestId>,
    Path(id): Path<String>,
) -> Response {
    match shared.kill_processes(&id, SandboxState::Sleeping).await {
        Ok(sandbox) => Json(sandbox).into_response(),
        Err(e) => error_response(e, Some(&rid)),
    }
}

async fn restart(
    State(shared): State<Arc<Shared>>,
    Extension(rid): Extension<RequestId>,
    Path(id): Path<String>,
) -> Response {
    match shared.kill_processes(&id, SandboxState::Running).await {
        Ok(sandbox) => Json(sandbox).into_response(),
        Err(e) => error_response(e, Some(&rid)),
    }
}

/// Typed client for the admin API, for tests and scripts.
#[derive(Debug, Clone)]
pub struct AdminClient {
    http: reqwest::Client,
    base_url: Url,
    key: ApiKey,
}

impl AdminClient {
    pub fn new(base_url: Url, key: ApiKey) -> Self {
        Self {
            http: reqwest::Client::new(),
            base_url,
            key,
        }
    }

    fn request(
        &self,
        method: reqwest::Method,
        template: &str,
        id: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let path = id.map_or_else(|| template.to_owned(), |id| template.replace("{id}", id));
        let mut url = self.base_url.clone();
        url.set_path(&path);
        self.http
            .request(method, url)
            .bearer_auth(self.key.expose())
    }

    /// The next `rule.count` matching calls get `rule.fault`.
    pub async fn add_fault(&self, rule: &FaultRule) -> reqwest::Result<()> {
        self.post(FAULTS, rule).await
    }

    /// Every call is answered `outage.status` for its duration (the admin API still answers).
    pub async fn begin_outage(&self, outage: &Outage) -> reqwest::Result<()> {
        self.post(OUTAGE, outage).await
    }

    async fn post(&self, path: &str, body: &impl Serialize) -> reqwest::Result<()> {
        self.request(reqwest::Method::POST, path, None)
            .json(body)
            .send()
            .await?
            .error_for_status()
            .map(drop)
    }

    /// Clears pending faults and ends an outage.
    pub async fn clear_faults(&self) -> reqwest::Result<()> {
        self.delete(FAULTS).await
    }

    /// Changes what the MCP endpoint declares (and checks calls against) from now on.
    pub async fn declare(&self, change: &DeclaredChange) -> reqwest::Result<()> {
        self.post(DECLARED, change).await
    }

    /// Undoes every [`AdminClient::declare`]: the endpoint declares its tools as published.
    pub async fn restore_declared(&self) -> reqwest::Result<()> {
        self.delete(DECLARED).await
    }

    async fn delete(&self, path: &str) -> reqwest::Result<()> {
        self.request(reqwest::Method::DELETE, path, None)
            .send()
            .await?
            .error_for_status()
            .map(drop)
    }

    pub async fn stats(&self) -> reqwest::Result<Stats> {
        self.request(reqwest::Method::GET, STATS, None)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await
    }

    /// Kills the sandbox's processes and marks it sleeping until its next use.
    pub async fn sleep(&self, id: &str) -> reqwest::Result<Sandbox> {
        self.request(reqwest::Method::POST, SLEEP, Some(id))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await
    }

    /// Kills the sandbox's processes; it keeps running, as after a briq resize.
    pub async fn restart(&self, id: &str) -> reqwest::Result<Sandbox> {
        self.request(reqwest::Method::POST, RESTART, Some(id))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await
    }
}
