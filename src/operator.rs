//! `briq-operator run`: the operator process — the controllers (behind leader election when
//! asked) and the HTTP endpoints `/healthz`, `/readyz` and `/metrics`.

use std::{net::SocketAddr, time::Duration};

use anyhow::Context as _;
use url::Url;

use crate::{
    briq::{ApiKey, BriqClient, ClientOptions, SandboxApi},
    controller::{self, Observer, Settings},
    http::{self, Role},
    leader::{self, LeaseConfig},
    subresources,
    task::AbortOnDrop,
};

/// How often the aggregated API looks at its serving certificate's files for a renewal.
const CERTIFICATE_LOOK_EVERY: Duration = Duration::from_secs(10);

#[derive(clap::Args, Debug)]
pub struct Args {
    /// briq's MCP endpoint (Streamable HTTP).
    #[arg(long, env = "BRIQ_API_URL", default_value = crate::briq::api::DEFAULT_BASE_URL)]
    pub briq_url: Url,

    /// API key for executors without `apiKeySecretRef`. Taken as text and checked afterwards,
    /// so that no parse error can echo it.
    #[arg(long, env = "BRIQ_API_KEY", hide_env_values = true)]
    pub default_api_key: Option<String>,

    /// Accept an `http://` briq URL, which would send the API key in clear text. Only for a
    /// local briq-compatible server.
    #[arg(long, env = "BRIQ_ALLOW_PLAIN_HTTP")]
    pub allow_plain_http: bool,

    /// The operator's own namespace, which holds the key Secrets that BriqExecutorClasses name
    /// (tenants should have no access to it) [default: POD_NAMESPACE].
    #[arg(long, env = "BRIQ_PLATFORM_NAMESPACE")]
    pub platform_namespace: Option<String>,

    /// Watch only this namespace [default: all namespaces].
    #[arg(long, env = "BRIQ_OPERATOR_NAMESPACE")]
    pub namespace: Option<String>,

    /// How often ready executors check that their sandbox still runs, in seconds.
    #[arg(long, default_value_t = 30)]
    pub probe_interval_seconds: u64,

    /// How often the orphan sweeper destroys sandboxes named like an executor that no longer
    /// exists (also run when an executor is deleted), in seconds; 0 turns it off.
    #[arg(long, default_value_t = 300)]
    pub orphan_sweep_interval_seconds: u64,

    /// How old a sandbox without an executor must be before the sweeper destroys it, in seconds
    /// (a create in flight is never an orphan).
    #[arg(long, default_value_t = 600)]
    pub orphan_grace_seconds: u64,

    /// How long an Execution waits for a BriqExecutor that does not exist before it fails with
    /// `ExecutorNeverAppeared`, in seconds.
    #[arg(long, default_value_t = 600)]
    pub executor_wait_seconds: u64,

    /// How long beyond its own deadline an Execution whose outcome briq left unknown (a 5xx, a
    /// timeout, an outage) waits for briq to say, from the sandbox's attempt journal, whether
    /// its code ran, in seconds. Past it the outcome stays unknown and the executor unusable.
    #[arg(long, default_value_t = 600)]
    pub outage_patience_seconds: u64,

    /// Work slots of the executor controller: how many BriqExecutor reconciles do work at once,
    /// shared round-robin across namespaces; one waiting for a sandbox's setup holds none.
    #[arg(long, default_value_t = 32)]
    pub max_concurrent_executors: u16,

    /// Work slots of the execution controller: how many Execution reconciles do work at once,
    /// shared round-robin across namespaces. An action running in its kernel holds none, so
    /// this bounds the operator's work, not the actions in flight.
    #[arg(long, default_value_t = 256)]
    pub max_concurrent_executions: u16,

    /// Per-request timeout of briq calls other than exec, in seconds.
    #[arg(long, default_value_t = 30)]
    pub briq_timeout_seconds: u64,

    /// Run the controllers only while holding a coordination.k8s.io Lease, so that several
    /// replicas can run with one active (the Helm chart turns this on).
    #[arg(long, env = "BRIQ_LEADER_ELECTION")]
    pub leader_election: bool,

    /// Name of the leader-election Lease.
    #[arg(long, default_value = "briq-operator")]
    pub lease_name: String,

    /// Namespace of the leader-election Lease [default: the namespace of the kubeconfig context
    /// or service account].
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// This replica's identity in the Lease [default: pod or host name plus a random suffix].
    #[arg(long)]
    pub lease_identity: Option<String>,

    /// How long a Lease stays valid after a renewal; a standby takes over at most this long after
    /// the leader dies.
    #[arg(long, default_value_t = 15)]
    pub lease_duration_seconds: u64,

    /// The leader renews the Lease this long before it expires (and stops leading if it cannot).
    #[arg(long, default_value_t = 5)]
    pub lease_grace_seconds: u64,

    /// Address of the HTTP endpoints /healthz, /readyz and /metrics.
    #[arg(long, env = "BRIQ_HTTP_ADDRESS", default_value = "127.0.0.1:8080")]
    pub http_address: SocketAddr,

    /// Address of the aggregated API (`subresources.briq.cloud`: an action's live output),
    /// which kube-apiserver reaches through an APIService; off when unset.
    #[arg(long, env = "BRIQ_SUBRESOURCES_ADDRESS", requires_all = ["subresources_cert_file", "subresources_key_file"])]
    pub subresources_address: Option<SocketAddr>,

    /// The aggregated API's serving certificate (PEM), valid for the Service the APIService
    /// names (`<service>.<namespace>.svc`).
    #[arg(long, env = "BRIQ_SUBRESOURCES_CERT_FILE")]
    pub subresources_cert_file: Option<std::path::PathBuf>,

    /// The key of `--subresources-cert-file` (PEM).
    #[arg(long, env = "BRIQ_SUBRESOURCES_KEY_FILE")]
    pub subresources_key_file: Option<std::path::PathBuf>,
}

impl Args {
    pub fn settings(&self) -> anyhow::Result<Settings> {
        let default_api_key = match &self.default_api_key {
            Some(text) => Some(ApiKey::new(text.as_str()).map_err(|error| {
                anyhow::anyhow!("--default-api-key (BRIQ_API_KEY) is not a usable key: {error}")
            })?),
            None => None,
        };
        Ok(Settings {
            default_api_key,
            platform_namespace: self
                .platform_namespace
                .clone()
                .or_else(|| self.lease_namespace.clone()),
            probe_interval: Duration::from_secs(self.probe_interval_seconds),
            namespace: self.namespace.clone(),
            orphan_sweep_interval: (self.orphan_sweep_interval_seconds > 0)
                .then(|| Duration::from_secs(self.orphan_sweep_interval_seconds)),
            orphan_grace: Duration::from_secs(self.orphan_grace_seconds),
            executor_wait: Duration::from_secs(self.executor_wait_seconds),
            outage_patience: Duration::from_secs(self.outage_patience_seconds),
            pending_create_expiry: Duration::from_secs(self.briq_timeout_seconds.saturating_mul(2)),
            executor_concurrency: self.max_concurrent_executors,
            execution_concurrency: self.max_concurrent_executions,
            ..Settings::default()
        })
    }

    pub fn briq_client(&self) -> anyhow::Result<BriqClient> {
        let mut options = ClientOptions::new(self.briq_url.clone());
        options.request_timeout = Duration::from_secs(self.briq_timeout_seconds);
        options.allow_plain_http = self.allow_plain_http;
        BriqClient::new(options).context("building the briq client")
    }

    /// The Lease to hold, when leader election is on.
    pub fn lease(&self, config: &kube::Config) -> anyhow::Result<Option<LeaseConfig>> {
        if !self.leader_election {
            return Ok(None);
        }
        let lease = LeaseConfig {
            name: self.lease_name.clone(),
            namespace: self
                .lease_namespace
                .clone()
                .unwrap_or_else(|| config.default_namespace.clone()),
            identity: self
                .lease_identity
                .clone()
                .unwrap_or_else(leader::default_identity),
            duration_seconds: self.lease_duration_seconds,
            grace_seconds: self.lease_grace_seconds,
        };
        lease.validate().map_err(anyhow::Error::msg)?;
        Ok(Some(lease))
    }
}

/// `briq-operator check-briq`: the live conformance check from a shell.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// briq's MCP endpoint (Streamable HTTP).
    #[arg(long, env = "BRIQ_API_URL", default_value = crate::briq::api::DEFAULT_BASE_URL)]
    pub briq_url: Url,

    /// The API key to check with. Taken as text and checked afterwards, so that no parse error
    /// can echo it.
    #[arg(long, env = "BRIQ_API_KEY", hide_env_values = true)]
    pub api_key: String,

    /// Accept an `http://` briq URL (a local briq-compatible server only).
    #[arg(long, env = "BRIQ_ALLOW_PLAIN_HTTP")]
    pub allow_plain_http: bool,
}

/// Prints what the server declares against what the operator sends; `false` on a mismatch.
pub async fn check_briq(args: CheckArgs) -> anyhow::Result<bool> {
    let key = ApiKey::new(args.api_key.as_str()).map_err(|error| {
        anyhow::anyhow!("--api-key (BRIQ_API_KEY) is not a usable key: {error}")
    })?;
    let mut options = ClientOptions::new(args.briq_url.clone());
    options.allow_plain_http = args.allow_plain_http;
    let client = BriqClient::new(options).context("building the briq client")?;
    let started = std::time::Instant::now();
    let mismatches = client
        .check_conformance(&key)
        .await
        .with_context(|| format!("calling tools/list at {}", args.briq_url))?;
    let took = started.elapsed();
    for (tool, parameters) in crate::briq::api::SENT {
        let named = |m: &crate::briq::Mismatch| m.tool() == *tool;
        let verdict = if mismatches.iter().any(named) {
            "MISMATCH"
        } else {
            "ok"
        };
        println!("{verdict:8} {tool}({})", parameters.join(", "));
    }
    for mismatch in &mismatches {
        println!("  {mismatch}");
    }
    println!(
        "{} at {} in {} ms (initialize, initialized, tools/list)",
        if mismatches.is_empty() {
            "the server declares every tool and argument the operator sends"
        } else {
            "BriqInterfaceMismatch"
        },
        args.briq_url,
        took.as_millis()
    );
    Ok(mismatches.is_empty())
}

/// How [`serve`] runs.
pub struct Options {
    pub settings: Settings,
    /// Hold this Lease to run the controllers; `None` runs them at once.
    pub lease: Option<LeaseConfig>,
    /// Serve /healthz, /readyz and /metrics here.
    pub http: Option<tokio::net::TcpListener>,
    /// Serve the aggregated API so.
    pub subresources: Option<subresources::Serving>,
}

/// Runs the controllers against the cluster of the ambient kubeconfig or service account until
/// SIGINT or SIGTERM.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let config = kube::Config::infer()
        .await
        .context("finding the Kubernetes configuration")?;
    let sandboxes = args.briq_client()?;
    let settings = args.settings()?;
    if let Some(key) = settings.default_api_key.clone() {
        // The default key's check at start: a mismatch is logged now, not at the first create.
        let client = sandboxes.clone();
        tokio::spawn(async move {
            // The key's first-use check, shared with the reconciles that start meanwhile.
            match client.conforms(&key).await {
                Ok(()) => {
                    tracing::info!(
                        "briq's MCP server declares every tool and argument the operator sends"
                    );
                }
                // Each mismatch was logged by the check.
                Err(crate::briq::Error::InterfaceMismatch { .. }) => {}
                Err(error) => {
                    tracing::warn!(%error, "briq's tools/list could not be read at start; checked again at the key's first use")
                }
            }
        });
    }
    let http = tokio::net::TcpListener::bind(args.http_address)
        .await
        .with_context(|| format!("listening on {}", args.http_address))?;
    let subresources = match (
        args.subresources_address,
        &args.subresources_cert_file,
        &args.subresources_key_file,
    ) {
        (Some(address), Some(cert), Some(key)) => Some(subresources::Serving {
            listener: tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("listening on {address}"))?,
            cert_pem: std::fs::read_to_string(cert)
                .with_context(|| format!("reading {}", cert.display()))?,
            key_pem: std::fs::read_to_string(key)
                .with_context(|| format!("reading {}", key.display()))?,
            files: Some(subresources::CertificateFiles {
                cert: cert.clone(),
                key: key.clone(),
                every: CERTIFICATE_LOOK_EVERY,
            }),
        }),
        _ => None,
    };
    let options = Options {
        settings,
        lease: args.lease(&config)?,
        http: Some(http),
        subresources,
    };
    serve(
        config,
        sandboxes,
        options,
        Observer::default(),
        shutdown_signal(),
    )
    .await
}

/// The operator: HTTP endpoints, and the controllers (while leading, with a lease) until
/// `shutdown` resolves; then the controllers finish what runs and the lease is released.
pub async fn serve<S>(
    config: kube::Config,
    sandboxes: S,
    options: Options,
    observer: Observer,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()>
where
    S: SandboxApi + Clone + 'static,
{
    let client = crate::kube_client::client(config.clone()).context("connecting to Kubernetes")?;
    crate::traces::init().context("configuring traces")?;
    let http = options.http.map(|listener| {
        let (health, metrics) = (observer.health.clone(), observer.metrics.clone());
        if let Ok(address) = listener.local_addr() {
            tracing::info!(%address, "serving /healthz, /readyz and /metrics");
        }
        AbortOnDrop(tokio::spawn(async move {
            if let Err(error) = http::serve(listener, health, metrics).await {
                tracing::error!(%error, "the HTTP server stopped");
            }
        }))
    });
    let _subresources = match options.subresources {
        Some(serving) => Some(serve_subresources(
            client.clone(),
            sandboxes.clone(),
            options.settings.clone(),
            serving,
        )),
        None => None,
    };
    match options.lease {
        None => {
            observer.health.set_role(Role::Single);
            observer.metrics.set_leader(true);
            let health = observer.health.clone();
            let shutdown = async move {
                shutdown.await;
                tracing::info!(
                    "shutting down: no new Executions start; waiting for the running ones"
                );
                health.set_stopping();
            };
            controller::run_observed(
                client,
                sandboxes,
                options.settings,
                shutdown,
                observer.clone(),
            )
            .await;
            observer.metrics.set_leader(false);
        }
        Some(lease) => {
            let lease_client = leader::lease_client(config, lease.grace_seconds)
                .context("building the leader-election client")?;
            let (health, metrics) = (observer.health.clone(), observer.metrics.clone());
            leader::run(lease_client, lease, health, metrics, shutdown, |stop| {
                let stop = async move {
                    let _ = stop.await;
                };
                controller::run_observed(
                    client.clone(),
                    sandboxes.clone(),
                    options.settings.clone(),
                    stop,
                    observer.clone(),
                )
            })
            .await;
        }
    }
    drop(http);
    crate::traces::flush();
    Ok(())
}

/// The aggregated API on a task of its own, on every replica (a standby's answers need no
/// lease). An API server without the front-proxy flags leaves it off, said in the log: the
/// controllers run either way.
fn serve_subresources<S: SandboxApi + Clone + 'static>(
    client: kube::Client,
    sandboxes: S,
    settings: Settings,
    serving: subresources::Serving,
) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        let proxy = match subresources::FrontProxy::from_cluster(client.clone()).await {
            Ok(proxy) => proxy,
            Err(error) => {
                tracing::error!(%error, "the aggregated API is off");
                return;
            }
        };
        if let Ok(address) = serving.listener.local_addr() {
            tracing::info!(%address, "serving the aggregated API {}", subresources::GROUP);
        }
        let keys = controller::ExecutorKeys::start(client, sandboxes, settings);
        if let Err(error) = subresources::serve(serving, keys, proxy).await {
            tracing::error!(%error, "the aggregated API stopped");
        }
    }))
}

async fn shutdown_signal() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn an_unusable_default_key_is_refused_without_being_echoed() {
        let secret = "sk-live secret-with-a-space";
        let command = Command::try_parse_from(["briq-operator", "--default-api-key", secret])
            .expect("any text parses");
        let error = command.args.settings().expect_err("not a header-safe key");
        let shown = format!("{error:#} {error:?}");
        assert!(
            !shown.contains("sk-live") && !shown.contains("secret-with"),
            "{shown}"
        );
        assert!(shown.contains("BRIQ_API_KEY"), "{shown}");
    }
}
