//! What the execution controller observed of an unfinished Execution, from its caches: the input
//! of [`super::step::decide`] and of the refusals ([`super::admit`]). Pure types.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::{controller::recheck::ATTEMPT_GRACE, crd::BriqExecutor};

/// What the execution controller observed of an unfinished Execution, from its caches.
pub struct Observed<'a> {
    pub executor_name: &'a str,
    pub namespace: &'a str,
    /// Whether this process holds an unwritten result for it.
    pub unwritten_result: bool,
    /// Whether it is cancelled (`spec.cancel`).
    pub cancel: bool,
    /// The attempt recorded in the status, if any.
    pub attempt: Option<Attempt>,
    pub now: Timestamp,
    /// Whether the Execution has an owner reference to an executor of its executor's name: it
    /// was adopted once, so its executor existed.
    pub adopted: bool,
    pub executor: Option<&'a BriqExecutor>,
    /// When the Execution was created, and how long it may wait for an executor that does not
    /// exist (`Settings::executor_wait`).
    pub created: Option<Timestamp>,
    pub executor_wait: SignedDuration,
    /// This process made the executor unusable; its cache may not show it yet.
    pub executor_known_unusable: bool,
    pub heads_queue: bool,
    /// Whether it already holds its place in its queues
    /// ([`ExecutionReason::holds_a_place`](crate::crd::reasons::ExecutionReason::holds_a_place)):
    /// the queue limits judge only an Execution that does not.
    pub placed: bool,
    /// How many unfinished Executions of the executor hold a place before it: those before it
    /// in the cached queue and those already placed (the running one among them). An
    /// Execution created later in the same second may sort before one already queued; it
    /// still comes after it for the queue's limit.
    pub ahead: usize,
    /// Its namespace's queue under its executor's class, when the class limits it.
    pub namespace_queue: Option<NamespaceQueue>,
}

/// The Executions waiting in a namespace under a class with `perNamespace.maxQueuedExecutions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceQueue {
    pub class: String,
    pub max: u32,
    /// Executions not started yet, of the namespace's executors of the class, that hold a place
    /// before this one: before it in run order, or placed already.
    pub waiting_before: usize,
}

/// An attempt recorded in an Execution's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    pub started: Option<Timestamp>,
    /// The run's deadline in seconds ([`timeout_seconds`](super::run::timeout_seconds)).
    pub timeout_seconds: u32,
}

impl Attempt {
    /// How long its runner may still report a result; `None` once nobody can.
    pub fn may_report_for(&self, now: Timestamp) -> Option<Duration> {
        let timeout = SignedDuration::from_secs(self.timeout_seconds.into());
        let until = self
            .started?
            .checked_add(timeout)
            .ok()?
            .checked_add(ATTEMPT_GRACE)
            .ok()?;
        let left = now.duration_until(until);
        left.is_positive().then(|| left.unsigned_abs())
    }
}
