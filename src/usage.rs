//! How much of each class executors and Executions use (in one namespace, or in all), counted
//! from what the caches show: the operator's metrics and `kubectl briq usage` count alike.

use std::{collections::BTreeMap, sync::Arc};

use kube::ResourceExt;

use crate::crd::{
    BriqExecutor, CLASS_ANNOTATION, CREATE_PENDING_ANNOTATION, Execution, SANDBOX_ID_ANNOTATION,
    conditions::{READY, SUCCEEDED},
    reasons::{ExecutionReason, ExecutorReason},
};

/// What executors and Executions use of one class (in one namespace, or in all).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Executors holding or making a sandbox under the class.
    pub executors: usize,
    /// Executors waiting for a place under its `maxExecutors`.
    pub executors_waiting: usize,
    /// Executions running (their attempt recorded, not finished).
    pub running: usize,
    /// Executions waiting for a place under its `maxRunningExecutions`.
    pub executions_waiting: usize,
    /// Executions not started yet (those waiting for a place among them), as its
    /// `maxQueuedExecutions` counts them.
    pub queued: usize,
}

/// The class `executor` counts under: the one its sandbox was made under, else the one it names.
pub fn counted_under(executor: &BriqExecutor) -> Option<&str> {
    executor
        .annotations()
        .get(CLASS_ANNOTATION)
        .or(executor.spec.class_name.as_ref())
        .map(String::as_str)
}

/// The use of each class (by name) that `executors` and `executions` make: how the operator
/// counts it, for its metrics and `kubectl briq usage`.
pub fn usage(
    executors: &[Arc<BriqExecutor>],
    executions: &[Arc<Execution>],
) -> BTreeMap<String, Usage> {
    let mut usage: BTreeMap<String, Usage> = BTreeMap::new();
    let mut class_of_executor = std::collections::HashMap::new();
    for executor in executors {
        let Some(class) = counted_under(executor) else {
            continue;
        };
        let namespace = executor.namespace().unwrap_or_default();
        class_of_executor.insert((namespace, executor.name_any()), class.to_owned());
        let annotations = executor.annotations();
        let entry = usage.entry(class.to_owned()).or_default();
        let holds = (annotations.contains_key(SANDBOX_ID_ANNOTATION)
            || annotations.contains_key(CREATE_PENDING_ANNOTATION))
            && executor.claimed_by().is_none()
            && executor.metadata.deletion_timestamp.is_none();
        entry.executors += usize::from(holds);
        let waiting = executor.status.as_ref().is_some_and(|status| {
            condition_reason(&status.conditions, READY)
                == Some(ExecutorReason::WaitingForCapacity.as_str())
        });
        entry.executors_waiting += usize::from(waiting);
    }
    for execution in executions {
        let key = (
            execution.namespace().unwrap_or_default(),
            execution.spec.executor_ref.name.clone(),
        );
        let Some(class) = class_of_executor.get(&key) else {
            continue;
        };
        let Some(status) = &execution.status else {
            continue;
        };
        let Some(succeeded) = status.conditions.iter().find(|c| c.type_ == SUCCEEDED) else {
            continue;
        };
        if succeeded.status != "Unknown" {
            continue;
        }
        let entry = usage.entry(class.clone()).or_default();
        if status.attempt_id.is_some() {
            entry.running += 1;
            continue;
        }
        entry.queued += 1;
        if succeeded.reason == ExecutionReason::WaitingForCapacity.as_str() {
            entry.executions_waiting += 1;
        }
    }
    usage
}

fn condition_reason<'c>(
    conditions: &'c [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<&'c str> {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.reason.as_str())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::crd::CLAIMED_BY_ANNOTATION;

    #[test]
    fn the_use_of_each_class_as_the_operator_counts_it() {
        let executor =
            |name: &str, annotations: Value, spec: Value, ready: &str| -> Arc<BriqExecutor> {
                Arc::new(
                serde_json::from_value(json!({
                    "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
                    "metadata": { "name": name, "namespace": "team", "annotations": annotations },
                    "spec": spec,
                    "status": { "conditions": [{
                        "type": "Ready", "status": "False", "reason": ready, "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }]},
                }))
                .unwrap(),
            )
            };
        let execution =
            |name: &str, on: &str, reason: &str, attempt: Option<&str>| -> Arc<Execution> {
                Arc::new(
                    serde_json::from_value(json!({
                        "apiVersion": "briq.cloud/v1alpha1", "kind": "Execution",
                        "metadata": { "name": name, "namespace": "team" },
                        "spec": { "executorRef": { "name": on }, "code": "1" },
                        "status": {
                            "attemptId": attempt,
                            "conditions": [{
                                "type": "Succeeded",
                                "status": if reason == "Completed" { "True" } else { "Unknown" },
                                "reason": reason, "message": "",
                                "lastTransitionTime": "2026-01-01T00:00:00Z",
                            }],
                        },
                    }))
                    .unwrap(),
                )
            };
        let executors = vec![
            executor(
                "a",
                json!({ CLASS_ANNOTATION: "std", SANDBOX_ID_ANNOTATION: "bq_1" }),
                json!({}),
                "KernelReady",
            ),
            executor(
                "b",
                json!({}),
                json!({ "className": "std" }),
                "WaitingForCapacity",
            ),
            // A handed-over member: its sandbox is counted with its claimer.
            executor(
                "m",
                json!({ CLASS_ANNOTATION: "std", SANDBOX_ID_ANNOTATION: "bq_2", CLAIMED_BY_ANNOTATION: "uid-c" }),
                json!({}),
                "Claimed",
            ),
            executor(
                "c",
                json!({ CLASS_ANNOTATION: "std", SANDBOX_ID_ANNOTATION: "bq_2" }),
                json!({}),
                "KernelReady",
            ),
            executor(
                "own",
                json!({ SANDBOX_ID_ANNOTATION: "bq_3" }),
                json!({}),
                "KernelReady",
            ),
        ];
        let executions = vec![
            execution("run", "a", "Running", Some("x1")),
            execution("briq", "c", "WaitingForBriq", Some("x2")),
            execution("wait", "c", "WaitingForCapacity", None),
            execution("queued", "a", "Queued", None),
            execution("done", "a", "Completed", Some("x0")),
            execution("elsewhere", "own", "Running", Some("x3")),
        ];
        let got = usage(&executors, &executions);
        assert_eq!(
            got,
            BTreeMap::from([(
                "std".to_owned(),
                Usage {
                    executors: 2,
                    executors_waiting: 1,
                    running: 2,
                    executions_waiting: 1,
                    queued: 2
                },
            )])
        );
    }
}
