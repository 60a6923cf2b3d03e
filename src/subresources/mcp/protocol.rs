//! MCP's JSON-RPC framing over Streamable HTTP, as data: what a POSTed body is, the answers to
//! the protocol's own methods, and the error objects. Nothing here does I/O.

use serde_json::{Value, json};

/// The protocol revisions this server speaks, newest first; an `initialize` asking for another
/// is answered with the newest, as the protocol prescribes.
pub const PROTOCOL_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];
/// The header carrying the session's id, set on the answer to `initialize`.
pub const SESSION_HEADER: &str = "mcp-session-id";
/// The header carrying the negotiated revision on every later request.
pub const VERSION_HEADER: &str = "mcp-protocol-version";

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;

/// A JSON-RPC error: its code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }
}

/// One POSTed JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Answered with a response carrying its `id`.
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// A notification or a client's response to the server: acknowledged with 202, no body.
    Accepted,
}

/// What `body` holds. A batch (a JSON array) is refused: the revisions this server speaks
/// since 2025-06-18 have none, and one message a POST keeps each answer bounded.
pub fn parse(body: &[u8]) -> Result<Message, (Value, RpcError)> {
    let value: Value = serde_json::from_slice(body).map_err(|error| {
        (
            Value::Null,
            RpcError::new(PARSE_ERROR, format!("the body is not JSON: {error}")),
        )
    })?;
    let Value::Object(object) = value else {
        let why = if value.is_array() {
            "batches are not supported: POST one JSON-RPC message at a time"
        } else {
            "a JSON-RPC message is an object"
        };
        return Err((Value::Null, RpcError::new(INVALID_REQUEST, why)));
    };
    let id = object.get("id").cloned();
    let invalid = |why: &str| {
        Err((
            id.clone().unwrap_or(Value::Null),
            RpcError::new(INVALID_REQUEST, why),
        ))
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid("\"jsonrpc\" must be \"2.0\"");
    }
    let Some(method) = object.get("method") else {
        return if object.contains_key("result") || object.contains_key("error") {
            Ok(Message::Accepted)
        } else {
            invalid("a request names its \"method\"")
        };
    };
    let Some(method) = method.as_str() else {
        return invalid("\"method\" must be a string");
    };
    let Some(id) = id else {
        return Ok(Message::Accepted);
    };
    if !(id.is_string() || id.is_i64() || id.is_u64()) {
        return Err((
            Value::Null,
            RpcError::new(INVALID_REQUEST, "\"id\" must be a string or an integer"),
        ));
    }
    let params = object.get("params").cloned().unwrap_or(Value::Null);
    if !(params.is_object() || params.is_null()) {
        return Err((
            id,
            RpcError::new(INVALID_PARAMS, "\"params\" must be an object"),
        ));
    }
    Ok(Message::Request {
        id,
        method: method.to_owned(),
        params,
    })
}

/// The revision to answer an `initialize` asking for `asked`.
pub fn negotiate(asked: Option<&str>) -> &'static str {
    PROTOCOL_VERSIONS
        .iter()
        .find(|v| Some(**v) == asked)
        .copied()
        .unwrap_or(PROTOCOL_VERSIONS[0])
}

/// Whether a later request's `MCP-Protocol-Version` header may be served (absent means the
/// client speaks 2025-03-26, which had none).
pub fn version_served(header: Option<&str>) -> bool {
    header.is_none_or(|v| PROTOCOL_VERSIONS.contains(&v))
}

/// The answer to `initialize` at `version`.
pub fn initialize_result(version: &str, namespace: &str) -> Value {
    json!({
        "protocolVersion": version,
        "capabilities": { "tools": { "listChanged": false }, "logging": {} },
        "serverInfo": {
            "name": "briq-operator",
            "title": "briq executors",
            "version": env!("CARGO_PKG_VERSION"),
        },
        "instructions": format!(
            "Python executors of Kubernetes namespace {namespace}: each BriqExecutor is a \
             sandbox with a persistent Jupyter kernel. list_executors shows them; create_executor \
             makes one; run_python runs code in one, its variables and imports kept for the next \
             call. Every action is recorded as an Execution, and every call is authorized as you."
        ),
    })
}

pub fn response(id: &Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

pub fn error_response(id: &Value, error: &RpcError) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id,
        "error": { "code": error.code, "message": error.message },
    })
}

pub fn notification(method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "method": method, "params": params })
}

/// One Server-Sent Event carrying `message`.
pub fn sse_event(message: &Value) -> String {
    format!("event: message\ndata: {message}\n\n")
}

/// Whether the client takes an SSE stream as the answer (its `Accept` names it).
pub fn accepts_sse(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',')
            .any(|t| t.trim().starts_with("text/event-stream"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_body_is_one_message_or_the_error_that_says_why_not() {
        let request = br#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#;
        assert_eq!(
            parse(request),
            Ok(Message::Request {
                id: json!(7),
                method: "tools/list".into(),
                params: Value::Null
            })
        );
        for accepted in [
            &br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#[..],
            br#"{"jsonrpc":"2.0","id":"s1","result":{}}"#,
            br#"{"jsonrpc":"2.0","id":"s1","error":{"code":1,"message":"x"}}"#,
        ] {
            assert_eq!(parse(accepted), Ok(Message::Accepted));
        }
        for (body, code, id) in [
            (&b"{not json"[..], PARSE_ERROR, Value::Null),
            (
                br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
                INVALID_REQUEST,
                Value::Null,
            ),
            (br#""ping""#, INVALID_REQUEST, Value::Null),
            (br#"{"id":1,"method":"ping"}"#, INVALID_REQUEST, json!(1)),
            (br#"{"jsonrpc":"2.0","id":1}"#, INVALID_REQUEST, json!(1)),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":3}"#,
                INVALID_REQUEST,
                json!(1),
            ),
            (
                br#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#,
                INVALID_REQUEST,
                Value::Null,
            ),
            (
                br#"{"jsonrpc":"2.0","id":2,"method":"ping","params":[1]}"#,
                INVALID_PARAMS,
                json!(2),
            ),
        ] {
            let (answered_id, error) = parse(body).unwrap_err();
            assert_eq!(
                (answered_id, error.code),
                (id, code),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn a_known_revision_is_echoed_and_any_other_gets_the_newest() {
        assert_eq!(negotiate(Some("2025-06-18")), "2025-06-18");
        assert_eq!(negotiate(Some("2025-03-26")), "2025-03-26");
        assert_eq!(negotiate(Some("2024-11-05")), "2025-11-25");
        assert_eq!(negotiate(None), "2025-11-25");
        assert!(version_served(None));
        assert!(version_served(Some("2025-11-25")));
        assert!(!version_served(Some("1999-01-01")));
    }

    #[test]
    fn an_sse_answer_is_given_only_to_a_client_that_takes_one() {
        assert!(accepts_sse(Some("application/json, text/event-stream")));
        assert!(accepts_sse(Some("text/event-stream;q=0.9")));
        assert!(!accepts_sse(Some("application/json")));
        assert!(!accepts_sse(None));
        assert_eq!(
            sse_event(&json!({"a": 1})),
            "event: message\ndata: {\"a\":1}\n\n"
        );
    }
}
