//! Connecting to the cluster the way kubectl does: `KUBECONFIG` or `~/.kube/config`, else the
//! in-cluster service account; the context's namespace unless `-n` says otherwise.

use kube::{Api, Client};

use super::error::Error;
use crate::crd::Execution;

#[derive(clap::Args)]
pub struct NamespaceArg {
    /// Namespace [default: the kubeconfig context's namespace, else `default`].
    #[arg(short, long)]
    pub namespace: Option<String>,
}

/// One existing Execution, named on the command line, and where it is.
#[derive(clap::Args)]
pub struct ExecutionArg {
    /// The Execution (`exec` prints its name on stderr).
    pub execution: String,

    #[command(flatten)]
    pub namespace: NamespaceArg,
}

impl ExecutionArg {
    /// The cluster, its Executions in the namespace, and the Execution's name.
    pub async fn connect(self) -> Result<(Cluster, Api<Execution>, String), Error> {
        let cluster = Cluster::connect(self.namespace).await?;
        let executions = cluster.api::<Execution>();
        Ok((cluster, executions, self.execution))
    }
}

pub struct Cluster {
    pub client: Client,
    pub namespace: String,
}

impl Cluster {
    /// Loads the configuration and checks that the API server answers, so that an unreachable
    /// cluster is reported once, with its address, before anything else is tried.
    pub async fn connect(namespace: NamespaceArg) -> Result<Cluster, Error> {
        let config = kube::Config::infer().await.map_err(Error::NoCluster)?;
        let server = config.cluster_url.to_string();
        let namespace = namespace
            .namespace
            .unwrap_or_else(|| config.default_namespace.clone());
        let unavailable = |source| Error::ClusterUnavailable {
            server: server.clone(),
            source,
        };
        let client = crate::kube_client::client(config).map_err(unavailable)?;
        client.apiserver_version().await.map_err(unavailable)?;
        Ok(Cluster { client, namespace })
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}
