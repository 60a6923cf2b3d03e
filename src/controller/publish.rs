//! Events about objects, published where they happen. A step that happens in bursts (a claim)
//! publishes none: its condition says it, and 100 claims at once would be 100 more writes while
//! they compete for the API server.

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
