//! A local briq-compatible sandbox server, for development and tests.
//!
//! **Not an isolation boundary.** Every sandbox is a directory on this host and its commands are
//! ordinary host processes running as the server's user, with the server's file system and
//! network. Use it for development and tests only, never for untrusted code.
//!
//! What it serves, every route behind the same bearer key:
//! - **The MCP surface** ([`LocalServer::url`], `POST /mcp`): briq's published MCP tools
//!   (`briq_run`, `briq_list`, `briq_status`, `briq_exec` with `async`, `briq_exec_result`,
//!   `briq_exec_stop`, `briq_files_put`, `briq_files_get`, `briq_stop`, `briq_start`,
//!   `briq_destroy`) over JSON-RPC and Streamable HTTP, with the
//!   argument and answer types of [`briq_operator::briq::api`]: sessions, `tools/list` as briq
//!   publishes it, tool errors, image reads, answers as JSON or, with
//!   [`Config::sse_answers`], as event streams (see `mcp`).
//! - **The legacy REST surface** ([`LocalServer::rest_url`], `/v1/sandboxes…`), only with
//!   [`Config::legacy_rest`]: the previous release's routes and wire types, for the upgrade test,
//!   whose previous operator speaks it next to this tree's. Both surfaces share the sandboxes.
//! - **The admin API** (`/_admin/…`, [`AdminClient`]): fault rules and outages, call counts per
//!   [`Operation`], live sandboxes, simulated sleep and restart, and changes to what the MCP
//!   surface declares ([`DeclaredChange`]).
//! - **Faults** ([`Fault`]): each acts on the HTTP answer of one counted call (`initialize`,
//!   `tools/list`, each tool call, each REST route): error statuses, dropped connections before
//!   or after the effect, bodies that are not JSON, event streams cut before the answer, tool
//!   and JSON-RPC errors, delays, gateway pages echoing the key or the request (see `perform`).
//!
//! A sandbox is `<root>/<id>/fs`, which is sandbox `/`; file paths map inside it. `briq_exec`
//! runs its command as given with the sandbox's `/` as working directory and the host path of
//! that `/` in `BRIQ_LOCAL_SANDBOX_ROOT`, so the client's exec prelude `cd`s inside it (commands
//! themselves see the host's `/`). A command runs in its own process group, killed at 60 s;
//! processes that detach keep running and are found through a marker variable (see `process`).
//! An async exec (`async_exec`) has no time limit; its output is kept in the sandbox and read by
//! offset as it comes, and stopping it kills every process it started. Sleep and restart are
//! simulated by killing the sandbox's processes, keeping its files (an async exec killed so is
//! `lost`).
//!
//! **Simulated mode** (`--simulate`, [`Config::simulation`]), for benchmarks at scale only,
//! never a default and never used by behaviour tests: like KWOK's nodes, sandboxes run no
//! process; the server answers the bridge's commands itself (setup and kernel start after a
//! short delay, a run after its code's `# sleep-ms: N`, each attempt at most once; see
//! `simulated`), taking the working directory and time limit out of the exec prelude. Files,
//! sleep, restart, destroy, listing, call counts and faults work as in the real mode; sleep,
//! restart and destroy kill the simulated kernel.

mod admin;
mod async_exec;
mod auth;
mod faults;
mod http;
mod mcp;
mod paths;
mod perform;
mod process;
mod rest;
mod root;
mod sandbox_io;
mod simulated;
mod state;

pub use admin::{AdminClient, Stats};
pub use faults::{Fault, FaultRule, Operation, OperationMatch, Outage};
pub use mcp::DeclaredChange;
pub use simulated::Simulation;
pub use state::LiveSandbox;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use url::Url;

use briq_operator::briq::ApiKey;
use state::Shared;

/// How long shutdown waits for in-flight requests after the sandboxes are gone.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Run a local briq-compatible sandbox server.
///
/// NOT an isolation boundary: sandboxes are plain host processes running as this server's user,
/// with its files and network. For development and tests only; never run untrusted code with it.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "NOT an isolation boundary: sandboxes are host processes running as this user. Development and tests only."
)]
pub struct Args {
    /// Address to listen on. Only loopback addresses unless --allow-non-loopback is given.
    #[arg(long, default_value = "127.0.0.1:8787")]
    pub listen: SocketAddr,

    /// Accept a non-loopback --listen address: whoever reaches it with the key runs commands as
    /// this user.
    #[arg(long)]
    pub allow_non_loopback: bool,

    /// Directory for sandbox files [default: a temporary directory, removed on exit]. Run as
    /// root, the server refuses one the kernel's user (uid 65534) cannot enter.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,

    /// API key clients must send as `Authorization: Bearer <key>`.
    #[arg(long, env = "BRIQ_API_KEY", hide_env_values = true)]
    pub api_key: ApiKey,

    /// Python virtual environment whose bin/ goes first on the PATH of sandbox commands, so
    /// `python3` is that venv's (e.g. one with the bridge's dependencies installed).
    #[arg(long, value_name = "PATH")]
    pub python_venv: Option<PathBuf>,

    /// Write the bound port to this file once listening (useful with port 0).
    #[arg(long, value_name = "FILE")]
    pub port_file: Option<PathBuf>,

    /// Simulated sandboxes, for benchmarks at scale: no process runs, the server answers the
    /// bridge's commands itself (a run waits for its code's `# sleep-ms: N` comment and outputs
    /// its last line). Never for tests of behaviour.
    #[arg(long)]
    pub simulate: bool,

    /// With --simulate: how long a bridge setup takes.
    #[arg(long, default_value_t = 50, value_name = "MS", requires = "simulate")]
    pub simulated_setup_ms: u64,

    /// With --simulate: how long starting a kernel takes.
    #[arg(long, default_value_t = 20, value_name = "MS", requires = "simulate")]
    pub simulated_kernel_ms: u64,

    /// Answer every `tools/call` as an event stream (text/event-stream) instead of one JSON
    /// body, as Streamable HTTP allows.
    #[arg(long)]
    pub sse_answers: bool,

    /// Also serve the previous release's REST surface (/v1/sandboxes…) on the same sandboxes.
    #[arg(long)]
    pub legacy_rest: bool,
}

impl Args {
    fn simulation(&self) -> Option<Simulation> {
        self.simulate.then(|| Simulation {
            setup: Duration::from_millis(self.simulated_setup_ms),
            kernel_start: Duration::from_millis(self.simulated_kernel_ms),
        })
    }
}

/// Settings of an in-process server (see [`spawn`]).
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub allow_non_loopback: bool,
    /// `None`: a temporary directory, removed with the server.
    pub root: Option<PathBuf>,
    pub api_key: ApiKey,
    pub python_venv: Option<PathBuf>,
    /// `Some`: simulated sandboxes (see the module documentation); `python_venv` is unused.
    pub simulation: Option<Simulation>,
    /// Answer every `tools/call` as an event stream rather than one JSON body.
    pub sse_answers: bool,
    /// Also serve the previous release's REST surface, at [`LocalServer::rest_url`].
    pub legacy_rest: bool,
}

impl Config {
    /// Loopback on a free port, temporary root, host Python.
    pub fn new(api_key: ApiKey) -> Self {
        Self {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            allow_non_loopback: false,
            root: None,
            api_key,
            python_venv: None,
            simulation: None,
            sse_answers: false,
            legacy_rest: false,
        }
    }
}

/// A running server. Dropping it kills every sandbox process (SIGKILL) and removes the
/// sandboxes, so a panicking test leaks nothing; [`LocalServer::shutdown`] also stops serving.
pub struct LocalServer {
    /// `http://ADDR/`: the legacy REST surface and the admin API answer under it.
    base: Url,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    // Dropped after `Drop::drop` has killed the processes using it.
    _temp_root: Option<tempfile::TempDir>,
}

impl LocalServer {
    /// The MCP endpoint, `http://ADDR/mcp`, for [`briq_operator::briq::ClientOptions::base_url`].
    pub fn url(&self) -> Url {
        let mut url = self.base.clone();
        url.set_path(mcp::ENDPOINT);
        url
    }

    /// `http://ADDR/`: the base of the legacy REST surface (served with [`Config::legacy_rest`]),
    /// as the previous release's operator takes it.
    pub fn rest_url(&self) -> Url {
        self.base.clone()
    }

    pub fn api_key(&self) -> &ApiKey {
        &self.shared.api_key
    }

    pub fn admin(&self) -> AdminClient {
        AdminClient::new(self.rest_url(), self.shared.api_key.clone())
    }

    /// Destroys every sandbox, then stops serving.
    pub async fn shutdown(mut self) {
        let shared = Arc::clone(&self.shared);
        let _ = tokio::task::spawn_blocking(move || shared.destroy_all_blocking()).await;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.shared.destroy_all_blocking();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Starts a server inside this process.
pub async fn spawn(config: Config) -> anyhow::Result<LocalServer> {
    if !config.listen.ip().is_loopback() && !config.allow_non_loopback {
        bail!(
            "refusing to listen on non-loopback address {} (sandboxes run as this user); \
             pass --allow-non-loopback to insist",
            config.listen
        );
    }
    if let Some(venv) = &config.python_venv {
        let python = venv.join("bin").join("python3");
        if !python.exists() {
            bail!("--python-venv {}: no {}", venv.display(), python.display());
        }
    }
    let (root, temp_root) = match config.root {
        Some(root) => {
            std::fs::create_dir_all(&root)
                .with_context(|| format!("creating sandbox root {}", root.display()))?;
            (root, None)
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix("briq-local-")
                .tempdir()
                .context("creating a temporary sandbox root")?;
            // Traversable (not listable) by every user, like the directories above a real
            // sandbox's `/`: the bridge runs the kernel as uid 65534 when it runs as root.
            std::fs::set_permissions(temp.path(), std::fs::Permissions::from_mode(0o711))
                .context("opening the temporary sandbox root to other users")?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    if let Some(refusal) = root::refusal(&root, root::splits_users()) {
        bail!(refusal);
    }
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listening on {}", config.listen))?;
    let address = listener.local_addr()?;
    let preview_host = if address.ip().is_unspecified() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        address.ip()
    };
    let shared = Arc::new(Shared::new(
        config.api_key,
        root,
        config.python_venv.as_deref(),
        preview_host,
        config.simulation.map(simulated::Simulator::new),
        config.sse_answers,
    ));
    let mut app = Router::new().merge(mcp::router()).merge(admin::router());
    if config.legacy_rest {
        app = app.merge(rest::router());
    }
    let app = app
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            auth::require_key,
        ))
        .layer(axum::middleware::from_fn(http::request_id))
        .with_state(Arc::clone(&shared));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .into_future(),
    );
    let base = Url::parse(&format!("http://{address}/")).context("server URL")?;
    Ok(LocalServer {
        base,
        shared,
        stop: Some(stop),
        task: Some(task),
        _temp_root: temp_root,
    })
}

/// `briq-dev local-sandbox-server`: serves until SIGINT or SIGTERM, then destroys every
/// sandbox.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let server = spawn(Config {
        simulation: args.simulation(),
        listen: args.listen,
        allow_non_loopback: args.allow_non_loopback,
        root: args.root,
        api_key: args.api_key,
        python_venv: args.python_venv,
        sse_answers: args.sse_answers,
        legacy_rest: args.legacy_rest,
    })
    .await?;
    if let Some(port_file) = &args.port_file {
        write_port_file(
            port_file,
            server.base.port_or_known_default().unwrap_or_default(),
        )?;
    }
    if args.simulate {
        tracing::warn!(
            url = %server.url(),
            "local sandbox server listening with SIMULATED sandboxes (no code runs; benchmarks only)"
        );
    } else {
        tracing::warn!(
            url = %server.url(),
            "local sandbox server listening; it is NOT an isolation boundary (host processes, this user)"
        );
    }
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = terminate.recv() => {}
    }
    tracing::info!("stopping: destroying all sandboxes");
    server.shutdown().await;
    Ok(())
}

/// Written whole through a rename, so a script polling for the file never reads it half done.
fn write_port_file(path: &std::path::Path, port: u16) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let mut file = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a file in {}", dir.display()))?;
    std::io::Write::write_all(&mut file, format!("{port}\n").as_bytes())?;
    file.persist(path)
        .with_context(|| format!("writing port file {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory as _, Parser};

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Sub,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Sub {
        LocalSandboxServer(Args),
    }

    #[test]
    fn help_warns_and_key_is_required_and_redacted() {
        let mut cli = Cli::command();
        let help = cli
            .find_subcommand_mut("local-sandbox-server")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(help.contains("NOT an isolation boundary"), "{help}");
        assert!(help.contains("127.0.0.1:8787"), "{help}");
        let parsed =
            Cli::try_parse_from(["x", "local-sandbox-server", "--api-key", "s3cret"]).unwrap();
        assert!(!format!("{parsed:?}").contains("s3cret"));
    }

    #[test]
    fn simulated_mode_is_asked_for() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["x", "local-sandbox-server", "--api-key", "k"];
            argv.extend(extra);
            Cli::try_parse_from(argv).map(|cli| match cli.command {
                Sub::LocalSandboxServer(args) => args.simulation(),
            })
        };
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(parse(&["--simulate"]).unwrap(), Some(Simulation::default()));
        let slow = parse(&["--simulate", "--simulated-setup-ms", "900"]).unwrap();
        assert_eq!(slow.unwrap().setup, Duration::from_millis(900));
        assert!(parse(&["--simulated-kernel-ms", "5"]).is_err());
    }

    #[tokio::test]
    async fn refuses_non_loopback_by_default() {
        let mut config = Config::new(ApiKey::new("k").unwrap());
        config.listen = "0.0.0.0:0".parse().unwrap();
        let error = spawn(config).await.err().unwrap();
        assert!(error.to_string().contains("non-loopback"), "{error}");
    }

    #[tokio::test]
    async fn refuses_a_root_the_kernel_user_cannot_enter_when_it_runs_as_root() {
        let private = tempfile::tempdir().unwrap();
        std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let mut config = Config::new(ApiKey::new("k").unwrap());
        config.root = Some(private.path().join("sandboxes"));
        let started = spawn(config).await;
        if root::splits_users() {
            let error = started.err().expect("refused at start");
            assert!(error.to_string().contains("cannot enter"), "{error}");
        } else {
            // Its sandboxes' kernels run as this user, who owns the directory.
            started.expect("served").shutdown().await;
        }
    }

    #[test]
    fn port_file_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("port");
        write_port_file(&path, 4321).unwrap();
        assert_eq!(std::fs::read_to_string(path).unwrap(), "4321\n");
    }
}
