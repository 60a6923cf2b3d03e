//! Shared test support: one real control plane (etcd + kube-apiserver) per test binary, the CRDs
//! installed once, and a fresh namespace per test.
//!
//! `BRIQ_TEST_KUBECONFIG` points the tests at a control plane the caller already runs instead.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use briq_operator::control_plane::{self, ControlPlane};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client, api::PostParams};

struct Cluster {
    kubeconfig: PathBuf,
    kubectl: PathBuf,
    // Keeps etcd and kube-apiserver alive for the whole test binary.
    _plane: Option<ControlPlane>,
}

pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        // Each #[tokio::test] has a runtime of its own that ends with the test: start the control
        // plane on a runtime of its own too, so nothing it needs dies with the first test.
        std::thread::spawn(|| {
            tokio::runtime::Runtime::new()
                .expect("tokio runtime")
                .block_on(start_cluster())
        })
        .join()
        .expect("control plane start panicked")
    })
}

async fn start_cluster() -> Cluster {
    let bin_dir = control_plane::binaries(repo_root()).expect("control-plane binaries");
    let kubectl = bin_dir.join("kubectl");
    let (kubeconfig, plane) = match std::env::var_os("BRIQ_TEST_KUBECONFIG") {
        Some(path) => (PathBuf::from(path), None),
        None => {
            let plane = ControlPlane::start(&bin_dir).await.expect("starting the control plane");
            (plane.kubeconfig().to_owned(), Some(plane))
        }
    };
    let client = client_for(&kubeconfig).await;
    briq_operator::crd::install(&client).await.expect("installing the CRDs");
    Cluster { kubeconfig, kubectl, _plane: plane }
}

async fn client_for(kubeconfig: &Path) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kube config");
    Client::try_from(config).expect("kube client")
}

/// One test's view of the cluster: an admin client and a namespace of its own. Without
/// kube-controller-manager namespaces never finish deleting, so they are left behind.
pub struct TestEnv {
    pub client: Client,
    pub namespace: String,
    pub kubeconfig: PathBuf,
    pub kubectl: PathBuf,
}

impl TestEnv {
    pub async fn new(prefix: &str) -> TestEnv {
        let cluster = cluster();
        let client = client_for(&cluster.kubeconfig).await;
        let namespace = format!("{prefix}-{:08x}", rand::random::<u32>());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": namespace }
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("creating the test namespace");
        TestEnv {
            client,
            namespace,
            kubeconfig: cluster.kubeconfig.clone(),
            kubectl: cluster.kubectl.clone(),
        }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Runs the control plane's own kubectl against this test's namespace; returns
    /// (success, stdout, stderr).
    pub fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        let out = std::process::Command::new(&self.kubectl)
            .env("KUBECONFIG", &self.kubeconfig)
            .args(["--namespace", &self.namespace])
            .args(args)
            .output()
            .expect("running kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}
