//! `briq-operator demo`: the whole product on one machine, with nothing but this repository. It
//! starts a local control plane, the local sandbox server and the operator, applies
//! `examples/executor.yaml` and `examples/execution.yaml`, prints the result, runs a smolagents
//! `CodeAgent` whose code runs as Executions (`bridge/briq_bridge/demo_agent.py`), prints its
//! answer, and tears everything down, destroying the sandbox through the operator's finalizer.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, PostParams},
    runtime::wait::{await_condition, conditions},
};

use crate::{
    briq::{ApiKey, BriqClient, ClientOptions},
    control_plane::{self, ControlPlane},
    controller::{self, Settings},
    crd::{self, BriqExecutor, Execution},
    local_server,
};

const NAMESPACE: &str = "default";
const READY_TIMEOUT: Duration = Duration::from_secs(180);
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// The agent: a few Executions, plus Python start-up (smolagents, the kubernetes client).
const AGENT_TIMEOUT: Duration = Duration::from_secs(180);

/// Timestamped progress lines.
pub struct Progress {
    started: Instant,
    /// On stderr, for a command whose stdout holds its result.
    to_stderr: bool,
}

impl Progress {
    pub fn start() -> Self {
        Progress {
            started: Instant::now(),
            to_stderr: false,
        }
    }

    pub fn start_on_stderr() -> Self {
        Progress {
            to_stderr: true,
            ..Progress::start()
        }
    }

    pub fn step(&self, message: impl std::fmt::Display) {
        let line = format!("[{:>6.1}s] {message}", self.elapsed().as_secs_f64());
        if self.to_stderr {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

/// The venv whose Python runs the local sandboxes, built (once, cached) by `.ci/python-env.sh`:
/// the bridge's dependencies installed.
pub fn sandbox_venv(repo: &Path) -> anyhow::Result<PathBuf> {
    let out = std::process::Command::new("bash")
        .arg(repo.join(".ci/python-env.sh"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running .ci/python-env.sh")?;
    if !out.status.success() {
        bail!(".ci/python-env.sh failed ({})", out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(PathBuf::from(
        stdout.lines().last().unwrap_or_default().trim(),
    ))
}

fn manifest<K: serde::de::DeserializeOwned>(repo: &Path, file: &str) -> anyhow::Result<K> {
    let path = repo.join("examples").join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// A local control plane with the CRDs, the local sandbox server and the operator, all in this
/// process. Used by `demo` and `local-stack`.
pub struct Stack {
    pub client: Client,
    pub server: local_server::LocalServer,
    pub plane: ControlPlane,
    operator: tokio::task::JoinHandle<()>,
}

impl Stack {
    pub async fn start(progress: &Progress) -> anyhow::Result<Stack> {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).to_owned();
        progress.step("building or reusing the local control plane (first run: several minutes)");
        let bin_dir = tokio::task::spawn_blocking({
            let repo = repo.clone();
            move || control_plane::binaries(&repo)
        })
        .await??;
        let plane = ControlPlane::start(&bin_dir).await?;
        let client = Client::try_from(plane.client_config().await?)?;
        crd::install(&client).await?;
        progress.step(format!("kube-apiserver ready at {}", plane.server()));

        let venv = tokio::task::spawn_blocking(move || sandbox_venv(&repo)).await??;
        let key = ApiKey::new(format!("local-{:016x}", rand::random::<u64>()))?;
        let mut config = local_server::Config::new(key.clone());
        config.python_venv = Some(venv);
        let server = local_server::spawn(config).await?;
        progress.step(format!(
            "local sandbox server at {} (sandboxes are host processes)",
            server.url()
        ));

        let settings = Settings {
            default_api_key: Some(key),
            ..Settings::default()
        };
        let sandboxes = BriqClient::new(ClientOptions::new(server.url()))?;
        let operator = tokio::spawn(controller::run(
            client.clone(),
            sandboxes,
            settings,
            std::future::pending(),
        ));
        progress.step("operator running");
        Ok(Stack {
            client,
            server,
            plane,
            operator,
        })
    }

    /// Deletes every executor through the operator (so finalizers destroy the sandboxes), then
    /// stops everything. Fails if a sandbox is left.
    pub async fn stop(self, progress: &Progress) -> anyhow::Result<()> {
        let executors: Api<BriqExecutor> = Api::all(self.client.clone());
        for executor in executors.list(&Default::default()).await? {
            let namespaced: Api<BriqExecutor> = Api::namespaced(
                self.client.clone(),
                &executor.namespace().unwrap_or_default(),
            );
            namespaced
                .delete(&executor.name_any(), &DeleteParams::default())
                .await?;
            let (name, uid) = (executor.name_any(), executor.uid().unwrap_or_default());
            let gone = await_condition(namespaced.clone(), &name, conditions::is_deleted(&uid));
            tokio::time::timeout(Duration::from_secs(60), gone)
                .await
                .context("an executor was not deleted")??;
        }
        let leaked = self.server.admin().stats().await?.sandboxes.len();
        self.operator.abort();
        self.server.shutdown().await;
        drop(self.plane);
        progress.step(format!(
            "torn down: executors deleted, {leaked} sandboxes left, control plane stopped"
        ));
        if leaked > 0 {
            bail!("{leaked} sandboxes were left behind");
        }
        Ok(())
    }
}

pub async fn run() -> anyhow::Result<()> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let progress = Progress::start();
    let stack = Stack::start(&progress).await?;
    let result = exercise(&stack.client, stack.plane.kubeconfig(), repo, &progress).await;
    stack.stop(&progress).await?;
    result
}

/// Runs the local stack until interrupted, writing an admin kubeconfig to `kubeconfig`.
pub async fn local_stack(kubeconfig: PathBuf) -> anyhow::Result<()> {
    let progress = Progress::start();
    let stack = Stack::start(&progress).await?;
    std::fs::copy(stack.plane.kubeconfig(), &kubeconfig).context("writing the kubeconfig")?;
    progress.step(format!("ready: KUBECONFIG={}", kubeconfig.display()));
    tokio::signal::ctrl_c().await?;
    stack.stop(&progress).await
}

/// Applies the example executor, runs the example Execution, then a real smolagents `CodeAgent`
/// whose actions run through the operator (`bridge/briq_bridge/demo_agent.py`).
async fn exercise(
    client: &Client,
    kubeconfig: &Path,
    repo: &Path,
    progress: &Progress,
) -> anyhow::Result<()> {
    let executors: Api<BriqExecutor> = Api::namespaced(client.clone(), NAMESPACE);
    let executions: Api<Execution> = Api::namespaced(client.clone(), NAMESPACE);
    let executor: BriqExecutor = manifest(repo, "executor.yaml")?;
    executors.create(&PostParams::default(), &executor).await?;
    progress.step("applied examples/executor.yaml; waiting for Ready (sandbox, bridge, kernel)");
    let ready = await_condition(
        executors.clone(),
        "demo",
        |executor: Option<&BriqExecutor>| {
            executor
                .and_then(|e| e.status.as_ref())
                .is_some_and(|status| {
                    status
                        .conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                        || status
                            .conditions
                            .iter()
                            .any(|c| c.type_ == "Stalled" && c.status == "True")
                })
        },
    );
    let executor = tokio::time::timeout(READY_TIMEOUT, ready)
        .await
        .context("the executor did not become ready")??;
    let status = executor.and_then(|e| e.status).unwrap_or_default();
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
    if ready.is_none_or(|c| c.status != "True") {
        bail!("the executor failed: {:?}", ready.map(|c| &c.message));
    }
    progress.step(format!(
        "executor ready, sandbox {}",
        status.sandbox_id.unwrap_or_default()
    ));

    let execution: Execution = manifest(repo, "execution.yaml")?;
    let created = executions
        .create(&PostParams::default(), &execution)
        .await?;
    let name = created.name_any();
    progress.step(format!("created Execution {name}; waiting for Succeeded"));
    let done = await_condition(
        executions.clone(),
        &name,
        |execution: Option<&Execution>| {
            execution.and_then(|e| e.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Succeeded" && c.status != "Unknown")
            })
        },
    );
    let execution = tokio::time::timeout(RUN_TIMEOUT, done)
        .await
        .context("the Execution did not finish")??;
    let status = execution.and_then(|e| e.status).unwrap_or_default();
    let succeeded = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Succeeded")
        .context("the Execution has no Succeeded condition")?;
    progress.step(format!(
        "Execution {name}: Succeeded={} ({})",
        succeeded.status, succeeded.reason
    ));
    println!(
        "--- logs ---\n{}",
        status.logs.unwrap_or_default().trim_end()
    );
    println!("--- output ---\n{}", status.output.unwrap_or_default());
    if succeeded.status != "True" {
        bail!("the Execution failed: {}", succeeded.message);
    }

    let answer = run_agent(repo, kubeconfig, progress).await?;
    println!("--- the agent's answer ---\n{answer}");
    Ok(())
}

/// Runs `python -m briq_bridge.demo_agent` (the venv of the local sandboxes has smolagents and
/// the bridge package) against the `demo` executor, relaying its lines as progress. Its model is
/// scripted unless `BRIQ_DEMO_MODEL` configures a real one. Returns the answer it printed.
async fn run_agent(repo: &Path, kubeconfig: &Path, progress: &Progress) -> anyhow::Result<String> {
    use tokio::io::{AsyncBufReadExt as _, BufReader};

    let venv = tokio::task::spawn_blocking({
        let repo = repo.to_owned();
        move || sandbox_venv(&repo)
    })
    .await??;
    progress.step("running a smolagents CodeAgent whose code runs as Executions");
    let mut child = tokio::process::Command::new(venv.join("bin").join("python"))
        .args(["-m", "briq_bridge.demo_agent", "--executor", "demo"])
        .args(["--namespace", NAMESPACE])
        .env("KUBECONFIG", kubeconfig)
        .current_dir(repo.join("bridge"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting the demo agent (python -m briq_bridge.demo_agent)")?;
    let stdout = child.stdout.take().context("the agent's stdout")?;
    let relay = async {
        let mut answer = None;
        let mut lines = BufReader::new(stdout).lines();
        while let Some(line) = lines.next_line().await? {
            match line.strip_prefix("answer: ") {
                Some(value) => answer = Some(value.to_owned()),
                None => progress.step(format!("agent: {line}")),
            }
        }
        let status = child.wait().await?;
        anyhow::Ok((status, answer))
    };
    let (status, answer) = tokio::time::timeout(AGENT_TIMEOUT, relay)
        .await
        .context("the demo agent did not finish")??;
    if !status.success() {
        bail!("the demo agent failed ({status})");
    }
    answer.context("the demo agent printed no answer")
}
