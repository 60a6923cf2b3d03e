//! The chart against the real kube-apiserver, and who it lets do what: `install.yaml` and a
//! release with every feature are accepted as rendered; the admission policies let only the
//! chart's ServiceAccount write the operator's fields and hold executors and pools to their
//! class; the roles grant exactly what the controllers use, the API server's authorizer denies
//! the rest, and the controllers run end to end as that ServiceAccount.

mod ops;
mod support;

use std::{collections::BTreeSet, time::Duration};

use briq_dev::local_server::Operation;
use briq_operator::crd::{BriqExecutor, Execution};
use k8s_openapi::api::{core::v1::Secret, events::v1::Event};
use kube::{
    Api,
    api::{DeleteParams, ListParams},
};
use ops::{ALL_FEATURES, DASHBOARD, Instance, until};
use serde_json::{Value, json};
use support::{TestEnv, create_execution, create_executor, finished, reason, wait_deleted};

/// The chart's APIService (cluster-scoped, one per cluster).
const API_SERVICE: &str = "v1alpha1.subresources.briq.cloud";

/// A stand-in for one of prometheus-operator's or cert-manager's CRDs (any content accepted), so
/// that the chart's ServiceMonitor, PrometheusRule, Certificates and Issuers can be applied.
fn stand_in_crd(group: &str, kind: &str) -> String {
    let plural = format!("{}s", kind.to_lowercase());
    format!(
        r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{ name: {plural}.{group} }}
spec:
  group: {group}
  names: {{ kind: {kind}, plural: {plural}, singular: {singular} }}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {{ type: object, x-kubernetes-preserve-unknown-fields: true }}
"#,
        singular = kind.to_lowercase(),
    )
}

#[tokio::test]
async fn the_release_manifest_holds_the_whole_install_and_the_api_server_accepts_it() {
    let env = TestEnv::new("chart-release").await;
    let out = tempfile::tempdir().unwrap();
    let helm = ops::tool("helm");
    let script = support::repo_root().join("dev/release.sh");
    let made = std::process::Command::new("bash")
        .args([script.as_os_str(), helm.as_os_str(), out.path().as_os_str()])
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let version = env!("CARGO_PKG_VERSION");
    let package = out.path().join(format!("briq-operator-{version}.tgz"));
    assert!(
        package.is_file(),
        "the packaged chart {}",
        package.display()
    );

    // The packaged chart carries the dashboard and the rule file (`.Files.Get` reads them).
    let (ok, packaged, stderr) = ops::helm(&[
        "template",
        "packaged",
        package.to_str().unwrap(),
        "--set",
        "grafanaDashboard.enabled=true",
        "--set",
        "prometheusRule.enabled=true",
    ]);
    assert!(ok, "{stderr}");
    let packaged = ops::documents(&packaged);
    let dashboard = std::fs::read_to_string(ops::chart_dir().join(DASHBOARD)).unwrap();
    assert_eq!(
        ops::find(&packaged, "ConfigMap")[0]["data"]["briq-operator.json"],
        dashboard.as_str()
    );
    assert_eq!(ops::find(&packaged, "PrometheusRule").len(), 1);

    let yaml = std::fs::read_to_string(out.path().join("install.yaml")).unwrap();
    let documents = ops::documents(&yaml);
    let mut kinds: Vec<&str> = documents
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    kinds.sort_unstable();
    for wanted in [
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(kinds.contains(&wanted), "no {wanted} in {kinds:?}");
    }
    // No aggregated API: its serving key would be one key, published with the release, for
    // every cluster; Helm makes one per install.
    for absent in ["APIService", "Secret"] {
        assert!(!kinds.contains(&absent), "a {absent} in {kinds:?}");
    }
    let crds = ops::find(&documents, "CustomResourceDefinition");
    assert_eq!(crds.len(), 4, "every CRD");
    for document in &documents {
        let namespace = &document["metadata"]["namespace"];
        assert!(
            namespace.is_null() || namespace == "briq-system",
            "{} {} is in {namespace}",
            document["kind"],
            document["metadata"]["name"]
        );
    }
    let deployment = ops::find(&documents, "Deployment")[0];
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("briq-operator:{version}")
    );

    // What `kubectl apply --server-side -f install.yaml` would do, checked by the API server's
    // own validation and admission (a dry run: this API server is shared by the tests).
    let (_, _, _) = env.kubectl(&["create", "namespace", "briq-system"]);
    let file = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    std::fs::write(file.path(), &yaml).unwrap();
    let (ok, stdout, stderr) = env.kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "--dry-run=server",
        // After the test namespace env.kubectl sets: install.yaml names its own.
        "--namespace=briq-system",
        "-f",
        file.path().to_str().unwrap(),
    ]);
    assert!(
        ok,
        "the API server refused install.yaml:\n{stdout}\n{stderr}"
    );
    assert_eq!(
        stdout.lines().count(),
        documents.len(),
        "one line per object: {stdout}"
    );
}

#[tokio::test]
async fn rendered_manifests_apply_to_the_api_server() {
    let env = TestEnv::new("chart-apply").await;
    for (group, kind) in [
        ("monitoring.coreos.com", "ServiceMonitor"),
        ("monitoring.coreos.com", "PrometheusRule"),
        ("cert-manager.io", "Certificate"),
        ("cert-manager.io", "Issuer"),
    ] {
        ops::apply(&env, &stand_in_crd(group, kind), "helm-chart-test");
    }
    let (ok, _, stderr) = env.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
        "crd/certificates.cert-manager.io",
        "crd/issuers.cert-manager.io",
    ]);
    assert!(ok, "{stderr}");

    let release = format!("apply-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let mut extra = vec!["--include-crds"];
    extra.extend_from_slice(ALL_FEATURES);
    let mut documents = ops::documents(&ops::template_text(&release, &env.namespace, &extra));
    // This release's ServiceAccount would be the only one let through: keep the policy here.
    ops::confine_admission_policy(&mut documents, &env.namespace);
    ops::apply(
        &env,
        &ops::yaml(&documents.iter().collect::<Vec<_>>()),
        "helm-chart-test",
    );
    let fullname = format!("{release}-briq-operator");
    for object in [
        format!("deployment/{fullname}"),
        format!("serviceaccount/{fullname}"),
        format!("service/{fullname}-metrics"),
        format!("servicemonitor/{fullname}"),
        format!("prometheusrule/{fullname}"),
        format!("configmap/{fullname}-dashboard"),
        format!("networkpolicy/{fullname}"),
        format!("role/{fullname}-leader-election"),
        format!("rolebinding/{fullname}-leader-election"),
        format!("clusterrole/{fullname}"),
        format!("clusterrolebinding/{fullname}"),
        format!("validatingadmissionpolicy/{fullname}-operator-fields"),
        format!("validatingadmissionpolicybinding/{fullname}-operator-fields"),
        format!("validatingadmissionpolicy/{fullname}-executor-class"),
        format!("validatingadmissionpolicybinding/{fullname}-executor-class"),
        format!("validatingadmissionpolicy/{fullname}-pool-class"),
        format!("validatingadmissionpolicybinding/{fullname}-pool-class"),
        // The aggregated API, with its certificate from cert-manager (ALL_FEATURES).
        format!("service/{fullname}-subresources"),
        format!("certificate/{fullname}-subresources"),
        format!("certificate/{fullname}-subresources-ca"),
        format!("issuer/{fullname}-subresources-ca"),
        format!("issuer/{fullname}-subresources-selfsigned"),
        format!("clusterrolebinding/{fullname}-auth-delegator"),
        format!("clusterrole/{fullname}-execution-log"),
        format!("clusterrole/{fullname}-executor-files"),
        format!("clusterrole/{fullname}-mcp"),
        format!("apiservice/{API_SERVICE}"),
    ] {
        let (ok, _, stderr) = env.kubectl(&["get", &object]);
        assert!(ok, "{object}: {stderr}");
    }
    let reader = format!("rolebinding/{fullname}-authentication-reader");
    let (ok, _, stderr) = env.kubectl(&["get", &reader, "--namespace=kube-system"]);
    assert!(ok, "{reader} in kube-system: {stderr}");
    let (ok, injected, stderr) = env.kubectl(&[
        "get",
        &format!("apiservice/{API_SERVICE}"),
        "--output=jsonpath={.metadata.annotations.cert-manager\\.io/inject-ca-from}",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(
        injected,
        format!("{}/{fullname}-subresources", env.namespace)
    );

    // Scoped to one namespace, the ClusterRole is bound there only.
    let scoped = format!("scoped-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let set = format!("watchNamespace={}", env.namespace);
    let yaml = ops::template_text(&scoped, &env.namespace, &["--set", &set]);
    let documents = ops::documents(&yaml);
    // Only classes and namespace labels (cluster-scoped) are read cluster-wide, and
    // SubjectAccessReviews (cluster-scoped) created, for the aggregated API.
    let mut cluster_bindings: Vec<&str> = ops::find(&documents, "ClusterRoleBinding")
        .iter()
        .map(|b| b["roleRef"]["name"].as_str().unwrap())
        .collect();
    cluster_bindings.sort_unstable();
    assert_eq!(
        cluster_bindings,
        [
            format!("{scoped}-briq-operator-classes").as_str(),
            "system:auth-delegator"
        ]
    );
    // The ClusterRole in the watched namespace, the class keys, the Lease, and the front
    // proxy's ConfigMap in kube-system.
    let mut bindings: Vec<String> = ops::find(&documents, "RoleBinding")
        .iter()
        .map(|b| {
            format!(
                "{}/{}",
                b["metadata"]["namespace"].as_str().unwrap(),
                b["roleRef"]["name"].as_str().unwrap()
            )
        })
        .collect();
    bindings.sort_unstable();
    let ns = &env.namespace;
    let mut expected = [
        "kube-system/extension-apiserver-authentication-reader".to_owned(),
        format!("{ns}/{scoped}-briq-operator"),
        format!("{ns}/{scoped}-briq-operator-class-keys"),
        format!("{ns}/{scoped}-briq-operator-leader-election"),
    ];
    expected.sort_unstable();
    assert_eq!(bindings, expected);
    ops::apply(&env, &yaml, "helm-chart-test");
    ops::admission_policy_effective(&env).await;

    // Without cert-manager the chart's own CA is the caBundle.
    let secret = ops::find(&documents, "Secret")[0];
    let (ok, ca_bundle, stderr) = env.kubectl(&[
        "get",
        &format!("apiservice/{API_SERVICE}"),
        "--output=jsonpath={.spec.caBundle}",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(ca_bundle, secret["data"]["ca.crt"].as_str().unwrap());
    let (ok, _, stderr) = env.kubectl(&[
        "get",
        &format!("secret/{scoped}-briq-operator-subresources-tls"),
    ]);
    assert!(ok, "{stderr}");

    // No pod serves it here (no kubelet): an unavailable APIService would fail the discovery of
    // the other tests of this control plane (kubectl, namespace deletion). It applied; remove it.
    let (ok, _, stderr) = env.kubectl(&["delete", &format!("apiservice/{API_SERVICE}")]);
    assert!(ok, "{stderr}");
}

#[test]
fn the_admission_policy_lets_only_the_charts_service_account_through() {
    // (values, the ServiceAccount let through, the namespace the binding is confined to)
    let cases: &[(&[&str], &str, Option<&str>)] = &[
        (&[], "adm-briq-operator", None),
        (&["--set", "serviceAccount.name=custom"], "custom", None),
        (&["--set", "serviceAccount.create=false"], "default", None),
        (
            &[
                "--set",
                "serviceAccount.create=false",
                "--set",
                "serviceAccount.name=shared",
            ],
            "shared",
            None,
        ),
        (
            &["--set", "watchNamespace=tenants"],
            "adm-briq-operator",
            Some("tenants"),
        ),
    ];
    for (values, account, confined) in cases {
        let documents = ops::template("adm", "briq-system", values);
        let deployment = ops::find(&documents, "Deployment")[0];
        assert_eq!(
            deployment["spec"]["template"]["spec"]["serviceAccountName"], *account,
            "{values:?}"
        );
        let policy = ops::find(&documents, "ValidatingAdmissionPolicy")[0];
        assert_eq!(
            policy["metadata"]["name"],
            "adm-briq-operator-operator-fields"
        );
        assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        assert_eq!(
            policy["spec"]["matchConditions"][0]["expression"],
            format!("request.userInfo.username != \"system:serviceaccount:briq-system:{account}\""),
            "{values:?}"
        );
        let rules = &policy["spec"]["matchConstraints"]["resourceRules"];
        assert_eq!(rules[0]["operations"], json!(["CREATE", "UPDATE"]));
        assert_eq!(
            rules[0]["resources"],
            json!([
                "briqexecutors",
                "executions",
                "briqexecutorpools",
                "briqexecutors/status",
                "executions/status",
                "briqexecutorpools/status"
            ])
        );
        let binding = ops::find(&documents, "ValidatingAdmissionPolicyBinding")[0];
        assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        let selector = &binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"];
        assert_eq!(
            selector["kubernetes.io/metadata.name"].as_str(),
            *confined,
            "{values:?}"
        );
    }
    let off = ops::template(
        "adm",
        "briq-system",
        &["--set", "admissionPolicy.enabled=false"],
    );
    assert!(
        ops::find(&off, "ValidatingAdmissionPolicy").is_empty()
            && ops::find(&off, "ValidatingAdmissionPolicyBinding").is_empty()
    );
}

#[test]
fn the_class_policies_take_every_class_as_parameter_and_are_bound_like_the_other() {
    // (values, the ServiceAccount let through, the namespace the bindings are confined to)
    let cases: &[(&[&str], &str, Option<&str>)] = &[
        (&[], "adm-briq-operator", None),
        (&["--set", "serviceAccount.name=custom"], "custom", None),
        (
            &["--set", "watchNamespace=tenants"],
            "adm-briq-operator",
            Some("tenants"),
        ),
    ];
    // (policy, resource, operations): executors when created only (one made before its class
    // was tightened keeps running, and stays editable); pools whenever their spec changes; the
    // scale subresource never (the operator caps the members).
    let policies = [
        (
            "adm-briq-operator-executor-class",
            "briqexecutors",
            json!(["CREATE"]),
        ),
        (
            "adm-briq-operator-pool-class",
            "briqexecutorpools",
            json!(["CREATE", "UPDATE"]),
        ),
    ];
    for (values, account, confined) in cases {
        let documents = ops::template("adm", "briq-system", values);
        let named = |kind: &str, name: &str| -> Value {
            ops::find(&documents, kind)
                .into_iter()
                .find(|d| d["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("{kind} {name} is rendered ({values:?})"))
                .clone()
        };
        for (name, resource, operations) in &policies {
            let policy = named("ValidatingAdmissionPolicy", name);
            assert_eq!(policy["spec"]["failurePolicy"], "Fail");
            assert_eq!(
                policy["spec"]["paramKind"],
                json!({ "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutorClass" })
            );
            assert_eq!(
                policy["spec"]["matchConditions"][0]["expression"],
                format!(
                    "request.userInfo.username != \"system:serviceaccount:briq-system:{account}\""
                ),
                "{values:?}"
            );
            assert_eq!(
                policy["spec"]["matchConstraints"]["resourceRules"],
                json!([{
                    "apiGroups": ["briq.cloud"], "apiVersions": ["*"],
                    "operations": operations, "resources": [resource],
                }])
            );
            let binding = named("ValidatingAdmissionPolicyBinding", name);
            assert_eq!(binding["spec"]["policyName"], *name);
            assert_eq!(
                binding["spec"]["paramRef"],
                json!({ "selector": {}, "parameterNotFoundAction": "Allow" })
            );
            assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
            let selector = &binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"];
            assert_eq!(
                selector["kubernetes.io/metadata.name"].as_str(),
                *confined,
                "{values:?}"
            );
        }
    }
}

/// (apiGroup, resource, verb, resourceName) for every permission a rule grants.
fn grants(rules: &Value) -> BTreeSet<(String, String, String, String)> {
    let mut out = BTreeSet::new();
    let strings = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|i| i.as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    for rule in rules.as_array().unwrap() {
        let names = strings(&rule["resourceNames"]);
        let names = if names.is_empty() {
            vec![String::new()]
        } else {
            names
        };
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    for name in &names {
                        out.insert((group.clone(), resource.clone(), verb.clone(), name.clone()));
                    }
                }
            }
        }
    }
    out
}

fn set(items: &[(&str, &str, &str, &str)]) -> BTreeSet<(String, String, String, String)> {
    items
        .iter()
        .map(|(g, r, v, n)| (g.to_string(), r.to_string(), v.to_string(), n.to_string()))
        .collect()
}

#[test]
fn the_roles_grant_exactly_what_the_controllers_use() {
    let documents = ops::template("rbac", "briq-system", &[]);
    let named = |kind: &str, name: &str| -> Value {
        ops::find(&documents, kind)
            .into_iter()
            .find(|d| d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name} is rendered"))
            .clone()
    };
    let cluster_role = named("ClusterRole", "rbac-briq-operator");
    let mut expected = Vec::new();
    for resource in ["briqexecutors", "executions"] {
        for verb in ["get", "list", "watch", "patch"] {
            expected.push(("briq.cloud", resource, verb, ""));
        }
    }
    expected.extend([
        ("briq.cloud", "briqexecutors/status", "patch", ""),
        ("briq.cloud", "executions/status", "patch", ""),
        ("briq.cloud", "briqexecutors/finalizers", "update", ""),
        ("briq.cloud", "executions", "create", ""),
        ("briq.cloud", "executions", "delete", ""),
        ("briq.cloud", "briqexecutorpools", "get", ""),
        ("briq.cloud", "briqexecutorpools", "list", ""),
        ("briq.cloud", "briqexecutorpools", "watch", ""),
        ("briq.cloud", "briqexecutorpools/status", "patch", ""),
        ("briq.cloud", "briqexecutorpools/finalizers", "update", ""),
        ("briq.cloud", "briqexecutors", "create", ""),
        ("briq.cloud", "briqexecutors", "delete", ""),
        ("", "secrets", "get", ""),
        ("", "secrets", "patch", ""),
        ("events.k8s.io", "events", "create", ""),
        ("events.k8s.io", "events", "patch", ""),
    ]);
    assert_eq!(grants(&cluster_role["rules"]), set(&expected));
    assert!(cluster_role.get("aggregationRule").is_none());

    assert_eq!(
        grants(&named("ClusterRole", "rbac-briq-operator-classes")["rules"]),
        set(&[
            ("briq.cloud", "briqexecutorclasses", "get", ""),
            ("briq.cloud", "briqexecutorclasses", "list", ""),
            ("briq.cloud", "briqexecutorclasses", "watch", ""),
            ("briq.cloud", "briqexecutorclasses/status", "patch", ""),
            ("", "namespaces", "get", ""),
        ])
    );
    let class_keys = named("Role", "rbac-briq-operator-class-keys");
    assert_eq!(
        grants(&class_keys["rules"]),
        set(&[("", "secrets", "get", "")])
    );
    assert_eq!(class_keys["metadata"]["namespace"], "briq-system");

    let role = named("Role", "rbac-briq-operator-leader-election");
    assert_eq!(
        grants(&role["rules"]),
        set(&[
            ("coordination.k8s.io", "leases", "create", ""),
            ("coordination.k8s.io", "leases", "get", "rbac-briq-operator"),
            (
                "coordination.k8s.io",
                "leases",
                "patch",
                "rbac-briq-operator"
            ),
        ])
    );
    assert_eq!(role["metadata"]["namespace"], "briq-system");

    // The aggregated API: the front proxy's ConfigMap and SubjectAccessReviews, through the
    // built-in roles kube-apiserver makes for aggregated API servers.
    let account = json!([{
        "kind": "ServiceAccount", "name": "rbac-briq-operator", "namespace": "briq-system"
    }]);
    let reader = named("RoleBinding", "rbac-briq-operator-authentication-reader");
    assert_eq!(reader["metadata"]["namespace"], "kube-system");
    assert_eq!(
        reader["roleRef"],
        json!({
            "apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
            "name": "extension-apiserver-authentication-reader"
        })
    );
    assert_eq!(reader["subjects"], account);
    let delegator = named("ClusterRoleBinding", "rbac-briq-operator-auth-delegator");
    assert_eq!(
        delegator["roleRef"],
        json!({
            "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
            "name": "system:auth-delegator"
        })
    );
    assert_eq!(delegator["subjects"], account);
    // No other source of SubjectAccessReviews or ConfigMaps among the chart's own roles.
    for kind in ["ClusterRole", "Role"] {
        for role in ops::find(&documents, kind) {
            assert!(
                grants(&role["rules"])
                    .iter()
                    .all(|(group, resource, _, _)| {
                        group != "authorization.k8s.io" && resource != "configmaps"
                    }),
                "{kind} {}",
                role["metadata"]["name"]
            );
        }
    }
    // Users: view, edit and admin get an Execution's output, and nothing else from this role.
    let log = named("ClusterRole", "rbac-briq-operator-execution-log");
    assert_eq!(
        grants(&log["rules"]),
        set(&[("subresources.briq.cloud", "executions/log", "get", "")])
    );
    // Edit and admin (not view) read and write an executor's files.
    let files = named("ClusterRole", "rbac-briq-operator-executor-files");
    assert_eq!(
        grants(&files["rules"]),
        set(&[
            ("subresources.briq.cloud", "briqexecutors/files", "get", ""),
            (
                "subresources.briq.cloud",
                "briqexecutors/files",
                "update",
                ""
            ),
        ])
    );
    let labels = &files["metadata"]["labels"];
    assert_eq!(
        labels["rbac.authorization.k8s.io/aggregate-to-edit"],
        "true"
    );
    assert_eq!(
        labels["rbac.authorization.k8s.io/aggregate-to-admin"],
        "true"
    );
    assert!(labels["rbac.authorization.k8s.io/aggregate-to-view"].is_null());
    // View, edit and admin reach the MCP endpoint; its tools then ask for the right each uses.
    let mcp = named("ClusterRole", "rbac-briq-operator-mcp");
    assert_eq!(
        grants(&mcp["rules"]),
        set(&[
            ("subresources.briq.cloud", "mcp", "create", ""),
            ("subresources.briq.cloud", "mcp", "deletecollection", ""),
        ])
    );
    for aggregate in ["view", "edit", "admin"] {
        for role in [&log, &mcp] {
            assert_eq!(
                role["metadata"]["labels"]
                    [format!("rbac.authorization.k8s.io/aggregate-to-{aggregate}")],
                "true"
            );
        }
    }
    assert!(
        ops::find(
            &ops::template(
                "rbac",
                "briq-system",
                &[
                    "--set",
                    "leaderElection.enabled=false",
                    "--set",
                    "replicas=1"
                ]
            ),
            "Role"
        )
        .iter()
        .all(|role| role["metadata"]["name"] != "rbac-briq-operator-leader-election")
    );
}

#[tokio::test]
async fn the_controllers_work_as_the_charts_service_account_and_nothing_more_is_allowed() {
    let env = TestEnv::new("chart-rbac").await;
    let release = format!("rbac-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let fullname = format!("{release}-briq-operator");
    // Only the RBAC objects (the Deployment would never start without a kubelet anyway).
    let documents = ops::template(&release, &env.namespace, &[]);
    let rbac: Vec<String> = documents
        .iter()
        .filter(|d| {
            [
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
            ]
            .contains(&d["kind"].as_str().unwrap())
        })
        .map(|d| format!("---\n{}", serde_yaml_ng::to_string(d).unwrap()))
        .collect();
    ops::apply(&env, &rbac.concat(), "helm-chart-test");
    // And the admission policy (confined to this namespace): the operator's own writes of its
    // annotations, status and finalizer pass it.
    let mut documents = documents;
    ops::confine_admission_policy(&mut documents, &env.namespace);
    let policy: Vec<&Value> = ops::admission_objects(&documents);
    let mut names: Vec<String> = policy
        .iter()
        .map(|d| {
            format!(
                "{} {}",
                d["kind"].as_str().unwrap(),
                d["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            format!("ValidatingAdmissionPolicy {fullname}-executor-class"),
            format!("ValidatingAdmissionPolicy {fullname}-operator-fields"),
            format!("ValidatingAdmissionPolicy {fullname}-pool-class"),
            format!("ValidatingAdmissionPolicyBinding {fullname}-executor-class"),
            format!("ValidatingAdmissionPolicyBinding {fullname}-operator-fields"),
            format!("ValidatingAdmissionPolicyBinding {fullname}-pool-class"),
        ]
    );
    ops::apply(&env, &ops::yaml(&policy), "helm-chart-test");
    ops::admission_policy_effective(&env).await;
    let user = format!("system:serviceaccount:{}:{fullname}", env.namespace);

    // What the role must not allow, asked of the API server's authorizer.
    let ns = env.namespace.as_str();
    let denied: &[(&str, &str, &str, &str)] = &[
        ("update", "briq.cloud", "briqexecutors", "py"),
        ("create", "briq.cloud", "briqexecutorpools", ""),
        ("delete", "briq.cloud", "briqexecutorpools", "fast"),
        ("patch", "briq.cloud", "briqexecutorpools", "fast"),
        ("update", "briq.cloud", "executions", "x"),
        ("deletecollection", "briq.cloud", "executions", ""),
        ("update", "briq.cloud", "briqexecutors/status", "py"),
        ("update", "briq.cloud", "executions/finalizers", "x"),
        ("list", "", "secrets", ""),
        ("watch", "", "secrets", ""),
        ("create", "", "secrets", ""),
        ("update", "", "secrets", "briq-key"),
        ("get", "", "configmaps", "x"),
        ("get", "", "pods", "x"),
        ("list", "", "namespaces", ""),
        ("update", "", "namespaces", ns),
        ("create", "briq.cloud", "briqexecutorclasses", ""),
        ("patch", "briq.cloud", "briqexecutorclasses", "standard"),
        (
            "update",
            "briq.cloud",
            "briqexecutorclasses/status",
            "standard",
        ),
        ("create", "", "events", ""),
        ("delete", "events.k8s.io", "events", "x"),
        ("list", "events.k8s.io", "events", ""),
        (
            "get",
            "coordination.k8s.io",
            "leases",
            "someone-elses-lease",
        ),
        (
            "patch",
            "coordination.k8s.io",
            "leases",
            "someone-elses-lease",
        ),
        ("delete", "coordination.k8s.io", "leases", &fullname),
        ("update", "coordination.k8s.io", "leases", &fullname),
        ("list", "coordination.k8s.io", "leases", ""),
        ("create", "", "serviceaccounts/token", &fullname),
        ("impersonate", "", "users", "admin"),
        (
            "get",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "executions.briq.cloud",
        ),
    ];
    for (verb, group, resource, name) in denied {
        assert!(
            !support::may(&env.client, &user, ns, verb, group, resource, name).await,
            "{verb} {group}/{resource} {name} is allowed"
        );
    }
    for (verb, group, resource, name) in [
        ("watch", "briq.cloud", "executions", ""),
        ("patch", "briq.cloud", "executions/status", "x"),
        // Pools make and replace their members.
        ("create", "briq.cloud", "briqexecutors", ""),
        ("delete", "briq.cloud", "briqexecutors", "fast-x1"),
        ("watch", "briq.cloud", "briqexecutorpools", ""),
        ("patch", "briq.cloud", "briqexecutorpools/status", "fast"),
        ("delete", "briq.cloud", "executions", "x"),
        // MCP's run_python, for a caller a SubjectAccessReview found may do it themselves.
        ("create", "briq.cloud", "executions", ""),
        ("get", "", "secrets", "briq-key"),
        ("patch", "", "secrets", "briq-key"),
        ("create", "events.k8s.io", "events", ""),
        ("patch", "coordination.k8s.io", "leases", fullname.as_str()),
        ("watch", "briq.cloud", "briqexecutorclasses", ""),
        // A class says whether briq's interface matches with its key.
        (
            "patch",
            "briq.cloud",
            "briqexecutorclasses/status",
            "standard",
        ),
        ("get", "", "namespaces", ns),
    ] {
        assert!(
            support::may(&env.client, &user, ns, verb, group, resource, name).await,
            "{verb} {group}/{resource} is denied"
        );
    }
    // The aggregated API: how the front proxy calls (one ConfigMap of kube-system, nothing else
    // there) and a SubjectAccessReview per request (cluster-scoped).
    for (allowed, namespace, verb, group, resource, name) in [
        (
            true,
            "kube-system",
            "get",
            "",
            "configmaps",
            "extension-apiserver-authentication",
        ),
        (
            false,
            "kube-system",
            "get",
            "",
            "configmaps",
            "kubeadm-config",
        ),
        (
            false,
            "kube-system",
            "update",
            "",
            "configmaps",
            "extension-apiserver-authentication",
        ),
        (false, "kube-system", "list", "", "configmaps", ""),
        (
            true,
            "",
            "create",
            "authorization.k8s.io",
            "subjectaccessreviews",
            "",
        ),
        (
            false,
            "",
            "create",
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            "",
        ),
        // It reads Executions itself; it is no user of its own API.
        (
            false,
            ns,
            "get",
            "subresources.briq.cloud",
            "executions/log",
            "x",
        ),
    ] {
        assert_eq!(
            support::may(&env.client, &user, namespace, verb, group, resource, name).await,
            allowed,
            "{verb} {group}/{resource} {name} in {namespace:?}"
        );
    }

    // The e2e flow with a client impersonating the ServiceAccount: leader election, an executor
    // whose key is in a Secret, Executions with history pruning, Events, deletion.
    let server = ops::sandbox_server().await;
    let mut config = ops::kube_config(&env).await;
    config.auth_info.impersonate = Some(user.clone());
    let impersonated = briq_operator::kube_client::client(config.clone()).unwrap();
    let listed = Api::<Secret>::namespaced(impersonated, ns)
        .list(&ListParams::default())
        .await;
    assert!(
        matches!(&listed, Err(kube::Error::Api(status)) if status.code == 403),
        "the client acts as the ServiceAccount, which may not list Secrets: {listed:?}"
    );
    let mut settings = ops::settings(&env, &server);
    settings.default_api_key = None;
    let mut operator = Instance::start(
        config,
        &server,
        settings,
        Some(ops::lease(&env, &fullname, "rbac-test")),
    )
    .await
    .unwrap();
    until(
        Duration::from_secs(30),
        "the impersonated operator leads",
        || operator.leading(),
    )
    .await;

    support::create_api_key_secret(&env, "briq-key", server.api_key().expose(), true).await;
    create_executor(
        &env,
        "py",
        json!({ "apiKeySecretRef": { "name": "briq-key" }, "executionHistoryLimit": 1 }),
    )
    .await;
    support::wait_ready(&env, "py").await;
    create_execution(&env, "one", "py", "x = 1").await;
    assert_eq!(reason(&finished(&env, "one", 60).await), "Completed");
    create_execution(&env, "two", "py", "x + 1").await;
    let two = finished(&env, "two", 60).await;
    assert_eq!(support::output(&two), "2");
    wait_deleted(&env.api::<Execution>(), "one", 30).await; // pruned: executionHistoryLimit 1

    env.api::<BriqExecutor>()
        .delete("py", &DeleteParams::default())
        .await
        .unwrap();
    wait_deleted(&env.api::<BriqExecutor>(), "py", 60).await;
    let stats = server.admin().stats().await.unwrap();
    assert!(
        stats.sandboxes.is_empty(),
        "the finalizer destroyed the sandbox"
    );
    assert_eq!(stats.calls(Operation::Create), 1);

    let events = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let reasons: BTreeSet<String> = events
        .items
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect();
    for expected in ["SandboxCreated", "Ready", "SandboxDestroyed"] {
        assert!(
            reasons.contains(expected),
            "event {expected} published as the ServiceAccount: {reasons:?}"
        );
    }
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_user_with_the_view_role_may_read_an_executions_output_through_the_aggregated_api() {
    let env = TestEnv::new("chart-log-view").await;
    let release = format!("logs-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let documents = ops::template(&release, &env.namespace, &[]);
    // The chart's role aggregated into view, edit and admin. (This control plane runs no
    // clusterrole-aggregation controller: the user is bound to the chart's role itself.)
    let role = ops::find(&documents, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == format!("{release}-briq-operator-execution-log"))
        .expect("the chart's execution-log ClusterRole");
    assert_eq!(
        role["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"],
        "true"
    );
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": { "name": "viewer", "namespace": env.namespace },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
            "name": role["metadata"]["name"],
        },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "viewer" }],
    });
    ops::apply(&env, &ops::yaml(&[role, &binding]), "helm-chart-test");
    let ns = env.namespace.as_str();
    for (allowed, namespace, verb, group, resource) in [
        (true, ns, "get", "subresources.briq.cloud", "executions/log"),
        // Only where the role is bound, only get, only the log.
        (
            false,
            "elsewhere",
            "get",
            "subresources.briq.cloud",
            "executions/log",
        ),
        (
            false,
            ns,
            "create",
            "subresources.briq.cloud",
            "executions/log",
        ),
        (false, ns, "get", "briq.cloud", "executions/log"),
        (
            false,
            ns,
            "get",
            "subresources.briq.cloud",
            "briqexecutors/files",
        ),
        (false, ns, "get", "briq.cloud", "executions"),
        (false, ns, "get", "briq.cloud", "executions/status"),
    ] {
        assert_eq!(
            support::may(
                &env.client,
                "viewer",
                namespace,
                verb,
                group,
                resource,
                "step-1"
            )
            .await,
            allowed,
            "{verb} {group}/{resource} in {namespace}"
        );
    }
}

#[tokio::test]
async fn an_upgrade_keeps_the_charts_serving_certificate_and_the_ca_bundle() {
    let env = TestEnv::new("chart-keep-cert").await;
    let release = format!("keep-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let kubeconfig = env.kubeconfig.to_str().unwrap().to_owned();
    // What an install or upgrade renders: `lookup` reads the cluster (helm template answers it
    // with nothing otherwise). A dry run takes nothing over; --take-ownership only skips the
    // check that existing objects (this Secret, another test's APIService) belong to the release.
    let render = || {
        let documents = ops::template(
            &release,
            &env.namespace,
            &[
                "--dry-run=server",
                "--kubeconfig",
                &kubeconfig,
                "--take-ownership",
                "--show-only",
                "templates/subresources.yaml",
            ],
        );
        let secret = ops::find(&documents, "Secret")[0].clone();
        let ca_bundle = ops::find(&documents, "APIService")[0]["spec"]["caBundle"].clone();
        assert_eq!(
            ca_bundle, secret["data"]["ca.crt"],
            "the caBundle is the Secret's CA"
        );
        secret
    };
    let installed = render();
    assert_ne!(
        render()["data"],
        installed["data"],
        "nothing to keep yet: a new CA and certificate"
    );
    ops::apply(&env, &ops::yaml(&[&installed]), "helm");
    let upgraded = render();
    assert_eq!(
        upgraded["data"], installed["data"],
        "an upgrade keeps the CA, the certificate and its key"
    );

    // A Secret missing a part is made anew, whole.
    let mut partial = installed.clone();
    partial["data"]
        .as_object_mut()
        .unwrap()
        .remove("ca.crt")
        .unwrap();
    let name = partial["metadata"]["name"].as_str().unwrap().to_owned();
    let (ok, _, stderr) = env.kubectl(&["delete", &format!("secret/{name}")]);
    assert!(ok, "{stderr}");
    ops::apply(&env, &ops::yaml(&[&partial]), "helm");
    let renewed = render();
    for key in ["ca.crt", "tls.crt", "tls.key"] {
        assert_ne!(renewed["data"][key], installed["data"][key], "{key}");
    }
}
