//! Status writes: server-side apply of the fields one manager owns, conditional on a version
//! where a decision was made on one, and the one-way `unusable` mark.

use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
    core::PartialObjectMeta,
};
use serde_json::json;
use tracing::warn;

use super::{
    context::{Error, Result, Shared},
    publish::publish,
};
use crate::crd::{BriqExecutor, UNUSABLE_MANAGER, conditions, reasons::ExecutorReason};

/// Server-side applies `status` (a JSON object of the fields `manager` owns) to `object`.
pub async fn apply_status<K>(
    api: &Api<K>,
    object: &K,
    manager: &str,
    status: serde_json::Value,
) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    apply_status_of(api, &object.name_any(), manager, status).await
}

/// [`apply_status`] to the object named `name`.
pub async fn apply_status_of<K>(
    api: &Api<K>,
    name: &str,
    manager: &str,
    status: serde_json::Value,
) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    // Nothing here reads the written object: the API server answers with its metadata only,
    // instead of echoing the whole object (an Execution's code is up to 256 KiB, and every
    // transfer of it costs the operator memory the allocator keeps).
    let request = kube::core::Request::new(api.resource_url()).patch_subresource(
        "status",
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&status_patch::<K>(status, None)),
    );
    let mut request = request.map_err(kube::Error::BuildRequest)?;
    request.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(METADATA_ONLY),
    );
    let client = api.clone().into_client();
    client
        .request::<PartialObjectMeta<K>>(request)
        .await
        .map(drop)
        .map_err(Error::from)
}

/// The `Accept` header that makes the API server answer with an object's metadata only.
pub const METADATA_ONLY: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// A server-side apply patch of `K`'s status, conditional on `resource_version` when given.
pub fn status_patch<K: Resource<DynamicType = ()>>(
    status: serde_json::Value,
    resource_version: Option<&str>,
) -> serde_json::Value {
    let mut patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    if let Some(version) = resource_version {
        patch["metadata"] = json!({ "resourceVersion": version });
    }
    patch
}

/// [`apply_status`], only if `object` is still at `resource_version` (when given): a write
/// decided on one version of an object never lands on another. Returns the object as written;
/// a conflict is [`is_conflict`].
pub async fn apply_status_at<K>(
    api: &Api<K>,
    object: &K,
    manager: &str,
    status: serde_json::Value,
    resource_version: Option<&str>,
) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = status_patch::<K>(status, resource_version);
    Ok(api
        .patch_status(
            &object.name_any(),
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&patch),
        )
        .await?)
}

/// Whether a conditional write lost: the object changed since the version it was decided on.
pub fn is_conflict(error: &Error) -> bool {
    matches!(error, Error::Kube(kube::Error::Api(status)) if status.code == 409)
}

/// How many times a write decided on one version of an object is decided again on a fresher
/// one after losing to a conflict, before the object counts as changing too often.
pub const WRITE_ATTEMPTS: usize = 3;

/// What became of a write decided again on conflict ([`retry_on_conflict`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Retried<T> {
    Done(T),
    /// The object is gone.
    Gone,
    /// It lost [`WRITE_ATTEMPTS`] times: the object keeps changing.
    KeptChanging,
}

/// Decides and writes on `object` with `attempt` (`Ok(None)`: its write, conditional on the
/// version it was decided on, lost to a conflict); after a conflict, reads the object afresh and
/// attempts again, at most [`WRITE_ATTEMPTS`] times.
pub async fn retry_on_conflict<K, T, F>(
    api: &Api<K>,
    mut object: K,
    mut attempt: impl FnMut(K) -> F,
) -> Result<Retried<T>>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    F: Future<Output = Result<Option<T>>>,
{
    for _ in 0..WRITE_ATTEMPTS {
        let name = object.name_any();
        if let Some(done) = attempt(object).await? {
            return Ok(Retried::Done(done));
        }
        match api.get_opt(&name).await? {
            Some(fresh) => object = fresh,
            None => return Ok(Retried::Gone),
        }
    }
    Ok(Retried::KeptChanging)
}

/// Whether a conditional write landed (`false`: it lost, see [`is_conflict`]); other errors
/// stay errors.
pub fn landed<T>(written: Result<T>) -> Result<bool> {
    match written {
        Ok(_) => Ok(true),
        Err(error) if is_conflict(&error) => Ok(false),
        Err(error) => Err(error),
    }
}

/// Marks `executor` unusable, for good: it never runs code again.
pub async fn mark_unusable<S>(
    shared: &Shared<S>,
    executor: &BriqExecutor,
    reason: &str,
) -> Result<()> {
    if executor.status.as_ref().is_some_and(|s| s.unusable) {
        return Ok(());
    }
    warn!(executor = %executor.name_any(), reason, "executor is now unusable");
    let api: Api<BriqExecutor> = Api::namespaced(
        shared.client.clone(),
        &executor.namespace().unwrap_or_default(),
    );
    let status = json!({ "unusable": true, "unusableReason": conditions::clip(reason.to_owned()) });
    apply_status(&api, executor, UNUSABLE_MANAGER, status).await?;
    shared.metrics.executor_ended(ExecutorReason::Unusable);
    let note = format!("{reason}; it never runs code again");
    let warning = kube::runtime::events::EventType::Warning;
    publish(shared, executor, warning, "Unusable", "Run", note).await;
    Ok(())
}
