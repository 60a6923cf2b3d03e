//! GitOps compatibility: the Argo CD health checks (run with Lua 5.1, the dialect of Argo CD's
//! gopher-lua) on their test cases and on real objects, and what kstatus (cli-utils, as Flux
//! uses it) computes for real objects in each state.

mod ops;
mod support;

use std::{collections::BTreeMap, path::Path};

use briq_operator::crd::{BriqExecutor, Execution};
use kube::{
    ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};
use mlua::{LuaSerdeExt, serde::SerializeOptions};

use serde_json::{Value, json};
use support::{
    Operator, TestEnv, condition, create_execution, create_executor, finished, wait_for,
};

fn health_dir() -> std::path::PathBuf {
    ops::chart_dir().join("health/briq.cloud")
}

/// Runs the Argo CD health check of `kind` on `object`: (status, message).
fn argo_health(kind: &str, object: &Value) -> (String, String) {
    let script = std::fs::read_to_string(health_dir().join(kind).join("health.lua")).unwrap();
    let lua = mlua::Lua::new();
    // JSON null is absent in Argo CD's Lua view of an object.
    let options = SerializeOptions::new()
        .serialize_none_to_null(false)
        .serialize_unit_to_null(false);
    let obj = lua.to_value_with(object, options).unwrap();
    lua.globals().set("obj", obj).unwrap();
    let result: mlua::Table = lua
        .load(&script)
        .set_name(format!("{kind}/health.lua"))
        .eval()
        .unwrap_or_else(|error| panic!("{kind}/health.lua failed: {error}"));
    let status: String = result.get("status").unwrap();
    let message: String = result.get("message").unwrap_or_default();
    assert!(
        [
            "Healthy",
            "Progressing",
            "Degraded",
            "Suspended",
            "Missing",
            "Unknown"
        ]
        .contains(&status.as_str()),
        "not an Argo CD health status: {status}"
    );
    (status, message)
}

fn yaml_file(path: &Path) -> Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn argo_cd_health_checks_pass_their_test_cases() {
    for kind in ["BriqExecutor", "Execution"] {
        let dir = health_dir().join(kind);
        let cases = yaml_file(&dir.join("health_test.yaml"));
        let cases = cases["tests"].as_array().unwrap();
        assert!(cases.len() >= 5, "{kind}: {} cases", cases.len());
        for case in cases {
            let input = yaml_file(&dir.join(case["inputPath"].as_str().unwrap()));
            assert_eq!(input["kind"], kind);
            let (status, message) = argo_health(kind, &input);
            let want = &case["healthStatus"];
            assert_eq!(
                status,
                want["status"].as_str().unwrap(),
                "{kind} {}",
                case["inputPath"]
            );
            assert_eq!(
                message,
                want["message"].as_str().unwrap(),
                "{kind} {}",
                case["inputPath"]
            );
        }
    }
}

#[test]
fn the_argocd_cm_snippet_carries_the_same_scripts() {
    let cm = yaml_file(&ops::chart_dir().join("health/argocd-cm.yaml"));
    for kind in ["BriqExecutor", "Execution"] {
        let script = std::fs::read_to_string(health_dir().join(kind).join("health.lua")).unwrap();
        let key = format!("resource.customizations.health.briq.cloud_{kind}");
        assert_eq!(
            cm["data"][&key].as_str(),
            Some(script.as_str()),
            "{key} in health/argocd-cm.yaml differs from {kind}/health.lua"
        );
    }
}

/// What kstatus computes for each object: name → (status, message).
fn kstatus(objects: &[Value]) -> BTreeMap<String, (String, String)> {
    use std::io::Write as _;
    let mut child = std::process::Command::new(ops::tool("kstatus"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("running kstatus");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(objects).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "kstatus failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            let text = |k: &str| v[k].as_str().unwrap().to_owned();
            (text("name"), (text("status"), text("message")))
        })
        .collect()
}

async fn get<K>(env: &TestEnv, name: &str) -> Value
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    serde_json::to_value(env.api::<K>().get(name).await.unwrap()).unwrap()
}

#[tokio::test]
async fn kstatus_and_argo_cd_read_real_objects_as_documented() {
    let env = TestEnv::new("gitops").await;
    let mut operator = Operator::start(&env).await;
    create_executor(&env, "py", json!({})).await;
    // No index: pip fails at once, offline.
    let broken = json!({ "packages": ["briq-no-such-package==0.0.1"], "env": [{ "name": "PIP_NO_INDEX", "value": "1" }] });
    create_executor(&env, "broken", broken).await;
    create_executor(
        &env,
        "nokey",
        json!({ "apiKeySecretRef": { "name": "missing" } }),
    )
    .await;
    create_executor(&env, "gone", json!({})).await;
    support::wait_ready(&env, "py").await;
    create_execution(&env, "ok", "py", "1 + 1").await;
    finished(&env, "ok", 60).await;
    create_execution(&env, "raises", "py", "1 / 0").await;
    finished(&env, "raises", 60).await;
    create_execution(&env, "orphan", "nowhere", "1").await;
    let executors = env.api::<BriqExecutor>();
    wait_for(&executors, "broken", 90, |e| {
        condition(e, "Stalled").0 == "True"
    })
    .await;
    wait_for(&executors, "nokey", 30, |e| {
        condition(e, "Ready").1 == "ApiKeyMissing"
    })
    .await;
    wait_for(&env.api::<Execution>(), "orphan", 30, |e| {
        condition(e, "Succeeded").1 == "ExecutorNotFound"
    })
    .await;

    // Its finalizer is all that "gone" needs: deleting it later leaves it Terminating.
    wait_for(&executors, "gone", 30, |e| !e.finalizers().is_empty()).await;

    // With the operator stopped: a spec change it has not observed, and a deletion its
    // finalizer holds.
    operator.kill().await;
    let patch = json!({ "spec": { "executionTimeoutSeconds": 10 } });
    executors
        .patch("py", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    executors
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();

    let mut objects = Vec::new();
    for name in ["py", "broken", "nokey", "gone"] {
        objects.push(get::<BriqExecutor>(&env, name).await);
    }
    for name in ["ok", "raises", "orphan"] {
        objects.push(get::<Execution>(&env, name).await);
    }
    let computed = kstatus(&objects);
    let expected = [
        // name, kstatus, Argo CD
        ("py", "InProgress", "Progressing"), // generation 2 not observed yet
        ("broken", "Failed", "Degraded"),    // Stalled=True (SetupFailed)
        ("nokey", "InProgress", "Progressing"), // Ready=False, not Stalled: waits for the Secret
        ("gone", "Terminating", "Progressing"), // deletion held by the finalizer
        // kstatus knows no `Succeeded`: an observed Execution is Current whatever its outcome.
        ("ok", "Current", "Healthy"),
        ("raises", "Current", "Degraded"),
        ("orphan", "Current", "Progressing"),
    ];
    for (object, (name, status, health)) in objects.iter().zip(expected) {
        let kind = object["kind"].as_str().unwrap();
        assert_eq!(
            computed[name].0, status,
            "kstatus of {kind} {name}: {:?}",
            computed[name]
        );
        assert_eq!(
            argo_health(kind, object).0,
            health,
            "Argo CD health of {kind} {name}"
        );
    }

    // Once observed, the ready executor is Current / Healthy.
    operator.resume();
    let py = wait_for(&executors, "py", 30, |e| {
        e.status.as_ref().and_then(|s| s.observed_generation) == e.metadata.generation
    })
    .await;
    let py = serde_json::to_value(py).unwrap();
    assert_eq!(kstatus(std::slice::from_ref(&py))["py"].0, "Current");
    assert_eq!(argo_health("BriqExecutor", &py).0, "Healthy");
    support::wait_deleted(&executors, "gone", 30).await;
}

/// The imperative pattern docs/src/gitops.md shows: `generateName` + `kubectl create` runs
/// anew each time; `kubectl apply` refuses a generated name.
#[tokio::test]
async fn generate_name_with_kubectl_create_makes_a_new_execution_each_time() {
    let env = TestEnv::new("gitops-create").await;
    let manifest = support::repo_root().join("examples/execution.yaml");
    let manifest = manifest.to_str().unwrap();
    let mut names = Vec::new();
    for _ in 0..2 {
        let (ok, stdout, stderr) = env.kubectl(&["create", "-f", manifest, "-o", "name"]);
        assert!(ok, "{stderr}");
        names.push(stdout.trim().to_owned());
    }
    assert_ne!(names[0], names[1]);
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("execution.briq.cloud/fibonacci-")),
        "{names:?}"
    );
    let (ok, _, stderr) = env.kubectl(&["apply", "-f", manifest]);
    assert!(
        !ok && stderr.contains("cannot use generate name with apply"),
        "{stderr}"
    );
}
