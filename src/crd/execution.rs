//! `Execution`: one action, Python code run once in a referenced `BriqExecutor`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{
    MAX_EXECUTION_TIMEOUT_SECONDS,
    reasons::{ExecutionReason, describe},
};

/// Largest accepted `spec.code`, in characters. The code travels as a file upload (briq takes
/// 1 MiB per file) and the object must stay far below etcd's 1.5 MiB request limit.
pub const MAX_CODE_CHARS: usize = 262_144;

/// One action: Python code run once, in order, in the kernel of the referenced `BriqExecutor`.
/// The spec is immutable; to run code again, create a new Execution (for imperative runs use
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
#[x_kube(validation = Rule::new("self == oldSelf").message(
    "Execution spec is immutable: an Execution runs once; create a new Execution to run code again"
))]
#[serde(rename_all = "camelCase")]
pub struct ExecutionSpec {
    /// The `BriqExecutor` (same namespace) whose kernel runs the code.
    pub executor_ref: ExecutorRef,

    /// Python source run in the executor's kernel. State (variables, imports) persists across
    /// Executions of one executor. The value of a final expression is returned as `output`.
    #[schemars(length(min = 1, max = MAX_CODE_CHARS))]
    pub code: String,

    /// Deadline in seconds (1 to 40); defaults to the executor's `executionTimeoutSeconds`.
    /// Running past it interrupts the kernel and makes the executor unusable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_EXECUTION_TIMEOUT_SECONDS))]
    pub timeout_seconds: Option<u32>,
}

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

    /// Identifies the one attempt to run this Execution, recorded before the code is sent. An
    /// attempt found without a result is never re-sent (the Execution becomes `Interrupted`).
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

    /// True when logs and output went over their shared 65,536-character budget and were cut
    /// (head and tail kept).
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
    super::append_description(
        schema,
        &describe(ExecutionReason::ALL, ExecutionReason::description),
    );
}
