//! What can stop a command, worded for the person at the terminal.

use std::{error::Error as _, path::PathBuf};

use kube::runtime::{wait, watcher};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no Kubernetes cluster configured: {}; not running inside a cluster either \
         (set KUBECONFIG or create ~/.kube/config)",
        describe_config(.0)
    )]
    NoCluster(#[source] kube::config::InferConfigError),

    #[error("cannot use the Kubernetes API server at {server}: {}", describe_kube(.source))]
    ClusterUnavailable {
        server: String,
        #[source]
        source: kube::Error,
    },

    #[error("Kubernetes API: {}", describe_kube(.0))]
    Kube(#[from] kube::Error),

    #[error("watching for changes: {}", describe_watch(.0))]
    Watch(#[from] wait::Error),

    #[error("BriqExecutor {name} not found in namespace {namespace}")]
    ExecutorNotFound { name: String, namespace: String },

    #[error("BriqExecutor {name} is unusable ({reason}); create a new BriqExecutor")]
    ExecutorUnusable { name: String, reason: String },

    #[error("BriqExecutor {name} did not become ready within {seconds}s ({reason})")]
    ExecutorNotReady {
        name: String,
        seconds: u64,
        reason: String,
    },

    #[error("Execution {name} not found in namespace {namespace}")]
    ExecutionNotFound { name: String, namespace: String },

    #[error("cp: {0}")]
    Copy(String),

    #[error("fork: {0}")]
    Fork(String),

    #[error("cannot read the code from {}: {source}", path.display())]
    ReadCode {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The kubeconfig's failure (the in-cluster one is always "not in a cluster").
fn describe_config(error: &kube::config::InferConfigError) -> String {
    use kube::config::KubeconfigError;
    match error.source() {
        Some(kubeconfig) => match kubeconfig.downcast_ref::<KubeconfigError>() {
            Some(KubeconfigError::ReadConfig(io, path)) => {
                format!("cannot read the kubeconfig {}: {io}", path.display())
            }
            _ => causes(kubeconfig),
        },
        None => error.to_string(),
    }
}

/// The API server's own message, or the causes of a transport failure without kube's
/// `ServiceError:` wrapping.
fn describe_kube(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        kube::Error::Service(source) => causes(source.as_ref()),
        kube::Error::HyperError(source) => causes(source),
        other => causes(other),
    }
}

fn describe_watch(error: &wait::Error) -> String {
    let wait::Error::ProbeFailed(error) = error;
    match error {
        watcher::Error::InitialListFailed(error)
        | watcher::Error::WatchStartFailed(error)
        | watcher::Error::WatchFailed(error) => describe_kube(error),
        other => causes(other),
    }
}

/// An error and its sources, `: `-separated, skipping a source its parent already quotes
/// (hyper's errors do not repeat their causes; many others do).
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Layer(&'static str, #[source] Option<Box<Layer>>);

    #[test]
    fn causes_are_joined_once_each() {
        let inner = Layer("connection refused", None);
        let quoting = Layer("connect failed: connection refused", Some(Box::new(inner)));
        let outer = Layer("client error", Some(Box::new(quoting)));
        assert_eq!(
            causes(&outer),
            "client error: connect failed: connection refused"
        );
    }
}
