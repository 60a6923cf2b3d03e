use briq_operator::{cli, crd, operator, telemetry};
use clap::{Parser, Subcommand};

/// briq-operator: sandboxed Python executors (briq microVMs) as Kubernetes resources.
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
    #[command(flatten)]
    Cli(cli::Command),
    /// Run the operator (the BriqExecutor and Execution controllers).
    Run(Box<operator::Args>),
    /// Print the CustomResourceDefinitions as YAML (what `crds/` holds).
    Crd,
    /// Print the API reference of the CRDs as Markdown (what docs/src/reference/api.md holds).
    ApiReference,
    /// Check briq's MCP server: compare its `tools/list` with every tool and argument the
    /// operator sends, and print each difference (exit 1 when there is one).
    CheckBriq(operator::CheckArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Installed or symlinked as `kubectl-briq`: only the CLI's commands, at the top level.
    if cli::invoked_as_kubectl_plugin() {
        cli::run_kubectl_plugin().await.exit();
    }
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Command::Cli(_) => cli::LOG_FILTER,
        _ => "info",
    };
    cli.logging.init(default_filter);
    match cli.command {
        Command::Cli(command) => cli::run(command).await.exit(),
        Command::Run(args) => operator::run(*args).await?,
        Command::Crd => print!("{}", crd::to_yaml()?),
        Command::ApiReference => print!("{}", crd::reference::markdown()),
        Command::CheckBriq(args) => {
            if !operator::check_briq(args).await? {
                std::process::exit(1);
            }
        }
    }
    Ok(())
}
