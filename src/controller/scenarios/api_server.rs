//! The scenarios' Kubernetes API server: a mock [`Service`](tower::Service) behind a real
//! [`kube::Client`], and a verifier that takes each request in the order the code under test
//! sends it, checks it ([`ApiServer::expect`]: method and path; the test checks the body) and
//! answers it ([`Exchange::reply`]). What the server does not expect fails the scenario: a
//! request of another method or path, one more request than the scenario says
//! ([`ApiServer::done`]), or one fewer.

use std::collections::BTreeMap;

use http::{Method, Request, Response, StatusCode, header::CONTENT_TYPE};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle, SendResponse};

/// The content types of the patches kube-rs sends.
pub(super) const MERGE_PATCH: &str = "application/merge-patch+json";
pub(super) const JSON_PATCH: &str = "application/json-patch+json";
pub(super) const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// One request, as data.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub(super) method: Method,
    pub(super) path: String,
    pub(super) query: BTreeMap<String, String>,
    pub(super) content_type: Option<String>,
    /// Its JSON body (`Null` when it has none).
    pub(super) body: Value,
}

impl Seen {
    /// A server-side apply by field manager `manager` (forced, as every status write here is).
    pub(super) fn assert_applied_by(&self, manager: &str) {
        assert_eq!(
            (
                self.content_type.as_deref(),
                self.query.get("fieldManager").map(String::as_str),
                self.query.get("force").map(String::as_str),
            ),
            (Some(APPLY_PATCH), Some(manager), Some("true")),
            "{self:?}"
        );
    }

    /// The `reason` of condition `type_` in the status this request writes.
    pub(super) fn condition_reason(&self, type_: &str) -> Option<&str> {
        self.body["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_)?["reason"]
            .as_str()
    }
}

/// A request taken, waiting for its answer.
pub(super) struct Exchange {
    pub(super) seen: Seen,
    respond: SendResponse<Response<Body>>,
}

impl Exchange {
    /// Answers 200 with `body`; returns the request.
    pub(super) fn reply(self, body: Value) -> Seen {
        self.reply_status(StatusCode::OK, body)
    }

    /// Answers 201 with the request's own body (a created object, as the server echoes it).
    pub(super) fn created(self) -> Seen {
        let body = self.seen.body.clone();
        self.reply_status(StatusCode::CREATED, body)
    }

    /// Answers a server-side apply asking for metadata only (`controller::status::apply_status`).
    pub(super) fn metadata_only(self, name: &str) -> Seen {
        self.reply(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": { "name": name },
        }))
    }

    pub(super) fn reply_status(self, status: StatusCode, body: Value) -> Seen {
        let Exchange { seen, respond } = self;
        let response = Response::builder()
            .status(status)
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(serde_json::to_vec(&body).expect("JSON")))
            .expect("a response");
        respond.send_response(response);
        seen
    }
}

pub(super) struct ApiServer {
    handle: Handle<Request<Body>, Response<Body>>,
}

/// A client whose every request goes to the returned server.
pub(super) fn pair() -> (kube::Client, ApiServer) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, "default"), ApiServer { handle })
}

impl ApiServer {
    /// The next request, which must be `method` on `path`.
    pub(super) async fn expect(&mut self, method: Method, path: &str) -> Exchange {
        let Some((request, respond)) = self.handle.next_request().await else {
            panic!("expected {method} {path}; the client was dropped with no further request");
        };
        let seen = seen(request).await;
        assert_eq!(
            (&seen.method, seen.path.as_str()),
            (&method, path),
            "unexpected request: {seen:#?}"
        );
        Exchange { seen, respond }
    }

    /// No further request came before every clone of the client was dropped.
    pub(super) async fn done(mut self) {
        if let Some((request, _)) = self.handle.next_request().await {
            panic!(
                "a request the scenario does not expect: {:#?}",
                seen(request).await
            );
        }
    }
}

async fn seen(request: Request<Body>) -> Seen {
    let (parts, body) = request.into_parts();
    let bytes = body.collect().await.expect("a request body").to_bytes();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "a body that is not JSON ({e}): {}",
                String::from_utf8_lossy(&bytes)
            )
        })
    };
    let query = parts
        .uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) => (key.to_owned(), value.to_owned()),
            None => (pair.to_owned(), String::new()),
        })
        .collect();
    Seen {
        method: parts.method,
        path: parts.uri.path().to_owned(),
        query,
        content_type: parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body,
    }
}
