//! The operator's aggregated API (`subresources.briq.cloud`) on a local control plane: served
//! in this process on a loopback port, and registered as kube-apiserver's APIService through an
//! ExternalName Service (a local control plane has no pod network to route a ClusterIP to).

use std::{net::SocketAddr, time::Duration};

use anyhow::Context as _;
use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use briq_operator::{
    briq::{BriqClient, ClientOptions},
    controller::{ExecutorKeys, Settings},
    subresources::{self, FrontProxy, Serving},
};
use k8s_openapi::{
    api::core::v1::{Namespace, Service},
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
    runtime::wait::await_condition,
};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::{control_plane::ControlPlane, local_server::LocalServer};

/// Where the APIService's Service lives.
pub const NAMESPACE: &str = "briq-subresources";
pub const SERVICE: &str = "briq-operator";

/// How long kube-apiserver may take to find the APIService available.
const AVAILABLE_WITHIN: Duration = Duration::from_secs(60);

/// The aggregated API, served until dropped.
pub struct AggregatedApi {
    /// Its own port (callers other than kube-apiserver are refused at the TLS handshake).
    pub address: SocketAddr,
    /// The CA of its serving certificate (the control plane's).
    pub ca_pem: String,
    task: JoinHandle<()>,
}

impl Drop for AggregatedApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AggregatedApi {
    /// Serves it for `server`'s sandboxes with `settings`' keys, and registers it; returns once
    /// kube-apiserver finds it available.
    pub async fn start(
        admin: &Client,
        plane: &ControlPlane,
        server: &LocalServer,
        settings: Settings,
    ) -> anyhow::Result<AggregatedApi> {
        let sandboxes = BriqClient::new(ClientOptions::local(server.url()))?;
        let (cert_pem, key_pem, ca_pem) =
            plane.serving_certificate(&format!("{SERVICE}.{NAMESPACE}.svc"))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let proxy = FrontProxy::from_cluster(admin.clone()).await?;
        let keys = ExecutorKeys::start(admin.clone(), sandboxes, settings);
        let serving = Serving {
            listener,
            cert_pem,
            key_pem,
            files: None,
        };
        let task = tokio::spawn(async move {
            if let Err(error) = subresources::serve(serving, keys, proxy).await {
                tracing::error!(%error, "the aggregated API stopped");
            }
        });
        let api = AggregatedApi {
            address,
            ca_pem,
            task,
        };
        register(admin, address.port(), &api.ca_pem).await?;
        Ok(api)
    }
}

async fn register(admin: &Client, port: u16, ca_pem: &str) -> anyhow::Result<()> {
    let apply = PatchParams::apply("briq-dev").force();
    let namespace: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE},
    }))?;
    Api::<Namespace>::all(admin.clone())
        .patch(NAMESPACE, &apply, &Patch::Apply(&namespace))
        .await
        .context("the aggregated API's namespace")?;
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {"type": "ExternalName", "externalName": "localhost",
                 "ports": [{"name": "https", "port": port}]},
    }))?;
    Api::<Service>::namespaced(admin.clone(), NAMESPACE)
        .patch(SERVICE, &apply, &Patch::Apply(&service))
        .await
        .context("the aggregated API's Service")?;
    let name = format!("{}.{}", subresources::VERSION, subresources::GROUP);
    let api_service: APIService = serde_json::from_value(json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": name},
        "spec": {"group": subresources::GROUP, "version": subresources::VERSION,
                 "service": {"namespace": NAMESPACE, "name": SERVICE, "port": port},
                 "caBundle": BASE64.encode(ca_pem),
                 "groupPriorityMinimum": 1000, "versionPriority": 15},
    }))?;
    let api_services: Api<APIService> = Api::all(admin.clone());
    api_services
        .patch(&name, &apply, &Patch::Apply(&api_service))
        .await
        .context("the APIService")?;
    let available = |service: Option<&APIService>| {
        service
            .and_then(|s| s.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "Available" && c.status == "True")
            })
    };
    tokio::time::timeout(
        AVAILABLE_WITHIN,
        await_condition(api_services, &name, available),
    )
    .await
    .context("kube-apiserver did not find the aggregated API available")??;
    Ok(())
}
