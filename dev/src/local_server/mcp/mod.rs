//! The MCP endpoint, `POST /mcp`: JSON-RPC 2.0 over Streamable HTTP, hand-written on axum.
//!
//! `initialize` opens a session (`Mcp-Session-Id`); every other message must carry a session
//! the server knows (none: 400; unknown: 404, which tells a client its session expired). A
//! notification is accepted with 202. `tools/list` lists [`declared`]'s tools, `tools/call`
//! calls one ([`tools`]); `DELETE /mcp` ends a session. Each counted call (`initialize`,
//! `tools/list`, each tool) goes through the fault rules like a REST call does
//! ([`crate::local_server::perform`]).

mod answer;
pub(crate) mod declared;
mod jsonrpc;
pub(crate) mod session;
mod tools;

pub use declared::DeclaredChange;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Map, Value, json};

use super::faults::Operation;
use super::http::{ApiError, code_of_status, with_retry_after};
use super::perform::{Call, Surface, perform};
use super::state::Shared;
use briq_operator::briq::api::ErrorCode;
use jsonrpc::{
    INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR, Reply, SERVER_ERROR, Transport,
    UNAUTHORIZED, error_message, json_response, refusal,
};
use session::SESSION_HEADER;
use tools::Refusal;

/// Where the endpoint answers.
pub(crate) const ENDPOINT: &str = "/mcp";

/// The protocol revisions this server speaks; `initialize` answers the client's when it is one
/// of them, else the first.
const PROTOCOL_VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2025-11-25"];

const SERVER_NAME: &str = "briq-local";

pub(crate) fn router() -> Router<Arc<Shared>> {
    // GET (a server-sent stream of its own) is not offered: axum answers it 405.
    Router::new().route(ENDPOINT, post(receive).delete(end_session))
}

/// The MCP surface's wording of errors and faults, for the request being answered.
struct Mcp(Reply);

impl Surface for Mcp {
    type Error = Refusal;

    fn error(&self, refusal: Refusal) -> Response {
        match refusal {
            Refusal::Params(message) => self.0.error(INVALID_PARAMS, &message),
            Refusal::Tool(error) => self
                .0
                .result(answer::tool_error(error.code, &error.message)),
        }
    }

    fn internal(&self, message: String) -> Refusal {
        Refusal::Tool(ApiError::internal(message))
    }

    fn status(
        &self,
        status: StatusCode,
        code: Option<ErrorCode>,
        retry_after: Option<u64>,
    ) -> Response {
        // The briq error code goes along as data: a JSON-RPC error's own code is a number.
        let data = json!({"code": code.unwrap_or_else(|| code_of_status(status))});
        let message = error_message(&self.0.id, SERVER_ERROR, "injected fault", Some(data));
        with_retry_after(json_response(status, &message), retry_after)
    }

    fn tool_error(&self, code: ErrorCode) -> Response {
        self.0.result(answer::tool_error(code, "injected fault"))
    }

    fn json_rpc_error(&self, code: i64) -> Response {
        self.0.error(code, "injected fault")
    }

    fn cut_stream(&self) -> Response {
        jsonrpc::event_stream(None)
    }
}

/// One POSTed JSON-RPC message.
async fn receive(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let message: Value = match serde_json::from_slice(&body) {
        Ok(message) => message,
        Err(e) => {
            let why = format!("parse error: {e}");
            return refusal(StatusCode::BAD_REQUEST, &Value::Null, PARSE_ERROR, &why);
        }
    };
    let json_rpc_2 = |m: &&Map<String, Value>| m.get("jsonrpc") == Some(&json!("2.0"));
    let Some(message) = message.as_object().filter(json_rpc_2) else {
        let why = if message.is_array() {
            "batches are not supported"
        } else {
            "not a JSON-RPC 2.0 message"
        };
        return refusal(StatusCode::BAD_REQUEST, &Value::Null, INVALID_REQUEST, why);
    };
    let id = message.get("id").cloned();
    let method = message.get("method").and_then(Value::as_str);
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    let request = String::from_utf8_lossy(&body);
    if let (Some(id), Some("initialize")) = (&id, method) {
        return initialize(&shared, id.clone(), &params, &request).await;
    }
    let reply_id = id.clone().unwrap_or(Value::Null);
    if let Err(refused) = session(&shared, &headers, &reply_id) {
        return *refused;
    }
    // A notification, or a response to a request this server never sends.
    let Some(id) = id else {
        return StatusCode::ACCEPTED.into_response();
    };
    let reply = Reply {
        id,
        transport: Transport::Json,
    };
    match method {
        Some("ping") => reply.result(json!({})),
        Some("tools/list") => list_tools(&shared, reply, &request).await,
        Some("tools/call") => call_tool(&shared, reply, &params, &request).await,
        Some(other) => reply.error(METHOD_NOT_FOUND, &format!("method not found: {other}")),
        None => reply.error(INVALID_REQUEST, "a request needs a method"),
    }
}

/// The answer to a request without the server's key, before any JSON-RPC is read.
pub(crate) fn unauthorized() -> Response {
    let message = "missing or wrong API key";
    refusal(
        StatusCode::UNAUTHORIZED,
        &Value::Null,
        UNAUTHORIZED,
        message,
    )
}

/// The session the message carries, if this server gave it out; else the answer refusing it
/// (boxed: an answer is large next to a session id).
fn session<'h>(
    shared: &Shared,
    headers: &'h HeaderMap,
    id: &Value,
) -> Result<&'h str, Box<Response>> {
    let refused = |status, message| Box::new(refusal(status, id, INVALID_REQUEST, message));
    match headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) {
        None => Err(refused(
            StatusCode::BAD_REQUEST,
            "missing Mcp-Session-Id: initialize first",
        )),
        Some(session) if !shared.sessions.is_open(session) => Err(refused(
            StatusCode::NOT_FOUND,
            "unknown or expired session: initialize again",
        )),
        Some(session) => Ok(session),
    }
}

/// `DELETE /mcp`: the client ends its session.
async fn end_session(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    match session(&shared, &headers, &Value::Null) {
        Ok(session) => {
            shared.sessions.close(session);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(refused) => *refused,
    }
}

/// Performs one MCP call under the fault rules: the effect is given the server and the reply
/// to answer with.
async fn performed<F, Fut>(
    shared: &Arc<Shared>,
    reply: Reply,
    call: Call<'_>,
    effect: F,
) -> Response
where
    F: FnOnce(Arc<Shared>, Reply) -> Fut,
    Fut: Future<Output = Result<Response, Refusal>> + Send + 'static,
{
    let effect = effect(Arc::clone(shared), reply.clone());
    perform(shared, &Mcp(reply), call, effect).await
}

async fn initialize(shared: &Arc<Shared>, id: Value, params: &Value, request: &str) -> Response {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = PROTOCOL_VERSIONS
        .into_iter()
        .find(|v| Some(*v) == asked)
        .unwrap_or(PROTOCOL_VERSIONS[0]);
    let reply = Reply {
        id,
        transport: Transport::Json,
    };
    let call = Call::new(Operation::Initialize, None, request);
    performed(shared, reply, call, async move |inner, answer| {
        let session = inner.sessions.open();
        let mut response = answer.result(json!({
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": false}},
            "serverInfo": {"name": SERVER_NAME, "version": env!("CARGO_PKG_VERSION")},
        }));
        if let Ok(value) = HeaderValue::from_str(&session) {
            response.headers_mut().insert(SESSION_HEADER, value);
        }
        Ok(response)
    })
    .await
}

async fn list_tools(shared: &Arc<Shared>, reply: Reply, request: &str) -> Response {
    let call = Call::new(Operation::ListTools, None, request);
    performed(shared, reply, call, async move |inner, answer| {
        let tools: Vec<Value> = inner.declared.tools().iter().map(|t| t.listed()).collect();
        Ok(answer.result(json!({"tools": tools})))
    })
    .await
}

async fn call_tool(
    shared: &Arc<Shared>,
    mut reply: Reply,
    params: &Value,
    request: &str,
) -> Response {
    if shared.sse_answers {
        reply.transport = Transport::EventStream;
    }
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let declared = shared.declared.tool(name);
    let Some((tool, operation)) = declared.and_then(|t| Some((t, tools::operation(name)?))) else {
        return reply.error(INVALID_PARAMS, &format!("unknown tool {name}"));
    };
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(arguments)) => arguments.clone(),
        Some(_) => {
            return reply.error(
                INVALID_PARAMS,
                &format!("{name}: arguments must be an object"),
            );
        }
    };
    let sandbox_id = arguments
        .get("briq")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let call = Call::new(operation, sandbox_id.as_deref(), request);
    performed(shared, reply, call, async move |inner, answer| {
        let result = tools::call(inner, tool, arguments).await?;
        Ok(answer.result(result))
    })
    .await
}

#[cfg(test)]
mod tests;
