use std::time::Duration;

use serde_json::json;

use super::*;

#[test]
fn deleting_a_thousand_objects_leaves_nothing_behind() {
    let kept = Bookkeeping::default();
    for i in 0..1_000 {
        let (executor, execution) = (format!("executor-{i}"), format!("execution-{i}"));
        drop(kept.lock(&executor));
        kept.made_unusable(&executor);
        kept.count_execution(&executor, "ns", "name", 7);
        kept.confirmed_owner(&executor, &format!("bq_{i}"));
        kept.finished(&execution);
        kept.keep_unwritten(&execution, ExecutionStatus::default());
        kept.wrote_waiting(&execution, ExecutionStatus::default());
    }
    assert_eq!(kept.len(), 7_000);
    for i in 0..1_000 {
        kept.execution_deleted(&format!("execution-{i}"));
        kept.executor_deleted(&format!("executor-{i}"));
    }
    // A run still waiting on a deleted Execution hears its cancel until the next sweep.
    assert_eq!(kept.len(), 1_000);
    kept.retain(|_| false, |_| false);
    assert_eq!(kept.len(), 0);
}

#[test]
fn entries_added_after_a_deletion_go_at_the_next_sweep() {
    let kept = Bookkeeping::default();
    drop(kept.lock("live-executor"));
    drop(kept.lock("gone-executor"));
    kept.confirmed_owner("gone-executor", "bq_1");
    kept.finished("live-execution");
    kept.keep_unwritten("gone-execution", ExecutionStatus::default());
    kept.retain(|uid| uid == "live-execution", |uid| uid == "live-executor");
    assert_eq!(kept.len(), 2);
    assert!(kept.is_finished("live-execution", false));
}

#[test]
fn counts_continue_from_the_recorded_total() {
    let kept = Bookkeeping::default();
    assert_eq!(kept.count_execution("a", "ns", "x", 41), 42);
    assert_eq!(
        kept.count_execution("a", "ns", "x", 0),
        43,
        "this process's count wins"
    );
    kept.executor_deleted("a");
    assert_eq!(kept.count_execution("a", "ns", "x", 0), 1);
}

fn totals(unwritten: &[UnwrittenCount]) -> Vec<(&str, u64)> {
    let mut totals: Vec<_> = unwritten
        .iter()
        .map(|count| (count.executor_uid.as_str(), count.total))
        .collect();
    totals.sort();
    totals
}

#[test]
fn many_executions_make_one_count_write_per_executor() {
    let kept = Bookkeeping::default();
    for _ in 0..10 {
        kept.count_execution("a", "ns", "x", 0);
    }
    kept.count_execution("b", "ns", "y", 5);
    assert_eq!(totals(&kept.take_unwritten_counts()), [("a", 10), ("b", 6)]);
    assert!(
        kept.take_unwritten_counts().is_empty(),
        "each is taken once"
    );
}

#[test]
fn a_failed_count_write_is_retried_unless_a_newer_count_came() {
    let kept = Bookkeeping::default();
    kept.count_execution("a", "ns", "x", 0);
    kept.count_execution("b", "ns", "y", 0);
    let failed = kept.take_unwritten_counts();
    kept.count_execution("a", "ns", "x", 0);
    for count in failed {
        kept.unwritten_count(count);
    }
    assert_eq!(totals(&kept.take_unwritten_counts()), [("a", 2), ("b", 1)]);
}

#[test]
fn a_deleted_executors_count_is_never_written() {
    let kept = Bookkeeping::default();
    kept.count_execution("a", "ns", "x", 0);
    let failed = kept.take_unwritten_counts();
    kept.count_execution("b", "ns", "y", 0);
    kept.executor_deleted("a");
    kept.executor_deleted("b");
    for count in failed {
        kept.unwritten_count(count);
    }
    assert!(kept.take_unwritten_counts().is_empty());
}

#[test]
fn a_waiting_status_is_remembered_until_the_execution_runs_finishes_or_goes() {
    let kept = Bookkeeping::default();
    for uid in ["runs", "finishes", "goes"] {
        kept.wrote_waiting(uid, ExecutionStatus::default());
    }
    assert!(kept.waiting_written("runs").is_some());
    kept.forget_waiting("runs");
    kept.finished("finishes");
    kept.execution_deleted("goes");
    for uid in ["runs", "finishes", "goes"] {
        assert_eq!(kept.waiting_written(uid), None, "{uid}");
    }
}

#[test]
fn a_finished_entry_lasts_until_the_cache_catches_up() {
    let kept = Bookkeeping::default();
    assert!(!kept.is_finished("x", false));
    kept.finished("x");
    assert!(kept.is_finished("x", false));
    assert!(kept.is_finished("x", true));
    assert_eq!(kept.len(), 0);
}

fn execution(uid: &str, code: &str, status: serde_json::Value) -> Execution {
    serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1",
        "kind": "Execution",
        "metadata": { "name": uid, "namespace": "ns", "uid": uid },
        "spec": { "executorRef": { "name": "py" }, "code": code },
        "status": status,
    }))
    .unwrap()
}

fn running() -> serde_json::Value {
    json!({ "attemptId": "00112233445566778899aabbccddeeff" })
}

#[test]
fn the_code_of_an_execution_not_sent_is_kept_until_it_is_sent() {
    let codes = Bookkeeping::with_code_budget(100);
    codes.heard(&execution("a", "x = 1", json!({})));
    assert_eq!(codes.code("a").as_deref(), Some("x = 1"));
    codes.heard(&execution("a", "x = 1", running()));
    assert_eq!(codes.code("a"), None, "sent: the code is not needed again");
    assert_eq!(codes.code_bytes(), 0);
}

#[test]
fn beyond_the_budget_nothing_more_is_kept() {
    let codes = Bookkeeping::with_code_budget(10);
    codes.heard(&execution("a", "123456", json!({})));
    codes.heard(&execution("b", "123456", json!({})));
    assert_eq!(
        codes.code("b"),
        None,
        "over the budget: read back by the Running write"
    );
    codes.heard(&execution("a", "123456", json!({})));
    assert_eq!(codes.code_bytes(), 6, "heard again, counted once");
    codes.heard(&execution("a", "123456", running()));
    codes.heard(&execution("b", "123456", json!({})));
    assert_eq!(codes.code("b").as_deref(), Some("123456"));
}

#[test]
fn finished_and_gone_executions_keep_no_code() {
    let codes = Bookkeeping::with_code_budget(100);
    codes.heard(&execution("a", "1", json!({})));
    codes.heard(&execution("b", "2", json!({})));
    let done = json!({ "conditions": [{
        "type": "Succeeded", "status": "True", "reason": "Completed", "message": "",
        "lastTransitionTime": "2026-12-04T00:00:00Z",
    }] });
    codes.heard(&execution("a", "1", done));
    assert_eq!(codes.code("a"), None);
    codes.retain(|uid| uid != "b", |_| true);
    assert_eq!((codes.code("b"), codes.code_bytes()), (None, 0));
}

fn cancelling(uid: &str, cancel: bool) -> Execution {
    serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "Execution",
        "metadata": { "name": "x", "namespace": "ns", "uid": uid },
        "spec": { "executorRef": { "name": "py" }, "code": "1", "cancel": cancel },
    }))
    .unwrap()
}

#[tokio::test]
async fn a_cancel_heard_before_the_run_waits_is_not_lost() {
    let kept = Bookkeeping::default();
    kept.heard(&cancelling("u1", true));
    kept.heard(&cancelling("u2", false));
    tokio::time::timeout(Duration::from_secs(1), kept.cancel_requested("u1"))
        .await
        .expect("heard before the wait began");
    let not_cancelled =
        tokio::time::timeout(Duration::from_millis(10), kept.cancel_requested("u2"));
    assert!(
        not_cancelled.await.is_err(),
        "not cancelled: the run goes on"
    );
}

#[tokio::test]
async fn a_cancel_heard_while_the_run_waits_wakes_it() {
    let kept = Arc::new(Bookkeeping::default());
    let waiting = tokio::spawn({
        let kept = kept.clone();
        async move { kept.cancel_requested("u1").await }
    });
    tokio::task::yield_now().await;
    kept.request_cancel("u1");
    tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .expect("woken")
        .unwrap();
    kept.retain(|_| false, |_| true);
    assert_eq!(kept.len(), 0);
}

fn uids(items: &[&str]) -> HashSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn two_turns_at_once_never_both_take_the_last_place() {
    let kept = Bookkeeping::default();
    let running = uids(&["r1"]);
    let the_cache_shows_none = |_: &str| false;
    assert!(kept.take_place("team", "a", 2, &running, the_cache_shows_none));
    // The cache does not show `a` running yet: it still counts.
    assert!(!kept.take_place("team", "b", 2, &running, the_cache_shows_none));
    // Another namespace has places of its own.
    assert!(kept.take_place("other", "c", 2, &running, the_cache_shows_none));
    // Asking again, `a` keeps its place.
    assert!(kept.take_place("team", "a", 2, &running, the_cache_shows_none));
}

#[test]
fn a_start_the_cache_shows_counts_once_and_an_end_frees_its_place() {
    let kept = Bookkeeping::default();
    let none = uids(&[]);
    assert!(kept.take_place("team", "a", 1, &none, |_| false));
    // Now running in the cache: counted there, not twice.
    let running = uids(&["a"]);
    assert!(!kept.take_place("team", "b", 1, &running, |_| false));
    // `a` finished: the cache shows it, and the cache no longer shows it running.
    assert!(kept.take_place("team", "b", 1, &none, |uid| uid == "a"));
}

/// The execution controller asks whether the cache shows a start through the bookkeeping
/// itself (`Context::is_finished`): the place is decided without a lock held while it asks.
#[test]
fn a_place_is_decided_while_the_cache_check_reads_the_bookkeeping() {
    let kept = Arc::new(Bookkeeping::default());
    let (decided, decision) = std::sync::mpsc::channel();
    std::thread::spawn({
        let kept = kept.clone();
        move || {
            let none = uids(&[]);
            let finished = |uid: &str| kept.is_finished(uid, false);
            assert!(kept.take_place("team", "a", 2, &none, finished));
            // `a` is starting: deciding `b` asks whether `a` finished.
            let allowed = kept.take_place("team", "b", 2, &none, finished);
            decided.send(allowed).expect("the test waits");
        }
    });
    let allowed = decision
        .recv_timeout(Duration::from_secs(10))
        .expect("decided, not deadlocked on the bookkeeping's lock");
    assert!(allowed, "two places, two starts");
}

#[test]
fn those_waiting_in_a_namespace_look_again_when_one_there_ends() {
    let kept = Bookkeeping::default();
    kept.wait_for_place("w1", ObjectRef::new("w1").within("team"));
    kept.wait_for_place("w2", ObjectRef::new("w2").within("team"));
    kept.wait_for_place("o1", ObjectRef::new("o1").within("other"));
    let mut woken: Vec<String> = kept
        .place_freed("team", "x")
        .into_iter()
        .map(|r| r.name)
        .collect();
    woken.sort();
    assert_eq!(woken, vec!["w1", "w2"]);
    assert!(kept.place_freed("team", "y").is_empty());
    assert_eq!(kept.len(), 1, "other's waiter stays");
}
