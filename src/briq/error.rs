//! Errors of the briq client, classified by what the caller should do next.

use std::time::Duration;

use reqwest::StatusCode;

use super::api::{ErrorCode, SandboxState, ToolErrorBody};
use super::conformance::{self, Mismatch};
use super::key::ApiKey;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a caller can conclude from an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The sandbox (or file) does not exist.
    NotFound,
    /// Repeating the same call cannot succeed: bad key, invalid request, plan or policy refusal.
    Terminal,
    /// The call did not take effect and may be repeated after a pause.
    Retryable,
    /// The call may or may not have taken effect: look before repeating anything not idempotent.
    Uncertain,
    /// briq answered something this client cannot understand; the call may have taken effect.
    Malformed,
}

/// What a failed call that runs code (an exec) may have done in the sandbox. Unlike
/// [`ErrorClass`], which decides whether an idempotent call may be repeated (a GET after a 503
/// may), this answers whether the code can have run: an exec is never repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecOutcome {
    /// The request provably never reached the sandbox, or briq refused it before acting.
    NotRun,
    /// The sandbox may have run the command: a gateway can answer 5xx, time out or reset the
    /// connection after briq acted on the request.
    Unknown,
}

/// Statuses with which briq refuses a request before acting on it: malformed or invalid
/// requests, authentication and authorization, a missing sandbox, conflicts, rate limits.
const REFUSED_BEFORE_ACTING: [u16; 7] = [400, 401, 403, 404, 409, 422, 429];

/// An error from the briq client. Never contains the API key.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not sent: the server's `tools/list` does not declare what the operator sends with this
    /// key, or requires what it never sends ([`super::conformance`]). Nothing happened at briq.
    #[error(
        "briq's MCP interface differs from what the operator speaks (BriqInterfaceMismatch): {}",
        conformance::describe(mismatches)
    )]
    InterfaceMismatch { mismatches: Vec<Mismatch> },
    /// Not sent: the request is one this client refuses to make (a limit briq publishes).
    #[error("not sent to briq: {detail}")]
    Invalid { detail: String },
    #[error("briq: not found: {message}{}", by(request_id))]
    NotFound {
        message: String,
        request_id: Option<String>,
    },
    #[error(
        "briq refused the API key (HTTP {status}): {message}; check the API key Secret{}",
        by(request_id)
    )]
    Unauthorized {
        status: u16,
        message: String,
        request_id: Option<String>,
    },
    #[error(
        "briq refused the request (HTTP {status}, {code}): {message}{}",
        by(request_id)
    )]
    Rejected {
        status: u16,
        code: ErrorCode,
        message: String,
        request_id: Option<String>,
    },
    #[error(
        "briq is unavailable (HTTP {status}, {code}): {message}{}",
        by(request_id)
    )]
    Unavailable {
        status: u16,
        code: ErrorCode,
        message: String,
        retry_after: Option<Duration>,
        request_id: Option<String>,
    },
    /// The request never left: nothing happened at briq.
    #[error("cannot reach briq")]
    Unreachable {
        #[source]
        source: reqwest::Error,
    },
    /// The request may have reached briq; its answer was lost or late.
    #[error(
        "briq call outcome unknown (connection lost or timed out){}",
        by(request_id)
    )]
    Uncertain {
        #[source]
        source: reqwest::Error,
        request_id: Option<String>,
    },
    #[error("malformed answer from briq: {detail}{}", by(request_id))]
    Malformed {
        detail: String,
        request_id: Option<String>,
    },
    #[error(
        "briq stored {path} with SHA-256 {answered}, expected {expected}{}",
        by(request_id)
    )]
    Integrity {
        path: String,
        expected: String,
        answered: String,
        request_id: Option<String>,
    },
    /// Created, but not running within the ready timeout; it can be found again by name.
    #[error("sandbox {id} is not running after {waited:?} (state {state})")]
    NotReady {
        id: String,
        state: SandboxState,
        waited: Duration,
    },
    #[error("cannot build the briq HTTP client or request")]
    Build {
        #[source]
        source: reqwest::Error,
    },
    /// Not sent: briq did not answer the last calls made with this key, and calls are held back
    /// until the pause is over ([`super::health`]). Nothing happened at briq.
    #[error(
        "briq is not answering (an outage?): calls are held back for {wait:?}, then briq is \
         probed again"
    )]
    HeldBack { wait: Duration },
}

/// Remote text kept in an error, at most: enough to tell a gateway page from briq's own answer.
pub const MAX_REMOTE_CHARS: usize = 200;

/// What stands for remote text an error does not keep ([`Error::without_remote_text`]).
pub const REMOTE_TEXT_NOT_KEPT: &str = "<not kept: the request carried secrets>";

/// `text` from the network as an error may carry it: the key scrubbed first, then cut to
/// [`MAX_REMOTE_CHARS`] characters.
pub fn remote_text(text: &str, key: &ApiKey) -> String {
    let scrubbed = text.replace(key.expose(), "<redacted>");
    match scrubbed.char_indices().nth(MAX_REMOTE_CHARS) {
        Some((cut, _)) => format!("{}…", &scrubbed[..cut]),
        None => scrubbed,
    }
}

fn by(request_id: &Option<String>) -> String {
    request_id
        .as_deref()
        .map(|id| format!(" (request id {id})"))
        .unwrap_or_default()
}

impl Error {
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::NotFound { .. } => ErrorClass::NotFound,
            Self::Unauthorized { .. }
            | Self::Rejected { .. }
            | Self::Build { .. }
            | Self::InterfaceMismatch { .. }
            | Self::Invalid { .. } => ErrorClass::Terminal,
            Self::Unavailable { .. }
            | Self::Unreachable { .. }
            | Self::Integrity { .. }
            | Self::NotReady { .. }
            | Self::HeldBack { .. } => ErrorClass::Retryable,
            Self::Uncertain { .. } => ErrorClass::Uncertain,
            Self::Malformed { .. } => ErrorClass::Malformed,
        }
    }

    /// What the sandbox may have done when this error is the answer to an exec. Only a request
    /// that never left ([`Error::Unreachable`], [`Error::Build`], a held-back or refused-here
    /// call), a refusal with one of `REFUSED_BEFORE_ACTING`'s statuses, or a JSON-RPC or tool
    /// error whose code says it was refused before acting ([`ErrorCode::refused_before_acting`])
    /// proves the command did not run; everything else (any 5xx, any other status, a timeout or
    /// reset after sending, a malformed or cut answer) leaves it unknown.
    pub fn exec_outcome(&self) -> ExecOutcome {
        let refused = |status: &u16| REFUSED_BEFORE_ACTING.contains(status);
        match self {
            Self::Unreachable { .. }
            | Self::Build { .. }
            | Self::NotFound { .. }
            | Self::HeldBack { .. }
            | Self::InterfaceMismatch { .. }
            | Self::Invalid { .. }
            | Self::Unauthorized { .. } => ExecOutcome::NotRun,
            Self::Rejected { status, code, .. } | Self::Unavailable { status, code, .. }
                if refused(status) || code.refused_before_acting() =>
            {
                ExecOutcome::NotRun
            }
            Self::Rejected { .. }
            | Self::Unavailable { .. }
            | Self::Uncertain { .. }
            | Self::Malformed { .. }
            // Neither answers an exec; if one ever did, nothing would prove the code did not run.
            | Self::Integrity { .. }
            | Self::NotReady { .. } => ExecOutcome::Unknown,
        }
    }

    /// Whether briq gave no answer to the call (a 5xx or 429, no connection, a timeout, a
    /// malformed answer), or it was held back because briq gives none now: an outage, not a
    /// refusal.
    pub fn unanswered(&self) -> bool {
        matches!(
            self,
            Self::Unavailable { .. }
                | Self::Unreachable { .. }
                | Self::Uncertain { .. }
                | Self::Malformed { .. }
                | Self::HeldBack { .. }
        )
    }

    /// briq's id for the failed request, worth logging: it is not secret.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Self::NotFound { request_id, .. }
            | Self::Unauthorized { request_id, .. }
            | Self::Rejected { request_id, .. }
            | Self::Unavailable { request_id, .. }
            | Self::Uncertain { request_id, .. }
            | Self::Malformed { request_id, .. }
            | Self::Integrity { request_id, .. } => request_id.as_deref(),
            Self::Unreachable { .. }
            | Self::NotReady { .. }
            | Self::Build { .. }
            | Self::HeldBack { .. }
            | Self::InterfaceMismatch { .. }
            | Self::Invalid { .. } => None,
        }
    }

    /// The pause briq asked for before trying again.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Unavailable { retry_after, .. } => *retry_after,
            Self::HeldBack { wait } => Some(*wait),
            _ => None,
        }
    }

    /// Turns a non-success HTTP answer into an error. The status decides the class; the body
    /// only adds detail (a JSON-RPC error's message, else the text), since proxies in front of
    /// briq answer 502s and 503s with HTML. A body that echoes the request (some proxies do)
    /// would echo the key, so it is scrubbed. A 404 is the endpoint's, never a sandbox's: a
    /// sandbox that is not found is a tool error.
    pub(crate) fn from_answer(
        status: StatusCode,
        body: &[u8],
        retry_after: Option<Duration>,
        request_id: Option<String>,
        key: &ApiKey,
    ) -> Self {
        let json_rpc = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("error").cloned());
        // briq's own code (assumed in the JSON-RPC error's `data`), else the JSON-RPC code.
        let briq_code = json_rpc
            .as_ref()
            .and_then(|e| e.get("data"))
            .and_then(|data| data.get("code"))
            .and_then(|code| serde_json::from_value(code.clone()).ok());
        let code = briq_code.unwrap_or_else(|| {
            json_rpc.as_ref().and_then(|e| e.get("code")).map_or(
                ErrorCode::Other,
                |code| match code.as_i64() {
                    Some(number) => ErrorCode::of_json_rpc(number),
                    None => serde_json::from_value(code.clone()).unwrap_or(ErrorCode::Other),
                },
            )
        });
        let message = json_rpc
            .as_ref()
            .and_then(|e| e.get("message"))
            .and_then(|m| m.as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| {
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                if text.is_empty() {
                    status.canonical_reason().unwrap_or("no message").to_owned()
                } else {
                    text.to_owned()
                }
            });
        // Scrubbed before it is cut: a cut through the key would leave a piece no scrub finds.
        let message = remote_text(&message, key);
        let request_id = request_id.map(|id| remote_text(&id, key));
        let status_code = status.as_u16();
        if code.is_account_refusal() {
            return Self::Rejected {
                status: status_code,
                code,
                message,
                request_id,
            };
        }
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Self::Unauthorized {
                status: status_code,
                message,
                request_id,
            },
            s if s == StatusCode::TOO_MANY_REQUESTS || s.is_server_error() => Self::Unavailable {
                status: status_code,
                code,
                message,
                retry_after,
                request_id,
            },
            _ => Self::Rejected {
                status: status_code,
                code,
                message,
                request_id,
            },
        }
    }

    /// A JSON-RPC error answered with HTTP 200: the standard refusals (parse error, invalid
    /// request, unknown method, invalid params) were made before acting; anything else is the
    /// server's own failure, as a 500 would be.
    pub(crate) fn from_json_rpc(
        code: i64,
        message: &str,
        request_id: Option<String>,
        key: &ApiKey,
    ) -> Self {
        let message = format!("JSON-RPC error {code}: {}", remote_text(message, key));
        let request_id = request_id.map(|id| remote_text(&id, key));
        match ErrorCode::of_json_rpc(code) {
            ErrorCode::InvalidParams => Self::Rejected {
                status: 200,
                code: ErrorCode::InvalidParams,
                message,
                request_id,
            },
            code => Self::Unavailable {
                status: 200,
                code,
                message,
                retry_after: None,
                request_id,
            },
        }
    }

    /// A tool's error answer (`isError`), its text read as briq's error body (assumed shape,
    /// [`ToolErrorBody`]); any other text is the message of a refusal whose code is unknown.
    pub(crate) fn from_tool_error(text: &str, request_id: Option<String>, key: &ApiKey) -> Self {
        let (code, message) = match serde_json::from_str::<ToolErrorBody>(text) {
            Ok(body) => (body.error.code, body.error.message),
            Err(_) => (ErrorCode::Other, text.to_owned()),
        };
        let message = remote_text(&message, key);
        let request_id = request_id.map(|id| remote_text(&id, key));
        match code {
            ErrorCode::NotFound => Self::NotFound {
                message,
                request_id,
            },
            ErrorCode::Unauthorized | ErrorCode::Forbidden => Self::Unauthorized {
                status: 200,
                message,
                request_id,
            },
            ErrorCode::RateLimited | ErrorCode::Unavailable | ErrorCode::Internal => {
                Self::Unavailable {
                    status: 200,
                    code,
                    message,
                    retry_after: None,
                    request_id,
                }
            }
            code => Self::Rejected {
                status: 200,
                code,
                message,
                request_id,
            },
        }
    }

    /// The same error with every piece of text that came from the network scrubbed of `key`,
    /// then cut to `MAX_REMOTE_CHARS`.
    pub fn redacted(self, key: &ApiKey) -> Self {
        self.with_remote_text(|text| remote_text(&text, key))
    }

    /// The same error without any text that came from the network (status, class and what
    /// this client knows stay): for a request that carried secrets other than the key, which
    /// a gateway's page might echo where no scrubbing can find every piece of them.
    pub fn without_remote_text(self) -> Self {
        self.with_remote_text(|_| REMOTE_TEXT_NOT_KEPT.to_owned())
    }

    /// The same error with `text` applied to every piece of text that came from the network.
    fn with_remote_text(self, text: impl Fn(String) -> String) -> Self {
        let id = |id: Option<String>| id.map(&text);
        match self {
            Self::NotFound {
                message,
                request_id,
            } => Self::NotFound {
                message: text(message),
                request_id: id(request_id),
            },
            Self::Unauthorized {
                status,
                message,
                request_id,
            } => Self::Unauthorized {
                status,
                message: text(message),
                request_id: id(request_id),
            },
            Self::Rejected {
                status,
                code,
                message,
                request_id,
            } => Self::Rejected {
                status,
                code,
                message: text(message),
                request_id: id(request_id),
            },
            Self::Unavailable {
                status,
                code,
                message,
                retry_after,
                request_id,
            } => Self::Unavailable {
                status,
                code,
                message: text(message),
                retry_after,
                request_id: id(request_id),
            },
            Self::Uncertain { source, request_id } => Self::Uncertain {
                source,
                request_id: id(request_id),
            },
            Self::Malformed { detail, request_id } => Self::Malformed {
                detail: text(detail),
                request_id: id(request_id),
            },
            Self::Integrity {
                path,
                expected,
                answered,
                request_id,
            } => Self::Integrity {
                path,
                expected,
                answered: text(answered),
                request_id: id(request_id),
            },
            Self::NotReady {
                id: sandbox,
                state,
                waited,
            } => Self::NotReady {
                id: text(sandbox),
                state,
                waited,
            },
            // Built here, never from an answer: a transport error names the URL, not the key.
            error @ (Self::Unreachable { .. }
            | Self::Build { .. }
            | Self::HeldBack { .. }
            | Self::InterfaceMismatch { .. }
            | Self::Invalid { .. }) => error,
        }
    }

    /// Classifies a transport failure by whether the request can have reached briq.
    pub(crate) fn from_transport(source: reqwest::Error, request_id: Option<String>) -> Self {
        if source.is_builder() {
            Self::Build { source }
        } else if source.is_connect() {
            Self::Unreachable { source }
        } else {
            Self::Uncertain { source, request_id }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::briq::key::leaked_pieces;

    #[test]
    fn an_error_of_a_request_that_carried_secrets_keeps_no_remote_text() {
        let page = "<html>502 Bad Gateway: {\"stdin\": \"{\\\"TOKEN\\\": \\\"tok-9f8e7d6c5b4a\\\"}\"}</html>";
        let error = Error::from_answer(
            StatusCode::BAD_GATEWAY,
            page.as_bytes(),
            None,
            Some("req-tok-9f8e7d6c5b4a".into()),
            &key(),
        );
        let class = error.class();
        let kept = error.without_remote_text();
        assert_eq!(kept.class(), class, "what the error means is kept");
        let text = kept.to_string();
        assert_eq!(
            leaked_pieces("tok-9f8e7d6c5b4a", &text),
            Vec::<String>::new(),
            "{text}"
        );
        assert!(text.contains(REMOTE_TEXT_NOT_KEPT), "{text}");
        assert!(text.contains("502"), "{text}");
    }

    fn key() -> ApiKey {
        ApiKey::new("k3y-s3cret").unwrap()
    }

    fn class_of(status: u16, body: &str) -> ErrorClass {
        Error::from_answer(
            StatusCode::from_u16(status).unwrap(),
            body.as_bytes(),
            None,
            None,
            &key(),
        )
        .class()
    }

    #[test]
    fn statuses_classify() {
        // The MCP endpoint's 404, never a sandbox's: that is a tool error.
        assert_eq!(class_of(404, ""), ErrorClass::Terminal);
        assert_eq!(class_of(401, ""), ErrorClass::Terminal);
        assert_eq!(class_of(403, ""), ErrorClass::Terminal);
        assert_eq!(class_of(400, ""), ErrorClass::Terminal);
        assert_eq!(class_of(422, ""), ErrorClass::Terminal);
        assert_eq!(class_of(429, ""), ErrorClass::Retryable);
        assert_eq!(class_of(500, ""), ErrorClass::Retryable);
        assert_eq!(
            class_of(502, "<html>bad gateway</html>"),
            ErrorClass::Retryable
        );
    }

    /// A transport error to wrap: which variant holds it is all the classification looks at.
    fn reqwest_error() -> reqwest::Error {
        reqwest::Client::new()
            .get("http://[::1")
            .build()
            .unwrap_err()
    }

    #[test]
    fn failed_execs_classify_by_what_the_sandbox_may_have_done() {
        use ExecOutcome::{NotRun, Unknown};
        let quota = r#"{"error":{"code":"quota_exceeded","message":"max"}}"#;
        let statuses: [(u16, &str, ExecOutcome); 23] = [
            (400, "", NotRun),
            (401, "", NotRun),
            (403, "", NotRun),
            (404, "", NotRun),
            (409, "", NotRun),
            (422, "", NotRun),
            (429, "", NotRun),
            (429, quota, NotRun),
            // Not known to be refused before acting: 402 is a plan refusal on paper, but nothing
            // in briq's description proves the command never started.
            (402, quota, Unknown),
            (405, "", Unknown),
            (408, "", Unknown),
            (410, "", Unknown),
            (413, "", Unknown),
            (499, "", Unknown),
            (500, "", Unknown),
            (501, "", Unknown),
            (502, "<html>bad gateway</html>", Unknown),
            (503, "", Unknown),
            (503, quota, Unknown),
            (504, "", Unknown),
            (520, "", Unknown),
            (599, "", Unknown),
            // A success status never becomes an error; a redirect is not followed.
            (302, "", Unknown),
        ];
        for (status, body, expected) in statuses {
            let error = Error::from_answer(
                StatusCode::from_u16(status).unwrap(),
                body.as_bytes(),
                None,
                None,
                &key(),
            );
            assert_eq!(
                error.exec_outcome(),
                expected,
                "HTTP {status} {body}: {error:?}"
            );
        }
        let others = [
            (
                Error::Unreachable {
                    source: reqwest_error(),
                },
                NotRun,
            ),
            (
                Error::Build {
                    source: reqwest_error(),
                },
                NotRun,
            ),
            (
                Error::Uncertain {
                    source: reqwest_error(),
                    request_id: None,
                },
                Unknown,
            ),
            (
                Error::Malformed {
                    detail: "not JSON".into(),
                    request_id: None,
                },
                Unknown,
            ),
            (
                Error::Integrity {
                    path: "/work/x".into(),
                    expected: "ab".into(),
                    answered: "cd".into(),
                    request_id: None,
                },
                Unknown,
            ),
            (
                Error::NotReady {
                    id: "bq_1".into(),
                    state: SandboxState::Creating,
                    waited: Duration::from_secs(1),
                },
                Unknown,
            ),
        ];
        for (error, expected) in others {
            assert_eq!(error.exec_outcome(), expected, "{error:?}");
        }
    }

    #[test]
    fn tool_and_json_rpc_errors_classify_by_their_code() {
        use ExecOutcome::{NotRun, Unknown};
        let tool = |code: &str| {
            Error::from_tool_error(
                &format!(r#"{{"error":{{"code":"{code}","message":"m"}}}}"#),
                None,
                &key(),
            )
        };
        let cases = [
            (tool("not_found"), ErrorClass::NotFound, NotRun),
            (tool("unauthorized"), ErrorClass::Terminal, NotRun),
            (tool("invalid_request"), ErrorClass::Terminal, NotRun),
            (tool("rate_limited"), ErrorClass::Retryable, NotRun),
            (tool("quota_exceeded"), ErrorClass::Terminal, Unknown),
            (tool("unavailable"), ErrorClass::Retryable, Unknown),
            (tool("internal"), ErrorClass::Retryable, Unknown),
            (tool("brand_new"), ErrorClass::Terminal, Unknown),
            (
                Error::from_tool_error("plain text, not briq's JSON", None, &key()),
                ErrorClass::Terminal,
                Unknown,
            ),
            (
                Error::from_json_rpc(-32602, "unknown argument cwd", None, &key()),
                ErrorClass::Terminal,
                NotRun,
            ),
            (
                Error::from_json_rpc(-32601, "no such method", None, &key()),
                ErrorClass::Terminal,
                NotRun,
            ),
            (
                Error::from_json_rpc(-32603, "internal", None, &key()),
                ErrorClass::Retryable,
                Unknown,
            ),
        ];
        for (error, class, outcome) in cases {
            assert_eq!(
                (error.class(), error.exec_outcome()),
                (class, outcome),
                "{error:?}"
            );
        }
        let text = Error::from_json_rpc(-32602, "k3y-s3cret echoed", None, &key()).to_string();
        assert!(!text.contains("k3y-s3cret"), "{text}");
        assert!(text.contains("-32602"), "{text}");
    }

    #[test]
    fn a_json_rpc_error_body_of_a_failed_answer_gives_its_message_and_briqs_code() {
        let refused = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"no credit","data":{"code":"payment_required"}}}"#;
        let error = Error::from_answer(StatusCode::PAYMENT_REQUIRED, refused, None, None, &key());
        assert!(
            matches!(
                error,
                Error::Rejected {
                    code: ErrorCode::PaymentRequired,
                    ..
                }
            ),
            "{error:?}"
        );
        let body = br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"overloaded"}}"#;
        let error = Error::from_answer(StatusCode::SERVICE_UNAVAILABLE, body, None, None, &key());
        assert_eq!(error.class(), ErrorClass::Retryable);
        assert!(error.to_string().contains("overloaded"), "{error}");
    }

    #[test]
    fn idempotent_calls_keep_retrying_server_errors() {
        // The exec classification does not change what a GET may do after a 503.
        for status in [429, 500, 502, 503, 504] {
            assert_eq!(class_of(status, ""), ErrorClass::Retryable, "HTTP {status}");
        }
    }

    #[test]
    fn account_refusals_are_terminal_whatever_the_status() {
        let body = r#"{"error":{"code":"quota_exceeded","message":"10 sandboxes max"}}"#;
        assert_eq!(class_of(429, body), ErrorClass::Terminal);
        let error = Error::from_answer(
            StatusCode::PAYMENT_REQUIRED,
            body.as_bytes(),
            None,
            None,
            &key(),
        );
        assert!(error.to_string().contains("10 sandboxes max"));
    }

    #[test]
    fn unauthorized_points_at_the_secret_and_carries_the_request_id() {
        let error = Error::from_answer(
            StatusCode::UNAUTHORIZED,
            br#"{"error":{"code":"unauthorized","message":"bad key"}}"#,
            None,
            Some("req_1".into()),
            &key(),
        );
        let text = error.to_string();
        assert!(text.contains("check the API key Secret"), "{text}");
        assert!(text.contains("req_1"), "{text}");
        assert_eq!(error.request_id(), Some("req_1"));
    }

    #[test]
    fn echoed_keys_are_scrubbed() {
        let error = Error::from_answer(
            StatusCode::BAD_GATEWAY,
            b"upstream said: Authorization: Bearer k3y-s3cret",
            None,
            None,
            &key(),
        );
        assert!(!format!("{error} {error:?}").contains("k3y-s3cret"));
    }

    #[test]
    fn a_key_echoed_across_the_length_limit_leaves_no_piece_behind() {
        let secret = "sk-live-0123456789abcdefghij";
        let key = ApiKey::new(secret).unwrap();
        for offset in 0..=MAX_REMOTE_CHARS + 1 {
            let page = format!("{}{secret}</p>{secret}", "-".repeat(offset));
            for status in [StatusCode::BAD_GATEWAY, StatusCode::FORBIDDEN] {
                let error = Error::from_answer(
                    status,
                    page.as_bytes(),
                    None,
                    Some(format!("req-{secret}")),
                    &key,
                );
                let shown = format!("{error} {error:?}");
                assert_eq!(
                    leaked_pieces(secret, &shown),
                    Vec::<String>::new(),
                    "offset {offset}"
                );
            }
        }
        let json = format!(
            r#"{{"error":{{"code":"invalid_request","message":"{secret} {}"}}}}"#,
            "x".repeat(500)
        );
        let error = Error::from_answer(StatusCode::BAD_REQUEST, json.as_bytes(), None, None, &key);
        let shown = error.to_string();
        assert!(leaked_pieces(secret, &shown).is_empty(), "{shown}");
        assert!(
            shown.chars().count() < MAX_REMOTE_CHARS + 100,
            "JSON messages are cut too"
        );
    }

    #[test]
    fn every_remote_field_leaves_the_client_scrubbed() {
        let secret = "sk-live-0123456789abcdefghij";
        let key = ApiKey::new(secret).unwrap();
        let echoed = || format!("echo {secret}");
        let errors = [
            Error::Malformed {
                detail: echoed(),
                request_id: Some(echoed()),
            },
            Error::NotFound {
                message: echoed(),
                request_id: Some(echoed()),
            },
            Error::Integrity {
                path: "/work/x".into(),
                expected: "ab".into(),
                answered: echoed(),
                request_id: None,
            },
            Error::NotReady {
                id: echoed(),
                state: SandboxState::Creating,
                waited: Duration::from_secs(1),
            },
        ];
        for error in errors {
            let shown = format!("{:?}", error.redacted(&key));
            assert!(leaked_pieces(secret, &shown).is_empty(), "{shown}");
        }
    }
}
