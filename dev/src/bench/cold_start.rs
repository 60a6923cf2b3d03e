//! Scenario 6: cold start, executor create → Ready. (a) "Prebuilt image": the bridge's
//! dependencies already in the sandbox's Python (the default venv, as `images/sandbox` has them),
//! and each executor's Ready Event confirms that setup made no pip call; (b) installed by pip
//! from the package index: a local sandbox server of its own per run whose Python is a fresh, empty venv
//! (made before the clock starts), so setup pip-installs everything.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::events::v1::Event;
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use serde::Serialize;
use serde_json::json;

use super::{objects, stats::Summary};
use crate::{progress::Progress, stack::Stack};
use briq_operator::crd::BriqExecutor;

const PREINSTALLED_NAMESPACE: &str = "bench-cold";
const PIP_NAMESPACE: &str = "bench-cold-pip";

#[derive(Debug, Clone, Serialize)]
pub struct ColdStart {
    pub runs: usize,
    pub preinstalled_ms: Option<Summary>,
    /// Runs of (a) whose Ready Event says setup made no pip call.
    pub preinstalled_without_pip: usize,
    pub pip_ms: Option<Summary>,
    /// Why there is no pip figure.
    pub pip_unavailable: Option<String>,
}

pub async fn run(stack: &Stack, progress: &Progress, runs: usize) -> anyhow::Result<ColdStart> {
    progress.step(format!(
        "6/9: cold start x{runs}, dependencies present (default venv)"
    ));
    stack.namespace(PREINSTALLED_NAMESPACE).await?;
    let operator = super::setup::controllers(stack, PREINSTALLED_NAMESPACE, stack.server())?;
    let api: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), PREINSTALLED_NAMESPACE);
    let events: Api<Event> = Api::namespaced(stack.admin().clone(), PREINSTALLED_NAMESPACE);
    let mut preinstalled = Vec::new();
    let mut preinstalled_without_pip = 0;
    for i in 0..runs {
        let name = format!("cold-{i}");
        preinstalled.push(create_to_ready(&api, &name, json!({})).await?);
        if !ready_note(&events, &name).await?.contains("pip-installed") {
            preinstalled_without_pip += 1;
        }
        objects::delete_executors(&api).await?;
    }
    operator.stop().await;

    progress.step(format!(
        "6: cold start x{runs}, dependencies pip-installed into a fresh venv"
    ));
    stack.namespace(PIP_NAMESPACE).await?;
    let api: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), PIP_NAMESPACE);
    // The sandbox's Python must be readable by the kernel's user (uid 65534): a Python under
    // /root (pyenv, the usual toolchain install) is not, the distribution's is.
    let python = std::env::var("BRIQ_PYTHON").unwrap_or_else(|_| {
        let system = "/usr/bin/python3";
        if std::path::Path::new(system).exists() {
            system
        } else {
            "python3"
        }
        .into()
    });
    let mut pip = Vec::new();
    let mut pip_unavailable = None;
    for i in 0..runs {
        let dir = tempfile::Builder::new()
            .prefix("briq-bench-venv-")
            .tempdir()?;
        // tempfile makes it 0700; the kernel's user must reach the venv inside.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        let venv = dir.path().join("venv");
        let status = tokio::process::Command::new(&python)
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .await
            .with_context(|| format!("running {python} -m venv"))?;
        if !status.success() {
            bail!("{python} -m venv failed ({status})");
        }
        let server = crate::stack::spawn_server(Some(venv.clone())).await?;
        let operator = super::setup::controllers(stack, PIP_NAMESPACE, &server)?;
        let spec = json!({ "setupTimeoutSeconds": 60 });
        let outcome = create_to_ready(&api, &format!("pip-{i}"), spec)
            .await
            .and_then(|took| {
                // The figure means something only if setup really pip-installed the bridge's
                // dependencies into the empty venv.
                if !installed(&venv, "smolagents") {
                    bail!(
                        "setup did not pip-install smolagents into {}",
                        venv.display()
                    );
                }
                Ok(took)
            });
        objects::delete_executors(&api).await?;
        operator.stop().await;
        server.shutdown().await;
        match outcome {
            Ok(took) => {
                pip.push(took);
                progress.step(format!(
                    "6: pip run {} ready in {:.1}s",
                    i + 1,
                    took.as_secs_f64()
                ));
            }
            Err(error) => {
                let reason = format!("{error:#}");
                let last = reason
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or_default()
                    .trim()
                    .to_owned();
                let first = reason.lines().next().unwrap_or_default().to_owned();
                pip_unavailable = Some(if first == last {
                    first
                } else {
                    format!("{first} … {last}")
                });
                break;
            }
        }
    }
    Ok(ColdStart {
        runs,
        preinstalled_ms: Summary::of(&preinstalled),
        preinstalled_without_pip,
        pip_ms: if pip_unavailable.is_some() {
            None
        } else {
            Summary::of(&pip)
        },
        pip_unavailable,
    })
}

/// Whether `package` is installed in `venv`.
fn installed(venv: &std::path::Path, package: &str) -> bool {
    let Ok(lib) = std::fs::read_dir(venv.join("lib")) else {
        return false;
    };
    lib.flatten()
        .any(|python| python.path().join("site-packages").join(package).is_dir())
}

/// The note of the named executor's Ready Event (published right after its Ready condition).
async fn ready_note(events: &Api<Event>, name: &str) -> anyhow::Result<String> {
    let started = Instant::now();
    loop {
        let list = events.list(&ListParams::default()).await?;
        let ready = list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("Ready")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        });
        if let Some(event) = ready {
            return Ok(event.note.unwrap_or_default());
        }
        if started.elapsed() > Duration::from_secs(10) {
            bail!("no Ready Event for {name} within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn create_to_ready(
    api: &Api<BriqExecutor>,
    name: &str,
    spec: serde_json::Value,
) -> anyhow::Result<Duration> {
    let object = objects::executor(name, spec)?;
    let started = Instant::now();
    api.create(&PostParams::default(), &object).await?;
    objects::wait_ready(api, name).await?;
    Ok(started.elapsed())
}
