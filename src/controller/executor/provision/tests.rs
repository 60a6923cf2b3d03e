use super::*;
use crate::{
    bridge::Malformed,
    controller::executor::fixtures::{not_found, unavailable},
};

#[test]
fn setup_verdict_table() {
    let prebuilt = Provisioned {
        pip_installed: false,
    };
    let cases: Vec<(Result<Provisioned, SetupError>, SetupVerdict)> = vec![
        (Ok(prebuilt), SetupVerdict::Ready(prebuilt)),
        (
            Err(SetupError::Call(CallError::Briq(not_found()))),
            SetupVerdict::SandboxGone,
        ),
        (
            Err(SetupError::Call(CallError::Briq(unavailable()))),
            SetupVerdict::Retry,
        ),
        (
            Err(SetupError::Call(CallError::TimedOut(
                std::time::Duration::from_secs(60),
            ))),
            SetupVerdict::Retry,
        ),
        // Setup is idempotent: an answer lost after it ran costs one more try, not the sandbox.
        (
            Err(SetupError::Call(CallError::ResultUnreadable(not_found()))),
            SetupVerdict::Retry,
        ),
        (
            Err(SetupError::Call(CallError::UnexpectedKind("result"))),
            SetupVerdict::Failed(
                "the bridge answered with a result envelope where another kind was expected".into(),
            ),
        ),
        (
            Err(SetupError::Call(CallError::Malformed(Malformed::Missing))),
            SetupVerdict::Failed(Malformed::Missing.to_string()),
        ),
        (
            Err(SetupError::Failed {
                message: "pip failed".into(),
                pip_tail: Some("ERROR: no such package".into()),
            }),
            SetupVerdict::Failed("pip failed; pip output ends:\nERROR: no such package".into()),
        ),
        (
            Err(SetupError::Failed {
                message: "setup did not finish within 55s".into(),
                pip_tail: Some(String::new()),
            }),
            SetupVerdict::Failed("setup did not finish within 55s".into()),
        ),
        (
            Err(SetupError::Kernel("no ipykernel".into())),
            SetupVerdict::Failed("the kernel did not start: no ipykernel".into()),
        ),
    ];
    for (outcome, expected) in cases {
        assert_eq!(setup_verdict(&outcome), expected, "{outcome:?}");
    }
}

#[test]
fn the_ready_note_says_whether_setup_ran_pip() {
    let cases = [
        (
            false,
            "sandbox bq_1 is ready; setup made no pip call: every requirement was installed \
             already",
        ),
        (
            true,
            "sandbox bq_1 is ready; setup pip-installed missing requirements",
        ),
    ];
    for (pip_installed, expected) in cases {
        assert_eq!(ready_note("bq_1", Provisioned { pip_installed }), expected);
    }
}
