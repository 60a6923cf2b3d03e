//! `metav1.Condition` bookkeeping, following the API conventions that kstatus, Flux, Argo CD and
//! `kubectl wait` read.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};

pub const READY: &str = "Ready";
pub const STALLED: &str = "Stalled";
pub const SUCCEEDED: &str = "Succeeded";
/// A BriqExecutor's, present (False) only while briq does not answer its probes.
pub const BRIQ_REACHABLE: &str = "BriqReachable";
/// An executor's suspension (`spec.suspend`): True while its sandbox is stopped; False once
/// resumed, or when its namespace could not be saved.
pub const SUSPENDED: &str = "Suspended";
/// A BriqExecutorClass's: False while briq's MCP server does not match what the operator sends
/// with the class's key.
pub const BRIQ_INTERFACE: &str = "BriqInterface";

/// Condition messages are capped well below the API's 32 KiB: they are read by people.
const MAX_MESSAGE_CHARS: usize = 4_000;

pub fn now() -> Time {
    Time(Timestamp::now())
}

/// The desired state of one condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    pub type_: &'static str,
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

pub fn desired(
    type_: &'static str,
    status: &'static str,
    reason: &'static str,
    message: impl Into<String>,
) -> Desired {
    Desired {
        type_,
        status,
        reason,
        message: clip(message.into()),
    }
}

/// Builds `desired` conditions stamped with `generation`, keeping each one's
/// `lastTransitionTime` from `current` unless its status changed.
pub fn merge(
    current: &[Condition],
    desired: &[Desired],
    generation: Option<i64>,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|want| {
            let previous = current.iter().find(|c| c.type_ == want.type_);
            let last_transition_time = match previous {
                Some(previous) if previous.status == want.status => {
                    previous.last_transition_time.clone()
                }
                _ => now(),
            };
            Condition {
                type_: want.type_.to_owned(),
                status: want.status.to_owned(),
                reason: want.reason.to_owned(),
                message: want.message.clone(),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
}

/// True when `current` already says what `desired` says for `generation`: no write is needed.
pub fn satisfied(current: &[Condition], desired: &[Desired], generation: Option<i64>) -> bool {
    current.len() == desired.len()
        && desired.iter().all(|want| {
            current.iter().any(|c| {
                c.type_ == want.type_
                    && c.status == want.status
                    && c.reason == want.reason
                    && c.message == want.message
                    && c.observed_generation == generation
            })
        })
}

pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Keeps the head and the tail of a long message (pip's last lines are the useful ones).
pub fn clip(message: String) -> String {
    let count = message.chars().count();
    if count <= MAX_MESSAGE_CHARS {
        return message;
    }
    let half = MAX_MESSAGE_CHARS / 2;
    let head: String = message.chars().take(half).collect();
    let tail: String = message.chars().skip(count - half).collect();
    format!("{head}\n… [{} characters cut] …\n{tail}", count - 2 * half)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_is_kept_while_the_status_stays() {
        let first = merge(
            &[],
            &[desired(READY, "False", "Provisioning", "creating")],
            Some(1),
        );
        let same = merge(
            &first,
            &[desired(READY, "False", "SetupFailed", "pip failed")],
            Some(2),
        );
        assert_eq!(same[0].last_transition_time, first[0].last_transition_time);
        assert_eq!(same[0].observed_generation, Some(2));
        assert!(satisfied(
            &same,
            &[desired(READY, "False", "SetupFailed", "pip failed")],
            Some(2)
        ));
        assert!(!satisfied(
            &same,
            &[desired(READY, "False", "SetupFailed", "pip failed")],
            Some(3)
        ));
    }

    #[test]
    fn long_messages_keep_head_and_tail() {
        let message = format!("start{}end", "x".repeat(10_000));
        let clipped = clip(message);
        assert!(clipped.starts_with("start") && clipped.ends_with("end"));
        assert!(clipped.chars().count() < MAX_MESSAGE_CHARS + 100);
    }
}
