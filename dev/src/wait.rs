//! Waiting, with a deadline, for a state of the cluster or of anything else.

use std::{future::Future, time::Duration};

use anyhow::{Context as _, bail};
use kube::{
    Api,
    runtime::wait::{await_condition, conditions},
};

/// What [`for_object`] and [`deleted`] need of a resource.
pub trait Watched:
    kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static
{
}

impl<K> Watched for K where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// Polls `check` every `interval` until it holds; fails with `what` after `timeout`. Returns how
/// long it took.
pub async fn poll<F, Fut>(
    timeout: Duration,
    interval: Duration,
    what: &str,
    mut check: F,
) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let started = tokio::time::Instant::now();
    while !check().await? {
        if started.elapsed() > timeout {
            bail!("{what}: not within {timeout:?}");
        }
        tokio::time::sleep(interval).await;
    }
    Ok(started.elapsed())
}

/// [`poll`] for a condition that needs no I/O, every 50 ms.
pub async fn until(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> bool,
) -> anyhow::Result<Duration> {
    poll(timeout, Duration::from_millis(50), what, || {
        std::future::ready(Ok(check()))
    })
    .await
}

/// Watches the named object until `condition` holds for it; fails after `timeout`, saying what
/// the object looks like then.
pub async fn for_object<K: Watched>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
    condition: impl Fn(&K) -> bool,
) -> anyhow::Result<K> {
    let wait = await_condition(api.clone(), name, move |object: Option<&K>| {
        object.is_some_and(&condition)
    });
    match tokio::time::timeout(timeout, wait).await {
        Ok(found) => found
            .with_context(|| format!("watching {name}"))?
            .with_context(|| format!("{name} disappeared")),
        Err(_) => bail!(
            "{name} did not reach the expected state within {timeout:?}: {:#?}",
            api.get_opt(name).await
        ),
    }
}

/// Waits until the named object is gone (at once if it does not exist).
pub async fn deleted<K: Watched>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let Some(object) = api.get_opt(name).await? else {
        return Ok(());
    };
    let uid = object.meta().uid.clone().unwrap_or_default();
    let wait = await_condition(api.clone(), name, conditions::is_deleted(&uid));
    match tokio::time::timeout(timeout, wait).await {
        Ok(done) => Ok(done.map(|_| ())?),
        Err(_) => bail!(
            "{name} still exists after {timeout:?}: {:#?}",
            api.get_opt(name).await
        ),
    }
}
