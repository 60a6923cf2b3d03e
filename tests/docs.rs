//! The docs book (`docs/`) built by mdbook, as `make docs` builds it: any mdbook warning or error
//! fails. mdbook comes from `tests/tools/build.sh` (`BRIQ_TOOLS_DIR`, else the script's
//! `--cached` answer); without it the test says so and skips, except under `BRIQ_CI` (`.ci/run`
//! builds it). The links and anchors are checked by the fast tier (`src/docs.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn skip<T>(why: &str) -> Option<T> {
    if std::env::var_os("BRIQ_CI").is_some() {
        panic!("{why}; under BRIQ_CI nothing is skipped");
    }
    eprintln!("SKIPPED: {why}");
    None
}

/// mdbook from the tools directory, or None (skipped) when it is not built.
fn mdbook() -> Option<PathBuf> {
    let dir = match std::env::var_os("BRIQ_TOOLS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let out = Command::new("bash")
                .arg(repo().join("tests/tools/build.sh"))
                .arg("--cached")
                .output()
                .expect("running tests/tools/build.sh --cached");
            let stdout = String::from_utf8_lossy(&out.stdout);
            match stdout.lines().last() {
                Some(dir) if out.status.success() => PathBuf::from(dir.trim()),
                _ => {
                    return skip("the tools are not built: run `bash tests/tools/build.sh`");
                }
            }
        }
    };
    let mdbook = dir.join("bin/mdbook");
    if mdbook.is_file() {
        Some(mdbook)
    } else {
        skip(&format!(
            "{} has no mdbook: run `bash tests/tools/build.sh` (make test and .ci/run do)",
            dir.display()
        ))
    }
}

#[test]
fn the_book_builds_without_a_warning() {
    let Some(mdbook) = mdbook() else { return };
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(&mdbook)
        .args(["build", "--dest-dir"])
        .arg(out_dir.path())
        .arg(repo().join("docs"))
        .output()
        .expect("running mdbook");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "mdbook build docs failed:\n{log}");
    let complaints: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("WARN") || line.contains("ERROR"))
        .collect();
    assert!(
        complaints.is_empty(),
        "mdbook build docs warned:\n{}",
        complaints.join("\n")
    );
    for page in ["index.html", "getting-started.html", "reference/api.html"] {
        assert!(out_dir.path().join(page).is_file(), "{page} not built");
    }
}
