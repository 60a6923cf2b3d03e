//! What every route of the aggregated API shares: the keys and sandboxes it acts through, the
//! front proxy it trusts, the live readers and the MCP sessions; errors as `Status` objects;
//! and the SubjectAccessReview asked before anything is done for a caller.

use std::sync::Arc;

use axum::{
    Json,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::json;

use super::{
    authorize::{self, Request},
    files::Refusal,
    front_proxy::{FrontProxy, User},
    live::Readers,
    mcp::sessions::Sessions,
};
use crate::{briq::SandboxApi, controller::ExecutorKeys};

pub struct Served<S> {
    pub keys: Arc<ExecutorKeys<S>>,
    pub sandboxes: Arc<S>,
    pub proxy: FrontProxy,
    pub readers: Arc<Readers>,
    pub sessions: Sessions,
}

/// A `Status` object, as the API server answers errors.
pub fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, Json(body)).into_response()
}

pub fn refused(refusal: Refusal) -> Response {
    status(refusal.code, refusal.reason, refusal.message)
}

/// `Ok` when `user` may do `request`, else the refusal to answer (403, or 503 when the API
/// server could not be asked: never allowed by default).
pub async fn authorized<S: SandboxApi + 'static>(
    served: &Served<S>,
    user: &User,
    request: &Request<'_>,
) -> Result<(), Refusal> {
    match authorize::denied(served.keys.client(), user, request).await {
        Ok(None) => Ok(()),
        Ok(Some(why)) => Err(Refusal::forbidden(why)),
        Err(error) => Err(Refusal::unavailable(format!(
            "the authorization could not be asked: {error}"
        ))),
    }
}
