//! Performing one call under the fault rules, whichever surface it came through: the call is
//! counted, a pending fault may answer it instead or break its answer, and the operation runs in
//! a task of its own so that it completes even when the client hangs up, as on a real server.
//! Faults named `…AfterEffect` break the answer only after the operation was performed (whether
//! it succeeded or failed).

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;

use super::faults::{Fault, Operation};
use super::http::{dropped_connection, echo_page, echo_request_page, malformed_json};
use super::state::Shared;
use briq_operator::briq::api::ErrorCode;

/// How a surface (the MCP endpoint, the legacy REST routes) words the answers a fault or an
/// error makes; the faults themselves mean the same on both.
pub(crate) trait Surface: Sync {
    /// Why an operation was refused or failed, as the surface's handlers say it.
    type Error: Send + 'static;

    fn error(&self, error: Self::Error) -> Response;

    /// The error of an operation whose task failed (a panic).
    fn internal(&self, message: String) -> Self::Error;

    /// An error status from the server or its gateway, before or after the operation.
    fn status(
        &self,
        status: StatusCode,
        code: Option<ErrorCode>,
        retry_after: Option<u64>,
    ) -> Response;

    /// A tool error with `code`, injected.
    fn tool_error(&self, code: ErrorCode) -> Response;

    /// A JSON-RPC error with `code`, injected.
    fn json_rpc_error(&self, code: i64) -> Response;

    /// An answer stream that ends before the answer.
    fn cut_stream(&self) -> Response;
}

/// One call: what it is, on which sandbox, and its request body as text (which a gateway's
/// error page may echo, [`Fault::EchoRequest`]).
pub(crate) struct Call<'a> {
    pub(crate) operation: Operation,
    pub(crate) sandbox_id: Option<&'a str>,
    pub(crate) request: &'a str,
}

impl<'a> Call<'a> {
    pub(crate) fn new(operation: Operation, sandbox_id: Option<&'a str>, request: &'a str) -> Self {
        Self {
            operation,
            sandbox_id,
            request,
        }
    }
}

/// Counts `call`, applies a pending fault, and runs `effect` unless the fault answers first.
pub(crate) async fn perform<S, F>(
    shared: &Shared,
    surface: &S,
    call: Call<'_>,
    effect: F,
) -> Response
where
    S: Surface,
    F: Future<Output = Result<Response, S::Error>> + Send + 'static,
{
    let fault = shared.faults.record(call.operation, call.sandbox_id);
    let delay = match &fault {
        Some(Fault::Status {
            status,
            code,
            retry_after_seconds,
        }) => return surface.status(status_code(*status), *code, *retry_after_seconds),
        Some(Fault::DropConnection) => return dropped_connection(),
        Some(Fault::EchoPage { echo_status }) => {
            return echo_page(*echo_status, shared.api_key.expose());
        }
        Some(Fault::EchoRequest {
            echo_request_status,
        }) => return echo_request_page(*echo_request_status, call.request),
        Some(Fault::ToolError { tool_error }) => return surface.tool_error(*tool_error),
        Some(Fault::JsonRpcError { json_rpc_error }) => {
            return surface.json_rpc_error(*json_rpc_error);
        }
        Some(Fault::Delay { delay_ms }) => Duration::from_millis(*delay_ms),
        _ => Duration::ZERO,
    };
    let outcome = tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        effect.await
    })
    .await
    .unwrap_or_else(|e| Err(surface.internal(format!("operation failed: {e}"))));
    if let Some(status) = shared.faults.outage() {
        // The gateway went down while the operation ran: performed, answered with the outage.
        return surface.status(status_code(status), None, None);
    }
    match (fault, outcome) {
        (Some(Fault::DropAfterEffect), _) => dropped_connection(),
        (
            Some(Fault::StatusAfterEffect {
                status_after_effect,
            }),
            _,
        ) => surface.status(status_code(status_after_effect), None, None),
        (
            Some(Fault::HangAfterEffect {
                hang_after_effect_ms,
            }),
            _,
        ) => {
            tokio::time::sleep(Duration::from_millis(hang_after_effect_ms)).await;
            dropped_connection()
        }
        (Some(Fault::SseCutAfterEffect), _) => surface.cut_stream(),
        (Some(Fault::MalformedJson), Ok(_)) => malformed_json(),
        (_, Ok(response)) => response,
        (_, Err(error)) => surface.error(error),
    }
}

fn status_code(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}
