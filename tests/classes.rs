//! Platform rules through a `BriqExecutorClass`, tried as a platform team and its tenants would:
//! the briq key lives in the operator's (platform's) namespace, which tenants cannot read, yet
//! their executors run with it; the operator holds executors to their class even where admission
//! did not (a class created after its executor, admission off), and an executor waiting for its
//! class goes on as soon as the class allows it.
//!
//! Classes are cluster-scoped and every test of this binary shares one API server: each test
//! names its classes uniquely and marks none as the default.

mod ops;
mod support;

use briq_dev::local_server::{DeclaredChange, Operation};
use briq_operator::{
    briq::{BriqClient, ClientOptions, SandboxApi},
    crd::{BriqExecutor, BriqExecutorClass, BriqExecutorPool, CLASS_ANNOTATION},
};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use support::{
    Operator, TestEnv, condition, create_api_key_secret, finished, output, reason, wait_for,
    wait_ready,
};

const RUN_SECONDS: u64 = 60;

/// A platform namespace holding the class key and a tenant namespace whose operator reads class
/// keys from the platform's (and has no default key of its own).
struct Platform {
    platform: TestEnv,
    tenant: TestEnv,
    operator: Operator,
}

impl Platform {
    async fn new(prefix: &str) -> Platform {
        let platform = TestEnv::new(&format!("{prefix}-platform")).await;
        let tenant = TestEnv::new(&format!("{prefix}-tenant")).await;
        let namespace = platform.namespace.clone();
        let operator = Operator::start_with(&tenant, move |settings| {
            settings.platform_namespace = Some(namespace);
            settings.default_api_key = None;
        })
        .await;
        let key = operator.server.api_key().expose().to_owned();
        create_api_key_secret(&platform, "briq-key", &key, true).await;
        Platform {
            platform,
            tenant,
            operator,
        }
    }

    /// Creates class `<prefix>-<random>` with the platform's key and `rules`; returns its name.
    async fn class(&self, prefix: &str, rules: Value) -> String {
        let name = unique(prefix);
        self.class_named(&name, rules).await;
        name
    }

    /// Creates class `name` with the platform's key and `rules`.
    async fn class_named(&self, name: &str, rules: Value) {
        let mut spec = json!({ "apiKeySecretRef": { "name": "briq-key" } });
        for (field, value) in rules.as_object().unwrap() {
            spec[field] = value.clone();
        }
        let class: BriqExecutorClass =
            serde_json::from_value(json!({ "metadata": { "name": name }, "spec": spec })).unwrap();
        classes(&self.tenant)
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }

    async fn creates(&self) -> u64 {
        let stats = self.operator.server.admin().stats().await.unwrap();
        stats.calls(Operation::Create)
    }
}

/// `<prefix>-<random>`: classes are cluster-scoped, shared by every test of this binary.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// Creates pool `name` of `replicas` members of class `class`; returns the pools' API.
async fn create_pool(
    env: &TestEnv,
    name: &str,
    replicas: i32,
    class: &str,
) -> Api<BriqExecutorPool> {
    let pool: BriqExecutorPool = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "replicas": replicas, "template": { "className": class } },
    }))
    .unwrap();
    let pools = env.api::<BriqExecutorPool>();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    pools
}

fn classes(env: &TestEnv) -> Api<BriqExecutorClass> {
    Api::all(env.client.clone())
}

fn executor(name: &str, spec: Value) -> BriqExecutor {
    serde_json::from_value(json!({ "metadata": { "name": name }, "spec": spec })).unwrap()
}

fn ready_reason(executor: &BriqExecutor) -> String {
    condition(executor, "Ready").1
}

fn stalled(executor: &BriqExecutor) -> String {
    condition(executor, "Stalled").0
}

#[tokio::test]
async fn a_tenant_with_every_right_in_its_namespace_cannot_read_the_class_key_yet_its_executors_run()
 {
    let stack = Platform::new("cls-key").await;
    let (tenant_ns, platform_ns) = (&stack.tenant.namespace, &stack.platform.namespace);
    // Every right in its own namespace.
    let role = format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{ name: everything, namespace: {tenant_ns} }}
rules: [{{ apiGroups: ["*"], resources: ["*"], verbs: ["*"] }}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: tenant-everything, namespace: {tenant_ns} }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: everything }}
subjects: [{{ apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant }}]
"#
    );
    let file = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    std::fs::write(file.path(), role).unwrap();
    let (ok, _, stderr) = stack
        .tenant
        .kubectl(&["apply", "-f", file.path().to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let admin = &stack.tenant.client;
    // The authorizer sees a new binding a moment after it is written.
    briq_dev::wait::poll(
        std::time::Duration::from_secs(30),
        std::time::Duration::from_millis(100),
        "the tenant reads the Secrets of its own namespace",
        || async { Ok(support::may(admin, "tenant", tenant_ns, "get", "", "secrets", "").await) },
    )
    .await
    .unwrap();
    for verb in ["get", "list", "watch"] {
        assert!(
            !support::may(admin, "tenant", platform_ns, verb, "", "secrets", "").await,
            "the tenant may {verb} the platform's Secrets"
        );
    }

    let class = stack.class("standard", json!({})).await;
    let tenant = ops::impersonating(&stack.tenant, "tenant").await;
    let executors: Api<BriqExecutor> = Api::namespaced(tenant.clone(), tenant_ns);
    executors
        .create(
            &PostParams::default(),
            &executor("py", json!({ "className": class })),
        )
        .await
        .expect("the tenant creates an executor of the class");
    let ready = wait_ready(&stack.tenant, "py").await;
    assert_eq!(
        ready.annotations().get(CLASS_ANNOTATION),
        Some(&class),
        "the executor records the class its sandbox was made under"
    );
    support::create_execution(&stack.tenant, "one", "py", "6 * 7").await;
    let one = finished(&stack.tenant, "one", RUN_SECONDS).await;
    assert_eq!(
        (reason(&one), output(&one)),
        ("Completed".into(), "42".into())
    );

    // No key anywhere the tenant can read.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(tenant, tenant_ns);
    let mine = secrets.list(&ListParams::default()).await.unwrap();
    let key = stack.operator.server.api_key().expose().to_owned();
    for secret in mine.items {
        let data: String = secret
            .data
            .iter()
            .flatten()
            .map(|(_, value)| String::from_utf8_lossy(&value.0).into_owned())
            .collect();
        assert!(
            briq_operator::briq::leaked_pieces(&key, &data).is_empty(),
            "Secret {} in the tenant's namespace holds the key",
            secret.name_any()
        );
    }
}

#[tokio::test]
async fn an_executor_created_before_its_class_waits_and_is_ready_once_the_class_exists() {
    let stack = Platform::new("cls-late").await;
    let name = format!("late-{:08x}", rand::random::<u32>());
    support::create_executor(&stack.tenant, "py", json!({ "className": name })).await;
    let waiting = wait_for(&stack.tenant.api::<BriqExecutor>(), "py", 30, |e| {
        ready_reason(e) == "ClassNotFound"
    })
    .await;
    let message = condition(&waiting, "Ready").2;
    assert!(message.contains(&name), "{message}");
    assert_eq!(stack.creates().await, 0, "nothing is made without a class");

    // The class's creation wakes it: within the wait below, far sooner than its recheck.
    let class: BriqExecutorClass = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "apiKeySecretRef": { "name": "briq-key" } },
    }))
    .unwrap();
    classes(&stack.tenant)
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let ready = wait_for(&stack.tenant.api::<BriqExecutor>(), "py", 30, |e| {
        ready_reason(e) == "KernelReady"
    })
    .await;
    assert_eq!(ready.annotations().get(CLASS_ANNOTATION), Some(&name));
}

#[tokio::test]
async fn an_executor_beyond_its_class_that_admission_did_not_see_makes_no_sandbox() {
    // No admission policy here (as when it is off, or the class came after the executor): the
    // operator holds the executor to its class itself.
    let stack = Platform::new("cls-limit").await;
    let class = stack
        .class(
            "strict",
            json!({
                "allowedImages": ["corp/python:3.12"],
                "defaultImage": "corp/python:3.12",
                "maxExecutionTimeoutSeconds": 20,
            }),
        )
        .await;
    support::create_executor(
        &stack.tenant,
        "miner",
        json!({ "className": class, "image": "evil/miner:latest" }),
    )
    .await;
    let refused = wait_for(&stack.tenant.api::<BriqExecutor>(), "miner", 30, |e| {
        ready_reason(e) == "ClassRefused"
    })
    .await;
    let message = condition(&refused, "Ready").2;
    assert!(
        message.contains(&format!(
            "image evil/miner:latest is not allowed by class {class} (allowedImages: corp/python:3.12)"
        )),
        "{message}"
    );
    assert_eq!(
        stalled(&refused),
        "True",
        "a refused executor tells GitOps tools to stop waiting"
    );
    assert_eq!(
        stack.creates().await,
        0,
        "no sandbox for a refused executor"
    );
    let events = stack
        .tenant
        .api::<k8s_openapi::api::events::v1::Event>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events.items.iter().any(|event| {
            event.reason.as_deref() == Some("ClassRefused")
                && event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("miner")
                && event
                    .note
                    .as_deref()
                    .is_some_and(|note| note.contains("evil/miner"))
        }),
        "a Warning Event says why: {:?}",
        events.items.iter().map(|e| &e.reason).collect::<Vec<_>>()
    );

    // One that leaves its image and timeout at their defaults gets the class's.
    support::create_executor(&stack.tenant, "py", json!({ "className": class })).await;
    let ready = wait_ready(&stack.tenant, "py").await;
    let id = ready.status.unwrap().sandbox_id.unwrap();
    let briq = BriqClient::new(ClientOptions::local(stack.operator.server.url())).unwrap();
    let sandbox = briq
        .get_sandbox(stack.operator.server.api_key(), &id)
        .await
        .unwrap();
    assert_eq!(sandbox.image, "corp/python:3.12");

    // The platform allows the image: the refused executor goes on, woken by the change.
    let allow = json!({ "spec": { "allowedImages": ["corp/python:3.12", "evil/*"] } });
    classes(&stack.tenant)
        .patch(&class, &PatchParams::default(), &Patch::Merge(&allow))
        .await
        .unwrap();
    let ready = wait_for(&stack.tenant.api::<BriqExecutor>(), "miner", 30, |e| {
        ready_reason(e) == "KernelReady"
    })
    .await;
    assert_eq!(stalled(&ready), "False");
}

#[tokio::test]
async fn a_pool_scaled_past_its_class_maximum_keeps_the_maximum() {
    // Scaling goes through the scale subresource, which no admission check of the class sees.
    let stack = Platform::new("cls-pool").await;
    let class = stack.class("pools", json!({ "maxPoolReplicas": 1 })).await;
    let pools = create_pool(&stack.tenant, "warm", 3, &class).await;
    let full = wait_for(&pools, "warm", 60, |p| condition(p, "Ready").0 == "True").await;
    let message = condition(&full, "Ready").2;
    assert!(
        message.contains(&format!(
            "replicas 3 is above class {class}'s maxPoolReplicas 1"
        )),
        "{message}"
    );
    assert_eq!(full.status.unwrap().replicas, 1);
    let members = stack
        .tenant
        .api::<BriqExecutor>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(members.items.len(), 1, "one member, not three");
}

#[tokio::test]
async fn a_pool_created_before_its_class_makes_no_member_until_the_class_caps_it() {
    // As when a pool and its class are applied together and the pool is seen first: members
    // made meanwhile could exceed the class's maxPoolReplicas.
    let stack = Platform::new("cls-pool-first").await;
    let class = unique("later");
    let pools = create_pool(&stack.tenant, "early", 3, &class).await;
    let waiting = wait_for(&pools, "early", 30, |p| {
        condition(p, "Ready").1 == "ClassNotFound"
    })
    .await;
    assert!(
        condition(&waiting, "Ready").2.contains(&class),
        "{:?}",
        condition(&waiting, "Ready")
    );
    let executors = stack.tenant.api::<BriqExecutor>();
    let made = executors.list(&ListParams::default()).await.unwrap();
    assert_eq!(made.items.len(), 0, "no member before the class");

    stack
        .class_named(&class, json!({ "maxPoolReplicas": 1 }))
        .await;
    // Woken by the class, far sooner than the pool's recheck.
    wait_for(&pools, "early", 60, |p| condition(p, "Ready").0 == "True").await;
    let made = executors.list(&ListParams::default()).await.unwrap();
    assert_eq!(made.items.len(), 1, "the class's maximum, never more");
    assert_eq!(stack.creates().await, 1);
}

#[tokio::test]
async fn a_namespace_at_its_class_running_cap_waits_with_the_reason_and_runs_when_one_ends() {
    let stack = Platform::new("cls-cap").await;
    let class = stack
        .class(
            "capped",
            json!({ "perNamespace": { "maxRunningExecutions": 1 } }),
        )
        .await;
    for name in ["a", "b"] {
        support::create_executor(&stack.tenant, name, json!({ "className": class })).await;
    }
    wait_ready(&stack.tenant, "a").await;
    wait_ready(&stack.tenant, "b").await;
    // `a` runs until the test lets it end.
    let gate = support::Gate::new();
    let blocking = gate.code("'a'");
    let spec = json!({ "executorRef": { "name": "a" }, "code": blocking, "timeoutSeconds": 40 });
    support::create_execution_from(&stack.tenant, "long", spec).await;
    let executions = stack.tenant.api::<briq_operator::crd::Execution>();
    wait_for(&executions, "long", 30, |e| {
        e.status.as_ref().is_some_and(|s| s.attempt_id.is_some())
    })
    .await;

    support::create_execution(&stack.tenant, "next", "b", "'b'").await;
    let waiting = wait_for(&executions, "next", 30, |e| {
        condition(e, "Succeeded").1 == "WaitingForCapacity"
    })
    .await;
    let message = condition(&waiting, "Succeeded").2;
    assert!(
        message.contains(&format!("Executions of class {class} at once")),
        "{message}"
    );
    assert!(waiting.status.unwrap().attempt_id.is_none(), "nothing sent");
    // What the namespace uses, as the platform's tenants see it.
    let usage = std::process::Command::new(env!("CARGO_BIN_EXE_briq-operator"))
        .env("KUBECONFIG", &stack.tenant.kubeconfig)
        .args(["usage", "-n", &stack.tenant.namespace])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&usage.stdout);
    let row: Vec<&str> = table
        .lines()
        .find(|line| line.starts_with(&class))
        .unwrap_or_else(|| panic!("a row for {class}: {table}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        row,
        vec![class.as_str(), "2", "0", "1/1", "1", "1"],
        "{table}"
    );

    gate.open();
    let long = finished(&stack.tenant, "long", RUN_SECONDS).await;
    assert_eq!(output(&long), "'a'");
    // Woken by the end of `long`: within the wait, not at a recheck.
    let next = finished(&stack.tenant, "next", 8).await;
    assert_eq!(
        (reason(&next), output(&next)),
        ("Completed".into(), "'b'".into())
    );
}

#[tokio::test]
async fn a_namespace_at_its_class_executor_cap_makes_the_next_wait_until_one_goes() {
    let stack = Platform::new("cls-execs").await;
    let class = stack
        .class("few", json!({ "perNamespace": { "maxExecutors": 1 } }))
        .await;
    support::create_executor(&stack.tenant, "first", json!({ "className": class })).await;
    wait_ready(&stack.tenant, "first").await;
    support::create_executor(&stack.tenant, "second", json!({ "className": class })).await;
    let executors = stack.tenant.api::<BriqExecutor>();
    let waiting = wait_for(&executors, "second", 30, |e| {
        ready_reason(e) == "WaitingForCapacity"
    })
    .await;
    let message = condition(&waiting, "Ready").2;
    assert!(
        message.contains("perNamespace.maxExecutors is 1") && message.contains(&class),
        "{message}"
    );
    assert_eq!(stack.creates().await, 1, "no sandbox for the second");

    executors
        .delete("first", &Default::default())
        .await
        .unwrap();
    // Woken by the first one's going, far sooner than its recheck (a minute).
    wait_for(&executors, "second", 30, |e| {
        ready_reason(e) == "KernelReady"
    })
    .await;
    assert_eq!(stack.creates().await, 2);
}

/// A fork is an executor like any other: past its class's cap it waits for a place, makes no
/// sandbox, and costs its source nothing (no pause, no snapshot) meanwhile.
#[tokio::test]
async fn a_fork_past_its_class_cap_waits_for_a_place_without_pausing_its_source() {
    let stack = Platform::new("cls-fork").await;
    let class = stack
        .class("forks", json!({ "perNamespace": { "maxExecutors": 1 } }))
        .await;
    let executors = stack.tenant.api::<BriqExecutor>();
    support::create_executor(&stack.tenant, "src", json!({ "className": class })).await;
    wait_ready(&stack.tenant, "src").await;
    let fork = json!({ "className": class, "forkFrom": { "name": "src" } });
    support::create_executor(&stack.tenant, "twin", fork).await;
    let waiting = wait_for(&executors, "twin", 30, |e| {
        ready_reason(e) == "WaitingForCapacity"
    })
    .await;
    assert!(
        condition(&waiting, "Ready")
            .2
            .contains("perNamespace.maxExecutors is 1"),
        "{waiting:?}"
    );
    let stats = stack.operator.server.admin().stats().await.unwrap();
    assert_eq!(
        (stats.calls(Operation::Create), stats.calls(Operation::Fork)),
        (1, 0),
        "no sandbox for the fork"
    );
    let source = executors.get("src").await.unwrap();
    assert_eq!(ready_reason(&source), "KernelReady");
    assert_eq!(
        source.status.unwrap().snapshot,
        None,
        "the source never paused for a fork that waits for a place"
    );
}

#[tokio::test]
async fn a_namespace_beyond_its_class_queue_is_refused_without_running() {
    let stack = Platform::new("cls-queue").await;
    let class = stack
        .class(
            "short",
            json!({ "perNamespace": { "maxQueuedExecutions": 1 } }),
        )
        .await;
    support::create_executor(&stack.tenant, "py", json!({ "className": class })).await;
    wait_ready(&stack.tenant, "py").await;
    let gate = support::Gate::new();
    let spec = json!({ "executorRef": { "name": "py" }, "code": gate.code("'long'"), "timeoutSeconds": 40 });
    support::create_execution_from(&stack.tenant, "long", spec).await;
    let executions = stack.tenant.api::<briq_operator::crd::Execution>();
    wait_for(&executions, "long", 30, |e| {
        e.status.as_ref().is_some_and(|s| s.attempt_id.is_some())
    })
    .await;
    support::create_execution(&stack.tenant, "waits", "py", "'waited'").await;
    wait_for(&executions, "waits", 30, |e| {
        condition(e, "Succeeded").1 == "Queued"
    })
    .await;

    support::create_execution(&stack.tenant, "refused", "py", "'never'").await;
    let refused = finished(&stack.tenant, "refused", 30).await;
    assert_eq!(reason(&refused), "QueueFull");
    let message = condition(&refused, "Succeeded").2;
    assert!(
        message.contains(&format!("1 Executions of class {class} waiting")),
        "{message}"
    );
    assert!(refused.status.unwrap().attempt_id.is_none(), "never sent");

    gate.open();
    let waited = finished(&stack.tenant, "waits", RUN_SECONDS).await;
    assert_eq!(
        (reason(&waited), output(&waited)),
        ("Completed".into(), "'waited'".into())
    );
}

/// briq's MCP server does not match what the operator sends with a class's key (its exec
/// without `stdin`): the class says so on its `BriqInterface` condition, naming the tool and the
/// parameter, as its executor's `Ready` does.
#[tokio::test]
async fn a_class_whose_key_meets_a_mismatched_briq_interface_says_so_naming_the_parameter() {
    let p = Platform::new("iface").await;
    p.operator
        .server
        .admin()
        .declare(&DeclaredChange::DropParameter {
            tool: "briq_exec".into(),
            parameter: "stdin".into(),
        })
        .await
        .unwrap();
    let class = p.class("iface", json!({})).await;
    p.tenant
        .api::<BriqExecutor>()
        .create(
            &PostParams::default(),
            &executor("py", json!({ "className": class })),
        )
        .await
        .unwrap();
    let said = wait_for(&classes(&p.tenant), &class, 30, |c| {
        condition(c, "BriqInterface").1 == "BriqInterfaceMismatch"
    })
    .await;
    let (status, _, message) = condition(&said, "BriqInterface");
    assert_eq!(status, "False");
    assert!(
        message.contains("briq_exec.stdin: sent, but not declared"),
        "{message}"
    );
    let executor = wait_for(&p.tenant.api::<BriqExecutor>(), "py", 30, |e| {
        ready_reason(e) == "BriqInterfaceMismatch"
    })
    .await;
    assert_eq!(condition(&executor, "Ready").0, "False");
    assert_eq!(p.creates().await, 0, "no sandbox is made");
}
