//! Forking an executor with its Python state (`spec.forkFrom`): a fork's kernel starts with its
//! source's namespace and working files, taken between two of the source's Executions, in a
//! sandbox of its own; whatever happens meanwhile (the source busy, the operator killed, the
//! source suspended, missing or in another namespace). Real kube-apiserver, real operator, the
//! local briq-compatible server with real kernels.

mod support;

use std::time::Duration;

use briq_dev::{
    local_server::{Fault, FaultRule, Operation},
    wait,
};
use briq_operator::crd::{BriqExecutor, Execution};
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::{
    Gate, Operator, TestEnv, condition, create_execution, create_executor, finished, output,
    reason, run, wait_deleted, wait_for, wait_ready,
};

/// A value, a function, a module alias, a file in the kernel's working directory and an open
/// socket (which cannot be saved) in an executor's kernel.
const STATE: &str = "import json as j, socket\nx = 41\ndef f():\n    return 1\n\
                     open('notes.txt', 'w').write('kept')\nsock = socket.socket()";

/// What a fork of an executor holding [`STATE`] answers when it has all of it.
const PROBE: &str = "j.dumps([x + f(), open('notes.txt').read()])";

async fn create_fork(env: &TestEnv, name: &str, source: &str) {
    create_executor(env, name, json!({ "forkFrom": { "name": source } })).await;
}

fn ready_reason(executor: &BriqExecutor) -> String {
    condition(executor, "Ready").1
}

async fn set_state(env: &TestEnv, executor: &str) {
    let set = run(env, "set-state", executor, STATE).await;
    assert_eq!(reason(&set), "Completed", "{:?}", set.status);
}

#[tokio::test]
async fn a_fork_starts_with_its_sources_namespace_and_files_in_a_sandbox_of_its_own() {
    let env = TestEnv::new("fork-state").await;
    let operator = Operator::start(&env).await;
    create_executor(&env, "src", json!({})).await;
    let source_sandbox = support::sandbox_of(&wait_ready(&env, "src").await);
    set_state(&env, "src").await;

    create_fork(&env, "twin", "src").await;
    let fork = wait_ready(&env, "twin").await;
    assert_ne!(support::sandbox_of(&fork), source_sandbox);
    let origin = fork.status.clone().unwrap().fork.expect("its origin");
    assert_eq!(
        (origin.from.as_str(), origin.source_sandbox.as_str()),
        ("src", source_sandbox.as_str())
    );
    assert!(origin.restored_time.is_some());
    let unsaved: Vec<&str> = origin.unsaved.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(unsaved, ["sock"], "named, never dropped in silence");

    let probed = run(&env, "probe-fork", "twin", PROBE).await;
    assert_eq!(output(&probed), "'[42, \"kept\"]'", "{:?}", probed.status);
    // Two branches from here on: what one does, the other never sees.
    run(
        &env,
        "diverge",
        "twin",
        "x = 0\nopen('notes.txt', 'w').write('fork')",
    )
    .await;
    let source_still = run(&env, "probe-source", "src", PROBE).await;
    assert_eq!(
        output(&source_still),
        "'[42, \"kept\"]'",
        "{:?}",
        source_still.status
    );
    let source = env.api::<BriqExecutor>().get("src").await.unwrap();
    assert_eq!(ready_reason(&source), "KernelReady");
    assert!(
        source.status.unwrap().snapshot.is_some(),
        "the source says what it saved"
    );
    assert_eq!(operator.live_sandboxes().await, 2);
}

#[tokio::test]
async fn a_fork_made_while_the_source_runs_waits_for_the_turn_and_takes_the_state_between_two_actions()
 {
    let env = TestEnv::new("fork-turn").await;
    let _operator = Operator::start(&env).await;
    create_executor(&env, "src", json!({})).await;
    wait_ready(&env, "src").await;
    let gate = Gate::new();
    create_execution(&env, "busy", "src", &gate.code("y = 1")).await;
    wait_for(&env.api::<Execution>(), "busy", 60, |e| {
        reason(e) == "Running"
    })
    .await;

    create_fork(&env, "twin", "src").await;
    // The source pauses its queue while its running action goes on; the fork waits for it.
    wait_for(&env.api::<BriqExecutor>(), "src", 30, |e| {
        ready_reason(e) == "Forking"
    })
    .await;
    wait_for(&env.api::<BriqExecutor>(), "twin", 30, |e| {
        ready_reason(e) == "WaitingForSnapshot"
    })
    .await;
    // Created during the pause: it runs after the snapshot, so the fork never sees it.
    create_execution(&env, "after", "src", "y = 2").await;
    gate.open();
    assert_eq!(reason(&finished(&env, "busy", 60).await), "Completed");

    wait_ready(&env, "twin").await;
    let forked = run(&env, "probe-fork", "twin", "y").await;
    assert_eq!(output(&forked), "1", "{:?}", forked.status);
    assert_eq!(reason(&finished(&env, "after", 60).await), "Completed");
    let source = run(&env, "probe-source", "src", "y").await;
    assert_eq!(output(&source), "2", "{:?}", source.status);
}

#[tokio::test]
async fn an_operator_killed_after_briq_forked_makes_no_second_fork_sandbox_and_leaks_none() {
    let env = TestEnv::new("fork-crash").await;
    let mut operator = Operator::start(&env).await;
    create_executor(&env, "src", json!({})).await;
    wait_ready(&env, "src").await;
    set_state(&env, "src").await;
    // briq makes the fork, and the answer never comes back: as if the operator died then.
    operator
        .admin()
        .add_fault(&FaultRule::on(Operation::Fork, Fault::DropAfterEffect).times(1))
        .await
        .unwrap();
    create_fork(&env, "twin", "src").await;
    let admin = operator.admin();
    wait::poll(
        Duration::from_secs(60),
        Duration::from_millis(20),
        "briq forked the source's sandbox",
        || async { Ok(admin.stats().await?.calls(Operation::Fork) >= 1) },
    )
    .await
    .unwrap();
    operator.kill().await;
    operator.resume();

    wait_ready(&env, "twin").await;
    let probed = run(&env, "probe-fork", "twin", PROBE).await;
    assert_eq!(output(&probed), "'[42, \"kept\"]'", "{:?}", probed.status);
    let stats = operator.admin().stats().await.unwrap();
    assert_eq!(
        stats.calls(Operation::Fork),
        1,
        "the fork found by its name, never made again"
    );
    assert_eq!(operator.live_sandboxes().await, 2);

    let executors = env.api::<BriqExecutor>();
    for name in ["twin", "src"] {
        executors
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
        wait_deleted(&executors, name, 60).await;
    }
    assert_eq!(operator.live_sandboxes().await, 0, "nothing leaked");
}

#[tokio::test]
async fn a_fork_of_a_deleted_source_or_one_in_another_namespace_waits_and_creates_nothing() {
    let env = TestEnv::new("fork-missing").await;
    let other = TestEnv::new("fork-other").await;
    let operator = Operator::start(&env).await;
    create_executor(&env, "src", json!({})).await;
    wait_ready(&env, "src").await;
    let executors = env.api::<BriqExecutor>();
    executors
        .delete("src", &DeleteParams::default())
        .await
        .unwrap();
    wait_deleted(&executors, "src", 60).await;
    // Another namespace's executor of that name is never found: forkFrom names one of its own.
    create_executor(&other, "src", json!({})).await;

    create_fork(&env, "twin", "src").await;
    let waiting = wait_for(&executors, "twin", 30, |e| {
        ready_reason(e) == "ForkSourceNotFound"
    })
    .await;
    assert_eq!(
        condition(&waiting, "Stalled").0,
        "False",
        "it waits for the source"
    );
    assert_eq!(support::sandbox_of(&waiting), "");
    assert_eq!(operator.live_sandboxes().await, 0, "no sandbox made for it");
    let stats = operator.admin().stats().await.unwrap();
    assert_eq!(stats.calls(Operation::Fork), 0);

    // A namespace is not a field of forkFrom: a manifest that names one is refused.
    let manifest = tempfile::NamedTempFile::new().unwrap();
    let across = json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
        "metadata": { "name": "across" },
        "spec": { "forkFrom": { "name": "src", "namespace": other.namespace } },
    });
    std::fs::write(manifest.path(), across.to_string()).unwrap();
    let path = manifest.path().to_str().unwrap();
    let (created, _, refused) = env.kubectl(&["create", "--validate=strict", "-f", path]);
    assert!(
        !created && refused.contains("forkFrom.namespace"),
        "{refused}"
    );

    // The source made again: the fork goes on from it.
    create_executor(&env, "src", json!({})).await;
    wait_ready(&env, "twin").await;
}

/// Waits until briq (the local server) has sandbox `id` stopped.
async fn stopped_again(operator: &Operator, id: &str) {
    use briq_operator::briq::{BriqClient, ClientOptions, SandboxApi as _, SandboxState};

    let client = BriqClient::new(ClientOptions::local(operator.server.url())).unwrap();
    wait::poll(
        Duration::from_secs(30),
        Duration::from_millis(50),
        "the source's sandbox is stopped again",
        || async {
            let sandbox = client.get_sandbox(operator.server.api_key(), id).await?;
            Ok(sandbox.state == SandboxState::Stopped)
        },
    )
    .await
    .unwrap();
}

/// Sets `spec.suspend` of executor `name`.
async fn set_suspend(env: &TestEnv, name: &str, suspend: bool) {
    let patch = Patch::Merge(json!({ "spec": { "suspend": suspend } }));
    env.api::<BriqExecutor>()
        .patch(name, &PatchParams::default(), &patch)
        .await
        .expect("setting spec.suspend");
}

#[tokio::test]
async fn a_fork_of_a_suspended_source_takes_its_saved_state_and_the_source_stays_suspended() {
    let env = TestEnv::new("fork-asleep").await;
    let operator = Operator::start(&env).await;
    create_executor(&env, "src", json!({})).await;
    let source_sandbox = support::sandbox_of(&wait_ready(&env, "src").await);
    set_state(&env, "src").await;
    set_suspend(&env, "src", true).await;
    let executors = env.api::<BriqExecutor>();
    wait_for(&executors, "src", 60, |e| ready_reason(e) == "Suspended").await;

    create_fork(&env, "twin", "src").await;
    let fork = wait_ready(&env, "twin").await;
    let unsaved: Vec<String> = fork
        .status
        .unwrap()
        .fork
        .unwrap()
        .unsaved
        .into_iter()
        .map(|u| u.name)
        .collect();
    assert_eq!(unsaved, ["sock"], "the suspension's names not saved");
    let probed = run(&env, "probe-fork", "twin", PROBE).await;
    assert_eq!(output(&probed), "'[42, \"kept\"]'", "{:?}", probed.status);

    // The source was never resumed, and its sandbox is stopped again once the fork has read.
    stopped_again(&operator, &source_sandbox).await;
    let source = executors.get("src").await.unwrap();
    assert_eq!(ready_reason(&source), "Suspended");
    assert!(
        source
            .status
            .unwrap()
            .suspension
            .unwrap()
            .resumed_time
            .is_none()
    );
}

#[tokio::test]
async fn three_forks_made_while_the_source_runs_share_one_save() {
    let env = TestEnv::new("fork-three").await;
    let _operator = Operator::start(&env).await;
    create_executor(&env, "src", json!({})).await;
    wait_ready(&env, "src").await;
    set_state(&env, "src").await;
    let gate = Gate::new();
    create_execution(&env, "busy", "src", &gate.code("y = 1")).await;
    wait_for(&env.api::<Execution>(), "busy", 60, |e| {
        reason(e) == "Running"
    })
    .await;
    let names = ["a", "b", "c"];
    for name in names {
        create_fork(&env, name, "src").await;
    }
    let executors = env.api::<BriqExecutor>();
    for name in names {
        wait_for(&executors, name, 30, |e| {
            ready_reason(e) == "WaitingForSnapshot"
        })
        .await;
    }
    gate.open();

    let mut uids = Vec::new();
    for name in names {
        let fork = wait_ready(&env, name).await;
        uids.push(fork.metadata.uid.clone().unwrap());
        let probed = run(&env, &format!("probe-{name}"), name, PROBE).await;
        assert_eq!(output(&probed), "'[42, \"kept\"]'", "{:?}", probed.status);
    }
    let source = executors.get("src").await.unwrap();
    let mut served = source.status.unwrap().snapshot.expect("a snapshot").forks;
    served.sort();
    uids.sort();
    assert_eq!(served, uids, "one snapshot saved for all three");
}

/// A suspended source's sandbox is started for its forks; the operator dies right after, and the
/// fork is gone by the time it is back: the sandbox is stopped again, never left running.
#[tokio::test]
async fn a_suspended_sources_sandbox_started_for_a_fork_that_went_is_stopped_after_a_crash() {
    let env = TestEnv::new("fork-asleep-crash").await;
    let mut operator = Operator::start(&env).await;
    create_executor(&env, "src", json!({})).await;
    let source_sandbox = support::sandbox_of(&wait_ready(&env, "src").await);
    set_suspend(&env, "src", true).await;
    let executors = env.api::<BriqExecutor>();
    wait_for(&executors, "src", 60, |e| ready_reason(e) == "Suspended").await;
    // briq starts the sandbox and every answer is lost: the operator cannot know it runs.
    let admin = operator.admin();
    admin
        .add_fault(&FaultRule::on(Operation::Start, Fault::DropAfterEffect))
        .await
        .unwrap();
    create_fork(&env, "twin", "src").await;
    wait::poll(
        Duration::from_secs(60),
        Duration::from_millis(20),
        "briq started the source's sandbox",
        || async { Ok(admin.stats().await?.calls(Operation::Start) >= 1) },
    )
    .await
    .unwrap();
    executors
        .delete("twin", &DeleteParams::default())
        .await
        .unwrap();
    wait_deleted(&executors, "twin", 60).await;
    operator.kill().await;
    admin.clear_faults().await.unwrap();
    operator.resume();

    stopped_again(&operator, &source_sandbox).await;
    assert_eq!(
        ready_reason(&executors.get("src").await.unwrap()),
        "Suspended"
    );
}
