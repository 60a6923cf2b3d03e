//! `briq-dev`: the development tooling of briq-operator (demo, local stack, local control plane,
//! local sandbox server, benchmarks).

use briq_dev::{bench, demo, local_server, stack::Stack};
use briq_operator::telemetry;
use clap::{Parser, Subcommand};

/// briq-dev: run briq-operator on this machine, for trying it, testing it and measuring it.
/// Development only.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    logging: telemetry::Logging,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the main job end to end on this machine: local control plane, local sandbox server and
    /// operator; apply examples/executor.yaml and examples/execution.yaml; print the result; tear
    /// everything down.
    Demo,
    /// Run the local control plane, local sandbox server and operator until interrupted, for
    /// trying things by hand (kubectl) and for the Python tests.
    LocalStack {
        /// Where to write the admin kubeconfig.
        #[arg(long, default_value = "briq-local.kubeconfig")]
        kubeconfig: std::path::PathBuf,
        /// Where to write the local sandbox server's URL (its MCP endpoint) and API key (JSON,
        /// mode 0600), for its admin API at the same host: faults and outages (`/_admin/…`).
        #[arg(long)]
        sandbox_server_file: Option<std::path::PathBuf>,
    },
    /// Start a local etcd + kube-apiserver with the CRDs installed, print its kubeconfig path and
    /// run until interrupted.
    ControlPlane,
    /// Serve briq's MCP tools locally, with sandboxes that are host processes. NOT an isolation
    /// boundary.
    LocalSandboxServer(local_server::Args),
    /// Measure briq-operator on this machine and print the figures (see `make bench`).
    Bench(bench::Args),
    /// Print the Python client's vocabulary (reasons and limits), generated from the operator's
    /// Rust definitions: what `bridge/agent/briq_operator_client/vocabulary.py` holds.
    Vocabulary,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    // The demo and the benchmarks speak through their progress lines; the in-process
    // operator's own logs would drown them.
    let default_filter = match cli.command {
        Command::Demo | Command::Bench(_) => "warn",
        _ => "info",
    };
    cli.logging.init(default_filter);
    if let Err(error) = run(cli.command).await {
        eprintln!("briq-dev: {error:#}");
        std::process::exit(1);
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Demo => demo::run().await,
        Command::LocalStack {
            kubeconfig,
            sandbox_server_file,
        } => demo::local_stack(&kubeconfig, sandbox_server_file.as_deref()).await,
        Command::LocalSandboxServer(args) => local_server::run(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Vocabulary => {
            print!("{}", briq_operator::crd::vocabulary::python_module());
            Ok(())
        }
        Command::ControlPlane => {
            let stack = Stack::builder().start().await?;
            let plane = stack.plane().expect("a control plane of our own");
            println!("control plane ready at {}", plane.server());
            println!("export KUBECONFIG={}", plane.kubeconfig().display());
            tokio::signal::ctrl_c().await?;
            stack.stop().await
        }
    }
}
