use briq_operator::{cli, control_plane, crd, demo, local_server, operator, telemetry};
use clap::{Parser, Subcommand};

/// briq-operator: sandboxed Python executors (briq microVMs) as Kubernetes resources.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Log format on stderr (filter with RUST_LOG).
    #[arg(long, global = true, value_enum, default_value_t)]
    log_format: telemetry::LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Cli(cli::Command),
    /// Run the operator (the BriqExecutor and Execution controllers).
    Run(operator::Args),
    /// Print the CustomResourceDefinitions as YAML (what `crds/` holds).
    Crd,
    /// Serve a local briq-compatible API whose sandboxes are host processes. Development and
    /// tests only: it is NOT an isolation boundary.
    LocalSandboxServer(local_server::Args),
    /// Run the main job end to end on this machine: local control plane, local sandbox server and
    /// operator; apply examples/executor.yaml and examples/execution.yaml; print the result; tear
    /// everything down.
    Demo,
    /// Run the local control plane, local sandbox server and operator until interrupted, for
    /// trying things by hand (kubectl) and for the Python tests. Development only.
    LocalStack {
        /// Where to write the admin kubeconfig.
        #[arg(long, default_value = "briq-local.kubeconfig")]
        kubeconfig: std::path::PathBuf,
    },
    /// Start a local etcd + kube-apiserver with the CRDs installed, print its kubeconfig path and
    /// run until interrupted. Development only.
    ControlPlane,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Installed or symlinked as `kubectl-briq`: only the CLI's commands, at the top level.
    if cli::invoked_as_kubectl_plugin() {
        cli::run_kubectl_plugin().await.exit();
    }
    let cli = Cli::parse();
    // The demo speaks through its progress lines; the operator's own logs would drown them.
    let default_filter = match cli.command {
        Command::Demo => "warn",
        Command::Cli(_) => cli::LOG_FILTER,
        _ => "info",
    };
    telemetry::init(cli.log_format, default_filter);
    match cli.command {
        Command::Cli(command) => cli::run(command).await.exit(),
        Command::Run(args) => operator::run(args).await?,
        Command::Demo => demo::run().await?,
        Command::LocalStack { kubeconfig } => demo::local_stack(kubeconfig).await?,
        Command::Crd => print!("{}", crd::to_yaml()?),
        Command::LocalSandboxServer(args) => local_server::run(args).await?,
        Command::ControlPlane => {
            let bin_dir = control_plane::binaries(env!("CARGO_MANIFEST_DIR").as_ref())?;
            let plane = control_plane::ControlPlane::start(&bin_dir).await?;
            let client = kube::Client::try_from(plane.client_config().await?)?;
            crd::install(&client).await?;
            println!("control plane ready at {}", plane.server());
            println!("export KUBECONFIG={}", plane.kubeconfig().display());
            tokio::signal::ctrl_c().await?;
        }
    }
    Ok(())
}
