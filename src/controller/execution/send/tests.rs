use super::*;
use crate::controller::execution::fixtures::{briq_error, not_found, result, unavailable};
use crate::{
    bridge::{Malformed, RunStatus},
    briq::{self, api::ErrorCode},
};

#[test]
fn attempt_id_table() {
    let cases = [
        (
            "a Kubernetes uid: its digits",
            "0E1A2B3C-4D5E-6F70-8192-A3B4C5D6E7F8",
            "0e1a2b3c4d5e6f708192a3b4c5d6e7f8",
        ),
        (
            "any other shape: its hash",
            "not-a-uid",
            "911377bb4df2f3bbaec3f31dc8fed879",
        ),
    ];
    for (name, uid, expected) in cases {
        assert_eq!(attempt_id(uid), expected, "{name}");
    }
}

#[test]
fn timeout_table() {
    for (own, default, class_max, expected) in [
        (None, 30, None, 30),
        (Some(5), 30, None, 5),
        (Some(40), 30, None, 40),
        (Some(0), 30, None, 1),
        (Some(400), 30, None, 40),
        (None, 99, None, 40),
        // An Execution cannot ask past its class's maximum.
        (Some(40), 10, Some(10), 10),
        (None, 10, Some(10), 10),
        (Some(5), 10, Some(10), 5),
    ] {
        assert_eq!(
            timeout_seconds(own, default, class_max),
            expected,
            "{own:?} {default} {class_max:?}"
        );
    }
}

/// How each failed call is classified, and which failed runs are left to the journal rather
/// than judged: every failure of briq to answer; not a missing sandbox, a refusal for good, or
/// the bridge's own failures.
#[test]
fn a_run_briq_did_not_answer_is_left_to_the_journal() {
    use Failure::*;
    let cases: Vec<(CallError, Failure)> = vec![
        (CallError::Briq(unavailable(500)), BriqUnanswered),
        (CallError::Briq(unavailable(502)), BriqUnanswered),
        (CallError::Briq(unavailable(503)), BriqUnanswered),
        (CallError::Briq(unavailable(504)), BriqUnanswered),
        (CallError::Briq(unavailable(429)), BriqUnanswered),
        (
            CallError::Briq(briq::Error::Malformed {
                detail: "not JSON".into(),
                request_id: None,
            }),
            BriqUnanswered,
        ),
        (
            CallError::Briq(briq_error(402, ErrorCode::PaymentRequired)),
            BriqUnanswered,
        ),
        (
            CallError::ResultUnreadable(unavailable(503)),
            BriqUnanswered,
        ),
        (CallError::ResultUnreadable(not_found()), BriqUnanswered),
        (CallError::Briq(not_found()), SandboxGone),
        (
            CallError::Briq(briq_error(400, ErrorCode::InvalidRequest)),
            Refused,
        ),
        (CallError::Briq(briq_error(409, ErrorCode::Other)), Refused),
        (
            CallError::TimedOut(Duration::from_secs(35)),
            BridgeUnreadable,
        ),
        (CallError::Malformed(Malformed::Repeated), BridgeUnreadable),
        (CallError::UnexpectedKind("setup"), BridgeUnreadable),
    ];
    for (error, class) in cases {
        let shown = format!("{error:?}");
        assert_eq!(failure(&error), class, "{shown}");
        let judged = ran(Err(error), 30);
        assert_eq!(judged.is_err(), class == BriqUnanswered, "{shown}");
    }
    let (verdict, kept) = ran(Ok(result(RunStatus::Ok, None)), 30).unwrap();
    assert_eq!(verdict.reason, ExecutionReason::Completed);
    assert!(kept.is_some());
}

#[test]
fn code_is_sent_only_to_a_sandbox_briq_confirms_as_the_executors_own() {
    assert_eq!(ownership_verdict("bq_1", &Ownership::Owned), None);
    let foreign = ownership_verdict("bq_victim", &Ownership::Foreign).unwrap();
    assert_eq!(foreign.reason, ExecutionReason::SandboxNotOwned);
    assert_eq!(
        foreign.unusable, None,
        "the executor's own sandbox is untouched"
    );
    assert!(foreign.message.contains("bq_victim") && foreign.message.contains("not sent"));
    let gone = ownership_verdict("bq_1", &Ownership::Gone).unwrap();
    assert_eq!(gone.reason, ExecutionReason::KernelLost);
    assert!(gone.unusable.is_some());
}
