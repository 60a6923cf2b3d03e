//! The Helm chart as rendered, no API server: `helm lint` with defaults and with every feature,
//! the values schema and the templates' own checks refusing bad values, the CRDs it ships, its
//! version, and the Deployment it renders (image, replicas spread over nodes and their disruption
//! budget, security context, probes, the arguments the operator accepts, environment) with its
//! metrics Service, ServiceMonitor and NetworkPolicy, and the aggregated API (APIService, its
//! Service, and a serving certificate its caBundle verifies, from Helm or cert-manager).

mod ops;
mod support;

use std::sync::Arc;

use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use briq_operator::bridge::session::{LONGEST_PROVISIONING, LONGEST_RUN};
use ops::ALL_FEATURES;
use rustls::{
    RootCertStore,
    client::{WebPkiServerVerifier, danger::ServerCertVerifier},
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject},
    sign::CertifiedKey,
};
use serde_json::{Value, json};

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
        (&["--set", "subresources.port=0"], "/subresources/port"),
        (
            &["--set", "subresources.certManager.issuerRef.kind=Secret"],
            "/subresources/certManager/issuerRef",
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
        (
            &["--set", "subresources.port=8080"],
            "subresources.port must differ from http.port",
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
    // Ingress: the HTTP port, and the aggregated API's port from anywhere (kube-apiserver's
    // address is not known to a policy).
    assert_eq!(
        policy["spec"]["ingress"],
        json!([
            { "ports": [{ "port": "http", "protocol": "TCP" }] },
            { "ports": [{ "port": "subresources", "protocol": "TCP" }] },
        ])
    );

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

/// The one document of `kind` named `name`.
fn named<'a>(documents: &'a [Value], kind: &str, name: &str) -> &'a Value {
    ops::find(documents, kind)
        .into_iter()
        .find(|d| d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name} is rendered"))
}

/// The PEM blocks of a base64 field (a Secret's data, a caBundle), as DER certificates.
fn certificates(base64_pem: &Value) -> Vec<CertificateDer<'static>> {
    let pem = BASE64
        .decode(base64_pem.as_str().expect("a base64 string"))
        .expect("base64");
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .expect("PEM certificates");
    assert!(!chain.is_empty(), "no certificate in {base64_pem}");
    chain
}

/// The DNS names of a certificate's subjectAltName extension.
fn dns_names(der: &[u8]) -> Vec<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).expect("an X.509 certificate");
    let names = cert
        .subject_alternative_name()
        .expect("one subjectAltName extension")
        .expect("a subjectAltName extension");
    names
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => Some(dns.to_string()),
            _ => None,
        })
        .collect()
}

/// The operator container's arguments.
fn operator_args(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_api_service_names_the_charts_service_and_its_ca_bundle_verifies_the_serving_certificate() {
    let documents = ops::template("ops", "briq-system", &[]);
    let api_service = named(&documents, "APIService", "v1alpha1.subresources.briq.cloud");
    let spec = &api_service["spec"];
    assert_eq!(spec["group"], "subresources.briq.cloud");
    assert_eq!(spec["version"], "v1alpha1");
    assert_eq!(spec["groupPriorityMinimum"], 1000);
    assert_eq!(spec["versionPriority"], 15);
    assert!(spec["insecureSkipTLSVerify"].is_null());
    assert_eq!(
        spec["service"],
        json!({ "namespace": "briq-system", "name": "ops-briq-operator-subresources", "port": 443 })
    );

    // The Service: port 443 to the operator's named container port, on every replica.
    let service = named(&documents, "Service", "ops-briq-operator-subresources");
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert_eq!(
        service["spec"]["ports"],
        json!([{ "name": "https", "port": 443, "targetPort": "subresources", "protocol": "TCP" }])
    );
    let deployment = ops::find(&documents, "Deployment")[0];
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert!(
        container["ports"]
            .as_array()
            .unwrap()
            .contains(&json!({ "name": "subresources", "containerPort": 8443, "protocol": "TCP" })),
        "{}",
        container["ports"]
    );

    // The operator serves the certificate of the Secret it mounts.
    let args = operator_args(deployment);
    for expected in [
        "--subresources-address=0.0.0.0:8443",
        "--subresources-cert-file=/etc/briq-operator/subresources/tls.crt",
        "--subresources-key-file=/etc/briq-operator/subresources/tls.key",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
    }
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/etc/briq-operator/subresources")
        .expect("the certificate's mount");
    assert_eq!(mount["readOnly"], true);
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the certificate's volume");
    assert_eq!(
        volume["secret"]["secretName"],
        "ops-briq-operator-subresources-tls"
    );
    let secret = named(&documents, "Secret", "ops-briq-operator-subresources-tls");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(secret["metadata"]["namespace"], "briq-system");

    // kube-apiserver checks the certificate for <service>.<namespace>.svc against the caBundle.
    let host = "ops-briq-operator-subresources.briq-system.svc";
    let ca = certificates(&spec["caBundle"]);
    assert_eq!(
        ca,
        certificates(&secret["data"]["ca.crt"]),
        "the Secret keeps the CA of the caBundle"
    );
    let chain = certificates(&secret["data"]["tls.crt"]);
    assert!(
        dns_names(&chain[0]).iter().any(|name| name == host),
        "{host} in {:?}",
        dns_names(&chain[0])
    );
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = RootCertStore::empty();
    for certificate in ca {
        roots.add(certificate).expect("a CA certificate");
    }
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .unwrap();
    verifier
        .verify_server_cert(
            &chain[0],
            &chain[1..],
            &ServerName::try_from(host).unwrap(),
            &[],
            UnixTime::now(),
        )
        .expect("the caBundle verifies the serving certificate for the Service's name");
    let wrong = ServerName::try_from("other.briq-system.svc").unwrap();
    assert!(
        verifier
            .verify_server_cert(&chain[0], &chain[1..], &wrong, &[], UnixTime::now())
            .is_err()
    );

    // And the key is the certificate's.
    let key = BASE64
        .decode(secret["data"]["tls.key"].as_str().unwrap())
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(&key).expect("a PEM private key");
    let certified = CertifiedKey::from_der(chain, key, &provider).expect("a usable key");
    certified
        .keys_match()
        .expect("the key matches the certificate");
}

#[test]
fn with_cert_manager_a_certificate_is_issued_and_its_ca_injected() {
    let documents = ops::template(
        "ops",
        "briq-system",
        &["--set", "subresources.certManager.enabled=true"],
    );
    assert!(
        ops::find(&documents, "Secret").is_empty(),
        "cert-manager writes the Secret, not the chart"
    );
    let api_service = named(&documents, "APIService", "v1alpha1.subresources.briq.cloud");
    assert!(api_service["spec"]["caBundle"].is_null());
    assert_eq!(
        api_service["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "briq-system/ops-briq-operator-subresources"
    );
    let certificate = named(&documents, "Certificate", "ops-briq-operator-subresources");
    assert_eq!(certificate["apiVersion"], "cert-manager.io/v1");
    assert_eq!(
        certificate["spec"]["secretName"], "ops-briq-operator-subresources-tls",
        "the Secret the operator mounts"
    );
    let dns: Vec<&str> = certificate["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        dns.contains(&"ops-briq-operator-subresources.briq-system.svc"),
        "{dns:?}"
    );
    // No issuer given: a self-signed root, a CA from it, and the CA's Issuer signs.
    assert_eq!(
        certificate["spec"]["issuerRef"],
        json!({ "name": "ops-briq-operator-subresources-ca", "kind": "Issuer", "group": "cert-manager.io" })
    );
    let ca_issuer = named(&documents, "Issuer", "ops-briq-operator-subresources-ca");
    assert_eq!(
        ca_issuer["spec"]["ca"]["secretName"],
        "ops-briq-operator-subresources-ca"
    );
    let ca = named(
        &documents,
        "Certificate",
        "ops-briq-operator-subresources-ca",
    );
    assert_eq!(ca["spec"]["isCA"], true);
    assert_eq!(
        ca["spec"]["secretName"],
        "ops-briq-operator-subresources-ca"
    );
    assert_eq!(
        ca["spec"]["issuerRef"]["name"],
        "ops-briq-operator-subresources-selfsigned"
    );
    let root = named(
        &documents,
        "Issuer",
        "ops-briq-operator-subresources-selfsigned",
    );
    assert_eq!(root["spec"]["selfSigned"], json!({}));

    // An issuer of the platform's: only the serving certificate, from it.
    let documents = ops::template(
        "ops",
        "briq-system",
        &[
            "--set",
            "subresources.certManager.enabled=true",
            "--set",
            "subresources.certManager.issuerRef.kind=ClusterIssuer",
            "--set",
            "subresources.certManager.issuerRef.name=internal-ca",
        ],
    );
    assert!(ops::find(&documents, "Issuer").is_empty());
    let certificates = ops::find(&documents, "Certificate");
    assert_eq!(certificates.len(), 1);
    assert_eq!(
        certificates[0]["spec"]["issuerRef"],
        json!({ "name": "internal-ca", "kind": "ClusterIssuer", "group": "cert-manager.io" })
    );
    assert!(ops::find(&documents, "Secret").is_empty());
}

#[test]
fn without_subresources_nothing_of_the_aggregated_api_renders() {
    let documents = ops::template(
        "ops",
        "briq-system",
        &[
            "--set",
            "subresources.enabled=false",
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
        ],
    );
    for kind in ["APIService", "Secret", "Certificate", "Issuer"] {
        assert!(ops::find(&documents, kind).is_empty(), "a {kind}");
    }
    for document in &documents {
        let name = document["metadata"]["name"].as_str().unwrap();
        assert!(
            !name.contains("subresources")
                && !name.ends_with("-authentication-reader")
                && !name.ends_with("-auth-delegator")
                && !name.ends_with("-execution-log")
                && !name.ends_with("-executor-files")
                && !name.ends_with("-mcp"),
            "{} {name}",
            document["kind"]
        );
        assert_ne!(document["metadata"]["namespace"], "kube-system");
    }
    let deployment = ops::find(&documents, "Deployment")[0];
    let args = operator_args(deployment);
    assert!(
        !args.iter().any(|a| a.starts_with("--subresources")),
        "{args:?}"
    );
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["ports"],
        json!([{ "name": "http", "containerPort": 8080, "protocol": "TCP" }])
    );
    assert_eq!(pod["volumes"].as_array().unwrap().len(), 1, "only /tmp");
    let policy = ops::find(&documents, "NetworkPolicy")[0];
    assert_eq!(
        policy["spec"]["ingress"],
        json!([{ "ports": [{ "port": "http", "protocol": "TCP" }] }])
    );
}
