//! An upgrade from the previous release, as a platform team does it with Helm: the previous
//! release's operator (its binary built from its commit by `compat/build.sh`, run as a process of
//! its own) on its CRDs (`compat/<version>/`) leaves executors holding Python state, a full pool,
//! a running Execution and queued ones. Then the new CRDs are applied with the command the
//! Upgrades page gives, the old operator is stopped as a rolling update stops a pod (SIGTERM,
//! then SIGKILL once its grace runs out with the action still in its kernel), and this tree's
//! operator takes over: nothing may be lost.
//!
//! Its own control plane (the old CRDs first), so it never shares one with the other tests.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use briq_dev::{
    local_server::{AdminClient, Operation},
    stack::{Controllers, Stack},
};
use briq_operator::crd::{
    BriqExecutor, BriqExecutorPool, Execution, POOL_LABEL, TEMPLATE_HASH_LABEL,
};
use kube::{ResourceExt, api::ListParams};
use serde_json::json;
use support::{
    Gate, READY_SECONDS, TestEnv, condition, create_execution, create_executor, create_pool,
    finished, output, reason, run, sandbox_of, wait_for, wait_ready,
};
use tokio::io::{AsyncBufReadExt as _, BufReader};

/// The release this tree upgrades from: the newest under `compat/`.
const PREVIOUS: &str = "0.1.0";
/// How long an Execution may take to be seen running or to finish, on a loaded machine.
const RUN_SECONDS: u64 = 60;

#[tokio::test]
async fn an_upgrade_from_the_previous_release_keeps_every_sandbox_its_state_queue_and_pool() {
    let Some(previous) = previous_operator() else {
        return;
    };
    let stack = Stack::builder()
        .released_crds(PREVIOUS)
        .start()
        .await
        .expect("a control plane with the previous release's CRDs");
    let env = TestEnv {
        client: stack.admin().clone(),
        namespace: "upgrade".into(),
        kubeconfig: stack.kubeconfig().to_owned(),
        kubectl: stack.kubectl(),
    };
    stack.namespace(&env.namespace).await.unwrap();
    // Both surfaces on one server: the previous release speaks REST, this one MCP.
    let server = support::sandbox_server_with_the_previous_surface().await;
    let admin = server.admin();

    // The previous release runs: two executors and a pool of two, all Ready.
    let mut old = PreviousOperator::start(&previous, &env, &server).await;
    create_executor(&env, "keeper", json!({})).await;
    create_executor(&env, "busy", json!({})).await;
    create_pool(&env, "warm", 2, json!({})).await;
    wait_ready(&env, "keeper").await;
    wait_ready(&env, "busy").await;
    let members = pool_ready(&env, "warm").await;
    assert_eq!(
        reason(&run(&env, "set", "keeper", "x = 41").await),
        "Completed"
    );

    // An action in its kernel on `busy`, and two more queued behind it.
    let gate = Gate::new();
    let execs = support::execs(&admin).await;
    let long = format!("runs = ['long']\n{}", gate.code("'long done'"));
    // The longest deadline there is: the action must outlast the upgrade on a loaded machine.
    let spec = json!({ "executorRef": { "name": "busy" }, "code": long, "timeoutSeconds": 40 });
    support::create_execution_from(&env, "long", spec).await;
    wait_for(&env.api::<Execution>(), "long", RUN_SECONDS, |e| {
        reason(e) == "Running"
    })
    .await;
    support::code_reached_sandbox(&admin, execs).await;
    for name in ["q1", "q2"] {
        let code = format!("runs.append({name:?})\nlen(runs)");
        create_execution(&env, name, "busy", &code).await;
        wait_for(&env.api::<Execution>(), name, RUN_SECONDS, |e| {
            reason(e) == "Queued"
        })
        .await;
    }
    let before = Snapshot::take(&env, &admin).await;

    // The upgrade: the new CRDs first, then the old operator goes as a rolling update ends a pod.
    let crds = support::repo_root().join("charts/briq-operator/crds");
    let (applied, out, err) = env.kubectl(&[
        "apply",
        "--server-side",
        // The CRDs' fields belong to whoever installed them (Helm, or an earlier apply): the
        // documented command takes them over, as it must.
        "--force-conflicts",
        "-f",
        crds.to_str().unwrap(),
    ]);
    assert!(applied, "applying the new CRDs: {out}{err}");
    old.terminate_and_wait_until_draining().await;
    assert_eq!(reason(&execution(&env, "long").await), "Running");
    assert_eq!(
        reason(&execution(&env, "q1").await),
        "Queued",
        "nothing new starts"
    );
    old.kill().await;

    // This tree's operator takes over, and the action ends only now.
    let new = Controllers::start(
        env.client.clone(),
        &server,
        support::settings(&env, &server),
    )
    .expect("the new operator's controllers");
    gate.open();
    let long = finished(&env, "long", RUN_SECONDS).await;
    assert_eq!(
        reason(&long),
        "Completed",
        "{:?}",
        condition(&long, "Succeeded")
    );
    assert_eq!(
        output(&long),
        "'long done'",
        "the running action's result is recorded"
    );
    for (name, runs) in [("q1", "2"), ("q2", "3")] {
        let queued = finished(&env, name, RUN_SECONDS).await;
        assert_eq!(
            reason(&queued),
            "Completed",
            "{:?}",
            condition(&queued, "Succeeded")
        );
        assert_eq!(output(&queued), runs, "{name} runs after the running one");
    }
    let runs = run(&env, "runs", "busy", "runs").await;
    assert_eq!(
        output(&runs),
        "['long', 'q1', 'q2']",
        "each action ran once, in order"
    );
    let state = run(&env, "state", "keeper", "x + 1").await;
    assert_eq!(output(&state), "42", "the kernel's state is kept");

    // The pool is not rolled: a claim under the new operator takes an old member's sandbox, the
    // refill is the only sandbox created, and the other member stays as it was. The claimer's
    // environment reaches the old member's kernel, whose bridge has no `set-env`: provisioning
    // installs this release's bridge first.
    let claim_env = json!([{ "name": "REGION", "value": "eu" }]);
    create_executor(
        &env,
        "claimer",
        json!({ "poolRef": { "name": "warm", "env": claim_env } }),
    )
    .await;
    let claimer = wait_ready(&env, "claimer").await;
    let region = run(
        &env,
        "region",
        "claimer",
        "import os\nos.environ.get('REGION')",
    )
    .await;
    assert_eq!(output(&region), "'eu'", "{:?}", region.status);
    let after_claim = pool_ready(&env, "warm").await;
    let taken = sandbox_of(&claimer);
    assert!(
        members.values().any(|sandbox| sandbox == &taken),
        "the claimer has an old member's sandbox: {taken} of {members:?}"
    );
    let kept: BTreeMap<_, _> = members
        .iter()
        .filter(|(_, sandbox)| **sandbox != taken)
        .map(|(uid, sandbox)| (uid.clone(), sandbox.clone()))
        .collect();
    assert_eq!(kept.len(), 1);
    assert!(
        kept.iter()
            .all(|(uid, sandbox)| after_claim.get(uid) == Some(sandbox)),
        "the unclaimed old member is kept: {kept:?} in {after_claim:?}"
    );
    let after = Snapshot::take(&env, &admin).await;
    assert_eq!(
        after.creates,
        before.creates + 1,
        "one sandbox created since the upgrade, the pool's refill: {:?} → {:?}",
        before.executors,
        after.executors
    );
    for (name, sandbox) in &before.executors {
        assert_eq!(
            after.executors.get(name),
            Some(sandbox),
            "{name} keeps its sandbox"
        );
    }
    assert!(
        before.live.is_subset(&after.live),
        "no sandbox destroyed: {:?} → {:?}",
        before.live,
        after.live
    );

    // The new operator's finalizers destroy what the old one made.
    briq_dev::stack::delete_pools(&env.api()).await.unwrap();
    briq_dev::stack::delete_executors(&env.api(), Duration::from_secs(180))
        .await
        .unwrap();
    assert_eq!(
        admin.stats().await.unwrap().sandboxes.len(),
        0,
        "no sandbox is left behind"
    );
    new.stop().await;
    server.shutdown().await;
    stack.stop().await.ok();
}

/// The previous release's binary, or `None` (skipped) when it is not built here and this is not
/// CI, where it always is.
fn previous_operator() -> Option<std::path::PathBuf> {
    match briq_dev::repo::released_operator(PREVIOUS) {
        Ok(binary) => Some(binary),
        Err(error) if std::env::var_os("BRIQ_CI").is_none() => {
            eprintln!(
                "skipped: the {PREVIOUS} operator is not built ({error:#}); make test builds it"
            );
            None
        }
        Err(error) => panic!("the {PREVIOUS} operator: {error:#}"),
    }
}

/// What an upgrade must keep, seen from outside: every executor's sandbox, the live sandboxes,
/// how many briq was asked to create.
struct Snapshot {
    executors: BTreeMap<String, String>,
    live: BTreeSet<String>,
    creates: u64,
}

impl Snapshot {
    async fn take(env: &TestEnv, admin: &AdminClient) -> Snapshot {
        let executors = env
            .api::<BriqExecutor>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|executor| (executor.name_any(), sandbox_of(executor)))
            .collect();
        let stats = admin.stats().await.unwrap();
        Snapshot {
            executors,
            live: stats.sandboxes.iter().map(|s| s.id.clone()).collect(),
            creates: stats.calls(Operation::Create),
        }
    }
}

/// Waits until the pool says all its replicas are Ready and its unclaimed members are, each
/// labelled with the hash this tree computes for the pool's template (so it has nothing to
/// roll); returns them as uid → sandbox id.
async fn pool_ready(env: &TestEnv, name: &str) -> BTreeMap<String, String> {
    let pool = wait_for(
        &env.api::<BriqExecutorPool>(),
        name,
        READY_SECONDS,
        |pool| {
            let status = pool.status.clone().unwrap_or_default();
            status.ready_replicas == pool.spec.replicas && condition(pool, "Ready").0 == "True"
        },
    )
    .await;
    let hash = briq_operator::crd::template_hash(&pool);
    let started = tokio::time::Instant::now();
    let members = loop {
        let members = env
            .api::<BriqExecutor>()
            .list(&ListParams::default().labels(&format!("{POOL_LABEL}={name}")))
            .await
            .unwrap()
            .items;
        if members.len() == pool.spec.replicas as usize
            && members.iter().all(|m| condition(m, "Ready").0 == "True")
        {
            break members;
        }
        assert!(
            started.elapsed() < Duration::from_secs(READY_SECONDS),
            "the pool's unclaimed members are not all Ready: {:?}",
            members
                .iter()
                .map(|m| (m.name_any(), condition(m, "Ready")))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for member in &members {
        assert_eq!(
            member.labels().get(TEMPLATE_HASH_LABEL),
            Some(&hash),
            "{} carries the template hash this tree computes",
            member.name_any()
        );
    }
    members
        .iter()
        .map(|member| (member.uid().unwrap(), sandbox_of(member)))
        .collect()
}

async fn execution(env: &TestEnv, name: &str) -> Execution {
    env.api::<Execution>().get(name).await.unwrap()
}

/// The previous release's `briq-operator run`, a process of its own on `env`'s namespace and the
/// local sandbox server, logging JSON lines (kept, and echoed when `RUST_LOG` is set).
struct PreviousOperator {
    child: tokio::process::Child,
    logs: Arc<Mutex<Vec<String>>>,
}

impl PreviousOperator {
    async fn start(
        binary: &Path,
        env: &TestEnv,
        server: &briq_dev::local_server::LocalServer,
    ) -> PreviousOperator {
        let mut child = tokio::process::Command::new(binary)
            .args(["--log-format", "json", "run", "--allow-plain-http"])
            .args(["--briq-url", server.rest_url().as_str()])
            .args(["--namespace", &env.namespace])
            .args(["--http-address", "127.0.0.1:0"])
            .env("BRIQ_API_KEY", server.api_key().expose())
            .env("KUBECONFIG", &env.kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|error| panic!("starting {}: {error}", binary.display()));
        let logs = Arc::new(Mutex::new(Vec::new()));
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let kept = logs.clone();
        let echo = std::env::var_os("RUST_LOG").is_some();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if echo {
                    eprintln!("[{PREVIOUS}] {line}");
                }
                kept.lock().unwrap().push(line);
            }
        });
        PreviousOperator { child, logs }
    }

    /// SIGTERM, as the kubelet sends first; waits until the operator says it drains (no new
    /// Execution starts, the running one is waited for).
    async fn terminate_and_wait_until_draining(&mut self) {
        let pid = self.child.id().expect("the previous operator runs");
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("running kill");
        assert!(sent.success(), "SIGTERM to the previous operator");
        let logs = self.logs.clone();
        briq_dev::wait::poll(
            Duration::from_secs(30),
            Duration::from_millis(20),
            "the previous operator drains",
            || {
                let logs = logs.clone();
                async move {
                    Ok(logs
                        .lock()
                        .unwrap()
                        .iter()
                        .any(|line| line.contains("shutting down")))
                }
            },
        )
        .await
        .unwrap_or_else(|error| panic!("{error}"));
    }

    /// SIGKILL, as the kubelet sends when the grace period ends.
    async fn kill(&mut self) {
        self.child
            .kill()
            .await
            .expect("killing the previous operator");
    }
}
