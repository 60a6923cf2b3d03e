//! The kubectl-style command line: `exec` runs code in a `BriqExecutor` and prints the result,
//! `logs` prints an existing `Execution`'s result, `get` lists both kinds, `describe` shows one
//! executor with its queue, recent Executions and Events.
//!
//! The same binary is a kubectl plugin when installed (or symlinked) as `kubectl-briq`: the
//! commands are then at the top level (`kubectl briq exec py -c '1 + 1'`).

mod cluster;
mod describe;
mod error;
mod exec;
mod get;
mod logs;
mod progress;
mod table;
mod usage;

pub use error::Error;

use std::{borrow::Cow, io::Write as _};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::{
    crd::{
        Execution,
        reasons::{ExecutionReason, Phase},
    },
    telemetry,
};

/// The name kubectl looks for on `PATH` to run `kubectl briq ...`.
pub const KUBECTL_PLUGIN_NAME: &str = "kubectl-briq";

/// Default log filter of the commands: none, they report their own errors (kube's logs would
/// repeat them). `RUST_LOG` turns logs on.
pub const LOG_FILTER: &str = "off";

#[derive(clap::Subcommand)]
pub enum Command {
    /// Run Python code in a BriqExecutor and print its result.
    ///
    /// Creates an Execution (kept as the record unless --rm), waits on a watch until it has
    /// finished, prints its logs, output and final answer (as JSON) on stdout and its error on
    /// stderr. While it waits and runs, progress goes to stderr when stderr is a terminal (or
    /// with --progress). Exit status: 0 when it succeeded, 1 when it failed, 2 when nothing
    /// could run (usage, cluster or executor problem).
    Exec(exec::Args),
    /// Print an existing Execution's result.
    ///
    /// Logs, output and final answer on stdout, the error on stderr, as `exec` prints them.
    /// Exit status as for `exec`; 0 while it has not finished.
    Logs(logs::Args),
    /// List BriqExecutors and/or Executions.
    Get(get::Args),
    /// Show one BriqExecutor: spec, sandbox, conditions, queue, recent Executions and Events.
    Describe(describe::Args),
    /// Show what a namespace uses of each BriqExecutorClass, against the class's limits.
    ///
    /// Executors holding a sandbox and Executions running (each of the most the class allows
    /// one namespace), and how many of each wait for a place, counted as the operator counts.
    Usage(usage::Args),
}

/// `kubectl briq ...`: the same commands, at the top level.
#[derive(clap::Parser)]
#[command(name = KUBECTL_PLUGIN_NAME, bin_name = "kubectl briq", version)]
#[command(about = "Run Python in briq executors and read the results (briq-operator's CLI)")]
pub struct KubectlPlugin {
    #[command(subcommand)]
    pub command: Command,
}

/// True when the binary was started as `kubectl-briq` (a symlink, or by kubectl).
pub fn invoked_as_kubectl_plugin() -> bool {
    std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .is_some_and(|program| {
            program
                .file_name()
                .is_some_and(|name| name == KUBECTL_PLUGIN_NAME)
        })
}

/// Parses the plugin's command line and runs it.
pub async fn run_kubectl_plugin() -> Exit {
    let plugin = <KubectlPlugin as clap::Parser>::parse();
    telemetry::init(telemetry::LogFormat::Text, LOG_FILTER);
    run(plugin.command).await
}

/// Runs one command; its errors are printed on stderr.
pub async fn run(command: Command) -> Exit {
    let result = match command {
        Command::Exec(args) => exec::run(args).await,
        Command::Logs(args) => logs::run(args).await,
        Command::Get(args) => get::run(args).await,
        Command::Describe(args) => describe::run(args).await,
        Command::Usage(args) => usage::run(args).await,
    };
    result.unwrap_or_else(|error| {
        eprintln!("error: {}", printable(&error.to_string()));
        Exit::Trouble
    })
}

/// How a command ended, as the process's exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done; the Execution (if any) succeeded or has not finished.
    Ok = 0,
    /// The Execution failed: the code raised, timed out, or the executor could not run it.
    ExecutionFailed = 1,
    /// Nothing could be run or shown: usage, cluster or executor problem.
    Trouble = 2,
}

impl Exit {
    pub fn exit(self) -> ! {
        let _ = std::io::stdout().flush();
        std::process::exit(self as i32)
    }
}

/// Writes a command's output. Failures (a closed pipe, as in `| head`) are ignored, as kubectl
/// does: there is nobody left to tell.
fn emit(stdout: &str, stderr: &str) {
    let _ = std::io::stdout().write_all(stdout.as_bytes());
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().write_all(stderr.as_bytes());
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|condition| condition.type_ == type_)
}

/// The Execution's `Succeeded` condition, once the operator has set it.
fn succeeded(execution: &Execution) -> Option<&Condition> {
    condition(&execution.status.as_ref()?.conditions, "Succeeded")
}

/// An Execution without what its code produced (logs, output, answer, error) and without its
/// code: what is kept of the Executions listed or watched only for their place and phase.
fn without_results(mut execution: Execution) -> Execution {
    execution.spec.code.clear();
    if let Some(status) = execution.status.as_mut() {
        status.logs = None;
        status.output = None;
        status.final_answer = None;
        status.error = None;
    }
    execution
}

/// Where an Execution stands, from its `Succeeded` condition: waiting until the operator has
/// reported on it, and while its reason is not one this CLI knows (a newer operator's).
fn phase(execution: &Execution) -> Phase {
    match succeeded(execution) {
        Some(c) if c.status == "True" => Phase::Succeeded,
        Some(c) if c.status == "False" => Phase::Failed,
        Some(c) => ExecutionReason::parse(&c.reason).map_or(Phase::Waiting, |r| r.phase()),
        None => Phase::Waiting,
    }
}

/// Text from the cluster made safe to print on a terminal. Status fields, condition messages
/// and Events are written by whoever may write them, not only by the operator: a message with
/// an escape sequence could move the cursor, rewrite earlier lines or set the window title, and
/// bidirectional overrides can make text read differently than it is. Control characters
/// (newlines too: one value, one line) and those overrides become visible escapes (`\n`,
/// `\u{1b}`); everything else, any script included, is kept.
fn printable(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control()
            || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            '\t' => escaped.push_str("\\t"),
            c if unsafe_char(c) => escaped.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_escape_injection_from_cluster_text_is_printed_inert() {
        let cases = [
            ("KernelReady", "KernelReady"),
            ("naïve 日本語 ✓", "naïve 日本語 ✓"),
            ("\u{1b}]0;pwned\u{7}", "\\u{1b}]0;pwned\\u{7}"),
            (
                "\u{1b}[2J\u{1b}[Hfake prompt",
                "\\u{1b}[2J\\u{1b}[Hfake prompt",
            ),
            ("line one\nline two\r", "line one\\nline two\\r"),
            ("\u{9b}31m", "\\u{9b}31m"),
            ("abc\u{202e}fed", "abc\\u{202e}fed"),
            ("\u{7f}", "\\u{7f}"),
        ];
        for (text, shown) in cases {
            assert_eq!(printable(text), shown, "{text:?}");
        }
        assert!(matches!(printable("plain"), Cow::Borrowed(_)));
    }

    fn execution(status: Option<(&str, &str)>) -> Execution {
        let conditions = status.map_or(serde_json::json!([]), |(status, reason)| {
            serde_json::json!([{
                "type": "Succeeded", "status": status, "reason": reason, "message": "",
                "lastTransitionTime": "2025-01-01T00:00:00Z"
            }])
        });
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "py-1" },
            "spec": { "executorRef": { "name": "py" }, "code": "1" },
            "status": { "conditions": conditions },
        }))
        .unwrap()
    }

    #[test]
    fn the_phase_follows_succeeded_and_an_unknown_reason_waits() {
        let cases = [
            (None, Phase::Waiting),
            (Some(("Unknown", "Queued")), Phase::Waiting),
            (Some(("Unknown", "ExecutorNotReady")), Phase::Waiting),
            (Some(("Unknown", "Running")), Phase::Running),
            (Some(("Unknown", "SomethingNewer")), Phase::Waiting),
            (Some(("True", "Completed")), Phase::Succeeded),
            (Some(("False", "Timeout")), Phase::Failed),
            (Some(("False", "Running")), Phase::Failed),
        ];
        for (status, expected) in cases {
            assert_eq!(phase(&execution(status)), expected, "{status:?}");
        }
    }
}
