//! `BriqExecutor`: one briq sandbox with a live Jupyter kernel, owned by one custom resource.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::reasons::{ExecutorReason, describe};

pub const DEFAULT_IMAGE: &str = "python:3.12-slim";
pub const DEFAULT_SLEEP: &str = "30m";
pub const DEFAULT_EXECUTION_TIMEOUT_SECONDS: u32 = 30;
pub const MAX_EXECUTION_TIMEOUT_SECONDS: u32 = 40;
pub const DEFAULT_SETUP_TIMEOUT_SECONDS: u32 = 60;
pub const DEFAULT_MAX_QUEUED_EXECUTIONS: u32 = 100;
/// Largest `ttlSecondsAfterFinished`, as Jobs' (an int32).
pub const MAX_TTL_SECONDS: u32 = i32::MAX as u32;
pub const DEFAULT_API_KEY_SECRET_KEY: &str = "BRIQ_API_KEY";

/// The longest `idleTimeoutSeconds`: 30 days.
pub const MAX_IDLE_TIMEOUT_SECONDS: u32 = 30 * 24 * 3600;

/// Fields that shape the sandbox cannot change once it exists: the executor owns exactly one
/// sandbox and never rebuilds it behind the user's back. Make a new executor instead.
const SANDBOX_FIELDS_IMMUTABLE: &str = "self.image == oldSelf.image && self.sleep == oldSelf.sleep \
    && self.setupTimeoutSeconds == oldSelf.setupTimeoutSeconds \
    && (has(self.size) ? has(oldSelf.size) && self.size == oldSelf.size : !has(oldSelf.size)) \
    && (has(self.packages) ? has(oldSelf.packages) && self.packages == oldSelf.packages : !has(oldSelf.packages)) \
    && (has(self.env) ? has(oldSelf.env) && self.env == oldSelf.env : !has(oldSelf.env)) \
    && (has(self.apiKeySecretRef) ? has(oldSelf.apiKeySecretRef) && self.apiKeySecretRef == oldSelf.apiKeySecretRef : !has(oldSelf.apiKeySecretRef)) \
    && (has(self.poolRef) ? has(oldSelf.poolRef) && self.poolRef == oldSelf.poolRef : !has(oldSelf.poolRef)) \
    && (has(self.className) ? has(oldSelf.className) && self.className == oldSelf.className : !has(oldSelf.className)) \
    && (has(self.forkFrom) ? has(oldSelf.forkFrom) && self.forkFrom == oldSelf.forkFrom : !has(oldSelf.forkFrom))";

/// A sandboxed Python executor: the operator creates one briq sandbox for it, installs the
/// bridge and its Python dependencies, starts a Jupyter kernel on loopback inside the sandbox and
/// reports `Ready`. Python state survives across the `Execution`s that reference it. Deleting the
/// executor destroys its sandbox.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "briq.cloud",
    version = "v1alpha1",
    kind = "BriqExecutor",
    plural = "briqexecutors",
    shortname = "bqe",
    doc = "A sandboxed Python executor backed by one briq sandbox with a live Jupyter kernel.",
    namespaced,
    status = "BriqExecutorStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Sandbox","type":"string","jsonPath":".status.sandboxId","priority":1}"#,
    printcolumn = r#"{"name":"Executions","type":"integer","jsonPath":".status.executionsTotal"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new(SANDBOX_FIELDS_IMMUTABLE).message(
    "image, size, sleep, setupTimeoutSeconds, packages, env, apiKeySecretRef, poolRef, className and forkFrom \
     are immutable: the sandbox already exists; create a new BriqExecutor instead"
))]
#[x_kube(validation = Rule::new("!(has(self.forkFrom) && has(self.poolRef))").message(
    "forkFrom and poolRef exclude each other: a fork takes its source's state, a claimer a pool member's sandbox"
))]
#[x_kube(validation = Rule::new("!(has(self.className) && has(self.apiKeySecretRef))").message(
    "className and apiKeySecretRef exclude each other: a class brings its own briq key"
))]
#[serde(rename_all = "camelCase")]
pub struct BriqExecutorSpec {
    /// Container image of the sandbox. It must provide `python3` and `pip`; the bridge's
    /// dependencies are pip-installed at setup unless the image already has them.
    #[serde(default = "default_image")]
    #[schemars(length(min = 1, max = 512))]
    pub image: String,

    /// briq sandbox size (for example `small`, `medium`). Passed to briq as is; when omitted,
    /// briq chooses its plan default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32), regex(pattern = r"^[a-z0-9][a-z0-9-]*$"))]
    pub size: Option<String>,

    /// Idle time after which briq puts the sandbox to sleep: a number with `m`, `h` or `d`, or
    /// `never` (plan-gated). Sleeping loses the kernel, and the executor then becomes unusable.
    #[serde(default = "default_sleep")]
    #[schemars(regex(pattern = r"^([1-9][0-9]{0,3}[mhd]|never)$"))]
    pub sleep: String,

    /// Default deadline of one Execution, in seconds (1 to 40). An Execution that runs longer is
    /// interrupted and the executor becomes unusable.
    #[serde(default = "default_execution_timeout")]
    #[schemars(range(min = 1, max = MAX_EXECUTION_TIMEOUT_SECONDS))]
    pub execution_timeout_seconds: u32,

    /// Deadline of the cold setup (pip install of the bridge's dependencies), in seconds. briq's
    /// synchronous commands end after 60 s, hence the maximum. A setup failure destroys the
    /// sandbox and the executor reports `SetupFailed`.
    #[serde(default = "default_setup_timeout")]
    #[schemars(range(min = 5, max = 60))]
    pub setup_timeout_seconds: u32,

    /// Extra pip requirements installed at setup, for example `pandas==2.2.3`. Options
    /// (anything starting with `-`) are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 256)))]
    #[x_kube(validation = Rule::new("self.all(p, !p.startsWith('-'))").message(
        "pip options are not allowed in packages; give requirement specifiers only"
    ))]
    pub packages: Option<Vec<String>>,

    /// Environment variables of the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub env: Option<Vec<SandboxEnvVar>>,

    /// Secret (in this namespace) holding the briq API key; it must carry the label
    /// `briq.cloud/api-key: "true"` (an unlabelled Secret is treated as missing). When omitted,
    /// the key of the executor's class is used (`className`, else the default class), else the
    /// operator's default key. Not allowed with `className`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<ApiKeySecretRef>,

    /// How many finished Executions of this executor to keep; older ones are deleted, oldest
    /// first. When omitted, nothing is pruned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100000))]
    pub execution_history_limit: Option<u32>,

    /// How many Executions of this executor may wait behind the running one (1 to 10,000). One
    /// created beyond them fails at once with `QueueFull`: every waiting Execution costs the
    /// operator memory and the API server a watch event.
    #[serde(default = "default_max_queued_executions")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_queued_executions: u32,

    /// Seconds after its completion at which a finished Execution of this executor is deleted,
    /// unless the Execution sets its own `ttlSecondsAfterFinished`. When omitted, finished
    /// Executions are kept (see also `executionHistoryLimit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = MAX_TTL_SECONDS))]
    pub execution_ttl_seconds_after_finished: Option<u32>,

    /// Seconds without an Execution after which the executor is reclaimed: its sandbox is
    /// destroyed and it becomes `Expired` for good (`Ready=False`, `Stalled=True`, reason
    /// `IdleTimeout`). Idle counts from the latest of the kernel's first answer and any
    /// Execution's creation or completion, and never while an Execution waits or runs. Keep it
    /// below `sleep`: a sandbox briq puts to sleep loses its kernel, and the executor then
    /// becomes unusable at its next use instead. When omitted, the executor is kept until
    /// deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_IDLE_TIMEOUT_SECONDS))]
    pub idle_timeout_seconds: Option<u32>,

    /// Take a Ready member of this `BriqExecutorPool` (its sandbox and live kernel) instead of
    /// creating a sandbox: Ready as soon as the handover is recorded. Without a Ready member the
    /// executor waits (`WaitingForPool`) and creates its own sandbox after
    /// `coldCreateAfterSeconds`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_ref: Option<PoolRef>,

    /// The `BriqExecutorClass` whose key, defaults and limits this executor takes. When
    /// omitted, the class marked `briq.cloud/is-default-class: "true"`, if any (unless
    /// `apiKeySecretRef` is set). A field left at its default takes the class's default.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub class_name: Option<String>,

    /// Suspend the executor while no Execution needs it: the kernel's user namespace is saved
    /// inside the sandbox (what cannot be saved is listed in `status.suspension`), the sandbox is
    /// stopped through briq (its disk kept, nothing running) and the executor reports
    /// `Ready=False`, reason `Suspended`. An Execution created meanwhile, or `suspend: false`,
    /// resumes it: the sandbox starts, a new kernel starts and the namespace is restored; with
    /// `suspend: true` still set, the executor is suspended again once its Executions have
    /// finished. The saved state never leaves the sandbox. Ignored by an unclaimed pool member
    /// (a pool keeps its members warm; scale the pool instead).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,

    /// What becomes of the executor once it has been idle for its `idleTimeoutSeconds`.
    /// `Expire` (the default): its sandbox is destroyed and it ends for good (`IdleTimeout`).
    /// `Suspend`: it is suspended as `suspend: true` would (its namespace saved inside the
    /// stopped sandbox) and the next Execution resumes it. `Suspend` needs a class that sets
    /// `allowIdleSuspend` (or no class). An unclaimed pool member, or an executor whose namespace
    /// could not be saved, expires instead: the idle timeout always ends the running sandbox.
    #[serde(default, skip_serializing_if = "IdleAction::is_expire")]
    pub idle_action: IdleAction,

    /// Start as a fork of another executor of this namespace: its kernel's namespace and its
    /// kernel user's working files, as they were between two of its Executions, are copied
    /// into this executor's own new sandbox and restored into its kernel (what could not be
    /// saved is listed in `status.fork`). The source pauses its Executions while it saves
    /// (`Ready=False`, reason `Forking`); a suspended source is not resumed. The fork must use
    /// its source's class or key, and a pool member can neither fork nor be forked. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_from: Option<ForkFrom>,
}

/// The executor a fork starts from.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
pub struct ForkFrom {
    /// The source `BriqExecutor`, in this namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// What becomes of an executor idle for its `idleTimeoutSeconds`.
#[derive(
    schemars::JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub enum IdleAction {
    /// Destroy the sandbox; the executor ends for good (`IdleTimeout`).
    #[default]
    Expire,
    /// Suspend it with its namespace; the next Execution resumes it.
    Suspend,
}

impl IdleAction {
    pub fn is_expire(&self) -> bool {
        *self == IdleAction::Expire
    }
}

/// An environment variable set in the sandbox.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
pub struct SandboxEnvVar {
    /// Variable name.
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$")
    )]
    pub name: String,
    /// Variable value.
    #[serde(default)]
    #[schemars(length(max = 32768))]
    pub value: String,
}

/// Reference to a key of a Secret in the executor's namespace.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
pub struct ApiKeySecretRef {
    /// Name of the Secret.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
    /// Key within the Secret.
    #[serde(default = "default_api_key_secret_key")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

/// Observed state of a `BriqExecutor`.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BriqExecutorStatus {
    /// `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready` is True while the kernel answers and the executor accepts Executions. `Stalled` is
    /// True when the executor can never become ready (unusable, setup failed): create a new
    /// executor. Their reasons:
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = list_executor_reasons)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// briq id of the sandbox this executor owns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,

    /// The pool member (a `BriqExecutor` of the pool named by `spec.poolRef`) whose sandbox and
    /// kernel this executor took, written with the `Ready` of its claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_member: Option<String>,

    /// True once the executor may never run code again (after a timeout, a transport failure, a
    /// malformed response, an interrupted Execution or a lost kernel). Final.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unusable: bool,

    /// Why the executor became unusable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unusable_reason: Option<String>,

    /// When the sandbox was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_created_time: Option<Time>,

    /// When the kernel first answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_time: Option<Time>,

    /// Executions run on this executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executions_total: Option<u64>,

    /// When the last Execution finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_execution_time: Option<Time>,

    /// The executor's last suspension (`spec.suspend`): what was saved, what was not, and when
    /// it was suspended and resumed. Kept after the resume: the names not saved are gone from
    /// the kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspension: Option<Suspension>,

    /// A fork's origin (`spec.forkFrom`): the snapshot of its source it took, and what of the
    /// source's namespace came into its kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkOrigin>,

    /// The last snapshot this executor saved inside its sandbox for its forks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Snapshot>,
}

/// Where a fork came from and what it took.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ForkOrigin {
    /// The source executor.
    pub from: String,
    /// The source's sandbox, from which the fork was made and its snapshot read.
    pub source_sandbox: String,
    /// The snapshot taken.
    pub snapshot: SnapshotParts,
    /// How many names of the source's namespace were saved.
    #[serde(default)]
    pub saved_names: u32,
    /// Names that could not be saved, or restored in the fork, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 512))]
    pub unsaved: Vec<UnsavedName>,
    /// When the fork's kernel had the source's namespace (unset until then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_time: Option<Time>,
}

/// A snapshot inside a source's sandbox: its id, and the parts it is read in.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotParts {
    #[schemars(length(max = 64))]
    pub id: String,
    /// Parts of at most 1 MiB.
    pub parts: u64,
    /// Size in bytes: the kernel user's directory packed, the saved namespace included.
    pub size: u64,
    /// SHA-256 (hex) of the whole.
    #[schemars(length(max = 64))]
    pub sha256: String,
}

/// A snapshot an executor saved for its forks.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    #[serde(flatten)]
    pub parts: SnapshotParts,
    /// When it was saved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_time: Option<Time>,
    /// How many names of the namespace were saved.
    #[serde(default)]
    pub saved_names: u32,
    /// Names that could not be saved, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 512))]
    pub unsaved: Vec<UnsavedName>,
    /// Why it could not be saved, if it could not: its forks fail with this (`ForkFailed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub failure: Option<String>,
    /// The uids of the forks it was saved for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    pub forks: Vec<String>,
    /// The sandbox of a suspended executor was started for this snapshot, and is stopped again
    /// once its forks have read it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sandbox_started: bool,
}

/// A suspension of an executor, as its status records it.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Suspension {
    /// When the sandbox was stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended_time: Option<Time>,

    /// When the kernel answered again after the sandbox started (unset while suspended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_time: Option<Time>,

    /// Size of the namespace saved inside the sandbox, in bytes.
    #[serde(default)]
    pub saved_bytes: u64,

    /// How many names of the kernel's namespace were saved.
    #[serde(default)]
    pub saved_names: u32,

    /// Names that could not be saved (an open socket, a thread, an object pickle refuses) or
    /// restored, with why: they are not in the kernel after the resume.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 512))]
    pub unsaved: Vec<UnsavedName>,
}

/// A name of the kernel's namespace that was not saved or not restored.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
pub struct UnsavedName {
    /// The Python name.
    #[schemars(length(max = 256))]
    pub name: String,
    /// Why it was not saved or restored.
    #[schemars(length(max = 256))]
    pub why: String,
}

impl BriqExecutor {
    /// A new fork of this executor: its spec, minus what a fork never takes (a pool to claim
    /// from, a suspension), with `forkFrom`; named after it (`<name>-fork-…`) and labelled
    /// with it.
    pub fn fork(&self) -> BriqExecutor {
        let source = self.metadata.name.clone().unwrap_or_default();
        let spec = BriqExecutorSpec {
            pool_ref: None,
            suspend: false,
            fork_from: Some(ForkFrom {
                name: source.clone(),
            }),
            ..self.spec.clone()
        };
        let metadata = ObjectMeta {
            generate_name: Some(format!("{source}-fork-")),
            labels: Some([(super::keys::FORKED_FROM_LABEL.to_owned(), source)].into()),
            ..ObjectMeta::default()
        };
        BriqExecutor {
            metadata,
            spec,
            status: None,
        }
    }

    /// Whether it holds the operator's finalizer: its deletion then waits for its Executions and
    /// destroys its sandbox. Code runs only on an executor that does.
    pub fn holds_finalizer(&self) -> bool {
        self.metadata
            .finalizers
            .as_ref()
            .is_some_and(|finalizers| finalizers.iter().any(|f| f == super::keys::FINALIZER))
    }

    /// The uid of the claimer a pool member was taken by (its `claimed-by` mark, written with
    /// the take); `None` while it is its pool's.
    pub fn claimed_by(&self) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(super::keys::CLAIMED_BY_ANNOTATION)
            .map(String::as_str)
    }

    /// The pool member a claimer records it took: its status (written with the claim's
    /// `Ready`), else its `claimed-member` annotation (written right after, and kept when a
    /// status is lost).
    pub fn claimed_member(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|status| status.claimed_member.as_deref())
            .or_else(|| {
                self.metadata
                    .annotations
                    .as_ref()?
                    .get(super::keys::CLAIMED_MEMBER_ANNOTATION)
                    .map(String::as_str)
            })
    }
}

impl BriqExecutorSpec {
    /// The spec an empty `spec: {}` becomes (every default applied), to tell a field a user left
    /// unset from one they set.
    pub fn default_for_comparison() -> BriqExecutorSpec {
        serde_json::from_value(serde_json::json!({})).expect("an empty spec has defaults")
    }
}

fn default_image() -> String {
    DEFAULT_IMAGE.to_owned()
}
fn default_sleep() -> String {
    DEFAULT_SLEEP.to_owned()
}
fn default_execution_timeout() -> u32 {
    DEFAULT_EXECUTION_TIMEOUT_SECONDS
}
fn default_setup_timeout() -> u32 {
    DEFAULT_SETUP_TIMEOUT_SECONDS
}
fn default_max_queued_executions() -> u32 {
    DEFAULT_MAX_QUEUED_EXECUTIONS
}
fn default_api_key_secret_key() -> String {
    DEFAULT_API_KEY_SECRET_KEY.to_owned()
}

/// Appends the executor reasons, with their meaning, to the conditions' description.
fn list_executor_reasons(schema: &mut schemars::Schema) {
    super::reasons::append_description(
        schema,
        &describe(ExecutorReason::ALL, ExecutorReason::description),
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

    /// Environment variables of this claimer's kernel, delivered when it takes its sandbox
    /// (before it reports Ready, without a cold start) and kept by every kernel that sandbox
    /// starts later (after a cancel, a resume). A value comes from `value` or from a key of a
    /// Secret in this namespace labelled `briq.cloud/claim-env: "true"` (an unlabelled Secret is
    /// treated as missing). Values are never written to the pool, the member or any status,
    /// Event or log. Not allowed are names starting with `BRIQ_` and those the bridge and the
    /// interpreter rely on: `HOME`, `PATH`, `PYTHONPATH`, `PYTHONHOME`, `PYTHONUSERBASE`,
    /// `IPYTHONDIR`, `PIP_PREFIX`, `PIP_USER`, `PIP_TARGET`, `LD_PRELOAD`, `LD_LIBRARY_PATH`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.all(e, self.exists_one(f, f.name == e.name))").message(
        "env names must be unique"
    ))]
    pub env: Vec<ClaimEnvVar>,
}

/// One variable of a claimer's environment: exactly one of `value` and `valueFrom`.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.value) != has(self.valueFrom)").message(
    "set exactly one of value and valueFrom"
))]
#[x_kube(validation = Rule::new(CLAIM_ENV_NAME_ALLOWED).message(
    "names starting with BRIQ_ and HOME, PATH, PYTHONPATH, PYTHONHOME, PYTHONUSERBASE, IPYTHONDIR, \
     PIP_PREFIX, PIP_USER, PIP_TARGET, LD_PRELOAD and LD_LIBRARY_PATH are reserved for the bridge \
     and the interpreter"
))]
pub struct ClaimEnvVar {
    /// Variable name.
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$")
    )]
    pub name: String,
    /// Variable value (it is visible to whoever can read this executor; put secrets in a
    /// Secret and use `valueFrom`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub value: Option<String>,
    /// Where the value comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<ClaimEnvSource>,
}

/// The names a claimer's environment may not set ([`ClaimEnvVar`]); the bridge refuses them
/// too (`bridge/PROTOCOL.md`, "A claimer's environment").
pub const CLAIM_ENV_RESERVED: [&str; 11] = [
    "HOME",
    "PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "IPYTHONDIR",
    "PIP_PREFIX",
    "PIP_USER",
    "PIP_TARGET",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
];

pub(crate) const CLAIM_ENV_NAME_ALLOWED: &str = "!self.name.startsWith('BRIQ_') && !(self.name in ['HOME', \
    'PATH', 'PYTHONPATH', 'PYTHONHOME', 'PYTHONUSERBASE', 'IPYTHONDIR', 'PIP_PREFIX', 'PIP_USER', \
    'PIP_TARGET', 'LD_PRELOAD', 'LD_LIBRARY_PATH'])";

/// The source of a claimer's variable.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimEnvSource {
    /// A key of a Secret in this namespace labelled `briq.cloud/claim-env: "true"`.
    pub secret_key_ref: ClaimSecretKeyRef,
}

/// A key of a Secret in the claimer's namespace.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
pub struct ClaimSecretKeyRef {
    /// Name of the Secret.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
    /// Key within the Secret.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

fn default_cold_create_after() -> u32 {
    30
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_takes_its_sources_spec_but_never_its_pool_or_suspension() {
        let source: BriqExecutor = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "py"},
            "spec": {
                "className": "gold", "image": "python:3.13-slim", "packages": ["numpy"],
                "poolRef": {"name": "warm"}, "suspend": true, "idleTimeoutSeconds": 600
            }
        }))
        .unwrap();
        let fork = source.fork();
        let spec = fork.spec;
        assert_eq!(spec.fork_from, Some(ForkFrom { name: "py".into() }));
        assert_eq!(spec.class_name.as_deref(), Some("gold"));
        assert_eq!(spec.image, "python:3.13-slim");
        assert_eq!(spec.packages, Some(vec!["numpy".to_owned()]));
        assert_eq!(spec.idle_timeout_seconds, Some(600));
        assert_eq!((spec.pool_ref, spec.suspend), (None, false));
        assert_eq!(fork.metadata.generate_name.as_deref(), Some("py-fork-"));
        assert_eq!(
            fork.metadata.labels.unwrap()[super::super::keys::FORKED_FROM_LABEL],
            "py"
        );
    }
}
