//! HTTP plumbing shared by the MCP endpoint, the legacy REST routes and the admin API: request
//! ids, the error every surface renders its own way, and the broken answers faults produce.

use std::io;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use rand::Rng as _;
use rand::distr::Alphanumeric;

use briq_operator::briq::api::{ErrorCode, REQUEST_ID_HEADER};

/// Lowercase letters and digits, for ids.
pub(crate) fn random_token(len: usize) -> String {
    rand::rng()
        .sample_iter(Alphanumeric)
        .take(len)
        .map(|b| char::from(b).to_ascii_lowercase())
        .collect()
}

#[derive(Debug, Clone)]
pub(crate) struct RequestId(pub String);

/// Gives every request an id, available to handlers as an extension and sent back as a header.
pub(crate) async fn request_id(mut request: Request, next: Next) -> Response {
    let id = format!("req_{}", random_token(20));
    request.extensions_mut().insert(RequestId(id.clone()));
    let mut response = next.run(request).await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}

/// Why the server refused or failed an operation: a tool error on the MCP surface, an error
/// answer with `status` on the legacy REST surface.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            message,
        )
    }
}

/// The error code an error status stands for, when a fault names none.
pub(crate) fn code_of_status(status: StatusCode) -> ErrorCode {
    match status {
        StatusCode::NOT_FOUND => ErrorCode::NotFound,
        StatusCode::UNAUTHORIZED => ErrorCode::Unauthorized,
        StatusCode::FORBIDDEN => ErrorCode::Forbidden,
        StatusCode::PAYMENT_REQUIRED => ErrorCode::PaymentRequired,
        StatusCode::TOO_MANY_REQUESTS => ErrorCode::RateLimited,
        StatusCode::INTERNAL_SERVER_ERROR => ErrorCode::Internal,
        s if s.is_server_error() => ErrorCode::Unavailable,
        _ => ErrorCode::InvalidRequest,
    }
}

/// The status an error code stands for, for a tool error answered by the REST surface.
pub(crate) fn status_of_code(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorCode::Forbidden | ErrorCode::PolicyViolation => StatusCode::FORBIDDEN,
        ErrorCode::PaymentRequired | ErrorCode::PlanLimit | ErrorCode::QuotaExceeded => {
            StatusCode::PAYMENT_REQUIRED
        }
        ErrorCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Internal | ErrorCode::Other => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::InvalidRequest | ErrorCode::InvalidParams => StatusCode::BAD_REQUEST,
    }
}

/// Sets `Retry-After` when a fault asks for it.
pub(crate) fn with_retry_after(mut response: Response, seconds: Option<u64>) -> Response {
    if let Some(seconds) = seconds {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// Starts a success answer, then breaks the connection: hyper aborts it when the body fails.
pub(crate) fn dropped_connection() -> Response {
    let chunks: [Result<Bytes, io::Error>; 2] = [
        Ok(Bytes::from_static(b"{\"partial\":")),
        Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "injected fault",
        )),
    ];
    Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// An HTML error page that echoes `key` at many offsets: first across character 200 (where
/// error messages are commonly cut), then after ever longer gaps, past several kilobytes (past
/// Event notes and condition messages).
pub(crate) fn echo_page(status: u16, key: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let head = format!("<html><body><h1>{status}</h1><pre>");
    const BEARER: &str = "Authorization: Bearer ";
    // The first key starts at character 192: a cut at 200 would keep 8 characters of it.
    let mut page = head.clone();
    page.push_str(&"-".repeat(192usize.saturating_sub(head.len() + BEARER.len())));
    for gap in 0..96 {
        page.push_str(BEARER);
        page.push_str(key);
        page.push_str(&"-".repeat(gap * 3));
        page.push('\n');
    }
    page.push_str("</pre></body></html>");
    (status, [(CONTENT_TYPE, "text/html")], page).into_response()
}

/// An HTML error page that echoes `request` (a request's body): its last 150 characters first,
/// within the first 200 of the page (where error messages are commonly cut), then all of it.
pub(crate) fn echo_request_page(status: u16, request: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let tail_start = request
        .char_indices()
        .rev()
        .nth(149)
        .map_or(0, |(at, _)| at);
    let page = format!(
        "<html><body><h1>{status}</h1><pre>…{}\n{request}</pre></body></html>",
        &request[tail_start..]
    );
    (status, [(CONTENT_TYPE, "text/html")], page).into_response()
}

pub(crate) fn malformed_json() -> Response {
    (
        StatusCode::OK,
        [(CONTENT_TYPE, "application/json")],
        "{\"this is\": not json",
    )
        .into_response()
}
