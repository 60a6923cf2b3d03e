//! The limits of `BriqExecutorClass`es at admission: the chart's class policies against the real
//! kube-apiserver, every class their parameter. An executor or a pool beyond a limit of its class
//! is refused with the very message the operator gives (`controller::class::violations` and
//! `pool_violation`, called here on the same spec and class: the two cannot drift apart).
//!
//! Each test installs a release of its own, watching its namespace only. Classes are
//! cluster-scoped and the control plane is shared by the tests of this binary: every class has a
//! name of its own, and a default class selects only its test's namespace.

mod ops;
mod support;

use std::{collections::BTreeMap, time::Duration};

use briq_operator::{
    controller::class::{pool_violation, violations},
    crd::{BriqExecutor, BriqExecutorClass, BriqExecutorClassSpec, BriqExecutorPool},
};
use k8s_openapi::api::{admissionregistration::v1::ValidatingAdmissionPolicy, core::v1::Namespace};
use kube::{
    Api, Client, Resource,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};
use support::TestEnv;

const DEFAULT_CLASS: &str = briq_operator::crd::DEFAULT_CLASS_ANNOTATION;
const NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A tenant's Role: RBAC allows everything on executors and pools, so only admission stops them.
const TENANT_ROLE: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: { name: tenant-edit }
rules:
  - apiGroups: ["briq.cloud"]
    resources: ["briqexecutors", "briqexecutorpools"]
    verbs: ["*"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: tenant-edit }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant-edit }
subjects:
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant }
"#;

/// One namespace under a release's class policies, with a tenant.
struct Classed {
    env: TestEnv,
    /// The release's class policies (executors, pools).
    policies: [String; 2],
    /// Impersonates a tenant allowed everything on executors and pools.
    tenant: Client,
    /// The namespace's labels, as the policies and the operator see them.
    labels: BTreeMap<String, String>,
}

/// A class made by a test: its (unique) name and its spec, as the operator reads it.
struct Class {
    name: String,
    spec: BriqExecutorClassSpec,
}

impl Classed {
    async fn install(prefix: &str) -> Classed {
        let env = TestEnv::new(prefix).await;
        let release = format!("cls-{:06x}", rand::random::<u32>() & 0xff_ffff);
        let watch = format!("watchNamespace={}", env.namespace);
        let documents = ops::template(&release, &env.namespace, &["--set", &watch]);
        let admission: Vec<&Value> = ops::admission_objects(&documents);
        let policies = [
            format!("{release}-briq-operator-executor-class"),
            format!("{release}-briq-operator-pool-class"),
        ];
        for kind in [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ] {
            for name in &policies {
                assert!(
                    admission
                        .iter()
                        .any(|d| d["kind"] == kind && d["metadata"]["name"] == name.as_str()),
                    "the chart renders {kind} {name} by default"
                );
            }
        }
        ops::apply(&env, &ops::yaml(&admission), "class-admission-test");
        ops::apply(&env, TENANT_ROLE, "class-admission-test");

        let labels = Api::<Namespace>::all(env.client.clone())
            .get(&env.namespace)
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap_or_default();
        assert_eq!(labels.get(NAME_LABEL), Some(&env.namespace));
        let tenant = ops::impersonating(&env, "tenant").await;
        Classed {
            env,
            policies,
            tenant,
            labels,
        }
    }

    fn executors(&self) -> Api<BriqExecutor> {
        Api::namespaced(self.tenant.clone(), &self.env.namespace)
    }

    fn pools(&self) -> Api<BriqExecutorPool> {
        Api::namespaced(self.tenant.clone(), &self.env.namespace)
    }

    fn classes(&self) -> Api<BriqExecutorClass> {
        Api::all(self.env.client.clone())
    }

    /// Makes a class named `<stem>-<random>` with `rules` (and a key), marked the default if
    /// `default`.
    async fn class(&self, stem: &str, default: bool, rules: Value) -> Class {
        let name = format!("{stem}-{:08x}", rand::random::<u32>());
        let mut spec = json!({ "apiKeySecretRef": { "name": "briq-key" } });
        for (field, value) in rules.as_object().unwrap() {
            spec[field] = value.clone();
        }
        let annotations = if default {
            json!({ DEFAULT_CLASS: "true" })
        } else {
            json!({})
        };
        // As written (a field may be null): typed, serde would leave out what is None.
        let class: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutorClass",
            "metadata": { "name": name, "annotations": annotations },
            "spec": spec,
        }))
        .unwrap();
        let made = Api::<DynamicObject>::all_with(
            self.env.client.clone(),
            &ApiResource::erase::<BriqExecutorClass>(&()),
        )
        .create(&PostParams::default(), &class)
        .await
        .unwrap_or_else(|error| panic!("creating class {name}: {error}"));
        Class {
            name,
            spec: serde_json::from_value(made.data["spec"].clone()).unwrap(),
        }
    }

    /// What the operator says of an executor with `spec` under `class` in this namespace: the
    /// limits it breaks, in its order.
    fn violations(&self, class: &Class, spec: &Value) -> Vec<String> {
        let spec = executor::<BriqExecutor>("x", spec.clone()).spec;
        violations(
            &class.name,
            &class.spec,
            &spec,
            &self.env.namespace,
            &self.labels,
        )
    }

    /// Waits until an executor with `spec` is refused here (a dry-run create, polled): the
    /// policies compiled, their bindings too, and the classes they are to see in the API
    /// server's cache of parameters — each of which takes a moment. Returns the refusal.
    async fn executor_refused(&self, what: &str, spec: Value) -> Refusal {
        let probe = raw::<BriqExecutor>("class-probe", spec);
        refused_once_in_force(&self.raw::<BriqExecutor>(), &probe, what, self).await
    }

    async fn pool_refused(&self, what: &str, replicas: i32, template: Value) -> Refusal {
        let spec = json!({ "replicas": replicas, "template": template });
        self.pool_spec_refused(what, spec).await
    }

    /// Waits until a pool with `spec` is refused, with the policies in force; its refusal.
    async fn pool_spec_refused(&self, what: &str, spec: Value) -> Refusal {
        let probe = raw::<BriqExecutorPool>("class-probe", spec);
        refused_once_in_force(&self.raw::<BriqExecutorPool>(), &probe, what, self).await
    }

    /// `K`s as the tenant, untyped: what a test writes is sent as it is, nulls included.
    fn raw<K: Resource<DynamicType = ()>>(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.tenant.clone(),
            &self.env.namespace,
            &ApiResource::erase::<K>(&()),
        )
    }

    /// A dry-run create of an executor with `spec` (as written), as the tenant.
    async fn try_executor(&self, name: &str, spec: Value) -> Result<DynamicObject, kube::Error> {
        self.raw::<BriqExecutor>()
            .create(&dry_run(), &raw::<BriqExecutor>(name, spec))
            .await
    }

    /// Asserts that an executor with `spec` is refused with the first limit of `class` the
    /// operator names, and returns that message.
    async fn executor_breaks(&self, what: &str, class: &Class, spec: Value) -> String {
        let expected = self.violations(class, &spec);
        assert!(
            !expected.is_empty(),
            "{what}: the operator should find a limit broken"
        );
        let result = self.try_executor("beyond", spec).await;
        refused(what, result, &expected[0]);
        expected[0].clone()
    }

    /// Asserts that an executor with `spec` is admitted, and within `class`'s limits for the
    /// operator too.
    async fn executor_within(&self, what: &str, class: &Class, spec: Value) {
        assert_eq!(
            self.violations(class, &spec),
            Vec::<String>::new(),
            "{what}: the operator should find no limit broken"
        );
        admitted(what, self.try_executor("within", spec).await);
    }
}

/// A denial by one of this release's class policies (a `kube::Error::Api`).
struct Refusal(kube::Error);

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

fn executor<K: DeserializeOwned>(name: &str, spec: Value) -> K {
    serde_json::from_value(json!({ "metadata": { "name": name }, "spec": spec })).unwrap()
}

/// A `K` named `name` with `spec`, exactly as written.
fn raw<K: Resource<DynamicType = ()>>(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": K::api_version(&()), "kind": K::kind(&()),
        "metadata": { "name": name },
        "spec": spec,
    }))
    .unwrap()
}

fn pool(name: &str, replicas: i32, template: Value) -> BriqExecutorPool {
    executor(name, json!({ "replicas": replicas, "template": template }))
}

/// Dry-run creates `probe` until one of `classed`'s class policies refuses it; fails after 30 s,
/// showing the policies' status (why they may not be in force).
async fn refused_once_in_force<K>(api: &Api<K>, probe: &K, what: &str, classed: &Classed) -> Refusal
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let refusal = std::cell::RefCell::new(None);
    let waited = briq_dev::wait::poll(
        Duration::from_secs(30),
        Duration::from_millis(100),
        what,
        || async {
            match api.create(&dry_run(), probe).await {
                Ok(_) => Ok(false),
                Err(kube::Error::Api(status))
                    if classed
                        .policies
                        .iter()
                        .any(|p| status.message.contains(&format!("'{p}'"))) =>
                {
                    *refusal.borrow_mut() = Some(Refusal(kube::Error::Api(status)));
                    Ok(true)
                }
                Err(error) => anyhow::bail!("{what}: the probe failed otherwise: {error}"),
            }
        },
    )
    .await;
    if let Err(error) = waited {
        let policies = Api::<ValidatingAdmissionPolicy>::all(classed.env.client.clone());
        let mut status = Vec::new();
        for name in &classed.policies {
            status.push(policies.get(name).await.map(|p| p.status));
        }
        panic!("{error:#}; the class policies: {status:#?}");
    }
    refusal.into_inner().unwrap()
}

/// Asserts that a class policy refused `result` with `message` (exactly, after the API server's
/// prefix), as Forbidden for a namespace the class does not select, else as Invalid.
#[track_caller]
fn refused<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>, message: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            let code = if message.starts_with("namespace ") {
                (403, "Forbidden")
            } else {
                (422, "Invalid")
            };
            assert!(
                status.message.contains("ValidatingAdmissionPolicy")
                    && status.message.contains("-class'"),
                "{what}: refused by something else: {}",
                status.message
            );
            assert!(
                status
                    .message
                    .ends_with(&format!(" denied request: {message}")),
                "{what}: the message should be {message:?}: {}",
                status.message
            );
            assert_eq!(
                (status.code, status.reason.as_str()),
                code,
                "{what}: {status:?}"
            );
        }
        other => panic!("{what} was admitted: {other:?}"),
    }
}

#[track_caller]
fn admitted<T>(what: &str, result: Result<T, kube::Error>) -> T {
    result.unwrap_or_else(|error| panic!("{what} was refused: {error}"))
}

/// Asserts that `refusal` (from a probe) is [`refused`] with `message`.
#[track_caller]
fn says(what: &str, refusal: Refusal, message: &str) {
    refused::<()>(what, Err(refusal.0), message);
}

#[tokio::test]
async fn an_executor_beyond_each_limit_of_its_class_is_refused_naming_the_limit() {
    let classed = Classed::install("cls-limits").await;
    let ns = classed.env.namespace.clone();
    let strict = classed
        .class(
            "strict",
            false,
            json!({
                // Selects this namespace, by every kind of requirement.
                "namespaceSelector": {
                    "matchLabels": { NAME_LABEL: ns },
                    "matchExpressions": [
                        { "key": NAME_LABEL, "operator": "In", "values": [ns, "other"] },
                        { "key": NAME_LABEL, "operator": "NotIn", "values": ["other"] },
                        { "key": NAME_LABEL, "operator": "Exists" },
                        { "key": "briq.cloud/no-such-label", "operator": "DoesNotExist" },
                    ],
                },
                "allowedImages": ["corp/python:3.12", "registry.example.com/agents/*"],
                "defaultImage": "corp/python:3.12",
                "allowedSizes": ["small", "medium"],
                "defaultSize": "small",
                "defaultSleep": "2h",
                "maxExecutionTimeoutSeconds": 20,
                "defaultIdleTimeoutSeconds": 600,
                "maxIdleTimeoutSeconds": 3600,
                "maxPoolReplicas": 3,
            }),
        )
        .await;
    let c = strict.name.as_str();
    let named = |mut spec: Value| {
        spec["className"] = json!(c);
        spec
    };
    let probe = named(json!({ "image": "evil/miner:latest" }));
    let refusal = classed
        .executor_refused("the class's image limit is in force", probe.clone())
        .await;
    says(
        "the probe",
        refusal,
        &classed.violations(&strict, &probe)[0],
    );

    let beyond = [
        ("an image outside", json!({ "image": "evil/miner:latest" })),
        (
            "an image that an allowed prefix is only a substring of",
            json!({ "image": "registry.example.com/agentsX/a:1" }),
        ),
        ("a size outside", json!({ "size": "xlarge" })),
        (
            "an execution timeout above the maximum",
            json!({ "executionTimeoutSeconds": 40 }),
        ),
        (
            "an idle timeout above the maximum",
            json!({ "idleTimeoutSeconds": 7200 }),
        ),
        (
            "fields written as null are unset (the class's defaults), a timeout above",
            json!({ "size": null, "idleTimeoutSeconds": null, "executionTimeoutSeconds": 40 }),
        ),
        (
            "suspending when idle, which the class does not allow",
            json!({ "idleAction": "Suspend" }),
        ),
        (
            "several limits at once: the first is named",
            json!({ "size": "xlarge", "executionTimeoutSeconds": 40, "idleTimeoutSeconds": 7200 }),
        ),
    ];
    let mut messages = Vec::new();
    for (what, spec) in beyond {
        messages.push(classed.executor_breaks(what, &strict, named(spec)).await);
    }
    // The messages, word for word (what a tenant reads).
    let images = "allowedImages: corp/python:3.12, registry.example.com/agents/*";
    assert_eq!(
        messages,
        [
            format!("image evil/miner:latest is not allowed by class {c} ({images})"),
            format!(
                "image registry.example.com/agentsX/a:1 is not allowed by class {c} ({images})"
            ),
            format!("size xlarge is not allowed by class {c} (allowedSizes: small, medium)"),
            format!(
                "executionTimeoutSeconds 40 is above class {c}'s maxExecutionTimeoutSeconds 20"
            ),
            format!("idleTimeoutSeconds 7200 is above class {c}'s maxIdleTimeoutSeconds 3600"),
            format!(
                "executionTimeoutSeconds 40 is above class {c}'s maxExecutionTimeoutSeconds 20"
            ),
            format!("idleAction Suspend is not allowed by class {c} (allowIdleSuspend is not set)"),
            format!("size xlarge is not allowed by class {c} (allowedSizes: small, medium)"),
        ]
    );

    let within = [
        // The class's defaults: corp/python:3.12, small, 20 s (its maximum shortens the CRD's
        // 30), idle 600 s.
        ("every field left at its default", json!({})),
        (
            "fields written as null: the class's defaults",
            json!({ "size": null, "idleTimeoutSeconds": null }),
        ),
        (
            "the CRD's default image set explicitly: it is the class's default",
            json!({ "image": "python:3.12-slim" }),
        ),
        (
            "an image under an allowed prefix, every limit reached",
            json!({
                "image": "registry.example.com/agents/pandas:2", "size": "medium",
                "executionTimeoutSeconds": 20, "idleTimeoutSeconds": 3600,
            }),
        ),
    ];
    for (what, spec) in within {
        classed.executor_within(what, &strict, named(spec)).await;
    }
    // And for real, as the tenant.
    admitted(
        "creating an executor within the limits",
        classed
            .executors()
            .create(&PostParams::default(), &executor("py", named(json!({}))))
            .await,
    );

    // The class's defaults count too: a default idle timeout above its maximum breaks it, and no
    // size at all (none set, no default) is allowed by allowedSizes.
    let loose = classed
        .class(
            "loose",
            false,
            json!({
                "allowedSizes": ["small"],
                "defaultIdleTimeoutSeconds": 200,
                "maxIdleTimeoutSeconds": 100,
            }),
        )
        .await;
    let l = loose.name.as_str();
    let probe = json!({ "className": l });
    let refusal = classed
        .executor_refused("the loose class is in force", probe.clone())
        .await;
    says(
        "the default idle timeout",
        refusal,
        &format!("idleTimeoutSeconds 200 is above class {l}'s maxIdleTimeoutSeconds 100"),
    );
    assert_eq!(
        classed.violations(&loose, &probe)[0],
        format!("idleTimeoutSeconds 200 is above class {l}'s maxIdleTimeoutSeconds 100")
    );
    classed
        .executor_within(
            "no size, an idle timeout of its own",
            &loose,
            json!({ "className": l, "idleTimeoutSeconds": 100 }),
        )
        .await;
    // No default idle timeout: an executor setting none gets the maximum, which it does not
    // exceed.
    let capped = classed
        .class(
            "capped",
            false,
            json!({ "maxIdleTimeoutSeconds": 100, "allowIdleSuspend": true }),
        )
        .await;
    let probe = json!({ "className": capped.name, "idleTimeoutSeconds": 101 });
    let refusal = classed
        .executor_refused("the capped class is in force", probe.clone())
        .await;
    says(
        "an idle timeout above the maximum",
        refusal,
        &classed.violations(&capped, &probe)[0],
    );
    classed
        .executor_within(
            "no idle timeout, no default",
            &capped,
            json!({ "className": capped.name }),
        )
        .await;
    classed
        .executor_within(
            "suspending when idle, which the class allows",
            &capped,
            json!({ "className": capped.name, "idleAction": "Suspend" }),
        )
        .await;

    // A class's fields written as null are unset, as the operator reads them: no limit.
    let nulls = classed
        .class(
            "nulls",
            false,
            json!({
                "namespaceSelector": null, "allowedImages": null, "defaultImage": null,
                "allowedSizes": null, "defaultSize": null, "defaultSleep": null,
                "defaultIdleTimeoutSeconds": null, "maxIdleTimeoutSeconds": null,
                "maxPoolReplicas": null, "maxExecutionTimeoutSeconds": 10,
            }),
        )
        .await;
    let probe = json!({ "className": nulls.name, "executionTimeoutSeconds": 40 });
    let refusal = classed
        .executor_refused("the class of nulls is in force", probe.clone())
        .await;
    says(
        "a class of nulls, but for its timeout",
        refusal,
        &classed.violations(&nulls, &probe)[0],
    );
    classed
        .executor_within(
            "anything else, under a class of nulls",
            &nulls,
            json!({
                "className": nulls.name, "image": "any/image:1", "size": "huge",
                "idleTimeoutSeconds": 2_592_000,
            }),
        )
        .await;
}

#[tokio::test]
async fn a_namespace_outside_the_class_selector_is_refused() {
    let classed = Classed::install("cls-namespace").await;
    let ns = classed.env.namespace.clone();
    let other = format!("{ns}-other");
    let requirement = |operator: &str, key: &str, values: Option<Vec<&str>>| {
        let mut requirement = json!({ "key": key, "operator": operator });
        if let Some(values) = values {
            requirement["values"] = json!(values);
        }
        json!({ "matchExpressions": [requirement] })
    };
    // (what, the class's namespaceSelector): each selector a class of its own.
    let selectors = [
        (
            "matchLabels naming another namespace",
            json!({ "matchLabels": { NAME_LABEL: other } }),
        ),
        (
            "In another namespace",
            requirement("In", NAME_LABEL, Some(vec![&other])),
        ),
        (
            "NotIn this one",
            requirement("NotIn", NAME_LABEL, Some(vec![&ns])),
        ),
        (
            "the name label DoesNotExist",
            requirement("DoesNotExist", NAME_LABEL, None),
        ),
        (
            "a label this namespace lacks Exists",
            requirement("Exists", "briq.cloud/no-such-label", None),
        ),
        (
            "matchLabels this one, but a requirement not",
            json!({
                "matchLabels": { NAME_LABEL: ns },
                "matchExpressions": [{ "key": "tier", "operator": "Exists" }],
            }),
        ),
        // What the operator cannot read selects nothing there; nor here.
        ("In without values", requirement("In", NAME_LABEL, None)),
        (
            "NotIn without values",
            requirement("NotIn", NAME_LABEL, None),
        ),
        (
            "an unknown operator",
            requirement("Near", NAME_LABEL, Some(vec![&ns])),
        ),
        // Selecting this namespace: admitted.
        (
            "matchLabels naming this namespace",
            json!({ "matchLabels": { NAME_LABEL: ns } }),
        ),
        (
            "NotIn another namespace",
            requirement("NotIn", NAME_LABEL, Some(vec![&other])),
        ),
        ("an empty selector", json!({})),
    ];
    let mut refusals = 0;
    for (what, selector) in selectors {
        let class = classed
            .class(
                "scoped",
                false,
                json!({ "namespaceSelector": selector, "maxExecutionTimeoutSeconds": 10 }),
            )
            .await;
        // In force once an executor beyond the timeout is refused, for the namespace or the
        // timeout; then the defaults (within the timeout) are left to the namespace alone.
        classed
            .executor_refused(
                &format!("{what}: the class is in force"),
                json!({ "className": class.name, "executionTimeoutSeconds": 40 }),
            )
            .await;
        let spec = json!({ "className": class.name });
        let expected = classed.violations(&class, &spec);
        let result = classed.try_executor("py", spec).await;
        match expected.first() {
            Some(message) => {
                assert_eq!(
                    *message,
                    format!(
                        "namespace {ns} may not use class {}: its namespaceSelector does not \
                         select it",
                        class.name
                    ),
                    "{what}"
                );
                refused(what, result, message);
                refusals += 1;
            }
            None => {
                admitted(what, result);
            }
        }
    }
    assert_eq!(
        refusals, 9,
        "the operator refuses each selector meant to refuse"
    );
}

/// A class `name` whose pools keep at most 2 members, of one image.
async fn class_of_two_members(classed: &Classed, name: &str) -> Class {
    classed
        .class(
            name,
            false,
            json!({
                "maxPoolReplicas": 2,
                "allowedImages": ["corp/python:3.12"],
                "defaultImage": "corp/python:3.12",
            }),
        )
        .await
}

/// A demand-sized pool's `maxReady` is its size at a burst: above the class's `maxPoolReplicas`,
/// it was admitted and then held down at run time, said only in the pool's status.
#[tokio::test]
async fn a_demand_pool_whose_max_ready_is_beyond_the_class_maximum_is_refused() {
    let classed = Classed::install("cls-demand").await;
    let class = class_of_two_members(&classed, "demand").await;
    let c = class.name.as_str();
    let demand = |max_ready: i32| json!({ "replicas": 0, "minReady": 0, "maxReady": max_ready, "template": { "className": c } });
    let expected = pool_violation(c, &class.spec, "maxReady", 3).unwrap();
    assert_eq!(
        expected,
        format!("maxReady 3 is above class {c}'s maxPoolReplicas 2")
    );
    let refusal = classed
        .pool_spec_refused("the class's pool maximum is in force", demand(3))
        .await;
    says("creating a demand pool up to 3", refusal, &expected);

    let pools = classed.raw::<BriqExecutorPool>();
    admitted(
        "creating a demand pool up to 2",
        pools
            .create(
                &PostParams::default(),
                &raw::<BriqExecutorPool>("bursty", demand(2)),
            )
            .await,
    );
    let raised = json!({ "spec": { "maxReady": 5 } });
    refused(
        "patching maxReady to 5",
        pools
            .patch("bursty", &PatchParams::default(), &Patch::Merge(&raised))
            .await,
        &pool_violation(c, &class.spec, "maxReady", 5).unwrap(),
    );
}

#[tokio::test]
async fn a_pool_beyond_the_class_maximum_is_refused_on_create_and_on_update() {
    let classed = Classed::install("cls-pool").await;
    let class = class_of_two_members(&classed, "pools").await;
    let c = class.name.as_str();
    let template = json!({ "className": c });
    let expected = pool_violation(c, &class.spec, "replicas", 3).unwrap();
    assert_eq!(
        expected,
        format!("replicas 3 is above class {c}'s maxPoolReplicas 2")
    );
    let refusal = classed
        .pool_refused("the class's pool maximum is in force", 3, template.clone())
        .await;
    says("creating a pool of 3", refusal, &expected);
    let pools = classed.pools();
    refused(
        "creating a pool of 3, for real",
        pools
            .create(&PostParams::default(), &pool("warm", 3, template.clone()))
            .await,
        &expected,
    );
    // The template is held to the class as an executor is.
    let image = classed.violations(&class, &json!({ "className": c, "image": "evil/miner:1" }));
    assert_eq!(
        image[0],
        format!("image evil/miner:1 is not allowed by class {c} (allowedImages: corp/python:3.12)")
    );
    refused(
        "creating a pool of an image outside",
        pools
            .create(
                &dry_run(),
                &pool(
                    "warm",
                    1,
                    json!({ "className": c, "image": "evil/miner:1" }),
                ),
            )
            .await,
        &image[0],
    );
    admitted(
        "creating a pool of 2",
        pools
            .create(&PostParams::default(), &pool("warm", 2, template.clone()))
            .await,
    );

    // Updates: replicas by merge patch and by replace, the template's image.
    let replicas = json!({ "spec": { "replicas": 3 } });
    refused(
        "patching the pool to 3",
        pools
            .patch("warm", &PatchParams::default(), &Patch::Merge(&replicas))
            .await,
        &expected,
    );
    let mut replaced = pools.get("warm").await.unwrap();
    replaced.spec.replicas = 5;
    refused(
        "replacing the pool with 5",
        pools
            .replace("warm", &PostParams::default(), &replaced)
            .await,
        &pool_violation(c, &class.spec, "replicas", 5).unwrap(),
    );
    let retemplated = json!({ "spec": { "template": { "image": "evil/miner:1" } } });
    refused(
        "patching the template's image",
        pools
            .patch("warm", &PatchParams::default(), &Patch::Merge(&retemplated))
            .await,
        &image[0],
    );
    assert_eq!(pools.get("warm").await.unwrap().spec.replicas, 2);

    // Tightened below the pool: a change of its spec must meet the class as it is now; its
    // labels are not its spec.
    let tightened = json!({ "spec": { "maxPoolReplicas": 1 } });
    let class = Class {
        spec: classed
            .classes()
            .patch(c, &PatchParams::default(), &Patch::Merge(&tightened))
            .await
            .unwrap()
            .spec,
        name: c.to_owned(),
    };
    let expected = pool_violation(c, &class.spec, "replicas", 2).unwrap();
    let refusal = classed
        .pool_refused("the tightened maximum is in force", 2, template.clone())
        .await;
    says("a pool of 2 under a maximum of 1", refusal, &expected);
    let labels = json!({ "metadata": { "labels": { "team": "a" } } });
    admitted(
        "labelling a pool beyond its tightened class",
        pools
            .patch("warm", &PatchParams::default(), &Patch::Merge(&labels))
            .await,
    );
    let raise = json!({ "spec": { "template": { "idleTimeoutSeconds": 60 } } });
    refused(
        "changing the template of a pool beyond its tightened class",
        pools
            .patch("warm", &PatchParams::default(), &Patch::Merge(&raise))
            .await,
        &expected,
    );
    let down = json!({ "spec": { "replicas": 1 } });
    admitted(
        "scaling the pool down to the class's maximum",
        pools
            .patch("warm", &PatchParams::default(), &Patch::Merge(&down))
            .await,
    );
}

#[tokio::test]
async fn an_executor_naming_no_class_is_held_to_the_default_class() {
    let classed = Classed::install("cls-default").await;
    let ns = classed.env.namespace.clone();
    // A default class for another namespace only: not the class of this one's executors.
    let elsewhere = classed
        .class(
            "elsewhere",
            true,
            json!({
                "namespaceSelector": { "matchLabels": { NAME_LABEL: format!("{ns}-other") } },
                "allowedImages": ["only/this:1"],
            }),
        )
        .await;
    let default = classed
        .class(
            "default",
            true,
            json!({
                "namespaceSelector": { "matchLabels": { NAME_LABEL: ns } },
                "allowedImages": ["corp/python:3.12"],
                "defaultImage": "corp/python:3.12",
            }),
        )
        .await;
    let outside = json!({ "image": "evil/miner:latest" });
    let expected = classed.violations(&default, &outside);
    assert_eq!(
        expected,
        [format!(
            "image evil/miner:latest is not allowed by class {} (allowedImages: corp/python:3.12)",
            default.name
        )]
    );
    let refusal = classed
        .executor_refused("the default class is in force", outside.clone())
        .await;
    says("an image outside the default class", refusal, &expected[0]);
    refused(
        "creating an executor naming no class, of an image outside the default class",
        classed
            .executors()
            .create(&PostParams::default(), &executor("py", outside.clone()))
            .await,
        &expected[0],
    );
    // Naming no class and no key by writing them as null is naming none.
    let nulls = json!({ "className": null, "apiKeySecretRef": null, "image": "evil/miner:latest" });
    assert_eq!(classed.violations(&default, &nulls), expected);
    refused(
        "an executor whose className and apiKeySecretRef are null",
        classed.try_executor("nulls", nulls).await,
        &expected[0],
    );
    // The other default class is in force too (naming it here is refused), and yet not this
    // namespace's class.
    let named = json!({ "className": elsewhere.name, "image": "only/this:1" });
    let refusal = classed
        .executor_refused("the other default class is in force", named.clone())
        .await;
    says(
        "naming the other namespace's default class",
        refusal,
        &classed.violations(&elsewhere, &named)[0],
    );
    classed
        .executor_within("every field left at its default", &default, json!({}))
        .await;
    admitted(
        "an executor with a key of its own: no class",
        classed
            .executors()
            .create(
                &PostParams::default(),
                &executor(
                    "own-key",
                    json!({ "image": "evil/miner:latest", "apiKeySecretRef": { "name": "mine" } }),
                ),
            )
            .await,
    );
}

#[tokio::test]
async fn an_executor_made_before_its_class_was_tightened_can_still_be_labelled() {
    let classed = Classed::install("cls-tightened").await;
    let class = classed
        .class(
            "team",
            false,
            json!({ "allowedImages": ["corp/python:3.12", "corp/ml:1"] }),
        )
        .await;
    let c = class.name.clone();
    classed
        .executor_refused(
            "the class is in force",
            json!({ "className": c, "image": "evil/miner:latest" }),
        )
        .await;
    let spec = json!({ "className": c, "image": "corp/ml:1" });
    admitted(
        "creating an executor of corp/ml:1",
        classed
            .executors()
            .create(&PostParams::default(), &executor("py", spec.clone()))
            .await,
    );

    let tightened = json!({ "spec": { "allowedImages": ["corp/python:3.12"] } });
    let class = Class {
        spec: classed
            .classes()
            .patch(&c, &PatchParams::default(), &Patch::Merge(&tightened))
            .await
            .unwrap()
            .spec,
        name: c.clone(),
    };
    let expected = classed.violations(&class, &spec);
    assert_eq!(
        expected,
        [format!(
            "image corp/ml:1 is not allowed by class {c} (allowedImages: corp/python:3.12)"
        )]
    );
    let refusal = classed
        .executor_refused("the tightened class is in force", spec.clone())
        .await;
    says("a new executor of corp/ml:1", refusal, &expected[0]);

    let labels = json!({ "metadata": {
        "labels": { "team": "a" },
        "annotations": { "example.com/owner": "b" },
    } });
    let labelled = admitted(
        "labelling the executor made before",
        classed
            .executors()
            .patch("py", &PatchParams::default(), &Patch::Merge(&labels))
            .await,
    );
    assert_eq!(
        labelled
            .metadata
            .labels
            .unwrap()
            .get("team")
            .map(String::as_str),
        Some("a")
    );
    let applied = json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
        "metadata": { "name": "py", "labels": { "applied": "yes" } },
        "spec": { "executionHistoryLimit": 3 },
    });
    admitted(
        "server-side apply to the executor made before",
        classed
            .executors()
            .patch("py", &PatchParams::apply("tenant"), &Patch::Apply(&applied))
            .await,
    );
}

#[tokio::test]
async fn an_executor_naming_a_class_not_made_yet_is_admitted() {
    let classed = Classed::install("cls-later").await;
    // The policies are in force here (with a class of this test's).
    let present = classed
        .class(
            "present",
            false,
            json!({ "allowedImages": ["corp/python:3.12"] }),
        )
        .await;
    classed
        .executor_refused(
            "the policies are in force",
            json!({ "className": present.name, "image": "evil/miner:latest" }),
        )
        .await;

    let later = format!("later-{:08x}", rand::random::<u32>());
    let spec = json!({ "className": later, "image": "evil/miner:latest" });
    admitted(
        "creating an executor naming a class not made yet",
        classed
            .executors()
            .create(&PostParams::default(), &executor("py", spec.clone()))
            .await,
    );

    // Made now, the class refuses new executors beyond it; the one made before stays (the
    // operator decides what becomes of it).
    let rules = json!({ "allowedImages": ["corp/python:3.12"] });
    let mut class: BriqExecutorClass = serde_json::from_value(json!({
        "metadata": { "name": later },
        "spec": { "apiKeySecretRef": { "name": "briq-key" } },
    }))
    .unwrap();
    class.spec.allowed_images = serde_json::from_value(rules["allowedImages"].clone()).unwrap();
    let made = classed
        .classes()
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let class = Class {
        name: later.clone(),
        spec: made.spec,
    };
    let refusal = classed
        .executor_refused("the class made later is in force", spec.clone())
        .await;
    says(
        "a new executor naming the class made later",
        refusal,
        &classed.violations(&class, &spec)[0],
    );
    assert!(
        classed.executors().get_opt("py").await.unwrap().is_some(),
        "the executor made before its class is kept"
    );
}
