//! The briq client: [`SandboxApi`] over briq's MCP tools ([`super::mcp`], [`super::api`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tokio::time::Instant;
use url::Url;

use super::api::{
    AsyncExecArgs, BriqArgs, BriqList, CreateSandbox, DEFAULT_WAIT_MS, ExecAnswer, ExecArgs,
    ExecOutput, ExecRequest, ExecResult, ExecResultArgs, ExecStarted, ExecStopArgs, FilesGetAnswer,
    FilesGetArgs, FilesPutAnswer, FilesPutArgs, ForkArgs, ListArgs, MAX_EXEC_TIMEOUT, RunArgs,
    Sandbox, SandboxState, decode_base64, tools,
};
use super::conformance::{self, Mismatch};
use super::error::{Error, ErrorClass};
use super::health::Health;
use super::key::ApiKey;
use super::mcp::{Endpoint, image_bytes};
use super::retry::idempotent;
use super::sandbox_api::{DestroyOutcome, SandboxApi};

/// Pauses between readiness polls after create: doubling from the first to the longest.
const FIRST_POLL: Duration = Duration::from_millis(100);
const LONGEST_POLL: Duration = Duration::from_secs(1);
/// How long a key whose server's interface did not match is refused before it is checked again:
/// a fixed server is picked up without a restart, and a broken one costs one `tools/list` a
/// minute.
const RECHECK_MISMATCH: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// briq's MCP endpoint.
    pub base_url: Url,
    /// Per request. An exec gets its command timeout on top of this.
    pub request_timeout: Duration,
    /// Larger answers fail as [`Error::Malformed`] instead of filling memory.
    pub max_response_bytes: usize,
    /// How long `create_sandbox` waits for the new sandbox to run.
    pub ready_timeout: Duration,
    /// Whether an `http://` URL is acceptable: it sends the key in clear text, so only a local
    /// briq-compatible server should ever be reached that way.
    pub allow_plain_http: bool,
}

impl ClientOptions {
    pub fn new(base_url: Url) -> Self {
        Self {
            base_url,
            request_timeout: Duration::from_secs(30),
            // A 1 MiB file travels as 1.4 MiB of base64, twice (text and structured content);
            // leave room for the JSON around it.
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
    #[error("briq URL {url} is not an http(s) URL")]
    BaseUrl { url: String },
    #[error(
        "briq URL {url} is plain http, which would send the API key in clear text \
         (allow it only for a local server: --allow-plain-http)"
    )]
    PlainHttp { url: String },
    #[error("cannot build the briq HTTP client")]
    Http(#[from] reqwest::Error),
}

/// What the conformance check found for one key.
#[derive(Debug, Clone)]
enum Verdict {
    Conforms,
    Mismatched {
        mismatches: Vec<Mismatch>,
        checked: Instant,
    },
}

/// briq over its MCP tools. Cheap to clone: clones share one connection pool, the sessions,
/// briq's health and the conformance verdicts.
#[derive(Debug, Clone)]
pub struct BriqClient {
    endpoint: Arc<Endpoint>,
    options: Arc<ClientOptions>,
    /// briq's health per key, shared by every clone: calls back off together.
    health: Arc<Health>,
    verdicts: Arc<Mutex<HashMap<u64, Verdict>>>,
    /// One check at a time per key: the executors reconciled at start share the first one.
    checking: Arc<Mutex<HashMap<u64, Arc<tokio::sync::Mutex<()>>>>>,
}

impl BriqClient {
    pub fn new(mut options: ClientOptions) -> Result<Self, NewClientError> {
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
        // The previous release took briq's base URL; its MCP endpoint is `/mcp` below it.
        if options.base_url.path() == "/" {
            options.base_url.set_path("/mcp");
        }
        // A redirect would carry the bearer key to wherever briq (or a proxy) points.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(options.request_timeout)
            .connect_timeout(options.request_timeout.min(Duration::from_secs(10)))
            .tcp_nodelay(true)
            .user_agent(concat!("briq-operator/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            endpoint: Arc::new(Endpoint::new(
                http,
                options.base_url.clone(),
                options.max_response_bytes,
            )),
            options: Arc::new(options),
            health: Arc::default(),
            verdicts: Arc::default(),
            checking: Arc::default(),
        })
    }

    /// Checks the server's `tools/list` against what the operator sends with `key`, now,
    /// whatever was found before; the verdict is kept for the calls that follow.
    pub async fn check_conformance(&self, key: &ApiKey) -> Result<Vec<Mismatch>, Error> {
        let declared = redacted(
            key,
            self.endpoint
                .list_tools(key, self.options.request_timeout)
                .await,
        );
        self.health.heard(key, &declared);
        let mismatches = conformance::check_sent(&declared?);
        let verdict = if mismatches.is_empty() {
            Verdict::Conforms
        } else {
            for mismatch in &mismatches {
                tracing::error!(
                    tool = mismatch.tool(),
                    %mismatch,
                    "briq's MCP interface differs from what the operator sends (BriqInterfaceMismatch)"
                );
            }
            Verdict::Mismatched {
                mismatches: mismatches.clone(),
                checked: Instant::now(),
            }
        };
        self.verdicts().insert(key.fingerprint(), verdict);
        Ok(mismatches)
    }

    fn verdicts(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Verdict>> {
        self.verdicts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many keys the server's interface does not match now.
    pub fn mismatched_keys(&self) -> usize {
        self.verdicts()
            .values()
            .filter(|v| matches!(v, Verdict::Mismatched { .. }))
            .count()
    }

    /// Whether calls with `key` may go out: checked at the key's first use, and again a while
    /// after a mismatch; calls that find no verdict wait for the one check under way.
    pub(crate) async fn conforms(&self, key: &ApiKey) -> Result<(), Error> {
        if let Some(verdict) = self.current_verdict(key) {
            return verdict;
        }
        let lock = Arc::clone(
            self.checking
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(key.fingerprint())
                .or_default(),
        );
        let _checking = lock.lock().await;
        if let Some(verdict) = self.current_verdict(key) {
            return verdict;
        }
        match self.check_conformance(key).await? {
            mismatches if mismatches.is_empty() => Ok(()),
            mismatches => Err(Error::InterfaceMismatch { mismatches }),
        }
    }

    /// The key's verdict while it holds: a match for good, a mismatch for a minute.
    fn current_verdict(&self, key: &ApiKey) -> Option<Result<(), Error>> {
        let known = self.verdicts().get(&key.fingerprint()).cloned();
        match known {
            Some(Verdict::Conforms) => Some(Ok(())),
            Some(Verdict::Mismatched {
                mismatches,
                checked,
            }) if checked.elapsed() < RECHECK_MISMATCH => {
                Some(Err(Error::InterfaceMismatch { mismatches }))
            }
            _ => None,
        }
    }

    /// Calls one tool, unless briq's health holds calls back now or the key's interface does
    /// not match (checked first at the key's first use); learns from the outcome. Every error leaves scrubbed of the key.
    async fn call(
        &self,
        key: &ApiKey,
        tool: &'static str,
        arguments: &impl serde::Serialize,
        timeout: Duration,
    ) -> Result<super::mcp::ToolAnswer, Error> {
        if let Err(wait) = self.health.admit(key) {
            return Err(Error::HeldBack { wait });
        }
        self.conforms(key).await?;
        let outcome = self.endpoint.call_tool(key, tool, arguments, timeout).await;
        self.health.heard(key, &outcome);
        redacted(key, outcome)
    }

    async fn briq_call(
        &self,
        key: &ApiKey,
        tool: &'static str,
        id: &str,
    ) -> Result<Sandbox, Error> {
        self.call(
            key,
            tool,
            &BriqArgs {
                briq: id.to_owned(),
            },
            self.options.request_timeout,
        )
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
            match self.briq_call(key, tools::STATUS, &sandbox.id).await {
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

    /// `briq_list`, repeated on retryable errors.
    async fn list(&self, key: &ApiKey) -> Result<Vec<Sandbox>, Error> {
        let list: BriqList = idempotent("list", || async {
            self.call(
                key,
                tools::LIST,
                &ListArgs::default(),
                self.options.request_timeout,
            )
            .await?
            .decode()
        })
        .await?;
        Ok(list.briqs)
    }
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

    fn mismatched_keys(&self) -> usize {
        BriqClient::mismatched_keys(self)
    }

    async fn create_sandbox(
        &self,
        key: &ApiKey,
        request: &CreateSandbox,
    ) -> Result<Sandbox, Error> {
        let arguments = RunArgs {
            create: request.clone(),
            wait: true,
        };
        // `wait` blocks until the briq runs, up to two minutes (published).
        let timeout = self.options.ready_timeout + self.options.request_timeout;
        let created: Sandbox = self
            .call(key, tools::RUN, &arguments, timeout)
            .await?
            .decode()?;
        self.wait_running(key, created).await
    }

    async fn fork_sandbox(
        &self,
        key: &ApiKey,
        source: &str,
        name: &str,
        sleep: &str,
    ) -> Result<Sandbox, Error> {
        let arguments = ForkArgs {
            briq: source.to_owned(),
            name: name.to_owned(),
            sleep: sleep.to_owned(),
            wait: true,
        };
        // `wait` blocks until the fork is ready, as `briq_run`'s does.
        let timeout = self.options.ready_timeout + self.options.request_timeout;
        let forked: Sandbox = self
            .call(key, tools::FORK, &arguments, timeout)
            .await?
            .decode()?;
        self.wait_running(key, forked).await
    }

    async fn find_sandboxes_by_name(
        &self,
        key: &ApiKey,
        name: &str,
    ) -> Result<Vec<Sandbox>, Error> {
        // briq_list has no name filter (published): only an exact match identifies ours.
        let listed = self.list(key).await?;
        Ok(listed.into_iter().filter(|s| s.name == name).collect())
    }

    async fn list_sandboxes(&self, key: &ApiKey) -> Result<Vec<Sandbox>, Error> {
        self.list(key).await
    }

    async fn get_sandbox(&self, key: &ApiKey, id: &str) -> Result<Sandbox, Error> {
        idempotent("get", || self.briq_call(key, tools::STATUS, id)).await
    }

    async fn destroy_sandbox(&self, key: &ApiKey, id: &str) -> Result<DestroyOutcome, Error> {
        idempotent("destroy", || async {
            let arguments = BriqArgs {
                briq: id.to_owned(),
            };
            match self
                .call(
                    key,
                    tools::DESTROY,
                    &arguments,
                    self.options.request_timeout,
                )
                .await
            {
                Ok(_) => Ok(DestroyOutcome::Destroyed),
                Err(Error::NotFound { .. }) => Ok(DestroyOutcome::AlreadyGone),
                Err(e) => Err(e),
            }
        })
        .await
    }

    async fn stop_sandbox(&self, key: &ApiKey, id: &str) -> Result<Sandbox, Error> {
        idempotent("stop", || self.briq_call(key, tools::STOP, id)).await
    }

    async fn start_sandbox(&self, key: &ApiKey, id: &str) -> Result<Sandbox, Error> {
        let started = idempotent("start", || self.briq_call(key, tools::START, id)).await?;
        self.wait_running(key, started).await
    }

    async fn exec(
        &self,
        key: &ApiKey,
        id: &str,
        request: &ExecRequest,
    ) -> Result<ExecOutput, Error> {
        if request.timeout.is_zero() || request.timeout > MAX_EXEC_TIMEOUT {
            return Err(Error::Invalid {
                detail: format!(
                    "a synchronous exec lasts 1 to {} s, not {:?}",
                    MAX_EXEC_TIMEOUT.as_secs(),
                    request.timeout
                ),
            });
        }
        if let Some(cwd) = &request.cwd
            && (!cwd.starts_with('/') || cwd.split('/').any(|part| matches!(part, "." | "..")))
        {
            return Err(Error::Invalid {
                detail: format!("the working directory {cwd:?} is not an absolute plain path"),
            });
        }
        let arguments = ExecArgs::from_request(id, request);
        let timeout = request.timeout + self.options.request_timeout;
        let answer: ExecAnswer = self
            .call(key, tools::EXEC, &arguments, timeout)
            .await?
            .decode()?;
        Ok(answer.into())
    }

    async fn exec_async(
        &self,
        key: &ApiKey,
        id: &str,
        request: &ExecRequest,
    ) -> Result<String, Error> {
        let arguments = AsyncExecArgs {
            exec: ExecArgs::from_request(id, request),
            started_async: true,
        };
        let started: ExecStarted = self
            .call(key, tools::EXEC, &arguments, self.options.request_timeout)
            .await?
            .decode()?;
        Ok(started.exec)
    }

    async fn exec_result(
        &self,
        key: &ApiKey,
        arguments: &ExecResultArgs,
    ) -> Result<ExecResult, Error> {
        let waits = Duration::from_millis(arguments.wait_ms.unwrap_or(DEFAULT_WAIT_MS));
        let timeout = waits + self.options.request_timeout;
        idempotent("exec_result", || async {
            self.call(key, tools::EXEC_RESULT, arguments, timeout)
                .await?
                .decode()
        })
        .await
    }

    async fn exec_stop(&self, key: &ApiKey, id: &str, exec: &str) -> Result<ExecResult, Error> {
        let arguments = ExecStopArgs {
            briq: id.to_owned(),
            exec: exec.to_owned(),
        };
        idempotent("exec_stop", || async {
            self.call(
                key,
                tools::EXEC_STOP,
                &arguments,
                self.options.request_timeout,
            )
            .await?
            .decode()
        })
        .await
    }

    async fn write_file(
        &self,
        key: &ApiKey,
        id: &str,
        path: &str,
        content: &[u8],
    ) -> Result<(), Error> {
        let arguments = FilesPutArgs::new(id, path, content);
        let expected = sha256_hex(content);
        idempotent("write_file", || async {
            let answer = self
                .call(
                    key,
                    tools::FILES_PUT,
                    &arguments,
                    self.options.request_timeout,
                )
                .await?;
            let stored: FilesPutAnswer = answer.decode()?;
            if stored.sha256.eq_ignore_ascii_case(&expected) {
                Ok(())
            } else {
                Err(Error::Integrity {
                    path: path.to_owned(),
                    expected: expected.clone(),
                    answered: stored.sha256,
                    request_id: answer.request_id,
                }
                .redacted(key))
            }
        })
        .await
    }

    async fn read_file(&self, key: &ApiKey, id: &str, path: &str) -> Result<Vec<u8>, Error> {
        let arguments = FilesGetArgs {
            briq: id.to_owned(),
            path: path.to_owned(),
        };
        idempotent("read_file", || async {
            let answer = self
                .call(
                    key,
                    tools::FILES_GET,
                    &arguments,
                    self.options.request_timeout,
                )
                .await?;
            let malformed = |e: base64::DecodeError| Error::Malformed {
                detail: format!("file content is not base64: {e}"),
                request_id: answer.request_id.clone(),
            };
            // A picture comes back as an image item (published); any other file as text.
            if let Some(image) = image_bytes(&answer.content) {
                return image.map_err(malformed);
            }
            let file: FilesGetAnswer = answer.decode()?;
            decode_base64(&file.content_base64).map_err(malformed)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_urls() {
        let options = ClientOptions::new(Url::parse("mailto:x@example.test").unwrap());
        assert!(matches!(
            BriqClient::new(options),
            Err(NewClientError::BaseUrl { .. })
        ));
    }

    #[test]
    fn a_plain_http_url_is_refused_unless_allowed() {
        let url = Url::parse("http://briq.example.test/mcp").unwrap();
        assert!(matches!(
            BriqClient::new(ClientOptions::new(url.clone())),
            Err(NewClientError::PlainHttp { .. })
        ));
        assert!(BriqClient::new(ClientOptions::local(url)).is_ok());
    }

    #[test]
    fn a_url_without_a_path_means_briqs_mcp_endpoint() {
        let endpoint = |url: &str| {
            BriqClient::new(ClientOptions::new(Url::parse(url).unwrap()))
                .unwrap()
                .options
                .base_url
                .to_string()
        };
        assert_eq!(
            endpoint("https://api.briq.cloud"),
            "https://api.briq.cloud/mcp"
        );
        assert_eq!(
            endpoint("https://api.briq.cloud/mcp"),
            "https://api.briq.cloud/mcp"
        );
        assert_eq!(
            endpoint("https://proxy.test/briq/mcp"),
            "https://proxy.test/briq/mcp"
        );
    }

    #[test]
    fn sha256_is_lowercase_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
