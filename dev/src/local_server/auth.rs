//! Bearer-key auth of every route (the MCP endpoint's, the legacy REST surface's and the admin
//! API's) against the server's key; each surface words the refusal its own way.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;

use super::http::{ApiError, RequestId};
use super::state::Shared;
use super::{mcp, rest};
use briq_operator::briq::api::ErrorCode;

pub(crate) async fn require_key(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if presented == Some(shared.api_key.expose()) {
        return next.run(request).await;
    }
    if request.uri().path() == mcp::ENDPOINT {
        return mcp::unauthorized();
    }
    let id = request.extensions().get::<RequestId>().cloned();
    let error = ApiError::new(
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthorized,
        "missing or wrong API key",
    );
    rest::error_response(error, id.as_ref())
}
