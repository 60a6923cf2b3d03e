//! The kubectl-style command line: `exec` runs code in a `BriqExecutor` and prints the result,
//! `logs` prints an existing `Execution`'s result, `cancel` cancels one, `get` lists executors,
//! Executions and pools, `describe` shows one executor with its queue, recent Executions and
//! Events, and `usage` shows what a namespace uses of each class against the class's limits.
//!
//! The same binary is a kubectl plugin when installed (or symlinked) as `kubectl-briq`: the
//! commands are then at the top level (`kubectl briq exec py -c '1 + 1'`).

mod cancel;
mod cluster;
mod cp;
mod describe;
mod error;
mod exec;
mod exit;
mod fork;
mod get;
mod live;
mod logs;
mod mcp;
mod output;
mod progress;
mod status;
mod table;
mod usage;

pub use error::Error;
pub use exit::Exit;

use output::printable;

use crate::telemetry;

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
    /// Copy a file into or out of a BriqExecutor's sandbox (`cp ./data.csv py:/work/data.csv`,
    /// `cp py:/work/out.png ./`), its SHA-256 checked end to end.
    Cp(cp::Args),
    /// List BriqExecutors and/or Executions.
    Get(get::Args),
    /// Show one BriqExecutor: spec, sandbox, conditions, queue, recent Executions and Events.
    Describe(describe::Args),
    /// Show what a namespace uses of each BriqExecutorClass, against the class's limits.
    ///
    /// Executors holding a sandbox and Executions running (each of the most the class allows
    /// one namespace), and how many of each wait for a place, counted as the operator counts.
    Usage(usage::Args),
    /// Cancel an Execution: one not sent yet never runs, a running one is interrupted in its
    /// kernel (KeyboardInterrupt), keeping the executor and its Python state.
    ///
    /// Sets spec.cancel. It ends Cancelled, unless it finished first; code that does not stop
    /// within a few seconds of the interrupt has its kernel restarted (its state is lost, and the
    /// error says so). With --wait, prints the result and exits as `logs` does.
    Cancel(cancel::Args),
    /// Fork a BriqExecutor with its Python state: N new executors whose kernels start with the
    /// source's namespace and working files, from one snapshot taken between two of its
    /// Executions (the source's Executions wait while it is saved).
    ///
    /// Prints each fork's name. With --wait, waits until every fork is Ready.
    Fork(fork::Args),
    /// Serve MCP on stdin/stdout for a desktop agent, relayed to the namespace's MCP endpoint
    /// with the kubeconfig's credentials (`claude mcp add briq -- kubectl briq mcp -n team-a`).
    ///
    /// One JSON-RPC message a line each way; what the endpoint streams (an action's prints)
    /// comes out as it arrives. Ends when stdin closes, ending the session.
    Mcp(mcp::Args),
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
        Command::Cp(args) => cp::run(args).await,
        Command::Get(args) => get::run(args).await,
        Command::Describe(args) => describe::run(args).await,
        Command::Usage(args) => usage::run(args).await,
        Command::Cancel(args) => cancel::run(args).await,
        Command::Fork(args) => fork::run(args).await,
        Command::Mcp(args) => mcp::run(args).await,
    };
    result.unwrap_or_else(|error| {
        eprintln!("error: {}", printable(&error.to_string()));
        Exit::Trouble
    })
}
