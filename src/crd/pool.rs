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
    printcolumn = r#"{"name":"Target","type":"integer","jsonPath":".status.targetReplicas"}"#,
    printcolumn = r#"{"name":"Current","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new(
    "(!has(self.minReady) || (has(self.maxReady) && self.minReady <= self.maxReady)) \
     && (!has(self.demandWindowSeconds) || has(self.maxReady))"
).message(
    "minReady and demandWindowSeconds size the pool by demand, which maxReady turns on: set \
     maxReady, at least minReady"
))]
#[serde(rename_all = "camelCase")]
pub struct BriqExecutorPoolSpec {
    /// How many unclaimed, Ready executors to keep (0 to 1,000; default 0). Driven by
    /// `kubectl scale`, an HPA or KEDA through the scale subresource. Not used while `maxReady`
    /// sizes the pool by demand, which may leave it out: `kubectl scale` then still writes it,
    /// to no effect until `maxReady` goes.
    #[serde(default = "no_replicas")]
    #[schemars(range(min = 0, max = MAX_POOL_REPLICAS))]
    pub replicas: i32,

    /// Size the pool by demand, between `minReady` and this many unclaimed members (1 to
    /// 1,000; the class's `maxPoolReplicas` bounds it too): the pool keeps as many as the
    /// claims of the last `demandWindowSeconds` made within any span of one refill (the
    /// measured time to make a member Ready). Set, it wins over `replicas` (what `kubectl
    /// scale`, an HPA or KEDA write): do not point an autoscaler at a demand-sized pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_POOL_REPLICAS))]
    pub max_ready: Option<i32>,

    /// The fewest unclaimed members a demand-sized pool keeps (0 to 1,000; default 0: the
    /// pool scales to zero after `demandWindowSeconds` without a claim, and the next claim
    /// waits for a member or creates its own sandbox at `coldCreateAfterSeconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_POOL_REPLICAS))]
    pub min_ready: Option<i32>,

    /// How far back a demand-sized pool counts claims (10 to 86,400 seconds; default 300): it
    /// grows at once when claims come faster, shrinks only once a burst is this far behind,
    /// and goes down to `minReady` after this long without a claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 86400))]
    pub demand_window_seconds: Option<u32>,

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

    /// The unclaimed members the pool aims for: `spec.replicas`, or the demand rule's target
    /// when `maxReady` is set, within the class's `maxPoolReplicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_replicas: Option<i32>,

    /// A demand-sized pool's last look at its claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand: Option<PoolDemand>,

    /// The label selector of the unclaimed members (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// `Ready` is True when `readyReplicas` reaches `spec.replicas`. Its reasons:
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = list_pool_reasons)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// What a demand-sized pool saw of its claims.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PoolDemand {
    /// Claims made in the last `demandWindowSeconds`.
    pub claims_in_window: i32,
    /// Of them, those that found no Ready member in time: their claimer created its own sandbox.
    pub cold_in_window: i32,
    /// The most of them made within one refill: what the pool keeps ready (within its bounds).
    pub peak_per_refill: i32,
    /// The time to make a member Ready the rule used, in milliseconds: measured on the pool's
    /// members, or a default until one has been made.
    pub refill_millis: u64,
}

fn list_pool_reasons(schema: &mut schemars::Schema) {
    use reasons::PoolReason;
    super::reasons::append_description(
        schema,
        &reasons::describe(PoolReason::ALL, PoolReason::description),
    );
}

/// What a pool that leaves `replicas` out keeps: none, unless `maxReady` sizes it. Set as the
/// schema's default, so that the scale subresource always finds `spec.replicas`.
fn no_replicas() -> i32 {
    0
}

impl BriqExecutorPool {
    /// Whether the pool keeps no member now: `replicas: 0`, or, sized by demand, a target of
    /// zero (a claimer then creates its own sandbox at once: nothing is coming).
    pub fn scaled_to_zero(&self) -> bool {
        match self.spec.max_ready {
            None => self.spec.replicas == 0,
            Some(_) => self.status.as_ref().and_then(|s| s.target_replicas) == Some(0),
        }
    }
}

/// The hash of a template, as the members made from it carry it ([`TEMPLATE_HASH_LABEL`](super::TEMPLATE_HASH_LABEL)): an
/// upgrade that changed it would replace every unclaimed member (`tests/upgrade.rs`).
pub fn template_hash(pool: &BriqExecutorPool) -> String {
    let canonical = serde_json::to_vec(&pool.spec.template).expect("a spec serializes");
    let digest = Sha256::digest(&canonical);
    digest[..5].iter().map(|b| format!("{b:02x}")).collect()
}
