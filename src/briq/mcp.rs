//! briq's MCP endpoint, one JSON-RPC request at a time over Streamable HTTP: `initialize` once
//! per key (its `Mcp-Session-Id` echoed when the server gives one), then `tools/call` and
//! `tools/list`, each answered as one JSON body or as an SSE stream.
//!
//! Written on reqwest rather than on rmcp's client: the operator sends a different key per
//! executor on one connection pool, and classifies every failure by what it proves about the
//! effect (refused before acting, lost after sending, answered). That needs the HTTP status, the
//! error body, the request id and the exact point where an answer broke off, which rmcp's
//! transport does not hand back.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use serde::Deserialize;
use serde_json::{Value, json};
use url::Url;

use super::api::{self, REQUEST_ID_HEADER};
use super::conformance::DeclaredTool;
use super::error::Error;
use super::key::ApiKey;
use crate::traces;

/// The protocol revision this client speaks (the server may answer an older one it prefers).
pub const PROTOCOL_VERSION: &str = "2025-06-18";
const SESSION_HEADER: &str = "mcp-session-id";
const PROTOCOL_HEADER: &str = "mcp-protocol-version";

/// A session with the server for one key: what `initialize` answered.
#[derive(Debug, Clone)]
struct Session {
    id: Option<String>,
    protocol_version: String,
}

/// One content item of a tool's answer.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Content {
    Text {
        text: String,
    },
    /// A file read that is a picture (published for PNG, JPEG, GIF, WebP): base64 bytes.
    Image {
        data: String,
        #[serde(rename = "mimeType")]
        mime_type: String,
    },
    #[serde(other)]
    Other,
}

/// The result of `tools/call`.
#[derive(Debug, Clone, Deserialize)]
struct CallToolResult {
    #[serde(default)]
    content: Vec<Content>,
    #[serde(default, rename = "structuredContent")]
    structured: Option<Value>,
    #[serde(default, rename = "isError")]
    is_error: bool,
}

/// A tool's successful answer.
#[derive(Debug, Clone)]
pub struct ToolAnswer {
    pub structured: Option<Value>,
    pub content: Vec<Content>,
    pub request_id: Option<String>,
}

impl ToolAnswer {
    /// The answer as `T`: its structured content, else its first text item read as JSON.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        let malformed = |detail: String| Error::Malformed {
            detail,
            request_id: self.request_id.clone(),
        };
        if let Some(structured) = &self.structured {
            return T::deserialize(structured).map_err(|e| malformed(e.to_string()));
        }
        let text = self
            .content
            .iter()
            .find_map(|item| match item {
                Content::Text { text } => Some(text),
                _ => None,
            })
            .ok_or_else(|| malformed("the answer has no text".to_owned()))?;
        serde_json::from_str(text).map_err(|e| malformed(e.to_string()))
    }

    /// The first text item, as sent.
    pub fn text(&self) -> Option<&str> {
        self.content.iter().find_map(|item| match item {
            Content::Text { text } => Some(text.as_str()),
            _ => None,
        })
    }
}

#[derive(Debug, Deserialize)]
struct ListToolsResult {
    tools: Vec<DeclaredTool>,
    #[serde(default, rename = "nextCursor")]
    next_cursor: Option<String>,
}

/// Why one POST failed.
enum PostError {
    /// 404 to a request that carried a session: the server forgot it, and refused the request
    /// before acting; initialize again and resend.
    SessionExpired,
    Briq(Error),
}

impl From<Error> for PostError {
    fn from(error: Error) -> Self {
        Self::Briq(error)
    }
}

/// What one POST brought back.
struct Posted {
    /// The JSON-RPC message answering the request; `None` for a notification's 202.
    message: Option<Value>,
    session_id: Option<String>,
    protocol_version: Option<String>,
}

/// The endpoint, shared by every clone of the client.
#[derive(Debug)]
pub struct Endpoint {
    http: reqwest::Client,
    url: Url,
    max_response_bytes: usize,
    sessions: Mutex<HashMap<u64, Session>>,
    next_id: AtomicU64,
}

impl Endpoint {
    pub fn new(http: reqwest::Client, url: Url, max_response_bytes: usize) -> Self {
        Self {
            http,
            url,
            max_response_bytes,
            sessions: Mutex::default(),
            next_id: AtomicU64::new(1),
        }
    }

    /// Calls `tool` with `arguments`; a tool error comes back as the [`Error`] it stands for.
    pub async fn call_tool(
        &self,
        key: &ApiKey,
        tool: &'static str,
        arguments: &impl serde::Serialize,
        timeout: Duration,
    ) -> Result<ToolAnswer, Error> {
        let arguments = serde_json::to_value(arguments).map_err(|e| Error::Invalid {
            detail: format!("{tool}'s arguments: {e}"),
        })?;
        let (result, request_id) = self
            .request(
                key,
                tool,
                "tools/call",
                json!({"name": tool, "arguments": arguments}),
                timeout,
            )
            .await?;
        let result: CallToolResult =
            serde_json::from_value(result).map_err(|e| Error::Malformed {
                detail: format!("{tool}'s answer: {e}"),
                request_id: request_id.clone(),
            })?;
        if result.is_error {
            let text = result
                .content
                .iter()
                .find_map(|item| match item {
                    Content::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .unwrap_or("");
            return Err(Error::from_tool_error(text, request_id, key));
        }
        Ok(ToolAnswer {
            structured: result.structured,
            content: result.content,
            request_id,
        })
    }

    /// Every tool the server declares (`tools/list`, following its cursor).
    pub async fn list_tools(
        &self,
        key: &ApiKey,
        timeout: Duration,
    ) -> Result<Vec<DeclaredTool>, Error> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        // A server that hands back cursors forever is answered by a bound, not a loop.
        for _ in 0..32 {
            let params = match &cursor {
                Some(cursor) => json!({"cursor": cursor}),
                None => json!({}),
            };
            let (result, request_id) = self
                .request(key, "tools/list", "tools/list", params, timeout)
                .await?;
            let page: ListToolsResult =
                serde_json::from_value(result).map_err(|e| Error::Malformed {
                    detail: format!("tools/list: {e}"),
                    request_id,
                })?;
            tools.extend(page.tools);
            match page.next_cursor {
                Some(next) if !next.is_empty() => cursor = Some(next),
                _ => return Ok(tools),
            }
        }
        Err(Error::Malformed {
            detail: "tools/list: more than 32 pages".to_owned(),
            request_id: None,
        })
    }

    /// One request in the key's session: initialized first when it has none, and once more when
    /// the server has forgotten it. Answers the JSON-RPC result and the request id.
    async fn request(
        &self,
        key: &ApiKey,
        operation: &str,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<(Value, Option<String>), Error> {
        let mut renewed = false;
        loop {
            let session = self.session(key, timeout).await?;
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
            match self
                .post(key, operation, Some(&session), &message, timeout)
                .await
            {
                Ok((posted, request_id)) => {
                    return Ok((response(posted.message, id, &request_id, key)?, request_id));
                }
                Err(PostError::SessionExpired) if !renewed => {
                    renewed = true;
                    self.forget(key);
                }
                // Refused before acting both times (MCP's rule for a 404 in a session).
                Err(PostError::SessionExpired) => {
                    return Err(Error::Rejected {
                        status: 404,
                        code: api::ErrorCode::Other,
                        message: "the server forgot the session it had just given".to_owned(),
                        request_id: None,
                    });
                }
                Err(PostError::Briq(error)) => return Err(error),
            }
        }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Session>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn forget(&self, key: &ApiKey) {
        self.sessions().remove(&key.fingerprint());
    }

    /// The key's session, initialized when it has none. Two calls that initialize at once
    /// make two sessions; the later is kept, and both are valid.
    async fn session(&self, key: &ApiKey, timeout: Duration) -> Result<Session, Error> {
        if let Some(session) = self.sessions().get(&key.fingerprint()) {
            return Ok(session.clone());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let initialize = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "briq-operator", "version": env!("CARGO_PKG_VERSION")},
            },
        });
        let (posted, request_id) = match self
            .post(key, "initialize", None, &initialize, timeout)
            .await
        {
            Ok(posted) => posted,
            Err(PostError::Briq(error)) => return Err(error),
            Err(PostError::SessionExpired) => unreachable!("no session was sent"),
        };
        let session_id = posted.session_id.clone();
        let header_version = posted.protocol_version.clone();
        let result = response(posted.message, id, &request_id, key)?;
        let protocol_version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .or(header_version.as_deref())
            .unwrap_or(PROTOCOL_VERSION)
            .to_owned();
        let session = Session {
            id: session_id,
            protocol_version,
        };
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        match self
            .post(key, "initialized", Some(&session), &initialized, timeout)
            .await
        {
            Ok(_) => {}
            Err(PostError::Briq(error)) => return Err(error),
            Err(PostError::SessionExpired) => {
                return Err(Error::Malformed {
                    detail: "the server forgot the session it had just given".to_owned(),
                    request_id,
                });
            }
        }
        self.sessions().insert(key.fingerprint(), session.clone());
        Ok(session)
    }

    /// POSTs one JSON-RPC message and reads its answer within the size bound.
    async fn post(
        &self,
        key: &ApiKey,
        operation: &str,
        session: Option<&Session>,
        message: &Value,
        timeout: Duration,
    ) -> Result<(Posted, Option<String>), PostError> {
        let mut request = self
            .http
            .post(self.url.clone())
            .timeout(timeout)
            .bearer_auth(key.expose())
            .header(ACCEPT, "application/json, text/event-stream")
            .json(message);
        if let Some(session) = session {
            if let Some(id) = &session.id {
                request = request.header(SESSION_HEADER, id);
            }
            request = request.header(PROTOCOL_HEADER, &session.protocol_version);
        }
        let noted = traces::enabled().then(|| (operation.to_owned(), SystemTime::now()));
        let note = |status: Option<u16>, request_id: Option<&str>| {
            if let Some((operation, start)) = &noted {
                traces::note(traces::BriqCall {
                    operation: operation.clone(),
                    start: *start,
                    end: SystemTime::now(),
                    request_id: request_id
                        .filter(|id| traceable_request_id(id, key))
                        .map(str::to_owned),
                    status,
                });
            }
        };
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => {
                note(None, None);
                return Err(Error::from_transport(e, None).into());
            }
        };
        let headers = response.headers().clone();
        let request_id = header(&headers, REQUEST_ID_HEADER);
        let status = response.status();
        note(Some(status.as_u16()), request_id.as_deref());
        if status == reqwest::StatusCode::NOT_FOUND && session.is_some_and(|s| s.id.is_some()) {
            return Err(PostError::SessionExpired);
        }
        if !status.is_success() {
            let body = self.read_body(response, &request_id).await?;
            return Err(Error::from_answer(
                status,
                &body,
                retry_after(&headers),
                request_id.clone(),
                key,
            )
            .into());
        }
        let posted = |message| Posted {
            message,
            session_id: header(&headers, SESSION_HEADER),
            protocol_version: header(&headers, PROTOCOL_HEADER),
        };
        if status == reqwest::StatusCode::ACCEPTED {
            return Ok((posted(None), request_id));
        }
        let expected_id = message.get("id").cloned();
        let event_stream = header(&headers, CONTENT_TYPE.as_str())
            .is_some_and(|kind| kind.starts_with("text/event-stream"));
        let message = if event_stream {
            self.read_events(response, expected_id.as_ref(), &request_id)
                .await?
        } else {
            let body = self.read_body(response, &request_id).await?;
            if body.is_empty() && expected_id.is_none() {
                return Ok((posted(None), request_id));
            }
            serde_json::from_slice(&body).map_err(|e| Error::Malformed {
                detail: format!("the answer is not JSON: {e}"),
                request_id: request_id.clone(),
            })?
        };
        Ok((posted(Some(message)), request_id))
    }

    /// Reads `response` chunk by chunk within the size bound, handing each chunk to `take` until
    /// it answers. A body that breaks off leaves the outcome unknown.
    async fn read_until<T>(
        &self,
        response: reqwest::Response,
        request_id: &Option<String>,
        mut take: impl FnMut(&[u8]) -> Option<T>,
    ) -> Result<Option<T>, Error> {
        let mut read = 0usize;
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|source| Error::Uncertain {
                source,
                request_id: request_id.clone(),
            })?;
            read += chunk.len();
            if read > self.max_response_bytes {
                return Err(Error::Malformed {
                    detail: format!("answer larger than {} bytes", self.max_response_bytes),
                    request_id: request_id.clone(),
                });
            }
            if let Some(taken) = take(&chunk) {
                return Ok(Some(taken));
            }
        }
        Ok(None)
    }

    async fn read_body(
        &self,
        response: reqwest::Response,
        request_id: &Option<String>,
    ) -> Result<Bytes, Error> {
        let mut body = BytesMut::new();
        self.read_until(response, request_id, |chunk| {
            body.extend_from_slice(chunk);
            None::<()>
        })
        .await?;
        Ok(body.freeze())
    }

    /// Reads an SSE stream until the event that answers the request (`id`), within the size
    /// bound. A stream that breaks or ends before it leaves the outcome unknown.
    async fn read_events(
        &self,
        response: reqwest::Response,
        id: Option<&Value>,
        request_id: &Option<String>,
    ) -> Result<Value, Error> {
        let mut events = EventReader::default();
        let answer = self
            .read_until(response, request_id, |chunk| {
                events
                    .push(chunk)
                    .into_iter()
                    .filter_map(|data| serde_json::from_str::<Value>(&data).ok())
                    .find(|message| {
                        message.get("id") == id
                            && (message.get("result").is_some() || message.get("error").is_some())
                    })
            })
            .await?;
        answer.ok_or_else(|| Error::Malformed {
            detail: "the answer's event stream ended before the answer".to_owned(),
            request_id: request_id.clone(),
        })
    }
}

/// The result of a JSON-RPC response to request `id`, or the error it carries.
fn response(
    message: Option<Value>,
    id: u64,
    request_id: &Option<String>,
    key: &ApiKey,
) -> Result<Value, Error> {
    let malformed = |detail: &str| Error::Malformed {
        detail: detail.to_owned(),
        request_id: request_id.clone(),
    };
    let mut message = message.ok_or_else(|| malformed("no answer to a request"))?;
    if message.get("id") != Some(&json!(id)) {
        return Err(malformed("the answer is to another request"));
    }
    if let Some(error) = message.get("error") {
        let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
        let text = error.get("message").and_then(Value::as_str).unwrap_or("");
        return Err(Error::from_json_rpc(code, text, request_id.clone(), key));
    }
    message
        .get_mut("result")
        .map(Value::take)
        .ok_or_else(|| malformed("the answer has neither result nor error"))
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Retry-After as seconds or as an HTTP date.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = k8s_openapi::jiff::fmt::rfc2822::parse(value)
        .ok()?
        .timestamp();
    let wait = at.duration_since(k8s_openapi::jiff::Timestamp::now());
    Some(Duration::try_from(wait).unwrap_or(Duration::ZERO))
}

/// Whether a request id may go into a span: remote text, so only a short token of plain
/// characters, never one that carries the key.
pub(super) fn traceable_request_id(id: &str, key: &ApiKey) -> bool {
    id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
        && !id.contains(key.expose())
}

/// Splits an SSE byte stream into the data of its events (comments and other fields skipped).
#[derive(Debug, Default)]
struct EventReader {
    pending: Vec<u8>,
}

impl EventReader {
    /// The data of every event completed by `chunk`.
    fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(chunk);
        let mut events = Vec::new();
        while let Some((end, separator)) = event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end + separator).collect();
            let text = String::from_utf8_lossy(&event[..end]);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(|data| data.strip_prefix(' ').unwrap_or(data))
                .collect();
            if !data.is_empty() {
                events.push(data.join("\n"));
            }
        }
        events
    }
}

/// Where the first complete event ends, and the length of the blank line that ends it.
fn event_end(bytes: &[u8]) -> Option<(usize, usize)> {
    let lf = bytes
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|at| (at, 2));
    let crlf = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| (at, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// The bytes of the first image item of an answer, if it has one.
pub fn image_bytes(content: &[Content]) -> Option<Result<Vec<u8>, base64::DecodeError>> {
    content.iter().find_map(|item| match item {
        Content::Image { data, .. } => Some(api::decode_base64(data)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_split_on_blank_lines_whatever_the_chunks() {
        let stream =
            b": briq-local\n\nevent: message\ndata: {\"a\":\ndata: 1}\n\r\n\r\ndata: two\n\n";
        for size in 1..stream.len() {
            let mut reader = EventReader::default();
            let events: Vec<String> = stream.chunks(size).flat_map(|c| reader.push(c)).collect();
            assert_eq!(events, ["{\"a\":\n1}", "two"], "chunks of {size}");
        }
    }

    #[test]
    fn a_response_to_another_request_or_without_a_result_is_malformed() {
        let key = ApiKey::new("k").unwrap();
        let cases = [
            (json!({"jsonrpc": "2.0", "id": 2, "result": {}}), false),
            (json!({"jsonrpc": "2.0", "id": 1}), false),
            (json!({"jsonrpc": "2.0", "id": 1, "result": {"x": 1}}), true),
        ];
        for (message, ok) in cases {
            let answer = response(Some(message.clone()), 1, &None, &key);
            assert_eq!(answer.is_ok(), ok, "{message}");
        }
        let refused = response(
            Some(json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}})),
            1,
            &None,
            &key,
        )
        .unwrap_err();
        assert_eq!(refused.class(), crate::briq::error::ErrorClass::Terminal);
        assert_eq!(
            refused.exec_outcome(),
            crate::briq::error::ExecOutcome::NotRun
        );
    }

    #[test]
    fn an_answer_reads_its_structured_content_else_its_text() {
        let structured = ToolAnswer {
            structured: Some(json!({"briqs": []})),
            content: vec![Content::Text {
                text: "not json".into(),
            }],
            request_id: None,
        };
        assert!(structured.decode::<api::BriqList>().is_ok());
        let text = ToolAnswer {
            structured: None,
            content: vec![Content::Text {
                text: r#"{"briqs": []}"#.into(),
            }],
            request_id: None,
        };
        assert!(text.decode::<api::BriqList>().is_ok());
        let image: Vec<Content> = serde_json::from_value(
            json!([{"type": "image", "data": "iVBO", "mimeType": "image/png"}]),
        )
        .unwrap();
        assert_eq!(image_bytes(&image).unwrap().unwrap(), b"\x89PN");
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
        headers.insert(
            RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), Some(Duration::ZERO));
    }

    #[test]
    fn a_request_id_carrying_the_key_or_odd_characters_stays_out_of_traces() {
        let key = ApiKey::new("bq_live_secret123").unwrap();
        let cases = [
            ("req-7f3a_9.b:1", true),
            ("", true),
            ("req\nforged", false),
            ("req id", false),
            ("x-bq_live_secret123", false),
            (&*"a".repeat(129), false),
        ];
        for (id, traceable) in cases {
            assert_eq!(traceable_request_id(id, &key), traceable, "{id:?}");
        }
    }
}
