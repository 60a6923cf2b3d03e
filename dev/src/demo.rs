//! `briq-dev demo`: the whole product on one machine, with nothing but this repository. It
//! starts a local control plane, the local sandbox server and the operator, applies
//! `examples/executor.yaml` and `examples/execution.yaml`, prints the result, runs a smolagents
//! `CodeAgent` whose code runs as Executions on an executor claimed from the warm pool of
//! `examples/pool.yaml` (`dev/python/briq_dev/demo_agent.py`), prints its answer, connects an
//! MCP client (the official SDK, `dev/python/briq_dev/demo_mcp.py`) to the namespace's endpoint
//! with a ServiceAccount token and prints what it got, and tears everything down, destroying
//! the sandboxes through the operator's finalizer.
//! `briq-dev local-stack` runs the same stack until interrupted.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, bail};
use kube::{Api, Client, ResourceExt, api::PostParams};

use briq_operator::crd::{BriqExecutor, BriqExecutorPool, Execution};

use crate::{
    progress::Progress,
    repo::{repo_root, sandbox_venv},
    stack::Stack,
    wait,
};

const NAMESPACE: &str = "default";
const READY_TIMEOUT: Duration = Duration::from_secs(180);
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// The agent: a few Executions, plus Python start-up (smolagents, the kubernetes client).
const AGENT_TIMEOUT: Duration = Duration::from_secs(180);

fn manifest<K: serde::de::DeserializeOwned>(file: &str) -> anyhow::Result<K> {
    let path = repo_root().join("examples").join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The stack of `demo` and `local-stack`: control plane, sandbox server, controllers for all
/// namespaces, all in this process.
async fn start(progress: &Progress) -> anyhow::Result<Stack> {
    Stack::builder()
        .controllers()
        .progress(progress)
        .start()
        .await
}

pub async fn run() -> anyhow::Result<()> {
    let progress = Progress::start();
    let stack = start(&progress).await?;
    let result = exercise(stack.admin(), stack.kubeconfig(), &progress).await;
    stack.stop().await?;
    result
}

/// Runs the local stack until interrupted, writing an admin kubeconfig to `kubeconfig`. Its
/// operator exports traces as `briq-operator run` does, when the `OTEL_*` variables say so.
pub async fn local_stack(
    kubeconfig: &Path,
    sandbox_server_file: Option<&Path>,
) -> anyhow::Result<()> {
    briq_operator::traces::init().context("configuring traces")?;
    let progress = Progress::start();
    let stack = start(&progress).await?;
    std::fs::copy(stack.kubeconfig(), kubeconfig).context("writing the kubeconfig")?;
    if let Some(path) = sandbox_server_file {
        write_sandbox_server_file(path, &stack)?;
    }
    progress.step(format!("ready: KUBECONFIG={}", kubeconfig.display()));
    tokio::signal::ctrl_c().await?;
    let stopped = stack.stop().await;
    briq_operator::traces::flush();
    stopped
}

/// Writes the sandbox server's URL (its MCP endpoint) and key, readable by this user only (the
/// key is a secret).
fn write_sandbox_server_file(path: &Path, stack: &Stack) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let server = stack.server();
    let text = serde_json::json!({
        "url": server.url().as_str(),
        "api_key": server.api_key().expose(),
    });
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(text.to_string().as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// Applies the example executor, runs the example Execution, then a real smolagents `CodeAgent`
/// whose actions run through the operator (`dev/python/briq_dev/demo_agent.py`).
async fn exercise(client: &Client, kubeconfig: &Path, progress: &Progress) -> anyhow::Result<()> {
    let executors: Api<BriqExecutor> = Api::namespaced(client.clone(), NAMESPACE);
    let executions: Api<Execution> = Api::namespaced(client.clone(), NAMESPACE);
    let executor: BriqExecutor = manifest("executor.yaml")?;
    executors.create(&PostParams::default(), &executor).await?;
    // The agent's executor comes from a warm pool, which fills while the example runs.
    let pools: Api<BriqExecutorPool> = Api::namespaced(client.clone(), NAMESPACE);
    let pool: BriqExecutorPool = manifest("pool.yaml")?;
    pools.create(&PostParams::default(), &pool).await?;
    progress.step(
        "applied examples/executor.yaml and examples/pool.yaml; waiting for Ready (sandbox, \
         bridge, kernel)",
    );
    let decided = |executor: &BriqExecutor| {
        executor.status.as_ref().is_some_and(|status| {
            status
                .conditions
                .iter()
                .any(|c| (c.type_ == "Ready" || c.type_ == "Stalled") && c.status == "True")
        })
    };
    let executor = wait::for_object(&executors, "demo", READY_TIMEOUT, decided)
        .await
        .context("the executor did not become ready")?;
    let status = executor.status.unwrap_or_default();
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
    if ready.is_none_or(|c| c.status != "True") {
        bail!("the executor failed: {:?}", ready.map(|c| &c.message));
    }
    progress.step(format!(
        "executor ready, sandbox {}",
        status.sandbox_id.unwrap_or_default()
    ));

    let execution: Execution = manifest("execution.yaml")?;
    let created = executions
        .create(&PostParams::default(), &execution)
        .await?;
    let name = created.name_any();
    progress.step(format!("created Execution {name}; waiting for Succeeded"));
    let finished = |execution: &Execution| {
        execution.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Succeeded" && c.status != "Unknown")
        })
    };
    let execution = wait::for_object(&executions, &name, RUN_TIMEOUT, finished)
        .await
        .context("the Execution did not finish")?;
    let status = execution.status.unwrap_or_default();
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

    let warm =
        |pool: &BriqExecutorPool| pool.status.as_ref().is_some_and(|s| s.ready_replicas >= 1);
    wait::for_object(&pools, "warm", READY_TIMEOUT, warm)
        .await
        .context("the pool did not get a Ready member")?;
    progress.step("pool warm has a Ready member");
    progress.step("running a smolagents CodeAgent whose code runs as Executions");
    let args = ["-m", "briq_dev.demo_agent", "--pool", "warm"];
    let answer = run_python(kubeconfig, progress, &args, "agent").await?;
    println!("--- the agent's answer ---\n{answer}");
    progress.step("connecting an MCP client (the official SDK) with a ServiceAccount token");
    let args = ["-m", "briq_dev.demo_mcp", "--executor", "demo"];
    let answer = run_python(kubeconfig, progress, &args, "mcp").await?;
    println!("--- the MCP client's answer ---\n{answer}");
    Ok(())
}

/// Runs `python <args>` in the venv of the local sandboxes (it has smolagents, the MCP SDK and
/// the bridge package): `briq_dev.demo_agent`, a CodeAgent on an executor it claims from the
/// `warm` pool (its model scripted unless `BRIQ_DEMO_MODEL` configures a real one), or
/// `briq_dev.demo_mcp`, an MCP client. Relays its lines as progress (`who: …`); returns the
/// answer it printed.
async fn run_python(
    kubeconfig: &Path,
    progress: &Progress,
    args: &[&str],
    who: &str,
) -> anyhow::Result<String> {
    use tokio::io::{AsyncBufReadExt as _, BufReader};

    let venv = tokio::task::spawn_blocking(sandbox_venv).await??;
    let mut child = tokio::process::Command::new(venv.join("bin").join("python"))
        .args(args)
        .args(["--namespace", NAMESPACE])
        .env("KUBECONFIG", kubeconfig)
        .current_dir(repo_root())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting python {}", args.join(" ")))?;
    let stdout = child.stdout.take().context("the agent's stdout")?;
    let relay = async {
        let mut answer = None;
        let mut lines = BufReader::new(stdout).lines();
        while let Some(line) = lines.next_line().await? {
            match line.strip_prefix("answer: ") {
                Some(value) => answer = Some(value.to_owned()),
                None => progress.step(format!("{who}: {line}")),
            }
        }
        let status = child.wait().await?;
        anyhow::Ok((status, answer))
    };
    let (status, answer) = tokio::time::timeout(AGENT_TIMEOUT, relay)
        .await
        .with_context(|| format!("the demo's {who} did not finish"))??;
    if !status.success() {
        bail!("the demo's {who} failed ({status})");
    }
    answer.with_context(|| format!("the demo's {who} printed no answer"))
}
