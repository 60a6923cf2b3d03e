use briq_operator::{control_plane::ControlPlane, crd};
use clap::{Parser, Subcommand};

/// briq-operator: sandboxed Python executors (briq microVMs) as Kubernetes resources.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions as YAML (what `crds/` holds).
    Crd,
    /// Start a local etcd + kube-apiserver with the CRDs installed, print its kubeconfig path and
    /// run until interrupted. For development only.
    ControlPlane,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => print!("{}", crd::to_yaml()?),
        Command::ControlPlane => {
            let bin_dir = briq_operator::control_plane::binaries(env!("CARGO_MANIFEST_DIR").as_ref())?;
            let plane = ControlPlane::start(&bin_dir).await?;
            let client = kube::Client::try_from(plane.client_config().await?)?;
            crd::install(&client).await?;
            println!("control plane ready at {}", plane.server());
            println!("export KUBECONFIG={}", plane.kubeconfig().display());
            tokio::signal::ctrl_c().await?;
        }
    }
    Ok(())
}
