//! `Execution`: one action, Python code run once in a referenced `BriqExecutor`.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time},
    jiff::Timestamp,
};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{
    conditions,
    executor::{MAX_EXECUTION_TIMEOUT_SECONDS, MAX_TTL_SECONDS},
    reasons::{ExecutionReason, describe},
};

/// Largest accepted `spec.code`, in characters (the schema can only count characters). The
/// API server stores objects as JSON, where a character can take up to 6 bytes (`<`, `>`, `&`,
/// U+2028, U+2029 and control characters become `\uXXXX`), so the code takes at most 384 KiB
/// as stored (64 KiB when ASCII). With the status ([`MAX_STATUS_BYTES`]) that is 640 KiB,
/// which leaves 384 KiB of the 1 MiB an Execution may take for metadata: far below etcd's
/// 1.5 MiB request limit. As a file upload (briq takes 1 MiB per file) it is at most 256 KiB.
pub const MAX_CODE_CHARS: usize = 65_536;

/// Largest status of an Execution, in bytes as the API server stores it (JSON, with the 6-byte
/// escapes). Logs, output, the error and condition messages are cut to fit, head and tail
/// kept, and `truncated` is set.
pub const MAX_STATUS_BYTES: usize = 262_144;

/// One action: Python code run once, in order, in the kernel of the referenced `BriqExecutor`.
/// The spec is immutable but for `cancel`; to run code again, create a new Execution (for imperative runs use
/// `metadata.generateName` with `kubectl create`). `Succeeded` is Unknown while queued or
/// running and True or False once finished.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "briq.cloud",
    version = "v1alpha1",
    kind = "Execution",
    plural = "executions",
    shortname = "bqx",
    doc = "One action: Python code run once in the kernel of a BriqExecutor.",
    namespaced,
    status = "ExecutionStatus",
    selectable = ".spec.executorRef.name",
    printcolumn = r#"{"name":"Executor","type":"string","jsonPath":".spec.executorRef.name"}"#,
    printcolumn = r#"{"name":"Succeeded","type":"string","jsonPath":".status.conditions[?(@.type==\"Succeeded\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Succeeded\")].reason"}"#,
    printcolumn = r#"{"name":"Output","type":"string","jsonPath":".status.output","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new(IMMUTABLE_BUT_CANCEL).message(
    "Execution spec is immutable but for cancel: an Execution runs once; create a new Execution to run code again"
))]
#[x_kube(validation = Rule::new("!has(oldSelf.cancel) || !oldSelf.cancel || (has(self.cancel) && self.cancel)")
    .message("Execution spec.cancel cannot be withdrawn once set"))]
#[serde(rename_all = "camelCase")]
pub struct ExecutionSpec {
    /// The `BriqExecutor` (same namespace) whose kernel runs the code.
    pub executor_ref: ExecutorRef,

    /// Python source run in the executor's kernel, at most 65,536 characters. State (variables,
    /// imports) persists across Executions of one executor. The value of a final expression is
    /// returned as `output`.
    #[schemars(length(min = 1, max = MAX_CODE_CHARS))]
    pub code: String,

    /// Deadline in seconds (1 to 40); defaults to the executor's `executionTimeoutSeconds`.
    /// Running past it interrupts the kernel and makes the executor unusable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_EXECUTION_TIMEOUT_SECONDS))]
    pub timeout_seconds: Option<u32>,

    /// Seconds after `status.completionTime` at which the finished Execution is deleted, as
    /// Jobs' `ttlSecondsAfterFinished` (0 deletes it as soon as it finishes). Defaults to the
    /// executor's `executionTtlSecondsAfterFinished`; when both are omitted, it is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = MAX_TTL_SECONDS))]
    pub ttl_seconds_after_finished: Option<u32>,

    /// Set to true to cancel the Execution (the one field that may change, and only to true):
    /// one not sent yet never runs; a running one is interrupted in its kernel
    /// (`KeyboardInterrupt`) and keeps its output up to then, and its executor stays usable
    /// with its Python state; code that does not stop within a few seconds of the interrupt
    /// has its kernel restarted (state lost, said so). It then ends `Cancelled`, unless it
    /// finished first. Deleting a running Execution cancels it too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel: bool,
}

/// Every field of the spec but `cancel` keeps its value (an optional field stays set or unset).
const IMMUTABLE_BUT_CANCEL: &str = "self.executorRef == oldSelf.executorRef && self.code == oldSelf.code \
    && has(self.timeoutSeconds) == has(oldSelf.timeoutSeconds) \
    && (!has(self.timeoutSeconds) || self.timeoutSeconds == oldSelf.timeoutSeconds) \
    && has(self.ttlSecondsAfterFinished) == has(oldSelf.ttlSecondsAfterFinished) \
    && (!has(self.ttlSecondsAfterFinished) || self.ttlSecondsAfterFinished == oldSelf.ttlSecondsAfterFinished)";

/// Reference to a `BriqExecutor` in the Execution's namespace.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
pub struct ExecutorRef {
    /// Name of the `BriqExecutor`.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
}

/// Observed state of an `Execution`.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionStatus {
    /// `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Succeeded`: Unknown while waiting or running, True once the code ran, False when it
    /// failed or could not run. Its reasons:
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = list_execution_reasons)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// Identifies the one attempt to run this Execution: derived from its uid, sent with the
    /// code, and recorded with `Running` before or beside the send. The sandbox's journal runs
    /// an attempt once; an attempt found without a result is asked of the journal, never sent
    /// again (`Interrupted` when nobody can tell how it ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<String>,

    /// What the code printed (stdout and stderr, interleaved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<String>,

    /// Jupyter `text/plain` representation of the final expression's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,

    /// True when the code called smolagents' `final_answer`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_final_answer: bool,

    /// The final answer in smolagents' safe serialization (`safe:` followed by JSON). Pickle is
    /// never used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_answer: Option<String>,

    /// The error the code raised, or why it could not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ExecutionError>,

    /// True when something was cut (head and tail kept): logs and output over their shared
    /// 65,536-character budget, or logs, output, error and condition messages over the status's
    /// 262,144-byte budget (as the API server stores it, where `<`, `>`, `&` take 6 bytes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,

    /// Rich display outputs (images, HTML) the code produced; they are not returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_outputs_dropped: Option<u32>,

    /// When the code was sent to the kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the result was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// Time the kernel spent on the code, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_millis: Option<u64>,
}

/// An exception raised by the code, or a failure to run it.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecutionError {
    /// Exception class name (for example `ZeroDivisionError`) or failure kind.
    pub name: String,
    /// Exception message.
    pub message: String,
    /// Traceback text, without terminal colour codes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceback: Option<String>,
}

/// Appends the Execution reasons, with their meaning, to the conditions' description.
fn list_execution_reasons(schema: &mut schemars::Schema) {
    super::reasons::append_description(
        schema,
        &describe(ExecutionReason::ALL, ExecutionReason::description),
    );
}

/// An Execution's place in its executor's queue: creationTimestamp (whole seconds), then name.
/// The operator runs an executor's Executions in this order; clients show queues in it.
pub type RunOrder = (Option<Timestamp>, String);

/// The place in its executor's queue of the Execution with `metadata`.
pub fn run_order(metadata: &ObjectMeta) -> RunOrder {
    (
        metadata.creation_timestamp.as_ref().map(|t| t.0),
        metadata.name.clone().unwrap_or_default(),
    )
}

impl Execution {
    /// Whether it concluded: its `Succeeded` condition is True or False, never to change again.
    pub fn finished(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, conditions::SUCCEEDED))
            .is_some_and(|c| c.status != "Unknown")
    }

    /// Its place in its executor's queue ([`run_order`]).
    pub fn run_order(&self) -> RunOrder {
        run_order(&self.metadata)
    }

    /// Whether it holds its place in its queues: started, or given a place while it waits
    /// ([`ExecutionReason::holds_a_place`]).
    pub fn holds_a_place(&self) -> bool {
        self.status.as_ref().is_some_and(|status| {
            status.attempt_id.is_some()
                || conditions::find(&status.conditions, conditions::SUCCEEDED)
                    .and_then(|c| ExecutionReason::parse(&c.reason))
                    .is_some_and(ExecutionReason::holds_a_place)
        })
    }

    /// Whether its attempt is recorded and it has not concluded: code that may be running.
    pub fn running(&self) -> bool {
        !self.finished() && self.status.as_ref().is_some_and(|s| s.attempt_id.is_some())
    }
}

/// The owner reference that makes an Execution part of its executor's history: garbage
/// collection deletes it with the executor. Clients that know the executor set it when they
/// create the Execution, which spares the operator a write; the operator adds it otherwise.
/// Not the controller reference (users and GitOps tools may have set their own), and it does
/// not block the owner's deletion (which would need permission on its finalizers).
pub fn history_owner(executor: &super::executor::BriqExecutor) -> Option<OwnerReference> {
    use kube::{Resource, ResourceExt};
    Some(OwnerReference {
        api_version: super::executor::BriqExecutor::api_version(&()).into_owned(),
        kind: super::executor::BriqExecutor::kind(&()).into_owned(),
        name: executor.name_any(),
        uid: executor.uid()?,
        controller: None,
        block_owner_deletion: None,
    })
}
