//! `briq-operator run`: the operator process.

use std::time::Duration;

use anyhow::Context as _;
use url::Url;

use crate::{
    briq::{ApiKey, BriqClient, ClientOptions},
    controller::{self, Settings},
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Base URL of the briq API.
    #[arg(long, env = "BRIQ_API_URL", default_value = "https://api.briq.cloud")]
    pub briq_url: Url,

    /// API key for executors without `apiKeySecretRef`.
    #[arg(long, env = "BRIQ_API_KEY", hide_env_values = true)]
    pub default_api_key: Option<ApiKey>,

    /// Watch only this namespace [default: all namespaces].
    #[arg(long, env = "BRIQ_OPERATOR_NAMESPACE")]
    pub namespace: Option<String>,

    /// How often ready executors check that their sandbox still runs, in seconds.
    #[arg(long, default_value_t = 30)]
    pub probe_interval_seconds: u64,

    /// Per-request timeout of briq calls other than exec, in seconds.
    #[arg(long, default_value_t = 30)]
    pub briq_timeout_seconds: u64,
}

impl Args {
    pub fn settings(&self) -> Settings {
        Settings {
            default_api_key: self.default_api_key.clone(),
            probe_interval: Duration::from_secs(self.probe_interval_seconds),
            namespace: self.namespace.clone(),
            ..Settings::default()
        }
    }

    pub fn briq_client(&self) -> anyhow::Result<BriqClient> {
        let mut options = ClientOptions::new(self.briq_url.clone());
        options.request_timeout = Duration::from_secs(self.briq_timeout_seconds);
        BriqClient::new(options).context("building the briq client")
    }
}

/// Runs the controllers against the cluster of the ambient kubeconfig or service account until
/// SIGINT or SIGTERM.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes")?;
    let sandboxes = args.briq_client()?;
    controller::run(client, sandboxes, args.settings(), shutdown_signal()).await;
    Ok(())
}

async fn shutdown_signal() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
