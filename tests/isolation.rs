//! Tenant isolation, tried as a hostile tenant would: two namespaces whose executors share one
//! briq account (the operator's default key), each namespace with the controllers of its own
//! operator run, one sandbox server behind both. Every id a tenant can write is a claim that
//! briq must confirm; a foreign sandbox is never adopted, run in or destroyed.

mod support;

use briq_dev::stack::{self, Controllers};
use briq_operator::crd::{BriqExecutor, Execution, SANDBOX_ID_ANNOTATION};
use k8s_openapi::api::events::v1::Event;
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use support::{
    Operator, TestEnv, condition, create_execution, create_executor, finished, output, reason,
    wait_deleted, wait_for, wait_ready,
};

const RUN_SECONDS: u64 = 60;

/// A victim's namespace with a Ready executor `py` whose kernel holds a secret, and a thief's
/// namespace served from the same briq account.
struct Tenants {
    victim: TestEnv,
    thief: TestEnv,
    operator: Operator,
    _thief_controllers: Controllers,
    victim_sandbox: String,
}

impl Tenants {
    async fn new(prefix: &str) -> Tenants {
        let victim = TestEnv::new(&format!("{prefix}-victim")).await;
        let thief = TestEnv::new(&format!("{prefix}-thief")).await;
        let operator = Operator::start(&victim).await;
        let settings = stack::settings(Some(&thief.namespace), &operator.server);
        let thief_controllers =
            Controllers::start(thief.client.clone(), &operator.server, settings)
                .expect("the thief namespace's controllers");
        create_executor(&victim, "py", json!({})).await;
        let ready = wait_ready(&victim, "py").await;
        let victim_sandbox = ready.status.unwrap().sandbox_id.unwrap();
        create_execution(&victim, "keep", "py", "secret = 'victim-state'").await;
        assert_eq!(
            reason(&finished(&victim, "keep", RUN_SECONDS).await),
            "Completed"
        );
        Tenants {
            victim,
            thief,
            operator,
            _thief_controllers: thief_controllers,
            victim_sandbox,
        }
    }

    async fn live_sandboxes(&self) -> Vec<String> {
        let stats = self.operator.admin().stats().await.unwrap();
        stats.sandboxes.into_iter().map(|s| s.id).collect()
    }

    /// The victim's executor is still Ready on the same sandbox, and its kernel still holds the
    /// secret.
    async fn victim_is_intact(&self, check: &str) {
        let executor = self.victim.api::<BriqExecutor>().get("py").await.unwrap();
        assert_eq!(condition(&executor, "Ready").0, "True");
        let status = executor.status.unwrap();
        assert_eq!(
            status.sandbox_id.as_deref(),
            Some(self.victim_sandbox.as_str())
        );
        assert!(!status.unusable);
        assert!(self.live_sandboxes().await.contains(&self.victim_sandbox));
        create_execution(&self.victim, check, "py", "secret").await;
        let checked = finished(&self.victim, check, RUN_SECONDS).await;
        assert_eq!(output(&checked), "'victim-state'");
    }
}

async fn not_owned_events(env: &TestEnv) -> usize {
    let events: Api<Event> = env.api();
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("SandboxNotOwned"))
        .count()
}

#[tokio::test]
async fn a_copied_manifest_naming_another_tenants_sandbox_gets_its_own_and_deleting_it_spares_the_victim()
 {
    let tenants = Tenants::new("iso-copy").await;
    let (victim, thief) = (&tenants.victim, &tenants.thief);

    // `kubectl get -o yaml`, another namespace, apply: every annotation comes along.
    let original = victim.api::<BriqExecutor>().get("py").await.unwrap();
    assert_eq!(
        original.annotations().get(SANDBOX_ID_ANNOTATION),
        Some(&tenants.victim_sandbox)
    );
    let copy: BriqExecutor = serde_json::from_value(json!({
        "metadata": { "name": "py", "annotations": original.annotations() },
        "spec": original.spec,
    }))
    .unwrap();
    thief
        .api::<BriqExecutor>()
        .create(&PostParams::default(), &copy)
        .await
        .unwrap();
    let stolen = wait_ready(thief, "py").await;
    let own = stolen.status.unwrap().sandbox_id.unwrap();
    assert_ne!(
        own, tenants.victim_sandbox,
        "the copy got a sandbox of its own"
    );
    assert!(
        not_owned_events(thief).await >= 1,
        "the refusal is an Event"
    );

    create_execution(thief, "peek", "py", "secret").await;
    let peek = finished(thief, "peek", RUN_SECONDS).await;
    assert_eq!(reason(&peek), "CodeError", "{:?}", peek.status);
    assert!(!format!("{:?}", peek.status).contains("victim-state"));

    thief
        .api::<BriqExecutor>()
        .delete("py", &Default::default())
        .await
        .unwrap();
    wait_deleted(&thief.api::<BriqExecutor>(), "py", 60).await;
    assert!(
        !tenants.live_sandboxes().await.contains(&own),
        "its own is destroyed"
    );
    tenants.victim_is_intact("after-copy").await;
}

#[tokio::test]
async fn a_foreign_sandbox_id_written_into_status_never_receives_code_and_is_never_destroyed() {
    let tenants = Tenants::new("iso-status").await;
    let (victim, thief) = (&tenants.victim, &tenants.thief);
    create_executor(thief, "py", json!({})).await;
    let own = wait_ready(thief, "py")
        .await
        .status
        .unwrap()
        .sandbox_id
        .unwrap();

    // A tenant with status rights points its executor at the victim's sandbox, in the status
    // and in the annotation.
    let executors = thief.api::<BriqExecutor>();
    let forged = json!({ "status": { "sandboxId": tenants.victim_sandbox } });
    executors
        .patch_status("py", &PatchParams::default(), &Patch::Merge(&forged))
        .await
        .unwrap();
    let annotation = json!({ "metadata": { "annotations": {
        SANDBOX_ID_ANNOTATION: tenants.victim_sandbox,
    } } });
    executors
        .patch("py", &PatchParams::default(), &Patch::Merge(&annotation))
        .await
        .unwrap();

    // Whether the operator refuses the run or has already gone back to the executor's own
    // sandbox, the code never reaches the victim's kernel.
    create_execution(thief, "peek", "py", "secret").await;
    let peek = finished(thief, "peek", RUN_SECONDS).await;
    assert!(
        ["SandboxNotOwned", "CodeError"].contains(&reason(&peek).as_str()),
        "{:?}",
        peek.status
    );
    assert!(!format!("{:?}", peek.status).contains("victim-state"));
    let repaired = wait_for(&executors, "py", 30, |e| {
        e.status.as_ref().and_then(|s| s.sandbox_id.as_deref()) == Some(own.as_str())
    })
    .await;
    assert_eq!(condition(&repaired, "Ready").0, "True");
    assert!(
        not_owned_events(thief).await >= 1,
        "the refusal is an Event"
    );

    // Deleting it destroys its own sandbox and leaves the victim's alone, whatever it names.
    executors
        .patch("py", &PatchParams::default(), &Patch::Merge(&annotation))
        .await
        .unwrap();
    executors.delete("py", &Default::default()).await.unwrap();
    wait_deleted(&executors, "py", 60).await;
    assert!(
        !tenants.live_sandboxes().await.contains(&own),
        "its own is destroyed"
    );
    tenants.victim_is_intact("after-status").await;
    let executions: Api<Execution> = victim.api();
    assert_eq!(
        reason(&executions.get("after-status").await.unwrap()),
        "Completed"
    );
}
