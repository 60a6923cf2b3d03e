//! How a reconcile ends: a success forgets the object's backoff, a failure is retried after it
//! (never sooner than briq asked); and the bookkeeping keys these use.

use std::time::Duration;

use kube::{
    Resource, ResourceExt,
    runtime::{controller::Action, reflector::Store},
};
use tracing::warn;

use super::{
    backoff,
    context::{Error, Result},
};

/// Drops the backoff counts of objects `store` no longer holds.
pub fn prune_backoff<K>(backoff: &backoff::Backoff, store: &Store<K>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let live: std::collections::HashSet<String> = store
        .state()
        .iter()
        .map(|o| object_key(o.as_ref()))
        .collect();
    backoff.retain(|key| live.contains(key));
}

/// The key of `object` in a controller's bookkeeping.
pub fn object_key<K: Resource<DynamicType = ()>>(object: &K) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// Ends a reconcile of `object`: a success starts its backoff over.
pub fn reconciled<K: Resource<DynamicType = ()>>(
    backoff: &backoff::Backoff,
    object: &K,
    result: Result<Action>,
) -> Result<Action> {
    if result.is_ok() {
        backoff.forget(&object_key(object));
    }
    result
}

/// How long ago `object` was created; a creation time ahead of this clock (skew) counts as just
/// created.
pub fn waited<K: Resource>(object: &K) -> Duration {
    object
        .meta()
        .creation_timestamp
        .as_ref()
        .map(|created| {
            let waited = k8s_openapi::jiff::Timestamp::now().duration_since(created.0);
            waited
                .max(k8s_openapi::jiff::SignedDuration::ZERO)
                .unsigned_abs()
        })
        .unwrap_or_default()
}

/// When to retry a failed reconcile of `object`: its backoff, never sooner than briq asked.
pub fn retry<K: Resource<DynamicType = ()>>(
    backoff: &backoff::Backoff,
    object: &K,
    error: &Error,
) -> Action {
    let delay = backoff.failed(&object_key(object), error.retry_after());
    let kind = K::kind(&());
    warn!(%kind, name = %object.name_any(), %error, ?delay, "reconcile failed; retrying");
    Action::requeue(delay)
}
