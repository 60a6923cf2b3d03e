//! Leader election: several operator processes against one API server and one sandbox server.
//! Only the lease holder runs the controllers; each Execution runs once, through fail-overs and
//! graceful shutdowns.

mod ops;
mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use briq_dev::local_server::{Fault, FaultRule, LocalServer, Operation};
use briq_operator::{crd::BriqExecutor, http::Health};
use k8s_openapi::api::coordination::v1::Lease;
use ops::{Instance, LEASE_SECONDS, until};
use serde_json::json;
use support::{TestEnv, create_execution, create_executor, finished, output, reason};

const RUN_SECONDS: u64 = 60;

/// Samples the replicas' health every 20 ms and remembers the most that ever led at once.
struct LeaderWatch {
    most: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl LeaderWatch {
    fn start(healths: Vec<Arc<Health>>) -> LeaderWatch {
        let (most, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (seen, done) = (most.clone(), stop.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let leading = healths
                    .iter()
                    .filter(|h| h.role() == briq_operator::http::Role::Leader)
                    .count();
                seen.fetch_max(leading, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        LeaderWatch { most, stop }
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

impl Drop for LeaderWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

async fn holder(env: &TestEnv, lease: &str) -> Option<String> {
    env.api::<Lease>()
        .get_opt(lease)
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

async fn execs(server: &LocalServer) -> u64 {
    support::execs(&server.admin()).await
}

/// Operator replicas of one Lease, against the test's API server and one sandbox server.
struct Replicas {
    server: LocalServer,
    config: kube::Config,
    settings: briq_operator::controller::Settings,
}

impl Replicas {
    async fn new(env: &TestEnv) -> Replicas {
        let server = ops::sandbox_server().await;
        let settings = ops::settings(env, &server);
        Replicas {
            config: ops::kube_config(env).await,
            settings,
            server,
        }
    }

    async fn start(&self, env: &TestEnv, identity: &str) -> Instance {
        Instance::start(
            self.config.clone(),
            &self.server,
            self.settings.clone(),
            Some(ops::lease(env, "briq-operator", identity)),
        )
        .await
        .unwrap()
    }

    /// Replica a leading, replica b standing by, and a Ready executor `py`.
    async fn leader_and_standby(&self, env: &TestEnv) -> (Instance, Instance) {
        let a = self.start(env, "replica-a").await;
        until(Duration::from_secs(30), "replica a leads", || a.leading()).await;
        let b = self.start(env, "replica-b").await;
        create_executor(env, "py", json!({})).await;
        support::wait_ready(env, "py").await;
        (a, b)
    }
}

#[tokio::test]
async fn two_replicas_run_each_execution_once_and_the_standby_takes_over() {
    let env = TestEnv::new("leader-failover").await;
    let replicas = Replicas::new(&env).await;
    let server = &replicas.server;
    let mut a = replicas.start(&env, "replica-a").await;
    let mut b = replicas.start(&env, "replica-b").await;
    let watch = LeaderWatch::start(vec![a.observer.health.clone(), b.observer.health.clone()]);
    until(Duration::from_secs(30), "one replica leads", || {
        a.leading() || b.leading()
    })
    .await;
    let leader_id = if a.leading() {
        &a.identity
    } else {
        &b.identity
    };
    assert_eq!(
        holder(&env, "briq-operator").await.as_ref(),
        Some(leader_id)
    );
    // The standby is ready too, and says why.
    let standby = if a.leading() { &b } else { &a };
    let (code, body) = standby.get("/readyz").await.unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("standby"), "{body}");

    create_executor(&env, "py", json!({})).await;
    support::wait_ready(&env, "py").await;
    create_execution(&env, "setup", "py", "ran = []").await;
    assert_eq!(
        reason(&finished(&env, "setup", RUN_SECONDS).await),
        "Completed"
    );

    // 20 Executions at once: each is sent exactly once, whichever replica sees it.
    let before = execs(server).await;
    let names: Vec<String> = (0..20).map(|i| format!("step-{i:02}")).collect();
    futures::future::join_all(names.iter().map(|name| {
        let env = &env;
        async move {
            let code = format!("ran.append('{name}')");
            create_execution(env, name, "py", &code).await
        }
    }))
    .await;
    for name in &names {
        assert_eq!(
            reason(&finished(&env, name, RUN_SECONDS).await),
            "Completed",
            "{name}"
        );
    }
    assert_eq!(execs(server).await - before, 20, "one exec per Execution");
    create_execution(&env, "count", "py", "(len(ran), len(set(ran)))").await;
    assert_eq!(
        output(&finished(&env, "count", RUN_SECONDS).await),
        "(20, 20)"
    );

    // Kill the leader (no release): the standby takes the lease once it expires.
    let (leader, standby) = if a.leading() {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let killed = Instant::now();
    leader.kill().await;
    until(
        Duration::from_secs(LEASE_SECONDS + 10),
        "the standby takes over",
        || standby.leading(),
    )
    .await;
    let took = killed.elapsed();
    eprintln!("the standby took over {took:?} after the leader was killed");
    // The lease stays valid for at most its duration after the last renewal; kube-lease-manager
    // then waits up to 1 s at random before taking an expired lease, and the caches sync.
    assert!(
        took <= Duration::from_secs(LEASE_SECONDS) + Duration::from_secs(3),
        "took over after {took:?}"
    );
    assert_eq!(
        holder(&env, "briq-operator").await.as_ref(),
        Some(&standby.identity)
    );

    // The new leader goes on with the same executor; still one exec per Execution.
    let before = execs(server).await;
    let more: Vec<String> = (20..25).map(|i| format!("step-{i:02}")).collect();
    for name in &more {
        create_execution(&env, name, "py", &format!("ran.append('{name}')")).await;
    }
    for name in &more {
        assert_eq!(
            reason(&finished(&env, name, RUN_SECONDS).await),
            "Completed",
            "{name}"
        );
    }
    create_execution(&env, "recount", "py", "(len(ran), len(set(ran)))").await;
    assert_eq!(
        output(&finished(&env, "recount", RUN_SECONDS).await),
        "(25, 25)"
    );
    assert_eq!(execs(server).await - before, 6);
    assert_eq!(watch.most(), 1, "two replicas never led at once");
}

/// The leader dies while its exec waits at the server: the new leader asks the sandbox's
/// journal what became of the attempt and finishes the Execution, which ran exactly once; the
/// executor stays usable for the next one.
#[tokio::test]
async fn killing_the_leader_mid_run_lets_the_new_leader_recover_the_execution_run_once() {
    let env = TestEnv::new("leader-midrun").await;
    let replicas = Replicas::new(&env).await;
    let server = &replicas.server;
    let (mut a, b) = replicas.leader_and_standby(&env).await;

    // The exec is held at the server long enough to kill the leader while it waits.
    server
        .admin()
        .add_fault(&FaultRule::on(
            Operation::Exec,
            Fault::delay(Duration::from_secs(3)),
        ))
        .await
        .unwrap();
    let before = execs(server).await;
    let counted = "import os\nopen(os.path.expanduser('~/ran.txt'), 'a').write('x')\nprint('ran')";
    create_execution(&env, "first", "py", counted).await;
    let count = "import os\nprint(len(open(os.path.expanduser('~/ran.txt')).read()))";
    create_execution(&env, "second", "py", count).await;
    support::code_reached_sandbox(&server.admin(), before).await;
    a.kill().await;
    until(
        Duration::from_secs(LEASE_SECONDS + 10),
        "replica b takes over",
        || b.leading(),
    )
    .await;

    let first = finished(&env, "first", RUN_SECONDS).await;
    assert_eq!(
        reason(&first),
        "Completed",
        "{:?}",
        support::condition(&first, "Succeeded")
    );
    assert_eq!(first.status.unwrap().logs.as_deref(), Some("ran\n"));
    let second = finished(&env, "second", RUN_SECONDS).await;
    assert_eq!(reason(&second), "Completed");
    assert_eq!(
        second.status.unwrap().logs.as_deref(),
        Some("1\n"),
        "the first Execution's code ran exactly once"
    );
    let executor = env.api::<BriqExecutor>().get("py").await.unwrap();
    assert_eq!(support::condition(&executor, "Ready").0, "True");
}

#[tokio::test]
async fn a_graceful_shutdown_finishes_the_running_execution_and_hands_over_at_once() {
    let env = TestEnv::new("leader-graceful").await;
    let replicas = Replicas::new(&env).await;
    let server = &replicas.server;
    let (mut a, b) = replicas.leader_and_standby(&env).await;

    server
        .admin()
        .add_fault(&FaultRule::on(Operation::Exec, Fault::delay(Duration::from_secs(3))).times(1))
        .await
        .unwrap();
    let before = execs(server).await;
    create_execution(&env, "a-running", "py", "x = 'finished'\nx").await;
    create_execution(&env, "b-next", "py", "x + ' too'").await;
    support::code_reached_sandbox(&server.admin(), before).await;

    // SIGTERM: the running Execution finishes on this replica, nothing new starts here, and the
    // lease is released (not left to expire).
    let (code, _) = a.get("/readyz").await.unwrap();
    assert_eq!(code, 200);
    a.shutdown().await.unwrap();
    let running = finished(&env, "a-running", 5).await;
    assert_eq!(reason(&running), "Completed", "{:?}", running.status);
    assert_eq!(output(&running), "'finished'");
    let after = holder(&env, "briq-operator").await;
    assert!(
        after.is_none() || after.as_ref() == Some(&b.identity),
        "the lease is released, not left to expire: {after:?}"
    );

    let next = finished(&env, "b-next", RUN_SECONDS).await;
    assert_eq!(reason(&next), "Completed");
    assert_eq!(output(&next), "'finished too'");
    // A renewal slower than the grace on a loaded machine makes a leader step down and take the
    // lease again; what matters is that b leads, not that no hiccup happened at this instant.
    until(
        Duration::from_secs(LEASE_SECONDS + 10),
        "replica b leads",
        || b.leading(),
    )
    .await;
    assert_eq!(execs(server).await, before + 2, "each ran once");
}
