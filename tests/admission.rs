//! Only the operator writes the operator's fields: the chart's ValidatingAdmissionPolicy against
//! the real kube-apiserver. A tenant whose RBAC allows everything on both kinds, status included,
//! is still denied the `briq.cloud/` annotations (which sandbox an executor owns) and status;
//! the operator's ServiceAccount, bound as the chart binds it, is not.
//!
//! Each test installs a release of its own, watching its namespace only, so that the policies
//! (cluster-scoped) of the tests running at once never meet.

mod ops;
mod support;

use briq_operator::crd::{BriqExecutor, Execution};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use support::{TestEnv, wait_deleted};

const SANDBOX_ID: &str = "briq.cloud/sandbox-id";
const CREATE_PENDING: &str = "briq.cloud/sandbox-create-pending";

/// One namespace with the chart's RBAC and admission policy, a tenant and the operator.
struct Guarded {
    env: TestEnv,
    /// `system:serviceaccount:<namespace>:<release>-briq-operator`.
    operator_user: String,
    /// Impersonates a tenant allowed everything on both kinds and their status.
    tenant: Client,
    /// Impersonates the operator's ServiceAccount.
    operator: Client,
}

/// A tenant's Role: RBAC allows everything, so only admission can stop them.
const TENANT_ROLE: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: { name: tenant-edit }
rules:
  - apiGroups: ["briq.cloud"]
    resources: ["briqexecutors", "executions", "briqexecutors/status", "executions/status"]
    verbs: ["*"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: tenant-edit }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant-edit }
subjects:
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant }
"#;

impl Guarded {
    async fn install(prefix: &str) -> Guarded {
        let env = TestEnv::new(prefix).await;
        let release = format!("adm-{:06x}", rand::random::<u32>() & 0xff_ffff);
        let watch = format!("watchNamespace={}", env.namespace);
        let documents = ops::template(&release, &env.namespace, &["--set", &watch]);
        let wanted: Vec<&Value> = documents
            .iter()
            .filter(|d| {
                [
                    "ServiceAccount",
                    "ClusterRole",
                    "RoleBinding",
                    "ValidatingAdmissionPolicy",
                    "ValidatingAdmissionPolicyBinding",
                ]
                .contains(&d["kind"].as_str().unwrap())
            })
            .collect();
        // (The chart's class policies, tests/class_admission.rs, come along: no class, no check.)
        let fields = format!("{release}-briq-operator-operator-fields");
        assert_eq!(
            ops::find(&documents, "ValidatingAdmissionPolicyBinding")
                .iter()
                .filter(|binding| binding["metadata"]["name"] == fields.as_str())
                .count(),
            1,
            "the policy is on by default"
        );
        ops::apply(&env, &ops::yaml(&wanted), "admission-test");
        ops::apply(&env, TENANT_ROLE, "admission-test");
        ops::admission_policy_effective(&env).await;

        let operator_user = format!(
            "system:serviceaccount:{}:{release}-briq-operator",
            env.namespace
        );
        let tenant = ops::impersonating(&env, "tenant").await;
        let operator = ops::impersonating(&env, &operator_user).await;
        Guarded {
            env,
            operator_user,
            tenant,
            operator,
        }
    }

    fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(client.clone(), &self.env.namespace)
    }

    /// The tenant creates an executor (`annotations` on it), as tenants do.
    async fn tenant_executor(&self, name: &str, annotations: Value) -> BriqExecutor {
        self.api::<BriqExecutor>(&self.tenant)
            .create(
                &PostParams::default(),
                &object(name, annotations, json!({})),
            )
            .await
            .unwrap_or_else(|error| panic!("the tenant creates executor {name}: {error}"))
    }

    async fn tenant_execution(&self, name: &str, annotations: Value) -> Execution {
        self.api::<Execution>(&self.tenant)
            .create(
                &PostParams::default(),
                &object(name, annotations, execution_spec()),
            )
            .await
            .unwrap_or_else(|error| panic!("the tenant creates execution {name}: {error}"))
    }

    /// The operator records a sandbox on an object, as the executor controller does (merge patch
    /// of the annotations).
    async fn operator_annotates<K>(&self, name: &str, annotations: Value)
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let patch = json!({ "metadata": { "annotations": annotations } });
        self.api::<K>(&self.operator)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|error| panic!("the operator annotates {name}: {error}"));
    }
}

fn object<K: DeserializeOwned>(name: &str, annotations: Value, spec: Value) -> K {
    serde_json::from_value(json!({
        "metadata": { "name": name, "annotations": annotations },
        "spec": spec,
    }))
    .unwrap()
}

fn execution_spec() -> Value {
    json!({ "executorRef": { "name": "py" }, "code": "1 + 1" })
}

/// Asserts that the policy (not RBAC, not validation) denied `result`, with a message containing
/// each of `mentions`.
#[track_caller]
fn denied<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>, mentions: &[&str]) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{what}: {status:?}");
            assert!(
                status.message.contains("ValidatingAdmissionPolicy"),
                "{what}: denied by something else: {}",
                status.message
            );
            for mention in mentions {
                assert!(
                    status.message.contains(mention),
                    "{what}: the message should name {mention:?}: {}",
                    status.message
                );
            }
        }
        other => panic!("{what} was allowed: {other:?}"),
    }
}

fn annotations<K: kube::Resource>(object: &K) -> Vec<(String, String)> {
    object
        .meta()
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect()
}

#[tokio::test]
async fn a_tenant_cannot_create_objects_naming_a_sandbox() {
    let guarded = Guarded::install("adm-create").await;
    let executors = guarded.api::<BriqExecutor>(&guarded.tenant);
    for key in [SANDBOX_ID, CREATE_PENDING, "briq.cloud/anything-new"] {
        let stolen: BriqExecutor = object(
            "py",
            json!({ key: "bq_someone_elses", "team": "a" }),
            json!({}),
        );
        denied(
            &format!("creating an executor with {key}"),
            executors.create(&PostParams::default(), &stolen).await,
            &[key, "briqexecutors py", &guarded.operator_user],
        );
    }
    // `kubectl get -o yaml`, rename, apply: the copy carries the operator's annotations.
    let copied: Execution = object(
        "copy",
        json!({ SANDBOX_ID: "bq_someone_elses" }),
        execution_spec(),
    );
    denied(
        "creating an execution with briq.cloud/sandbox-id",
        guarded
            .api::<Execution>(&guarded.tenant)
            .create(&PostParams::default(), &copied)
            .await,
        &[SANDBOX_ID, "executions copy"],
    );
    // Not even the cluster admin (system:masters) is exempt: restores must strip them.
    denied(
        "the admin creating an executor with briq.cloud/sandbox-id",
        guarded
            .env
            .api::<BriqExecutor>()
            .create(
                &PostParams::default(),
                &object::<BriqExecutor>("py", json!({ SANDBOX_ID: "bq_x" }), json!({})),
            )
            .await,
        &[SANDBOX_ID],
    );
}

#[tokio::test]
async fn a_tenant_cannot_add_change_or_remove_the_operators_annotations() {
    let guarded = Guarded::install("adm-annotations").await;
    let executors = guarded.api::<BriqExecutor>(&guarded.tenant);
    guarded.tenant_executor("py", json!({ "team": "a" })).await;

    // Adding one, by merge patch, JSON patch, server-side apply and replace.
    let add = json!({ "metadata": { "annotations": { SANDBOX_ID: "bq_someone_elses" } } });
    denied(
        "adding briq.cloud/sandbox-id by merge patch",
        executors
            .patch("py", &PatchParams::default(), &Patch::Merge(&add))
            .await,
        &[SANDBOX_ID, "briqexecutors py"],
    );
    let json_patch: json_patch::Patch = serde_json::from_value(json!([{
        "op": "add", "path": "/metadata/annotations/briq.cloud~1sandbox-create-pending",
        "value": "2026-01-01T00:00:00Z"
    }]))
    .unwrap();
    denied(
        "adding briq.cloud/sandbox-create-pending by JSON patch",
        executors
            .patch(
                "py",
                &PatchParams::default(),
                &Patch::Json::<()>(json_patch),
            )
            .await,
        &[CREATE_PENDING],
    );
    let applied = json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
        "metadata": { "name": "py", "annotations": { SANDBOX_ID: "bq_someone_elses" } },
    });
    denied(
        "adding briq.cloud/sandbox-id by server-side apply",
        executors
            .patch("py", &PatchParams::apply("tenant"), &Patch::Apply(&applied))
            .await,
        &[SANDBOX_ID],
    );
    let mut replaced = executors.get("py").await.unwrap();
    replaced
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(SANDBOX_ID.into(), "bq_someone_elses".into());
    denied(
        "adding briq.cloud/sandbox-id by replace",
        executors
            .replace("py", &PostParams::default(), &replaced)
            .await,
        &[SANDBOX_ID],
    );

    // The operator records the executor's sandbox; the tenant can neither change nor remove it.
    guarded
        .operator_annotates::<BriqExecutor>("py", json!({ SANDBOX_ID: "bq_mine" }))
        .await;
    let change = json!({ "metadata": { "annotations": { SANDBOX_ID: "bq_someone_elses" } } });
    denied(
        "changing briq.cloud/sandbox-id",
        executors
            .patch("py", &PatchParams::default(), &Patch::Merge(&change))
            .await,
        &[SANDBOX_ID],
    );
    let remove = json!({ "metadata": { "annotations": { SANDBOX_ID: null } } });
    denied(
        "removing briq.cloud/sandbox-id",
        executors
            .patch("py", &PatchParams::default(), &Patch::Merge(&remove))
            .await,
        &[SANDBOX_ID],
    );
    let mut stripped = executors.get("py").await.unwrap();
    stripped.metadata.annotations = None;
    denied(
        "removing every annotation by replace",
        executors
            .replace("py", &PostParams::default(), &stripped)
            .await,
        &[SANDBOX_ID],
    );
    assert_eq!(
        annotations(&executors.get("py").await.unwrap()),
        [
            (SANDBOX_ID.to_owned(), "bq_mine".to_owned()),
            ("team".to_owned(), "a".to_owned())
        ]
    );

    // The same on an Execution.
    let executions = guarded.api::<Execution>(&guarded.tenant);
    guarded.tenant_execution("run", json!({})).await;
    denied(
        "adding a briq.cloud/ annotation to an execution",
        executions
            .patch("run", &PatchParams::default(), &Patch::Merge(&add))
            .await,
        &[SANDBOX_ID, "executions run"],
    );
    guarded
        .operator_annotates::<Execution>("run", json!({ "briq.cloud/attempt": "a1" }))
        .await;
    let remove = json!({ "metadata": { "annotations": { "briq.cloud/attempt": null } } });
    denied(
        "removing the operator's annotation from an execution",
        executions
            .patch("run", &PatchParams::default(), &Patch::Merge(&remove))
            .await,
        &["briq.cloud/attempt"],
    );
}

#[tokio::test]
async fn a_tenant_cannot_write_status() {
    let guarded = Guarded::install("adm-status").await;
    guarded.tenant_executor("py", json!({})).await;
    guarded.tenant_execution("run", json!({})).await;
    let executors = guarded.api::<BriqExecutor>(&guarded.tenant);
    let executions = guarded.api::<Execution>(&guarded.tenant);

    for (what, status) in [
        (
            "status.sandboxId",
            json!({ "status": { "sandboxId": "bq_someone_elses" } }),
        ),
        (
            "status.unusable",
            json!({ "status": { "unusable": false } }),
        ),
    ] {
        denied(
            &format!("writing an executor's {what}"),
            executors
                .patch_status("py", &PatchParams::default(), &Patch::Merge(&status))
                .await,
            &["status of briqexecutors py", &guarded.operator_user],
        );
    }
    let applied = json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
        "status": { "sandboxId": "bq_someone_elses" },
    });
    denied(
        "writing an executor's status by server-side apply",
        executors
            .patch_status("py", &PatchParams::apply("tenant"), &Patch::Apply(&applied))
            .await,
        &["status of briqexecutors py"],
    );
    let mut replaced = executors.get("py").await.unwrap();
    replaced.status.get_or_insert_default().sandbox_id = Some("bq_someone_elses".into());
    denied(
        "replacing an executor's status",
        executors
            .replace_status("py", &PostParams::default(), &replaced)
            .await,
        &["status of briqexecutors py"],
    );
    let attempt = json!({ "status": { "attemptId": "someone-elses-attempt", "output": "42" } });
    denied(
        "writing an execution's status.attemptId",
        executions
            .patch_status("run", &PatchParams::default(), &Patch::Merge(&attempt))
            .await,
        &["status of executions run"],
    );
    assert!(executors.get("py").await.unwrap().status.is_none());
    assert!(executions.get("run").await.unwrap().status.is_none());
}

#[tokio::test]
async fn a_tenant_still_manages_their_objects() {
    let guarded = Guarded::install("adm-tenant").await;
    let executors = guarded.api::<BriqExecutor>(&guarded.tenant);
    let executions = guarded.api::<Execution>(&guarded.tenant);
    guarded
        .tenant_executor(
            "py",
            json!({ "example.com/team": "a", "briq.cloud-ish": "ok" }),
        )
        .await;
    guarded.tenant_execution("run", json!({})).await;
    guarded
        .operator_annotates::<BriqExecutor>("py", json!({ SANDBOX_ID: "bq_mine" }))
        .await;

    // Labels, other annotations and the spec, by every kind of write.
    let labels = json!({ "metadata": {
        "labels": { "team": "b" },
        "annotations": { "example.com/team": "b", "note": "x" },
    } });
    executors
        .patch("py", &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .expect("labels and other annotations");
    let spec = json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
        "metadata": { "name": "py", "labels": { "applied": "yes" } },
        "spec": { "executionHistoryLimit": 3 },
    });
    executors
        .patch("py", &PatchParams::apply("tenant"), &Patch::Apply(&spec))
        .await
        .expect("server-side apply of the spec");
    // A read-modify-write carries the operator's annotations along unchanged: allowed.
    let mut edited = executors.get("py").await.unwrap();
    edited.spec.execution_history_limit = Some(5);
    edited
        .metadata
        .annotations
        .get_or_insert_default()
        .remove("note");
    let edited = executors
        .replace("py", &PostParams::default(), &edited)
        .await
        .expect("replace carrying the operator's annotations");
    assert_eq!(edited.spec.execution_history_limit, Some(5));
    assert_eq!(
        edited
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .get(SANDBOX_ID)
            .map(String::as_str),
        Some("bq_mine")
    );
    executions
        .patch("run", &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .expect("labels on an execution");

    // Deleting (the operator's finalizer is not the tenant's business here).
    executions
        .delete("run", &DeleteParams::default())
        .await
        .expect("deleting an execution");
    executors
        .delete("py", &DeleteParams::default())
        .await
        .expect("deleting an executor");
    wait_deleted(&executions, "run", 30).await;
    wait_deleted(&executors, "py", 30).await;

    // A release watching one namespace guards that namespace only.
    let elsewhere = TestEnv::new("adm-elsewhere").await;
    elsewhere
        .api::<BriqExecutor>()
        .create(
            &PostParams::default(),
            &object::<BriqExecutor>("py", json!({ SANDBOX_ID: "bq_restored" }), json!({})),
        )
        .await
        .expect("another namespace is not this release's");
}

#[tokio::test]
async fn the_operators_service_account_sets_annotations_writes_status_and_removes_the_finalizer() {
    let guarded = Guarded::install("adm-operator").await;
    let as_operator = guarded.api::<BriqExecutor>(&guarded.operator);
    guarded.tenant_executor("py", json!({ "team": "a" })).await;
    guarded.tenant_execution("run", json!({})).await;

    // What the executor controller does: finalizer (JSON patch), create-pending, sandbox id.
    let finalizer: json_patch::Patch = serde_json::from_value(json!([
        { "op": "test", "path": "/metadata/finalizers", "value": null },
        { "op": "add", "path": "/metadata/finalizers", "value": ["briq.cloud/destroy-sandbox"] },
    ]))
    .unwrap();
    as_operator
        .patch("py", &PatchParams::default(), &Patch::Json::<()>(finalizer))
        .await
        .expect("the operator adds its finalizer");
    guarded
        .operator_annotates::<BriqExecutor>("py", json!({ CREATE_PENDING: "2026-01-01T00:00:00Z" }))
        .await;
    guarded
        .operator_annotates::<BriqExecutor>(
            "py",
            json!({ CREATE_PENDING: null, SANDBOX_ID: "bq_mine" }),
        )
        .await;
    let status = json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
        "status": { "sandboxId": "bq_mine", "unusable": false },
    });
    as_operator
        .patch_status(
            "py",
            &PatchParams::apply("briq-operator").force(),
            &Patch::Apply(&status),
        )
        .await
        .expect("the operator writes an executor's status");
    let status = json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "Execution",
        "status": { "attemptId": "a1", "output": "2" },
    });
    guarded
        .api::<Execution>(&guarded.operator)
        .patch_status(
            "run",
            &PatchParams::apply("briq-operator").force(),
            &Patch::Apply(&status),
        )
        .await
        .expect("the operator writes an execution's status");
    let executor = as_operator.get("py").await.unwrap();
    assert_eq!(
        annotations(&executor),
        [
            (SANDBOX_ID.to_owned(), "bq_mine".to_owned()),
            ("team".to_owned(), "a".to_owned())
        ]
    );
    assert_eq!(
        executor.status.unwrap().sandbox_id.as_deref(),
        Some("bq_mine")
    );

    // The tenant deletes; the operator's cleanup removes the sandbox annotation and the finalizer.
    guarded
        .api::<BriqExecutor>(&guarded.tenant)
        .delete("py", &DeleteParams::default())
        .await
        .expect("the tenant deletes the executor");
    guarded
        .operator_annotates::<BriqExecutor>("py", json!({ SANDBOX_ID: null }))
        .await;
    let release: json_patch::Patch = serde_json::from_value(json!([
        { "op": "test", "path": "/metadata/finalizers/0", "value": "briq.cloud/destroy-sandbox" },
        { "op": "remove", "path": "/metadata/finalizers/0" },
    ]))
    .unwrap();
    as_operator
        .patch("py", &PatchParams::default(), &Patch::Json::<()>(release))
        .await
        .expect("the operator removes its finalizer");
    wait_deleted(&as_operator, "py", 30).await;
    // And the operator deletes finished Executions (executionHistoryLimit).
    guarded
        .api::<Execution>(&guarded.operator)
        .delete("run", &DeleteParams::default())
        .await
        .expect("the operator deletes an execution");
}

/// A user who may create executors but not read one is refused a fork of it: a fork would hand
/// them its Python state.
#[tokio::test]
async fn a_user_who_may_not_read_an_executor_cannot_fork_it() {
    let guarded = Guarded::install("adm-fork").await;
    guarded.tenant_executor("secret-state", json!({})).await;
    let creator_only = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: { name: create-only }
rules:
  - apiGroups: ["briq.cloud"]
    resources: ["briqexecutors"]
    verbs: ["create"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: create-only }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: create-only }
subjects:
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: creator }
"#;
    ops::apply(&guarded.env, creator_only, "admission-test");
    let creator = ops::impersonating(&guarded.env, "creator").await;
    let fork = |name: &str| {
        object::<BriqExecutor>(
            name,
            json!({}),
            json!({ "forkFrom": { "name": "secret-state" } }),
        )
    };
    // RBAC lets them create: a plain executor goes through (once the grant is in effect).
    let plain = object::<BriqExecutor>("plain", json!({}), json!({}));
    briq_dev::wait::poll(
        std::time::Duration::from_secs(30),
        std::time::Duration::from_millis(100),
        "the creator's grant is in effect",
        || async {
            let created = guarded
                .api::<BriqExecutor>(&creator)
                .create(&PostParams::default(), &plain)
                .await;
            Ok(created.is_ok())
        },
    )
    .await
    .unwrap();
    denied(
        "a fork of an executor the creator may not get",
        guarded
            .api::<BriqExecutor>(&creator)
            .create(&PostParams::default(), &fork("stolen"))
            .await,
        &[
            "forking briqexecutor secret-state",
            "creator may not get it",
        ],
    );
    // The tenant, who may read it, forks it.
    guarded
        .api::<BriqExecutor>(&guarded.tenant)
        .create(&PostParams::default(), &fork("mine"))
        .await
        .expect("a fork by a user who may read the source");
}
