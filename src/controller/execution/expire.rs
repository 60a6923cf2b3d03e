//! A finished Execution's time to live (its own `ttlSecondsAfterFinished`, else its executor's
//! default): it is deleted once that is over.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Preconditions},
    runtime::controller::Action,
};
use tracing::info;

use super::context::Context;
use crate::{controller::context::Result, crd::Execution};

/// What becomes of a finished Execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Kept: no time to live, or no completion time recorded yet.
    Keep,
    DeleteNow,
    /// Deleted after this long.
    DeleteAfter(Duration),
}

/// When a finished Execution is deleted: `ttl` seconds (its own, else its executor's) after
/// it `completed`.
pub fn expiry(completed: Option<Timestamp>, ttl: Option<u32>, now: Timestamp) -> Expiry {
    let (Some(completed), Some(ttl)) = (completed, ttl) else {
        return Expiry::Keep;
    };
    let Ok(at) = completed.checked_add(SignedDuration::from_secs(ttl.into())) else {
        return Expiry::Keep;
    };
    let left = now.duration_until(at);
    if left.is_positive() {
        Expiry::DeleteAfter(left.unsigned_abs())
    } else {
        Expiry::DeleteNow
    }
}

/// Deletes a finished Execution once its time to live is over, or asks to be back then.
pub(super) async fn expire<S>(execution: &Execution, ctx: &Context<S>) -> Result<Action> {
    let namespace = execution.namespace().unwrap_or_default();
    let ttl = execution.spec.ttl_seconds_after_finished.or_else(|| {
        ctx.cached_executor(&namespace, &execution.spec.executor_ref.name)
            .and_then(|executor| executor.spec.execution_ttl_seconds_after_finished)
    });
    let completed = execution
        .status
        .as_ref()
        .and_then(|s| s.completion_time.as_ref())
        .map(|t| t.0);
    match expiry(completed, ttl, Timestamp::now()) {
        Expiry::Keep => Ok(Action::await_change()),
        Expiry::DeleteAfter(left) => Ok(Action::requeue(left)),
        Expiry::DeleteNow => {
            let api: Api<Execution> = Api::namespaced(ctx.shared.client.clone(), &namespace);
            let uid = execution.uid().unwrap_or_default();
            let params = DeleteParams::default().preconditions(Preconditions {
                uid: Some(uid),
                resource_version: None,
            });
            match api.delete(&execution.name_any(), &params).await {
                Ok(_) => info!("deleted a finished Execution whose time to live is over"),
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error.into()),
            }
            Ok(Action::await_change())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::execution::fixtures::at;

    #[test]
    fn expiry_table() {
        let done = Some(at("10"));
        let table = [
            ("no time to live", done, None, "10", Expiry::Keep),
            (
                "not recorded as completed yet",
                None,
                Some(5),
                "30",
                Expiry::Keep,
            ),
            (
                "before its time",
                done,
                Some(5),
                "12",
                Expiry::DeleteAfter(Duration::from_secs(3)),
            ),
            ("at its time", done, Some(5), "15", Expiry::DeleteNow),
            ("past its time", done, Some(5), "50", Expiry::DeleteNow),
            ("zero: at once", done, Some(0), "10", Expiry::DeleteNow),
            (
                "the longest",
                done,
                Some(i32::MAX as u32),
                "10",
                Expiry::DeleteAfter(Duration::from_secs(i32::MAX as u64)),
            ),
        ];
        for (name, completed, ttl, now, expected) in table {
            assert_eq!(expiry(completed, ttl, at(now)), expected, "{name}");
        }
    }
}
