//! The kubectl-style command line: `exec` runs code in a `BriqExecutor` and prints the result,
//! `logs` prints an existing `Execution`'s result, `get` lists both kinds.
//!
//! The same binary is a kubectl plugin when installed (or symlinked) as `kubectl-briq`: the
//! commands are then at the top level (`kubectl briq exec py -c '1 + 1'`).

mod cluster;
mod error;
mod exec;
mod get;
mod logs;
mod table;

pub use error::Error;

use std::io::Write as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::{crd::Execution, telemetry};

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
    /// stderr. Exit status: 0 when it succeeded, 1 when it failed, 2 when nothing could run
    /// (usage, cluster or executor problem).
    Exec(exec::Args),
    /// Print an existing Execution's result.
    ///
    /// Logs, output and final answer on stdout, the error on stderr, as `exec` prints them.
    /// Exit status as for `exec`; 0 while it has not finished.
    Logs(logs::Args),
    /// List BriqExecutors and/or Executions.
    Get(get::Args),
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
    };
    result.unwrap_or_else(|error| {
        eprintln!("error: {error}");
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
