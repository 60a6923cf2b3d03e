//! The HTTP client for briq.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{Method, RequestBuilder};
use serde::de::DeserializeOwned;
use sha2::{Digest as _, Sha256};
use tokio::time::Instant;
use url::Url;

use super::health::Health;

use super::api::{
    self, CreateSandbox, ExecBody, ExecOutput, ExecRequest, FileContent, FileQuery, ListQuery,
    PreviewAnswer, Sandbox, SandboxList, SandboxState, WriteFileAnswer, paths,
};
use super::error::{Error, ErrorClass};
use super::key::ApiKey;
use super::retry::idempotent;
use super::sandbox_api::{DestroyOutcome, SandboxApi};
use crate::traces;

/// Pauses between readiness polls after create: doubling from the first to the longest.
const FIRST_POLL: Duration = Duration::from_millis(100);
const LONGEST_POLL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub base_url: Url,
    /// Per request. An exec gets its command timeout on top of this.
    pub request_timeout: Duration,
    /// Larger answers fail as [`Error::Malformed`] instead of filling memory.
    pub max_response_bytes: usize,
    /// How long `create_sandbox` waits for the new sandbox to run.
    pub ready_timeout: Duration,
    /// Whether an `http://` base URL is acceptable: it sends the key in clear text, so only a
    /// local briq-compatible server should ever be reached that way.
    pub allow_plain_http: bool,
}

impl ClientOptions {
    pub fn new(base_url: Url) -> Self {
        Self {
            base_url,
            request_timeout: Duration::from_secs(30),
            // A 1 MiB file travels as 1.4 MiB of base64; leave room for the JSON around it.
            max_response_bytes: 4 * 1024 * 1024,
            ready_timeout: Duration::from_secs(120),
            allow_plain_http: false,
        }
    }

    /// Options for a local briq-compatible server, which speaks plain HTTP on loopback.
    pub fn local(base_url: Url) -> Self {
        Self {
            allow_plain_http: true,
            ..Self::new(base_url)
        }
    }
}

/// Why a [`BriqClient`] cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum NewClientError {
    #[error("briq base URL {url} is not an http(s) URL")]
    BaseUrl { url: String },
    #[error(
        "briq base URL {url} is plain http, which would send the API key in clear text \
         (allow it only for a local server: --allow-plain-http)"
    )]
    PlainHttp { url: String },
    #[error("cannot build the briq HTTP client")]
    Http(#[from] reqwest::Error),
}

/// The briq API over HTTPS. Cheap to clone: clones share one connection pool.
#[derive(Debug, Clone)]
pub struct BriqClient {
    http: reqwest::Client,
    options: Arc<ClientOptions>,
    /// briq's health per key, shared by every clone: calls back off together.
    health: Arc<Health>,
}

/// A success answer, read within the size bound.
struct Answer {
    body: Bytes,
    request_id: Option<String>,
}

impl Answer {
    fn decode<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.body).map_err(|e| Error::Malformed {
            detail: e.to_string(),
            request_id: self.request_id.clone(),
        })
    }
}

impl BriqClient {
    pub fn new(options: ClientOptions) -> Result<Self, NewClientError> {
        if !matches!(options.base_url.scheme(), "http" | "https")
            || options.base_url.cannot_be_a_base()
        {
            return Err(NewClientError::BaseUrl {
                url: options.base_url.to_string(),
            });
        }
        if options.base_url.scheme() == "http" && !options.allow_plain_http {
            return Err(NewClientError::PlainHttp {
                url: options.base_url.to_string(),
            });
        }
        // A redirect would carry the bearer key to wherever briq (or a proxy) points.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(options.request_timeout)
            .connect_timeout(options.request_timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("briq-operator/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            http,
            options: Arc::new(options),
            health: Arc::default(),
        })
    }

    /// Fills a [`paths`] template; values are percent-encoded as path segments.
    fn endpoint(&self, template: &str, values: &[&str]) -> Url {
        let mut url = self.options.base_url.clone();
        let mut values = values.iter();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty();
            for segment in template.split('/').filter(|s| !s.is_empty()) {
                if segment.starts_with('{') {
                    segments.push(values.next().copied().unwrap_or_default());
                } else {
                    segments.push(segment);
                }
            }
        }
        url
    }

    fn request(&self, method: Method, template: &str, values: &[&str]) -> RequestBuilder {
        self.http.request(method, self.endpoint(template, values))
    }

    /// Sends one request, unless briq's health for `key` holds calls back now; learns from the
    /// outcome.
    async fn call(&self, key: &ApiKey, request: RequestBuilder) -> Result<Answer, Error> {
        if let Err(wait) = self.health.admit(key) {
            return Err(Error::HeldBack { wait });
        }
        let outcome = self.send(key, request).await;
        self.health.heard(key, &outcome);
        outcome
    }

    async fn send(&self, key: &ApiKey, request: RequestBuilder) -> Result<Answer, Error> {
        let (http, request) = request.bearer_auth(key.expose()).build_split();
        let request = request.map_err(|e| Error::from_transport(e, None))?;
        let mut noted = traces::enabled().then(|| Noted {
            operation: format!(
                "{} {}",
                request.method(),
                route(self.options.base_url.path(), request.url().path())
            ),
            start: SystemTime::now(),
        });
        let response = match http.execute(request).await {
            Ok(response) => response,
            Err(e) => {
                if let Some(noted) = noted.take() {
                    noted.done(None, None, key);
                }
                return Err(Error::from_transport(e, None));
            }
        };
        let request_id = response
            .headers()
            .get(api::REQUEST_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let status = response.status();
        if let Some(noted) = noted {
            noted.done(Some(status.as_u16()), request_id.as_deref(), key);
        }
        let retry_after = retry_after(response.headers());
        let body = self.read_body(response, &request_id).await?;
        if status.is_success() {
            Ok(Answer { body, request_id })
        } else {
            Err(Error::from_answer(
                status,
                &body,
                retry_after,
                request_id,
                key,
            ))
        }
    }

    async fn read_body(
        &self,
        response: reqwest::Response,
        request_id: &Option<String>,
    ) -> Result<Bytes, Error> {
        let limit = self.options.max_response_bytes;
        match Limited::new(reqwest::Body::from(response), limit)
            .collect()
            .await
        {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(e) if e.is::<LengthLimitError>() => Err(Error::Malformed {
                detail: format!("answer larger than {limit} bytes"),
                request_id: request_id.clone(),
            }),
            Err(e) => match e.downcast::<reqwest::Error>() {
                Ok(source) => Err(Error::Uncertain {
                    source: *source,
                    request_id: request_id.clone(),
                }),
                Err(other) => Err(Error::Malformed {
                    detail: other.to_string(),
                    request_id: request_id.clone(),
                }),
            },
        }
    }

    async fn get_once(&self, key: &ApiKey, id: &str) -> Result<Sandbox, Error> {
        self.call(key, self.request(Method::GET, paths::SANDBOX, &[id]))
            .await?
            .decode()
    }

    /// Polls until the sandbox runs. Transient failures only cost time here: the sandbox exists.
    async fn wait_running(&self, key: &ApiKey, mut sandbox: Sandbox) -> Result<Sandbox, Error> {
        let started = Instant::now();
        let deadline = started + self.options.ready_timeout;
        // The first look is immediate: a fast briq (or the local server) is running already.
        let mut pause = Duration::ZERO;
        loop {
            match sandbox.state {
                SandboxState::Running => return Ok(sandbox),
                SandboxState::Destroying | SandboxState::Destroyed => break,
                _ if Instant::now() >= deadline => break,
                _ => {}
            }
            tokio::time::sleep_until(deadline.min(Instant::now() + pause)).await;
            pause = (pause * 2).clamp(FIRST_POLL, LONGEST_POLL);
            match self.get_once(key, &sandbox.id).await {
                Ok(latest) => sandbox = latest,
                Err(e) if matches!(e.class(), ErrorClass::Retryable | ErrorClass::Uncertain) => {
                    tracing::debug!(id = %sandbox.id, error = %e, "polling new sandbox");
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::NotReady {
            id: sandbox.id,
            state: sandbox.state,
            waited: started.elapsed(),
        })
    }
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

impl BriqClient {
    /// `GET /v1/sandboxes`, filtered by `name` when given; repeated on retryable errors.
    async fn list(&self, key: &ApiKey, name: Option<&str>) -> Result<Vec<Sandbox>, Error> {
        let query = ListQuery {
            name: name.map(str::to_owned),
        };
        let list: SandboxList = idempotent("list", || async {
            self.call(
                key,
                self.request(Method::GET, paths::SANDBOXES, &[])
                    .query(&query),
            )
            .await?
            .decode()
        })
        .await?;
        Ok(list.sandboxes)
    }
}

/// A call being noted for the traces ([`traces::recording`]).
struct Noted {
    operation: String,
    start: SystemTime,
}

impl Noted {
    fn done(self, status: Option<u16>, request_id: Option<&str>, key: &ApiKey) {
        traces::note(traces::BriqCall {
            operation: self.operation,
            start: self.start,
            end: SystemTime::now(),
            request_id: request_id
                .filter(|id| traceable_request_id(id, key))
                .map(str::to_owned),
            status,
        });
    }
}

/// Whether briq's request id may go into a span: remote text, so only a short token of plain
/// characters, never one that carries the key.
fn traceable_request_id(id: &str, key: &ApiKey) -> bool {
    id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
        && !id.contains(key.expose())
}

/// The [`paths`] template `path` was made from (below the base URL's own path), so that spans
/// are named by route, not by sandbox.
fn route(base: &str, path: &str) -> String {
    let below = path
        .strip_prefix(base.trim_end_matches('/'))
        .unwrap_or(path);
    let segments: Vec<&str> = below.split('/').filter(|s| !s.is_empty()).collect();
    [
        paths::SANDBOXES,
        paths::SANDBOX,
        paths::EXEC,
        paths::FILES,
        paths::PREVIEW,
    ]
    .into_iter()
    .find(|template| {
        let parts: Vec<&str> = template.split('/').filter(|s| !s.is_empty()).collect();
        parts.len() == segments.len()
            && parts
                .iter()
                .zip(&segments)
                .all(|(part, segment)| part.starts_with('{') || part == segment)
    })
    .map_or_else(|| "other".to_owned(), str::to_owned)
}

/// Every error leaves the client through here: remote text (messages, details, request ids) is
/// scrubbed of the key, then cut.
fn redacted<T>(key: &ApiKey, result: Result<T, Error>) -> Result<T, Error> {
    result.map_err(|error| error.redacted(key))
}

fn sha256_hex(content: &[u8]) -> String {
    format!("{:x}", Sha256::digest(content))
}

impl SandboxApi for BriqClient {
    fn unreachable_keys(&self) -> usize {
        self.health.unreachable()
    }

    async fn create_sandbox(
        &self,
        key: &ApiKey,
        request: &CreateSandbox,
    ) -> Result<Sandbox, Error> {
        redacted(
            key,
            async {
                let created: Sandbox = self
                    .call(
                        key,
                        self.request(Method::POST, paths::SANDBOXES, &[])
                            .json(request),
                    )
                    .await?
                    .decode()?;
                self.wait_running(key, created).await
            }
            .await,
        )
    }

    async fn find_sandboxes_by_name(
        &self,
        key: &ApiKey,
        name: &str,
    ) -> Result<Vec<Sandbox>, Error> {
        redacted(
            key,
            async {
                let listed = self.list(key, Some(name)).await?;
                // The filter's exact semantics are assumed; only an exact match identifies our sandbox.
                Ok(listed.into_iter().filter(|s| s.name == name).collect())
            }
            .await,
        )
    }

    async fn list_sandboxes(&self, key: &ApiKey) -> Result<Vec<Sandbox>, Error> {
        redacted(key, async { self.list(key, None).await }.await)
    }

    async fn get_sandbox(&self, key: &ApiKey, id: &str) -> Result<Sandbox, Error> {
        redacted(
            key,
            async { idempotent("get", || self.get_once(key, id)).await }.await,
        )
    }

    async fn destroy_sandbox(&self, key: &ApiKey, id: &str) -> Result<DestroyOutcome, Error> {
        redacted(
            key,
            async {
                idempotent("destroy", || async {
                    match self
                        .call(key, self.request(Method::DELETE, paths::SANDBOX, &[id]))
                        .await
                    {
                        Ok(_) => Ok(DestroyOutcome::Destroyed),
                        Err(Error::NotFound { .. }) => Ok(DestroyOutcome::AlreadyGone),
                        Err(e) => Err(e),
                    }
                })
                .await
            }
            .await,
        )
    }

    async fn stop_sandbox(&self, key: &ApiKey, id: &str) -> Result<Sandbox, Error> {
        redacted(
            key,
            async {
                idempotent("stop", || async {
                    self.call(key, self.request(Method::POST, paths::STOP, &[id]))
                        .await?
                        .decode()
                })
                .await
            }
            .await,
        )
    }

    async fn start_sandbox(&self, key: &ApiKey, id: &str) -> Result<Sandbox, Error> {
        redacted(
            key,
            async {
                let started: Sandbox = idempotent("start", || async {
                    self.call(key, self.request(Method::POST, paths::START, &[id]))
                        .await?
                        .decode()
                })
                .await?;
                self.wait_running(key, started).await
            }
            .await,
        )
    }

    async fn exec(
        &self,
        key: &ApiKey,
        id: &str,
        request: &ExecRequest,
    ) -> Result<ExecOutput, Error> {
        redacted(
            key,
            async {
                let request = self
                    .request(Method::POST, paths::EXEC, &[id])
                    .timeout(request.timeout + self.options.request_timeout)
                    .json(&ExecBody::from(request));
                self.call(key, request).await?.decode()
            }
            .await,
        )
    }

    async fn write_file(
        &self,
        key: &ApiKey,
        id: &str,
        path: &str,
        content: &[u8],
    ) -> Result<(), Error> {
        redacted(
            key,
            async {
                let body = FileContent::new(path, content);
                let expected = sha256_hex(content);
                idempotent("write_file", || async {
                    let answer = self
                        .call(
                            key,
                            self.request(Method::PUT, paths::FILES, &[id]).json(&body),
                        )
                        .await?;
                    let stored: WriteFileAnswer = answer.decode()?;
                    if stored.sha256.eq_ignore_ascii_case(&expected) {
                        Ok(())
                    } else {
                        Err(Error::Integrity {
                            path: path.to_owned(),
                            expected: expected.clone(),
                            answered: stored.sha256,
                            request_id: answer.request_id,
                        })
                    }
                })
                .await
            }
            .await,
        )
    }

    async fn read_file(&self, key: &ApiKey, id: &str, path: &str) -> Result<Vec<u8>, Error> {
        redacted(
            key,
            async {
                let query = FileQuery {
                    path: path.to_owned(),
                };
                idempotent("read_file", || async {
                    let answer = self
                        .call(
                            key,
                            self.request(Method::GET, paths::FILES, &[id]).query(&query),
                        )
                        .await?;
                    let file: FileContent = answer.decode()?;
                    file.content().map_err(|e| Error::Malformed {
                        detail: format!("file content is not base64: {e}"),
                        request_id: answer.request_id,
                    })
                })
                .await
            }
            .await,
        )
    }

    async fn preview_url(&self, key: &ApiKey, id: &str, port: u16) -> Result<Url, Error> {
        redacted(
            key,
            async {
                let port = port.to_string();
                // A read like `get`, so as safe to repeat.
                idempotent("preview", || async {
                    let answer = self
                        .call(key, self.request(Method::GET, paths::PREVIEW, &[id, &port]))
                        .await?;
                    let preview: PreviewAnswer = answer.decode()?;
                    Url::parse(&preview.url).map_err(|e| Error::Malformed {
                        detail: format!("preview URL: {e}"),
                        request_id: answer.request_id,
                    })
                })
                .await
            }
            .await,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(base: &str) -> BriqClient {
        BriqClient::new(ClientOptions::new(Url::parse(base).unwrap())).unwrap()
    }

    #[test]
    fn endpoints_keep_a_base_path_and_encode_values() {
        let url =
            client("https://example.test/briq/").endpoint(paths::PREVIEW, &["bq_a/b", "8080"]);
        assert_eq!(
            url.as_str(),
            "https://example.test/briq/v1/sandboxes/bq_a%2Fb/preview/8080"
        );
    }

    #[test]
    fn a_traced_call_is_named_by_its_route_never_by_its_sandbox() {
        let cases = [
            ("/", "/v1/sandboxes", "/v1/sandboxes"),
            ("/", "/v1/sandboxes/bq_1", "/v1/sandboxes/{id}"),
            ("/", "/v1/sandboxes/bq_1/exec", "/v1/sandboxes/{id}/exec"),
            (
                "/briq/",
                "/briq/v1/sandboxes/bq_1/files",
                "/v1/sandboxes/{id}/files",
            ),
            (
                "/",
                "/v1/sandboxes/bq_1/preview/8080",
                "/v1/sandboxes/{id}/preview/{port}",
            ),
            ("/", "/v1/sandboxes/bq_1/exec/more", "other"),
            ("/", "/v2/sandboxes", "other"),
        ];
        for (base, path, expected) in cases {
            assert_eq!(route(base, path), expected, "{base} {path}");
        }
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

    #[test]
    fn only_http_base_urls() {
        let options = ClientOptions::new(Url::parse("mailto:x@example.test").unwrap());
        assert!(matches!(
            BriqClient::new(options),
            Err(NewClientError::BaseUrl { .. })
        ));
    }

    #[test]
    fn a_plain_http_url_is_refused_unless_allowed() {
        let url = Url::parse("http://briq.example.test").unwrap();
        assert!(matches!(
            BriqClient::new(ClientOptions::new(url.clone())),
            Err(NewClientError::PlainHttp { .. })
        ));
        assert!(BriqClient::new(ClientOptions::local(url)).is_ok());
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
    fn sha256_is_lowercase_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
