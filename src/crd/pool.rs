//! `BriqExecutorPool`: executors kept provisioned and Ready ahead of demand, which a
//! `BriqExecutor` with `spec.poolRef` claims instead of creating a sandbox of its own.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{executor::BriqExecutorSpec, reasons};

/// The most members one pool keeps.
pub const MAX_POOL_REPLICAS: i32 = 1000;

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
    super::reasons::append_description(
        schema,
        &reasons::describe(PoolReason::ALL, PoolReason::description),
    );
}

/// The hash of a template, as the members made from it carry it ([`TEMPLATE_HASH_LABEL`](super::TEMPLATE_HASH_LABEL)): an
/// upgrade that changed it would replace every unclaimed member (`tests/upgrade.rs`).
pub fn template_hash(pool: &BriqExecutorPool) -> String {
    let canonical = serde_json::to_vec(&pool.spec.template).expect("a spec serializes");
    let digest = Sha256::digest(&canonical);
    digest[..5].iter().map(|b| format!("{b:02x}")).collect()
}
