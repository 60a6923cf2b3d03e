use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;
use crate::{
    bridge::{CodeError, Malformed},
    briq::{self, api::ErrorCode},
};

fn executor(status: serde_json::Value, deleting: bool) -> BriqExecutor {
    let mut metadata = json!({ "name": "py", "namespace": "ns", "uid": "u-py" });
    if deleting {
        metadata["deletionTimestamp"] = json!("2026-12-03T00:00:00Z");
    }
    serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1",
        "kind": "BriqExecutor",
        "metadata": metadata,
        "spec": {},
        "status": status,
    }))
    .unwrap()
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
    json!({
        "type": type_, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": "2026-12-03T00:00:00Z",
    })
}

fn ready() -> BriqExecutor {
    executor(
        json!({ "conditions": [
            condition("Ready", "True", "KernelReady", "the kernel answers"),
            condition("Stalled", "False", "KernelReady", ""),
        ], "sandboxId": "bq_1" }),
        false,
    )
}

fn observed(executor: Option<&BriqExecutor>) -> Observed<'_> {
    Observed {
        executor_name: "py",
        namespace: "ns",
        unwritten_result: false,
        attempt: None,
        now: at("30"),
        adopted: false,
        executor,
        created: Some(at("00")),
        executor_wait: SignedDuration::from_secs(600),
        executor_known_unusable: false,
        heads_queue: true,
        placed: false,
        ahead: 0,
        namespace_queue: None,
    }
}

fn attempt(started: &str, timeout_seconds: u32) -> Attempt {
    Attempt {
        started: Some(at(started)),
        timeout_seconds,
    }
}

fn fail(reason: ExecutionReason, message: &str) -> Step {
    Step::Refuse(Refusal::Fail(Verdict::new(reason, message)))
}

#[test]
fn decide_table() {
    use ExecutionReason::*;
    let ready = ready();
    let mut queue_of_one = ready.clone();
    queue_of_one.spec.max_queued_executions = 1;
    let deleting = executor(json!({}), true);
    let unusable = executor(
        json!({ "unusable": true, "unusableReason": "an Execution ran past its 30s deadline",
                "conditions": [condition("Ready", "True", "KernelReady", "")] }),
        false,
    );
    let setup_failed = executor(
        json!({ "conditions": [
            condition("Ready", "False", "SetupFailed", "pip failed"),
            condition("Stalled", "True", "SetupFailed", "pip failed"),
        ] }),
        false,
    );
    let provisioning = executor(
        json!({ "conditions": [condition("Ready", "Unknown", "Provisioning", "creating the sandbox")] }),
        false,
    );
    let cases: Vec<(&str, Observed, Step)> = vec![
        (
            "an unwritten result comes first",
            Observed {
                unwritten_result: true,
                attempt: Some(attempt("00", 30)),
                ..observed(None)
            },
            Step::WriteResult,
        ),
        (
            "running without a result here, executor usable: its sandbox's journal is asked",
            Observed {
                attempt: Some(attempt("00", 10)),
                ..observed(Some(&ready))
            },
            Step::Recover,
        ),
        (
            "running without a result here, even within its deadline: asking waits for it",
            Observed {
                attempt: Some(attempt("20", 5)),
                ..observed(Some(&ready))
            },
            Step::Recover,
        ),
        (
            "running, executor unusable, past deadline and grace: never sent again",
            Observed {
                attempt: Some(attempt("00", 10)),
                ..observed(Some(&unusable))
            },
            Step::Interrupt,
        ),
        (
            "running, executor being deleted, its runner may still report",
            Observed {
                attempt: Some(attempt("20", 5)),
                ..observed(Some(&deleting))
            },
            Step::AwaitAttempt(Duration::from_secs(10)),
        ),
        (
            "running, executor known unusable here though the cache does not say so yet",
            Observed {
                attempt: Some(attempt("20", 5)),
                executor_known_unusable: true,
                ..observed(Some(&ready))
            },
            Step::AwaitAttempt(Duration::from_secs(10)),
        ),
        (
            "running, executor gone, no start time: nobody can say when it ends",
            Observed {
                attempt: Some(Attempt {
                    started: None,
                    timeout_seconds: 30,
                }),
                ..observed(None)
            },
            Step::Interrupt,
        ),
        (
            "no executor yet",
            observed(None),
            Step::Refuse(Refusal::Wait {
                reason: ExecutorNotFound,
                message: "BriqExecutor py does not exist in namespace ns".into(),
                recheck: Duration::from_secs(10),
            }),
        ),
        (
            "no executor for the whole wait",
            Observed {
                executor_wait: SignedDuration::from_secs(30),
                ..observed(None)
            },
            fail(
                ExecutorNeverAppeared,
                "BriqExecutor py did not appear in namespace ns within 30s; the code did not run",
            ),
        ),
        (
            "a creation time ahead of the operator's clock counts as just created",
            Observed {
                created: Some(at("40")),
                executor_wait: SignedDuration::from_secs(30),
                ..observed(None)
            },
            Step::Refuse(Refusal::Wait {
                reason: ExecutorNotFound,
                message: "BriqExecutor py does not exist in namespace ns".into(),
                recheck: Duration::from_secs(10),
            }),
        ),
        (
            "the executor it was adopted by is gone",
            Observed {
                adopted: true,
                ..observed(None)
            },
            fail(ExecutorDeleted, "BriqExecutor py was deleted"),
        ),
        (
            "executor being deleted",
            observed(Some(&deleting)),
            fail(ExecutorDeleted, "BriqExecutor py is being deleted"),
        ),
        (
            "executor unusable",
            observed(Some(&unusable)),
            fail(
                ExecutorUnusable,
                "BriqExecutor py is unusable (an Execution ran past its 30s deadline); create a new BriqExecutor",
            ),
        ),
        (
            "executor made unusable by this process, the cache does not say so yet",
            Observed {
                executor_known_unusable: true,
                ..observed(Some(&ready))
            },
            fail(
                ExecutorUnusable,
                "BriqExecutor py is unusable (an earlier Execution made it unusable); create a new BriqExecutor",
            ),
        ),
        (
            "executor stalled",
            observed(Some(&setup_failed)),
            fail(
                ExecutorUnusable,
                "BriqExecutor py cannot run code (SetupFailed: pip failed); create a new BriqExecutor",
            ),
        ),
        (
            "executor still provisioning",
            observed(Some(&provisioning)),
            Step::Refuse(Refusal::Wait {
                reason: ExecutorNotReady,
                message: "BriqExecutor py is not ready: creating the sandbox".into(),
                recheck: Duration::from_secs(10),
            }),
        ),
        (
            "behind others",
            Observed {
                heads_queue: false,
                ahead: 1,
                ..observed(Some(&ready))
            },
            Step::Queue,
        ),
        (
            "the last place in a full queue: one runs, 100 wait",
            Observed {
                heads_queue: false,
                ahead: 100,
                ..observed(Some(&ready))
            },
            Step::Queue,
        ),
        (
            "beyond a full queue",
            Observed {
                heads_queue: false,
                ahead: 101,
                ..observed(Some(&ready))
            },
            fail(
                QueueFull,
                "BriqExecutor py already has 100 Executions waiting (maxQueuedExecutions is 100); \
                 this one was not run: create it again once the queue drains",
            ),
        ),
        (
            "beyond a full queue of an executor still provisioning",
            Observed {
                heads_queue: false,
                ahead: 101,
                ..observed(Some(&provisioning))
            },
            fail(
                QueueFull,
                "BriqExecutor py already has 100 Executions waiting (maxQueuedExecutions is 100); \
                 this one was not run: create it again once the queue drains",
            ),
        ),
        (
            "the last place in its namespace's queue under its class",
            Observed {
                namespace_queue: Some(NamespaceQueue {
                    class: "std".into(),
                    max: 3,
                    waiting_before: 2,
                }),
                heads_queue: false,
                ahead: 1,
                ..observed(Some(&ready))
            },
            Step::Queue,
        ),
        (
            "beyond its namespace's queue under its class",
            Observed {
                namespace_queue: Some(NamespaceQueue {
                    class: "std".into(),
                    max: 3,
                    waiting_before: 3,
                }),
                heads_queue: true,
                ..observed(Some(&ready))
            },
            fail(
                QueueFull,
                "namespace ns already has 3 Executions of class std waiting (its \
                 perNamespace.maxQueuedExecutions is 3); this one was not run: create it again \
                 once they drain",
            ),
        ),
        (
            "beyond a queue of one",
            Observed {
                heads_queue: false,
                ahead: 2,
                ..observed(Some(&queue_of_one))
            },
            fail(
                QueueFull,
                "BriqExecutor py already has 1 Executions waiting (maxQueuedExecutions is 1); \
                 this one was not run: create it again once the queue drains",
            ),
        ),
        (
            "queued already in a queue of one, behind one created later that sorts first: \
             keeps its place",
            Observed {
                heads_queue: false,
                placed: true,
                ahead: 2,
                ..observed(Some(&queue_of_one))
            },
            Step::Queue,
        ),
        (
            "queued already in its namespace's full queue under its class: keeps its place",
            Observed {
                namespace_queue: Some(NamespaceQueue {
                    class: "std".into(),
                    max: 3,
                    waiting_before: 3,
                }),
                heads_queue: false,
                placed: true,
                ahead: 1,
                ..observed(Some(&ready))
            },
            Step::Queue,
        ),
        (
            "behind the running one in a queue of one",
            Observed {
                heads_queue: false,
                ahead: 1,
                ..observed(Some(&queue_of_one))
            },
            Step::Queue,
        ),
        (
            "no executor to count against yet",
            Observed {
                heads_queue: false,
                ahead: 500,
                ..observed(None)
            },
            Step::Refuse(Refusal::Wait {
                reason: ExecutorNotFound,
                message: "BriqExecutor py does not exist in namespace ns".into(),
                recheck: Duration::from_secs(10),
            }),
        ),
        (
            "head of the queue",
            observed(Some(&ready)),
            Step::ConfirmTurn,
        ),
    ];
    for (name, observed, expected) in cases {
        assert_eq!(decide(&observed), expected, "{name}");
    }
}

fn at(seconds: &str) -> Timestamp {
    format!("2026-12-03T00:00:{seconds}Z").parse().unwrap()
}

fn order(seconds: &str, name: &str) -> RunOrder {
    (Some(at(seconds)), name.to_owned())
}

fn sibling(uid: &str, seconds: &str, name: &str, done: bool) -> Sibling {
    Sibling {
        uid: Some(uid.into()),
        order: order(seconds, name),
        done,
    }
}

#[test]
fn turn_table() {
    let me = order("10", "b");
    let myself = sibling("me", "10", "b", false);
    let cases: Vec<(&str, Vec<Sibling>, Timestamp, Turn)> = vec![
        ("alone", vec![myself.clone()], at("20"), Turn::Mine),
        (
            "an older one waits",
            vec![sibling("x", "09", "z", false), myself.clone()],
            at("20"),
            Turn::Behind,
        ),
        (
            "an older one finished",
            vec![sibling("x", "09", "z", true), myself.clone()],
            at("20"),
            Turn::Mine,
        ),
        (
            "same second, sorts first by name",
            vec![sibling("x", "10", "a", false)],
            at("20"),
            Turn::Behind,
        ),
        (
            "same second, sorts after: the second settles first",
            vec![sibling("x", "10", "c", false)],
            at("11"),
            Turn::Settling(Duration::from_secs(1)),
        ),
        (
            "same second, settled",
            vec![sibling("x", "10", "c", false)],
            at("12"),
            Turn::Mine,
        ),
        (
            "a later second does not hold it back",
            vec![sibling("x", "11", "a", false)],
            at("10"),
            Turn::Mine,
        ),
        (
            "a listed sibling without a creation time sorts first",
            vec![Sibling {
                uid: Some("x".into()),
                order: (None, "z".into()),
                done: false,
            }],
            at("20"),
            Turn::Behind,
        ),
    ];
    for (name, siblings, now, expected) in cases {
        assert_eq!(turn(Some("me"), &me, &siblings, now), expected, "{name}");
    }
}

#[test]
fn turn_from_cache_table() {
    let settling = Turn::Settling(Duration::from_secs(1));
    let cases = [
        (
            "its turn, the cache current: no LIST",
            Turn::Mine,
            true,
            Some(Turn::Mine),
        ),
        (
            "its turn, the cache listing or its watch failed: LIST",
            Turn::Mine,
            false,
            None,
        ),
        ("one before it", Turn::Behind, true, Some(Turn::Behind)),
        (
            "one before it, even in a lagging cache",
            Turn::Behind,
            false,
            Some(Turn::Behind),
        ),
        (
            "a burst settling",
            settling.clone(),
            true,
            Some(settling.clone()),
        ),
        (
            "a burst settling, in a lagging cache",
            settling.clone(),
            false,
            Some(settling),
        ),
    ];
    for (name, cached, current, expected) in cases {
        assert_eq!(turn_from_cache(cached, current), expected, "{name}");
    }
}

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

fn result(status: RunStatus, error: Option<(&str, &str)>) -> RunResult {
    RunResult {
        status,
        logs: "hi\n".into(),
        output: Some("2".into()),
        truncated: false,
        final_answer: None,
        error: error.map(|(name, message)| CodeError {
            name: name.into(),
            message: message.into(),
            traceback: "Traceback …".into(),
        }),
        display_dropped: 0,
        duration_ms: 7,
    }
}

fn briq_error(status: u16, code: ErrorCode) -> briq::Error {
    briq::Error::Rejected {
        status,
        code,
        message: "no".into(),
        request_id: None,
    }
}

fn unavailable(status: u16) -> briq::Error {
    briq::Error::Unavailable {
        status,
        code: ErrorCode::Unavailable,
        message: "bad gateway".into(),
        retry_after: None,
        request_id: Some("req_1".into()),
    }
}

fn not_found() -> briq::Error {
    briq::Error::NotFound {
        message: "gone".into(),
        request_id: None,
    }
}

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

fn time(seconds: &str) -> Time {
    Time(at(seconds))
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
fn expiry_table() {
    let done = Some(at("10"));
    let table = [
        ("no time to live", done, None, "10", Expiry::Keep),
        (
            "not recorded as completed yet",
            None,
            Some(5),
            "30",
            Expiry::Keep,
        ),
        (
            "before its time",
            done,
            Some(5),
            "12",
            Expiry::DeleteAfter(Duration::from_secs(3)),
        ),
        ("at its time", done, Some(5), "15", Expiry::DeleteNow),
        ("past its time", done, Some(5), "50", Expiry::DeleteNow),
        ("zero: at once", done, Some(0), "10", Expiry::DeleteNow),
        (
            "the longest",
            done,
            Some(i32::MAX as u32),
            "10",
            Expiry::DeleteAfter(Duration::from_secs(i32::MAX as u64)),
        ),
    ];
    for (name, completed, ttl, now, expected) in table {
        assert_eq!(expiry(completed, ttl, at(now)), expected, "{name}");
    }
}

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

/// Which failed runs are left to the journal (`true`) rather than judged: every failure of briq
/// to answer; not a missing sandbox, a refusal for good, or the bridge's own failures.
#[test]
fn a_run_briq_did_not_answer_is_left_to_the_journal() {
    let cases: Vec<(CallError, bool)> = vec![
        (CallError::Briq(unavailable(500)), true),
        (CallError::Briq(unavailable(502)), true),
        (CallError::Briq(unavailable(503)), true),
        (CallError::Briq(unavailable(504)), true),
        (CallError::Briq(unavailable(429)), true),
        (
            CallError::Briq(briq::Error::Malformed {
                detail: "not JSON".into(),
                request_id: None,
            }),
            true,
        ),
        (
            CallError::Briq(briq_error(402, ErrorCode::PaymentRequired)),
            true,
        ),
        (CallError::ResultUnreadable(unavailable(503)), true),
        (CallError::ResultUnreadable(not_found()), true),
        (CallError::Briq(not_found()), false),
        (
            CallError::Briq(briq_error(400, ErrorCode::InvalidRequest)),
            false,
        ),
        (CallError::Briq(briq_error(409, ErrorCode::Other)), false),
        (CallError::TimedOut(Duration::from_secs(35)), false),
        (CallError::Malformed(Malformed::Repeated), false),
        (CallError::UnexpectedKind("setup"), false),
    ];
    for (error, to_journal) in cases {
        let shown = format!("{error:?}");
        let judged = ran(Err(error), 30);
        assert_eq!(judged.is_err(), to_journal, "{shown}");
    }
    let (verdict, kept) = ran(Ok(result(RunStatus::Ok, None)), 30).unwrap();
    assert_eq!(verdict.reason, ExecutionReason::Completed);
    assert!(kept.is_some());
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
