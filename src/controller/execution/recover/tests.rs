use super::*;
use crate::{
    bridge::{Malformed, RunStatus},
    briq::api::ErrorCode,
    controller::execution::fixtures::{at, attempt, briq_error, not_found, result, unavailable},
};

/// What the journal's answer about a lost attempt leads to: (answer, expected).
#[test]
fn recovered_table() {
    use ExecutionReason::*;
    // (reason, poisons, keeps the result) of a judged answer; None: resend or ask again.
    type Expected = Result<Option<(ExecutionReason, bool, bool)>, &'static str>;
    let cases: Vec<(Result<Option<RunResult>, CallError>, Expected)> = vec![
        (Ok(None), Err("resend")),
        (
            Ok(Some(result(RunStatus::Ok, None))),
            Ok(Some((Completed, false, true))),
        ),
        (
            Ok(Some(result(RunStatus::Error, Some(("ValueError", "x"))))),
            Ok(Some((CodeError, false, true))),
        ),
        (
            Ok(Some(result(RunStatus::Timeout, None))),
            Ok(Some((Timeout, true, true))),
        ),
        (
            Ok(Some(result(RunStatus::KernelLost, None))),
            Ok(Some((KernelLost, true, true))),
        ),
        // Accepted, no result and no way to know: it may have run.
        (
            Err(CallError::Malformed(Malformed::Missing)),
            Ok(Some((Interrupted, true, false))),
        ),
        (
            Err(CallError::TimedOut(Duration::from_secs(34))),
            Ok(Some((Interrupted, true, false))),
        ),
        // The question itself failed: asking runs nothing, so ask again.
        (Err(CallError::Briq(unavailable(502))), Err("ask again")),
        (
            Err(CallError::Briq(briq_error(429, ErrorCode::RateLimited))),
            Err("ask again"),
        ),
        (
            Err(CallError::ResultUnreadable(unavailable(503))),
            Err("ask again"),
        ),
        // The sandbox is gone, and its kernel with it.
        (
            Err(CallError::Briq(not_found())),
            Ok(Some((KernelLost, true, false))),
        ),
    ];
    for (answer, expected) in cases {
        let shown = format!("{answer:?}");
        let got = match recovered(answer, 30) {
            Recovered::Resend => Err("resend"),
            Recovered::AskAgain(_) => Err("ask again"),
            Recovered::Judge(judged) => {
                let (verdict, result) = *judged;
                Ok(Some((
                    verdict.reason,
                    verdict.unusable.is_some(),
                    result.is_some(),
                )))
            }
        };
        assert_eq!(got, expected, "{shown}");
    }
}

#[test]
fn patience_runs_from_the_attempts_deadline() {
    let patience = Duration::from_secs(600);
    let s = Duration::from_secs;
    // (started, timeout, now, left)
    let table = [
        ("00", 30, "10", Some(s(635))),
        ("00", 5, "20", Some(s(600))),
        ("00", 1, "16", Some(s(600))),
    ];
    for (started, timeout, now, left) in table {
        assert_eq!(
            patience_left(&attempt(started, timeout), patience, at(now)),
            left,
            "{started} {timeout} {now}"
        );
    }
    let long_ago: Timestamp = "2026-12-02T23:49:00Z".parse().unwrap();
    let over = Attempt {
        started: Some(long_ago),
        timeout_seconds: 30,
    };
    assert_eq!(patience_left(&over, patience, at("00")), None);
    let unstarted = Attempt {
        started: None,
        timeout_seconds: 30,
    };
    assert_eq!(
        patience_left(&unstarted, patience, at("00")),
        Some(patience)
    );
}

#[test]
fn an_outcome_briq_never_told_poisons_and_says_it_may_have_run() {
    let verdict =
        outcome_stayed_unknown(&CallError::Briq(unavailable(503)), Duration::from_secs(600));
    assert_eq!(verdict.reason, ExecutionReason::TransportError);
    assert_eq!(
        verdict.message,
        "the outcome stayed unknown: briq did not answer whether the code ran within 600s beyond \
         its deadline (last: briq is unavailable (HTTP 503, unavailable): bad gateway (request id \
         req_1)); it may have run, and the executor is now unusable"
    );
    assert!(verdict.unusable.is_some());
    assert_eq!(
        waiting_for_briq_message(&CallError::Briq(unavailable(502)), Some(at("30"))),
        "briq did not answer whether the code ran (briq is unavailable (HTTP 502, unavailable): \
         bad gateway (request id req_1)); the sandbox's attempt journal will be asked once briq \
         answers again until 2026-12-03T00:00:30Z, and the code is never sent twice"
    );
}
