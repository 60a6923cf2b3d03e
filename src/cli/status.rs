//! What the commands read from an object's status: its conditions, an Execution's phase, and
//! Executions kept without their results.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::crd::{
    Execution,
    reasons::{ExecutionReason, Phase},
};

pub(super) fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|condition| condition.type_ == type_)
}

/// The Execution's `Succeeded` condition, once the operator has set it.
pub(super) fn succeeded(execution: &Execution) -> Option<&Condition> {
    condition(&execution.status.as_ref()?.conditions, "Succeeded")
}

/// An Execution without what its code produced (logs, output, answer, error) and without its
/// code: what is kept of the Executions listed or watched only for their place and phase.
pub(super) fn without_results(mut execution: Execution) -> Execution {
    execution.spec.code.clear();
    if let Some(status) = execution.status.as_mut() {
        status.logs = None;
        status.output = None;
        status.final_answer = None;
        status.error = None;
    }
    execution
}

/// Where an Execution stands, from its `Succeeded` condition: waiting until the operator has
/// reported on it, and while its reason is not one this CLI knows (a newer operator's).
pub(super) fn phase(execution: &Execution) -> Phase {
    match succeeded(execution) {
        Some(c) if c.status == "True" => Phase::Succeeded,
        Some(c) if c.status == "False" => Phase::Failed,
        Some(c) => ExecutionReason::parse(&c.reason).map_or(Phase::Waiting, |r| r.phase()),
        None => Phase::Waiting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn execution(status: Option<(&str, &str)>) -> Execution {
        let conditions = status.map_or(serde_json::json!([]), |(status, reason)| {
            serde_json::json!([{
                "type": "Succeeded", "status": status, "reason": reason, "message": "",
                "lastTransitionTime": "2025-01-01T00:00:00Z"
            }])
        });
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "py-1" },
            "spec": { "executorRef": { "name": "py" }, "code": "1" },
            "status": { "conditions": conditions },
        }))
        .unwrap()
    }

    #[test]
    fn the_phase_follows_succeeded_and_an_unknown_reason_waits() {
        let cases = [
            (None, Phase::Waiting),
            (Some(("Unknown", "Queued")), Phase::Waiting),
            (Some(("Unknown", "ExecutorNotReady")), Phase::Waiting),
            (Some(("Unknown", "Running")), Phase::Running),
            (Some(("Unknown", "SomethingNewer")), Phase::Waiting),
            (Some(("True", "Completed")), Phase::Succeeded),
            (Some(("False", "Timeout")), Phase::Failed),
            (Some(("False", "Running")), Phase::Failed),
        ];
        for (status, expected) in cases {
            assert_eq!(phase(&execution(status)), expected, "{status:?}");
        }
    }
}
