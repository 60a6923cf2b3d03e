//! The aggregated API (`subresources.briq.cloud`) behind a real kube-apiserver's aggregation
//! layer: an action's output as it comes, through kube-apiserver's authentication and RBAC, and
//! nothing to a caller who is not the front proxy. One aggregated server and one operator (all
//! namespaces) serve the whole binary, as an APIService names one server.

mod support;

use std::{
    sync::{OnceLock, mpsc},
    time::Duration,
};

use briq_dev::{aggregated::AggregatedApi, control_plane::Signer, operators::Controllers};
use briq_operator::subresources;
use futures::{AsyncBufReadExt, TryStreamExt};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};
use support::*;

/// Starts, once per binary, the operator's controllers and its aggregated API (all namespaces),
/// on a runtime of their own; returns once kube-apiserver finds the APIService available.
fn aggregated() -> &'static AggregatedApi {
    static AGGREGATED: OnceLock<AggregatedApi> = OnceLock::new();
    AGGREGATED.get_or_init(|| {
        let (ready, started) = mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().expect("a runtime");
            runtime.block_on(async move {
                let plane = plane().expect("the test binary's own control plane");
                let admin = briq_dev::stack::client_for(plane.kubeconfig())
                    .await
                    .expect("an admin client");
                let server = sandbox_server().await;
                let settings = briq_dev::stack::settings(None, &server);
                let controllers = Controllers::start(admin.clone(), &server, settings.clone())
                    .expect("controllers");
                let api = AggregatedApi::start(&admin, plane, &server, settings)
                    .await
                    .expect("the aggregated API");
                ready.send(api).expect("the test waits");
                let _running = (server, controllers);
                std::future::pending::<()>().await;
            })
        });
        started.recv().expect("the aggregated API started")
    })
}

fn log_path(namespace: &str, name: &str, query: &str) -> String {
    format!(
        "/apis/{}/{}/namespaces/{namespace}/executions/{name}/log?{query}",
        subresources::GROUP,
        subresources::VERSION
    )
}

/// GET `path` through kube-apiserver as `client`: (status, body).
async fn get(client: &Client, path: &str) -> (u16, String) {
    let request = http::Request::get(path).body(Vec::new()).unwrap();
    match client.request_text(request).await {
        Ok(body) => (200, body),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(error) => panic!("GET {path}: {error}"),
    }
}

async fn ready_executor(env: &TestEnv) {
    create_executor(env, "py", json!({})).await;
    wait_ready(env, "py").await;
}

#[tokio::test]
async fn a_finished_execution_s_log_is_what_its_status_holds() {
    let _ = aggregated();
    let env = TestEnv::new("sub-finished").await;
    ready_executor(&env).await;
    let done = run(&env, "hello", "py", "print('hello')\nprint('world')").await;
    assert_eq!(reason(&done), "Completed");
    let (code, text) = get(&env.client, &log_path(&env.namespace, "hello", "")).await;
    assert_eq!((code, text.as_str()), (200, "hello\nworld\n"));
    let (code, json) = get(
        &env.client,
        &log_path(&env.namespace, "hello", "format=json"),
    )
    .await;
    assert_eq!(code, 200);
    let lines: Vec<Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines,
        vec![
            json!({"stream": "stdout", "text": "hello\nworld\n"}),
            json!({"end": "Completed"}),
        ]
    );
    let (code, message) = get(&env.client, &log_path(&env.namespace, "absent", "")).await;
    assert_eq!(code, 404, "{message}");
}

#[tokio::test]
async fn a_running_action_s_prints_reach_a_follower_before_the_action_ends() {
    let _ = aggregated();
    let env = TestEnv::new("sub-follow").await;
    ready_executor(&env).await;
    let gate = Gate::new();
    let code = format!(
        "print('first', flush=True)\nimport sys\nprint('warned', file=sys.stderr, flush=True)\n{}",
        gate.code("print('second')")
    );
    create_execution(&env, "live", "py", &code).await;
    let request = http::Request::get(log_path(&env.namespace, "live", "follow=true&format=json"))
        .body(Vec::new())
        .unwrap();
    let mut lines = env
        .client
        .request_stream(request)
        .await
        .expect("the log stream")
        .lines();
    let mut next = async || -> Value {
        let line = tokio::time::timeout(Duration::from_secs(120), lines.try_next())
            .await
            .expect("a line within the action's life")
            .expect("a readable stream")
            .expect("a line before the stream ends");
        serde_json::from_str(&line).expect("a JSON line")
    };
    assert_eq!(next().await, json!({"stream": "stdout", "text": "first\n"}));
    assert_eq!(
        next().await,
        json!({"stream": "stderr", "text": "warned\n"})
    );
    // The action cannot end before the gate opens: what came, came while it ran.
    let running = env
        .api::<briq_operator::crd::Execution>()
        .get("live")
        .await
        .unwrap();
    assert_eq!(reason(&running), "Running");
    gate.open();
    assert_eq!(
        next().await,
        json!({"stream": "stdout", "text": "second\n"})
    );
    assert_eq!(next().await, json!({"end": "Completed"}));
}

/// A Role of `verbs` on `resources` of `group`, bound to `user`, in `namespace`.
async fn grant(admin: &Client, namespace: &str, user: &str, group: &str, resources: &[&str]) {
    let name = format!("{user}-{}", group.replace('.', "-"));
    let apply = PatchParams::apply("briq-test").force();
    let role: Role = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": [{"apiGroups": [group], "resources": resources, "verbs": ["get"]}],
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), namespace)
        .patch(&name, &apply, &Patch::Apply(&role))
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .patch(&name, &apply, &Patch::Apply(&binding))
        .await
        .unwrap();
    // kube-apiserver's RBAC reads its own watch of roles: ask it until it knows the grant.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let resource = resources[0];
    while !may(admin, user, namespace, "get", group, resource, "").await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the API server never learnt the grant"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn client_as(user: &str) -> Client {
    let path = plane()
        .expect("the test binary's own control plane")
        .kubeconfig_for(user, &[])
        .expect("a kubeconfig");
    briq_dev::stack::client_for(&path).await.expect("a client")
}

#[tokio::test]
async fn a_user_allowed_get_executions_in_one_namespace_reads_no_log_of_another() {
    let _ = aggregated();
    let (mine, theirs) = (
        TestEnv::new("sub-mine").await,
        TestEnv::new("sub-theirs").await,
    );
    for env in [&mine, &theirs] {
        ready_executor(env).await;
        run(env, "step", "py", "print('secret of ' + __name__)").await;
    }
    let user = format!("alice-{:08x}", rand::random::<u32>());
    grant(
        &mine.client,
        &mine.namespace,
        &user,
        "briq.cloud",
        &["executions"],
    )
    .await;
    let alice = client_as(&user).await;
    // `get executions` alone is not the log.
    let (code, _) = get(&alice, &log_path(&mine.namespace, "step", "")).await;
    assert_eq!(code, 403);
    grant(
        &mine.client,
        &mine.namespace,
        &user,
        subresources::GROUP,
        &["executions/log"],
    )
    .await;
    let (code, text) = get(&alice, &log_path(&mine.namespace, "step", "")).await;
    assert_eq!((code, text.as_str()), (200, "secret of __main__\n"));
    let (code, message) = get(&alice, &log_path(&theirs.namespace, "step", "")).await;
    assert_eq!(code, 403, "{message}");
}

/// A client of the aggregated API's own port, with this client certificate, if any.
fn direct(aggregated: &AggregatedApi, identity: Option<(String, String)>) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(aggregated.ca_pem.as_bytes()).unwrap();
    let mut builder = reqwest::Client::builder()
        .tls_certs_only([ca])
        .timeout(Duration::from_secs(20));
    if let Some((cert, key)) = identity {
        let identity = reqwest::Identity::from_pem(format!("{cert}{key}").as_bytes()).unwrap();
        builder = builder.identity(identity);
    }
    builder.build().unwrap()
}

#[tokio::test]
async fn a_direct_call_without_the_front_proxy_certificate_is_refused() {
    let aggregated = aggregated();
    let env = TestEnv::new("sub-direct").await;
    ready_executor(&env).await;
    run(&env, "step", "py", "print('kept')").await;
    let plane = plane().unwrap();
    let url = format!(
        "https://{}{}",
        aggregated.address,
        log_path(&env.namespace, "step", "")
    );
    let as_admin = |client: &reqwest::Client| {
        client
            .get(&url)
            .header("X-Remote-User", "admin")
            .header("X-Remote-Group", "system:masters")
    };
    // No client certificate, or one of the cluster's CA (not the front proxy's): no TLS.
    assert!(as_admin(&direct(aggregated, None)).send().await.is_err());
    let cluster_signed = plane
        .client_certificate(briq_dev::control_plane::FRONT_PROXY_CLIENT, Signer::Cluster)
        .unwrap();
    assert!(
        as_admin(&direct(aggregated, Some(cluster_signed)))
            .send()
            .await
            .is_err()
    );
    // The front proxy's CA, another name than the API server's own.
    let other_name = plane
        .client_certificate("mallory", Signer::FrontProxy)
        .unwrap();
    let refused = as_admin(&direct(aggregated, Some(other_name)))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    // The front proxy's own certificate: the headers name the user, whose RBAC decides.
    let proxy = plane
        .client_certificate(
            briq_dev::control_plane::FRONT_PROXY_CLIENT,
            Signer::FrontProxy,
        )
        .unwrap();
    let proxy = direct(aggregated, Some(proxy));
    let nobody = proxy
        .get(&url)
        .header("X-Remote-User", "nobody")
        .send()
        .await
        .unwrap();
    assert_eq!(nobody.status(), 403);
    let admin = as_admin(&proxy).send().await.unwrap();
    assert_eq!(admin.status(), 200);
    assert_eq!(admin.text().await.unwrap(), "kept\n");

    // The MCP endpoint, with a forged user, straight to the operator's port: no TLS without
    // the front proxy's certificate, 401 with another name's; no session is opened.
    let mcp = format!(
        "https://{}/apis/{}/{}/namespaces/{}/mcp",
        aggregated.address,
        subresources::GROUP,
        subresources::VERSION,
        env.namespace
    );
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "forger"}}});
    let forged = |client: reqwest::Client| {
        client
            .post(&mcp)
            .header("X-Remote-User", "admin")
            .header("X-Remote-Group", "system:masters")
            .header("Accept", "application/json, text/event-stream")
            .json(&initialize)
            .send()
    };
    assert!(forged(direct(aggregated, None)).await.is_err());
    let cluster_signed = plane
        .client_certificate(briq_dev::control_plane::FRONT_PROXY_CLIENT, Signer::Cluster)
        .unwrap();
    assert!(
        forged(direct(aggregated, Some(cluster_signed)))
            .await
            .is_err()
    );
    let other_name = plane
        .client_certificate("mallory", Signer::FrontProxy)
        .unwrap();
    let refused = forged(direct(aggregated, Some(other_name))).await.unwrap();
    assert_eq!(refused.status(), 401);
    assert!(refused.headers().get("mcp-session-id").is_none());
}

#[tokio::test]
async fn exec_prints_each_line_while_the_action_runs_and_never_twice() {
    use tokio::io::AsyncBufReadExt as _;
    let _ = aggregated();
    let env = TestEnv::new("sub-cli").await;
    ready_executor(&env).await;
    let gate = Gate::new();
    let code = format!("print('first')\n{}", gate.code("print('second')"));
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_briq-operator"));
    command
        .env("KUBECONFIG", &env.kubeconfig)
        .env_remove("RUST_LOG")
        .args(["exec", "py", "-c", &code, "-n", &env.namespace, "--quiet"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("kubectl-briq exec");
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(120), stdout.next_line())
        .await
        .expect("the first line while the action runs")
        .unwrap();
    assert_eq!(first.as_deref(), Some("first"));
    // The gate is closed: the action is still running, so the line came live.
    let executions = env
        .api::<briq_operator::crd::Execution>()
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(reason(&executions.items[0]), "Running");
    gate.open();
    let mut rest = Vec::new();
    while let Some(line) = stdout.next_line().await.unwrap() {
        rest.push(line);
    }
    let status = child.wait().await.unwrap();
    assert!(status.success());
    assert_eq!(rest, ["second"], "the logs are not printed again");
    let name = executions.items[0].metadata.name.clone().unwrap();
    let logs = tokio::process::Command::new(env!("CARGO_BIN_EXE_briq-operator"))
        .env("KUBECONFIG", &env.kubeconfig)
        .args(["logs", "-f", &name, "-n", &env.namespace])
        .output()
        .await
        .unwrap();
    assert!(logs.status.success());
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "first\nsecond\n");
}

fn files_path(namespace: &str, executor: &str, path: &str) -> String {
    format!(
        "/apis/{}/{}/namespaces/{namespace}/briqexecutors/{executor}/files?path={path}",
        subresources::GROUP,
        subresources::VERSION
    )
}

/// PUT `body` to `path` through kube-apiserver as `client`: (status, body).
async fn put(client: &Client, path: &str, body: Vec<u8>) -> (u16, String) {
    let request = http::Request::put(path)
        .header(http::header::CONTENT_TYPE, "application/octet-stream")
        .body(body)
        .unwrap();
    match client.request_text(request).await {
        Ok(body) => (201, body),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(error) => panic!("PUT {path}: {error}"),
    }
}

async fn briq_cli(env: &TestEnv, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_briq-operator"))
        .env("KUBECONFIG", &env.kubeconfig)
        .env_remove("RUST_LOG")
        .args(args)
        .args(["-n", &env.namespace])
        .output()
        .await
        .unwrap()
}

#[tokio::test]
async fn cp_moves_a_file_of_several_parts_in_and_out_and_the_kernel_reads_it() {
    let _ = aggregated();
    let env = TestEnv::new("sub-cp").await;
    ready_executor(&env).await;
    let dir = tempfile::tempdir().unwrap();
    // Larger than one part either way (512 KiB), not a multiple of it.
    let data: Vec<u8> = (0..1_300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let local = dir.path().join("data.bin");
    std::fs::write(&local, &data).unwrap();
    let uploaded = briq_cli(
        &env,
        &["cp", local.to_str().unwrap(), "py:/tmp/in/data.bin"],
    )
    .await;
    assert!(uploaded.status.success(), "{uploaded:?}");
    let read = run(
        &env,
        "size",
        "py",
        "import hashlib\nb = open('/tmp/in/data.bin', 'rb').read()\nprint(len(b), hashlib.sha256(b).hexdigest())",
    )
    .await;
    let digest = format!("{:x}", <sha2::Sha256 as sha2::Digest>::digest(&data));
    let logs = read.status.as_ref().and_then(|s| s.logs.clone());
    assert_eq!(logs, Some(format!("{} {digest}\n", data.len())), "{read:?}");
    run(
        &env,
        "write",
        "py",
        "open('/tmp/out.bin', 'wb').write(bytes(range(256)) * 3000)",
    )
    .await;
    let downloaded = briq_cli(
        &env,
        &["cp", "py:/tmp/out.bin", dir.path().to_str().unwrap()],
    )
    .await;
    assert!(downloaded.status.success(), "{downloaded:?}");
    let expected: Vec<u8> = (0..=255u8).cycle().take(256 * 3000).collect();
    assert_eq!(std::fs::read(dir.path().join("out.bin")).unwrap(), expected);
}

#[tokio::test]
async fn a_path_to_the_bridges_own_files_a_missing_file_or_one_over_the_cap_moves_nothing() {
    let _ = aggregated();
    let env = TestEnv::new("sub-files-bad").await;
    ready_executor(&env).await;
    let ns = env.namespace.as_str();
    let journal = files_path(ns, "py", "/work/.briq/journal");
    let (code, message) = get(&env.client, &journal).await;
    assert_eq!(code, 403, "{message}");
    let bridge = files_path(ns, "py", "/work/.briq/bridge.py");
    let (code, message) = put(&env.client, &bridge, b"print('owned')".to_vec()).await;
    assert_eq!(code, 403, "{message}");
    let (code, message) = get(&env.client, &files_path(ns, "py", "/tmp/absent")).await;
    assert_eq!(code, 404, "{message}");
    let (code, message) = get(&env.client, &files_path(ns, "py", "relative/x")).await;
    assert_eq!(code, 400, "{message}");
    // A name that is not UTF-8 (a lone 0xFF byte, percent-encoded).
    let (code, message) = get(&env.client, &files_path(ns, "py", "/tmp/%FF")).await;
    assert_eq!(code, 400, "{message}");
    let over = vec![0u8; subresources::MAX_FILE_BYTES as usize + 1];
    let (code, message) = put(&env.client, &files_path(ns, "py", "/tmp/big"), over).await;
    assert_eq!(code, 413, "{message}");
    let (code, _) = get(&env.client, &files_path(ns, "py", "/tmp/big")).await;
    assert_eq!(code, 404, "nothing was written");
    let (code, message) = get(&env.client, &files_path(ns, "absent", "/tmp/x")).await;
    assert_eq!(code, 404, "{message}");
}

#[tokio::test]
async fn a_user_who_may_read_logs_moves_no_file_and_a_suspended_executor_none_either() {
    let _ = aggregated();
    let env = TestEnv::new("sub-files-rbac").await;
    ready_executor(&env).await;
    let ns = env.namespace.as_str();
    let user = format!("viewer-{:08x}", rand::random::<u32>());
    grant(
        &env.client,
        ns,
        &user,
        subresources::GROUP,
        &["executions/log"],
    )
    .await;
    let viewer = client_as(&user).await;
    let path = files_path(ns, "py", "/tmp/planted");
    let (code, message) = put(&viewer, &path, b"x".to_vec()).await;
    assert_eq!(code, 403, "{message}");
    let (code, _) = get(&env.client, &path).await;
    assert_eq!(code, 404, "nothing was written");
    env.api::<briq_operator::crd::BriqExecutor>()
        .patch(
            "py",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": true}})),
        )
        .await
        .unwrap();
    let (code, message) = put(&env.client, &path, b"x".to_vec()).await;
    assert_eq!(code, 409, "{message}");
    assert!(message.contains("suspended"), "{message}");
}

#[tokio::test]
async fn a_flood_of_output_is_cut_live_and_ends_with_the_tail_the_status_keeps() {
    let _ = aggregated();
    let env = TestEnv::new("sub-flood").await;
    ready_executor(&env).await;
    // 100 MB of output, then a last line: the live view stops early, the status keeps head and
    // tail, and a follower reads the live head, the cut, then the status's tail.
    let code = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1_000_000)\nprint('\\nlast line')";
    create_execution(&env, "flood", "py", code).await;
    let request = http::Request::get(log_path(&env.namespace, "flood", "follow=true&format=json"))
        .body(Vec::new())
        .unwrap();
    let lines = env
        .client
        .request_stream(request)
        .await
        .expect("the log stream")
        .lines();
    let pieces: Vec<Value> =
        tokio::time::timeout(Duration::from_secs(180), lines.try_collect::<Vec<String>>())
            .await
            .expect("the stream ends with the action")
            .expect("a readable stream")
            .iter()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
    let text: usize = pieces
        .iter()
        .filter_map(|p| p["text"].as_str())
        .map(|t| t.chars().count())
        .sum();
    let cut = pieces
        .iter()
        .position(|p| p.get("cut").is_some())
        .expect("a cut");
    assert_eq!(pieces.last(), Some(&json!({"end": "Completed"})));
    let tail = pieces[pieces.len() - 2]["text"].as_str().unwrap();
    assert!(
        tail.ends_with("\nlast line\n"),
        "the status's tail comes last"
    );
    assert!(cut < pieces.len() - 2);
    // The live head (16,384) and the status's tail (under half the 65,536 budget): bounded.
    assert!(text <= 16_384 + 32_768, "{text} characters streamed");
}

/// The leaf certificate the aggregated API at `address` presents to kube-apiserver's front
/// proxy (DER).
async fn presented(address: std::net::SocketAddr, ca_pem: &str) -> Vec<u8> {
    let plane = plane().unwrap();
    let proxy = plane
        .client_certificate(
            briq_dev::control_plane::FRONT_PROXY_CLIENT,
            Signer::FrontProxy,
        )
        .unwrap();
    let identity = reqwest::Identity::from_pem(format!("{}{}", proxy.0, proxy.1).as_bytes());
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap()])
        .identity(identity.unwrap())
        .tls_info(true)
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let answer = client
        .get(format!("https://{address}/healthz"))
        .header("X-Remote-User", "admin")
        .send()
        .await
        .unwrap();
    let info = answer.extensions().get::<reqwest::tls::TlsInfo>().unwrap();
    info.peer_certificate().unwrap().to_vec()
}

fn leaf_der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

#[tokio::test]
async fn a_renewed_serving_certificate_is_served_without_a_restart() {
    let plane = plane().unwrap();
    let admin = briq_dev::stack::client_for(plane.kubeconfig())
        .await
        .unwrap();
    let server = sandbox_server().await;
    let dir = tempfile::tempdir().unwrap();
    let files = subresources::CertificateFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
        every: Duration::from_millis(100),
    };
    let (cert, key, ca) = plane.serving_certificate("renewed.example").unwrap();
    std::fs::write(&files.cert, &cert).unwrap();
    std::fs::write(&files.key, &key).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let sandboxes = briq_operator::briq::BriqClient::new(
        briq_operator::briq::ClientOptions::local(server.url()),
    )
    .unwrap();
    let keys = briq_operator::controller::ExecutorKeys::start(
        admin.clone(),
        sandboxes,
        briq_dev::stack::settings(None, &server),
    );
    let proxy = subresources::FrontProxy::from_cluster(admin).await.unwrap();
    let serving = subresources::Serving {
        listener,
        cert_pem: cert.clone(),
        key_pem: key,
        files: Some(files.clone()),
    };
    let serve = tokio::spawn(subresources::serve(serving, keys, proxy));
    assert_eq!(presented(address, &ca).await, leaf_der(&cert));

    // cert-manager renews it: the Secret's files change under the running server.
    let (renewed, renewed_key, _) = plane.serving_certificate("renewed.example").unwrap();
    std::fs::write(&files.key, &renewed_key).unwrap();
    std::fs::write(&files.cert, &renewed).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while presented(address, &ca).await != leaf_der(&renewed) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the renewed certificate was not served within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    serve.abort();
}

#[test]
fn a_half_written_or_mismatched_certificate_pair_keeps_the_one_served() {
    let plane = plane().unwrap();
    let (cert, key, _) = plane.serving_certificate("kept.example").unwrap();
    let (other, other_key, _) = plane.serving_certificate("kept.example").unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let pem = |cert: &str, key: &str| subresources::Pem {
        cert: cert.to_owned(),
        key: key.to_owned(),
    };
    let serving = subresources::ServingCertificate::new(pem(&cert, &key), provider).unwrap();
    // The new certificate beside the old key (the key not rewritten yet), a truncated file.
    assert!(serving.offer(pem(&other, &key)).is_err());
    assert!(serving.offer(pem(&cert[..cert.len() / 2], &key)).is_err());
    assert!(serving.offer(pem("", &key)).is_err());
    assert_eq!(
        serving.offer(pem(&cert, &key)),
        Ok(false),
        "still the first"
    );
    assert_eq!(serving.offer(pem(&other, &other_key)), Ok(true));
}
