//! `BriqExecutorPool`: executors kept provisioned and Ready ahead of demand, which a
//! `BriqExecutor` with `spec.poolRef` claims instead of creating a sandbox of its own.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{BriqExecutorSpec, reasons};

/// The most members one pool keeps.
pub const MAX_POOL_REPLICAS: i32 = 1000;

/// On a pool's unclaimed members: the pool's name. Removed when a member is claimed, so the
/// scale subresource's selector counts only what the pool still offers.
pub const POOL_LABEL: &str = "briq.cloud/pool";
/// On a pool's members: the hash of the template they were made from.
pub const TEMPLATE_HASH_LABEL: &str = "briq.cloud/pool-template-hash";
/// On a pool's members, from their creation on and for good: the pool's name. Guarded by the
/// admission policy (only the operator writes `briq.cloud/` annotations). A member runs no code
/// of its own.
pub const POOL_MEMBER_ANNOTATION: &str = "briq.cloud/pool-member";
/// On a claimed member: the uid of the executor it was handed to (written once, with the
/// member's resourceVersion as precondition: exactly one claimer wins).
pub const CLAIMED_BY_ANNOTATION: &str = "briq.cloud/claimed-by";
/// The same uid as a label, so that a claimer finds its member with one selective LIST after a
/// crash between the two halves of the handover.
pub const CLAIMED_BY_LABEL: &str = "briq.cloud/claimed-by";
/// On a claimer: the name of the member whose sandbox and kernel it took. Only a pointer: the
/// member's own `claimed-by` must name the claimer's uid for the sandbox to count as its own.
pub const CLAIMED_MEMBER_ANNOTATION: &str = "briq.cloud/claimed-member";
/// On a claimer that stopped waiting for its pool: why it creates a sandbox of its own.
pub const POOL_FALLBACK_ANNOTATION: &str = "briq.cloud/pool-fallback";

/// Executors kept provisioned and Ready (sandbox created, bridge set up, kernel started), so
/// that a `BriqExecutor` with `spec.poolRef` is Ready as soon as it claims one. Members whose
/// template is outdated, or that became unusable or expired, are replaced while unclaimed; a
/// claimed member belongs to its claimer and never changes. Deleting the pool or scaling it down
/// destroys unclaimed members only.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "briq.cloud",
    version = "v1alpha1",
    kind = "BriqExecutorPool",
    plural = "briqexecutorpools",
    shortname = "bqp",
    doc = "A warm pool of Ready BriqExecutors, claimed through BriqExecutor spec.poolRef.",
    namespaced,
    status = "BriqExecutorPoolStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Current","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct BriqExecutorPoolSpec {
    /// How many unclaimed, Ready executors to keep (0 to 1,000). Driven by `kubectl scale`, an
    /// HPA or KEDA through the scale subresource.
    #[schemars(range(min = 0, max = MAX_POOL_REPLICAS))]
    pub replicas: i32,

    /// The spec of every member. A claimer's sandbox is the template's: the claimer's own
    /// image, size, sleep, setupTimeoutSeconds, packages, env and apiKeySecretRef must equal
    /// the template's or be left at their defaults. `poolRef` is not allowed here (the rule is
    /// set where the CRD is generated, `crd::pool_template_rules`).
    pub template: BriqExecutorSpec,
}

#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BriqExecutorPoolStatus {
    /// `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Unclaimed members made from the current template, Ready or not yet.
    #[serde(default)]
    pub replicas: i32,

    /// Unclaimed members made from the current template whose kernel answers.
    #[serde(default)]
    pub ready_replicas: i32,

    /// The label selector of the unclaimed members (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// `Ready` is True when `readyReplicas` reaches `spec.replicas`. Its reasons:
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = list_pool_reasons)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

fn list_pool_reasons(schema: &mut schemars::Schema) {
    use reasons::PoolReason;
    super::append_description(
        schema,
        &reasons::describe(PoolReason::ALL, PoolReason::description),
    );
}

/// A claimer's reference to the pool it takes its sandbox from.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PoolRef {
    /// The `BriqExecutorPool`, in this namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// How long to wait for a Ready member before creating a sandbox of its own (cold), in
    /// seconds (0 to 600, default 30). A pool that is missing or scaled to zero is not waited
    /// for.
    #[serde(default = "default_cold_create_after")]
    #[schemars(range(min = 0, max = 600))]
    pub cold_create_after_seconds: u32,
}

fn default_cold_create_after() -> u32 {
    30
}
