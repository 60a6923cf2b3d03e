//! Events about objects: published at once where something is ordered against them, or queued
//! in the background ([`super::events`]).

use kube::Resource;
use tracing::warn;

use super::context::Shared;

/// An Event of this controller.
pub fn event(
    type_: kube::runtime::events::EventType,
    reason: &str,
    action: &str,
    note: String,
) -> kube::runtime::events::Event {
    kube::runtime::events::Event {
        type_,
        reason: reason.to_owned(),
        // Event notes are limited to 1 KiB.
        note: Some(note.chars().take(1000).collect()),
        action: action.to_owned(),
        secondary: None,
    }
}

/// Queues `event` about `object`, which nothing is ordered against ([`events`]).
pub fn publish_deferred<S, K: Resource<DynamicType = ()>>(
    shared: &Shared<S>,
    object: &K,
    event: kube::runtime::events::Event,
) {
    shared
        .deferred_events
        .publish(event, object.object_ref(&()));
}

/// Publishes an event about `object`; a failure to publish is logged, never fatal.
pub async fn publish<S, K: Resource<DynamicType = ()>>(
    shared: &Shared<S>,
    object: &K,
    type_: kube::runtime::events::EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = event(type_, reason, action, note);
    if let Err(error) = shared
        .recorder
        .publish(&event, &object.object_ref(&()))
        .await
    {
        warn!(%error, reason, "could not publish an event");
    }
}
