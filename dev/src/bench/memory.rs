//! Scenario 5: the operator's own footprint as object counts grow. A separate `briq-operator
//! run --namespace NS` process (the release binary beside this one) on the local sandbox
//! server's simulated sandboxes, so that its executors are really Ready: its peak RSS (`VmHWM`)
//! and RSS idle, with many Ready `BriqExecutor`s, with Executions of the largest code queued and
//! after many create/delete cycles; then a second one, started on the same namespace once it
//! also holds many finished `Execution`s (finished by us through the status subresource, while
//! no operator runs).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde::Serialize;
use serde_json::json;

use futures::{StreamExt, TryStreamExt, stream};

use super::{
    objects::{self, FirstSeen},
    setup::OPERATOR_USER,
};
use crate::{progress::Progress, repo::repo_root, stack::Stack};
use briq_operator::crd::{BriqExecutor, Execution};

const NAMESPACE: &str = "bench-memory";
const WRITES_AT_ONCE: usize = 32;
const QUEUED_LARGEST: usize = 250;
const CYCLES: usize = 1_000;

#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    /// Peak RSS of a freshly started operator with nothing to do, and its RSS.
    pub idle_peak_kib: u64,
    pub idle_rss_kib: u64,
    pub executors: usize,
    /// Peak RSS once that many executors are Ready (on simulated sandboxes).
    pub with_executors_peak_kib: u64,
    pub with_executors_rss_kib: u64,
    /// RSS with that many Executions of the largest code queued (their executor does not exist).
    pub queued_largest: usize,
    pub with_queued_rss_kib: u64,
    /// RSS after that many Executions were created and deleted, one after another.
    pub cycles: usize,
    pub after_cycles_rss_kib: u64,
    pub executions: usize,
    /// Peak RSS of an operator started on the namespace once it also holds that many finished
    /// Executions (the executors still Ready).
    pub with_executions_peak_kib: u64,
    pub with_executions_rss_kib: u64,
    /// RSS growth per Ready executor (from idle), and per finished Execution (the second
    /// operator against the first with the executors alone).
    pub per_executor_kib: f64,
    pub per_execution_kib: f64,
}

/// The largest code an Execution may carry, in the characters that take the most memory.
fn largest_code() -> String {
    let body = "\u{1F600}".repeat(briq_operator::crd::MAX_CODE_CHARS - 3);
    format!("# {body}\n")
}

pub async fn run(
    stack: &Stack,
    progress: &Progress,
    executors: usize,
    executions: usize,
) -> anyhow::Result<Memory> {
    let binary = operator_binary()?;
    let logs = tempfile::Builder::new().prefix("briq-bench-").tempdir()?;

    stack.namespace(NAMESPACE).await?;
    let first = Operator::start(stack, &binary, &logs.path().join("operator.log"))?;
    first.until_quiet().await?;
    let idle = first.memory()?;
    progress.step(format!(
        "5/9: operator idle at {} KiB peak; {executors} BriqExecutors on simulated sandboxes",
        idle.peak
    ));
    let api: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let ready = FirstSeen::start(api.clone(), objects::ready).await?;
    let names: Vec<String> = (0..executors).map(|i| format!("m-{i:05}")).collect();
    let plan = names
        .iter()
        .map(|name| objects::executor(name, json!({})))
        .collect::<anyhow::Result<Vec<BriqExecutor>>>()?;
    let created = Instant::now();
    objects::create_all(&api, plan, None).await?;
    let bound = Duration::from_secs(60 + executors as u64 / 5);
    if !ready.wait_for(executors, created, bound).await {
        first.alive()?;
        bail!(
            "{} of {executors} executors were not Ready within {bound:?}",
            executors - ready.count()
        );
    }
    drop(ready);
    first.until_quiet().await?;
    let with_executors = first.memory()?;

    // Queued Executions must not keep their code in memory.
    let waiting: Api<Execution> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let code = largest_code();
    let queued = (0..QUEUED_LARGEST)
        .map(|i| objects::execution(&format!("q-{i:04}"), "absent", &code))
        .collect::<anyhow::Result<Vec<Execution>>>()?;
    objects::create_all(&waiting, queued, None).await?;
    first.until_quiet().await?;
    let with_queued = first.memory()?;
    waiting
        .delete_collection(&Default::default(), &ListParams::default())
        .await?;

    // Nothing kept per object may outlive it.
    progress.step(format!(
        "5: {} KiB RSS with {QUEUED_LARGEST} queued of the largest code; {CYCLES} create/delete cycles",
        with_queued.rss
    ));
    for i in 0..CYCLES {
        let name = format!("c-{i:05}");
        let object = objects::execution(&name, "absent", "1 + 1")?;
        waiting.create(&PostParams::default(), &object).await?;
        waiting.delete(&name, &Default::default()).await?;
    }
    first.until_quiet().await?;
    let after_cycles = first.memory()?;
    first.stop().await;

    progress.step(format!(
        "5: {} KiB peak with {executors} Ready executors; creating {executions} finished \
         Executions, then a second operator",
        with_executors.peak
    ));
    create_finished(stack, executions).await?;
    let second = Operator::start(stack, &binary, &logs.path().join("operator-second.log"))?;
    second.until_quiet().await?;
    let with_executions = second.memory()?;
    second.stop().await;
    let growth = |to: &Usage, from: &Usage, count: usize| {
        (to.rss as f64 - from.rss as f64) / count.max(1) as f64
    };
    Ok(Memory {
        idle_peak_kib: idle.peak,
        idle_rss_kib: idle.rss,
        executors,
        with_executors_peak_kib: with_executors.peak,
        with_executors_rss_kib: with_executors.rss,
        queued_largest: QUEUED_LARGEST,
        with_queued_rss_kib: with_queued.rss,
        cycles: CYCLES,
        after_cycles_rss_kib: after_cycles.rss,
        executions,
        with_executions_peak_kib: with_executions.peak,
        with_executions_rss_kib: with_executions.rss,
        per_executor_kib: growth(&with_executors, &idle, executors),
        per_execution_kib: growth(&with_executions, &with_executors, executions),
    })
}

/// Creates `count` Executions and finishes each (Succeeded=True) through the status subresource.
/// No operator watches the namespace meanwhile, so nothing else writes their status.
async fn create_finished(stack: &Stack, count: usize) -> anyhow::Result<()> {
    let api: Api<Execution> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    stream::iter(0..count)
        .map(|i| {
            let (api, now) = (api.clone(), now.clone());
            async move {
                let name = format!("done-{i:05}");
                let object = objects::execution(&name, "gone", "1 + 1")?;
                api.create(&PostParams::default(), &object).await?;
                let status = json!({
                    "status": {
                        "observedGeneration": 1,
                        "conditions": [{
                            "type": "Succeeded", "status": "True", "reason": "Completed",
                            "message": "the code ran", "lastTransitionTime": now,
                            "observedGeneration": 1,
                        }],
                        "attemptId": format!("{i:016x}"),
                        "output": "2",
                        "startTime": now,
                        "completionTime": now,
                        "durationMillis": 3,
                    },
                });
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(WRITES_AT_ONCE)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// `briq-operator` next to this executable (the workspace's target directory, where `make bench`
/// builds it); built when missing.
pub(super) fn operator_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .context("the benchmark binary has no directory")?;
    let binary = dir.join("briq-operator");
    if !binary.is_file() {
        let mut build =
            std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()));
        build
            .args(["build", "-p", "briq-operator", "--bin", "briq-operator"])
            .current_dir(repo_root());
        if dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().context("building briq-operator")?;
        if !status.success() || !binary.is_file() {
            bail!("could not build {}", binary.display());
        }
    }
    Ok(binary)
}

struct Usage {
    peak: u64,
    rss: u64,
}

pub(super) struct Operator {
    child: tokio::process::Child,
    pid: u32,
    log: PathBuf,
}

impl Operator {
    /// On [`NAMESPACE`], with the simulated sandbox server as its briq API.
    fn start(stack: &Stack, binary: &Path, log: &Path) -> anyhow::Result<Self> {
        Self::start_in(stack, binary, log, NAMESPACE, &[])
    }

    /// On `namespace`, with the simulated sandbox server as its briq API and `env` added.
    pub(super) fn start_in(
        stack: &Stack,
        binary: &Path,
        log: &Path,
        namespace: &str,
        env: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let sandboxes = stack.simulated_server();
        let out = std::fs::File::create(log)?;
        // Its HTTP endpoints on a free port, so that nothing else on the machine is in the way.
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = tokio::process::Command::new(binary)
            .args(["run", "--namespace", namespace])
            // Traces only where `env` asks for them.
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("KUBECONFIG", stack.user_kubeconfig(OPERATOR_USER))
            .env("BRIQ_API_URL", sandboxes.url().as_str())
            .env("BRIQ_API_KEY", sandboxes.api_key().expose())
            .env("BRIQ_ALLOW_PLAIN_HTTP", "true")
            .env("BRIQ_HTTP_ADDRESS", format!("127.0.0.1:{port}"))
            .env_remove("BRIQ_OPERATOR_NAMESPACE")
            .env_remove("BRIQ_LEADER_ELECTION")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let pid = child.id().context("the operator exited at once")?;
        Ok(Operator {
            child,
            pid,
            log: log.to_owned(),
        })
    }

    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    pub(super) fn alive(&self) -> anyhow::Result<()> {
        if std::fs::metadata(format!("/proc/{}/status", self.pid)).is_err()
            || proc_field(self.pid, "State:").is_some_and(|s| s.starts_with('Z'))
        {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "the operator process exited; its log ends:\n{}",
                tail.join("\n")
            );
        }
        Ok(())
    }

    /// Waits until the process has used no CPU for two seconds (at least 3 s, at most 180 s).
    async fn until_quiet(&self) -> anyhow::Result<()> {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let deadline = Instant::now() + Duration::from_secs(180);
        let mut last = (cpu_ticks(self.pid), Instant::now());
        while Instant::now() < deadline {
            self.alive()?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let ticks = cpu_ticks(self.pid);
            if ticks != last.0 {
                last = (ticks, Instant::now());
            } else if last.1.elapsed() >= Duration::from_secs(2) {
                return Ok(());
            }
        }
        Ok(())
    }

    fn memory(&self) -> anyhow::Result<Usage> {
        self.alive()?;
        let kib = |field: &str| {
            proc_field(self.pid, field)
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .with_context(|| format!("no {field} in /proc/{}/status", self.pid))
        };
        Ok(Usage {
            peak: kib("VmHWM:")?,
            rss: kib("VmRSS:")?,
        })
    }

    pub(super) async fn stop(mut self) {
        // SAFETY: kill(2) on our own child's pid; it has not been reaped yet.
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGTERM);
        }
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

fn proc_field(pid: u32, field: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field).map(|v| v.trim().to_owned()))
}

/// Clock ticks per second, the unit of [`cpu_ticks`].
pub(super) fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// utime + stime of a process, in clock ticks.
pub(super) fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name, which may contain spaces.
    let rest = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of stat; `rest` starts at field 3.
    field(11) + field(12)
}
