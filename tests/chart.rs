//! The Helm chart: lint, template, values schema, the rendered manifests applied to the real
//! kube-apiserver, and RBAC proven by running the controllers as the chart's ServiceAccount.

mod ops;
mod support;

use std::{collections::BTreeSet, time::Duration};

use briq_dev::local_server::Operation;
use briq_operator::bridge::session::{LONGEST_PROVISIONING, LONGEST_RUN};
use briq_operator::crd::{BriqExecutor, Execution};
use k8s_openapi::api::{core::v1::Secret, events::v1::Event};
use kube::{
    Api,
    api::{DeleteParams, ListParams},
};
use ops::{Instance, until};
use serde_json::{Value, json};
use support::{TestEnv, create_execution, create_executor, finished, reason, wait_deleted};

/// Every feature of the chart switched on.
const ALL_FEATURES: &[&str] = &[
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
];

#[test]
fn the_chart_ships_the_generated_crds() {
    let generated = std::fs::read_to_string(support::repo_root().join("crds/briq.cloud.yaml"))
        .expect("crds/briq.cloud.yaml");
    let shipped = std::fs::read_to_string(ops::chart_dir().join("crds/briq.cloud.yaml"))
        .expect("charts/briq-operator/crds/briq.cloud.yaml");
    assert!(
        generated == shipped,
        "charts/briq-operator/crds/briq.cloud.yaml differs from crds/briq.cloud.yaml: \
         cp crds/briq.cloud.yaml charts/briq-operator/crds/"
    );
    let (ok, stdout, stderr) = ops::helm(&["show", "crds", ops::chart_dir().to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("name: briqexecutors.briq.cloud")
            && stdout.contains("name: executions.briq.cloud")
    );
}

#[test]
fn helm_lint_passes_with_defaults_and_with_every_feature() {
    let chart = ops::chart_dir();
    let chart = chart.to_str().unwrap();
    for extra in [&[][..], ALL_FEATURES] {
        let mut args = vec!["lint", "--strict", chart];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = ops::helm(&args);
        assert!(ok, "helm lint {extra:?}:\n{stdout}\n{stderr}");
    }
}

#[test]
fn bad_values_fail_before_anything_is_installed() {
    let cases: &[(&[&str], &str)] = &[
        (&["--set", "replicas=-1"], "/replicas"),
        (&["--set", "replicas=two"], "/replicas"),
        (&["--set", "log.format=xml"], "/log/format"),
        (&["--set", "briq.apiUrl=api.briq.cloud"], "/briq/apiUrl"),
        (
            &["--set", "image.pullPolicy=Sometimes"],
            "/image/pullPolicy",
        ),
        (&["--set", "image.repository="], "/image/repository"),
        (&["--set", "image.digest=latest"], "/image/digest"),
        (&["--set", "image.digest=sha256:abc"], "/image/digest"),
        (
            &["--set", "leaderElection.enabled=yes"],
            "/leaderElection/enabled",
        ),
        (
            &["--set", "leaderElection.leaseDurationSeconds=0"],
            "/leaderElection",
        ),
        (
            &["--set", "briq.apiKeySecret.name=Not_A_Name"],
            "/briq/apiKeySecret/name",
        ),
        (&["--set", "watchNamespace=UPPER"], "/watchNamespace"),
        (
            &["--set", "resources.requests.memory=lots"],
            "/resources/requests/memory",
        ),
        (
            &["--set", "terminationGracePeriodSeconds=5"],
            "/terminationGracePeriodSeconds",
        ),
        (
            &["--set", "networkPolicy.enabled=true"],
            "/networkPolicy/apiServer/cidrs",
        ),
        (
            &["--set", "networkPolicy.briqApi.cidrs={example.com}"],
            "/networkPolicy/briqApi/cidrs",
        ),
        (
            &["--set", "tracing.otlpEndpoint=otel-collector:4318"],
            "/tracing/otlpEndpoint",
        ),
        (&["--set", "tracing.sampler=sometimes"], "/tracing/sampler"),
        (
            &[
                "--set",
                "networkPolicy.enabled=true",
                "--set",
                "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
                "--set",
                "tracing.otlpEndpoint=http://otel-collector:4318",
            ],
            "tracing.collector.to is required",
        ),
        (&["--set", "replica=3"], "additional properties 'replica'"),
        (
            &["--set", "serviceMonitor.interval=often"],
            "/serviceMonitor/interval",
        ),
        (
            &["--set", "admissionPolicy.enabled=yes"],
            "/admissionPolicy/enabled",
        ),
        // Checks the schema cannot express, made by the templates.
        (
            &["--kube-version", "1.29.0"],
            "admissionPolicy.enabled needs Kubernetes 1.30",
        ),
        (
            &["--set", "leaderElection.leaseGraceSeconds=15"],
            "leaseGraceSeconds must be less",
        ),
        (
            &[
                "--set",
                "replicas=2",
                "--set",
                "leaderElection.enabled=false",
            ],
            "needs leaderElection.enabled",
        ),
    ];
    let chart = ops::chart_dir();
    for (values, expected) in cases {
        let mut args = vec!["template", "bad", chart.to_str().unwrap()];
        args.extend_from_slice(values);
        let (ok, _, stderr) = ops::helm(&args);
        assert!(!ok, "{values:?} was accepted");
        assert!(
            stderr.contains(expected),
            "{values:?}: expected {expected:?} in:\n{stderr}"
        );
    }
}

#[test]
fn a_drain_evicts_at_most_one_replica_at_a_time() {
    let documents = ops::template("ops", "briq-system", &[]);
    let deployment = ops::find(&documents, "Deployment")[0];
    let budgets = ops::find(&documents, "PodDisruptionBudget");
    assert_eq!(budgets.len(), 1, "two replicas by default get a budget");
    assert_eq!(budgets[0]["spec"]["maxUnavailable"], 1);
    assert_eq!(
        budgets[0]["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"],
        "the budget selects the operator's pods"
    );
    for single in [
        &["--set", "replicas=1"][..],
        &["--set", "podDisruptionBudget.enabled=false"],
    ] {
        let documents = ops::template("ops", "briq-system", single);
        assert!(
            ops::find(&documents, "PodDisruptionBudget").is_empty(),
            "{single:?}"
        );
    }
}

#[test]
fn the_chart_is_versioned_with_the_crate() {
    let chart: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(ops::chart_dir().join("Chart.yaml")).unwrap(),
    )
    .unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart["version"], version, "Chart.yaml version");
    assert_eq!(chart["appVersion"], version, "Chart.yaml appVersion");
}

/// The operator container's image as rendered with `values`.
fn rendered_image(values: &[&str]) -> String {
    let documents = ops::template("ops", "briq-system", values);
    let deployment = ops::find(&documents, "Deployment")[0];
    deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .expect("an image")
        .to_owned()
}

#[test]
fn a_digest_pins_the_image_whatever_its_tag_points_at_later() {
    let digest = format!("sha256:{}", "ab".repeat(32));
    // The chart's appVersion is the crate's version (`the_chart_is_versioned_with_the_crate`).
    let app_version = env!("CARGO_PKG_VERSION");
    assert_eq!(rendered_image(&[]), format!("briq-operator:{app_version}"));
    assert_eq!(
        rendered_image(&["--set", "image.tag=edge"]),
        "briq-operator:edge"
    );
    let pinned = format!("image.digest={digest}");
    assert_eq!(
        rendered_image(&["--set", "image.tag=edge", "--set", &pinned]),
        format!("briq-operator@{digest}")
    );
}

#[test]
fn replicas_prefer_different_nodes_unless_the_values_say_where() {
    let affinity = |values: &[&str]| {
        let documents = ops::template("ops", "briq-system", values);
        ops::find(&documents, "Deployment")[0]["spec"]["template"]["spec"]["affinity"].clone()
    };
    let spread = affinity(&[]);
    let preferred = &spread["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(preferred.as_array().map(Vec::len), Some(1), "{spread}");
    let term = &preferred[0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    let documents = ops::template("ops", "briq-system", &[]);
    let deployment = ops::find(&documents, "Deployment")[0];
    assert_eq!(
        term["labelSelector"]["matchLabels"], deployment["spec"]["selector"]["matchLabels"],
        "it keeps the operator's own pods apart"
    );
    assert!(
        spread["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].is_null(),
        "soft: a one-node cluster still runs both replicas"
    );
    assert!(affinity(&["--set", "replicas=1"]).is_null());
    let given = affinity(&["--set", "affinity.nodeAffinity.example=kept"]);
    assert_eq!(given, json!({ "nodeAffinity": { "example": "kept" } }));
}

#[test]
fn the_deployment_runs_locked_down_with_probes_on_the_http_endpoints() {
    let documents = ops::template("ops", "briq-system", ALL_FEATURES);
    let deployment = ops::find(&documents, "Deployment")[0];
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    // A graceful shutdown finishes what runs: the longest provisioning and the longest
    // Execution, with room for their status writes and the lease's release.
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    let longest = LONGEST_PROVISIONING.max(LONGEST_RUN).as_secs();
    assert!(grace >= longest + 15, "{grace} s < {longest} s + 15 s");
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["privileged"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert!(container["resources"]["requests"]["memory"].is_string());
    assert!(container["resources"]["limits"]["memory"].is_string());
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["ports"][0]["containerPort"], 8080);

    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for expected in [
        "run",
        "--leader-election",
        "--log-format=json",
        "--http-address=0.0.0.0:8080",
        "--lease-name=ops-briq-operator",
    ] {
        assert!(args.contains(&expected), "{expected} in {args:?}");
    }
    let env = container["env"].as_array().unwrap();
    let var = |name: &str| {
        env.iter()
            .find(|v| v["name"] == name)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(var("BRIQ_API_URL")["value"], "https://api.briq.cloud/mcp");
    assert_eq!(var("RUST_LOG")["value"], "info");
    assert_eq!(
        var("BRIQ_API_KEY")["valueFrom"]["secretKeyRef"],
        json!({ "name": "briq-default-key", "key": "BRIQ_API_KEY" }),
        "the key comes from the Secret, never from values"
    );
    assert_eq!(
        var("POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert_eq!(
        var("OTEL_EXPORTER_OTLP_ENDPOINT")["value"],
        "http://otel-collector.observability:4318"
    );
    assert_eq!(
        var("OTEL_TRACES_SAMPLER")["value"],
        "parentbased_traceidratio"
    );
    assert_eq!(var("OTEL_TRACES_SAMPLER_ARG")["value"], "0.25");

    // The operator binary accepts exactly these arguments.
    let binary = env!("CARGO_BIN_EXE_briq-operator");
    let mut check = vec![args[0]];
    check.extend(&args[1..]);
    check.push("--help");
    let out = std::process::Command::new(binary)
        .args(&check)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "briq-operator {check:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The metrics Service and ServiceMonitor point at the named port.
    let service = ops::find(&documents, "Service")[0];
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "http");
    let monitor = ops::find(&documents, "ServiceMonitor")[0];
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "http");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");

    // Egress: API server, DNS, briq API, the trace collector — nothing else.
    let policy = ops::find(&documents, "NetworkPolicy")[0];
    let egress = policy["spec"]["egress"].as_array().unwrap();
    assert_eq!(egress.len(), 4);
    assert_eq!(egress[0]["to"][0]["ipBlock"]["cidr"], "10.0.0.1/32");
    assert_eq!(egress[1]["ports"][0]["port"], 53);
    assert_eq!(egress[2]["ports"][0]["port"], 443);
    assert_eq!(egress[3]["to"][0]["ipBlock"]["cidr"], "10.0.0.9/32");
    assert_eq!(egress[3]["ports"][0]["port"], 4318);

    // Without a default key the variable is absent, so executors must name their own Secret.
    let plain = ops::template("ops", "briq-system", &[]);
    let container =
        &ops::find(&plain, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0];
    assert!(
        !container["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "BRIQ_API_KEY")
    );
    assert!(
        ops::find(&plain, "ServiceMonitor").is_empty()
            && ops::find(&plain, "NetworkPolicy").is_empty()
    );
    // Traces are off unless an endpoint is given.
    assert!(
        !container["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"].as_str().unwrap().starts_with("OTEL_"))
    );
}

/// A stand-in for one of prometheus-operator's CRDs (any content accepted), so that the chart's
/// ServiceMonitor and PrometheusRule can be applied.
fn monitoring_crd(kind: &str) -> String {
    let plural = format!("{}s", kind.to_lowercase());
    format!(
        r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{ name: {plural}.monitoring.coreos.com }}
spec:
  group: monitoring.coreos.com
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
    ops::apply(&env, &monitoring_crd("ServiceMonitor"), "helm-chart-test");
    ops::apply(&env, &monitoring_crd("PrometheusRule"), "helm-chart-test");
    let (ok, _, stderr) = env.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
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
    ] {
        let (ok, _, stderr) = env.kubectl(&["get", &object]);
        assert!(ok, "{object}: {stderr}");
    }

    // Scoped to one namespace, the ClusterRole is bound there only.
    let scoped = format!("scoped-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let set = format!("watchNamespace={}", env.namespace);
    let yaml = ops::template_text(&scoped, &env.namespace, &["--set", &set]);
    let documents = ops::documents(&yaml);
    // Only classes and namespace labels (cluster-scoped) are read cluster-wide.
    let cluster_bindings = ops::find(&documents, "ClusterRoleBinding");
    assert_eq!(cluster_bindings.len(), 1);
    assert_eq!(
        cluster_bindings[0]["roleRef"]["name"],
        format!("{scoped}-briq-operator-classes")
    );
    assert_eq!(ops::find(&documents, "RoleBinding").len(), 3);
    ops::apply(&env, &yaml, "helm-chart-test");
    ops::admission_policy_effective(&env).await;
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
        ("create", "briq.cloud", "executions", ""),
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

const DASHBOARD: &str = "dashboards/briq-operator.json";
const ALERTS: &str = "alerts/briq-operator.rules.yaml";

/// Every series name the operator exports, from its own registry's text encoding: a counter
/// `x` is scraped as `x_total`, a histogram `x` as `x_bucket`, `x_sum` and `x_count`.
fn exported_metric_names() -> BTreeSet<String> {
    let text = briq_operator::metrics::Metrics::default().render();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(declared) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = declared.split_once(' ').expect("# TYPE name kind");
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            "gauge" => &[""],
            other => panic!("{name}: a metric of type {other}: teach this test its series"),
        };
        names.extend(suffixes.iter().map(|suffix| format!("{name}{suffix}")));
    }
    assert!(names.len() > 10, "{text}");
    names
}

/// Runs tests/promcheck with `args` and `stdin`; the metric names it prints, or its error.
fn promcheck(args: &[&str], stdin: &str) -> Result<BTreeSet<String>, String> {
    use std::io::Write;
    let mut child = std::process::Command::new(ops::tool("promcheck"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running promcheck (tests/tools/build.sh builds it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// A Grafana query with its variables replaced by something PromQL parses: `$__rate_interval`,
/// `$__interval`, `$__range` (and any `$__…`) by a duration, `$namespace`, `${pod}`, … by a
/// label value.
fn without_grafana_variables(query: &str) -> String {
    let mut out = String::new();
    let mut rest = query;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let braced = after.starts_with('{');
        let name_start = usize::from(braced);
        let name_len = after[name_start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len() - name_start);
        let name = &after[name_start..name_start + name_len];
        assert!(!name.is_empty(), "a lone $ in {query}");
        let mut end = name_start + name_len;
        if braced {
            assert!(after[end..].starts_with('}'), "unclosed ${{ in {query}");
            end += 1;
        }
        out.push_str(if name.starts_with("__") { "5m" } else { "x" });
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The PromQL of a dashboard: every panel target's `expr` (rows' panels too) and the selector
/// of every `label_values(selector, label)` variable query.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    fn walk(value: &Value, found: &mut Vec<String>) {
        match value {
            Value::Object(fields) => {
                if let Some(Value::Array(targets)) = fields.get("targets") {
                    for target in targets {
                        let expr = target["expr"].as_str().expect("a target without expr");
                        found.push(expr.to_owned());
                    }
                }
                fields.values().for_each(|v| walk(v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(&dashboard["panels"], &mut found);
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"]
            .as_str()
            .or(variable["query"].as_str())
            .expect("a query variable's query");
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable query {query}: only label_values(…) is checked"));
        let (selector, _label) = inner
            .rsplit_once(',')
            .expect("label_values(selector, label)");
        found.push(selector.trim().to_owned());
    }
    found
}

#[test]
fn every_metric_the_dashboard_and_alerts_name_is_one_the_operator_exports() {
    let chart = ops::chart_dir();
    let dashboard_text = std::fs::read_to_string(chart.join(DASHBOARD)).unwrap();
    let alerts_text = std::fs::read_to_string(chart.join(ALERTS)).unwrap();
    let dashboard: Value = serde_json::from_str(&dashboard_text).expect("the dashboard is JSON");
    let alerts: Value = serde_yaml_ng::from_str(&alerts_text).expect("the rule file is YAML");

    // The chart ships both files unchanged.
    let documents = ops::template(
        "obs",
        "briq-system",
        &[
            "--set",
            "grafanaDashboard.enabled=true",
            "--set",
            "prometheusRule.enabled=true",
            "--set-json",
            r#"prometheusRule.additionalRules=[{"alert":"Extra","expr":"up == 0","for":"5m"}]"#,
        ],
    );
    let configmap = ops::find(&documents, "ConfigMap");
    assert_eq!(configmap.len(), 1);
    assert_eq!(configmap[0]["metadata"]["labels"]["grafana_dashboard"], "1");
    assert!(
        configmap[0]["data"]["briq-operator.json"] == dashboard_text.as_str(),
        "the ConfigMap's briq-operator.json differs from {DASHBOARD}"
    );
    let rule = ops::find(&documents, "PrometheusRule");
    assert_eq!(rule.len(), 1);
    let groups = rule[0]["spec"]["groups"].as_array().unwrap();
    let shipped = alerts["groups"].as_array().unwrap();
    assert_eq!(&groups[..shipped.len()], &shipped[..], "{ALERTS} changed");
    assert_eq!(
        groups.len(),
        shipped.len() + 1,
        "the additional rules' group"
    );
    assert_eq!(groups[shipped.len()]["rules"][0]["alert"], "Extra");

    // Each alert says how urgent it is, what it means and what to do, after a while.
    let mut alert_names = Vec::new();
    for group in shipped {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().expect("only alerts");
            alert_names.push(name);
            assert!(rule["for"].is_string(), "{name}: for");
            for field in ["summary", "description", "runbook", "runbook_url"] {
                assert!(rule["annotations"][field].is_string(), "{name}: {field}");
            }
            assert!(
                ["info", "warning", "critical"]
                    .contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
                "{name}: severity"
            );
        }
    }
    assert!(alert_names.len() >= 5, "{alert_names:?}");

    // Prometheus' own parsers: the rule file as Prometheus loads it (strictly, every expr and
    // template too), the PrometheusRule's groups (with the additional rules) likewise, and the
    // dashboard's queries.
    let from_alerts = promcheck(&["rules", chart.join(ALERTS).to_str().unwrap()], "")
        .unwrap_or_else(|error| panic!("{ALERTS}: {error}"));
    let deployed = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    let spec = serde_yaml_ng::to_string(&rule[0]["spec"]).unwrap();
    std::fs::write(deployed.path(), spec).unwrap();
    promcheck(&["rules", deployed.path().to_str().unwrap()], "")
        .unwrap_or_else(|error| panic!("the PrometheusRule's groups: {error}"));
    let queries: Vec<String> = dashboard_queries(&dashboard)
        .iter()
        .map(|query| without_grafana_variables(query).replace('\n', " "))
        .collect();
    assert!(queries.len() >= 15, "{queries:#?}");
    let from_dashboard = promcheck(&["exprs"], &queries.join("\n"))
        .unwrap_or_else(|error| panic!("{DASHBOARD}: {error}"));
    assert!(promcheck(&["exprs"], "sum(rate(x[5m]").is_err());

    let exported = exported_metric_names();
    for (source, names) in [(ALERTS, &from_alerts), (DASHBOARD, &from_dashboard)] {
        assert!(!names.is_empty(), "{source} names no metric");
        let unknown: Vec<&String> = names.difference(&exported).collect();
        assert!(
            unknown.is_empty(),
            "{source} names metrics the operator does not export: {unknown:?}\nexported: {exported:#?}"
        );
    }
}

#[test]
fn grafana_variables_become_parseable_placeholders() {
    assert_eq!(
        without_grafana_variables(
            r#"rate(m{namespace=~"$namespace", pod=~"${pod}"}[$__rate_interval])"#
        ),
        r#"rate(m{namespace=~"x", pod=~"x"}[5m])"#
    );
}
