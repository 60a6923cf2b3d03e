use std::sync::{Arc, Mutex};

use futures::{StreamExt, stream};
use kube::runtime::reflector;
use serde_json::json;

use super::*;
use crate::crd::CLAIMED_MEMBER_ANNOTATION;

fn executor(name: &str, ready: &str, annotations: serde_json::Value) -> BriqExecutor {
    serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
        "metadata": { "name": name, "namespace": "team", "uid": format!("uid-{name}"),
                      "annotations": annotations },
        "spec": {},
        "status": { "conditions": [{
            "type": "Ready", "status": ready, "reason": "R", "message": "",
            "lastTransitionTime": "2026-12-03T10:00:00Z",
        }]},
    }))
    .unwrap()
}

fn waiting_execution(name: &str, executor: &str) -> Execution {
    serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "Execution",
        "metadata": { "name": name, "namespace": "team", "uid": format!("uid-{name}") },
        "spec": { "executorRef": { "name": executor }, "code": "1" },
    }))
    .unwrap()
}

/// What was woken, and the Ready condition the executor cache showed for `py` at that moment.
type Heard = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// Runs `events` through [`executor_events`] as the operator does, with one Execution waiting
/// on executor `py`; returns each wake-up with what the executor cache showed when it was sent,
/// and the deletions heard.
async fn wake_ups(
    events: Vec<watcher::Event<BriqExecutor>>,
) -> (Vec<(String, Option<String>)>, Vec<String>) {
    let (executions, mut execution_writer) = reflector::store::<Execution>();
    execution_writer.apply_watcher_event(&watcher::Event::Apply(waiting_execution("step", "py")));
    let (executors, executor_writer) = reflector::store::<BriqExecutor>();
    let heard: Heard = Arc::default();
    let shown = |cache: &Store<BriqExecutor>| {
        cache.get(&ObjectRef::new("py").within("team")).map(|py| {
            serde_json::to_value(py.as_ref()).unwrap()["status"]["conditions"][0]["status"]
                .as_str()
                .unwrap()
                .to_owned()
        })
    };
    let (on_execution, cache) = (heard.clone(), executors.clone());
    let (on_pool, pool_cache) = (heard.clone(), executors.clone());
    let on_executor = heard.clone();
    let triggers = ExecutorTriggers {
        executors: executors.clone(),
        executions,
        wake_execution: Box::new(move |woken| {
            on_execution
                .lock()
                .unwrap()
                .push((format!("execution {woken}"), shown(&cache)));
        }),
        wake_pool: Box::new(move |woken| {
            on_pool
                .lock()
                .unwrap()
                .push((format!("pool {woken}"), shown(&pool_cache)));
        }),
        wake_executor: Box::new(move |woken| {
            on_executor
                .lock()
                .unwrap()
                .push((format!("executor {woken}"), None));
        }),
    };
    let deleted: Arc<Mutex<Vec<String>>> = Arc::default();
    let on_delete = deleted.clone();
    let applied: Vec<_> = executor_events(
        stream::iter(events.into_iter().map(Ok)),
        executor_writer,
        triggers,
        move |gone| on_delete.lock().unwrap().push(gone.name_any()),
    )
    .collect()
    .await;
    assert!(applied.iter().all(Result::is_ok));
    let heard = heard.lock().unwrap().clone();
    let deleted = deleted.lock().unwrap().clone();
    (heard, deleted)
}

fn woke(what: &str, cache_showed: Option<&str>) -> (String, Option<String>) {
    (what.to_owned(), cache_showed.map(str::to_owned))
}

const STEP: &str = "execution Execution.v1alpha1.briq.cloud/step.team";

#[tokio::test]
async fn an_executor_change_wakes_its_waiting_executions_only_once_the_cache_shows_it() {
    let (heard, deleted) = wake_ups(vec![
        watcher::Event::Apply(executor("py", "Unknown", json!({}))),
        watcher::Event::Apply(executor("py", "True", json!({}))),
        watcher::Event::Delete(executor("py", "True", json!({}))),
    ])
    .await;
    assert_eq!(
        heard,
        [
            woke(STEP, Some("Unknown")),
            woke(STEP, Some("True")),
            woke(STEP, None),
        ]
    );
    assert_eq!(deleted, ["py"]);
}

#[tokio::test]
async fn a_relisted_executor_wakes_its_executions_when_the_relist_is_in_the_cache() {
    let (heard, _) = wake_ups(vec![
        watcher::Event::Init,
        watcher::Event::InitApply(executor("py", "True", json!({}))),
        watcher::Event::InitApply(executor("other", "True", json!({}))),
        watcher::Event::InitDone,
    ])
    .await;
    assert_eq!(heard, [woke(STEP, Some("True"))]);
}

#[tokio::test]
async fn a_pool_member_change_wakes_its_pool_once_the_cache_shows_it() {
    let member = |ready| executor("py", ready, json!({ POOL_MEMBER_ANNOTATION: "warm" }));
    let (heard, _) = wake_ups(vec![
        watcher::Event::Apply(member("Unknown")),
        watcher::Event::Apply(member("True")),
    ])
    .await;
    const POOL: &str = "pool BriqExecutorPool.v1alpha1.briq.cloud/warm.team";
    assert_eq!(
        heard,
        [
            woke(STEP, Some("Unknown")),
            woke(POOL, Some("Unknown")),
            woke(STEP, Some("True")),
            woke(POOL, Some("True")),
        ]
    );
}

#[test]
fn an_executors_change_wakes_those_of_its_namespace_waiting_for_a_place() {
    let executor = |namespace: &str, name: &str, reason: &str| -> Arc<BriqExecutor> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
                "metadata": { "name": name, "namespace": namespace, "uid": format!("{namespace}-{name}") },
                "spec": {},
                "status": { "conditions": [{
                    "type": "Ready", "status": "False", "reason": reason, "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }]},
            }))
            .unwrap(),
        )
    };
    let all = [
        executor("team", "gone", "Terminating"),
        executor("team", "waits", "WaitingForCapacity"),
        executor("team", "ready", "KernelReady"),
        executor("other", "waits", "WaitingForCapacity"),
    ];
    let woken: Vec<String> = waiting_for_a_place(&all, &all[0])
        .into_iter()
        .map(|r| format!("{r}"))
        .collect();
    assert_eq!(
        woken,
        vec![format!(
            "{}",
            ObjectRef::<BriqExecutor>::new("waits").within("team")
        )]
    );
    assert!(
        waiting_for_a_place(&all, &all[1]).is_empty(),
        "a waiting executor does not wake itself"
    );
}

#[tokio::test]
async fn every_reconcile_waiting_for_the_first_class_list_hears_of_it() {
    // A reflector store's own readiness wakes only its latest waiter: at start-up, reconciles
    // waiting for it at once all but one waited for good (the killed-operator tests hung so).
    let (classes, writer) = reflector::store::<crate::crd::BriqExecutorClass>();
    let (listed_tx, listed) = tokio::sync::watch::channel(false);
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let mut listed = listed.clone();
            tokio::spawn(async move { listed.wait_for(|listed| *listed).await.is_ok() })
        })
        .collect();
    tokio::task::yield_now().await;
    let (executors, _) = reflector::store::<BriqExecutor>();
    let (pools, _) = reflector::store::<BriqExecutorPool>();
    let events = stream::iter([Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)]);
    class_events(
        events,
        writer,
        listed_tx,
        executors,
        Box::new(|_| {}),
        pools,
        Box::new(|_| {}),
    )
    .collect::<Vec<()>>()
    .await;
    for waiter in waiters {
        let heard = tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await;
        assert!(
            matches!(heard, Ok(Ok(true))),
            "a waiter never heard of the list"
        );
    }
    assert!(classes.wait_until_ready().await.is_ok());
}

#[test]
fn executions_wake_their_executor_to_resume_or_to_suspend() {
    let with = |name: &str, reason: &str, suspend: bool| {
        let mut executor = executor(name, "False", json!({}));
        executor.status.as_mut().unwrap().conditions[0].reason = reason.into();
        executor.spec.suspend = suspend;
        executor
    };
    let (executors, mut writer) = reflector::store::<BriqExecutor>();
    for executor in [
        with("asleep", "Suspended", true),
        with("dozing", "Suspending", true),
        with("waking", "Resuming", false),
        with("asked", "KernelReady", true),
        with("awake", "KernelReady", false),
    ] {
        writer.apply_watcher_event(&watcher::Event::Apply(executor));
    }
    let finished = |name: &str, executor: &str| {
        let mut execution = waiting_execution(name, executor);
        execution.status = Some(
            serde_json::from_value(json!({ "conditions": [{
                "type": "Succeeded", "status": "True", "reason": "Completed", "message": "",
                "lastTransitionTime": "2026-12-03T10:00:00Z",
            }]}))
            .unwrap(),
        );
        execution
    };
    let woken = |execution: &Execution, gone: bool| {
        suspension_wake(&executors, execution, gone).map(|o| o.name)
    };
    // (case, Execution, deleted, executor woken)
    let cases = [
        (
            "waiting, executor suspended: resume",
            waiting_execution("a", "asleep"),
            false,
            Some("asleep"),
        ),
        (
            "waiting, executor suspending: resume",
            waiting_execution("b", "dozing"),
            false,
            Some("dozing"),
        ),
        (
            "waiting, executor already resuming",
            waiting_execution("c", "waking"),
            false,
            None,
        ),
        (
            "waiting, executor awake",
            waiting_execution("d", "asked"),
            false,
            None,
        ),
        (
            "waiting, executor unknown",
            waiting_execution("e", "unknown"),
            false,
            None,
        ),
        (
            "finished, executor asked to suspend: suspend",
            finished("f", "asked"),
            false,
            Some("asked"),
        ),
        (
            "deleted, executor asked to suspend: suspend",
            waiting_execution("g", "asked"),
            true,
            Some("asked"),
        ),
        (
            "finished, executor not asked",
            finished("h", "awake"),
            false,
            None,
        ),
        (
            "finished, executor suspended already",
            finished("i", "asleep"),
            false,
            None,
        ),
        (
            "deleted, executor suspended: no kernel needed",
            waiting_execution("j", "asleep"),
            true,
            None,
        ),
    ];
    for (name, execution, gone, expected) in cases {
        assert_eq!(
            woken(&execution, gone),
            expected.map(str::to_owned),
            "{name}"
        );
    }
}

#[test]
fn a_claimer_wakes_its_pool_until_it_holds_a_member_and_a_member_wakes_its_own() {
    let executions = reflector::store::<Execution>().0;
    let claimer = |annotations: serde_json::Value| -> BriqExecutor {
        let mut claimer = executor("agent", "False", annotations);
        claimer.spec.pool_ref = serde_json::from_value(json!({ "name": "warm" })).unwrap();
        claimer
    };
    let warm = Some(ObjectRef::<BriqExecutorPool>::new("warm").within("team"));
    let cases = [
        (
            "a new claimer: a claim the pool must see",
            claimer(json!({})),
            warm.clone(),
        ),
        (
            "a claimer holding its member: the member's change woke the pool",
            claimer(json!({ CLAIMED_MEMBER_ANNOTATION: "warm-a" })),
            None,
        ),
        (
            "a claimer that made its own sandbox: counted already",
            claimer(json!({ POOL_FALLBACK_ANNOTATION: "true" })),
            None,
        ),
        (
            "a member",
            executor("warm-a", "True", json!({ POOL_MEMBER_ANNOTATION: "warm" })),
            warm,
        ),
        ("neither", executor("py", "True", json!({})), None),
    ];
    for (case, executor, pool) in cases {
        assert_eq!(woken_by(&executions, &executor).1, pool, "{case}");
    }
}

#[test]
fn a_ready_member_wakes_as_many_of_the_oldest_waiting_claimers_as_the_pool_has_ready_members() {
    let at = |executor: &mut BriqExecutor, second: u32| {
        executor.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + i64::from(second))
                    .unwrap(),
            ));
    };
    let claimer = |name: &str, second: u32, annotations: serde_json::Value| {
        let mut claimer = executor(name, "False", annotations);
        claimer.spec.pool_ref = serde_json::from_value(json!({ "name": "warm" })).unwrap();
        at(&mut claimer, second);
        Arc::new(claimer)
    };
    let member = |name: &str, ready: &str, annotations: serde_json::Value| {
        let mut annotations = annotations;
        annotations[POOL_MEMBER_ANNOTATION] = json!("warm");
        Arc::new(executor(name, ready, annotations))
    };
    let (a, b) = (
        member("warm-a", "True", json!({})),
        member("warm-b", "True", json!({})),
    );
    // Ready with its claim's record, before the write that copies it into its annotations.
    let mut recorded_not_settled = claimer("recorded", 5, json!({}));
    Arc::make_mut(&mut recorded_not_settled)
        .status
        .get_or_insert_default()
        .claimed_member = Some("warm-y".into());
    let everyone = vec![
        claimer("late", 30, json!({})),
        claimer("early", 10, json!({})),
        claimer("served", 0, json!({ CLAIMED_MEMBER_ANNOTATION: "warm-x" })),
        recorded_not_settled,
        claimer("cold", 1, json!({ POOL_FALLBACK_ANNOTATION: "no member" })),
        claimer("middle", 20, json!({})),
        a.clone(),
        b.clone(),
        member("warm-c", "False", json!({})),
        member(
            "warm-d",
            "True",
            json!({ CLAIMED_BY_ANNOTATION: "uid-served" }),
        ),
    ];
    let names = |woken: Vec<ObjectRef<BriqExecutor>>| -> Vec<String> {
        woken.into_iter().map(|o| o.name).collect()
    };
    assert_eq!(
        names(claimers_to_serve(&everyone, &a)),
        ["early", "middle"],
        "two Ready members: the two oldest claimers still waiting"
    );
    assert!(
        claimers_to_serve(&everyone, &member("warm-c", "False", json!({}))).is_empty(),
        "a member not Ready serves no one"
    );
    assert!(
        claimers_to_serve(&everyone, &everyone[8]).is_empty(),
        "a claimed member serves no one"
    );
    assert!(
        claimers_to_serve(&everyone, &everyone[0]).is_empty(),
        "a claimer's change wakes no other claimer"
    );
}
