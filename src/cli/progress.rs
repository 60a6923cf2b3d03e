//! `exec`'s progress on stderr while its Execution waits in its executor's queue and runs
//! (`queued (2 ahead)`, `running`), from one watch on that executor's Executions.

use std::{collections::HashMap, pin::pin};

use futures::TryStreamExt as _;
use kube::{
    Api, ResourceExt,
    runtime::{
        wait,
        watcher::{self, Event, watcher},
    },
};

use super::{
    error::Error,
    logs,
    output::printable,
    status::{phase, succeeded, without_results},
};
use crate::crd::{Execution, reasons::Phase, run_order};

/// Where an Execution stands, as its progress line tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// The operator has not reported on it yet: nothing to tell.
    Unseen,
    /// Behind `ahead` unfinished Executions of the same executor (the running one included).
    Queued {
        ahead: usize,
    },
    /// Waiting for another reason (its executor is not ready): the condition's reason.
    Waiting {
        reason: String,
    },
    Running,
    Finished,
}

/// The stage of `mine` among `siblings`, the other Executions of its executor (it may be among
/// them). Ahead of it are, of those not being deleted, the running one (it may have started
/// while `mine` was being created in the same second, yet sort after it) and the waiting ones
/// that come first in run order.
pub fn stage<'a>(mine: &Execution, siblings: impl IntoIterator<Item = &'a Execution>) -> Stage {
    let Some(condition) = succeeded(mine) else {
        return Stage::Unseen;
    };
    match phase(mine) {
        Phase::Succeeded | Phase::Failed => Stage::Finished,
        Phase::Running => Stage::Running,
        Phase::Waiting if condition.reason == "Queued" => {
            let order = run_order(&mine.metadata);
            let ahead = siblings
                .into_iter()
                .filter(|e| e.metadata.deletion_timestamp.is_none())
                .filter(|e| match phase(e) {
                    Phase::Running => true,
                    Phase::Waiting => run_order(&e.metadata) < order,
                    Phase::Succeeded | Phase::Failed => false,
                })
                .count();
            Stage::Queued { ahead }
        }
        Phase::Waiting => Stage::Waiting {
            reason: condition.reason.clone(),
        },
    }
}

/// The progress line of a stage; none when there is nothing to tell.
pub fn line(stage: &Stage) -> Option<String> {
    match stage {
        Stage::Unseen | Stage::Finished => None,
        Stage::Queued { ahead: 0 } => Some("queued (next)".into()),
        Stage::Queued { ahead } => Some(format!("queued ({ahead} ahead)")),
        Stage::Waiting { reason } => Some(format!("waiting ({})", printable(reason))),
        Stage::Running => Some("running".into()),
    }
}

/// Waits, on a watch of `executor`'s Executions (selected by the API server), until the
/// Execution `name` has finished, as [`logs::await_finished`] does, and prints a progress line
/// on stderr each time its stage changes. Of the other Executions only their place and phase
/// are kept.
pub async fn follow(
    executions: &Api<Execution>,
    executor: &str,
    name: &str,
    namespace: &str,
) -> Result<Execution, Error> {
    let selector = format!("spec.executorRef.name={executor}");
    let config = watcher::Config::default().fields(&selector);
    let mut events = pin!(watcher(executions.clone(), config));
    let mut siblings: HashMap<String, Execution> = HashMap::new();
    let mut relisted: Option<HashMap<String, Execution>> = None;
    let mut mine: Option<Execution> = None;
    let mut shown: Option<String> = None;
    let probe_failed = |error| Error::Watch(wait::Error::ProbeFailed(error));
    while let Some(event) = events.try_next().await.map_err(probe_failed)? {
        let mut keep = |execution: Execution, into: &mut HashMap<String, Execution>| {
            let key = execution.name_any();
            if key == name {
                mine = Some(execution.clone());
            }
            into.insert(key, without_results(execution));
        };
        match event {
            Event::Init => relisted = Some(HashMap::new()),
            Event::InitApply(execution) => keep(execution, relisted.get_or_insert_default()),
            Event::InitDone => {
                siblings = relisted.take().unwrap_or_default();
                if !siblings.contains_key(name) {
                    mine = None;
                }
            }
            Event::Apply(execution) => keep(execution, &mut siblings),
            Event::Delete(execution) => {
                let key = execution.name_any();
                if key == name {
                    mine = None;
                }
                siblings.remove(&key);
            }
        }
        if relisted.is_some() {
            continue;
        }
        let current = match &mine {
            Some(current) if !logs::ended(current) => current,
            _ => return logs::once_ended(mine, name, namespace),
        };
        let line = line(&stage(current, siblings.values()));
        if line.is_some() && line != shown {
            eprintln!("{}", line.as_deref().unwrap_or_default());
            shown = line;
        }
    }
    logs::once_ended(None, name, namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn execution(name: &str, created: &str, condition: Option<(&str, &str)>) -> Execution {
        let conditions = condition.map_or(serde_json::json!([]), |(status, reason)| {
            serde_json::json!([{
                "type": "Succeeded", "status": status, "reason": reason, "message": "",
                "lastTransitionTime": created
            }])
        });
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "uid": name, "creationTimestamp": created },
            "spec": { "executorRef": { "name": "py" }, "code": "1" },
            "status": { "conditions": conditions },
        }))
        .unwrap()
    }

    const T0: &str = "2025-01-01T00:00:00Z";
    const T1: &str = "2025-01-01T00:00:01Z";
    const T2: &str = "2025-01-01T00:00:02Z";

    #[test]
    fn the_stage_counts_unfinished_executions_ahead_in_run_order() {
        let queued = Some(("Unknown", "Queued"));
        let mine = execution("py-m", T1, queued);
        let mut deleting = execution("py-del", T0, queued);
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(T0.parse().unwrap()),
        );
        let siblings = [
            execution("py-run", T0, Some(("Unknown", "Running"))),
            execution("py-zz-run", T1, Some(("Unknown", "Running"))),
            execution("py-done", T0, Some(("True", "Completed"))),
            execution("py-failed", T0, Some(("False", "CodeError"))),
            execution("py-a", T1, queued),
            execution("py-z", T1, queued),
            execution("py-later", T2, queued),
            execution("py-unseen", T0, None),
            deleting,
            mine.clone(),
        ];
        // Ahead: the running ones (py-zz-run sorts after it, but runs), the one not reported
        // on yet, and py-a (same second, sorts first by name).
        assert_eq!(stage(&mine, &siblings), Stage::Queued { ahead: 4 });
        assert_eq!(stage(&mine, []), Stage::Queued { ahead: 0 });

        let cases = [
            (None, Stage::Unseen),
            (Some(("Unknown", "Running")), Stage::Running),
            (Some(("True", "FinalAnswer")), Stage::Finished),
            (Some(("False", "QueueFull")), Stage::Finished),
            (
                Some(("Unknown", "ExecutorNotReady")),
                Stage::Waiting {
                    reason: "ExecutorNotReady".into(),
                },
            ),
        ];
        for (condition, expected) in cases {
            let execution = execution("py-m", T1, condition);
            assert_eq!(stage(&execution, &siblings), expected, "{condition:?}");
        }
    }

    #[test]
    fn progress_lines_say_the_place_in_the_queue_and_nothing_once_finished() {
        let cases = [
            (Stage::Unseen, None),
            (Stage::Queued { ahead: 0 }, Some("queued (next)")),
            (Stage::Queued { ahead: 2 }, Some("queued (2 ahead)")),
            (Stage::Running, Some("running")),
            (Stage::Finished, None),
            (
                Stage::Waiting {
                    reason: "ExecutorNotReady\u{1b}[2J".into(),
                },
                Some("waiting (ExecutorNotReady\\u{1b}[2J)"),
            ),
        ];
        for (stage, expected) in cases {
            assert_eq!(line(&stage).as_deref(), expected, "{stage:?}");
        }
    }
}
