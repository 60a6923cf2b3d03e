//! Which `BriqExecutorClass` an executor takes, and what the class makes of its spec: the
//! values its sandbox gets (a field left at its default takes the class's default) and the
//! limits it breaks, each named. Pure; the chart's admission policy says the same in CEL, and
//! the operator checks again before it creates a sandbox (admission may be off, or the class
//! may have come after the executor).

use std::{collections::BTreeMap, sync::Arc};

use kube::{
    ResourceExt,
    core::{Selector, SelectorExt},
};

use crate::crd::{
    BriqExecutorClass, BriqExecutorClassSpec, BriqExecutorSpec, CLAIMED_MEMBER_ANNOTATION,
    CLASS_ANNOTATION, CREATE_PENDING_ANNOTATION, DEFAULT_EXECUTION_TIMEOUT_SECONDS, IdleAction,
    SANDBOX_ID_ANNOTATION,
};

/// What an executor's annotations say of the class its sandbox was made under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded<'a> {
    /// Made under this class.
    Class(&'a str),
    /// Made without a class (before classes existed, or with no class to take).
    Unclassed,
    /// No sandbox made or claimed yet: the class is chosen now.
    NotYet,
}

/// What `annotations` of an executor record of its class: its [`CLASS_ANNOTATION`], else, once
/// it has or is making a sandbox, none.
pub fn recorded(annotations: &BTreeMap<String, String>) -> Recorded<'_> {
    if let Some(name) = annotations.get(CLASS_ANNOTATION) {
        return Recorded::Class(name);
    }
    let made = [
        SANDBOX_ID_ANNOTATION,
        CREATE_PENDING_ANNOTATION,
        CLAIMED_MEMBER_ANNOTATION,
    ]
    .iter()
    .any(|key| annotations.contains_key(*key));
    if made {
        Recorded::Unclassed
    } else {
        Recorded::NotYet
    }
}

/// The class an executor takes.
#[derive(Debug, Clone)]
pub enum Resolved {
    Class(Arc<BriqExecutorClass>),
    /// It names a class (or was made under one) that does not exist (yet).
    Missing(String),
    /// No class: its own `apiKeySecretRef`, or the operator's default key.
    Unclassed,
}

/// The class of an executor with `spec` in the namespace labelled `namespace_labels`, among
/// `classes`: the one it names; else, unless it brings its own key, the one it was made under
/// (`recorded`), else the default class whose `namespaceSelector` selects the namespace (the
/// newest, if several are marked). The labels matter only for an executor not made yet.
pub fn resolve(
    spec: &BriqExecutorSpec,
    recorded: Recorded,
    classes: &[Arc<BriqExecutorClass>],
    namespace_labels: &BTreeMap<String, String>,
) -> Resolved {
    let named = |name: &str| {
        classes.iter().find(|c| c.name_any() == name).map_or_else(
            || Resolved::Missing(name.to_owned()),
            |c| Resolved::Class(c.clone()),
        )
    };
    if let Some(name) = &spec.class_name {
        return named(name);
    }
    if spec.api_key_secret_ref.is_some() {
        return Resolved::Unclassed;
    }
    match recorded {
        Recorded::Class(name) => return named(name),
        Recorded::Unclassed => return Resolved::Unclassed,
        Recorded::NotYet => {}
    }
    classes
        .iter()
        .filter(|c| c.is_default() && selects(&c.spec, namespace_labels))
        .max_by_key(|c| (c.metadata.creation_timestamp.clone(), c.name_any()))
        .map_or(Resolved::Unclassed, |c| Resolved::Class(c.clone()))
}

/// Whether resolving the class of an executor with `spec`, as `recorded`, among `classes` may
/// depend on its namespace's labels (else they need not be read).
pub fn needs_namespace_labels(
    spec: &BriqExecutorSpec,
    recorded: Recorded,
    classes: &[Arc<BriqExecutorClass>],
) -> bool {
    match resolve(spec, recorded, classes, &BTreeMap::new()) {
        Resolved::Class(class) => class.spec.namespace_selector.is_some(),
        Resolved::Missing(_) => false,
        // A default class selecting only some namespaces may be this one's.
        Resolved::Unclassed => {
            recorded == Recorded::NotYet
                && spec.class_name.is_none()
                && spec.api_key_secret_ref.is_none()
                && classes.iter().any(|c| c.is_default())
        }
    }
}

/// Whether `class`'s `namespaceSelector` selects the namespace labelled `namespace_labels`.
fn selects(class: &BriqExecutorClassSpec, namespace_labels: &BTreeMap<String, String>) -> bool {
    match &class.namespace_selector {
        None => true,
        // A selector the API server accepted but this code cannot read selects nothing.
        Some(selector) => Selector::try_from(selector.clone())
            .is_ok_and(|selector| selector.matches(namespace_labels)),
    }
}

/// What the sandbox of an executor gets, its spec's values with the class's defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effective {
    pub image: String,
    pub size: Option<String>,
    pub sleep: String,
    pub execution_timeout_seconds: u32,
    pub idle_timeout_seconds: Option<u32>,
}

/// `spec` under `class` (none: the spec as it is). A field left at its default (the CRD's) takes
/// the class's default; the class's maximum execution timeout shortens a default one; an
/// executor that sets no idle timeout gets the class's default, else its maximum.
pub fn effective(spec: &BriqExecutorSpec, class: Option<&BriqExecutorClassSpec>) -> Effective {
    let unset = BriqExecutorSpec::default_for_comparison();
    let mut effective = Effective {
        image: spec.image.clone(),
        size: spec.size.clone(),
        sleep: spec.sleep.clone(),
        execution_timeout_seconds: spec.execution_timeout_seconds,
        idle_timeout_seconds: spec.idle_timeout_seconds,
    };
    let Some(class) = class else {
        return effective;
    };
    if spec.image == unset.image
        && let Some(image) = &class.default_image
    {
        effective.image = image.clone();
    }
    if effective.size.is_none() {
        effective.size = class.default_size.clone();
    }
    if spec.sleep == unset.sleep
        && let Some(sleep) = &class.default_sleep
    {
        effective.sleep = sleep.clone();
    }
    if spec.execution_timeout_seconds == DEFAULT_EXECUTION_TIMEOUT_SECONDS
        && let Some(max) = class.max_execution_timeout_seconds
    {
        effective.execution_timeout_seconds = effective.execution_timeout_seconds.min(max);
    }
    effective.idle_timeout_seconds = spec
        .idle_timeout_seconds
        .or(class.default_idle_timeout_seconds)
        .or(class.max_idle_timeout_seconds);
    effective
}

/// The idle timeout an executor made under `class` runs with: [`effective`]'s, never beyond the
/// class's maximum (the spec's may have been raised after admission saw it).
pub fn idle_timeout_seconds(
    spec: &BriqExecutorSpec,
    class: Option<&BriqExecutorClassSpec>,
) -> Option<u32> {
    let idle = effective(spec, class).idle_timeout_seconds;
    match class.and_then(|c| c.max_idle_timeout_seconds) {
        Some(max) => idle.map(|idle| idle.min(max)),
        None => idle,
    }
}

/// Whether `image` is one of `allowed`: an exact image, or a prefix ending in `*`.
pub fn image_allowed(image: &str, allowed: &[String]) -> bool {
    allowed
        .iter()
        .any(|pattern| match pattern.strip_suffix('*') {
            Some(prefix) => image.starts_with(prefix),
            None => image == pattern,
        })
}

/// The limits of class `name` that an executor with `spec` in the namespace labelled
/// `namespace_labels` (which hold its name, `kubernetes.io/metadata.name`) breaks, each as a
/// message naming the limit. Empty: it may use the class.
pub fn violations(
    name: &str,
    class: &BriqExecutorClassSpec,
    spec: &BriqExecutorSpec,
    namespace: &str,
    namespace_labels: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut broken = namespace_violation(name, class, namespace, namespace_labels)
        .into_iter()
        .collect::<Vec<_>>();
    let effective = effective(spec, Some(class));
    if let Some(allowed) = &class.allowed_images
        && !image_allowed(&effective.image, allowed)
    {
        broken.push(format!(
            "image {} is not allowed by class {name} (allowedImages: {})",
            effective.image,
            allowed.join(", ")
        ));
    }
    if let (Some(allowed), Some(size)) = (&class.allowed_sizes, &effective.size)
        && !allowed.contains(size)
    {
        broken.push(format!(
            "size {size} is not allowed by class {name} (allowedSizes: {})",
            allowed.join(", ")
        ));
    }
    if let Some(max) = class.max_execution_timeout_seconds
        && effective.execution_timeout_seconds > max
    {
        broken.push(format!(
            "executionTimeoutSeconds {} is above class {name}'s maxExecutionTimeoutSeconds {max}",
            effective.execution_timeout_seconds
        ));
    }
    if let (Some(max), Some(idle)) = (
        class.max_idle_timeout_seconds,
        effective.idle_timeout_seconds,
    ) && idle > max
    {
        broken.push(format!(
            "idleTimeoutSeconds {idle} is above class {name}'s maxIdleTimeoutSeconds {max}"
        ));
    }
    if spec.idle_action == IdleAction::Suspend && !class.allow_idle_suspend {
        broken.push(format!(
            "idleAction Suspend is not allowed by class {name} (allowIdleSuspend is not set)"
        ));
    }
    broken
}

/// Whether an executor with `spec`, made under `class`, is suspended rather than expired at its
/// idle timeout: it asks for it and its class (if any) allows it. Checked again at the timeout,
/// as the idle timeout is: the spec may have changed after admission saw it.
pub fn suspends_when_idle(spec: &BriqExecutorSpec, class: Option<&BriqExecutorClassSpec>) -> bool {
    spec.idle_action == IdleAction::Suspend && class.is_none_or(|class| class.allow_idle_suspend)
}

/// Why namespace `namespace` may not use class `name`, if it may not.
pub fn namespace_violation(
    name: &str,
    class: &BriqExecutorClassSpec,
    namespace: &str,
    namespace_labels: &BTreeMap<String, String>,
) -> Option<String> {
    let selected = selects(class, namespace_labels);
    (!selected).then(|| {
        format!("namespace {namespace} may not use class {name}: its namespaceSelector does not select it")
    })
}

/// An executor, as [`executors_ahead`] counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Whether it holds or makes a sandbox under the class.
    pub holds: bool,
    /// Not made yet, of the class, waiting: when it was created, and its name (the order in
    /// which waiting executors make their sandboxes).
    pub waits_since: Option<(String, String)>,
}

/// How many executors of a namespace come before one created at `created` named `name` under
/// the class's `maxExecutors`: those holding a sandbox, and those waiting created before it.
pub fn executors_ahead(others: &[Holder], created: &str, name: &str) -> usize {
    others
        .iter()
        .filter(|other| {
            other.holds
                || other
                    .waits_since
                    .as_ref()
                    .is_some_and(|(at, n)| (at.as_str(), n.as_str()) < (created, name))
        })
        .count()
}

/// The limit of class `name` a pool keeping `replicas` members breaks, if it breaks one; `what`
/// names where the number comes from (`replicas`, or the demand target of a demand-sized pool).
pub fn pool_violation(
    name: &str,
    class: &BriqExecutorClassSpec,
    what: &str,
    replicas: i32,
) -> Option<String> {
    let max = class.max_pool_replicas?;
    (replicas > max)
        .then(|| format!("{what} {replicas} is above class {name}'s maxPoolReplicas {max}"))
}

#[cfg(test)]
mod tests;
