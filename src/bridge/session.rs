//! One executor's sandbox as the controllers use it: bridge commands over the briq API, each
//! answered by one envelope of this protocol.

use std::{collections::BTreeMap, time::Duration};

use crate::{
    bridge::{
        self, Command, EnvReport, Envelope, FileReport, KernelReport, Malformed, Nonce, RunResult,
        RunStatus, SetupReport, StateReport, fork::ForkReport,
    },
    briq::{self, ApiKey, ExecRequest, SandboxApi},
};

/// A claimer's environment: variable names to values, some from its Secrets.
pub type ClaimEnv = BTreeMap<String, String>;

/// How long the live kernel has to take a claimer's environment.
const SET_ENV_DEADLINE: Duration = Duration::from_secs(10);
/// Room for the bridge's own start-up and the kernel interrupt grace beyond a command's deadline.
const BRIDGE_MARGIN: Duration = Duration::from_secs(5);
const KERNEL_START_DEADLINE: Duration = Duration::from_secs(30);
/// How long joining an upload's parts (64 MiB at most) or reading a part may take.
const FILE_DEADLINE: Duration = Duration::from_secs(60);
/// How long beyond a run's own timeout `recall` may wait for it: the bridge waits for a running
/// attempt's result until its timeout, interrupt grace and runner margin (3.5 s) have passed.
const RECALL_MARGIN: Duration = Duration::from_secs(4);

/// The longest one executor's provisioning may wait on briq: setup (briq's longest synchronous
/// command), then the kernel's start, each with the bridge's margin.
pub const LONGEST_PROVISIONING: Duration = Duration::from_secs(
    briq::api::MAX_EXEC_TIMEOUT.as_secs()
        + KERNEL_START_DEADLINE.as_secs()
        + BRIDGE_MARGIN.as_secs(),
);

/// The longest one Execution may wait on briq: its deadline and the bridge's margin.
pub const LONGEST_RUN: Duration =
    Duration::from_secs(crate::crd::MAX_EXECUTION_TIMEOUT_SECONDS as u64 + BRIDGE_MARGIN.as_secs());

/// Why a bridge call gave no trustworthy answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The exec of the bridge command failed; [`briq::Error::exec_outcome`] tells whether the
    /// command can have run.
    #[error(transparent)]
    Briq(#[from] briq::Error),
    /// The exec returned and the bridge spilled its answer to a file, but reading that file
    /// failed: the command ran, its answer is lost.
    #[error("the command ran, but reading its spilled answer failed: {0}")]
    ResultUnreadable(#[source] briq::Error),
    #[error("the bridge command did not finish within {0:?}")]
    TimedOut(Duration),
    #[error("{0}")]
    Malformed(#[from] Malformed),
    #[error("the bridge answered with a {0} envelope where another kind was expected")]
    UnexpectedKind(&'static str),
}

impl CallError {
    /// The pause briq asked for before calling again, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CallError::Briq(error) | CallError::ResultUnreadable(error) => error.retry_after(),
            _ => None,
        }
    }
}

/// Why provisioning a sandbox failed for good.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("setup failed: {message}")]
    Failed {
        message: String,
        pip_tail: Option<String>,
    },
    #[error("the kernel did not start: {0}")]
    Kernel(String),
    #[error("the kernel did not take the claimer's environment: {0}")]
    Env(String),
    #[error(transparent)]
    Call(#[from] CallError),
}

/// What a finished provisioning did, for the executor's Ready event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Provisioned {
    /// Whether setup ran pip; false when every requirement was importable already (an image
    /// with the bridge's runtime preinstalled, `images/sandbox`).
    pub pip_installed: bool,
}

pub struct Session<'a, S> {
    pub api: &'a S,
    pub key: &'a ApiKey,
    pub sandbox_id: &'a str,
}

impl<'a, S> Session<'a, S> {
    pub fn new(api: &'a S, key: &'a ApiKey, sandbox_id: &'a str) -> Self {
        Session {
            api,
            key,
            sandbox_id,
        }
    }
}

impl<S: SandboxApi> Session<'_, S> {
    /// Uploads the bridge, installs its dependencies and `requirements` within `deadline`,
    /// starts the kernel and gives it `env` (a claimer's; none for others). Every step is
    /// idempotent, so a failed attempt may simply be repeated. `deadline` is cut to what fits
    /// in one synchronous briq command with the bridge's margin.
    pub async fn provision(
        &self,
        deadline: Duration,
        requirements: &[String],
        env: &ClaimEnv,
    ) -> Result<Provisioned, SetupError> {
        let (upload, staged) = bridge::staged_bridge();
        self.api
            .write_file(
                self.key,
                self.sandbox_id,
                &upload,
                bridge::SOURCE.as_bytes(),
            )
            .await
            .map_err(CallError::from)?;
        let deadline = deadline.min(briq::api::MAX_EXEC_TIMEOUT - BRIDGE_MARGIN);
        let setup: SetupReport = match self
            .call(
                &Command::Setup {
                    staged: &staged,
                    deadline,
                    requirements,
                },
                deadline,
            )
            .await
        {
            Ok(Envelope::Setup(report)) => report,
            Ok(other) => return Err(unexpected(&other).into()),
            Err(CallError::TimedOut(_)) => {
                return Err(SetupError::Failed {
                    message: format!("setup did not finish within {}s", deadline.as_secs()),
                    pip_tail: None,
                });
            }
            Err(error) => return Err(error.into()),
        };
        if !setup.ok {
            return Err(SetupError::Failed {
                message: setup.message,
                pip_tail: setup.pip_tail,
            });
        }
        let kernel = self.start_kernel().await?;
        if !kernel.alive {
            return Err(SetupError::Kernel(kernel.message));
        }
        if !env.is_empty() {
            let report = self.set_env(env).await?;
            if !report.ok {
                return Err(SetupError::Env(report.message));
            }
        }
        Ok(Provisioned {
            pip_installed: setup.installed,
        })
    }

    /// Starts the kernel unless a live one answers (after the sandbox restarted, a new one).
    pub async fn start_kernel(&self) -> Result<KernelReport, CallError> {
        self.kernel(&Command::StartKernel {
            deadline: KERNEL_START_DEADLINE,
        })
        .await
    }

    async fn kernel(&self, command: &Command<'_>) -> Result<KernelReport, CallError> {
        match self.call(command, KERNEL_START_DEADLINE).await? {
            Envelope::Kernel(report) => Ok(report),
            other => Err(unexpected(&other)),
        }
    }

    /// Runs `code` in the kernel as `attempt` (16 to 64 lowercase hex digits): one exec, the
    /// code on its stdin. Never repeated here: an error leaves it unknown whether the code ran
    /// (the sandbox's journal would run a second delivery of the same attempt only once).
    pub async fn run(
        &self,
        attempt: &str,
        code: &str,
        timeout: Duration,
    ) -> Result<RunResult, CallError> {
        match self
            .call_with_input(&Command::Run { attempt, timeout }, timeout, Some(code))
            .await?
        {
            Envelope::Result(result) if result.status == RunStatus::NotAccepted => Err(
                CallError::Malformed(Malformed::Invalid("a run answered not_accepted".into())),
            ),
            Envelope::Result(result) => Ok(result),
            other => Err(unexpected(&other)),
        }
    }

    /// What became of `attempt`, whose run had `timeout`: `Ok(None)` when the sandbox never
    /// accepted it (its code never ran), else its result, waited for while it runs. A
    /// malformed answer (no envelope included) means the sandbox cannot know.
    pub async fn recall(
        &self,
        attempt: &str,
        timeout: Duration,
    ) -> Result<Option<RunResult>, CallError> {
        match self
            .call(&Command::Recall { attempt }, timeout + RECALL_MARGIN)
            .await?
        {
            Envelope::Result(result) if result.status == RunStatus::NotAccepted => Ok(None),
            Envelope::Result(result) => Ok(Some(result)),
            other => Err(unexpected(&other)),
        }
    }

    /// Cancels `attempt` ([`Command::Cancel`]): its journaled result once the cancel is done —
    /// `cancelled` when it never ran or was interrupted, another status when it finished first.
    pub async fn cancel(&self, attempt: &str, grace: Duration) -> Result<RunResult, CallError> {
        match self
            .call(
                &Command::Cancel { attempt, grace },
                grace + KERNEL_START_DEADLINE,
            )
            .await?
        {
            Envelope::Result(result) if result.status == RunStatus::NotAccepted => Err(
                CallError::Malformed(Malformed::Invalid("a cancel answered not_accepted".into())),
            ),
            Envelope::Result(result) => Ok(result),
            other => Err(unexpected(&other)),
        }
    }

    /// Gives the kernel `env` ([`Command::SetEnv`]), sent on stdin: never in argv or in the
    /// exec's environment. A report that claims success for other names than those sent is
    /// malformed.
    pub async fn set_env(&self, env: &ClaimEnv) -> Result<EnvReport, CallError> {
        let input = serde_json::to_string(env).expect("a map of strings serializes");
        let command = Command::SetEnv {
            deadline: SET_ENV_DEADLINE,
        };
        // The request carried the values: an error keeps no text from the network, which a
        // gateway's page could fill with the request's body.
        let answer = self
            .call_with_input(&command, SET_ENV_DEADLINE, Some(&input))
            .await
            .map_err(|error| match error {
                CallError::Briq(error) => CallError::Briq(error.without_remote_text()),
                CallError::ResultUnreadable(error) => {
                    CallError::ResultUnreadable(error.without_remote_text())
                }
                other => other,
            })?;
        match answer {
            Envelope::Env(report) if report.ok && !report.names.iter().eq(env.keys()) => {
                Err(CallError::Malformed(Malformed::Invalid(
                    "set-env answered other names than it was sent".into(),
                )))
            }
            Envelope::Env(report) => Ok(report),
            other => Err(unexpected(&other)),
        }
    }

    /// Saves the kernel's namespace inside the sandbox ([`Command::SaveState`]).
    pub async fn save_state(&self, deadline: Duration) -> Result<StateReport, CallError> {
        self.state(&Command::SaveState { deadline }, deadline).await
    }

    /// Restores the namespace saved last into the kernel ([`Command::RestoreState`]).
    pub async fn restore_state(&self, deadline: Duration) -> Result<StateReport, CallError> {
        self.state(&Command::RestoreState { deadline }, deadline)
            .await
    }

    /// Installs the parts uploaded to `staged` as `dest` ([`Command::FileWrite`]).
    pub async fn file_write(
        &self,
        staged: &str,
        parts: usize,
        dest: &str,
        size: u64,
        sha256: &str,
    ) -> Result<FileReport, CallError> {
        let command = Command::FileWrite {
            staged,
            parts,
            dest,
            size,
            sha256,
            deadline: FILE_DEADLINE,
        };
        self.file(&command).await
    }

    /// Reads a part of `path` ([`Command::FileRead`]).
    pub async fn file_read(
        &self,
        path: &str,
        offset: u64,
        max_size: u64,
    ) -> Result<FileReport, CallError> {
        let command = Command::FileRead {
            path,
            offset,
            length: bridge::files::READ_PART_BYTES,
            max_size,
            deadline: FILE_DEADLINE,
        };
        self.file(&command).await
    }

    /// Saves the namespace (unless `saved`) and packs the kernel user's directory as
    /// `snapshot` ([`Command::ForkSave`]).
    pub async fn fork_save(
        &self,
        snapshot: &str,
        saved: bool,
        deadline: Duration,
    ) -> Result<ForkReport, CallError> {
        let command = Command::ForkSave {
            snapshot,
            saved,
            deadline,
        };
        self.fork(&command, deadline).await
    }

    /// Unpacks the snapshot uploaded to `staged` into the kernel user's directory
    /// ([`Command::ForkLoad`]).
    pub async fn fork_load(
        &self,
        staged: &str,
        parts: u64,
        size: u64,
        sha256: &str,
        deadline: Duration,
    ) -> Result<ForkReport, CallError> {
        let command = Command::ForkLoad {
            staged,
            parts,
            size,
            sha256,
            deadline,
        };
        self.fork(&command, deadline).await
    }

    async fn fork(
        &self,
        command: &Command<'_>,
        deadline: Duration,
    ) -> Result<ForkReport, CallError> {
        match self.call(command, deadline).await? {
            Envelope::Fork(report) => Ok(report),
            other => Err(unexpected(&other)),
        }
    }

    async fn file(&self, command: &Command<'_>) -> Result<FileReport, CallError> {
        match self.call(command, FILE_DEADLINE).await? {
            Envelope::File(report) => Ok(report),
            other => Err(unexpected(&other)),
        }
    }

    async fn state(
        &self,
        command: &Command<'_>,
        deadline: Duration,
    ) -> Result<StateReport, CallError> {
        match self.call(command, deadline).await? {
            Envelope::State(report) => Ok(report),
            other => Err(unexpected(&other)),
        }
    }

    async fn call(&self, command: &Command<'_>, deadline: Duration) -> Result<Envelope, CallError> {
        self.call_with_input(command, deadline, None).await
    }

    async fn call_with_input(
        &self,
        command: &Command<'_>,
        deadline: Duration,
        stdin: Option<&str>,
    ) -> Result<Envelope, CallError> {
        let nonce = Nonce::random();
        let request = ExecRequest {
            argv: command.argv(),
            cwd: Some(bridge::WORKDIR.to_owned()),
            // Not in argv: any process in the sandbox can read any command line.
            env: BTreeMap::from([(bridge::NONCE_ENV.to_owned(), nonce.as_str().to_owned())]),
            timeout: (deadline + BRIDGE_MARGIN).min(briq::api::MAX_EXEC_TIMEOUT),
            stdin: stdin.map(str::to_owned),
        };
        let output = self.api.exec(self.key, self.sandbox_id, &request).await?;
        if output.timed_out {
            return Err(CallError::TimedOut(request.timeout));
        }
        match bridge::parse(&output.stdout, &nonce)? {
            Envelope::Spilled(spill) => {
                let path = bridge::spill_file(&nonce);
                // The command ran: whatever goes wrong from here, it ran.
                let content = self
                    .api
                    .read_file(self.key, self.sandbox_id, &path)
                    .await
                    .map_err(CallError::ResultUnreadable)?;
                Ok(bridge::parse_spilled(&content, &spill, &nonce)?)
            }
            envelope => Ok(envelope),
        }
    }
}

fn unexpected(envelope: &Envelope) -> CallError {
    CallError::UnexpectedKind(match envelope {
        Envelope::Setup(_) => "setup",
        Envelope::Kernel(_) => "kernel",
        Envelope::Result(_) => "result",
        Envelope::State(_) => "state",
        Envelope::Env(_) => "env",
        Envelope::File(_) => "file",
        Envelope::Fork(_) => "fork",
        Envelope::Spilled(_) => "spilled",
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::bridge::RunStatus;
    use crate::bridge::fake::{Call, FakeBriq, Reply, default_envelope, result};

    const ID: &str = "bq_1";

    fn key() -> ApiKey {
        ApiKey::new("k").unwrap()
    }

    fn session<'a>(api: &'a FakeBriq, key: &'a ApiKey) -> Session<'a, FakeBriq> {
        Session::new(api, key, ID)
    }

    /// The staged bridge's upload: its path is random, its place in the sequence is not.
    fn staged_upload(calls: &[Call]) -> Option<&str> {
        match calls.first()? {
            Call::WriteFile { id, path } if id == ID && path.starts_with("/work/.briq/bridge-") => {
                Some(path)
            }
            _ => None,
        }
    }

    #[tokio::test]
    async fn provisioning_uploads_the_bridge_then_sets_up_and_starts_the_kernel() {
        let api = FakeBriq::default().with_sandbox(ID, "py");
        let key = key();
        let done = session(&api, &key)
            .provision(Duration::from_secs(30), &[], &BTreeMap::new())
            .await
            .unwrap();
        assert_eq!(
            done,
            Provisioned {
                pip_installed: false
            }
        );
        let calls = api.calls();
        assert!(staged_upload(&calls).is_some(), "{calls:?}");
        assert_eq!(
            calls[1..],
            [Call::exec(ID, "setup"), Call::exec(ID, "start-kernel")]
        );
    }

    #[tokio::test]
    async fn a_claimers_environment_goes_to_the_kernel_on_stdin_after_its_start() {
        let api = FakeBriq::default().with_sandbox(ID, "py");
        let key = key();
        api.answer(
            "set-env",
            Reply::Envelope(json!({"kind": "env", "ok": true, "names": ["TOKEN"], "message": ""})),
        );
        let env = BTreeMap::from([("TOKEN".to_owned(), "s3cret".to_owned())]);
        session(&api, &key)
            .provision(Duration::from_secs(30), &[], &env)
            .await
            .unwrap();
        assert_eq!(
            api.calls()[1..],
            [
                Call::exec(ID, "setup"),
                Call::exec(ID, "start-kernel"),
                Call::exec_with(ID, "set-env", r#"{"TOKEN":"s3cret"}"#),
            ]
        );
    }

    #[tokio::test]
    async fn a_failed_setup_starts_no_kernel() {
        let api = FakeBriq::default().with_sandbox(ID, "py");
        let key = key();
        api.answer(
            "setup",
            Reply::Envelope(json!({"kind": "setup", "ok": false, "installed": true, "message": "pip failed", "pip_tail": "no index"})),
        );
        let error = session(&api, &key)
            .provision(
                Duration::from_secs(30),
                &["numpy".to_owned()],
                &BTreeMap::new(),
            )
            .await
            .unwrap_err();
        assert!(matches!(error, SetupError::Failed { .. }), "{error:?}");
        assert_eq!(api.calls()[1..], [Call::exec(ID, "setup")]);
    }

    #[tokio::test]
    async fn a_run_is_one_exec_with_the_code_on_stdin() {
        let api = FakeBriq::default().with_sandbox(ID, "py");
        let key = key();
        let run = session(&api, &key)
            .run("00000000000000aa", "1 + 1", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(run.output.as_deref(), Some("2"));
        assert_eq!(api.calls(), [Call::exec_with(ID, "run", "1 + 1")]);
    }

    #[tokio::test]
    async fn a_spilled_answer_is_read_from_its_file_after_the_one_exec() {
        let api = FakeBriq::default().with_sandbox(ID, "py");
        let key = key();
        api.answer("run", Reply::Spilled(result("ok", "large")));
        let run = session(&api, &key)
            .run("00000000000000aa", "big()", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(run.output.as_deref(), Some("large"));
        let calls = api.calls();
        assert_eq!(calls[0], Call::exec_with(ID, "run", "big()"));
        assert!(
            matches!(&calls[1..], [Call::ReadFile { id, path }] if id == ID && path.starts_with("/work/.briq/results/")),
            "{calls:?}"
        );
    }

    #[tokio::test]
    async fn a_run_whose_answer_was_lost_is_never_sent_again_and_recall_asks_the_journal() {
        let api = FakeBriq::default().with_sandbox(ID, "py");
        let key = key();
        api.answer(
            "run",
            Reply::Fails(briq::Error::Malformed {
                detail: "cut".into(),
                request_id: None,
            }),
        );
        api.answer("recall", Reply::Envelope(result("ok", "2")));
        let session = session(&api, &key);
        let lost = session
            .run("00000000000000aa", "1 + 1", Duration::from_secs(5))
            .await
            .unwrap_err();
        let CallError::Briq(error) = &lost else {
            panic!("{lost:?}")
        };
        assert_eq!(error.exec_outcome(), briq::ExecOutcome::Unknown);
        let learnt = session
            .recall("00000000000000aa", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(learnt.and_then(|r| r.output).as_deref(), Some("2"));
        assert_eq!(
            api.calls(),
            [
                Call::exec_with(ID, "run", "1 + 1"),
                Call::exec(ID, "recall"),
            ]
        );
    }

    #[tokio::test]
    async fn an_attempt_the_journal_never_accepted_is_recalled_as_not_run() {
        let api = FakeBriq::default().with_sandbox(ID, "py");
        let key = key();
        api.answer("recall", Reply::Envelope(result("not_accepted", "")));
        let learnt = session(&api, &key)
            .recall("00000000000000aa", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(learnt, None);
        assert_eq!(api.calls(), [Call::exec(ID, "recall")]);
    }

    #[tokio::test]
    async fn cancel_save_and_restore_are_one_exec_each() {
        let api = FakeBriq::default().with_sandbox(ID, "py");
        let key = key();
        let session = session(&api, &key);
        let cancelled = session
            .cancel("00000000000000aa", Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(cancelled.status, RunStatus::Cancelled);
        session.save_state(Duration::from_secs(10)).await.unwrap();
        session
            .restore_state(Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(
            api.calls(),
            [
                Call::exec(ID, "cancel"),
                Call::exec(ID, "save-state"),
                Call::exec(ID, "restore-state"),
            ]
        );
        assert_eq!(default_envelope("probe")["kind"], "kernel");
    }

    #[tokio::test]
    async fn a_stopped_sandbox_runs_nothing_and_says_so() {
        let api = FakeBriq::default().with_sandbox(ID, "py");
        let key = key();
        api.stop_sandbox(&key, ID).await.unwrap();
        let error = session(&api, &key)
            .run("00000000000000aa", "1 + 1", Duration::from_secs(5))
            .await
            .unwrap_err();
        let CallError::Briq(error) = &error else {
            panic!("{error:?}")
        };
        assert_eq!(error.exec_outcome(), briq::ExecOutcome::NotRun);
    }
}
