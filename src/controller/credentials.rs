//! Which briq API key an executor uses: its class's (from the platform namespace), its own
//! labelled Secret's, or the operator's default; and the class it takes, from the class cache.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::{Api, ResourceExt};

use super::{
    class,
    context::{Error, Result, Shared},
};
use crate::{
    briq::ApiKey,
    controller::recheck::CLASSES_WAIT,
    crd::{
        API_KEY_LABEL, API_KEY_LABEL_VALUE, BriqExecutor, BriqExecutorClass,
        DEFAULT_API_KEY_SECRET_KEY,
    },
};

/// The API key of `executor`: from its Secret, or the operator's default.
pub async fn api_key<S>(shared: &Shared<S>, executor: &BriqExecutor) -> Result<ApiKey> {
    Ok(key_and_secret(shared, executor).await?.0)
}

/// [`api_key`], with the Secret it came from when that is a Secret of the executor's namespace
/// (`None`: the operator's default key, or its class's, whose Secret is the platform's).
pub async fn key_and_secret<S>(
    shared: &Shared<S>,
    executor: &BriqExecutor,
) -> Result<(ApiKey, Option<Secret>)> {
    let recorded = class::recorded(executor.annotations());
    match class_of(shared, executor, recorded).await?.0 {
        class::Resolved::Class(class) => return Ok((class_key(shared, &class).await?, None)),
        class::Resolved::Missing(name) => return Err(Error::ClassMissing(name)),
        class::Resolved::Unclassed => {}
    }
    own_key(shared, executor).await
}

/// The key of an executor without a class: from its `apiKeySecretRef`, else the operator's
/// default key.
pub async fn own_key<S>(
    shared: &Shared<S>,
    executor: &BriqExecutor,
) -> Result<(ApiKey, Option<Secret>)> {
    let Some(reference) = &executor.spec.api_key_secret_ref else {
        let key = shared.settings.default_api_key.clone().ok_or_else(|| {
            Error::ApiKey(
                "no apiKeySecretRef is set, no BriqExecutorClass applies and the operator has no \
                 default briq API key"
                    .into(),
            )
        })?;
        return Ok((key, None));
    };
    let namespace = executor.namespace().unwrap_or_default();
    let (key, secret) = secret_key(shared, &namespace, &reference.name, &reference.key).await?;
    Ok((key, Some(secret)))
}

/// The key of `class`, from its Secret in the operator's namespace.
pub async fn class_key<S>(shared: &Shared<S>, class: &BriqExecutorClass) -> Result<ApiKey> {
    let Some(namespace) = &shared.settings.platform_namespace else {
        return Err(Error::ApiKey(format!(
            "BriqExecutorClass {} applies, but the operator was started without \
             --platform-namespace, where class keys are",
            class.name_any()
        )));
    };
    let reference = &class.spec.api_key_secret_ref;
    Ok(
        secret_key(shared, namespace, &reference.name, &reference.key)
            .await?
            .0,
    )
}

/// Waits for the first list of classes: before it, no class is known, and an executor (or a
/// pool) could be taken for one without a class. A list that does not come (CRDs or RBAC older
/// than the operator) fails the reconcile, retried with backoff, rather than holding its work
/// slot for good. (Not the store's own readiness future: a store wakes only its latest waiter,
/// and the reconciles waiting at once would all but one wait for good.)
pub async fn classes_known<S>(shared: &Shared<S>) -> Result<()> {
    let mut listed = shared.classes_listed.clone();
    match tokio::time::timeout(CLASSES_WAIT, listed.wait_for(|listed| *listed)).await {
        Ok(Ok(_)) => Ok(()),
        _ => Err(Error::ClassesUnknown),
    }
}

/// The class `executor` takes ([`class::resolve`]), as `recorded`, from the class cache, with
/// its namespace's labels, which are read only when they can matter (empty otherwise).
pub async fn class_of<S>(
    shared: &Shared<S>,
    executor: &BriqExecutor,
    recorded: class::Recorded<'_>,
) -> Result<(class::Resolved, BTreeMap<String, String>)> {
    classes_known(shared).await?;
    let classes = shared.classes.state();
    let labels = if class::needs_namespace_labels(&executor.spec, recorded, &classes) {
        let namespace = executor.namespace().unwrap_or_default();
        let namespaces: Api<Namespace> = Api::all(shared.client.clone());
        namespaces
            .get_metadata_opt(&namespace)
            .await?
            .and_then(|n| n.metadata.labels)
            .unwrap_or_default()
    } else {
        BTreeMap::new()
    };
    let resolved = class::resolve(&executor.spec, recorded, &classes, &labels);
    Ok((resolved, labels))
}

/// The class `executor` was made under, if any, from the cache (an executor not made yet may
/// get another: see [`class_of`]).
pub fn made_under<S>(
    shared: &Shared<S>,
    executor: &BriqExecutor,
) -> Option<Arc<BriqExecutorClass>> {
    let classes = shared.classes.state();
    let recorded = class::recorded(executor.annotations());
    match class::resolve(&executor.spec, recorded, &classes, &BTreeMap::new()) {
        class::Resolved::Class(class) => Some(class),
        _ => None,
    }
}

/// The API key in field `key` (empty: the default field) of the labelled Secret
/// `namespace/name`.
pub async fn secret_key<S>(
    shared: &Shared<S>,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<(ApiKey, Secret)> {
    let secrets: Api<Secret> = Api::namespaced(shared.client.clone(), namespace);
    // Only Secrets labelled for it are keys: otherwise anyone who may create an executor could
    // have the operator send any Secret of the namespace to briq, even one they cannot read.
    // An unlabelled Secret is reported exactly like a missing one.
    let secret = secrets
        .get_opt(name)
        .await?
        .filter(|secret| {
            secret.labels().get(API_KEY_LABEL).map(String::as_str) == Some(API_KEY_LABEL_VALUE)
        })
        .ok_or_else(|| {
            Error::ApiKey(format!(
                "no Secret {namespace}/{name} labelled {API_KEY_LABEL}={API_KEY_LABEL_VALUE}"
            ))
        })?;
    let key = if key.is_empty() {
        DEFAULT_API_KEY_SECRET_KEY
    } else {
        key
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .ok_or_else(|| Error::ApiKey(format!("Secret {namespace}/{name} has no key {key}")))?;
    let text = String::from_utf8(bytes.0.clone()).map_err(|_| {
        Error::ApiKey(format!(
            "key {key} of Secret {namespace}/{name} is not UTF-8"
        ))
    })?;
    let api_key = ApiKey::new(text.trim())
        .map_err(|e| Error::ApiKey(format!("key {key} of Secret {namespace}/{name}: {e}")))?;
    Ok((api_key, secret))
}
