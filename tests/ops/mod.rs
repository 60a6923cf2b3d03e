//! Support for the tests of running the operator in a cluster (chart, RBAC, leader election,
//! metrics, GitOps): the tools from `tests/tools/build.sh`, the rendered chart, and whole
//! operator processes (`operator::serve`: HTTP endpoints, leader election, controllers) started
//! in this test process against the shared control plane.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
    time::Duration,
};

use briq_operator::leader::LeaseConfig;
use serde_json::Value;

use crate::support::{self, TestEnv};

#[allow(unused_imports)] // each test binary uses a different part of this module
pub use {
    crate::support::{sandbox_server, settings},
    // One operator process, as `briq-operator run` runs it, inside this test process.
    briq_dev::stack::OperatorProcess as Instance,
};

/// The directory holding `bin/` (helm, kstatus, crane, registry, krew, promcheck) and `debs/`:
/// `BRIQ_TOOLS_DIR`, else what
/// `tests/tools/build.sh --cached` prints (it never builds; `make test` and `.ci/run` do).
pub fn tools_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("BRIQ_TOOLS_DIR") {
            return PathBuf::from(dir);
        }
        briq_dev::repo::script_output("tests/tools/build.sh", &["--cached"]).unwrap_or_else(
            |error| {
                panic!(
                    "helm and kstatus are not built: run `bash tests/tools/build.sh` (make test \
                     does): {error:#}"
                )
            },
        )
    })
}

pub fn tool(name: &str) -> PathBuf {
    tools_dir().join("bin").join(name)
}

pub fn chart_dir() -> PathBuf {
    support::repo_root().join("charts/briq-operator")
}

/// Every feature of the chart switched on.
pub const ALL_FEATURES: &[&str] = &[
    "--set",
    "serviceMonitor.enabled=true",
    "--set",
    "networkPolicy.enabled=true",
    "--set",
    "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
    "--set",
    "briq.apiKeySecret.name=briq-default-key",
    "--set",
    "podAnnotations.example\\.com/team=agents",
    "--set",
    "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "--set",
    "grafanaDashboard.enabled=true",
    "--set",
    "grafanaDashboard.annotations.grafana_folder=Operators",
    "--set",
    "prometheusRule.enabled=true",
    "--set",
    "prometheusRule.labels.release=prometheus",
    "--set",
    "tracing.otlpEndpoint=http://otel-collector.observability:4318",
    "--set",
    "tracing.sampler=parentbased_traceidratio",
    "--set",
    "tracing.samplerArg=0.25",
    "--set",
    "tracing.collector.to[0].ipBlock.cidr=10.0.0.9/32",
    // The aggregated API is on by default; its certificate from cert-manager instead of Helm.
    "--set",
    "subresources.certManager.enabled=true",
];

/// The chart's Grafana dashboard, relative to the chart's directory.
pub const DASHBOARD: &str = "dashboards/briq-operator.json";

/// Runs helm; returns (success, stdout, stderr).
pub fn helm(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(tool("helm"))
        // No user configuration, cache or repositories: only what this test hands in.
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("briq-helm-config"),
        )
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("briq-helm-cache"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("briq-helm-data"),
        )
        .args(args)
        .output()
        .expect("running helm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `helm template` of the chart, as YAML text; panics when helm fails.
pub fn template_text(release: &str, namespace: &str, extra: &[&str]) -> String {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        release,
        chart.to_str().unwrap(),
        "--namespace",
        namespace,
    ];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = helm(&args);
    assert!(ok, "helm template {extra:?} failed: {stderr}");
    stdout
}

/// `helm template` of the chart, one JSON value per document.
pub fn template(release: &str, namespace: &str, extra: &[&str]) -> Vec<Value> {
    documents(&template_text(release, namespace, extra))
}

pub fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|document| {
            <Value as serde::Deserialize>::deserialize(document).expect("rendered YAML parses")
        })
        .filter(|document| !document.is_null())
        .collect()
}

pub fn find<'a>(documents: &'a [Value], kind: &str) -> Vec<&'a Value> {
    documents.iter().filter(|d| d["kind"] == kind).collect()
}

/// The admin kube::Config of the test cluster.
pub async fn kube_config(env: &TestEnv) -> kube::Config {
    let mut config = briq_dev::stack::kube_config(&env.kubeconfig)
        .await
        .expect("kube config");
    config.default_namespace = env.namespace.clone();
    config
}

/// A short lease in the test namespace, so that fail-overs take seconds. Its grace leaves a
/// renewal (whose requests time out at a third of it) room on a busy 2-CPU machine: with 1 s, a
/// request slower than 333 ms made the leader step down mid-test.
pub fn lease(env: &TestEnv, name: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        name: name.into(),
        namespace: env.namespace.clone(),
        identity: identity.into(),
        duration_seconds: LEASE_SECONDS,
        grace_seconds: LEASE_GRACE_SECONDS,
    }
}

pub const LEASE_SECONDS: u64 = 6;
pub const LEASE_GRACE_SECONDS: u64 = 3;

/// Waits until `check` holds, polling; panics with `what` after `timeout`.
pub async fn until(timeout: Duration, what: &str, check: impl FnMut() -> bool) -> Duration {
    briq_dev::wait::until(timeout, what, check)
        .await
        .unwrap_or_else(|error| panic!("{error}"))
}

/// The chart's ValidatingAdmissionPolicyBinding confined to `namespace`. Policies are
/// cluster-wide, and each release lets only its own ServiceAccount through: on a shared control
/// plane an unconfined binding would deny the operators of every other test.
pub fn confine_admission_policy(documents: &mut [Value], namespace: &str) {
    for binding in documents
        .iter_mut()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
    {
        binding["spec"]["matchResources"] = serde_json::json!({
            "namespaceSelector": {
                "matchLabels": { "kubernetes.io/metadata.name": namespace }
            }
        });
    }
}

/// Documents as one multi-document YAML text, for `kubectl apply`.
pub fn yaml(documents: &[&Value]) -> String {
    documents
        .iter()
        .map(|d| format!("---\n{}", serde_yaml_ng::to_string(d).unwrap()))
        .collect()
}

/// Waits until the admission policy guards `env`'s namespace: type-checking and compiling a
/// policy and its binding is asynchronous, so a dry-run create of an executor naming a sandbox
/// is tried (as the admin, whom the policy does not exempt either) until it is denied.
pub async fn admission_policy_effective(env: &TestEnv) {
    use briq_operator::crd::BriqExecutor;
    use kube::api::PostParams;

    let probe: BriqExecutor = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "admission-probe",
            "annotations": { "briq.cloud/sandbox-id": "bq_probe" }
        },
        "spec": {}
    }))
    .unwrap();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let api = env.api::<BriqExecutor>();
    briq_dev::wait::poll(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "the admission policy denies an executor naming a sandbox",
        || async {
            Ok(match api.create(&dry_run, &probe).await {
                Ok(_) => false,
                Err(kube::Error::Api(status))
                    if status.code == 403
                        && status.message.contains("ValidatingAdmissionPolicy") =>
                {
                    true
                }
                Err(error) => anyhow::bail!("the probe failed otherwise: {error}"),
            })
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
}

/// A client acting as `user`: the test's admin impersonating it.
pub async fn impersonating(env: &TestEnv, user: &str) -> kube::Client {
    let mut config = kube_config(env).await;
    config.auth_info.impersonate = Some(user.to_owned());
    briq_operator::kube_client::client(config).unwrap()
}

/// `kubectl apply --server-side` of `yaml`, as field manager `manager`; panics when it fails.
/// Objects naming another namespace than the test's (the chart's RoleBinding in kube-system)
/// are applied there, after the others: kubectl refuses them under the test's `--namespace`.
pub fn apply(env: &TestEnv, yaml: &str, manager: &str) {
    let documents = documents(yaml);
    let mut namespaces: Vec<Option<&str>> = vec![None];
    for document in &documents {
        let namespace = document["metadata"]["namespace"]
            .as_str()
            .filter(|n| *n != env.namespace);
        if !namespaces.contains(&namespace) {
            namespaces.push(namespace);
        }
    }
    for namespace in namespaces {
        let group: Vec<&Value> = documents
            .iter()
            .filter(|d| {
                d["metadata"]["namespace"]
                    .as_str()
                    .filter(|n| *n != env.namespace)
                    == namespace
            })
            .collect();
        if group.is_empty() {
            continue;
        }
        let file = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
        std::fs::write(file.path(), self::yaml(&group)).unwrap();
        let manager = format!("--field-manager={manager}");
        // After the test's namespace, which env.kubectl sets first.
        let namespace = format!("--namespace={}", namespace.unwrap_or(&env.namespace));
        let (ok, stdout, stderr) = env.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            &manager,
            &namespace,
            "-f",
            file.path().to_str().unwrap(),
        ]);
        assert!(
            ok,
            "kubectl apply --server-side {namespace} failed:\n{stdout}\n{stderr}"
        );
    }
}

/// The admission policies and their bindings among `documents`.
pub fn admission_objects(documents: &[Value]) -> Vec<&Value> {
    documents
        .iter()
        .filter(|d| {
            d["kind"]
                .as_str()
                .is_some_and(|kind| kind.starts_with("ValidatingAdmissionPolicy"))
        })
        .collect()
}
