//! Warm pools end to end: real kube-apiserver (with garbage collection), the real briq client
//! against the local sandbox server, real Jupyter kernels. A `BriqExecutorPool` keeps members
//! Ready; a `BriqExecutor` with `poolRef` takes one member's sandbox and kernel, and exactly one
//! executor owns each sandbox at every instant.

mod support;

use std::{collections::BTreeSet, time::Duration};

use briq_dev::{
    local_server::{Fault, FaultRule, Operation},
    stack::Controllers,
};
use k8s_openapi::api::events::v1::Event;

use briq_operator::crd::{
    BriqExecutor, BriqExecutorPool, CLAIMED_BY_ANNOTATION, CLAIMED_BY_LABEL,
    CLAIMED_MEMBER_ANNOTATION, FINALIZER, POOL_LABEL, POOL_MEMBER_ANNOTATION,
};
use kube::{
    ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use support::{
    Operator, READY_SECONDS, TestEnv, condition, create_execution, create_executor, create_pool,
    finished, output, reason, run, sandbox_of, two_operators, wait_deleted, wait_for, wait_ready,
};

/// A test namespace, its operator, and a pool `fast` (template `{}`) of `replicas` Ready members.
async fn with_ready_pool(prefix: &str, replicas: i32) -> (TestEnv, Operator) {
    let env = TestEnv::new(prefix).await;
    let operator = Operator::start(&env).await;
    create_pool(&env, "fast", replicas, json!({})).await;
    pool_ready(&env, "fast", replicas).await;
    (env, operator)
}

/// Waits until the pool has exactly `replicas` unclaimed members from its current template,
/// all Ready, and says so in its status (which a claim alone does not change, hence the count
/// from the API first).
/// A failure names what the pool and its members showed last, so that a slow machine and a
/// wrong target tell themselves apart.
async fn pool_ready(env: &TestEnv, name: &str, replicas: i32) -> BriqExecutorPool {
    let members_ready = briq_dev::wait::poll(
        Duration::from_secs(READY_SECONDS),
        Duration::from_millis(100),
        "the pool's unclaimed members are Ready",
        || async {
            let members = unclaimed(env, name).await;
            Ok(members.len() == replicas as usize
                && members.iter().all(|m| {
                    condition(m, "Ready").0 == "True" && m.metadata.deletion_timestamp.is_none()
                }))
        },
    )
    .await;
    if let Err(error) = members_ready {
        let members: Vec<String> = unclaimed(env, name)
            .await
            .iter()
            .map(|m| {
                let deleting = m.metadata.deletion_timestamp.is_some();
                format!(
                    "{} Ready={:?} deleting={deleting}",
                    m.name_any(),
                    condition(m, "Ready")
                )
            })
            .collect();
        let pool = env
            .api::<BriqExecutorPool>()
            .get(name)
            .await
            .map(|p| p.status);
        panic!("{error}; its unclaimed members: {members:?}; its status: {pool:?}");
    }
    wait_for(
        &env.api::<BriqExecutorPool>(),
        name,
        READY_SECONDS,
        |pool| {
            let status = pool.status.clone().unwrap_or_default();
            status.replicas == replicas
                && status.ready_replicas == replicas
                && status.observed_generation == pool.metadata.generation
                && condition(pool, "Ready").0 == "True"
        },
    )
    .await
}

/// The pool's unclaimed members, by the label the scale subresource selects them with.
async fn unclaimed(env: &TestEnv, pool: &str) -> Vec<BriqExecutor> {
    env.api::<BriqExecutor>()
        .list(&ListParams::default().labels(&format!("{POOL_LABEL}={pool}")))
        .await
        .unwrap()
        .items
}

/// Every live sandbox's id and name, as briq (the local server) has them.
async fn live_sandboxes(operator: &Operator) -> (BTreeSet<String>, BTreeSet<String>) {
    let sandboxes = operator.admin().stats().await.unwrap().sandboxes;
    let ids = sandboxes.iter().map(|s| s.id.clone()).collect();
    let names = sandboxes.into_iter().map(|s| s.name).collect();
    (ids, names)
}

#[tokio::test]
async fn a_claim_takes_a_ready_members_kernel_and_the_pool_refills() {
    let (env, operator) = with_ready_pool("pool-claim", 2).await;
    let members: BTreeSet<String> = unclaimed(&env, "fast")
        .await
        .iter()
        .map(sandbox_of)
        .collect();

    create_executor(&env, "agent", json!({ "poolRef": { "name": "fast" } })).await;
    let agent = wait_ready(&env, "agent").await;
    let sandbox = sandbox_of(&agent);
    assert!(
        members.contains(&sandbox),
        "{sandbox} is one of {members:?}"
    );
    let (_, _, message) = condition(&agent, "Ready");
    assert!(
        message.contains("handed over from BriqExecutorPool fast"),
        "{message}"
    );

    // The member now belongs to the claimer: claimed for good, owned by it, out of the pool.
    let executors = env.api::<BriqExecutor>();
    let taken: Vec<BriqExecutor> = executors
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.annotations().contains_key(POOL_MEMBER_ANNOTATION) && sandbox_of(e) == sandbox
        })
        .collect();
    assert_eq!(taken.len(), 1, "one member had that sandbox");
    let member = &taken[0];
    assert_eq!(
        member.annotations().get(CLAIMED_BY_ANNOTATION),
        agent.uid().as_ref()
    );
    assert!(!member.labels().contains_key(POOL_LABEL));
    assert_eq!(member.owner_references().len(), 1);
    assert_eq!(
        Some(&member.owner_references()[0].uid),
        agent.uid().as_ref()
    );
    let member = wait_for(&executors, &member.name_any(), 30, |m| {
        condition(m, "Ready").1 == "Claimed"
    })
    .await;

    // Python state persists in the handed-over kernel.
    assert_eq!(
        reason(&run(&env, "one", "agent", "x = 41").await),
        "Completed"
    );
    let two = run(&env, "two", "agent", "x + 1").await;
    assert_eq!(
        (reason(&two).as_str(), output(&two).as_str()),
        ("Completed", "42")
    );

    // A member runs no code of its own, claimed or not.
    let refused = run(&env, "direct", &member.name_any(), "x").await;
    assert_eq!(reason(&refused), "ExecutorUnusable");
    assert!(
        condition(&refused, "Succeeded")
            .2
            .contains("member of BriqExecutorPool fast")
    );

    // The pool refills: two unclaimed Ready members again, beside the claimed one.
    pool_ready(&env, "fast", 2).await;
    assert_eq!(operator.live_sandboxes().await, 3);
}

/// The claim path's writes, counted: a burst of claims competes for the API server, so a claim
/// is Ready after two writes, the member's take and the claimer's status (its record and its
/// Ready together), with no Event and no interim status; the claimer's finalizer and the record's
/// annotations follow in a third, off the claim's path. The member's own status (`Claimed`), the
/// pool's and its refill follow the claim too.
#[tokio::test]
async fn a_warm_claim_is_ready_after_two_writes_the_take_and_its_record_with_ready() {
    let env = TestEnv::new("pool-writes").await;
    let requests = support::RequestLog::default();
    let client = requests.client(&env).await;
    let _operator = Operator::start_as(&env, client, |_| {}).await;
    create_pool(&env, "fast", 1, json!({})).await;
    pool_ready(&env, "fast", 1).await;
    let member = unclaimed(&env, "fast").await[0].name_any();

    let before = requests.len();
    create_executor(&env, "agent", json!({ "poolRef": { "name": "fast" } })).await;
    wait_ready(&env, "agent").await;
    // The refill is Ready: whatever the claim made the operator do has been done.
    pool_ready(&env, "fast", 1).await;
    let named = |request: &str, name: &str| {
        let path = request.split('?').next().unwrap_or_default();
        path.contains(&format!("/briqexecutors/{name}"))
    };
    let writes: Vec<String> = requests
        .since(before)
        .into_iter()
        .filter(|request| !request.starts_with("GET "))
        .filter(|request| named(request, "agent") || named(request, &member))
        .filter(|request| !request.contains(&format!("/briqexecutors/{member}/status")))
        .map(|request| {
            let (method, target) = request.split_once(' ').unwrap();
            let path = target.split('?').next().unwrap();
            let tail = &path[path.find("/briqexecutors/").unwrap()..];
            format!("{method} {}", tail.replace(&member, "MEMBER"))
        })
        .collect();
    assert_eq!(
        writes,
        [
            "PATCH /briqexecutors/MEMBER",
            "PATCH /briqexecutors/agent/status",
            "PATCH /briqexecutors/agent",
        ],
        "the claim's writes: the take, the record with Ready, then what settles it"
    );
    let agent = env.api::<BriqExecutor>().get("agent").await.unwrap();
    assert_eq!(agent.claimed_member(), Some(member.as_str()));
    assert_eq!(
        agent.status.as_ref().unwrap().claimed_member.as_deref(),
        Some(member.as_str()),
        "recorded with its Ready"
    );
    assert!(agent.finalizers().iter().any(|f| f == FINALIZER));
    assert_eq!(
        agent.annotations().get(CLAIMED_MEMBER_ANNOTATION),
        Some(&member),
        "settled"
    );
    let about_agent = event_notes_about(&env, "agent").await;
    assert_eq!(about_agent, Vec::<String>::new(), "no Event per claim");
}

/// A claimer waiting for a pool that refills reads its Secrets when it begins to wait and when
/// it takes a member, not on every recheck in between: that was one GET per Secret a second
/// and waiting claimer, all through a drained pool's refill.
#[tokio::test]
async fn a_claimer_waiting_for_a_refill_reads_its_secret_to_begin_and_to_take_not_on_each_recheck()
{
    let env = TestEnv::new("pool-env-reads").await;
    let requests = support::RequestLog::default();
    let client = requests.client(&env).await;
    let operator = Operator::start_as(&env, client, |_| {}).await;
    support::create_claim_env_secret(&env, "tools", true, "tok").await;
    // The member's sandbox takes 6 s to create: the claimer rechecks several times meanwhile.
    let admin = operator.admin();
    let creates = admin.stats().await.unwrap().calls(Operation::Create);
    admin
        .add_fault(&FaultRule::on(Operation::Create, Fault::delay(Duration::from_secs(6))).times(1))
        .await
        .unwrap();
    create_pool(&env, "refilling", 1, json!({})).await;
    eventually(30, "the member's create reached briq", || async {
        admin.stats().await.unwrap().calls(Operation::Create) > creates
    })
    .await;

    let before = requests.len();
    let env_from_secret = json!([
        { "name": "TOOL_TOKEN", "valueFrom": { "secretKeyRef": { "name": "tools", "key": "token" } } },
    ]);
    let pool_ref =
        json!({ "name": "refilling", "coldCreateAfterSeconds": 600, "env": env_from_secret });
    create_executor(&env, "agent", json!({ "poolRef": pool_ref })).await;
    let claimer = wait_ready(&env, "agent").await;
    let message = condition(&claimer, "Ready").2;
    assert!(
        message.contains("handed over from BriqExecutorPool refilling"),
        "{message}"
    );
    let reads: Vec<String> = requests
        .reads_since(before, "secrets")
        .into_iter()
        .filter(|request| request.contains("/secrets/tools"))
        .collect();
    assert_eq!(
        reads.len(),
        2,
        "the reads of the claimer's Secret: {reads:#?}"
    );
}

/// The notes of the Events about the executor `name`.
async fn event_notes_about(env: &TestEnv, name: &str) -> Vec<String> {
    notes_of_events(env, |event| {
        event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
    })
    .await
}

#[tokio::test]
async fn without_a_ready_member_a_claimer_creates_its_own_sandbox() {
    let env = TestEnv::new("pool-fallback").await;
    let operator = Operator::start(&env).await;
    // At once when there is no pool, or the pool is scaled to zero.
    create_pool(&env, "empty", 0, json!({})).await;
    create_executor(&env, "lonely", json!({ "poolRef": { "name": "missing" } })).await;
    create_executor(&env, "eager", json!({ "poolRef": { "name": "empty" } })).await;
    for name in ["lonely", "eager"] {
        let executor = wait_ready(&env, name).await;
        assert_own_sandbox(&env, &operator, &executor).await;
    }

    // After coldCreateAfterSeconds when the pool has no Ready member: its member's sandbox
    // create hangs at briq.
    let admin = operator.admin();
    let creates = admin.stats().await.unwrap().calls(Operation::Create);
    admin
        .add_fault(
            &FaultRule::on(Operation::Create, Fault::delay(Duration::from_secs(20))).times(1),
        )
        .await
        .unwrap();
    create_pool(&env, "slow", 1, json!({})).await;
    eventually(30, "the member's create reached briq", || async {
        admin.stats().await.unwrap().calls(Operation::Create) > creates
    })
    .await;
    create_executor(
        &env,
        "patient",
        json!({ "poolRef": { "name": "slow", "coldCreateAfterSeconds": 1 } }),
    )
    .await;
    let patient = wait_ready(&env, "patient").await;
    assert_own_sandbox(&env, &operator, &patient).await;
    let notes = event_notes(&env, "ColdCreate").await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("no Ready member of BriqExecutorPool slow within 1s")),
        "{notes:?}"
    );
}

async fn assert_own_sandbox(env: &TestEnv, operator: &Operator, executor: &BriqExecutor) {
    let name = executor.name_any();
    let own = briq_operator::briq::sandbox_name(&env.namespace, &name, &executor.uid().unwrap());
    assert!(
        live_sandboxes(operator).await.1.contains(&own),
        "{name} runs on a sandbox of its own"
    );
    assert!(
        executor
            .annotations()
            .contains_key(briq_operator::crd::POOL_FALLBACK_ANNOTATION),
        "{name} says why it did not claim"
    );
}

async fn event_notes(env: &TestEnv, reason: &str) -> Vec<String> {
    notes_of_events(env, |event| event.reason.as_deref() == Some(reason)).await
}

/// The notes of the namespace's Events that `keep` keeps.
async fn notes_of_events(env: &TestEnv, keep: impl Fn(&Event) -> bool) -> Vec<String> {
    env.api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|event| keep(event))
        .map(|event| event.note.unwrap_or_default())
        .collect()
}

/// Polls `check` until it holds, or panics after `seconds`.
async fn eventually<F, Fut>(seconds: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    briq_dev::wait::poll(
        Duration::from_secs(seconds),
        Duration::from_millis(100),
        what,
        || {
            let fut = check();
            async move { Ok(fut.await) }
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error}"));
}

#[tokio::test]
async fn a_claimer_whose_spec_differs_from_the_template_claims_nothing() {
    let env = TestEnv::new("pool-mismatch").await;
    let operator = Operator::start(&env).await;
    create_pool(&env, "fast", 1, json!({ "sleep": "2h" })).await;
    pool_ready(&env, "fast", 1).await;
    create_executor(
        &env,
        "odd",
        json!({ "poolRef": { "name": "fast" }, "sleep": "3h" }),
    )
    .await;
    let odd = wait_for(&env.api::<BriqExecutor>(), "odd", 30, |e| {
        condition(e, "Stalled").0 == "True"
    })
    .await;
    let (_, why, message) = condition(&odd, "Ready");
    assert_eq!(why, "PoolMismatch");
    assert!(message.contains("sleep"), "{message}");
    // Leaving the field unset takes the template's value.
    create_executor(&env, "plain", json!({ "poolRef": { "name": "fast" } })).await;
    wait_ready(&env, "plain").await;
    pool_ready(&env, "fast", 1).await;
    assert_eq!(
        operator.live_sandboxes().await,
        2,
        "one handed over, one refilled"
    );
}

#[tokio::test]
async fn the_pool_scales_through_its_scale_subresource() {
    let (env, operator) = with_ready_pool("pool-scale", 1).await;
    let (ok, _, stderr) = env.kubectl(&["scale", "briqexecutorpool/fast", "--replicas=3"]);
    assert!(ok, "{stderr}");
    pool_ready(&env, "fast", 3).await;
    assert_eq!(operator.live_sandboxes().await, 3);
    let (ok, stdout, stderr) = env.kubectl(&[
        "get",
        "--raw",
        &format!(
            "/apis/briq.cloud/v1alpha1/namespaces/{}/briqexecutorpools/fast/scale",
            env.namespace
        ),
    ]);
    assert!(ok, "{stderr}");
    let scale: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(scale["spec"]["replicas"], 3);
    assert_eq!(scale["status"]["replicas"], 3);
    assert_eq!(scale["status"]["selector"], "briq.cloud/pool=fast");

    let (ok, _, stderr) = env.kubectl(&["scale", "briqexecutorpool/fast", "--replicas=1"]);
    assert!(ok, "{stderr}");
    pool_ready(&env, "fast", 1).await;
    eventually(60, "the surplus sandboxes are destroyed", || async {
        operator.live_sandboxes().await == 1
    })
    .await;
}

#[tokio::test]
async fn a_template_change_replaces_unclaimed_members_only() {
    let env = TestEnv::new("pool-roll").await;
    let operator = Operator::start(&env).await;
    create_pool(
        &env,
        "fast",
        1,
        json!({ "env": [{ "name": "FLAVOUR", "value": "a" }] }),
    )
    .await;
    pool_ready(&env, "fast", 1).await;
    create_executor(
        &env,
        "agent",
        json!({ "poolRef": { "name": "fast" }, "env": [{ "name": "FLAVOUR", "value": "a" }] }),
    )
    .await;
    let agent = wait_ready(&env, "agent").await;
    let held = sandbox_of(&agent);
    assert_eq!(
        reason(&run(&env, "before", "agent", "x = 1").await),
        "Completed"
    );
    pool_ready(&env, "fast", 1).await;
    let old: Vec<String> = unclaimed(&env, "fast")
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();

    let patch = json!({ "spec": { "template": { "env": [{ "name": "FLAVOUR", "value": "b" }] } } });
    env.api::<BriqExecutorPool>()
        .patch("fast", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    pool_ready(&env, "fast", 1).await;
    let new = unclaimed(&env, "fast").await;
    assert_eq!(new.len(), 1);
    assert!(
        !old.contains(&new[0].name_any()),
        "the unclaimed member was replaced"
    );
    let flavour = run(&env, "flavour-new", &new[0].name_any(), "1").await;
    assert_eq!(reason(&flavour), "ExecutorUnusable", "members run nothing");

    // The claimer keeps its sandbox, its kernel and its state.
    let agent = env.api::<BriqExecutor>().get("agent").await.unwrap();
    assert_eq!(sandbox_of(&agent), held);
    let after = run(
        &env,
        "after",
        "agent",
        "import os\n(x, os.environ['FLAVOUR'])",
    )
    .await;
    assert_eq!(output(&after), "(1, 'a')");
    assert_eq!(operator.live_sandboxes().await, 2);
}

#[tokio::test]
async fn deleting_the_pool_destroys_unclaimed_members_and_claimed_ones_live_on() {
    let (env, operator) = with_ready_pool("pool-delete", 2).await;
    create_executor(&env, "agent", json!({ "poolRef": { "name": "fast" } })).await;
    wait_ready(&env, "agent").await;
    pool_ready(&env, "fast", 2).await;
    assert_eq!(operator.live_sandboxes().await, 3);

    let pools = env.api::<BriqExecutorPool>();
    // As `kubectl delete` does it: the pool goes at once, garbage collection takes what it owns.
    pools
        .delete("fast", &DeleteParams::default())
        .await
        .unwrap();
    wait_deleted(&pools, "fast", 60).await;
    eventually(60, "the unclaimed members are deleted", || async {
        unclaimed(&env, "fast").await.is_empty()
    })
    .await;
    eventually(
        60,
        "the unclaimed members' sandboxes are destroyed",
        || async { operator.live_sandboxes().await == 1 },
    )
    .await;
    let still = run(&env, "still", "agent", "'alive'").await;
    assert_eq!(output(&still), "'alive'");

    // The claimer takes its member (and the sandbox) with it: nothing leaks.
    let executors = env.api::<BriqExecutor>();
    executors
        .delete("agent", &DeleteParams::default())
        .await
        .unwrap();
    wait_deleted(&executors, "agent", 60).await;
    eventually(60, "every executor is gone", || async {
        executors
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    assert_eq!(operator.live_sandboxes().await, 0, "no sandbox leaked");
}

/// The first half of a handover, as the operator writes it: `member` is `claimer`'s, owned by
/// it, out of its pool.
async fn take_as_the_operator_does(env: &TestEnv, member: &BriqExecutor, claimer: &BriqExecutor) {
    let uid = claimer.uid().unwrap();
    let owner = json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor", "name": claimer.name_any(),
        "uid": uid, "controller": true, "blockOwnerDeletion": true,
    });
    let taken = json!({ "metadata": {
        "annotations": { CLAIMED_BY_ANNOTATION: uid },
        "labels": { POOL_LABEL: null, CLAIMED_BY_LABEL: uid },
        "ownerReferences": [owner],
    }});
    env.api::<BriqExecutor>()
        .patch(
            &member.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&taken),
        )
        .await
        .unwrap();
}

/// A claim's first two writes, as the operator writes them, without the third: `claimer` took
/// `member` and is Ready with the record of it, without its finalizer and the record's
/// annotations (the operator died between the writes).
async fn claim_without_settling(env: &TestEnv, member: &BriqExecutor, claimer: &BriqExecutor) {
    take_as_the_operator_does(env, member, claimer).await;
    let condition = |type_: &str, status: &str| {
        json!({
            "type": type_, "status": status, "reason": "KernelReady",
            "message": format!("the kernel answers: handed over from BriqExecutorPool fast (executor {})", member.name_any()),
            "lastTransitionTime": "2026-12-07T00:00:00Z",
        })
    };
    let record = json!({ "status": {
        "conditions": [condition("Ready", "True"), condition("Stalled", "False")],
        "sandboxId": sandbox_of(member),
        "claimedMember": member.name_any(),
    }});
    env.api::<BriqExecutor>()
        .patch_status(
            &claimer.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&record),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn an_operator_killed_between_a_claims_ready_and_its_finalizer_settles_it_before_any_code_runs()
 {
    let (env, mut operator) = with_ready_pool("pool-settle", 1).await;
    operator.kill().await;
    let claimer = create_executor(&env, "agent", json!({ "poolRef": { "name": "fast" } })).await;
    let member = unclaimed(&env, "fast").await.remove(0);
    claim_without_settling(&env, &member, &claimer).await;
    // An Execution comes while the claimer is Ready but unsettled: it runs once the claimer
    // holds its finalizer, so that deleting the claimer waits for it.
    create_execution(&env, "early", "agent", "x = 41").await;

    operator.resume();
    let early = finished(&env, "early", READY_SECONDS).await;
    assert_eq!(reason(&early), "Completed", "{:?}", early.status);
    let agent = env.api::<BriqExecutor>().get("agent").await.unwrap();
    assert!(
        agent.finalizers().iter().any(|f| f == FINALIZER),
        "settled: {:?}",
        agent.metadata
    );
    assert_eq!(
        agent.annotations().get(CLAIMED_MEMBER_ANNOTATION),
        Some(&member.name_any())
    );
    assert_eq!(sandbox_of(&agent), sandbox_of(&member));
    // The code ran in the member's kernel, where the next action finds its state.
    let next = run(&env, "next", "agent", "x + 1").await;
    assert_eq!(output(&next), "42", "{:?}", next.status);
}

#[tokio::test]
async fn a_claimer_deleted_before_its_claim_is_settled_leaks_no_sandbox() {
    let (env, mut operator) = with_ready_pool("pool-unsettled-delete", 1).await;
    operator.kill().await;
    let claimer = create_executor(&env, "agent", json!({ "poolRef": { "name": "fast" } })).await;
    let member = unclaimed(&env, "fast").await.remove(0);
    let taken = sandbox_of(&member);
    claim_without_settling(&env, &member, &claimer).await;
    // Without a finalizer the claimer goes at once; the member it owns goes with it (the
    // garbage collector), and the member's finalizer destroys the sandbox.
    let executors = env.api::<BriqExecutor>();
    executors
        .delete("agent", &DeleteParams::default())
        .await
        .unwrap();
    wait_deleted(&executors, "agent", 30).await;
    operator.resume();
    wait_deleted(&executors, &member.name_any(), READY_SECONDS).await;
    pool_ready(&env, "fast", 1).await;
    eventually(READY_SECONDS, "the taken sandbox is destroyed", || async {
        !live_sandboxes(&operator).await.0.contains(&taken)
    })
    .await;
    assert_eq!(
        operator.live_sandboxes().await,
        1,
        "only the refill's sandbox"
    );
}

#[tokio::test]
async fn an_operator_killed_mid_handover_leaves_exactly_one_owner() {
    let (env, mut operator) = with_ready_pool("pool-crash", 2).await;

    // The operator dies right after the first half of a handover: the member says it was
    // handed to the claimer, the claimer has recorded nothing yet.
    operator.kill().await;
    let claimer = create_executor(&env, "agent", json!({ "poolRef": { "name": "fast" } })).await;
    let uid = claimer.uid().unwrap();
    let members = unclaimed(&env, "fast").await;
    let member = &members[0];
    take_as_the_operator_does(&env, member, &claimer).await;

    operator.resume();
    let agent = wait_ready(&env, "agent").await;
    assert_eq!(
        sandbox_of(&agent),
        sandbox_of(member),
        "the claimer finished that handover instead of taking another member"
    );
    pool_ready(&env, "fast", 2).await;
    // Exactly one executor uses each sandbox: the claimer and the unclaimed members.
    let executors = env
        .api::<BriqExecutor>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let users: Vec<String> = executors
        .iter()
        .filter(|e| !e.annotations().contains_key(CLAIMED_BY_ANNOTATION))
        .map(sandbox_of)
        .collect();
    let distinct: BTreeSet<&String> = users.iter().collect();
    assert_eq!(users.len(), 3);
    assert_eq!(distinct.len(), 3, "no sandbox has two users: {users:?}");
    let claimed: Vec<&BriqExecutor> = executors
        .iter()
        .filter(|e| e.annotations().get(CLAIMED_BY_ANNOTATION) == Some(&uid))
        .collect();
    assert_eq!(claimed.len(), 1, "one member was handed to the claimer");
}

#[tokio::test]
async fn two_claimers_racing_for_one_member_never_share_it() {
    let (env, _operator) = with_ready_pool("pool-race", 1).await;
    for name in ["left", "right"] {
        create_executor(
            &env,
            name,
            json!({ "poolRef": { "name": "fast", "coldCreateAfterSeconds": 0 } }),
        )
        .await;
    }
    let left = wait_ready(&env, "left").await;
    let right = wait_ready(&env, "right").await;
    assert_ne!(sandbox_of(&left), sandbox_of(&right));
    let executors = env
        .api::<BriqExecutor>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let handed: Vec<&String> = executors
        .iter()
        .filter_map(|e| e.annotations().get(CLAIMED_BY_ANNOTATION))
        .collect();
    assert!(
        handed.len() <= 1,
        "one member, at most one claim: {handed:?}"
    );
}

#[tokio::test]
async fn two_operators_claiming_for_the_same_claimers_at_once_leave_each_one_member() {
    // Both operators see each claimer without a member and take one for it at the same moment:
    // the members' preconditions let both win (each a different member), so only the claimer's
    // record, conditional on the version both decided on, says which one it keeps; the other
    // is one too many and goes, sandbox and all.
    let env = TestEnv::new("pool-two-ops").await;
    let (operator, _second) = two_operators(&env).await;
    create_pool(&env, "fast", 4, json!({})).await;
    pool_ready(&env, "fast", 4).await;
    let first: BTreeSet<String> = unclaimed(&env, "fast")
        .await
        .iter()
        .map(sandbox_of)
        .collect();
    let claimers = ["left", "right"];
    for name in claimers {
        create_executor(&env, name, json!({ "poolRef": { "name": "fast" } })).await;
    }
    for name in claimers {
        wait_ready(&env, name).await;
    }
    let executors = env.api::<BriqExecutor>();
    eventually(
        READY_SECONDS,
        "each claimer holds one member, the one it records",
        || async {
            let all = executors.list(&ListParams::default()).await.unwrap().items;
            claimers.iter().all(|name| {
                let claimer = all.iter().find(|e| e.name_any() == *name).unwrap();
                let held: Vec<String> = all
                    .iter()
                    .filter(|e| {
                        e.annotations().get(CLAIMED_BY_ANNOTATION) == claimer.uid().as_ref()
                    })
                    .map(|e| e.name_any())
                    .collect();
                claimer
                    .annotations()
                    .get(CLAIMED_MEMBER_ANNOTATION)
                    .is_some_and(|recorded| held == [recorded.clone()])
            })
        },
    )
    .await;
    // A member given back took its sandbox with it: every sandbox of the pool's first members
    // that briq still has is one an executor records (refills of both operators' pools may
    // overshoot on their own; they are not this test's).
    eventually(
        READY_SECONDS,
        "no sandbox of a member given back is left",
        || async {
            let (live, _) = live_sandboxes(&operator).await;
            let recorded: BTreeSet<String> = executors
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .map(sandbox_of)
                .collect();
            first
                .iter()
                .all(|id| !live.contains(id) || recorded.contains(id))
        },
    )
    .await;
}

#[tokio::test]
async fn a_copied_claimer_never_gets_the_members_sandbox() {
    let (env, _operator) = with_ready_pool("pool-copy", 1).await;
    create_executor(&env, "agent", json!({ "poolRef": { "name": "fast" } })).await;
    let agent = wait_ready(&env, "agent").await;
    let held = sandbox_of(&agent);
    assert_eq!(
        reason(&run(&env, "mine", "agent", "secret = 42").await),
        "Completed"
    );

    // `kubectl get -o yaml`, a new name, `kubectl apply`: every annotation comes along (here
    // as an admin, past the admission policy that stops tenants from writing them). The code
    // ran, so the claim is settled: its annotations record the member.
    let executors = env.api::<BriqExecutor>();
    let agent = executors.get("agent").await.unwrap();
    assert!(agent.annotations().contains_key(CLAIMED_MEMBER_ANNOTATION));
    let copy: BriqExecutor = serde_json::from_value(json!({
        "metadata": { "name": "copy", "annotations": agent.annotations() },
        "spec": agent.spec,
    }))
    .unwrap();
    executors
        .create(&PostParams::default(), &copy)
        .await
        .unwrap();
    let copy = wait_ready(&env, "copy").await;
    assert_ne!(
        sandbox_of(&copy),
        held,
        "the copy runs on a sandbox of its own"
    );
    let notes = event_notes(&env, "SandboxNotOwned").await;
    assert!(notes.iter().any(|n| n.contains(&held)), "{notes:?}");
    let probe = run(&env, "probe", "copy", "secret").await;
    assert_eq!(
        reason(&probe),
        "CodeError",
        "the copy never saw the original's kernel"
    );

    // The original keeps its sandbox and its state.
    let agent = executors.get("agent").await.unwrap();
    assert_eq!(sandbox_of(&agent), held);
    assert_eq!(output(&run(&env, "still", "agent", "secret").await), "42");
}

#[tokio::test]
async fn a_restarted_operator_makes_no_members_before_its_executor_cache_shows_the_old_ones() {
    let (env, mut operator) = with_ready_pool("pool-restart", 2).await;
    operator.kill().await;
    // The next process's executor cache shows the members a while after its pool cache shows
    // the pool (a consistent list, after an upgrade's CRD update or with many executors).
    let requests = support::RequestLog::default();
    let client = requests
        .client_with_slow_lists(&env, "briqexecutors", Duration::from_secs(2))
        .await;
    let settings = support::settings(&env, &operator.server);
    let restarted = Controllers::start(client, &operator.server, settings).expect("controllers");
    // A claim after the restart: the pool is reconciled by the new process (it refills), so
    // whatever it would make of a cache that does not show its members yet has been made.
    create_executor(&env, "agent", json!({ "poolRef": { "name": "fast" } })).await;
    wait_ready(&env, "agent").await;
    pool_ready(&env, "fast", 2).await;
    let created = requests.creates("briqexecutors");
    assert_eq!(
        created.len(),
        1,
        "one member made since the restart, the refill: {created:?}"
    );
    restarted.stop().await;
}

/// A pool exists to keep kernels warm: a template that says `suspend: true` does not put its
/// members to sleep, so a claim never gets a stopped sandbox (and never waits for a resume).
#[tokio::test]
async fn a_pool_never_hands_out_a_suspended_member_even_when_its_template_asks_to_suspend() {
    let env = TestEnv::new("pool-suspend").await;
    let _operator = Operator::start(&env).await;
    create_pool(&env, "warm", 1, json!({ "suspend": true })).await;
    pool_ready(&env, "warm", 1).await;
    let member = unclaimed(&env, "warm").await.remove(0);
    assert_eq!(condition(&member, "Ready").1, "KernelReady");

    // No cold create within the test: the claim is served from the pool or not at all.
    let pool_ref = json!({ "poolRef": { "name": "warm", "coldCreateAfterSeconds": 600 } });
    create_executor(&env, "agent", pool_ref).await;
    let agent = wait_ready(&env, "agent").await;
    assert_eq!(sandbox_of(&agent), sandbox_of(&member));
    let ran = run(&env, "one", "agent", "1 + 1").await;
    assert_eq!(
        (reason(&ran).as_str(), output(&ran).as_str()),
        ("Completed", "2")
    );
}

#[tokio::test]
async fn a_pool_sized_by_demand_grows_from_zero_with_its_claims_and_scales_back_to_zero_after_a_quiet_window()
 {
    let env = TestEnv::new("pool-demand").await;
    let operator = Operator::start(&env).await;
    let pool: BriqExecutorPool = serde_json::from_value(json!({
        "metadata": { "name": "demand" },
        // replicas is not used once maxReady sizes the pool by demand. The window outlasts a
        // member's making on a loaded machine several times over: a member still being made when
        // its claim leaves the window goes with the target, and the pool never shows it Ready.
        "spec": { "replicas": 5, "maxReady": 3, "demandWindowSeconds": 30, "template": {} },
    }))
    .unwrap();
    let pools = env.api::<BriqExecutorPool>();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    let target = |pool: &BriqExecutorPool| {
        let status = pool.status.clone().unwrap_or_default();
        (status.observed_generation == pool.metadata.generation)
            .then_some((status.target_replicas, status.replicas))
    };
    wait_for(&pools, "demand", 60, |pool| {
        target(pool) == Some((Some(0), 0))
    })
    .await;
    assert!(
        unclaimed(&env, "demand").await.is_empty(),
        "no claim yet: no member"
    );

    // The first claim finds nothing warm: it makes its own sandbox at once, and the pool makes
    // a member for the next one.
    create_executor(&env, "first", json!({ "poolRef": { "name": "demand" } })).await;
    let first = wait_ready(&env, "first").await;
    assert_own_sandbox(&env, &operator, &first).await;
    let grown = pool_ready(&env, "demand", 1).await;
    let demand = grown.status.unwrap().demand.expect("what the rule saw");
    assert_eq!((demand.claims_in_window, demand.peak_per_refill), (1, 1));

    // The next claim is served warm.
    create_executor(&env, "second", json!({ "poolRef": { "name": "demand" } })).await;
    let second = wait_ready(&env, "second").await;
    assert!(
        second.claimed_member().is_some(),
        "claimed a warm member: {:?}",
        second.status
    );
    // What the pool saw: two claims in its window, the first of them cold.
    wait_for(&pools, "demand", 60, |pool| {
        let demand = pool.status.clone().unwrap_or_default().demand;
        demand.is_some_and(|d| (d.claims_in_window, d.cold_in_window) == (2, 1))
    })
    .await;

    // A window without a claim: back to zero, its unclaimed members gone.
    wait_for(&pools, "demand", 60, |pool| {
        target(pool) == Some((Some(0), 0))
    })
    .await;
    eventually(60, "the pool's members are gone", || async {
        unclaimed(&env, "demand").await.is_empty()
    })
    .await;
}
