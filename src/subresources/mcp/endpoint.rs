//! `namespaces/{namespace}/mcp`: MCP's Streamable HTTP transport. kube-apiserver authenticates
//! the caller and authorizes the path (`create` on resource `mcp` for a POST, `deletecollection`
//! for a DELETE) before proxying it; each tool then asks for the caller's right to what it does.
//! A POST carries one JSON-RPC message; `run_python` answers on an SSE stream that carries its
//! prints as notifications first, every other request in one JSON body.

use std::{sync::Arc, time::Instant};

use axum::{
    Extension, Json,
    body::Body,
    extract::{Path, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{
    act::{self, Outcome, Relay},
    protocol::{self, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, Message, RpcError},
    tools::{self, Call, Refused},
};
use crate::{
    briq::SandboxApi,
    subresources::{
        front_proxy::User,
        served::{Served, status},
    },
};

/// The largest POSTed message: a `write_file` of 1 MiB in base64 with room to spare.
pub const MAX_REQUEST_BYTES: usize = 2 * 1024 * 1024;
/// How much of a longer body is read and dropped before the connection is given up.
const DRAINED_BYTES: usize = 16 * 1024 * 1024;

fn rpc_error(code: StatusCode, id: &Value, error: &RpcError) -> Response {
    (code, Json(protocol::error_response(id, error))).into_response()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A page in a browser sends `Origin`; no MCP client does. Refusing it keeps a web page from
/// reaching the endpoint through a user's `kubectl proxy` (DNS rebinding, cross-site POSTs).
fn from_a_browser(headers: &HeaderMap) -> Option<Response> {
    headers.contains_key(header::ORIGIN).then(|| {
        status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "requests from web pages (with an Origin header) are not served".into(),
        )
    })
}

/// The body, when it is at most [`MAX_REQUEST_BYTES`]. A longer one is read on and dropped up
/// to [`DRAINED_BYTES`], so that the answer (413) reaches the client through kube-apiserver's
/// proxy, which fails the whole request when the body is cut off while it still sends it.
async fn read_bounded(body: Body) -> Option<Bytes> {
    let mut frames = body.into_data_stream();
    let mut kept = Vec::new();
    let mut seen = 0usize;
    while let Some(Ok(chunk)) = futures::StreamExt::next(&mut frames).await {
        seen += chunk.len();
        if seen > DRAINED_BYTES {
            return None;
        }
        if seen <= MAX_REQUEST_BYTES {
            kept.extend_from_slice(&chunk);
        }
    }
    (seen <= MAX_REQUEST_BYTES).then(|| Bytes::from(kept))
}

pub async fn post<S: SandboxApi + Clone + 'static>(
    State(served): State<Arc<Served<S>>>,
    Extension(user): Extension<User>,
    Path(namespace): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Some(refused) = from_a_browser(&headers) {
        return refused;
    }
    let Some(bytes) = read_bounded(body).await else {
        return status(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!("an MCP message is at most {MAX_REQUEST_BYTES} bytes"),
        );
    };
    let (id, method, params) = match protocol::parse(&bytes) {
        Ok(Message::Request { id, method, params }) => (id, method, params),
        Ok(Message::Accepted) => return StatusCode::ACCEPTED.into_response(),
        Err((id, error)) => return rpc_error(StatusCode::BAD_REQUEST, &id, &error),
    };
    let now = Instant::now();
    if method == "initialize" {
        let version = protocol::negotiate(params["protocolVersion"].as_str());
        return match served.sessions.open(&user.name, &namespace, version, now) {
            Ok(session) => {
                let answer =
                    protocol::response(&id, protocol::initialize_result(version, &namespace));
                let mut response = Json(answer).into_response();
                response.headers_mut().insert(
                    protocol::SESSION_HEADER,
                    HeaderValue::from_str(&session).expect("a hex session id"),
                );
                response
            }
            Err(full) => rpc_error(
                StatusCode::SERVICE_UNAVAILABLE,
                &id,
                &RpcError::new(INVALID_REQUEST, full.to_string()),
            ),
        };
    }
    let Some(session) = header(&headers, protocol::SESSION_HEADER) else {
        return rpc_error(
            StatusCode::BAD_REQUEST,
            &id,
            &RpcError::new(INVALID_REQUEST, "no Mcp-Session-Id: send initialize first"),
        );
    };
    if served
        .sessions
        .find(session, &user.name, &namespace, now)
        .is_none()
    {
        return rpc_error(
            StatusCode::NOT_FOUND,
            &id,
            &RpcError::new(
                INVALID_REQUEST,
                "no such session (ended or expired): initialize again",
            ),
        );
    }
    if !protocol::version_served(header(&headers, protocol::VERSION_HEADER)) {
        return rpc_error(
            StatusCode::BAD_REQUEST,
            &id,
            &RpcError::new(
                INVALID_REQUEST,
                format!(
                    "MCP-Protocol-Version is not one of {}",
                    protocol::PROTOCOL_VERSIONS.join(", ")
                ),
            ),
        );
    }
    let result = match method.as_str() {
        "ping" | "logging/setLevel" => serde_json::json!({}),
        "tools/list" => serde_json::json!({ "tools": tools::definitions() }),
        "tools/call" => {
            let Some(name) = params["name"].as_str() else {
                return rpc_error(
                    StatusCode::OK,
                    &id,
                    &RpcError::new(INVALID_PARAMS, "tools/call names its tool in \"name\""),
                );
            };
            let call = match Call::parse(name, &params["arguments"]) {
                Ok(call) => call,
                Err(Refused::UnknownTool(tool)) => {
                    return rpc_error(
                        StatusCode::OK,
                        &id,
                        &RpcError::new(INVALID_PARAMS, format!("unknown tool: {tool}")),
                    );
                }
                Err(Refused::Arguments(why)) => {
                    let answer = protocol::response(&id, Outcome::error(why).result());
                    return Json(answer).into_response();
                }
            };
            let progress_token = params["_meta"].get("progressToken").cloned();
            if matches!(call, Call::RunPython { .. })
                && protocol::accepts_sse(header(&headers, header::ACCEPT.as_str()))
            {
                return streamed(served, user, namespace, id, call, progress_token).await;
            }
            act::perform(&served, &user, &namespace, call, None)
                .await
                .result()
        }
        other => {
            return rpc_error(
                StatusCode::OK,
                &id,
                &RpcError::new(METHOD_NOT_FOUND, format!("method not found: {other}")),
            );
        }
    };
    Json(protocol::response(&id, result)).into_response()
}

/// `call` answered on an SSE stream: its notifications as they come, then its result. The call
/// goes on when the client leaves (the action is an Execution: its result stays in its
/// status), only its relay stops.
async fn streamed<S: SandboxApi + Clone + 'static>(
    served: Arc<Served<S>>,
    user: User,
    namespace: String,
    id: Value,
    call: Call,
    progress_token: Option<Value>,
) -> Response {
    // A few messages in flight: a client that reads slowly holds the relay, never a buffer.
    let (out, messages) = mpsc::channel::<Value>(16);
    tokio::spawn(async move {
        let relay = Relay::new(out.clone(), progress_token);
        let outcome = act::perform(&served, &user, &namespace, call, Some(relay)).await;
        let _ = out.send(protocol::response(&id, outcome.result())).await;
    });
    // The answer starts with its first message: headers alone, followed by a pause, leave
    // kube-apiserver's proxy with a response it sometimes drops before the body comes.
    let mut messages = ReceiverStream::new(messages);
    let first = tokio_stream::StreamExt::next(&mut messages).await;
    let events = tokio_stream::StreamExt::map(
        tokio_stream::StreamExt::chain(tokio_stream::iter(first), messages),
        |message| Ok::<_, std::convert::Infallible>(Bytes::from(protocol::sse_event(&message))),
    );
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(events),
    )
        .into_response()
}

/// No stream of the server's own: everything it sends belongs to a request and goes on that
/// request's stream, and kube-apiserver would cut an idle one at its request timeout anyway.
pub async fn get() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST, DELETE")],
        "this MCP endpoint sends everything on the stream of the request it belongs to",
    )
        .into_response()
}

/// Ends the caller's session.
pub async fn delete<S: SandboxApi + Clone + 'static>(
    State(served): State<Arc<Served<S>>>,
    Extension(user): Extension<User>,
    Path(namespace): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = from_a_browser(&headers) {
        return refused;
    }
    match header(&headers, protocol::SESSION_HEADER) {
        Some(session) if served.sessions.close(session, &user.name, &namespace) => {
            StatusCode::NO_CONTENT.into_response()
        }
        Some(_) => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "no such MCP session".into(),
        ),
        None => status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "DELETE ends the session its Mcp-Session-Id names".into(),
        ),
    }
}
