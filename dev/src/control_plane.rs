//! A real, local Kubernetes control plane (etcd + kube-apiserver on loopback, and
//! kube-controller-manager for namespace deletion and garbage collection), started the way
//! controller-runtime's envtest starts one. Used by the tests and by the local demo; never in a
//! cluster.
//!
//! The binaries come from `tests/control-plane/build.sh`, which builds them once per version
//! from the Go module proxy into a cache outside the repository.

use std::{
    fs,
    net::{Ipv4Addr, TcpListener},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// How long kube-apiserver may take to answer `/readyz` (its first start migrates etcd).
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// How many times a start whose ports another process took first is tried.
const START_ATTEMPTS: u32 = 3;

/// The audit policy of [`Options::audit_log`]: every request at level Metadata (who, verb,
/// resource, response code; no bodies), without the RequestReceived stage, so a completed
/// request is one line and a watch is two (ResponseStarted, ResponseComplete).
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
";

/// The controllers of kube-controller-manager the control plane runs: deleting a namespace
/// deletes its objects, and owner references are garbage collected. Nothing else (no pods run).
const CONTROLLERS: &str = "namespace,garbagecollector,resourcequota";

/// How to start a control plane; the default is what the tests use.
#[derive(Debug, Clone)]
pub struct Options {
    /// Make kube-apiserver write an audit log ([`ControlPlane::audit_log`]; JSON lines, see
    /// `AUDIT_POLICY`), for counting the API requests of a client.
    pub audit_log: bool,
    /// Run kube-controller-manager (`CONTROLLERS`): without it namespaces never finish
    /// deleting, owner references are never collected and ResourceQuotas never count usage (so
    /// their admission refuses every create they cover).
    pub controller_manager: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            audit_log: false,
            controller_manager: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("control-plane binaries not found in {0} (run tests/control-plane/build.sh)")]
    BinariesMissing(PathBuf),
    #[error("building the control plane failed: {0}")]
    Build(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("generating certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    #[error(
        "{process} exited before the control plane became ready ({status}); its log ends:\n{log_tail}"
    )]
    Exited {
        process: &'static str,
        status: std::process::ExitStatus,
        log_tail: String,
    },
    #[error("kube-apiserver did not answer /readyz within {0:?}; its log ends:\n{1}")]
    NotReady(Duration, String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// Runs `tests/control-plane/build.sh` (a no-op when the cache is warm) and returns the directory
/// holding `kube-apiserver`, `etcd` and `kubectl`. `BRIQ_CONTROL_PLANE_BIN` overrides it.
pub fn binaries() -> Result<PathBuf, Error> {
    if let Some(dir) = std::env::var_os("BRIQ_CONTROL_PLANE_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let built = crate::repo::script_output("tests/control-plane/build.sh", &[])
        .map_err(|e| Error::Build(format!("{e:#}")))?;
    Ok(built.join("bin"))
}

/// A running etcd + kube-apiserver. Both processes die with this one (parent-death signal) and
/// are killed on drop.
pub struct ControlPlane {
    processes: Vec<Child>,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    server: String,
    bin_dir: PathBuf,
    /// Kept to sign client certificates for other users ([`ControlPlane::kubeconfig_for`]).
    pki: Pki,
    audit_log: Option<PathBuf>,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver from `bin_dir` on free loopback ports and waits until the
    /// API server is ready.
    pub async fn start(bin_dir: &Path) -> Result<Self, Error> {
        Self::start_with(bin_dir, Options::default()).await
    }

    /// [`ControlPlane::start`] with `options`.
    pub async fn start_with(bin_dir: &Path, options: Options) -> Result<Self, Error> {
        // The ports are free when chosen, not reserved: until etcd and kube-apiserver bind them,
        // another process may take one (the control plane of a test binary started at the same
        // moment, an outgoing connection). The process that lost it exits at once, saying so in
        // its log: start again, on other ports.
        let mut attempt = 1;
        loop {
            match Self::start_once(bin_dir, &options).await {
                Err(Error::Exited { log_tail, .. })
                    if attempt < START_ATTEMPTS && log_tail.contains("address already in use") =>
                {
                    attempt += 1;
                }
                started => return started,
            }
        }
    }

    async fn start_once(bin_dir: &Path, options: &Options) -> Result<Self, Error> {
        let mut binaries = vec!["etcd", "kube-apiserver"];
        if options.controller_manager {
            binaries.push("kube-controller-manager");
        }
        for binary in binaries {
            if !bin_dir.join(binary).is_file() {
                return Err(Error::BinariesMissing(bin_dir.to_owned()));
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("briq-control-plane-")
            .tempdir()
            .map_err(io("creating the control-plane directory"))?;
        // A control plane held in a static is never dropped: its directory and processes go at
        // exit instead.
        crate::at_exit::clean_at_exit(dir.path());
        let pki = Pki::generate()?;
        let files = pki.write(dir.path())?;

        let [etcd_client, etcd_peer, api_port] = free_ports()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let mut etcd = Command::new(bin_dir.join("etcd"));
        etcd.args([
            "--name",
            "default",
            "--log-level",
            "warn",
            "--unsafe-no-fsync",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("etcd"))
        .args(["--listen-client-urls", &etcd_url])
        .args(["--advertise-client-urls", &etcd_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("default={peer_url}")])
        .args(["--listen-metrics-urls", ""]);

        let mut apiserver = Command::new(bin_dir.join("kube-apiserver"));
        let path = |name: &str| dir.path().join(name).display().to_string();
        apiserver
            .args(["--etcd-servers", &etcd_url])
            .args([
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
            ])
            .args(["--secure-port", &api_port.to_string()])
            .args(["--cert-dir", &path("pki")])
            .args(["--tls-cert-file", &files.serving_cert])
            .args(["--tls-private-key-file", &files.serving_key])
            .args(["--client-ca-file", &files.ca_cert])
            .args(["--service-account-issuer", "https://kubernetes.default.svc"])
            .args([
                "--service-account-key-file",
                &files.service_account_public_key,
            ])
            .args([
                "--service-account-signing-key-file",
                &files.service_account_key,
            ])
            .args(["--service-cluster-ip-range", "10.0.0.0/24"])
            // The aggregation layer: kube-apiserver proxies an APIService's requests with this
            // client certificate and names the user in these headers.
            .args(["--requestheader-client-ca-file", &files.front_proxy_ca_cert])
            .args(["--requestheader-allowed-names", FRONT_PROXY_CLIENT])
            .args(["--requestheader-username-headers", "X-Remote-User"])
            .args(["--requestheader-group-headers", "X-Remote-Group"])
            .args(["--requestheader-extra-headers-prefix", "X-Remote-Extra-"])
            .args(["--proxy-client-cert-file", &files.front_proxy_client_cert])
            .args(["--proxy-client-key-file", &files.front_proxy_client_key])
            .args(["--authorization-mode", "RBAC"])
            .args(["--disable-admission-plugins", "ServiceAccount"])
            .args(["--allow-privileged=true", "--v=1"]);
        let audit_log = if options.audit_log {
            let policy = dir.path().join("audit-policy.yaml");
            fs::write(&policy, AUDIT_POLICY).map_err(io("writing the audit policy"))?;
            let log = dir.path().join("audit.log");
            apiserver
                .arg("--audit-policy-file")
                .arg(&policy)
                .arg("--audit-log-path")
                .arg(&log)
                // One file (rotation only past 1 GiB), written as requests complete.
                .args(["--audit-log-maxsize=1024", "--audit-log-mode=blocking"]);
            Some(log)
        } else {
            None
        };

        let mut plane = ControlPlane {
            processes: Vec::new(),
            kubeconfig: dir.path().join("kubeconfig"),
            server: format!("https://127.0.0.1:{api_port}"),
            bin_dir: bin_dir.to_owned(),
            dir,
            pki,
            audit_log,
        };
        let admin = plane.pki.kubeconfig(
            &plane.server,
            "admin",
            &plane.pki.admin_cert,
            &plane.pki.admin_key,
        );
        fs::write(&plane.kubeconfig, admin).map_err(io("writing the kubeconfig"))?;
        plane.spawn("etcd", etcd)?;
        plane.spawn("kube-apiserver", apiserver)?;
        let ca_pem = plane.pki.ca_pem.clone();
        plane.wait_ready(&ca_pem).await?;
        if options.controller_manager {
            // Its own user name, in system:masters: the bootstrap role of
            // system:kube-controller-manager covers only what it does itself, while each
            // controller's own role is reached through per-controller service-account
            // credentials, which need the token controller and more.
            let kubeconfig =
                plane.kubeconfig_for("system:kube-controller-manager", &["system:masters"])?;
            let mut manager = Command::new(bin_dir.join("kube-controller-manager"));
            manager
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["--controllers", CONTROLLERS])
                .args([
                    "--leader-elect=false",
                    "--use-service-account-credentials=false",
                ])
                // A quota counts a custom resource only once the quota controller's discovery
                // (every 30 s) has found it; a quota it first saw before that shows no usage
                // until the next full resync (5 minutes by default) or a change of such an
                // object. A bounded recheck instead (tests/crds.rs waited 120 s in vain).
                .arg("--resource-quota-sync-period=5s")
                // No serving endpoint: nothing probes it, and a fixed port would collide
                // between control planes started at once.
                .args(["--secure-port=0", "--bind-address", "127.0.0.1"])
                .args(["--v=1"]);
            plane.spawn("kube-controller-manager", manager)?;
        }
        Ok(plane)
    }

    /// Path of an admin kubeconfig (O=system:masters) for this control plane.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:PORT` of the API server.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Directory of the control-plane binaries (it holds a matching `kubectl`).
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The process id of `process` (`etcd` or `kube-apiserver`), to read its use in `/proc`.
    pub fn pid(&self, process: &str) -> Option<u32> {
        let index = ["etcd", "kube-apiserver"]
            .iter()
            .position(|name| *name == process)?;
        self.processes.get(index).map(Child::id)
    }

    /// The audit log (one JSON event per line), when started with [`Options::audit_log`].
    pub fn audit_log(&self) -> Option<&Path> {
        self.audit_log.as_deref()
    }

    /// Writes a kubeconfig for user `common_name` in the groups `organizations` (a client
    /// certificate signed by this control plane's CA) and returns its path. The API server
    /// reports the user as `user.username` in its audit log, so requests of, say, an operator
    /// given its own kubeconfig can be told apart from everyone else's.
    pub fn kubeconfig_for(
        &self,
        common_name: &str,
        organizations: &[&str],
    ) -> Result<PathBuf, Error> {
        let text = self
            .pki
            .client_kubeconfig(&self.server, common_name, organizations)?;
        let file: String = common_name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let path = self.dir.path().join(format!("kubeconfig-{file}"));
        fs::write(&path, text).map_err(io("writing a kubeconfig"))?;
        Ok(path)
    }

    /// A serving certificate for `dns_name` (and 127.0.0.1) signed by this control plane's CA,
    /// with the CA: what an aggregated API server behind an APIService needs. Returns
    /// `(certificate, key, ca)` in PEM.
    pub fn serving_certificate(&self, dns_name: &str) -> Result<(String, String, String), Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![dns_name.to_owned()])?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(Ipv4Addr::LOCALHOST.into()));
        params.distinguished_name.push(DnType::CommonName, dns_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.pki.ca)?;
        Ok((cert.pem(), key.serialize_pem(), self.pki.ca_pem.clone()))
    }

    /// A client certificate of `common_name` signed by the front-proxy CA (as kube-apiserver's
    /// own is, with [`FRONT_PROXY_CLIENT`]) or by the cluster's CA: for tests that call an
    /// aggregated API server directly. Returns `(certificate, key)` in PEM.
    pub fn client_certificate(
        &self,
        common_name: &str,
        signer: Signer,
    ) -> Result<(String, String), Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let issuer = match signer {
            Signer::FrontProxy => &self.pki.front_proxy_ca,
            Signer::Cluster => &self.pki.ca,
        };
        let cert = params.signed_by(&key, issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    fn log_path(&self, process: &str) -> PathBuf {
        self.dir.path().join(format!("{process}.log"))
    }

    /// The end of a process's log: the directory holding it is removed with the control plane.
    fn log_tail(&self, process: &str) -> String {
        let log = fs::read_to_string(self.log_path(process)).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn spawn(&mut self, process: &'static str, mut command: Command) -> Result<(), Error> {
        let log = fs::File::create(self.log_path(process)).map_err(io("creating a log file"))?;
        let err = log.try_clone().map_err(io("creating a log file"))?;
        command.stdin(Stdio::null()).stdout(log).stderr(err);
        // SAFETY: prctl is async-signal-safe; it only asks the kernel to kill the child when
        // the thread that spawned it exits (see `spawn_from_long_lived_thread`).
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child =
            spawn_from_long_lived_thread(command).map_err(io(format!("starting {process}")))?;
        crate::at_exit::kill_at_exit(self.dir.path(), child.id());
        self.processes.push(child);
        Ok(())
    }

    async fn wait_ready(&mut self, ca_pem: &str) -> Result<(), Error> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let url = format!("{}/readyz", self.server);
        // `/readyz` needs no client certificate: `system:public-info-viewer` grants it to all.
        let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes())
            .map_err(|e| Error::Build(format!("the generated CA does not parse: {e}")))?;
        let http = reqwest::Client::builder()
            .tls_certs_only([ca])
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| Error::Build(format!("building the readiness probe: {e}")))?;
        while Instant::now() < deadline {
            for (child, process) in self.processes.iter_mut().zip(["etcd", "kube-apiserver"]) {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(Error::Exited {
                        process,
                        status,
                        log_tail: self.log_tail(process),
                    });
                }
            }
            if let Ok(response) = http.get(&url).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(Error::NotReady(
            READY_TIMEOUT,
            self.log_tail("kube-apiserver"),
        ))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for child in self.processes.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        crate::at_exit::forget(self.dir.path());
    }
}

/// The parent-death signal fires when the spawning *thread* ends, and test harnesses run each
/// test on a thread of its own: spawn from one thread that lives as long as the process.
fn spawn_from_long_lived_thread(mut command: Command) -> std::io::Result<Child> {
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: std::sync::OnceLock<std::sync::Mutex<mpsc::Sender<Request>>> =
        std::sync::OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("control-plane-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
                // Keep the thread (and so the children) alive until the process exits.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawning the control-plane spawner thread");
        std::sync::Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    let sent = spawner
        .lock()
        .map_err(|_| std::io::Error::other("spawner poisoned"))?
        .send((
            std::mem::replace(&mut command, Command::new("true")),
            reply_tx,
        ));
    sent.map_err(|_| std::io::Error::other("spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?
}

fn free_ports<const N: usize>() -> Result<[u16; N], Error> {
    // Hold every listener until all ports are chosen so that no two are the same.
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<_, _>>()
        .map_err(io("choosing free ports"))?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener
            .local_addr()
            .map_err(io("choosing free ports"))?
            .port();
    }
    Ok(ports)
}

/// A throwaway CA, the API server's serving certificate, an admin client certificate and the
/// service-account signing key.
struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
    ca_pem: String,
    serving_cert: String,
    serving_key: String,
    admin_cert: String,
    admin_key: String,
    service_account_key: String,
    service_account_public_key: String,
    /// A CA of its own for the front proxy, as kubeadm makes one: an aggregated API server
    /// trusts a request's user headers only from a client certificate of this CA.
    front_proxy_ca: CertifiedIssuer<'static, KeyPair>,
    front_proxy_ca_pem: String,
    front_proxy_client_cert: String,
    front_proxy_client_key: String,
}

struct PkiFiles {
    ca_cert: String,
    serving_cert: String,
    serving_key: String,
    service_account_key: String,
    service_account_public_key: String,
    front_proxy_ca_cert: String,
    front_proxy_client_cert: String,
    front_proxy_client_key: String,
}

/// The common name of the client certificate kube-apiserver presents to aggregated API servers
/// (`--requestheader-allowed-names`).
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// Which CA signs a certificate [`ControlPlane::client_certificate`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signer {
    FrontProxy,
    Cluster,
}

impl Pki {
    fn generate() -> Result<Self, Error> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "briq-operator local CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

        let serving_key = KeyPair::generate()?;
        let mut serving = CertificateParams::new(vec!["localhost".to_owned()])?;
        serving
            .subject_alt_names
            .push(SanType::IpAddress(Ipv4Addr::LOCALHOST.into()));
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &ca)?;

        let admin_key = KeyPair::generate()?;
        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin.distinguished_name.push(DnType::CommonName, "admin");
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &ca)?;

        let service_account = KeyPair::generate()?;

        let mut front_proxy_ca_params = CertificateParams::new(Vec::<String>::new())?;
        front_proxy_ca_params
            .distinguished_name
            .push(DnType::CommonName, "briq-operator local front-proxy CA");
        front_proxy_ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        front_proxy_ca_params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let front_proxy_ca =
            CertifiedIssuer::self_signed(front_proxy_ca_params, KeyPair::generate()?)?;
        let front_proxy_client_key = KeyPair::generate()?;
        let mut front_proxy_client = CertificateParams::new(Vec::<String>::new())?;
        front_proxy_client
            .distinguished_name
            .push(DnType::CommonName, FRONT_PROXY_CLIENT);
        front_proxy_client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let front_proxy_client_cert =
            front_proxy_client.signed_by(&front_proxy_client_key, &front_proxy_ca)?;
        Ok(Pki {
            front_proxy_ca_pem: front_proxy_ca.pem(),
            front_proxy_ca,
            front_proxy_client_cert: front_proxy_client_cert.pem(),
            front_proxy_client_key: front_proxy_client_key.serialize_pem(),
            ca_pem: ca.pem(),
            serving_cert: serving_cert.pem(),
            serving_key: serving_key.serialize_pem(),
            admin_cert: admin_cert.pem(),
            admin_key: admin_key.serialize_pem(),
            service_account_key: service_account.serialize_pem(),
            service_account_public_key: service_account.public_key_pem(),
            ca,
        })
    }

    fn write(&self, dir: &Path) -> Result<PkiFiles, Error> {
        let pki = dir.join("pki");
        fs::create_dir_all(&pki).map_err(io("creating the pki directory"))?;
        let put = |name: &str, pem: &str| -> Result<String, Error> {
            let path = pki.join(name);
            fs::write(&path, pem).map_err(io(format!("writing {name}")))?;
            Ok(path.display().to_string())
        };
        Ok(PkiFiles {
            ca_cert: put("ca.crt", &self.ca_pem)?,
            serving_cert: put("apiserver.crt", &self.serving_cert)?,
            serving_key: put("apiserver.key", &self.serving_key)?,
            service_account_key: put("sa.key", &self.service_account_key)?,
            service_account_public_key: put("sa.pub", &self.service_account_public_key)?,
            front_proxy_ca_cert: put("front-proxy-ca.crt", &self.front_proxy_ca_pem)?,
            front_proxy_client_cert: put("front-proxy-client.crt", &self.front_proxy_client_cert)?,
            front_proxy_client_key: put("front-proxy-client.key", &self.front_proxy_client_key)?,
        })
    }

    /// A kubeconfig whose client certificate (signed by the CA) says user `common_name` in the
    /// groups `organizations`.
    fn client_kubeconfig(
        &self,
        server: &str,
        common_name: &str,
        organizations: &[&str],
    ) -> Result<String, Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        for organization in organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *organization);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.ca)?;
        Ok(self.kubeconfig(server, common_name, &cert.pem(), &key.serialize_pem()))
    }

    fn kubeconfig(&self, server: &str, user: &str, cert_pem: &str, key_pem: &str) -> String {
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: local
  context: {{cluster: local, user: {user}, namespace: default}}
current-context: local
",
            ca = BASE64.encode(&self.ca_pem),
            cert = BASE64.encode(cert_pem),
            key = BASE64.encode(key_pem),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_kubeconfigs_name_their_user_and_carry_a_fresh_certificate() {
        let pki = Pki::generate().unwrap();
        let server = "https://127.0.0.1:6443";
        let text = pki
            .client_kubeconfig(server, "briq-operator", &["system:masters"])
            .unwrap();
        let config = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        let user = &config.auth_infos[0];
        assert_eq!(user.name, "briq-operator");
        assert_eq!(
            config.contexts[0].context.as_ref().unwrap().user.as_deref(),
            Some("briq-operator")
        );
        let cert = user
            .auth_info
            .as_ref()
            .unwrap()
            .client_certificate_data
            .clone()
            .unwrap();
        let admin = pki.kubeconfig(server, "admin", &pki.admin_cert, &pki.admin_key);
        assert!(
            !admin.contains(&cert),
            "a minted user has a certificate of its own"
        );
        assert!(AUDIT_POLICY.contains("omitStages: [RequestReceived]"));
    }
}
