//! The CRDs against a real kube-apiserver: schema, CEL rules, status subresource, printer
//! columns and `kubectl explain`.

mod support;

use briq_operator::crd::{BriqExecutor, BriqExecutorPool, Execution};
use kube::{
    Api, Resource,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    core::{ApiResource, Status},
};
use serde_json::{Value, json};
use support::TestEnv;

#[test]
fn checked_in_crds_match_the_rust_types() {
    let generated = briq_operator::crd::to_yaml().unwrap();
    let checked_in = std::fs::read_to_string(support::repo_root().join("crds/briq.cloud.yaml"))
        .expect("crds/briq.cloud.yaml");
    assert!(
        generated == checked_in,
        "crds/briq.cloud.yaml is stale: run `cargo run -- crd > crds/briq.cloud.yaml`"
    );
}

#[test]
fn the_python_clients_vocabulary_matches_the_rust_reasons() {
    let generated = briq_operator::crd::vocabulary::python_module();
    let path = "bridge/agent/briq_operator_client/vocabulary.py";
    let checked_in = std::fs::read_to_string(support::repo_root().join(path)).expect(path);
    assert!(
        generated == checked_in,
        "{path} is stale: run `cargo run -p briq-dev -- vocabulary > {path}`"
    );
}

fn dynamic<K: Resource<DynamicType = ()>>(env: &TestEnv) -> Api<DynamicObject> {
    Api::namespaced_with(
        env.client.clone(),
        &env.namespace,
        &ApiResource::erase::<K>(&()),
    )
}

fn object<K: Resource<DynamicType = ()>>(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": { "name": name },
        "spec": spec,
    }))
    .unwrap()
}

/// Creates the object and returns the API server's refusal.
async fn refused<K: Resource<DynamicType = ()>>(env: &TestEnv, spec: Value) -> Status {
    let result = dynamic::<K>(env)
        .create(&PostParams::default(), &object::<K>("bad", spec))
        .await;
    match result {
        Err(kube::Error::Api(response)) => *response,
        other => panic!("expected the API server to refuse the object, got {other:?}"),
    }
}

#[tokio::test]
async fn valid_objects_are_accepted_with_defaults() {
    let env = TestEnv::new("crd-valid").await;
    dynamic::<BriqExecutor>(&env)
        .create(
            &PostParams::default(),
            &object::<BriqExecutor>("py", json!({})),
        )
        .await
        .unwrap();
    let executor = env.api::<BriqExecutor>().get("py").await.unwrap();
    assert_eq!(executor.spec.image, "python:3.12-slim");
    assert_eq!(executor.spec.sleep, "30m");
    assert_eq!(executor.spec.execution_timeout_seconds, 30);
    assert_eq!(executor.spec.setup_timeout_seconds, 60);
    assert_eq!(executor.spec.size, None);

    let spec = json!({ "executorRef": { "name": "py" }, "code": "1 + 1", "timeoutSeconds": 40 });
    dynamic::<Execution>(&env)
        .create(&PostParams::default(), &object::<Execution>("one", spec))
        .await
        .unwrap();
    let execution = env.api::<Execution>().get("one").await.unwrap();
    assert_eq!(execution.spec.timeout_seconds, Some(40));
}

/// A claimer's spec with `env` as its `poolRef.env`.
fn pool_env(env: serde_json::Value) -> serde_json::Value {
    json!({ "poolRef": { "name": "fast", "env": env } })
}

#[tokio::test]
async fn invalid_executors_are_refused_with_clear_messages() {
    let env = TestEnv::new("crd-bad-executor").await;
    let cases = [
        (
            json!({ "executionTimeoutSeconds": 41 }),
            "executionTimeoutSeconds",
        ),
        (
            json!({ "executionTimeoutSeconds": 0 }),
            "executionTimeoutSeconds",
        ),
        (json!({ "sleep": "30" }), "sleep"),
        (
            json!({ "apiKeySecretRef": { "key": "k" } }),
            "apiKeySecretRef.name",
        ),
        (
            json!({ "apiKeySecretRef": { "name": "Bad_Name" } }),
            "apiKeySecretRef.name",
        ),
        (json!({ "apiKeySecretRef": "briq-key" }), "apiKeySecretRef"),
        (
            json!({ "packages": ["--index-url=http://x"] }),
            "pip options are not allowed",
        ),
        (
            json!({ "env": [{ "name": "1BAD", "value": "x" }] }),
            "env[0].name",
        ),
        (json!({ "size": "Large!" }), "size"),
        (
            pool_env(json!([{ "name": "PYTHONPATH", "value": "/tmp" }])),
            "are reserved for the bridge and the interpreter",
        ),
        (
            pool_env(json!([{ "name": "BRIQ_NONCE", "value": "x" }])),
            "are reserved for the bridge and the interpreter",
        ),
        (
            pool_env(json!([{ "name": "T", "value": "x",
                "valueFrom": { "secretKeyRef": { "name": "s", "key": "k" } } }])),
            "set exactly one of value and valueFrom",
        ),
        (
            pool_env(json!([{ "name": "T" }])),
            "set exactly one of value and valueFrom",
        ),
        (
            pool_env(json!([{ "name": "T", "value": "a" }, { "name": "T", "value": "b" }])),
            "env names must be unique",
        ),
        (
            pool_env(json!([{ "name": "T", "valueFrom": { "secretKeyRef": { "name": "s" } } }])),
            "secretKeyRef.key",
        ),
    ];
    for (spec, expected) in cases {
        let refusal = refused::<BriqExecutor>(&env, spec.clone()).await;
        assert_eq!(refusal.code, 422, "{spec}: {refusal:?}");
        assert!(
            refusal.message.contains(expected),
            "{spec}: {}",
            refusal.message
        );
    }
}

#[tokio::test]
async fn invalid_executions_are_refused_with_clear_messages() {
    let env = TestEnv::new("crd-bad-execution").await;
    let cases = [
        (
            json!({ "executorRef": { "name": "py" } }),
            "spec.code: Required value",
        ),
        (
            json!({ "executorRef": { "name": "py" }, "code": "" }),
            "spec.code",
        ),
        (json!({ "code": "1" }), "spec.executorRef: Required value"),
        (
            json!({ "executorRef": { "name": "py" }, "code": "1", "timeoutSeconds": 41 }),
            "timeoutSeconds",
        ),
        (
            json!({ "executorRef": { "name": "py" }, "code": "x".repeat(262_145) }),
            "spec.code",
        ),
    ];
    for (spec, expected) in cases {
        let refusal = refused::<Execution>(&env, spec.clone()).await;
        assert_eq!(refusal.code, 422, "{expected}: {refusal:?}");
        assert!(
            refusal.message.contains(expected),
            "{expected}: {}",
            refusal.message
        );
    }
}

#[tokio::test]
async fn execution_spec_and_executor_sandbox_fields_are_immutable() {
    let env = TestEnv::new("crd-immutable").await;
    let spec = json!({ "executorRef": { "name": "py" }, "code": "1 + 1" });
    dynamic::<Execution>(&env)
        .create(&PostParams::default(), &object::<Execution>("once", spec))
        .await
        .unwrap();
    let edit = json!({ "spec": { "code": "2 + 2" } });
    let refusal = env
        .api::<Execution>()
        .patch("once", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap_err();
    assert!(
        refusal.to_string().contains("Execution spec is immutable"),
        "{refusal}"
    );

    dynamic::<BriqExecutor>(&env)
        .create(
            &PostParams::default(),
            &object::<BriqExecutor>("py", json!({})),
        )
        .await
        .unwrap();
    for edit in [
        json!({ "spec": { "image": "python:3.13" } }),
        json!({ "spec": { "size": "large" } }),
    ] {
        let refusal = env
            .api::<BriqExecutor>()
            .patch("py", &PatchParams::default(), &Patch::Merge(&edit))
            .await
            .unwrap_err();
        assert!(
            refusal.to_string().contains("immutable"),
            "{edit}: {refusal}"
        );
    }
    // The per-execution deadline may change: it shapes no sandbox.
    let edit = json!({ "spec": { "executionTimeoutSeconds": 10 } });
    env.api::<BriqExecutor>()
        .patch("py", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
}

/// `spec.cancel` is the one field of an Execution's spec that may change, and only to true:
/// every other field stays as created (an optional one stays set or unset), and a cancel
/// cannot be taken back.
#[tokio::test]
async fn execution_spec_takes_cancel_once_and_nothing_else() {
    let env = TestEnv::new("crd-cancel").await;
    let spec = json!({ "executorRef": { "name": "py" }, "code": "1 + 1", "timeoutSeconds": 5 });
    dynamic::<Execution>(&env)
        .create(&PostParams::default(), &object::<Execution>("once", spec))
        .await
        .unwrap();
    let api = env.api::<Execution>();
    let patch = |edit: serde_json::Value| {
        let api = api.clone();
        async move {
            api.patch("once", &PatchParams::default(), &Patch::Merge(&edit))
                .await
        }
    };
    for edit in [
        json!({ "spec": { "timeoutSeconds": 6 } }),
        json!({ "spec": { "timeoutSeconds": null } }),
        json!({ "spec": { "ttlSecondsAfterFinished": 60 } }),
        json!({ "spec": { "executorRef": { "name": "other" } } }),
        json!({ "spec": { "code": "2 + 2", "cancel": true } }),
    ] {
        let refusal = patch(edit.clone()).await.unwrap_err();
        assert!(
            refusal.to_string().contains("immutable but for cancel"),
            "{edit}: {refusal}"
        );
    }
    let cancelled = patch(json!({ "spec": { "cancel": true } })).await.unwrap();
    assert!(cancelled.spec.cancel);
    assert_eq!(cancelled.spec.code, "1 + 1");
    patch(json!({ "spec": { "cancel": true } }))
        .await
        .expect("cancelling twice is harmless");
    let refusal = patch(json!({ "spec": { "cancel": false } }))
        .await
        .unwrap_err();
    assert!(
        refusal.to_string().contains("cannot be withdrawn"),
        "{refusal}"
    );
}

#[tokio::test]
async fn status_is_a_subresource_and_printer_columns_show_it() {
    let env = TestEnv::new("crd-status").await;
    dynamic::<BriqExecutor>(&env)
        .create(
            &PostParams::default(),
            &object::<BriqExecutor>("py", json!({})),
        )
        .await
        .unwrap();
    let status = json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
        "status": { "conditions": [{
            "type": "Ready", "status": "True", "reason": "KernelReady", "message": "ok",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1
        }], "sandboxId": "bq_test" }
    });
    let api = env.api::<BriqExecutor>();
    api.patch_status(
        "py",
        &PatchParams::apply("test").force(),
        &Patch::Apply(&status),
    )
    .await
    .unwrap();
    // A status written through the main resource is ignored.
    let sneaky = json!({ "status": { "sandboxId": "bq_other" } });
    api.patch("py", &PatchParams::default(), &Patch::Merge(&sneaky))
        .await
        .unwrap();
    assert_eq!(
        api.get("py")
            .await
            .unwrap()
            .status
            .unwrap()
            .sandbox_id
            .as_deref(),
        Some("bq_test")
    );

    let (ok, stdout, stderr) = env.kubectl(&["get", "briqexecutors"]);
    assert!(ok, "{stderr}");
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "REASON", "EXECUTIONS", "AGE"]);
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..3], ["py", "True", "KernelReady"]);
    let (ok, stdout, _) = env.kubectl(&["get", "bqe", "-o", "wide"]);
    assert!(ok && stdout.contains("bq_test"), "{stdout}");
}

#[tokio::test]
async fn kubectl_explain_shows_the_descriptions() {
    let env = TestEnv::new("crd-explain").await;
    let stdout = explain(&env, "briqexecutors.spec.executionTimeoutSeconds").await;
    assert!(
        stdout.contains("Default deadline of one Execution"),
        "{stdout}"
    );
    let stdout = explain(&env, "executions.status.finalAnswer").await;
    assert!(stdout.contains("safe serialization"), "{stdout}");
}

/// `kubectl explain FIELD`'s output. kubectl reads the schema from the API server's OpenAPI
/// document, which takes a CRD in a moment after it is established (longer on a busy machine):
/// until then it answers that it cannot find the resource.
async fn explain(env: &TestEnv, field: &str) -> String {
    let mut answer = None;
    briq_dev::wait::poll(
        std::time::Duration::from_secs(60),
        std::time::Duration::from_millis(200),
        "the API server's OpenAPI document has the CRDs' schemas",
        || {
            let (ok, stdout, stderr) = env.kubectl(&["explain", field]);
            let published = ok || !stderr.contains("couldn't find resource");
            answer = Some((ok, stdout, stderr));
            std::future::ready(Ok(published))
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}: {answer:?}"));
    let (ok, stdout, stderr) = answer.expect("kubectl explain ran");
    assert!(ok, "{stderr}");
    stdout
}

#[tokio::test]
async fn a_resource_quota_caps_how_many_executors_a_namespace_may_hold() {
    use k8s_openapi::api::core::v1::ResourceQuota;
    let env = TestEnv::new("crds-quota").await;
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": { "name": "executors" },
        "spec": { "hard": { "count/briqexecutors.briq.cloud": "2" } },
    }))
    .unwrap();
    let quotas = env.api::<ResourceQuota>();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    // kube-controller-manager's resourcequota controller counts usage first; until then the
    // quota's admission refuses every create it covers. It finds a new resource (the CRD) by
    // discovery every 30 s, then counts: the bound leaves room for a busy machine.
    support::wait_for(&quotas, "executors", 120, |quota| {
        quota
            .status
            .as_ref()
            .and_then(|s| s.used.as_ref())
            .is_some()
    })
    .await;

    let executors = env.api::<BriqExecutor>();
    let executor = |name: &str| -> BriqExecutor {
        serde_json::from_value(json!({ "metadata": { "name": name }, "spec": {} })).unwrap()
    };
    // The quota's admission counts each create into the quota's status, and the quota
    // controller recounts from its own caches, which can lag a create just admitted: a recount
    // written then lowers `used` again and lets one create too many in. So each create waits
    // until the quota shows it, as Kubernetes' own quota tests do.
    for (count, name) in ["one", "two"].into_iter().enumerate() {
        executors
            .create(&PostParams::default(), &executor(name))
            .await
            .unwrap_or_else(|e| panic!("{name} within the quota: {e}"));
        let counted = (count + 1).to_string();
        support::wait_for(&quotas, "executors", 60, |quota| {
            quota
                .status
                .as_ref()
                .and_then(|s| s.used.as_ref())
                .and_then(|used| used.get("count/briqexecutors.briq.cloud"))
                .is_some_and(|used| used.0 == counted)
        })
        .await;
    }
    match executors
        .create(&PostParams::default(), &executor("three"))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status.message.contains("exceeded quota"),
                "{}",
                status.message
            );
        }
        other => panic!("a third executor beyond the quota: {other:?}"),
    }
}

/// A pool sized by demand needs no `replicas` (the manifest is accepted as written): it
/// defaults to 0, which `kubectl scale` reads, and scaling writes it to no effect while
/// `maxReady` sizes the pool.
#[tokio::test]
async fn a_pool_sized_by_demand_needs_no_replicas_and_scales_through_a_default_of_zero() {
    let env = TestEnv::new("crd-demand-pool").await;
    dynamic::<BriqExecutorPool>(&env)
        .create(
            &PostParams::default(),
            &object::<BriqExecutorPool>(
                "by-demand",
                json!({ "maxReady": 4, "minReady": 0, "template": {} }),
            ),
        )
        .await
        .expect("a demand-sized pool without replicas");
    let pools = env.api::<BriqExecutorPool>();
    let pool = pools.get("by-demand").await.unwrap();
    assert_eq!((pool.spec.replicas, pool.spec.max_ready), (0, Some(4)));
    // Scale's own JSON leaves a zero out.
    let scale = pools.get_scale("by-demand").await.unwrap();
    assert_eq!(scale.spec.map(|s| s.replicas.unwrap_or(0)), Some(0));
    pools
        .patch_scale(
            "by-demand",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 3 } })),
        )
        .await
        .unwrap();
    let scaled = pools.get("by-demand").await.unwrap();
    assert_eq!((scaled.spec.replicas, scaled.spec.max_ready), (3, Some(4)));
}
