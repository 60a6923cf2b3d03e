//! The operator's side of the bridge: the Python program that runs inside the sandbox and
//! drives the Jupyter kernel (`bridge/sandbox/briq_sandbox.py`, protocol in
//! `bridge/PROTOCOL.md`). This module ships the program, builds its command lines and parses its
//! one framed envelope strictly. Nothing the sandbox prints is ever evaluated.

pub mod session;

use std::time::Duration;

use rand::{Rng, distr::Alphanumeric};
use serde::Deserialize;

/// The bridge program, uploaded to [`BRIDGE_FILE`] at setup.
pub const SOURCE: &str = include_str!("../../bridge/sandbox/briq_sandbox.py");

/// Working directory of every bridge command; all bridge paths are relative to it, so the same
/// commands work on briq and on the local sandbox server.
pub const WORKDIR: &str = "/work";
/// Where [`SOURCE`] is uploaded.
pub const BRIDGE_FILE: &str = "/work/.briq/bridge.py";
const BRIDGE_ARG: &str = ".briq/bridge.py";
const STATE_DIR: &str = ".briq/state";

/// Logs and output share this many characters per action.
pub const TEXT_BUDGET_CHARS: usize = 65_536;
/// A serialized final answer may be this long at most.
pub const FINAL_ANSWER_MAX_CHARS: usize = 65_536;
/// Largest bridge stdout the parser reads. A result is at most two budgets of text, which JSON
/// escaping can grow up to six-fold; anything larger is malformed.
pub const MAX_STDOUT_BYTES: usize = 1 << 20;

/// A fresh per-call token framing the envelope, so code that prints look-alike text cannot
/// forge a result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nonce(String);

impl Nonce {
    pub fn random() -> Self {
        Nonce(
            rand::rng()
                .sample_iter(&Alphanumeric)
                .take(32)
                .map(char::from)
                .collect(),
        )
    }

    fn begin_marker(&self) -> String {
        format!("<<<BRIQ-ENVELOPE {}>>>", self.0)
    }

    fn end_marker(&self) -> String {
        format!("<<<END-BRIQ-ENVELOPE {}>>>", self.0)
    }
}

/// One invocation of the bridge.
#[derive(Clone, Debug)]
pub enum Command<'a> {
    /// Install the bridge's Python dependencies (skipped when importable) and `requirements`.
    Setup {
        deadline: Duration,
        requirements: &'a [String],
    },
    /// Start the kernel unless a live one answers.
    StartKernel { deadline: Duration },
    /// Report whether the kernel is alive; never starts one.
    Probe,
    /// Run the uploaded action file `code_file` (relative to [`WORKDIR`]).
    Run {
        code_file: &'a str,
        timeout: Duration,
    },
}

impl Command<'_> {
    /// The argv to exec with `cwd` = [`WORKDIR`].
    pub fn argv(&self, nonce: &Nonce) -> Vec<String> {
        let mut argv: Vec<String> = ["python3", BRIDGE_ARG].map(String::from).to_vec();
        let seconds = |d: &Duration| format!("{:.3}", d.as_secs_f64());
        match self {
            Command::Setup {
                deadline,
                requirements,
            } => {
                argv.extend(["setup".into(), "--deadline".into(), seconds(deadline)]);
                for requirement in requirements.iter() {
                    argv.extend(["--requirement".into(), requirement.clone()]);
                }
            }
            Command::StartKernel { deadline } => {
                argv.extend(
                    ["start-kernel", "--state-dir", STATE_DIR, "--deadline"].map(String::from),
                );
                argv.push(seconds(deadline));
            }
            Command::Probe => argv.extend(["probe", "--state-dir", STATE_DIR].map(String::from)),
            Command::Run { code_file, timeout } => {
                argv.extend(["run", "--state-dir", STATE_DIR, "--code"].map(String::from));
                argv.extend([code_file.to_string(), "--timeout".into(), seconds(timeout)]);
            }
        }
        argv.extend(["--nonce".into(), nonce.0.clone()]);
        argv
    }
}

/// Upload path (absolute) and bridge argument (relative to [`WORKDIR`]) of an action file.
pub fn action_file(name: &str) -> (String, String) {
    let relative = format!(".briq/actions/{name}.py");
    (format!("{WORKDIR}/{relative}"), relative)
}

/// What the bridge answered.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Envelope {
    Setup(SetupReport),
    Kernel(KernelReport),
    Result(RunResult),
    /// The real envelope was too large for briq's stdout and went to [`spill_file`].
    Spilled(Spill),
}

/// Where a spilled envelope is, and how to recognise it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spill {
    pub bytes: u64,
    pub sha256: String,
}

/// The file a spilled envelope of the call framed with `nonce` is written to.
pub fn spill_file(nonce: &Nonce) -> String {
    format!("{WORKDIR}/.briq/results/{}.out", nonce.0)
}

/// Parses the content of a spilled envelope, checked against what the bridge announced. A spill
/// never points at another spill.
pub fn parse_spilled(content: &[u8], spill: &Spill, nonce: &Nonce) -> Result<Envelope, Malformed> {
    use sha2::{Digest, Sha256};
    let digest = format!("{:x}", Sha256::digest(content));
    if content.len() as u64 != spill.bytes || digest != spill.sha256 {
        return Err(Malformed::Invalid(
            "spilled envelope does not match its size and digest".into(),
        ));
    }
    let text = std::str::from_utf8(content).map_err(|e| Malformed::Invalid(e.to_string()))?;
    match parse(text, nonce)? {
        Envelope::Spilled(_) => Err(Malformed::Invalid(
            "a spilled envelope points at another".into(),
        )),
        envelope => Ok(envelope),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetupReport {
    pub ok: bool,
    /// False when everything was importable already and pip was skipped.
    pub installed: bool,
    pub message: String,
    pub pip_tail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelReport {
    pub alive: bool,
    pub started: bool,
    pub pid: Option<i64>,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Ok,
    FinalAnswer,
    FinalAnswerRejected,
    Error,
    Timeout,
    KernelLost,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunResult {
    pub status: RunStatus,
    pub logs: String,
    pub output: Option<String>,
    pub truncated: bool,
    pub final_answer: Option<String>,
    pub error: Option<CodeError>,
    pub display_dropped: u32,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeError {
    pub name: String,
    pub message: String,
    pub traceback: String,
}

/// Why a bridge answer cannot be trusted. Any of these makes the executor unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("bridge output is {0} bytes, over the {MAX_STDOUT_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("bridge output has no envelope for this call")]
    Missing,
    #[error("bridge output has more than one envelope for this call")]
    Repeated,
    #[error("bridge envelope is not terminated")]
    Unterminated,
    #[error("bridge envelope is not valid: {0}")]
    Invalid(String),
}

/// Finds the one envelope framed with `nonce` in `stdout` and decodes it strictly: unknown
/// fields, a second envelope, or results over the budgets are malformed.
pub fn parse(stdout: &str, nonce: &Nonce) -> Result<Envelope, Malformed> {
    if stdout.len() > MAX_STDOUT_BYTES {
        return Err(Malformed::TooLarge(stdout.len()));
    }
    let (begin, end) = (nonce.begin_marker(), nonce.end_marker());
    let mut starts = stdout.match_indices(&begin);
    let (start, _) = starts.next().ok_or(Malformed::Missing)?;
    if starts.next().is_some() || stdout.matches(&end).count() > 1 {
        return Err(Malformed::Repeated);
    }
    let body_start = start + begin.len();
    let body_len = stdout[body_start..]
        .find(&end)
        .ok_or(Malformed::Unterminated)?;
    let body = stdout[body_start..body_start + body_len].trim();
    let envelope: Envelope =
        serde_json::from_str(body).map_err(|e| Malformed::Invalid(e.to_string()))?;
    if let Envelope::Result(result) = &envelope {
        check_result(result)?;
    }
    Ok(envelope)
}

fn check_result(result: &RunResult) -> Result<(), Malformed> {
    let invalid = |why: &str| Err(Malformed::Invalid(why.to_owned()));
    // The truncation marker may add a line beyond the budget; a bridge that ignores the budget
    // by more than that is not trusted.
    let text_chars =
        result.logs.chars().count() + result.output.as_deref().map_or(0, |o| o.chars().count());
    if text_chars > TEXT_BUDGET_CHARS + 256 {
        return invalid("logs and output exceed their shared budget");
    }
    match (result.status, &result.final_answer, &result.error) {
        (RunStatus::FinalAnswer, Some(answer), None) => {
            if !answer.starts_with("safe:") {
                return invalid("final answer is not in smolagents' safe serialization");
            }
            if answer.chars().count() > FINAL_ANSWER_MAX_CHARS {
                return invalid("final answer exceeds its budget");
            }
        }
        (RunStatus::FinalAnswer, _, _) => {
            return invalid("final_answer status without exactly an answer");
        }
        (RunStatus::Error | RunStatus::FinalAnswerRejected, None, Some(_)) => {}
        (RunStatus::Error | RunStatus::FinalAnswerRejected, _, _) => {
            return invalid("error status without exactly an error");
        }
        (RunStatus::Ok | RunStatus::Timeout | RunStatus::KernelLost, None, _) => {}
        (_, Some(_), _) => return invalid("a final answer on a status that has none"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(nonce: &Nonce, body: &str) -> String {
        format!("{}\n{body}\n{}\n", nonce.begin_marker(), nonce.end_marker())
    }

    const OK: &str = r#"{"kind":"result","status":"ok","logs":"hi\n","output":"42","truncated":false,"final_answer":null,"error":null,"display_dropped":0,"duration_ms":3}"#;

    #[test]
    fn parses_a_result_among_other_output() {
        let nonce = Nonce::random();
        let stdout = format!("pip noise\n{}trailing\n", frame(&nonce, OK));
        let Envelope::Result(result) = parse(&stdout, &nonce).unwrap() else {
            panic!()
        };
        assert_eq!(result.status, RunStatus::Ok);
        assert_eq!(result.output.as_deref(), Some("42"));
        assert_eq!(result.logs, "hi\n");
    }

    #[test]
    fn parses_setup_and_kernel_reports() {
        let nonce = Nonce::random();
        let setup = r#"{"kind":"setup","ok":false,"installed":true,"message":"pip exited 1","pip_tail":"E: no"}"#;
        assert!(matches!(
            parse(&frame(&nonce, setup), &nonce),
            Ok(Envelope::Setup(SetupReport { ok: false, .. }))
        ));
        let kernel =
            r#"{"kind":"kernel","alive":true,"started":false,"pid":7,"message":"running"}"#;
        assert!(matches!(
            parse(&frame(&nonce, kernel), &nonce),
            Ok(Envelope::Kernel(KernelReport { pid: Some(7), .. }))
        ));
    }

    #[test]
    fn forged_or_broken_envelopes_are_malformed() {
        let nonce = Nonce::random();
        let other = Nonce::random();
        assert_eq!(parse(&frame(&other, OK), &nonce), Err(Malformed::Missing));
        assert_eq!(parse("", &nonce), Err(Malformed::Missing));
        let twice = format!("{}{}", frame(&nonce, OK), frame(&nonce, OK));
        assert_eq!(parse(&twice, &nonce), Err(Malformed::Repeated));
        let open = format!("{}\n{OK}\n", nonce.begin_marker());
        assert_eq!(parse(&open, &nonce), Err(Malformed::Unterminated));
        let unknown = OK.replace(
            r#""duration_ms":3"#,
            r#""duration_ms":3,"eval":"os.system('x')""#,
        );
        assert!(matches!(
            parse(&frame(&nonce, &unknown), &nonce),
            Err(Malformed::Invalid(_))
        ));
        let missing = OK.replace(r#","display_dropped":0"#, "");
        assert!(matches!(
            parse(&frame(&nonce, &missing), &nonce),
            Err(Malformed::Invalid(_))
        ));
        let huge = "x".repeat(MAX_STDOUT_BYTES + 1);
        assert_eq!(
            parse(&huge, &nonce),
            Err(Malformed::TooLarge(MAX_STDOUT_BYTES + 1))
        );
    }

    #[test]
    fn results_that_break_the_protocol_rules_are_malformed() {
        let nonce = Nonce::random();
        let pickle = OK
            .replace(r#""status":"ok""#, r#""status":"final_answer""#)
            .replace(r#""final_answer":null"#, r#""final_answer":"pickle:gASV""#);
        assert!(matches!(
            parse(&frame(&nonce, &pickle), &nonce),
            Err(Malformed::Invalid(_))
        ));
        let error_without_error = OK.replace(r#""status":"ok""#, r#""status":"error""#);
        assert!(matches!(
            parse(&frame(&nonce, &error_without_error), &nonce),
            Err(Malformed::Invalid(_))
        ));
        let over_budget = OK.replace(
            r#""logs":"hi\n""#,
            &format!(r#""logs":"{}""#, "y".repeat(TEXT_BUDGET_CHARS + 300)),
        );
        assert!(matches!(
            parse(&frame(&nonce, &over_budget), &nonce),
            Err(Malformed::Invalid(_))
        ));
        let answer = OK
            .replace(r#""status":"ok""#, r#""status":"final_answer""#)
            .replace(r#""final_answer":null"#, r#""final_answer":"safe:[1, 2]""#);
        assert!(parse(&frame(&nonce, &answer), &nonce).is_ok());
    }

    #[test]
    fn spilled_envelopes_are_checked_against_their_digest() {
        use sha2::{Digest, Sha256};
        let nonce = Nonce::random();
        let content = frame(&nonce, OK);
        let spill = Spill {
            bytes: content.len() as u64,
            sha256: format!("{:x}", Sha256::digest(&content)),
        };
        let pointer = format!(
            r#"{{"kind":"spilled","bytes":{},"sha256":"{}"}}"#,
            spill.bytes, spill.sha256
        );
        assert_eq!(
            parse(&frame(&nonce, &pointer), &nonce),
            Ok(Envelope::Spilled(spill.clone()))
        );
        assert!(matches!(
            parse_spilled(content.as_bytes(), &spill, &nonce),
            Ok(Envelope::Result(_))
        ));
        let tampered = content.replace("42", "43");
        assert!(parse_spilled(tampered.as_bytes(), &spill, &nonce).is_err());
        let nested = frame(&nonce, &pointer);
        let nested_spill = Spill {
            bytes: nested.len() as u64,
            sha256: format!("{:x}", Sha256::digest(&nested)),
        };
        assert!(parse_spilled(nested.as_bytes(), &nested_spill, &nonce).is_err());
    }

    #[test]
    fn argv_carries_the_nonce_and_relative_paths() {
        let nonce = Nonce::random();
        let argv = Command::Run {
            code_file: ".briq/actions/a.py",
            timeout: Duration::from_secs(30),
        }
        .argv(&nonce);
        assert_eq!(&argv[..3], ["python3", ".briq/bridge.py", "run"]);
        assert!(argv.contains(&"30.000".to_owned()));
        assert_eq!(argv.last(), Some(&nonce.0));
        let requirements = ["pandas==2.2.3".to_owned()];
        let argv = Command::Setup {
            deadline: Duration::from_secs(60),
            requirements: &requirements,
        }
        .argv(&nonce);
        assert!(
            argv.windows(2)
                .any(|w| w == ["--requirement", "pandas==2.2.3"])
        );
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_output(stdout in ".{0,2000}") {
            let _ = parse(&stdout, &Nonce::random());
        }

        #[test]
        fn user_text_around_a_real_envelope_cannot_change_it(
            before in ".{0,500}", after in ".{0,500}", forged in "[a-zA-Z0-9]{32}",
        ) {
            let nonce = Nonce::random();
            prop_assume!(forged != nonce.0);
            let fake = frame(&Nonce(forged), &OK.replace("42", "forged"));
            let stdout = format!("{before}{fake}{}{after}", frame(&nonce, OK));
            let Ok(Envelope::Result(result)) = parse(&stdout, &nonce) else {
                return Err(TestCaseError::fail("the real envelope was not found"));
            };
            prop_assert_eq!(result.output.as_deref(), Some("42"));
        }

        #[test]
        fn any_single_corruption_of_the_body_is_rejected_or_parsed_strictly(
            position in 0usize..OK.len(), byte in any::<u8>(),
        ) {
            let nonce = Nonce::random();
            let mut body = OK.as_bytes().to_vec();
            body[position] = byte;
            if let Ok(body) = String::from_utf8(body)
                && let Ok(Envelope::Result(result)) = parse(&frame(&nonce, &body), &nonce)
            {
                // A corruption that still decodes must still satisfy every protocol rule.
                prop_assert!(check_result(&result).is_ok());
            }
        }
    }
}
