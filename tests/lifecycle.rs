//! What agents ask of an executor's life beyond running code: cancelling an action (it stops,
//! the kernel and its Python state stay; one queued never runs), whatever else happens meanwhile
//! (an operator restart, a briq outage, the Execution deleted); suspending an idle executor and
//! resuming it with its Python state. Real kube-apiserver, real
//! operator, the local briq-compatible server with real kernels.

mod support;

use std::time::Duration;

use briq_dev::local_server::Outage;
use briq_operator::crd::{BriqExecutor, Execution};
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::{
    Gate, Operator, TestEnv, condition, create_execution_from, create_executor, finished, output,
    reason, run, wait_for, wait_ready,
};

/// Code that says it started (in its logs), then never ends on its own.
const RUNAWAY: &str = "print('started', flush=True)\nwhile True:\n    pass";

/// Code that swallows every interrupt: only a kernel restart ends it.
const STUBBORN: &str = "import time\nprint('started', flush=True)\nwhile True:\n    try:\n        \
                        time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass";

/// Creates Execution `name` running `code` on `executor` with the longest deadline, so that only
/// a cancel can end it within the test's waits.
async fn start(env: &TestEnv, name: &str, executor: &str, code: &str) {
    let spec = json!({ "executorRef": { "name": executor }, "code": code, "timeoutSeconds": 40 });
    create_execution_from(env, name, spec).await;
}

async fn cancel(env: &TestEnv, name: &str) {
    let patch = Patch::Merge(json!({ "spec": { "cancel": true } }));
    env.api::<Execution>()
        .patch(name, &PatchParams::default(), &patch)
        .await
        .expect("setting spec.cancel");
}

/// Waits until the Execution's code runs in its kernel: recorded `Running` (written once an
/// action outlasts 100 ms) with its attempt.
async fn running(env: &TestEnv, name: &str) {
    wait_for(&env.api::<Execution>(), name, 60, |e| {
        reason(e) == "Running" && e.status.as_ref().is_some_and(|s| s.attempt_id.is_some())
    })
    .await;
}

fn error_name(execution: &Execution) -> String {
    execution
        .status
        .as_ref()
        .and_then(|s| s.error.as_ref())
        .map(|e| e.name.clone())
        .unwrap_or_default()
}

fn logs(execution: &Execution) -> String {
    execution
        .status
        .as_ref()
        .and_then(|s| s.logs.clone())
        .unwrap_or_default()
}

/// The executor is Ready, usable, and its kernel still holds `x = 41`.
async fn keeps_its_state(env: &TestEnv, executor: &str, probe: &str) {
    let after = run(env, probe, executor, "x + 1").await;
    assert_eq!(reason(&after), "Completed", "{:?}", after.status);
    assert_eq!(output(&after), "42");
    let executor = env.api::<BriqExecutor>().get(executor).await.unwrap();
    assert_eq!(condition(&executor, "Ready").0, "True");
    assert!(!executor.status.unwrap_or_default().unusable);
}

async fn executor_with_state(env: &TestEnv, name: &str) {
    create_executor(env, name, json!({})).await;
    wait_ready(env, name).await;
    let set = run(env, &format!("{name}-set"), name, "x = 41").await;
    assert_eq!(reason(&set), "Completed", "{:?}", set.status);
}

#[tokio::test]
async fn a_runaway_loop_cancelled_ends_cancelled_and_its_executor_keeps_its_python_state() {
    let env = TestEnv::new("cancel-runaway").await;
    let _operator = Operator::start(&env).await;
    executor_with_state(&env, "py").await;

    start(&env, "runaway", "py", RUNAWAY).await;
    running(&env, "runaway").await;
    cancel(&env, "runaway").await;
    let cancelled = finished(&env, "runaway", 30).await;
    assert_eq!(reason(&cancelled), "Cancelled", "{:?}", cancelled.status);
    assert_eq!(error_name(&cancelled), "Cancelled");
    assert!(
        condition(&cancelled, "Succeeded")
            .2
            .contains("keeps its state"),
        "{:?}",
        cancelled.status
    );
    assert!(
        logs(&cancelled).contains("started"),
        "output up to the cancel is kept"
    );

    keeps_its_state(&env, "py", "after").await;
}

#[tokio::test]
async fn code_that_swallows_the_interrupt_is_cancelled_by_a_kernel_restart_that_says_the_state_is_gone()
 {
    let env = TestEnv::new("cancel-stubborn").await;
    let _operator = Operator::start(&env).await;
    executor_with_state(&env, "py").await;

    start(&env, "stubborn", "py", STUBBORN).await;
    running(&env, "stubborn").await;
    cancel(&env, "stubborn").await;
    let cancelled = finished(&env, "stubborn", 60).await;
    assert_eq!(reason(&cancelled), "Cancelled", "{:?}", cancelled.status);
    assert_eq!(error_name(&cancelled), "KernelRestarted");
    let message = condition(&cancelled, "Succeeded").2;
    assert!(message.contains("state is gone"), "{message}");

    // A new kernel: usable, and `x` went with the old one.
    let after = run(&env, "after", "py", "x").await;
    assert_eq!(reason(&after), "CodeError", "{:?}", after.status);
    assert_eq!(error_name(&after), "NameError");
    let works = run(&env, "works", "py", "1 + 1").await;
    assert_eq!(output(&works), "2");
}

#[tokio::test]
async fn an_execution_cancelled_while_queued_never_runs() {
    let env = TestEnv::new("cancel-queued").await;
    let _operator = Operator::start(&env).await;
    executor_with_state(&env, "py").await;

    let gate = Gate::new();
    start(&env, "head", "py", &gate.code("x")).await;
    running(&env, "head").await;
    start(&env, "queued", "py", "x = 0\nx").await;
    wait_for(&env.api::<Execution>(), "queued", 30, |e| {
        reason(e) == "Queued"
    })
    .await;
    cancel(&env, "queued").await;
    let cancelled = finished(&env, "queued", 30).await;
    assert_eq!(reason(&cancelled), "Cancelled", "{:?}", cancelled.status);
    let message = condition(&cancelled, "Succeeded").2;
    assert!(message.contains("never ran"), "{message}");

    gate.open();
    let head = finished(&env, "head", 30).await;
    assert_eq!(output(&head), "41", "{:?}", head.status);
    keeps_its_state(&env, "py", "after").await;
}

#[tokio::test]
async fn a_cancel_made_while_the_operator_was_down_reaches_the_same_end() {
    let env = TestEnv::new("cancel-restart").await;
    let mut operator = Operator::start(&env).await;
    executor_with_state(&env, "py").await;

    start(&env, "runaway", "py", RUNAWAY).await;
    running(&env, "runaway").await;
    operator.kill().await;
    cancel(&env, "runaway").await;
    operator.resume();
    let cancelled = finished(&env, "runaway", 30).await;
    assert_eq!(reason(&cancelled), "Cancelled", "{:?}", cancelled.status);
    assert_eq!(error_name(&cancelled), "Cancelled");
    keeps_its_state(&env, "py", "after").await;
}

#[tokio::test]
async fn a_cancel_during_a_briq_outage_ends_as_the_journal_confirms_once_briq_answers() {
    let env = TestEnv::new("cancel-outage").await;
    let operator = Operator::start(&env).await;
    executor_with_state(&env, "py").await;

    start(&env, "runaway", "py", RUNAWAY).await;
    running(&env, "runaway").await;
    operator
        .admin()
        .begin_outage(&Outage::new(503, Duration::from_secs(10)))
        .await
        .unwrap();
    // The cancel reaches briq during its outage (answered 503, not performed): it is asked
    // again until briq carries it, so the code does not run on to its 40 s deadline (Timeout,
    // the executor unusable).
    cancel(&env, "runaway").await;
    let cancelled = finished(&env, "runaway", 90).await;
    assert_eq!(reason(&cancelled), "Cancelled", "{:?}", cancelled.status);
    assert_eq!(error_name(&cancelled), "Cancelled");
    keeps_its_state(&env, "py", "after").await;
}

#[tokio::test]
async fn deleting_a_running_execution_stops_its_code_and_keeps_the_executor() {
    let env = TestEnv::new("cancel-delete").await;
    let _operator = Operator::start(&env).await;
    executor_with_state(&env, "py").await;

    start(&env, "runaway", "py", RUNAWAY).await;
    running(&env, "runaway").await;
    env.api::<Execution>()
        .delete("runaway", &DeleteParams::default())
        .await
        .unwrap();
    // Without the cancel, the loop would hold the kernel until its 40 s deadline and then
    // leave the executor unusable (Timeout); this one runs as soon as the kernel is free.
    keeps_its_state(&env, "py", "after").await;
}

/// The pieces suspending an executor is made of, on a real kernel and the local server's stop and
/// start: the kernel saves its namespace inside the sandbox, the sandbox stops (every process
/// ends, the disk stays) and starts, a new kernel starts, and the namespace comes back — a
/// value, a defined function and a module alias — while what cannot be saved (an open socket)
/// is named, never dropped in silence. The operator only ever reads names and counts.
#[tokio::test]
async fn a_namespace_saved_in_the_sandbox_comes_back_after_a_stop_and_start() {
    use briq_operator::{
        bridge::session::Session,
        briq::{BriqClient, ClientOptions, SandboxApi as _, SandboxState},
    };

    let env = TestEnv::new("suspend-parts").await;
    // No probe while the test stops the sandbox behind the operator's back: the operator would
    // rightly call its kernel lost (suspending will tell it first).
    let operator = Operator::start_with(&env, |settings| {
        settings.probe_interval = Duration::from_secs(3600)
    })
    .await;
    create_executor(&env, "py", json!({})).await;
    let ready = wait_ready(&env, "py").await;
    let code = "import json as j, socket\nx = 41\ndef f():\n    return 1\nsock = socket.socket()";
    let set = run(&env, "set", "py", code).await;
    assert_eq!(reason(&set), "Completed", "{:?}", set.status);

    let client = BriqClient::new(ClientOptions::local(operator.server.url())).unwrap();
    let sandbox_id = support::sandbox_of(&ready);
    let session = Session {
        api: &client,
        key: operator.server.api_key(),
        sandbox_id: &sandbox_id,
    };
    let deadline = Duration::from_secs(30);
    let saved = session.save_state(deadline).await.unwrap();
    assert!(saved.ok, "{saved:?}");
    let mut names = saved.saved.clone();
    names.sort();
    assert_eq!(names, ["f", "j", "socket", "x"]);
    assert_eq!(saved.unsaved.len(), 1, "{saved:?}");
    assert_eq!(saved.unsaved[0].name, "sock");
    assert!(saved.bytes > 0);

    let key = operator.server.api_key();
    let stopped = client.stop_sandbox(key, &sandbox_id).await.unwrap();
    assert_eq!(stopped.state, SandboxState::Stopped);
    assert_eq!(
        client.start_sandbox(key, &sandbox_id).await.unwrap().state,
        SandboxState::Running
    );
    let kernel = session.start_kernel().await.unwrap();
    assert!(kernel.alive && kernel.started, "a new kernel: {kernel:?}");
    let restored = session.restore_state(deadline).await.unwrap();
    assert!(restored.ok, "{restored:?}");
    assert_eq!(restored.saved.len(), 4, "{restored:?}");

    let back = run(&env, "back", "py", "j.dumps(x + f())").await;
    assert_eq!(reason(&back), "Completed", "{:?}", back.status);
    assert_eq!(output(&back), "'42'");
}

/// Sets `spec.suspend` of executor `name`.
async fn set_suspend(env: &TestEnv, name: &str, suspend: bool) {
    let patch = Patch::Merge(json!({ "spec": { "suspend": suspend } }));
    env.api::<BriqExecutor>()
        .patch(name, &PatchParams::default(), &patch)
        .await
        .expect("setting spec.suspend");
}

/// Waits until executor `name` reports `Suspended`.
async fn suspended(env: &TestEnv, name: &str) -> BriqExecutor {
    wait_for(&env.api::<BriqExecutor>(), name, 60, |executor| {
        condition(executor, "Ready").1 == "Suspended"
    })
    .await
}

/// The state briq (the local server) gives the sandbox `id`.
async fn sandbox_state(
    operator: &Operator,
    id: &str,
) -> Result<briq_operator::briq::SandboxState, briq_operator::briq::Error> {
    use briq_operator::briq::{BriqClient, ClientOptions, SandboxApi as _};
    let client = BriqClient::new(ClientOptions::local(operator.server.url())).unwrap();
    client
        .get_sandbox(operator.server.api_key(), id)
        .await
        .map(|sandbox| sandbox.state)
}

/// A value, a function and a module alias set on an executor, with an open socket beside them.
const STATE: &str =
    "import json as j, socket\nx = 41\ndef f():\n    return 1\nsock = socket.socket()";

#[tokio::test]
async fn a_suspended_executor_stops_its_sandbox_and_resumes_with_its_namespace_naming_what_it_could_not_save()
 {
    use briq_operator::briq::SandboxState;

    let env = TestEnv::new("suspend-resume").await;
    let operator = Operator::start(&env).await;
    create_executor(&env, "py", json!({})).await;
    let sandbox = support::sandbox_of(&wait_ready(&env, "py").await);
    let set = run(&env, "set", "py", STATE).await;
    assert_eq!(reason(&set), "Completed", "{:?}", set.status);

    set_suspend(&env, "py", true).await;
    let asleep = suspended(&env, "py").await;
    assert_eq!(condition(&asleep, "Suspended").0, "True");
    let suspension = asleep.status.clone().unwrap().suspension.expect("recorded");
    assert_eq!(suspension.saved_names, 4, "{suspension:?}");
    assert!(suspension.saved_bytes > 0);
    let unsaved: Vec<&str> = suspension.unsaved.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(
        unsaved,
        ["sock"],
        "the socket is named, never dropped in silence"
    );
    assert!(condition(&asleep, "Ready").2.contains("sock"));
    assert_eq!(
        sandbox_state(&operator, &sandbox).await.unwrap(),
        SandboxState::Stopped
    );

    set_suspend(&env, "py", false).await;
    let awake = wait_ready(&env, "py").await;
    assert_eq!(condition(&awake, "Suspended").1, "Resumed");
    assert_eq!(support::sandbox_of(&awake), sandbox, "the same sandbox");
    let back = run(&env, "back", "py", "j.dumps(x + f())").await;
    assert_eq!(reason(&back), "Completed", "{:?}", back.status);
    assert_eq!(output(&back), "'42'");
    let gone = run(&env, "gone", "py", "sock").await;
    assert_eq!(error_name(&gone), "NameError", "{:?}", gone.status);
}

#[tokio::test]
async fn an_execution_created_while_suspended_resumes_the_executor_runs_once_and_it_suspends_again()
{
    let env = TestEnv::new("suspend-wake").await;
    let _operator = Operator::start(&env).await;
    executor_with_state(&env, "py").await;
    set_suspend(&env, "py", true).await;
    suspended(&env, "py").await;

    let bumped = run(&env, "bump", "py", "x += 1\nx").await;
    assert_eq!(reason(&bumped), "Completed", "{:?}", bumped.status);
    assert_eq!(output(&bumped), "42");
    // spec.suspend still asks it: once nothing waits, it is suspended again.
    suspended(&env, "py").await;
    let again = run(&env, "again", "py", "x").await;
    assert_eq!(
        output(&again),
        "42",
        "the action ran once: x was bumped once"
    );
}

#[tokio::test]
async fn deleting_a_suspended_executor_destroys_its_sandbox() {
    let env = TestEnv::new("suspend-delete").await;
    let operator = Operator::start(&env).await;
    create_executor(&env, "py", json!({ "suspend": true })).await;
    let asleep = suspended(&env, "py").await;
    let sandbox = support::sandbox_of(&asleep);

    env.api::<BriqExecutor>()
        .delete("py", &DeleteParams::default())
        .await
        .unwrap();
    support::wait_deleted(&env.api::<BriqExecutor>(), "py", 60).await;
    let state = sandbox_state(&operator, &sandbox).await;
    assert!(
        matches!(state, Err(ref e) if e.class() == briq_operator::briq::ErrorClass::NotFound)
            || matches!(state, Ok(briq_operator::briq::SandboxState::Destroyed)),
        "{state:?}"
    );
}

#[tokio::test]
async fn an_idle_executor_whose_idle_action_is_suspend_is_suspended_not_expired_and_resumed_by_the_next_execution()
 {
    use briq_operator::briq::SandboxState;

    let env = TestEnv::new("suspend-idle").await;
    // An idle timeout is looked at again at the latest one probe interval after an Execution
    // ends (then exactly when it is due): a short interval keeps an idle timeout of seconds on
    // time.
    let operator = Operator::start_with(&env, |s| s.probe_interval = Duration::from_secs(2)).await;
    let spec = json!({ "idleTimeoutSeconds": 3, "idleAction": "Suspend" });
    create_executor(&env, "py", spec).await;
    let sandbox = support::sandbox_of(&wait_ready(&env, "py").await);
    let set = run(&env, "set", "py", "x = 41").await;
    assert_eq!(reason(&set), "Completed", "{:?}", set.status);

    // Idle for its timeout: suspended with its namespace, its sandbox stopped, not destroyed.
    let asleep = suspended(&env, "py").await;
    assert_eq!(condition(&asleep, "Stalled").0, "False");
    assert!(
        condition(&asleep, "Ready")
            .2
            .contains("idleAction: Suspend"),
        "{:?}",
        asleep.status
    );
    assert_eq!(
        sandbox_state(&operator, &sandbox).await.unwrap(),
        SandboxState::Stopped
    );

    // The next Execution resumes it, with its state, and once idle again it is suspended again.
    let bumped = run(&env, "bump", "py", "x += 1\nx").await;
    assert_eq!(reason(&bumped), "Completed", "{:?}", bumped.status);
    assert_eq!(output(&bumped), "42");
    let again = suspended(&env, "py").await;
    assert_eq!(support::sandbox_of(&again), sandbox, "the same sandbox");
}
