//! `BriqExecutorClass`: what a platform team decides for the executors of many tenants — the
//! briq key (in a namespace tenants cannot read), who may use it, and the limits of their specs.
//! Cluster-scoped, as StorageClass, IngressClass and GatewayClass are.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{
    executor::{ApiKeySecretRef, MAX_EXECUTION_TIMEOUT_SECONDS, MAX_IDLE_TIMEOUT_SECONDS},
    keys::DEFAULT_CLASS_ANNOTATION,
    pool::MAX_POOL_REPLICAS,
};

/// Rules a platform team sets for executors: the briq API key they use (a Secret in the
/// operator's namespace, which tenants never read), the namespaces that may use the class, and
/// the defaults and limits of executor specs. A spec outside them is refused at admission (the
/// chart's `ValidatingAdmissionPolicy`, with the class as its parameter) and, should one get
/// through (admission off, the class created after the executor), by the operator, which
/// reports it and creates no sandbox. Executors made before a change of the class keep running.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "briq.cloud",
    version = "v1alpha1",
    kind = "BriqExecutorClass",
    plural = "briqexecutorclasses",
    shortname = "bqc",
    status = "BriqExecutorClassStatus",
    doc = "Platform rules for BriqExecutors: the briq key, who may use it, spec defaults and limits.",
    printcolumn = r#"{"name":"Default","type":"string","jsonPath":".metadata.annotations.briq\\.cloud/is-default-class"}"#,
    printcolumn = r#"{"name":"Key","type":"string","jsonPath":".spec.apiKeySecretRef.name"}"#,
    printcolumn = r#"{"name":"Briq","type":"string","jsonPath":".status.conditions[?(@.type==\"BriqInterface\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct BriqExecutorClassSpec {
    /// Secret in the operator's namespace holding the briq API key of this class's executors.
    /// It must carry the label `briq.cloud/api-key: "true"`. Tenants need no access to it (and
    /// should have none): the operator reads it for them.
    pub api_key_secret_ref: ApiKeySecretRef,

    /// Namespaces whose executors and pools may use this class (matched against the namespace's
    /// labels, for example `kubernetes.io/metadata.name`). When omitted, every namespace may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// Images this class's executors may use: each an exact image, or a prefix ending in `*`
    /// (`registry.example.com/agents/*`). When omitted, any image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 512)))]
    pub allowed_images: Option<Vec<String>>,

    /// The image of an executor that leaves `image` at its default. It must itself be allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub default_image: Option<String>,

    /// briq sizes this class's executors may ask for. When omitted, any size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32), inner(length(min = 1, max = 32)))]
    pub allowed_sizes: Option<Vec<String>>,

    /// The size of an executor that sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32), regex(pattern = r"^[a-z0-9][a-z0-9-]*$"))]
    pub default_size: Option<String>,

    /// The `sleep` of an executor that leaves it at its default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([1-9][0-9]{0,3}[mhd]|never)$"))]
    pub default_sleep: Option<String>,

    /// The longest `executionTimeoutSeconds` an executor may set (1 to 40). An executor that
    /// leaves it at its default (30) gets this one when it is shorter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_EXECUTION_TIMEOUT_SECONDS))]
    pub max_execution_timeout_seconds: Option<u32>,

    /// The `idleTimeoutSeconds` of an executor that sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_IDLE_TIMEOUT_SECONDS))]
    pub default_idle_timeout_seconds: Option<u32>,

    /// The longest `idleTimeoutSeconds` an executor may set; one that sets none (and has no
    /// default from the class) gets this one: no executor of the class is kept idle longer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_IDLE_TIMEOUT_SECONDS))]
    pub max_idle_timeout_seconds: Option<u32>,

    /// Executors of this class may set `idleAction: Suspend`: idle for their
    /// `idleTimeoutSeconds`, they keep their stopped sandbox (its disk, with the saved
    /// namespace) until deleted, instead of giving it back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_idle_suspend: bool,

    /// The most members a pool of this class may keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_POOL_REPLICAS))]
    pub max_pool_replicas: Option<i32>,

    /// What one namespace may use of this class at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_namespace: Option<NamespaceLimits>,
}

/// What the operator found of a class's briq key.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BriqExecutorClassStatus {
    /// `BriqInterface` is False when briq's MCP server, asked with the class's key, does not
    /// declare a tool or argument the operator sends, or requires one it never sends (the
    /// message names each), and True once a sandbox is made with the key again. Written only
    /// when it changes. Its reasons:
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = list_class_reasons)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

fn list_class_reasons(schema: &mut schemars::Schema) {
    use super::reasons::{self, ClassReason};
    reasons::append_description(
        schema,
        &reasons::describe(ClassReason::ALL, ClassReason::description),
    );
}

/// Limits of one namespace's use of a class.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceLimits {
    /// Executors of the class (pool members included) that hold or make a sandbox at once in
    /// one namespace. One more waits (`WaitingForCapacity`) and makes its sandbox when one of
    /// them goes (deleted, or its sandbox given back), oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100000))]
    pub max_executors: Option<u32>,

    /// Executions of the class's executors that run at once in one namespace. One more waits
    /// (`WaitingForCapacity`) until one of them ends: a namespace cannot take more than this of
    /// the platform's capacity, however many executors it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_running_executions: Option<u32>,

    /// Executions of the class's executors that wait (not started) at once in one namespace.
    /// One created beyond them fails at once with `QueueFull`, without running: every waiting
    /// Execution costs the operator memory and the API server watch events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub max_queued_executions: Option<u32>,
}

impl BriqExecutorClass {
    /// Whether the class is marked the default.
    pub fn is_default(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
            .is_some_and(|v| v == "true")
    }
}
