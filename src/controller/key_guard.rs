//! The API key Secrets of executors with a sandbox carry [`KEY_IN_USE_FINALIZER`] (as Kubernetes
//! protects a PVC in use): deleting a namespace, or the Secret, cannot take the key away before
//! the sandboxes made with it are destroyed. The executor controller protects a Secret when it
//! reads a key from it and releases it after the last destroy; the orphan sweeper releases what
//! no executor uses any more.

use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tracing::{info, warn};

use super::context::{Result, Shared};
use crate::crd::{BriqExecutor, KEY_IN_USE_FINALIZER};

/// Adds [`KEY_IN_USE_FINALIZER`] to `secret` unless it has it.
pub async fn protect<S>(shared: &Shared<S>, secret: &Secret) -> Result<()> {
    if secret
        .finalizers()
        .iter()
        .any(|f| f == KEY_IN_USE_FINALIZER)
    {
        return Ok(());
    }
    if secret.metadata.deletion_timestamp.is_some() {
        // No finalizer can be added to an object being deleted.
        warn!(secret = %secret.name_any(), "the API key Secret is being deleted unprotected");
        return Ok(());
    }
    let api: Api<Secret> = Api::namespaced(
        shared.client.clone(),
        &secret.namespace().unwrap_or_default(),
    );
    // Finalizers merge by value in a strategic merge patch: no other finalizer is touched.
    let patch = json!({ "metadata": { "finalizers": [KEY_IN_USE_FINALIZER] } });
    api.patch(
        &secret.name_any(),
        &PatchParams::default(),
        &Patch::Strategic(&patch),
    )
    .await?;
    info!(secret = %secret.name_any(), "protecting the API key Secret while its key is in use");
    Ok(())
}

/// Removes [`KEY_IN_USE_FINALIZER`] from Secret `namespace/name`, if it is there.
pub async fn release<S>(shared: &Shared<S>, namespace: &str, name: &str) -> Result<()> {
    let api: Api<Secret> = Api::namespaced(shared.client.clone(), namespace);
    let Some(secret) = api.get_opt(name).await? else {
        return Ok(());
    };
    if !secret
        .finalizers()
        .iter()
        .any(|f| f == KEY_IN_USE_FINALIZER)
    {
        return Ok(());
    }
    let patch = json!({
        "metadata": { "$deleteFromPrimitiveList/finalizers": [KEY_IN_USE_FINALIZER] }
    });
    api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    info!(%namespace, secret = %name, "released the API key Secret: no sandbox uses its key");
    Ok(())
}

/// Whether another executor than `except` (a uid) in `executors` takes its key from Secret
/// `name`.
pub fn secret_used_by_others(executors: &[BriqExecutor], name: &str, except: &str) -> bool {
    executors.iter().any(|executor| {
        executor.uid().as_deref() != Some(except)
            && executor
                .spec
                .api_key_secret_ref
                .as_ref()
                .is_some_and(|reference| reference.name == name)
    })
}
