use std::time::Duration;

use super::*;
use crate::{
    bridge::Malformed,
    briq::{self, api::ErrorCode},
    controller::execution::{
        fixtures::{briq_error, not_found, order, result, time, unavailable},
        send::running_status,
    },
};

/// (outcome, reason, poisons the executor, keeps the result)
type JudgeCase = (Result<RunResult, CallError>, ExecutionReason, bool, bool);

#[test]
fn judge_table() {
    use ExecutionReason::*;
    let cases: Vec<JudgeCase> = vec![
        (Ok(result(RunStatus::Ok, None)), Completed, false, true),
        (
            Ok(result(RunStatus::FinalAnswer, None)),
            FinalAnswer,
            false,
            true,
        ),
        (
            Ok(result(
                RunStatus::Error,
                Some(("ZeroDivisionError", "division by zero")),
            )),
            CodeError,
            false,
            true,
        ),
        (
            Ok(result(
                RunStatus::FinalAnswerRejected,
                Some(("TypeError", "ndarray")),
            )),
            FinalAnswerRejected,
            false,
            true,
        ),
        (Ok(result(RunStatus::Timeout, None)), Timeout, true, true),
        (
            Ok(result(RunStatus::KernelLost, None)),
            KernelLost,
            true,
            true,
        ),
        (
            Err(CallError::TimedOut(Duration::from_secs(35))),
            Timeout,
            true,
            false,
        ),
        (
            Err(CallError::Malformed(Malformed::Repeated)),
            MalformedResponse,
            true,
            false,
        ),
        (
            Err(CallError::UnexpectedKind("setup")),
            MalformedResponse,
            true,
            false,
        ),
        (
            Err(CallError::Briq(briq::Error::NotFound {
                message: "gone".into(),
                request_id: None,
            })),
            KernelLost,
            true,
            false,
        ),
        (
            Err(CallError::Briq(briq_error(400, ErrorCode::InvalidRequest))),
            TransportError,
            false,
            false,
        ),
        (
            Err(CallError::Briq(briq::Error::Malformed {
                detail: "not JSON".into(),
                request_id: None,
            })),
            TransportError,
            true,
            false,
        ),
        // Refused before acting: the code did not run and the executor stays usable.
        (
            Err(CallError::Briq(unavailable(429))),
            TransportError,
            false,
            false,
        ),
        (
            Err(CallError::Briq(briq_error(409, ErrorCode::Other))),
            TransportError,
            false,
            false,
        ),
        // A gateway may answer any 5xx after the sandbox ran the code.
        (
            Err(CallError::Briq(unavailable(500))),
            TransportError,
            true,
            false,
        ),
        (
            Err(CallError::Briq(unavailable(502))),
            TransportError,
            true,
            false,
        ),
        (
            Err(CallError::Briq(unavailable(503))),
            TransportError,
            true,
            false,
        ),
        (
            Err(CallError::Briq(unavailable(504))),
            TransportError,
            true,
            false,
        ),
        (
            Err(CallError::Briq(briq_error(402, ErrorCode::PaymentRequired))),
            TransportError,
            true,
            false,
        ),
        // The exec returned: the code ran, whatever reading its answer ran into.
        (
            Err(CallError::ResultUnreadable(unavailable(503))),
            TransportError,
            true,
            false,
        ),
        (
            Err(CallError::ResultUnreadable(not_found())),
            TransportError,
            true,
            false,
        ),
        (
            Err(CallError::ResultUnreadable(briq_error(
                400,
                ErrorCode::InvalidRequest,
            ))),
            TransportError,
            true,
            false,
        ),
    ];
    for (outcome, reason, poisons, keeps_result) in cases {
        let shown = format!("{outcome:?}");
        let (verdict, kept) = judge(outcome, 30);
        assert_eq!(verdict.reason, reason, "{shown}");
        assert_eq!(verdict.unusable.is_some(), poisons, "{shown}");
        assert_eq!(kept.is_some(), keeps_result, "{shown}");
    }
}

#[test]
fn failed_calls_say_whether_the_code_ran() {
    let message = |outcome: CallError| judge(Err(outcome), 30).0.message;
    assert_eq!(
        message(CallError::Briq(unavailable(429))),
        "briq refused the request to run the code or was never reached, so the code did not run: \
         briq is unavailable (HTTP 429, unavailable): bad gateway (request id req_1)"
    );
    assert_eq!(
        message(CallError::Briq(unavailable(502))),
        "the outcome is unknown: the code may have run (briq is unavailable (HTTP 502, \
         unavailable): bad gateway (request id req_1)); the executor is now unusable"
    );
    assert_eq!(
        message(CallError::ResultUnreadable(unavailable(503))),
        "the outcome is unknown: the command ran, but reading its spilled answer failed: briq is \
         unavailable (HTTP 503, unavailable): bad gateway (request id req_1); the executor is now \
         unusable"
    );
    assert_eq!(
        message(CallError::Briq(not_found())),
        "the sandbox is gone (briq: not found: gone), so the code did not run; the executor is \
         now unusable"
    );
    // No verdict that leaves the outcome unknown claims the code did not run.
    for outcome in [
        CallError::Briq(unavailable(500)),
        CallError::Briq(unavailable(504)),
        CallError::Briq(briq::Error::Malformed {
            detail: "not JSON".into(),
            request_id: None,
        }),
        CallError::ResultUnreadable(not_found()),
        CallError::ResultUnreadable(briq_error(400, ErrorCode::InvalidRequest)),
    ] {
        let shown = format!("{outcome:?}");
        let (verdict, _) = judge(Err(outcome), 30);
        assert!(verdict.unusable.is_some(), "{shown}");
        assert!(
            !verdict.message.contains("did not run"),
            "{shown}: {}",
            verdict.message
        );
    }
}

#[test]
fn judge_messages_say_what_happened_to_the_code() {
    let (verdict, _) = judge(
        Ok(result(
            RunStatus::Error,
            Some(("NameError", "x is not defined")),
        )),
        30,
    );
    assert_eq!(verdict.message, "NameError: x is not defined");
    let (verdict, _) = judge(Ok(result(RunStatus::Timeout, None)), 12);
    assert_eq!(
        verdict.message,
        "the code ran past its 12s deadline; the kernel was interrupted and the executor is now unusable"
    );
    assert_eq!(
        verdict.unusable.as_deref(),
        Some("an Execution ran past its 12s deadline")
    );
}

#[test]
fn the_final_status_keeps_the_attempt_and_carries_the_result() {
    let running = running_status(
        &ExecutionStatus::default(),
        Some(1),
        "py",
        "00000000000000aa".into(),
        time("01"),
    );
    assert_eq!(running.conditions[0].reason, "Running");
    assert_eq!(running.conditions[0].message, "running in BriqExecutor py");

    let (verdict, kept) = judge(
        Ok(result(RunStatus::Error, Some(("ValueError", "bad")))),
        30,
    );
    let done = final_status(&running, Some(1), &verdict, kept, time("02"));
    assert_eq!(
        done,
        ExecutionStatus {
            observed_generation: Some(1),
            conditions: done.conditions.clone(),
            attempt_id: Some("00000000000000aa".into()),
            logs: Some("hi\n".into()),
            output: Some("2".into()),
            error: Some(ExecutionError {
                name: "ValueError".into(),
                message: "bad".into(),
                traceback: Some("Traceback …".into()),
            }),
            start_time: Some(time("01")),
            completion_time: Some(time("02")),
            duration_millis: Some(7),
            ..Default::default()
        }
    );
    let succeeded = &done.conditions[0];
    assert_eq!(
        (succeeded.status.as_str(), succeeded.reason.as_str()),
        ("False", "CodeError")
    );

    let refused = Verdict::new(
        ExecutionReason::ExecutorDeleted,
        "BriqExecutor py was deleted",
    );
    let never_ran = final_status(
        &ExecutionStatus::default(),
        Some(1),
        &refused,
        None,
        time("03"),
    );
    assert_eq!(never_ran.attempt_id, None);
    assert_eq!(
        never_ran.error,
        Some(ExecutionError {
            name: "ExecutorDeleted".into(),
            message: "BriqExecutor py was deleted".into(),
            traceback: None,
        })
    );
}

#[test]
fn history_keeps_the_newest() {
    let finished = vec![
        (order("03", "c"), "c"),
        (order("01", "a"), "a"),
        (order("02", "b"), "b"),
        (order("01", "z"), "z"),
    ];
    assert_eq!(beyond_history(finished.clone(), 2), vec!["a", "z"]);
    assert_eq!(
        beyond_history(finished.clone(), 0),
        vec!["a", "z", "b", "c"]
    );
    assert_eq!(beyond_history(finished, 10), Vec::<&str>::new());
}

#[test]
fn the_largest_results_the_bridge_can_send_fit_the_status_budget() {
    use crate::bridge::{FINAL_ANSWER_MAX_CHARS, TEXT_BUDGET_CHARS};
    // Issue 14: 70,000 `\u2028<` pairs (the bridge passes 65,536 characters of them) in the
    // message and the traceback, and a full text budget of `<` in the logs: 1.2 MB as stored.
    let worst = "\u{2028}<".repeat(TEXT_BUDGET_CHARS / 2);
    let mut raised = result(RunStatus::Error, Some(("ValueError", &worst)));
    raised.logs = "<".repeat(TEXT_BUDGET_CHARS);
    raised.output = None;
    raised.error.as_mut().unwrap().traceback = worst.clone();
    let (verdict, kept) = judge(Ok(raised), 30);
    assert_eq!(verdict.reason, ExecutionReason::CodeError);
    let done = final_status(
        &ExecutionStatus::default(),
        Some(1),
        &verdict,
        kept,
        time("02"),
    );
    let size = budget::status_len(&done);
    assert!(size <= MAX_STATUS_BYTES, "{size} bytes");
    assert!(
        size > MAX_STATUS_BYTES - 1_000,
        "the budget is used: {size} bytes"
    );
    assert!(done.truncated);
    let error = done.error.unwrap();
    assert!(error.message.starts_with("\u{2028}<") && error.message.ends_with("\u{2028}<"));
    assert!(error.message.contains(" characters cut] "));
    assert_eq!(error.name, "ValueError");

    // A final answer the bridge accepts (65,536 characters) but that takes over half the
    // budget as stored (5 + 2 + 65,529 × 6 + 2 bytes) is refused, never cut.
    let mut answered = result(RunStatus::FinalAnswer, None);
    answered.final_answer = Some(format!(
        "safe:\"{}\"",
        "<".repeat(FINAL_ANSWER_MAX_CHARS - 7)
    ));
    let (verdict, kept) = judge(Ok(answered), 30);
    assert_eq!(verdict.reason, ExecutionReason::FinalAnswerRejected);
    assert_eq!(
        verdict.message,
        "FinalAnswerRejected: the final answer takes 393183 bytes as stored, over its \
         131072-byte budget"
    );
    let done = final_status(
        &ExecutionStatus::default(),
        Some(1),
        &verdict,
        kept,
        time("02"),
    );
    assert_eq!(
        (done.final_answer.as_deref(), done.is_final_answer),
        (None, false)
    );
    assert!(budget::status_len(&done) <= MAX_STATUS_BYTES);

    // One that fits is kept whole.
    let mut answered = result(RunStatus::FinalAnswer, None);
    let answer = format!("safe:\"{}\"", "a".repeat(FINAL_ANSWER_MAX_CHARS - 7));
    answered.final_answer = Some(answer.clone());
    let (verdict, kept) = judge(Ok(answered), 30);
    assert_eq!(verdict.reason, ExecutionReason::FinalAnswer);
    let done = final_status(
        &ExecutionStatus::default(),
        Some(1),
        &verdict,
        kept,
        time("02"),
    );
    assert_eq!(done.final_answer, Some(answer));
}

#[test]
fn a_waiting_status_is_written_once() {
    let first = waiting_status(
        &ExecutionStatus::default(),
        Some(1),
        ExecutionReason::Queued,
        "waiting".into(),
    )
    .expect("a first write");
    assert_eq!(first.observed_generation, Some(1));
    assert_eq!(first.conditions[0].reason, "Queued");
    assert_eq!(first.conditions[0].status, "Unknown");
    assert_eq!(
        waiting_status(&first, Some(1), ExecutionReason::Queued, "waiting".into()),
        None
    );
    assert!(
        waiting_status(
            &first,
            Some(1),
            ExecutionReason::ExecutorNotReady,
            "waiting".into()
        )
        .is_some()
    );
}

#[test]
fn a_waiting_status_over_a_recorded_attempt_keeps_it_so_the_code_is_never_sent_again() {
    // Recovery waits (e.g. the executor's key Secret is gone) on an Execution recorded as
    // running: the status it writes must still name the attempt, or the next reconcile would
    // see an Execution that never ran and send its code again.
    let running = running_status(
        &ExecutionStatus::default(),
        Some(1),
        "py",
        "0123456789abcdef".into(),
        time("20"),
    );
    let waiting = waiting_status(
        &running,
        Some(1),
        ExecutionReason::ExecutorNotReady,
        "no key".into(),
    )
    .expect("a new reason is written");
    assert_eq!(waiting.attempt_id.as_deref(), Some("0123456789abcdef"));
    assert_eq!(waiting.start_time, running.start_time);
    assert_eq!(waiting.conditions[0].reason, "ExecutorNotReady");
}
