//! The controllers end to end: real kube-apiserver, the real briq client against the local
//! sandbox server, real Jupyter kernels. Each test has its own namespace, operator and server.

mod support;

use std::time::Duration;

use briq_dev::local_server::{Fault, FaultRule, Operation, Outage};
use briq_operator::{
    briq::{self, BriqClient, ClientOptions, SandboxApi as _},
    crd::{
        BriqExecutor, CREATE_PENDING_ANNOTATION, Execution, FINALIZER, MAX_CODE_CHARS,
        MAX_STATUS_BYTES,
    },
};
use k8s_openapi::api::events::v1::Event;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams},
};
use serde_json::json;
use support::{
    Operator, READY_SECONDS, TestEnv, condition, create_execution, create_execution_from,
    create_executor, finished, output, reason, run, wait_deleted, wait_for, wait_ready,
};

const RUN_SECONDS: u64 = 60;

/// Mirrors the `final_answer` tool smolagents sends to remote executors: it raises
/// `FinalAnswerException` carrying the value in smolagents' safe serialization.
const FINAL_ANSWER_TOOL: &str = r#"
from smolagents.serialization import SafeSerializer

class FinalAnswerException(BaseException):
    pass

def final_answer(value):
    raise FinalAnswerException(SafeSerializer.dumps(value))
"#;

async fn ready_executor(env: &TestEnv, name: &str) -> BriqExecutor {
    create_executor(env, name, json!({})).await;
    wait_ready(env, name).await
}

#[tokio::test]
async fn executor_becomes_ready_and_python_state_survives_across_executions() {
    let env = TestEnv::new("e2e-state").await;
    let operator =
        Operator::start_with(&env, |s| s.count_write_interval = Duration::from_secs(1)).await;
    let executor = ready_executor(&env, "py").await;
    let status = executor.status.clone().unwrap();
    assert_eq!(status.observed_generation, executor.metadata.generation);
    // The sandboxes' Python has the bridge's runtime, as a prebuilt sandbox image does: the
    // Ready Event says that setup made no pip call.
    let events = env.api::<Event>();
    briq_dev::wait::poll(
        Duration::from_secs(10),
        Duration::from_millis(100),
        "the Ready Event",
        || async {
            let list = events.list(&ListParams::default()).await?;
            let ready: Vec<String> = list
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("Ready"))
                .filter_map(|e| e.note)
                .collect();
            match ready.as_slice() {
                [] => Ok(false),
                [note]
                    if note.ends_with(
                        "setup made no pip call: every requirement was installed already",
                    ) =>
                {
                    Ok(true)
                }
                other => anyhow::bail!("one Ready Event saying no pip call ran, not {other:?}"),
            }
        },
    )
    .await
    .unwrap();
    assert!(
        status
            .sandbox_id
            .as_deref()
            .is_some_and(|id| id.starts_with("bq_"))
    );
    assert_eq!(condition(&executor, "Stalled").0, "False");
    assert!(executor.finalizers().contains(&FINALIZER.to_owned()));
    assert_eq!(
        executor.annotations().get("briq.cloud/sandbox-id"),
        status.sandbox_id.as_ref(),
        "the sandbox id is kept in metadata too"
    );

    let first = run(&env, "first", "py", "x = 41\nprint('set x')").await;
    assert_eq!(reason(&first), "Completed");
    assert_eq!(
        first.status.as_ref().unwrap().logs.as_deref(),
        Some("set x\n")
    );
    let second = run(&env, "second", "py", "x + 1").await;
    let second_status = second.status.clone().unwrap();
    assert_eq!(reason(&second), "Completed");
    assert_eq!(second_status.output.as_deref(), Some("42"));
    assert!(second_status.start_time.is_some() && second_status.completion_time.is_some());
    assert_eq!(
        second_status.observed_generation,
        second.metadata.generation
    );
    assert_eq!(
        second.owner_references()[0].name,
        "py",
        "Executions are owned by their executor"
    );

    // Counts are written in batches, every `count_write_interval` (1 s here).
    wait_for(&env.api::<BriqExecutor>(), "py", 10, |e| {
        e.status.as_ref().and_then(|s| s.executions_total) == Some(2)
    })
    .await;
    assert_eq!(operator.live_sandboxes().await, 1);
}

#[tokio::test]
async fn counts_are_not_written_per_execution_but_are_not_lost_when_the_operator_stops() {
    let env = TestEnv::new("e2e-counts").await;
    let operator =
        Operator::start_with(&env, |s| s.count_write_interval = Duration::from_secs(3600)).await;
    ready_executor(&env, "py").await;
    assert_eq!(reason(&run(&env, "one", "py", "1").await), "Completed");
    assert_eq!(reason(&run(&env, "two", "py", "2").await), "Completed");
    let total = |executor: BriqExecutor| executor.status.and_then(|s| s.executions_total);
    let executors = env.api::<BriqExecutor>();
    assert_eq!(total(executors.get("py").await.unwrap()), None);
    let _server = operator.stop().await;
    assert_eq!(total(executors.get("py").await.unwrap()), Some(2));
}

#[tokio::test]
async fn final_answers_round_trip_and_arrays_are_rejected() {
    let env = TestEnv::new("e2e-final").await;
    let _operator = Operator::start(&env).await;
    ready_executor(&env, "py").await;
    assert_eq!(
        reason(&run(&env, "tool", "py", FINAL_ANSWER_TOOL).await),
        "Completed"
    );

    let code =
        "fib = [0, 1]\nwhile len(fib) < 20:\n    fib.append(fib[-1] + fib[-2])\nfinal_answer(fib)";
    let answer = run(&env, "fibonacci", "py", code).await;
    let status = answer.status.clone().unwrap();
    assert_eq!(reason(&answer), "FinalAnswer");
    assert_eq!(condition(&answer, "Succeeded").0, "True");
    assert!(status.is_final_answer);
    let value = status.final_answer.unwrap();
    let numbers: Vec<u64> = serde_json::from_str(value.strip_prefix("safe:").unwrap()).unwrap();
    assert_eq!(
        numbers,
        [
            0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584, 4181
        ]
    );

    let array = run(
        &env,
        "array",
        "py",
        "import numpy as np\nfinal_answer({'nested': np.arange(3)})",
    )
    .await;
    assert_eq!(reason(&array), "FinalAnswerRejected");
    let (_, _, message) = condition(&array, "Succeeded");
    assert!(
        message.contains("return arrays as lists and images as bytes"),
        "{message}"
    );
    // A rejected answer is the code's fault, not the executor's.
    assert_eq!(
        reason(&run(&env, "after", "py", "len(fib)").await),
        "Completed"
    );
}

#[tokio::test]
async fn code_errors_keep_the_executor_usable() {
    let env = TestEnv::new("e2e-errors").await;
    let _operator = Operator::start(&env).await;
    ready_executor(&env, "py").await;

    let raised = run(&env, "raise", "py", "print('before')\n1 / 0").await;
    let status = raised.status.clone().unwrap();
    assert_eq!(reason(&raised), "CodeError");
    assert_eq!(condition(&raised, "Succeeded").0, "False");
    assert_eq!(
        status.logs.as_deref(),
        Some("before\n"),
        "logs printed before the error are kept"
    );
    let error = status.error.unwrap();
    assert_eq!(error.name, "ZeroDivisionError");
    let traceback = error.traceback.unwrap();
    assert!(
        traceback.contains("ZeroDivisionError") && !traceback.contains('\u{1b}'),
        "{traceback}"
    );

    let syntax = run(&env, "syntax", "py", "def broken(:\n    pass").await;
    assert_eq!(reason(&syntax), "CodeError");
    assert_eq!(syntax.status.unwrap().error.unwrap().name, "SyntaxError");

    let fine = run(&env, "fine", "py", "2 + 2").await;
    assert_eq!(fine.status.unwrap().output.as_deref(), Some("4"));
    let executor = env.api::<BriqExecutor>().get("py").await.unwrap();
    assert!(!executor.status.unwrap().unusable);
}

#[tokio::test]
async fn a_timeout_makes_the_executor_unusable_for_good() {
    let env = TestEnv::new("e2e-timeout").await;
    let operator = Operator::start(&env).await;
    ready_executor(&env, "py").await;

    let spin = json!({
        "executorRef": { "name": "py" },
        "code": "while True:\n    pass",
        "timeoutSeconds": 2,
    });
    create_execution_from(&env, "spin", spin).await;
    let spin = finished(&env, "spin", RUN_SECONDS).await;
    assert_eq!(reason(&spin), "Timeout");

    let executor = wait_for(&env.api::<BriqExecutor>(), "py", 30, |executor| {
        condition(executor, "Stalled").0 == "True"
    })
    .await;
    let status = executor.status.clone().unwrap();
    assert!(status.unusable);
    assert!(status.unusable_reason.unwrap().contains("deadline"));
    assert_eq!(condition(&executor, "Ready").0, "False");
    assert_eq!(condition(&executor, "Ready").1, "Unusable");
    assert_eq!(status.observed_generation, executor.metadata.generation);
    let events = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let unusable: Vec<_> = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Unusable"))
        .filter_map(|e| e.note.clone())
        .collect();
    assert_eq!(unusable.len(), 1, "one Event says why: {unusable:?}");
    assert!(unusable[0].contains("deadline"), "{unusable:?}");

    let execs_before = operator
        .admin()
        .stats()
        .await
        .unwrap()
        .calls(Operation::Exec);
    let later = run(&env, "later", "py", "1 + 1").await;
    assert_eq!(reason(&later), "ExecutorUnusable");
    assert!(
        condition(&later, "Succeeded")
            .2
            .contains("create a new BriqExecutor")
    );
    let execs_after = operator
        .admin()
        .stats()
        .await
        .unwrap()
        .calls(Operation::Exec);
    assert_eq!(
        execs_before, execs_after,
        "an unusable executor never runs code again"
    );

    // Its Events tell the story, each transition once (the second unusable Execution repeats
    // none), and none carries the API key.
    env.api::<BriqExecutor>()
        .delete("py", &DeleteParams::default())
        .await
        .unwrap();
    wait_deleted(&env.api::<BriqExecutor>(), "py", 60).await;
    let story = ["SandboxCreated", "Ready", "Unusable", "SandboxDestroyed"];
    // The finalizer publishes SandboxDestroyed before it lets the executor go.
    let mut told: Vec<Event> = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("py"))
        .collect();
    told.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    let reasons: Vec<&str> = told.iter().filter_map(|e| e.reason.as_deref()).collect();
    assert_eq!(reasons, story, "{told:#?}");
    let key = operator.server.api_key().expose();
    for event in &told {
        let note = event.note.as_deref().unwrap_or_default();
        assert!(!note.contains(key), "{note}");
    }
    assert!(
        told[2]
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("deadline"),
        "{:?}",
        told[2].note
    );
}

#[tokio::test]
async fn executions_run_one_at_a_time_in_creation_order() {
    let env = TestEnv::new("e2e-order").await;
    let _operator = Operator::start(&env).await;
    ready_executor(&env, "py").await;
    let setup = "import time\nspans = []";
    assert_eq!(reason(&run(&env, "setup", "py", setup).await), "Completed");

    // Created at once, so most share one creationTimestamp second: the name breaks the tie.
    let names: Vec<String> = (0..10).map(|i| format!("step-{i:02}")).collect();
    let creates = names.iter().enumerate().map(|(i, name)| {
        let code = format!(
            "t0 = time.monotonic()\ntime.sleep(0.1)\nspans.append(({i}, t0, time.monotonic()))"
        );
        let env = &env;
        async move { create_execution(env, name, "py", &code).await }
    });
    futures::future::join_all(creates).await;
    for name in &names {
        assert_eq!(
            reason(&finished(&env, name, RUN_SECONDS).await),
            "Completed",
            "{name}"
        );
    }
    // The run order is (creationTimestamp, name): under load the creates may straddle a second.
    let mut created = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let execution = env.api::<Execution>().get(name).await.unwrap();
        created.push((
            execution.metadata.creation_timestamp.unwrap().0,
            name.clone(),
            i,
        ));
    }
    created.sort();
    let expected: Vec<String> = created.iter().map(|(_, _, i)| i.to_string()).collect();
    let check = "order = [i for i, _, _ in spans]\n\
                 overlaps = sum(1 for a, b in zip(spans, spans[1:]) if b[1] < a[2])\n\
                 (order, overlaps)";
    let result = run(&env, "check", "py", check).await;
    assert_eq!(
        result.status.unwrap().output.as_deref(),
        Some(format!("([{}], 0)", expected.join(", ")).as_str())
    );
}

/// Code that counts its runs in the kernel user's home, then prints.
const COUNTED: &str = "import os, time\nopen(os.path.expanduser('~/ran.txt'), 'a').write('x')\ntime.sleep(1)\nprint('ran')";

/// Where the operator is killed while an Execution runs.
enum KillPoint {
    /// `Running` is recorded, the exec is held at the server: it never reaches the sandbox
    /// while this operator lives.
    BeforeTheExec,
    /// The exec has reached the sandbox, the code runs.
    WhileTheCodeRuns,
    /// The code has run; the answer never came back, so no result is written.
    AfterTheCodeRan,
    /// As [`KillPoint::AfterTheCodeRan`], and the operator stays down past the journal's
    /// retention: the sandbox prunes its journal with its clock two hours on.
    AfterTheCodeRanForHours,
}

/// The operator is killed at `point` and comes back: the Execution ends as if nothing had
/// happened — completed, its output recorded, its code run exactly once (counted in the
/// sandbox) — and the executor stays usable.
async fn a_killed_operator_recovers_the_execution(prefix: &str, point: KillPoint) {
    let env = TestEnv::new(prefix).await;
    let mut operator = Operator::start(&env).await;
    let executor = ready_executor(&env, "py").await;
    let admin = operator.admin();
    let before = admin.stats().await.unwrap();
    let (operation, fault) = match point {
        KillPoint::BeforeTheExec => (Operation::Exec, Some(Fault::delay(Duration::from_secs(30)))),
        KillPoint::WhileTheCodeRuns => (Operation::Exec, None),
        KillPoint::AfterTheCodeRan | KillPoint::AfterTheCodeRanForHours => (
            Operation::Exec,
            Some(Fault::hang_after_effect(Duration::from_secs(120))),
        ),
    };
    if let Some(fault) = fault {
        admin
            .add_fault(&FaultRule::on(operation, fault))
            .await
            .unwrap();
    }
    create_execution(&env, "victim", "py", COUNTED).await;
    let running = wait_for(&env.api::<Execution>(), "victim", RUN_SECONDS, |e| {
        reason(e) == "Running"
    })
    .await;
    let calls = before.calls(operation);
    briq_dev::wait::poll(
        Duration::from_secs(30),
        Duration::from_millis(20),
        "the call reaches the sandbox server",
        || async { Ok(admin.stats().await?.calls(operation) > calls) },
    )
    .await
    .unwrap();
    let sandboxes = BriqClient::new(ClientOptions::local(operator.server.url())).unwrap();
    let sandbox_id = executor.status.unwrap().sandbox_id.unwrap();
    if let KillPoint::AfterTheCodeRan | KillPoint::AfterTheCodeRanForHours = point {
        // The sandbox's own record says when the code has run (asking runs nothing).
        let attempt = running.status.unwrap().attempt_id.unwrap();
        let session = briq_operator::bridge::session::Session {
            api: &sandboxes,
            key: operator.server.api_key(),
            sandbox_id: &sandbox_id,
        };
        let recorded = session.recall(&attempt, Duration::from_secs(30)).await;
        assert!(matches!(recorded, Ok(Some(_))), "{recorded:?}");
    }
    operator.kill().await;
    admin.clear_faults().await.unwrap();
    if let KillPoint::AfterTheCodeRanForHours = point {
        let prune = "import importlib.util, time\n\
            spec = importlib.util.spec_from_file_location('bridge', '.briq/bridge.py')\n\
            bridge = importlib.util.module_from_spec(spec)\n\
            spec.loader.exec_module(bridge)\n\
            bridge.Journal().prune(time.time() + 2 * bridge.JOURNAL_MAX_AGE_S)\n";
        let request = briq::ExecRequest {
            argv: vec!["python3".into(), "-c".into(), prune.into()],
            cwd: Some(briq_operator::bridge::WORKDIR.into()),
            env: Default::default(),
            timeout: Duration::from_secs(30),
            stdin: None,
        };
        let pruned = sandboxes
            .exec(operator.server.api_key(), &sandbox_id, &request)
            .await
            .unwrap();
        assert_eq!(pruned.exit_code, Some(0), "{pruned:?}");
    }
    operator.resume();

    let victim = finished(&env, "victim", RUN_SECONDS).await;
    assert_eq!(
        reason(&victim),
        "Completed",
        "{:?}",
        condition(&victim, "Succeeded")
    );
    assert_eq!(
        victim.status.as_ref().unwrap().logs.as_deref(),
        Some("ran\n")
    );
    let count = run(
        &env,
        "count",
        "py",
        "import os\nprint(len(open(os.path.expanduser('~/ran.txt')).read()))",
    )
    .await;
    assert_eq!(reason(&count), "Completed", "the executor stays usable");
    assert_eq!(
        count.status.unwrap().logs.as_deref(),
        Some("1\n"),
        "the code ran exactly once"
    );
}

#[tokio::test]
async fn an_operator_killed_before_the_exec_is_sent_is_recovered_and_the_code_runs_once() {
    a_killed_operator_recovers_the_execution("e2e-kill-before", KillPoint::BeforeTheExec).await;
}

#[tokio::test]
async fn an_operator_killed_while_the_code_runs_is_recovered_and_the_code_runs_once() {
    a_killed_operator_recovers_the_execution("e2e-kill-during", KillPoint::WhileTheCodeRuns).await;
}

#[tokio::test]
async fn an_operator_killed_after_the_code_ran_is_recovered_without_running_it_again() {
    a_killed_operator_recovers_the_execution("e2e-kill-after", KillPoint::AfterTheCodeRan).await;
}

#[tokio::test]
async fn an_operator_down_past_the_journal_retention_learns_the_result_and_runs_nothing_twice() {
    a_killed_operator_recovers_the_execution("e2e-kill-hours", KillPoint::AfterTheCodeRanForHours)
        .await;
}

#[tokio::test]
async fn an_uncertain_create_and_a_crash_still_make_exactly_one_sandbox() {
    let env = TestEnv::new("e2e-create").await;
    let mut operator = Operator::start_with(&env, |settings| {
        settings.backoff_base = Duration::from_secs(2)
    })
    .await;
    // The sandbox is created, but the answer never comes: the operator cannot know, and is
    // killed while it waits. (With the answer dropped at once, the operator's own writes woke it
    // again at once and it adopted the sandbox within a second: on a loaded machine the crash
    // came after that, or the wait below began too late to see the pending create at all.)
    operator
        .admin()
        .add_fault(&FaultRule::on(
            Operation::Create,
            Fault::hang_after_effect(Duration::from_secs(600)),
        ))
        .await
        .unwrap();
    create_executor(&env, "py", json!({})).await;
    let pending = wait_for(&env.api::<BriqExecutor>(), "py", 30, |executor| {
        executor
            .annotations()
            .contains_key(CREATE_PENDING_ANNOTATION)
    })
    .await;
    assert!(
        pending
            .annotations()
            .contains_key(CREATE_PENDING_ANNOTATION)
    );
    while operator
        .admin()
        .stats()
        .await
        .unwrap()
        .calls(Operation::Create)
        == 0
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    operator.kill().await;
    operator.resume();

    let executor = wait_ready(&env, "py").await;
    let stats = operator.admin().stats().await.unwrap();
    assert_eq!(
        stats.calls(Operation::Create),
        1,
        "the sandbox was adopted, not created again"
    );
    assert_eq!(stats.sandboxes.len(), 1);
    assert_eq!(
        executor.status.as_ref().unwrap().sandbox_id.as_deref(),
        Some(stats.sandboxes[0].id.as_str())
    );
    assert!(
        !executor
            .annotations()
            .contains_key(CREATE_PENDING_ANNOTATION)
    );
}

#[tokio::test]
async fn deleting_an_executor_destroys_its_sandbox_even_when_destroy_fails_at_first() {
    let env = TestEnv::new("e2e-delete").await;
    let operator = Operator::start(&env).await;
    ready_executor(&env, "py").await;
    ready_executor(&env, "flaky").await;
    assert_eq!(operator.live_sandboxes().await, 2);

    env.api::<BriqExecutor>()
        .delete("py", &DeleteParams::default())
        .await
        .unwrap();
    wait_deleted(&env.api::<BriqExecutor>(), "py", 30).await;
    assert_eq!(operator.live_sandboxes().await, 1);

    // Each failed attempt is an Event; the finalizer stays until the destroy is confirmed.
    let mut rule = FaultRule::on(Operation::Destroy, Fault::status(503));
    rule.count = 6;
    operator.admin().add_fault(&rule).await.unwrap();
    env.api::<BriqExecutor>()
        .delete("flaky", &DeleteParams::default())
        .await
        .unwrap();
    let events: Api<Event> = env.api();
    let destroy_failed = || async {
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("DestroyFailed"))
            .count()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while destroy_failed().await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no DestroyFailed event"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_deleted(&env.api::<BriqExecutor>(), "flaky", 60).await;
    let stats = operator.admin().stats().await.unwrap();
    assert!(
        stats.calls(Operation::Destroy) > 6,
        "destroy was retried past the failures"
    );
    assert_eq!(stats.sandboxes.len(), 0, "no sandbox is leaked");
}

#[tokio::test]
async fn a_deleted_executor_lets_its_executions_conclude_before_garbage_collection_removes_them() {
    let env = TestEnv::new("e2e-deleted").await;
    let _operator = Operator::start(&env).await;
    ready_executor(&env, "py").await;
    create_execution(&env, "busy", "py", "import time\ntime.sleep(3)").await;
    wait_for(&env.api::<Execution>(), "busy", RUN_SECONDS, |e| {
        reason(e) == "Running"
    })
    .await;
    create_execution(&env, "queued", "py", "1 + 1").await;
    wait_for(&env.api::<Execution>(), "queued", RUN_SECONDS, |e| {
        reason(e) == "Queued"
    })
    .await;
    env.api::<BriqExecutor>()
        .delete("py", &DeleteParams::default())
        .await
        .unwrap();
    // Garbage collection removes an executor's Executions with it: each must have said how it
    // ended before that, the queued one at once, the running one when its action ends.
    let queued = finished(&env, "queued", RUN_SECONDS).await;
    assert_eq!(
        reason(&queued),
        "ExecutorDeleted",
        "{:?}",
        condition(&queued, "Succeeded")
    );
    let busy = finished(&env, "busy", RUN_SECONDS).await;
    assert_eq!(
        condition(&busy, "Succeeded").0,
        "True",
        "the running action ends before its sandbox is destroyed: {:?}",
        condition(&busy, "Succeeded")
    );
    wait_deleted(&env.api::<BriqExecutor>(), "py", RUN_SECONDS).await;
}

#[tokio::test]
async fn a_sleeping_sandbox_loses_its_kernel_and_the_executor_notices() {
    let env = TestEnv::new("e2e-sleep").await;
    // No probe during the test: the next Execution must notice on its own.
    let operator =
        Operator::start_with(&env, |s| s.probe_interval = Duration::from_secs(3600)).await;
    let executor = ready_executor(&env, "py").await;
    assert_eq!(
        reason(&run(&env, "before", "py", "x = 1").await),
        "Completed"
    );
    let id = executor.status.unwrap().sandbox_id.unwrap();
    operator.admin().sleep(&id).await.unwrap();

    let after = run(&env, "after", "py", "x").await;
    assert_eq!(reason(&after), "KernelLost");
    let executor = wait_for(&env.api::<BriqExecutor>(), "py", 30, |e| {
        condition(e, "Stalled").0 == "True"
    })
    .await;
    assert!(executor.status.unwrap().unusable);
}

#[tokio::test]
async fn the_periodic_probe_notices_a_sleeping_sandbox() {
    let env = TestEnv::new("e2e-probe").await;
    let operator = Operator::start_with(&env, |s| s.probe_interval = Duration::from_secs(1)).await;
    let executor = ready_executor(&env, "py").await;
    operator
        .admin()
        .sleep(&executor.status.unwrap().sandbox_id.unwrap())
        .await
        .unwrap();
    let executor = wait_for(&env.api::<BriqExecutor>(), "py", 30, |e| {
        condition(e, "Stalled").0 == "True"
    })
    .await;
    assert!(
        executor
            .status
            .unwrap()
            .unusable_reason
            .unwrap()
            .contains("sleeping")
    );
}

#[tokio::test]
async fn oversized_output_is_truncated_and_flagged() {
    let env = TestEnv::new("e2e-big").await;
    let _operator = Operator::start(&env).await;
    ready_executor(&env, "py").await;
    let big = run(&env, "big", "py", "print('a' * 200_000)\n'b' * 100_000").await;
    let status = big.status.clone().unwrap();
    assert_eq!(
        reason(&Execution {
            status: Some(status.clone()),
            ..big.clone()
        }),
        "Completed"
    );
    assert!(status.truncated);
    let logs = status.logs.unwrap_or_default();
    let output = status.output.unwrap_or_default();
    assert!(logs.chars().count() + output.chars().count() <= 65_536);
    assert!(
        logs.starts_with("aaaa") && logs.contains("truncated"),
        "head and a marked cut are kept"
    );
}

/// The whole object as the API server stores it (JSON, `<` and U+2028 as `\uXXXX`), and the
/// bytes its status takes there.
fn stored_size(env: &TestEnv, name: &str) -> (usize, usize) {
    let path = format!(
        "/apis/briq.cloud/v1alpha1/namespaces/{}/executions/{name}",
        env.namespace
    );
    let (ok, raw, stderr) = env.kubectl(&["get", "--raw", &path]);
    assert!(ok, "{stderr}");
    let raw = raw.trim_end();
    let key = ",\"status\":";
    let status = raw.find(key).expect("a status") + key.len();
    // The status is the object's last field: what follows the key, less the closing brace.
    (raw.len(), raw.len() - status - 1)
}

#[tokio::test]
async fn an_error_that_grows_sixfold_when_stored_is_cut_to_the_status_budget() {
    let env = TestEnv::new("e2e-budget").await;
    let _operator = Operator::start(&env).await;
    ready_executor(&env, "py").await;
    // Issue 14: logs and an error message the API server stores as 6 bytes per character, and
    // code of the largest size, mostly `<`. Uncut, the status alone would take 1.2 MB and the
    // object over etcd's 1.5 MiB: the write was refused and retried forever.
    let body = "print('<' * 65_536)\nraise ValueError('\\u2028<' * 70_000)\n";
    let padding = MAX_CODE_CHARS - body.len() - 2;
    let code = format!("#{}\n{body}", "<".repeat(padding));
    assert_eq!(
        code.chars().count(),
        MAX_CODE_CHARS,
        "the largest code allowed"
    );
    let raised = run(&env, "huge-error", "py", &code).await;
    assert_eq!(reason(&raised), "CodeError");
    let status = raised.status.clone().unwrap();
    assert!(status.truncated);
    let error = status.error.unwrap();
    assert_eq!(error.name, "ValueError");
    assert!(error.message.starts_with("\u{2028}<") && error.message.contains("characters cut"));
    let (object, stored_status) = stored_size(&env, "huge-error");
    assert!(
        stored_status <= MAX_STATUS_BYTES,
        "status {stored_status} bytes"
    );
    assert!(object < 1 << 20, "object {object} bytes");

    let after = run(&env, "after", "py", "2 + 2").await;
    assert_eq!(reason(&after), "Completed");
    assert_eq!(after.status.unwrap().output.as_deref(), Some("4"));
}

#[tokio::test]
async fn an_execution_beyond_a_full_queue_fails_at_once_and_the_queue_runs_on() {
    let env = TestEnv::new("e2e-queue-cap").await;
    let _operator = Operator::start(&env).await;
    create_executor(&env, "py", json!({ "maxQueuedExecutions": 1 })).await;
    wait_ready(&env, "py").await;
    create_execution(&env, "a-run", "py", "import time\ntime.sleep(6)\n'a'").await;
    create_execution(&env, "b-wait", "py", "'b'").await;
    create_execution(&env, "c-refused", "py", "'c'").await;

    let refused = finished(&env, "c-refused", 5).await;
    assert_eq!(reason(&refused), "QueueFull");
    assert_eq!(
        condition(&refused, "Succeeded").2,
        "BriqExecutor py already has 1 Executions waiting (maxQueuedExecutions is 1); this one \
         was not run: create it again once the queue drains"
    );
    assert!(refused.status.unwrap().start_time.is_none(), "it never ran");
    let running = env.api::<Execution>().get("a-run").await.unwrap();
    let head = condition(&running, "Succeeded").0;
    assert!(
        !["True", "False"].contains(&head.as_str()),
        "refused at once, before the head finished: {head:?}"
    );

    assert_eq!(output(&finished(&env, "a-run", RUN_SECONDS).await), "'a'");
    assert_eq!(output(&finished(&env, "b-wait", RUN_SECONDS).await), "'b'");
    let executor = env.api::<BriqExecutor>().get("py").await.unwrap();
    assert!(!executor.status.unwrap().unusable);
}

#[tokio::test]
async fn finished_executions_are_deleted_after_their_time_to_live() {
    let env = TestEnv::new("e2e-ttl").await;
    let _operator = Operator::start(&env).await;
    create_executor(&env, "py", json!({})).await;
    wait_ready(&env, "py").await;
    let api = env.api::<Execution>();
    run(&env, "before-ttl", "py", "0").await;
    // A time to live given to the executor later reaches the Executions already finished.
    let ttl = json!({ "spec": { "executionTtlSecondsAfterFinished": 3 } });
    env.api::<BriqExecutor>()
        .patch(
            "py",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&ttl),
        )
        .await
        .unwrap();
    wait_deleted(&api, "before-ttl", 15).await;

    let default = run(&env, "default", "py", "1").await;
    let completed = default.status.unwrap().completion_time.unwrap().0;
    wait_deleted(&api, "default", 15).await;
    let lived = completed.duration_until(k8s_openapi::jiff::Timestamp::now());
    assert!(
        lived.as_secs() >= 2,
        "deleted {lived:?} after its completion"
    );

    let spec =
        json!({ "executorRef": { "name": "py" }, "code": "2", "ttlSecondsAfterFinished": 3600 });
    create_execution_from(&env, "own-ttl", spec).await;
    finished(&env, "own-ttl", RUN_SECONDS).await;
    let spec =
        json!({ "executorRef": { "name": "py" }, "code": "3", "ttlSecondsAfterFinished": 0 });
    create_execution_from(&env, "at-once", spec).await;
    wait_deleted(&api, "at-once", RUN_SECONDS).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        api.get_opt("own-ttl").await.unwrap().is_some(),
        "its own time to live overrides the executor's"
    );
}

#[tokio::test]
async fn executions_cannot_reach_an_executor_in_another_namespace() {
    let env = TestEnv::new("e2e-ns-a").await;
    let other = TestEnv::new("e2e-ns-b").await;
    let _operator = Operator::start(&env).await;
    let _other_operator = Operator::start(&other).await;
    ready_executor(&env, "py").await;
    create_execution(&other, "stray", "py", "1 + 1").await;
    let stray = wait_for(&other.api::<Execution>(), "stray", 30, |e| {
        reason(e) == "ExecutorNotFound"
    })
    .await;
    assert_eq!(condition(&stray, "Succeeded").0, "Unknown");
    assert!(condition(&stray, "Succeeded").2.contains(&other.namespace));
}

/// A misspelt executor name: the Execution says what it waits for, then fails once the
/// operator's wait is over, instead of waiting forever.
#[tokio::test]
async fn an_execution_naming_an_executor_that_never_appears_fails_after_the_wait() {
    let env = TestEnv::new("e2e-never").await;
    let _operator = Operator::start_with(&env, |settings| {
        settings.executor_wait = Duration::from_secs(4);
    })
    .await;
    create_execution(&env, "typo", "pyy", "1 + 1").await;
    let waiting = wait_for(&env.api::<Execution>(), "typo", 30, |e| {
        reason(e) == "ExecutorNotFound"
    })
    .await;
    assert_eq!(condition(&waiting, "Succeeded").0, "Unknown");
    let failed = finished(&env, "typo", 30).await;
    let (status, reason, message) = condition(&failed, "Succeeded");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ExecutorNeverAppeared")
    );
    assert!(message.contains("within 4s"), "{message}");
}

#[tokio::test]
async fn a_failed_setup_destroys_the_sandbox_and_stalls() {
    let env = TestEnv::new("e2e-setup").await;
    let operator = Operator::start(&env).await;
    // No index: pip fails at once, offline, as it would for a package that does not exist.
    let spec = json!({ "packages": ["briq-no-such-package==0.0.1"], "env": [{ "name": "PIP_NO_INDEX", "value": "1" }] });
    create_executor(&env, "broken", spec).await;
    let executor = wait_for(&env.api::<BriqExecutor>(), "broken", READY_SECONDS, |e| {
        condition(e, "Stalled").0 == "True"
    })
    .await;
    let (ready, reason, message) = condition(&executor, "Ready");
    assert_eq!((ready.as_str(), reason.as_str()), ("False", "SetupFailed"));
    assert!(
        message.contains("briq-no-such-package"),
        "the pip output tail is in the message: {message}"
    );
    let executor = wait_for(&env.api::<BriqExecutor>(), "broken", 30, |e| {
        e.status.as_ref().is_some_and(|s| s.sandbox_id.is_none())
    })
    .await;
    assert!(executor.status.is_some());
    assert_eq!(
        operator.live_sandboxes().await,
        0,
        "a setup failure destroys the sandbox"
    );
}

#[tokio::test]
async fn a_missing_api_key_secret_is_reported_and_never_printed() {
    let env = TestEnv::new("e2e-key").await;
    let _operator = Operator::start(&env).await;
    create_executor(
        &env,
        "nokey",
        json!({ "apiKeySecretRef": { "name": "briq-key" } }),
    )
    .await;
    let executor = wait_for(&env.api::<BriqExecutor>(), "nokey", 30, |e| {
        condition(e, "Ready").1 == "ApiKeyMissing"
    })
    .await;
    assert!(condition(&executor, "Ready").2.contains("briq-key"));

    // A wrong key is refused by briq; the status says so without the key itself.
    support::create_api_key_secret(&env, "wrong", "sk-wrong-secret-value", true).await;
    create_executor(
        &env,
        "wrongkey",
        json!({ "apiKeySecretRef": { "name": "wrong" } }),
    )
    .await;
    let executor = wait_for(&env.api::<BriqExecutor>(), "wrongkey", 30, |e| {
        condition(e, "Ready").1 == "BriqRefused"
    })
    .await;
    let text = serde_json::to_string(&executor).unwrap();
    assert!(!text.contains("sk-wrong-secret-value"));
    assert!(condition(&executor, "Ready").2.contains("API key"));
}

#[tokio::test]
async fn an_unlabelled_secret_is_never_used_as_a_key_and_looks_missing() {
    let env = TestEnv::new("e2e-unlabelled").await;
    let operator = Operator::start(&env).await;
    let creates_before = operator
        .admin()
        .stats()
        .await
        .unwrap()
        .calls(Operation::Create);
    // A Secret that holds a key briq would accept, but that nobody opted in as an API key: an
    // executor must not make the operator send it to briq.
    let valid_key = operator.server.api_key().expose().to_owned();
    support::create_api_key_secret(&env, "db-password", &valid_key, false).await;
    for (name, secret) in [("borrower", "db-password"), ("missing", "no-such-secret")] {
        create_executor(&env, name, json!({ "apiKeySecretRef": { "name": secret } })).await;
    }
    let mut messages = Vec::new();
    for (name, secret) in [("borrower", "db-password"), ("missing", "no-such-secret")] {
        let executor = wait_for(&env.api::<BriqExecutor>(), name, 30, |e| {
            condition(e, "Ready").1 == "ApiKeyMissing"
        })
        .await;
        let message = condition(&executor, "Ready").2;
        assert!(message.contains("briq.cloud/api-key=true"), "{message}");
        messages.push(message.replace(secret, "<secret>"));
    }
    assert_eq!(
        messages[0], messages[1],
        "an unlabelled Secret reads exactly like a missing one"
    );
    let stats = operator.admin().stats().await.unwrap();
    assert_eq!(
        stats.calls(Operation::Create),
        creates_before,
        "briq never saw the unlabelled Secret's value"
    );
}

#[tokio::test]
async fn queued_executions_wait_without_reading_from_the_api_server() {
    let env = TestEnv::new("e2e-queue-cost").await;
    let requests = support::RequestLog::default();
    let client = requests.client(&env).await;
    let _operator = Operator::start_as(&env, client, |_| {}).await;
    ready_executor(&env, "py").await;
    create_execution(&env, "busy", "py", "import time\ntime.sleep(20)").await;
    wait_for(&env.api::<Execution>(), "busy", RUN_SECONDS, |e| {
        reason(e) == "Running"
    })
    .await;
    let queued: Vec<String> = (0..5).map(|i| format!("queued-{i}")).collect();
    for name in &queued {
        create_execution(&env, name, "py", "1 + 1").await;
    }
    for name in &queued {
        wait_for(&env.api::<Execution>(), name, RUN_SECONDS, |e| {
            reason(e) == "Queued"
        })
        .await;
    }

    // Longer than the fallback re-check of queued Executions (5 s), so that it runs meanwhile.
    let mark = requests.len();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        reason(&env.api::<Execution>().get("busy").await.unwrap()),
        "Running",
        "the window must end while the queue still waits"
    );
    for resource in ["executions", "briqexecutors"] {
        let reads = requests.reads_since(mark, resource);
        assert!(
            reads.is_empty(),
            "queued Executions read {resource}: {reads:#?}"
        );
    }
    for name in &queued {
        assert_eq!(
            reason(&finished(&env, name, RUN_SECONDS).await),
            "Completed",
            "{name}"
        );
    }
}

/// Appends a line to `marker.txt` in the kernel's directory: proof in the sandbox that it ran.
const MARK: &str = "with open('marker.txt', 'a') as f:\n    f.write('ran\\n')\n";

/// What the kernel's `marker.txt` holds (empty when it does not exist), read past the operator.
async fn marker(operator: &Operator, sandbox: &str) -> String {
    let client = BriqClient::new(ClientOptions::local(operator.server.url())).unwrap();
    match client
        .read_file(operator.server.api_key(), sandbox, "/work/home/marker.txt")
        .await
    {
        Ok(content) => String::from_utf8(content).unwrap(),
        Err(briq::Error::NotFound { .. }) => String::new(),
        Err(error) => panic!("reading marker.txt: {error}"),
    }
}

/// A ready executor `py`, with the fault rule `rule` makes for its sandbox added; its sandbox id.
async fn executor_with_fault(
    env: &TestEnv,
    operator: &Operator,
    rule: impl FnOnce(&str) -> FaultRule,
) -> String {
    let executor = ready_executor(env, "py").await;
    let sandbox = executor.status.unwrap().sandbox_id.unwrap();
    operator.admin().add_fault(&rule(&sandbox)).await.unwrap();
    sandbox
}

/// The executor `py` turns unusable for `why`, and a later Execution fails without any exec.
async fn assert_unusable_for_good(env: &TestEnv, operator: &Operator, why: &str) {
    let executor = wait_for(&env.api::<BriqExecutor>(), "py", 30, |executor| {
        condition(executor, "Stalled").0 == "True"
    })
    .await;
    let status = executor.status.clone().unwrap();
    assert!(status.unusable);
    let reason_given = status.unusable_reason.unwrap_or_default();
    assert!(reason_given.contains(why), "{reason_given}");
    assert_eq!(condition(&executor, "Ready").0, "False");
    assert_eq!(condition(&executor, "Ready").1, "Unusable");
    assert_eq!(condition(&executor, "Stalled").1, "Unusable");
    let execs_before = support::execs(&operator.admin()).await;
    let later = run(env, "later", "py", "1 + 1").await;
    assert_eq!(reason(&later), "ExecutorUnusable");
    assert_eq!(
        support::execs(&operator.admin()).await,
        execs_before,
        "an unusable executor never runs code again"
    );
}

/// The executor `py` still runs code, keeps its Python state and is Ready.
async fn assert_still_usable(env: &TestEnv, name: &str) {
    let executor = env.api::<BriqExecutor>().get("py").await.unwrap();
    assert!(!executor.status.clone().unwrap().unusable);
    assert_eq!(condition(&executor, "Ready").0, "True");
    let next = run(env, name, "py", "1 + 1").await;
    assert_eq!(reason(&next), "Completed", "{:?}", next.status);
    assert_eq!(support::output(&next), "2");
}

#[tokio::test]
async fn exec_performed_then_answered_502_is_learnt_from_the_journal_and_the_executor_stays_usable()
{
    let env = TestEnv::new("e2e-502-after").await;
    let operator = Operator::start(&env).await;
    // A gateway answers 502 after the sandbox ran the code.
    let sandbox = executor_with_fault(&env, &operator, |id| {
        FaultRule::on(Operation::Exec, Fault::status_after_effect(502)).for_sandbox(id)
    })
    .await;

    let ran = run(&env, "ran", "py", &format!("{MARK}print('it ran')")).await;
    assert_eq!(reason(&ran), "Completed", "{:?}", ran.status);
    assert_eq!(
        ran.status.as_ref().unwrap().logs.as_deref(),
        Some("it ran\n")
    );
    assert_eq!(
        marker(&operator, &sandbox).await,
        "ran\n",
        "the code ran once"
    );
    assert_still_usable(&env, "next").await;
}

/// briq stays down past the outage patience: the outcome is called unknown, not guessed, and the
/// executor never runs code again.
#[tokio::test]
async fn an_outage_outlasting_the_patience_leaves_the_outcome_unknown_and_the_executor_unusable() {
    let env = TestEnv::new("e2e-patience").await;
    let operator = Operator::start_with(&env, |s| s.outage_patience = Duration::from_secs(3)).await;
    ready_executor(&env, "py").await;
    // The operator has confirmed with briq that the sandbox is the executor's own: the next
    // Execution's code is sent without asking briq anything else first.
    let first = run(&env, "first", "py", "1").await;
    assert_eq!(reason(&first), "Completed", "{:?}", first.status);
    operator
        .admin()
        .begin_outage(&Outage::new(503, Duration::from_secs(300)))
        .await
        .unwrap();
    let spec = json!({ "executorRef": { "name": "py" }, "code": "1 + 1", "timeoutSeconds": 1 });
    create_execution_from(&env, "lost", spec).await;

    let lost = finished(&env, "lost", RUN_SECONDS).await;
    assert_eq!(reason(&lost), "TransportError", "{:?}", lost.status);
    let (_, _, message) = condition(&lost, "Succeeded");
    assert!(message.contains("outcome stayed unknown"), "{message}");
    assert!(message.contains("may have run"), "{message}");
    operator.admin().clear_faults().await.unwrap();
    assert_unusable_for_good(&env, &operator, "outcome unknown").await;
}

#[tokio::test]
async fn exec_answered_429_without_performing_is_sent_again_once_and_the_executor_stays_usable() {
    let env = TestEnv::new("e2e-429").await;
    let operator = Operator::start(&env).await;
    let sandbox = executor_with_fault(&env, &operator, |id| {
        FaultRule::on(Operation::Exec, Fault::status(429)).for_sandbox(id)
    })
    .await;

    let refused = run(&env, "refused", "py", &format!("{MARK}print('sent again')")).await;
    assert_eq!(reason(&refused), "Completed", "{:?}", refused.status);
    assert_eq!(
        refused.status.as_ref().unwrap().logs.as_deref(),
        Some("sent again\n")
    );
    assert_eq!(
        marker(&operator, &sandbox).await,
        "ran\n",
        "the journal said it was never accepted, so it was sent again, and ran once"
    );
    assert_still_usable(&env, "next").await;
}

#[tokio::test]
async fn spilled_result_unreadable_after_the_exec_is_read_again_from_the_journal() {
    let env = TestEnv::new("e2e-spill-lost").await;
    let operator = Operator::start(&env).await;
    // Three 503s: every attempt of the (idempotent, retried) read of the spilled result fails.
    let sandbox = executor_with_fault(&env, &operator, |id| {
        FaultRule::on(Operation::ReadFile, Fault::status(503))
            .times(3)
            .for_sandbox(id)
    })
    .await;
    let reads_before = operator
        .admin()
        .stats()
        .await
        .unwrap()
        .calls(Operation::ReadFile);

    // Over 32 KiB of output: the bridge spills its answer to .briq/results/<nonce>.out.
    let big = run(&env, "big", "py", &format!("{MARK}print('a' * 40_000)")).await;
    assert_eq!(reason(&big), "Completed", "{:?}", big.status);
    assert_eq!(
        big.status.as_ref().unwrap().logs.as_deref(),
        Some(format!("{}\n", "a".repeat(40_000)).as_str())
    );
    assert_eq!(
        marker(&operator, &sandbox).await,
        "ran\n",
        "the code ran once"
    );
    let stats = operator.admin().stats().await.unwrap();
    assert!(
        stats.calls(Operation::ReadFile) > reads_before + 3,
        "the spilled result was asked for, then asked of the journal again"
    );
    assert_still_usable(&env, "next").await;
}

/// The operator is killed at random moments while 50 Executions run on 5 executors, 25 times
/// or more. Every Execution still ends, none runs twice (each counts its runs in a file on the
/// host), none is `Interrupted` (the kernels live, so the sandboxes' journals know every
/// outcome), and deleting the executors leaves no sandbox. Prints its figures.
#[tokio::test]
async fn killing_the_operator_at_random_never_runs_code_twice_nor_loses_an_execution() {
    use rand::Rng as _;
    const EXECUTORS: usize = 5;
    const PER_EXECUTOR: usize = 10;
    const KILLS: usize = 25;
    let env = TestEnv::new("e2e-chaos").await;
    let mut operator = Operator::start(&env).await;
    // The kernels run on this host: they count their runs in a directory every user can write.
    let counts = tempfile::Builder::new()
        .prefix("briq-chaos-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(
        counts.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    for e in 0..EXECUTORS {
        create_executor(&env, &format!("py-{e}"), json!({})).await;
    }
    for e in 0..EXECUTORS {
        wait_ready(&env, &format!("py-{e}")).await;
    }
    let mut rng = rand::rng();
    let mut names = Vec::new();
    for i in 0..PER_EXECUTOR {
        for e in 0..EXECUTORS {
            let name = format!("step-{e}-{i:02}");
            let marker = counts.path().join(&name);
            let pause = rng.random_range(300..700);
            let code = format!(
                "open({:?}, 'a').write('x')\nimport time\ntime.sleep({pause} / 1000)\n{i}",
                marker.display().to_string()
            );
            create_execution(&env, &name, &format!("py-{e}"), &code).await;
            names.push(name);
        }
    }
    let executions = env.api::<Execution>();
    let running = || async {
        let listed = executions.list(&ListParams::default()).await.unwrap();
        listed
            .items
            .iter()
            .filter(|e| reason(e) == "Running")
            .count()
    };
    let (mut kills, mut mid_run) = (0, 0);
    while kills < KILLS {
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..400))).await;
        if running().await > 0 {
            mid_run += 1;
        }
        operator.kill().await;
        kills += 1;
        operator.resume();
    }
    let mut reasons = std::collections::BTreeMap::<String, usize>::new();
    let mut ran_twice = Vec::new();
    let mut never_ran = Vec::new();
    for name in &names {
        let execution = finished(&env, name, RUN_SECONDS).await;
        *reasons.entry(reason(&execution)).or_default() += 1;
        let runs = std::fs::read_to_string(counts.path().join(name))
            .map(|text| text.len())
            .unwrap_or(0);
        match runs {
            0 => never_ran.push(name.clone()),
            1 => {}
            _ => ran_twice.push(name.clone()),
        }
    }
    for e in 0..EXECUTORS {
        env.api::<BriqExecutor>()
            .delete(&format!("py-{e}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    for e in 0..EXECUTORS {
        wait_deleted(&env.api::<BriqExecutor>(), &format!("py-{e}"), RUN_SECONDS).await;
    }
    let left = operator.live_sandboxes().await;
    println!(
        "kill-at-random: {} Executions on {EXECUTORS} executors, {kills} kills ({mid_run} while \
         an Execution was recorded Running); outcomes {reasons:?}; ran twice: {}; never ran: {}; \
         sandboxes left: {left}",
        names.len(),
        ran_twice.len(),
        never_ran.len(),
    );
    assert!(ran_twice.is_empty(), "ran twice: {ran_twice:?}");
    assert_eq!(reasons.get("Interrupted"), None, "{reasons:?}");
    assert_eq!(
        reasons.get("Completed"),
        Some(&names.len()),
        "every Execution completed: {reasons:?}; never ran: {never_ran:?}"
    );
    assert_eq!(left, 0, "no sandbox is left");
}

/// The executor's Expired state: Stalled for `IdleTimeout` with its sandbox given back.
fn expired(executor: &BriqExecutor) -> bool {
    let stalled = condition(executor, "Stalled");
    stalled.0 == "True"
        && stalled.1 == "IdleTimeout"
        && executor
            .status
            .as_ref()
            .is_some_and(|s| s.sandbox_id.is_none())
}

#[tokio::test]
async fn an_idle_executor_expires_gives_its_sandbox_back_and_never_runs_code_again() {
    let env = TestEnv::new("e2e-idle").await;
    let operator = Operator::start(&env).await;
    create_executor(&env, "py", json!({ "idleTimeoutSeconds": 3 })).await;
    wait_ready(&env, "py").await;
    assert_eq!(
        reason(&run(&env, "first", "py", "x = 1").await),
        "Completed"
    );

    let executor = wait_for(&env.api::<BriqExecutor>(), "py", 30, expired).await;
    let (ready, ready_reason, message) = condition(&executor, "Ready");
    assert_eq!(
        (ready.as_str(), ready_reason.as_str()),
        ("False", "IdleTimeout")
    );
    assert!(message.contains("idleTimeoutSeconds"), "{message}");
    assert_eq!(
        operator.live_sandboxes().await,
        0,
        "the sandbox was destroyed before it was forgotten"
    );
    assert!(
        !executor
            .annotations()
            .contains_key(briq_operator::crd::SANDBOX_ID_ANNOTATION)
    );
    let events = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Expired")),
        "an Expired Event"
    );

    // Final: new code is refused at once, and nothing reaches briq.
    let before = support::execs(&operator.admin()).await;
    let refused = run(&env, "late", "py", "x").await;
    assert_eq!(reason(&refused), "ExecutorUnusable");
    let (_, _, why) = condition(&refused, "Succeeded");
    assert!(why.contains("IdleTimeout"), "{why}");
    assert_eq!(support::execs(&operator.admin()).await, before);
}

#[tokio::test]
async fn an_execution_longer_than_the_idle_timeout_is_never_cut_short() {
    let env = TestEnv::new("e2e-idle-busy").await;
    let _operator = Operator::start(&env).await;
    create_executor(&env, "py", json!({ "idleTimeoutSeconds": 5 })).await;
    wait_ready(&env, "py").await;
    let long = run(&env, "long", "py", "import time\ntime.sleep(8)\n'done'").await;
    assert_eq!(reason(&long), "Completed", "{:?}", long.status);
    assert_eq!(output(&long), "'done'");
    // Idle counts from the end of that run, not from Ready: still ready right after it.
    let executor = env.api::<BriqExecutor>().get("py").await.unwrap();
    assert_eq!(
        condition(&executor, "Ready").0,
        "True",
        "{:?}",
        executor.status
    );
    wait_for(&env.api::<BriqExecutor>(), "py", 30, expired).await;
}
