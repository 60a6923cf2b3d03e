use std::time::Duration;

use k8s_openapi::jiff::SignedDuration;
use serde_json::json;

use super::*;
use crate::{
    controller::execution::{
        end::Verdict,
        fixtures::{at, attempt},
        turn::NamespaceQueue,
    },
    controller::recheck::TURN,
    crd::{FINALIZER, reasons::ExecutionReason},
};

fn executor(status: serde_json::Value, deleting: bool) -> BriqExecutor {
    // Every executor the operator runs code in holds its finalizer.
    let mut metadata = json!({
        "name": "py", "namespace": "ns", "uid": "u-py", "finalizers": [FINALIZER],
    });
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
        cancel: false,
        attempt: None,
        now: at("30"),
        adopted: false,
        executor,
        created: Some(at("00")),
        executor_wait: SignedDuration::from_secs(600),
        executor_known_unusable: false,
        turn: Some(Turn::Mine),
        cache_current: true,
        placed: false,
        ahead: 0,
        namespace_queue: None,
    }
}

fn fail(reason: ExecutionReason, message: &str) -> Step {
    Step::Refuse(Refusal::Fail(Verdict::new(reason, message)))
}

#[test]
fn decide_table() {
    use ExecutionReason::*;
    let ready = ready();
    let mut unsettled_claimer = ready.clone();
    unsettled_claimer.metadata.finalizers = None;
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
            "cancelled while running here before a restart, executor usable: its journal cancels it",
            Observed {
                cancel: true,
                attempt: Some(attempt("20", 30)),
                ..observed(Some(&ready))
            },
            Step::Cancel,
        ),
        (
            "cancelled while running, executor unusable: the attempt is waited for as any other",
            Observed {
                cancel: true,
                attempt: Some(attempt("20", 5)),
                ..observed(Some(&unusable))
            },
            Step::AwaitAttempt(Duration::from_secs(10)),
        ),
        (
            "cancelled while queued behind another: its sandbox's journal claims the attempt",
            Observed {
                cancel: true,
                turn: Some(Turn::Behind),
                ..observed(Some(&ready))
            },
            Step::Cancel,
        ),
        (
            "cancelled with a result unwritten: the result it ended with is written",
            Observed {
                cancel: true,
                unwritten_result: true,
                ..observed(Some(&ready))
            },
            Step::WriteResult,
        ),
        (
            "cancelled before its executor exists: nothing could have run it",
            Observed {
                cancel: true,
                ..observed(None)
            },
            Step::CancelUnsent,
        ),
        (
            "cancelled, executor provisioning without a sandbox yet",
            Observed {
                cancel: true,
                ..observed(Some(&provisioning))
            },
            Step::CancelUnsent,
        ),
        (
            "cancelled, executor unusable: its sandbox takes no more code",
            Observed {
                cancel: true,
                ..observed(Some(&unusable))
            },
            Step::CancelUnsent,
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
            "a claimer Ready with its claim's record, before the write that gives it its finalizer",
            observed(Some(&unsettled_claimer)),
            Step::Refuse(Refusal::Wait {
                reason: ExecutorNotReady,
                message: "BriqExecutor py is not ready: it does not hold its finalizer yet, which \
                          makes its deletion wait for its Executions"
                    .into(),
                recheck: Duration::from_secs(10),
            }),
        ),
        (
            "behind others",
            Observed {
                turn: Some(Turn::Behind),
                ahead: 1,
                ..observed(Some(&ready))
            },
            Step::Queue(TURN),
        ),
        (
            "the last place in a full queue: one runs, 100 wait",
            Observed {
                turn: Some(Turn::Behind),
                ahead: 100,
                ..observed(Some(&ready))
            },
            Step::Queue(TURN),
        ),
        (
            "beyond a full queue",
            Observed {
                turn: Some(Turn::Behind),
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
                turn: Some(Turn::Behind),
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
                turn: Some(Turn::Behind),
                ahead: 1,
                ..observed(Some(&ready))
            },
            Step::Queue(TURN),
        ),
        (
            "beyond its namespace's queue under its class",
            Observed {
                namespace_queue: Some(NamespaceQueue {
                    class: "std".into(),
                    max: 3,
                    waiting_before: 3,
                }),
                turn: Some(Turn::Mine),
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
                turn: Some(Turn::Behind),
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
                turn: Some(Turn::Behind),
                placed: true,
                ahead: 2,
                ..observed(Some(&queue_of_one))
            },
            Step::Queue(TURN),
        ),
        (
            "queued already in its namespace's full queue under its class: keeps its place",
            Observed {
                namespace_queue: Some(NamespaceQueue {
                    class: "std".into(),
                    max: 3,
                    waiting_before: 3,
                }),
                turn: Some(Turn::Behind),
                placed: true,
                ahead: 1,
                ..observed(Some(&ready))
            },
            Step::Queue(TURN),
        ),
        (
            "behind the running one in a queue of one",
            Observed {
                turn: Some(Turn::Behind),
                ahead: 1,
                ..observed(Some(&queue_of_one))
            },
            Step::Queue(TURN),
        ),
        (
            "no executor to count against yet",
            Observed {
                turn: Some(Turn::Behind),
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
            Step::TakeTurn { confirm: false },
        ),
    ];
    for (name, observed, expected) in cases {
        assert_eq!(decide(&observed), expected, "{name}");
    }
}

/// The turn as the cache shows it decides, except that the head of a lagging cache (listing,
/// or its watch failed) confirms it with a LIST first: the cache never invents a sibling, so
/// its "wait" always stands.
#[test]
fn the_turn_is_decided_from_the_cache_and_confirmed_only_while_it_lags() {
    let ready = ready();
    let arriving = Turn::BurstArriving(Duration::from_secs(1));
    let cases = [
        (
            "its turn, the cache current: no LIST",
            Some(Turn::Mine),
            true,
            Step::TakeTurn { confirm: false },
        ),
        (
            "its turn, the cache listing or its watch failed: LIST",
            Some(Turn::Mine),
            false,
            Step::TakeTurn { confirm: true },
        ),
        ("one before it", Some(Turn::Behind), true, Step::Queue(TURN)),
        (
            "one before it, even in a lagging cache",
            Some(Turn::Behind),
            false,
            Step::Queue(TURN),
        ),
        (
            "a burst still arriving",
            Some(arriving.clone()),
            true,
            Step::Queue(Duration::from_secs(1)),
        ),
        (
            "a burst still arriving, in a lagging cache",
            Some(arriving),
            false,
            Step::Queue(Duration::from_secs(1)),
        ),
        (
            "not in the cache yet: it waits for its own event",
            None,
            true,
            Step::Queue(TURN),
        ),
    ];
    for (name, turn, cache_current, expected) in cases {
        let observed = Observed {
            turn,
            cache_current,
            ..observed(Some(&ready))
        };
        assert_eq!(decide(&observed), expected, "{name}");
    }
}

/// The API calls of one Execution's happy path, from its creation to its result, as the pure
/// parts that decide them say: created by the Python client (which names the executor as its
/// owner) at the head of its queue, the executor Ready, the cache current, its code at hand.
#[test]
fn one_executions_happy_path_is_one_send_and_one_status_write() {
    use crate::controller::execution::{
        end::ending,
        send::{Recording, send},
        turn::owners_with,
    };
    let ready = ready();
    // Judged from the caches, its turn too while the cache is current: no read, no LIST.
    let observed = Observed {
        adopted: true,
        ..observed(Some(&ready))
    };
    assert_eq!(decide(&observed), Step::TakeTurn { confirm: false });
    // The owner its creator set: no owner write.
    let owned_by_its_creator = [crate::crd::history_owner(&ready).unwrap()];
    assert_eq!(owners_with(&owned_by_its_creator, &ready, "u-py"), None);
    let completed = Verdict::new(ExecutionReason::Completed, "the code ran");
    // The send: the code at hand goes at once, under the attempt id derived from the uid;
    // Running is written beside it only once the action outlasts 100 ms.
    let now = crate::crd::conditions::now();
    let uid = "0e1a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8";
    let code: std::sync::Arc<str> = "1 + 1".into();
    let nothing_yet = crate::crd::ExecutionStatus::default();
    let with_code = send(
        uid,
        &nothing_yet,
        Some(1),
        "py",
        Some(code.clone()),
        30,
        now.clone(),
    );
    let attempt = "0e1a2b3c4d5e6f708192a3b4c5d6e7f8";
    assert_eq!(
        (
            with_code.attempt.as_str(),
            &with_code.recording,
            with_code.timeout
        ),
        (
            attempt,
            &Recording::Beside {
                code,
                after: Duration::from_millis(100)
            },
            30
        )
    );
    let running = with_code.running;
    assert_eq!(
        (
            running.attempt_id.as_deref(),
            &running.start_time,
            running.conditions[0].reason.as_str()
        ),
        (Some(attempt), &Some(now.clone()), "Running")
    );
    // After the send: one status write, the result, with the attempt Running recorded folded
    // into it (an action shorter than 100 ms has no Running write of its own); the execution
    // counted on the executor, nothing marked, no history to prune.
    let ended =
        |verdict: &Verdict| ending(&running, Some(1), verdict, None, now.clone(), true, None);
    let done = ended(&completed);
    assert_eq!(
        (&done.mark_unusable, done.count, done.prune_history),
        (&None, true, false)
    );
    assert_eq!(
        (done.status.attempt_id.as_deref(), &done.status.start_time),
        (Some(attempt), &Some(now.clone()))
    );
    // The code not at hand (the cache drops it past its budget): Running first brings it back.
    let without_code = send(uid, &nothing_yet, Some(1), "py", None, 30, now.clone());
    assert_eq!(without_code.recording, Recording::First);
    // Off the happy path: a lost kernel marks the executor unusable before the result.
    let lost = Verdict::new(ExecutionReason::KernelLost, "the kernel died").poisons("lost");
    let lost = ended(&lost);
    assert_eq!(
        (lost.mark_unusable.as_deref(), lost.count),
        (Some("lost"), true)
    );
    // Not created by a client that names the owner: one owner write before the turn.
    assert_eq!(owners_with(&[], &ready, "u-py").map(|o| o.len()), Some(1));
}
