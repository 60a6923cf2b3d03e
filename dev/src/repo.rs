//! The repository this tooling works in, and the scripts in it that build and cache what the
//! local stack needs (control plane binaries, the sandboxes' Python, helm and kstatus).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
};

use anyhow::{Context as _, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Deserialize as _;

/// The repository root (this crate lives in `dev/`). Development tooling only: the operator
/// itself never looks for its sources.
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("dev/ has a parent directory")
}

/// The CRDs of release `version` as clusters that run it store them (`compat/<version>/`).
pub fn released_crds(version: &str) -> anyhow::Result<Vec<CustomResourceDefinition>> {
    let path = repo_root()
        .join("compat")
        .join(version)
        .join("briq.cloud.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|document| {
            CustomResourceDefinition::deserialize(document)
                .with_context(|| format!("a CRD of {}", path.display()))
        })
        .collect()
}

/// The operator binary of release `version`, built from its commit (`compat/<version>/commit`)
/// by `compat/build.sh`: `BRIQ_PREVIOUS_OPERATOR`, else what the script has built and cached
/// (`--cached`: it never builds here, `make test` builds it first).
pub fn released_operator(version: &str) -> anyhow::Result<PathBuf> {
    match std::env::var_os("BRIQ_PREVIOUS_OPERATOR") {
        Some(binary) => Ok(PathBuf::from(binary)),
        None => script_output("compat/build.sh", &["--cached", version]),
    }
}

/// Runs `bash <repo>/<script> <args>` (its stderr goes to ours) and returns the last line it
/// printed on stdout: the scripts under `.ci/` and `tests/` print the directory they built or
/// found last.
pub fn script_output(script: &str, args: &[&str]) -> anyhow::Result<PathBuf> {
    let path = repo_root().join(script);
    let out = Command::new("bash")
        .arg(&path)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", path.display()))?;
    if !out.status.success() {
        bail!("{} {} failed ({})", script, args.join(" "), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default().trim();
    if last.is_empty() {
        bail!("{script} printed nothing");
    }
    Ok(PathBuf::from(last))
}

/// The venv whose Python runs the local sandboxes, with the bridge's dependencies installed (so
/// sandbox setup skips pip and reaches no package index): `BRIQ_SANDBOX_VENV`, else what
/// `.ci/python-env.sh` builds (once, cached) and prints. Looked up once per process.
pub fn sandbox_venv() -> anyhow::Result<PathBuf> {
    static VENV: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut cached = VENV.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(venv) = &*cached {
        return Ok(venv.clone());
    }
    let venv = match std::env::var_os("BRIQ_SANDBOX_VENV") {
        Some(venv) => PathBuf::from(venv),
        None => script_output(".ci/python-env.sh", &[])?,
    };
    *cached = Some(venv.clone());
    Ok(venv)
}
