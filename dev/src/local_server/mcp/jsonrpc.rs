//! JSON-RPC 2.0 messages as the endpoint answers them, and how an answer travels: one JSON body,
//! or an event stream (Streamable HTTP lets a server pick either for any request).

use axum::http::StatusCode;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

pub(crate) const PARSE_ERROR: i64 = -32700;
pub(crate) const INVALID_REQUEST: i64 = -32600;
pub(crate) const METHOD_NOT_FOUND: i64 = -32601;
pub(crate) const INVALID_PARAMS: i64 = -32602;
/// The implementation-defined server error range's first code: an injected fault.
pub(crate) const SERVER_ERROR: i64 = -32000;
/// A missing or wrong API key (refused before any JSON-RPC is read).
pub(crate) const UNAUTHORIZED: i64 = -32001;

/// The comment an event stream opens with, before any event: it primes the stream, and a client
/// must skip it.
pub(crate) const PRIMING_COMMENT: &str = ": briq-local\n\n";

/// A JSON-RPC error message.
pub(crate) fn error_message(id: &Value, code: i64, message: &str, data: Option<Value>) -> Value {
    let mut error = json!({"code": code, "message": message});
    if let Some(data) = data {
        error["data"] = data;
    }
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

/// An error answered with an HTTP status of its own, always as one JSON body: what the server
/// refuses before treating the message as a request.
pub(crate) fn refusal(status: StatusCode, id: &Value, code: i64, message: &str) -> Response {
    json_response(status, &error_message(id, code, message, None))
}

pub(crate) fn json_response(status: StatusCode, message: &Value) -> Response {
    (
        status,
        [(CONTENT_TYPE, "application/json")],
        message.to_string(),
    )
        .into_response()
}

/// An event stream: the priming comment, then the message's event unless the stream is cut
/// before it.
pub(crate) fn event_stream(message: Option<&Value>) -> Response {
    let mut body = PRIMING_COMMENT.to_owned();
    if let Some(message) = message {
        // Compact JSON has no line breaks, so the message is one `data` line.
        body.push_str(&format!("event: message\ndata: {message}\n\n"));
    }
    (
        StatusCode::OK,
        [
            (CONTENT_TYPE, "text/event-stream"),
            (CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// How answers to a request travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Json,
    EventStream,
}

/// The answer to one request (`id`), by its transport, with HTTP 200.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub(crate) id: Value,
    pub(crate) transport: Transport,
}

impl Reply {
    pub(crate) fn result(&self, result: Value) -> Response {
        self.send(&json!({"jsonrpc": "2.0", "id": self.id, "result": result}))
    }

    pub(crate) fn error(&self, code: i64, message: &str) -> Response {
        self.send(&error_message(&self.id, code, message, None))
    }

    fn send(&self, message: &Value) -> Response {
        match self.transport {
            Transport::Json => json_response(StatusCode::OK, message),
            Transport::EventStream => event_stream(Some(message)),
        }
    }
}
