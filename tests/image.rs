//! The operator image (`images/operator`, `make image`) and the release artifacts that go through
//! registries: the image is reproducible and in step with its Dockerfile; image and chart go
//! through a real OCI registry (go-containerregistry's `registry`) unchanged; the image, pulled
//! back and unpacked, runs the operator from its own root filesystem as the ServiceAccount that
//! `install.yaml` created (no admin credentials anywhere) until the example of
//! docs/src/concepts.md succeeds; krew installs the plugin from its manifest.
//!
//! The tools (crane, registry, krew, the image's Debian packages) come from
//! `tests/tools/build.sh`; where they are absent, or this is not root (chroot), the tests that need
//! them say so and skip, except under `BRIQ_CI` (`.ci/run` builds them and runs as root).

mod ops;
mod support;

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

use briq_operator::crd::{BriqExecutor, Execution};
use serde_json::Value;
use support::{TestEnv, finished, output, reason, wait_deleted};

/// What `tests/tools/build.sh` adds for these tests, beside helm.
fn image_tools() -> Option<&'static Path> {
    let dir = ops::tools_dir();
    let present = ["crane", "registry", "krew"]
        .iter()
        .all(|tool| dir.join("bin").join(tool).is_file())
        && dir.join("debs/.complete").is_file();
    if present {
        Some(dir)
    } else {
        skip(&format!(
            "{} has no crane, registry, krew or debs/: run `bash tests/tools/build.sh` \
             (make test and .ci/run do)",
            dir.display()
        ))
    }
}

fn skip<T>(why: &str) -> Option<T> {
    if std::env::var_os("BRIQ_CI").is_some() {
        panic!("{why}; under BRIQ_CI nothing is skipped");
    }
    eprintln!("SKIPPED: {why}");
    None
}

fn run(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `images/operator/build.py` on this test binary's operator; returns the manifest's digest.
fn build_image(out: &Path) -> String {
    let _ = fs::remove_dir_all(out);
    let tools = image_tools().expect("image tools");
    let digest = run(Command::new("python3")
        .arg(support::repo_root().join("images/operator/build.py"))
        .args(["--binary", env!("CARGO_BIN_EXE_briq-operator"), "--debs"])
        .arg(tools.join("debs"))
        .arg("--out")
        .arg(out));
    digest.trim().to_owned()
}

/// One image per test binary (it takes seconds), rebuilt on every run.
fn image() -> &'static (PathBuf, String) {
    static IMAGE: OnceLock<(PathBuf, String)> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("operator-image");
        let digest = build_image(&dir);
        (dir, digest)
    })
}

fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    fs::read(layout.join("blobs/sha256").join(hex)).expect("blob")
}

fn describe() -> Value {
    serde_json::from_str(&run(Command::new("python3")
        .arg(support::repo_root().join("images/operator/build.py"))
        .arg("--describe")))
    .unwrap()
}

#[test]
fn a_rebuild_of_the_same_commit_is_the_same_image_and_its_sbom_names_every_package() {
    if image_tools().is_none() {
        return;
    }
    let (layout, digest) = image();
    let again = Path::new(env!("CARGO_TARGET_TMPDIR")).join("operator-image-again");
    assert_eq!(&build_image(&again), digest, "two builds, two digests");

    let index: Value =
        serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
    assert_eq!(index["manifests"][0]["digest"], digest.as_str());
    let manifest: Value = serde_json::from_slice(&blob(layout, digest)).unwrap();
    let config: Value = serde_json::from_slice(&blob(
        layout,
        manifest["config"]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    let described = describe();
    assert_eq!(config["config"]["User"], described["user"]);
    assert_eq!(config["config"]["User"], "65532:65532", "never root");
    assert_eq!(config["config"]["Entrypoint"], described["entrypoint"]);
    let labels = &config["config"]["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    let head = run(Command::new("git")
        .arg("-C")
        .arg(support::repo_root())
        .args(["rev-parse", "HEAD"]));
    assert_eq!(labels["org.opencontainers.image.revision"], head.trim());

    let sbom: Value =
        serde_json::from_slice(&fs::read(layout.join("sbom.spdx.json")).unwrap()).unwrap();
    assert_eq!(sbom["spdxVersion"], "SPDX-2.3");
    let all = sbom["packages"].as_array().unwrap();
    let described_image = all.iter().find(|p| p["SPDXID"] == "SPDXRef-Image").unwrap();
    let packages: BTreeMap<&str, &Value> = all
        .iter()
        .filter(|p| p["SPDXID"] != "SPDXRef-Image")
        .map(|p| (p["name"].as_str().unwrap(), p))
        .collect();
    assert_eq!(
        described_image["checksums"][0]["checksumValue"],
        digest.strip_prefix("sha256:").unwrap(),
        "the SBOM describes this image"
    );
    let debs = image_tools().unwrap().join("debs");
    for deb in fs::read_dir(&debs).unwrap().map(|e| e.unwrap().path()) {
        if deb.extension().is_none_or(|e| e != "deb") {
            continue;
        }
        let field = |name: &str| {
            run(Command::new("dpkg-deb").arg("--field").arg(&deb).arg(name))
                .trim()
                .to_owned()
        };
        let name = field("Package");
        assert_eq!(
            packages.get(name.as_str()).map(|p| &p["versionInfo"]),
            Some(&Value::from(field("Version"))),
            "{name} in the SBOM"
        );
    }
    // Crates linked into the binary, with their lock file version; none of the dev tooling.
    for crate_ in ["kube-client", "reqwest", "rustls", "tokio"] {
        assert!(packages.contains_key(crate_), "{crate_} in the SBOM");
    }
    for tooling in ["briq-dev", "proptest", "mlua"] {
        assert!(
            !packages.contains_key(tooling),
            "{tooling} is not in the image"
        );
    }
}

/// The argument of every `INSTRUCTION` line of the Dockerfile, continuation lines joined.
fn dockerfile_instructions() -> Vec<(String, String)> {
    let text = fs::read_to_string(support::repo_root().join("images/operator/Dockerfile")).unwrap();
    let joined = text
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    joined
        .lines()
        .filter_map(|line| {
            let (instruction, argument) = line.trim().split_once(' ')?;
            Some((instruction.to_owned(), argument.trim().to_owned()))
        })
        .collect()
}

#[test]
fn the_dockerfile_installs_what_the_daemonless_recipe_installs() {
    let described = describe();
    let instructions = dockerfile_instructions();
    let last = |wanted: &str| -> &str {
        instructions
            .iter()
            .rev()
            .find(|(instruction, _)| instruction == wanted)
            .map(|(_, argument)| argument.as_str())
            .unwrap_or_else(|| panic!("no {wanted} in the Dockerfile"))
    };
    let run_lines: Vec<&str> = instructions
        .iter()
        .filter(|(instruction, _)| instruction == "RUN")
        .map(|(_, argument)| argument.as_str())
        .collect();
    let downloads = run_lines
        .iter()
        .find_map(|line| line.split("apt-get download ").nth(1))
        .expect("an apt-get download");
    let packages: Vec<&str> = downloads
        .split_whitespace()
        .take_while(|word| *word != "&&")
        .collect();
    assert_eq!(
        serde_json::to_value(&packages).unwrap(),
        described["packages"],
        "images/operator/packages"
    );

    assert_eq!(last("USER"), described["user"]);
    assert_eq!(last("WORKDIR"), described["workdir"]);
    let json = |text: &str| serde_json::from_str::<Value>(text).unwrap();
    assert_eq!(json(last("ENTRYPOINT")), described["entrypoint"]);
    assert_eq!(json(last("CMD")), described["cmd"]);
    let env: Vec<&str> = last("ENV").split_whitespace().collect();
    assert_eq!(serde_json::to_value(&env).unwrap(), described["env"]);

    let copies: Vec<&str> = instructions
        .iter()
        .filter(|(instruction, _)| instruction == "COPY")
        .map(|(_, argument)| argument.as_str())
        .collect();
    let binary = described["binary"].as_str().unwrap();
    assert!(
        copies
            .iter()
            .any(|c| c.starts_with("--from=build ") && c.ends_with(&format!(" {binary}"))),
        "the binary at {binary}: {copies:?}"
    );
    assert!(
        copies.contains(&"images/operator/rootfs/ /rootfs/"),
        "the recipe's files (images/operator/rootfs): {copies:?}"
    );
    for (path, mode, owner) in described["directories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d[0].as_str().unwrap(),
                d[1].as_str().unwrap(),
                d[2].as_u64().unwrap(),
            )
        })
    {
        let owned = if owner == 0 {
            String::new()
        } else {
            format!("-o {owner} -g {owner} ")
        };
        let wanted = format!("install -d -m {mode} {owned}/rootfs{path}");
        assert!(
            run_lines.iter().any(|line| line.contains(&wanted)),
            "{wanted:?} in the Dockerfile"
        );
    }
    let labels: Vec<&str> = last("LABEL")
        .split_whitespace()
        .filter_map(|pair| pair.split_once('=').map(|(key, _)| key))
        .filter(|key| key.starts_with("org.opencontainers."))
        .collect();
    assert_eq!(serde_json::to_value(&labels).unwrap(), described["labels"]);
    let version_default = instructions
        .iter()
        .find_map(|(instruction, argument)| {
            (instruction == "ARG")
                .then(|| argument.strip_prefix("VERSION="))
                .flatten()
        })
        .expect("ARG VERSION=");
    assert_eq!(version_default, env!("CARGO_PKG_VERSION"));
}

/// A process killed when the test ends, passed or not.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// go-containerregistry's registry (in memory) on a port of its own.
struct Registry {
    _process: Process,
    host: String,
}

impl Registry {
    async fn start(tools: &Path) -> Registry {
        let port = free_port();
        let process = Process(
            Command::new(tools.join("bin/registry"))
                .args(["-port", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting the registry"),
        );
        let host = format!("127.0.0.1:{port}");
        let probe = format!("http://{host}/v2/");
        briq_dev::wait::poll(
            Duration::from_secs(20),
            Duration::from_millis(50),
            "the registry answers /v2/",
            || async {
                Ok(reqwest::get(&probe)
                    .await
                    .is_ok_and(|r| r.status().is_success()))
            },
        )
        .await
        .unwrap();
        Registry {
            _process: process,
            host,
        }
    }
}

fn crane(tools: &Path, args: &[&str]) -> String {
    run(Command::new(tools.join("bin/crane"))
        .arg("--insecure")
        .args(args))
}

/// `dev/release.sh` into `out` (with the plugin archive when given the binary).
fn release(out: &Path, binary: Option<&str>) {
    let mut command = Command::new("bash");
    command
        .arg(support::repo_root().join("dev/release.sh"))
        .arg(ops::tool("helm"))
        .arg(out);
    command.args(binary);
    run(&mut command);
}

#[tokio::test]
async fn the_chart_goes_through_an_oci_registry_byte_for_byte() {
    let Some(tools) = image_tools() else { return };
    let registry = Registry::start(tools).await;
    let out = tempfile::tempdir().unwrap();
    release(out.path(), None);
    let version = env!("CARGO_PKG_VERSION");
    let package = out.path().join(format!("briq-operator-{version}.tgz"));
    let repository = format!("oci://{}/charts", registry.host);
    let (ok, _, stderr) = ops::helm(&[
        "push",
        package.to_str().unwrap(),
        &repository,
        "--plain-http",
    ]);
    assert!(ok, "helm push: {stderr}");
    let pulled = tempfile::tempdir().unwrap();
    let (ok, _, stderr) = ops::helm(&[
        "pull",
        &format!("{repository}/briq-operator"),
        "--version",
        version,
        "--plain-http",
        "--destination",
        pulled.path().to_str().unwrap(),
    ]);
    assert!(ok, "helm pull: {stderr}");
    assert!(
        fs::read(&package).unwrap()
            == fs::read(pulled.path().join(format!("briq-operator-{version}.tgz"))).unwrap(),
        "the chart pulled back differs from the one pushed"
    );
}

#[test]
fn krew_installs_kubectl_briq_from_the_release_manifest() {
    let Some(tools) = image_tools() else { return };
    let out = tempfile::tempdir().unwrap();
    release(out.path(), Some(env!("CARGO_BIN_EXE_briq-operator")));
    let version = env!("CARGO_PKG_VERSION");
    let manifest: Value =
        serde_yaml_ng::from_str(&fs::read_to_string(out.path().join("briq.yaml")).unwrap())
            .unwrap();
    assert_eq!(manifest["spec"]["version"], format!("v{version}"));
    let archive = out
        .path()
        .join(format!("kubectl-briq_v{version}_linux_amd64.tar.gz"));
    let krew_root = tempfile::tempdir().unwrap();
    // krew checks the archive against the manifest's sha256 before it installs anything.
    run(Command::new(tools.join("bin/krew"))
        .env("KREW_ROOT", krew_root.path())
        .arg("install")
        .arg(format!(
            "--manifest={}",
            out.path().join("briq.yaml").display()
        ))
        .arg(format!("--archive={}", archive.display()))
        .stdin(Stdio::null()));
    let help = run(Command::new(krew_root.path().join("bin/kubectl-briq")).arg("--help"));
    assert!(
        help.contains("Usage: kubectl briq"),
        "the plugin speaks as kubectl briq:\n{help}"
    );
}

/// A program of this machine (looked up before the child's environment replaces PATH).
fn host_program(name: &str) -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("no {name} on this machine"))
}

fn is_root() -> bool {
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The API server's address and CA from the admin kubeconfig (what a kubelet hands a pod as
/// KUBERNETES_SERVICE_HOST/PORT and ca.crt).
fn api_server(kubeconfig: &Path) -> (String, String, Vec<u8>) {
    let config: Value = serde_yaml_ng::from_str(&fs::read_to_string(kubeconfig).unwrap()).unwrap();
    let cluster = &config["clusters"][0]["cluster"];
    let server = url::Url::parse(cluster["server"].as_str().unwrap()).unwrap();
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD
        .decode(cluster["certificate-authority-data"].as_str().unwrap())
        .unwrap();
    (
        server.host_str().unwrap().to_owned(),
        server.port().unwrap().to_string(),
        ca,
    )
}

#[tokio::test]
async fn pulled_from_a_registry_the_image_runs_the_readme_example_as_install_yamls_service_account()
{
    let Some(tools) = image_tools() else { return };
    if !is_root() {
        skip::<()>("running the image's root filesystem needs chroot: run as root");
        return;
    }
    let (layout, digest) = image();
    let version = env!("CARGO_PKG_VERSION");

    // Push, pull back by tag, unpack: the root filesystem a container runtime would run.
    let registry = Registry::start(tools).await;
    let reference = format!("{}/briq-operator:{version}", registry.host);
    crane(tools, &["push", layout.to_str().unwrap(), &reference]);
    assert_eq!(crane(tools, &["digest", &reference]).trim(), digest);
    let rootfs = tempfile::tempdir().unwrap();
    let exported = rootfs.path().with_extension("tar");
    crane(tools, &["export", &reference, exported.to_str().unwrap()]);
    run(Command::new("tar")
        .arg("-xf")
        .arg(&exported)
        .arg("-C")
        .arg(rootfs.path()));
    fs::remove_file(&exported).unwrap();
    let root = rootfs.path();
    for shell in [
        "bin/sh",
        "usr/bin/sh",
        "bin/bash",
        "usr/bin/apt-get",
        "usr/bin/dpkg",
    ] {
        assert!(
            root.join(shell).symlink_metadata().is_err(),
            "the image has {shell}"
        );
    }

    // Install as a user would: install.yaml applied for real (this binary's own API server).
    let env = TestEnv::new("image").await;
    let out = tempfile::tempdir().unwrap();
    release(out.path(), None);
    let install = out.path().join("install.yaml");
    let (ok, stdout, stderr) = env.kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "--namespace=briq-system",
        "-f",
        install.to_str().unwrap(),
    ]);
    assert!(ok, "kubectl apply -f install.yaml:\n{stdout}\n{stderr}");
    let documents = ops::documents(&fs::read_to_string(&install).unwrap());
    let deployment = ops::find(&documents, "Deployment")[0];
    let pod = &deployment["spec"]["template"]["spec"];
    let service_account = pod["serviceAccountName"].as_str().unwrap();
    let container = &pod["containers"][0];

    // What the kubelet mounts into the pod: the ServiceAccount's token, the cluster CA and the
    // namespace; no kubeconfig, no admin credentials.
    let (ok, token, stderr) = env.kubectl(&[
        "create",
        "token",
        service_account,
        "--namespace=briq-system",
        "--duration=1h",
    ]);
    assert!(ok, "kubectl create token: {stderr}");
    let (host, port, ca) = api_server(&env.kubeconfig);
    let secrets = root.join("var/run/secrets/kubernetes.io/serviceaccount");
    fs::create_dir_all(&secrets).unwrap();
    fs::write(secrets.join("token"), token.trim()).unwrap();
    fs::write(secrets.join("ca.crt"), ca).unwrap();
    fs::write(secrets.join("namespace"), "briq-system").unwrap();

    // The Deployment's own arguments and environment; what differs is where briq is (the local
    // sandbox server, plain HTTP on loopback) and a free port for the HTTP endpoints.
    let server = support::sandbox_server().await;
    let http = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|arg| {
            let arg = arg.as_str().unwrap();
            if arg.starts_with("--http-address=") {
                format!("--http-address={http}")
            } else {
                arg.to_owned()
            }
        })
        .collect();
    // A runtime starts from the image's Env, then the container's.
    let mut environment: BTreeMap<String, String> = describe()["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| {
            let (name, value) = pair.as_str().unwrap().split_once('=').unwrap();
            (name.to_owned(), value.to_owned())
        })
        .collect();
    for variable in container["env"].as_array().unwrap() {
        let name = variable["name"].as_str().unwrap().to_owned();
        let value = match (name.as_str(), variable["value"].as_str()) {
            ("BRIQ_API_URL", _) => server.url().to_string(),
            (_, Some(value)) => value.to_owned(),
            ("POD_NAME", None) => "briq-operator-image-test".to_owned(),
            ("POD_NAMESPACE", None) => "briq-system".to_owned(),
            (other, None) => panic!("{other}: a valueFrom this test does not fill in"),
        };
        environment.insert(name, value);
    }
    environment.insert("BRIQ_ALLOW_PLAIN_HTTP".into(), "true".into());
    // The chart's briq.apiKeySecret would put it here from a Secret.
    environment.insert("BRIQ_API_KEY".into(), server.api_key().expose().to_owned());
    environment.insert("KUBERNETES_SERVICE_HOST".into(), host);
    environment.insert("KUBERNETES_SERVICE_PORT".into(), port);
    let entrypoint = container["command"]
        .as_array()
        .map(|c| c[0].as_str().unwrap().to_owned())
        .unwrap_or_else(|| describe()["entrypoint"][0].as_str().unwrap().to_owned());
    let log_path = out.path().join("operator.log");
    let mut operator = Process(
        Command::new(host_program("chroot"))
            .arg("--userspec=65532:65532")
            .arg(root)
            .arg(&entrypoint)
            .args(&args)
            .env_clear()
            .envs(&environment)
            .current_dir(root)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&log_path).unwrap())
            .stderr(Stdio::from(
                fs::OpenOptions::new().append(true).open(&log_path).unwrap(),
            ))
            .spawn()
            .expect("chroot"),
    );
    let log = || fs::read_to_string(&log_path).unwrap_or_default();

    // Ready as its readiness probe says (the pod's readinessProbe path).
    let probe = format!("http://{http}/readyz");
    let ready = briq_dev::wait::poll(
        Duration::from_secs(60),
        Duration::from_millis(100),
        "the operator is ready",
        || async {
            Ok(reqwest::get(&probe)
                .await
                .is_ok_and(|r| r.status().is_success()))
        },
    )
    .await;
    assert!(ready.is_ok(), "{ready:?}\noperator log:\n{}", log());

    // kube-apiserver serves a policy whose parameters are a custom resource only once its
    // informer of that resource has synced, moments after the CRD: until then it refuses every
    // executor ("paramKind … not yet synced"). A user would retry; so does the test, bounded.
    let plain: BriqExecutor = serde_json::from_value(
        serde_json::json!({ "metadata": { "name": "policy-probe" }, "spec": {} }),
    )
    .unwrap();
    let dry_run = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    let executors = env.api::<BriqExecutor>();
    briq_dev::wait::poll(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "the class policy's parameters are synced",
        || async {
            Ok(match executors.create(&dry_run, &plain).await {
                Ok(_) => true,
                Err(kube::Error::Api(status)) if status.message.contains("not yet synced") => false,
                Err(error) => anyhow::bail!("a plain executor was refused: {error}"),
            })
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}\noperator log:\n{}", log()));

    // The example of docs/src/concepts.md, as `kubectl apply` / `kubectl create` give it.
    let examples = support::repo_root().join("examples");
    let (ok, _, stderr) = env.kubectl(&[
        "apply",
        "-f",
        examples.join("executor.yaml").to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let (ok, created, stderr) = env.kubectl(&[
        "create",
        "-f",
        examples.join("execution.yaml").to_str().unwrap(),
        "-o",
        "name",
    ]);
    assert!(ok, "{stderr}");
    let name = created.trim().rsplit('/').next().unwrap().to_owned();
    let execution: Execution = tokio::time::timeout(
        Duration::from_secs(support::READY_SECONDS + 60),
        finished(&env, &name, support::READY_SECONDS + 60),
    )
    .await
    .unwrap_or_else(|_| panic!("no result; operator log:\n{}", log()));
    assert_eq!(
        reason(&execution),
        "Completed",
        "{:?}\noperator log:\n{}",
        execution.status,
        log()
    );
    let status = execution.status.as_ref().unwrap();
    assert!(
        status
            .logs
            .as_deref()
            .unwrap_or_default()
            .contains("computed 20 numbers"),
        "{status:?}"
    );
    assert!(output(&execution).contains("4181"), "{status:?}");

    // Its finalizer, as the ServiceAccount, destroys the sandbox.
    let executors = env.api::<BriqExecutor>();
    executors.delete("demo", &Default::default()).await.unwrap();
    wait_deleted(&executors, "demo", 60).await;
    assert_eq!(
        server.admin().stats().await.unwrap().sandboxes.len(),
        0,
        "the sandbox outlived its executor"
    );

    // SIGTERM, as the kubelet stops a pod: the operator ends cleanly.
    run(Command::new("kill").args(["-TERM", &operator.0.id().to_string()]));
    let status = tokio::task::spawn_blocking(move || {
        let status = operator.0.wait();
        drop(operator);
        status
    })
    .await
    .unwrap()
    .unwrap();
    assert!(status.success(), "{status}; operator log:\n{}", log());
}
