//! The one vocabulary of condition reasons. The controllers write these, the metrics label by
//! them, the CRD descriptions list them, and the Python client reads them from a file generated
//! from this module (`bridge/agent/briq_operator_client/vocabulary.py`, drift-tested like `crds/`).

use std::fmt;

/// Declares a reason enum: each variant's string is its name, and its doc is the description
/// the CRD and the generated Python file carry.
macro_rules! reasons {
    ($(#[$meta:meta])* $name:ident { $($(#[doc = $doc:literal])+ $variant:ident,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[doc = $doc])+ $variant,)+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => stringify!($variant),)+
                }
            }

            /// The reason's documentation, as one line.
            pub fn description(self) -> String {
                let lines: &[&str] = match self {
                    $($name::$variant => &[$($doc),+],)+
                };
                lines.iter().map(|line| line.trim()).collect::<Vec<_>>().join(" ")
            }

            pub fn parse(text: &str) -> Option<$name> {
                $name::ALL.iter().copied().find(|reason| reason.as_str() == text)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

reasons! {
    /// Reasons of an Execution's `Succeeded` condition.
    ExecutionReason {
        /// Waiting for earlier Executions of the same executor.
        Queued,
        /// The referenced BriqExecutor does not exist (yet).
        ExecutorNotFound,
        /// The BriqExecutor is not Ready yet (provisioning, or no API key).
        ExecutorNotReady,
        /// The code was sent to the kernel; the result is not recorded yet.
        Running,
        /// briq failed to answer (a 5xx, a timeout, a lost connection, an outage) after the
        /// code was sent: whether it ran is asked of the sandbox's attempt journal once briq
        /// answers again, within the operator's outage patience (`--outage-patience-seconds`,
        /// 10 minutes by default) beyond the run's own deadline. The code is never sent twice.
        WaitingForBriq,
        /// The code ran.
        Completed,
        /// The code ran and returned a final answer.
        FinalAnswer,
        /// The code raised an exception.
        CodeError,
        /// The final answer was refused (not serializable, too large, an array or image).
        FinalAnswerRejected,
        /// The code ran past its deadline; the kernel was interrupted and the executor is
        /// unusable.
        Timeout,
        /// A call to briq failed for good. Either briq refused the request before acting
        /// (HTTP 400, 401, 403, 409, 422), so the code did not run and the executor stays
        /// usable; or briq did not answer whether the code ran within the outage patience
        /// (`WaitingForBriq`), so the outcome stayed unknown and the executor is unusable.
        TransportError,
        /// The bridge answered with output that breaks the protocol; the executor is unusable.
        MalformedResponse,
        /// The kernel is gone (the sandbox slept, restarted or vanished); the executor is
        /// unusable.
        KernelLost,
        /// The executor can run no more code (unusable, or it can never become ready).
        ExecutorUnusable,
        /// The executor was deleted.
        ExecutorDeleted,
        /// The referenced BriqExecutor did not appear within the operator's wait
        /// (`--executor-wait-seconds`, 10 minutes by default) after the Execution was created;
        /// the code did not run.
        ExecutorNeverAppeared,
        /// The executor names a sandbox that belongs to another object: the code was not sent.
        SandboxNotOwned,
        /// The operator lost track of the code while it ran and the sandbox kept no result for
        /// it (or its executor could not be asked); it may have run and is never run again.
        Interrupted,
        /// The executor already had `maxQueuedExecutions` Executions waiting: this one was
        /// refused without running. Create it again once the queue drains.
        QueueFull,
        /// Its namespace already runs as many Executions of its executor's class as the class
        /// allows at once (`perNamespace.maxRunningExecutions`): it runs as soon as one of them
        /// ends.
        WaitingForCapacity,
        /// Cancelled (`spec.cancel`, or the Execution deleted while it ran): never run when
        /// cancelled before it was sent; otherwise interrupted in its kernel (`KeyboardInterrupt`),
        /// its output up to then kept, the executor usable with its Python state. Code that
        /// does not stop within the grace period has its kernel restarted: the executor stays
        /// usable, its Python state is gone (the error says which).
        Cancelled,
    }
}

/// Where an Execution stands when its `Succeeded` condition has a given reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Succeeded=Unknown, nothing sent yet.
    Waiting,
    /// Succeeded=Unknown, the code may be running.
    Running,
    /// Succeeded=True.
    Succeeded,
    /// Succeeded=False.
    Failed,
}

impl ExecutionReason {
    pub const fn phase(self) -> Phase {
        use ExecutionReason::*;
        match self {
            Queued | ExecutorNotFound | ExecutorNotReady | WaitingForCapacity => Phase::Waiting,
            Running | WaitingForBriq => Phase::Running,
            Completed | FinalAnswer => Phase::Succeeded,
            CodeError
            | FinalAnswerRejected
            | Timeout
            | TransportError
            | MalformedResponse
            | KernelLost
            | ExecutorUnusable
            | ExecutorDeleted
            | ExecutorNeverAppeared
            | SandboxNotOwned
            | Interrupted
            | QueueFull
            | Cancelled => Phase::Failed,
        }
    }

    /// Whether an Execution waiting with this reason already has its place in its queues: the
    /// operator gives it (or refuses it, `QueueFull`) once the executor is known, and a place
    /// once given is kept, whatever arrives later.
    pub const fn holds_a_place(self) -> bool {
        use ExecutionReason::*;
        matches!(self, Queued | ExecutorNotReady | WaitingForCapacity)
    }

    /// The reasons an Execution can end with: the `reason` label of the finished-Executions
    /// metric takes exactly these values.
    pub fn terminal() -> impl Iterator<Item = ExecutionReason> {
        ExecutionReason::ALL
            .iter()
            .copied()
            .filter(|reason| matches!(reason.phase(), Phase::Succeeded | Phase::Failed))
    }

    /// Whether a client should take this outcome to mean that the executor can run no more
    /// code. `TransportError` counts, conservatively: it also covers requests briq refused,
    /// after which the executor may still be usable, but a client cannot tell the two apart.
    pub const fn ends_the_executor(self) -> bool {
        use ExecutionReason::*;
        matches!(
            self,
            Timeout
                | TransportError
                | MalformedResponse
                | KernelLost
                | ExecutorUnusable
                | ExecutorDeleted
                | Interrupted
        )
    }
}

reasons! {
    /// Reasons of a BriqExecutor's `Ready` and `Stalled` conditions.
    ExecutorReason {
        /// Creating the sandbox, installing the bridge or starting the kernel.
        Provisioning,
        /// No usable briq API key (missing Secret or key, or no operator default).
        ApiKeyMissing,
        /// A Secret or key named by `poolRef.env` is missing, or the Secret is not labelled
        /// `briq.cloud/claim-env: "true"`, or its value cannot be an environment variable: the
        /// claimer takes no sandbox until it can have its whole environment.
        EnvUnavailable,
        /// The executor names a `BriqExecutorClass` that does not exist (yet); it waits for it
        /// and creates nothing.
        ClassNotFound,
        /// The executor's spec breaks a limit of its `BriqExecutorClass`, or its namespace may
        /// not use the class (the message names which); nothing is created. Looked at again
        /// when the class changes.
        ClassRefused,
        /// Its namespace already has as many executors of its class holding a sandbox as the
        /// class allows (`perNamespace.maxExecutors`): it makes its sandbox when one of them
        /// goes, oldest waiting first.
        WaitingForCapacity,
        /// briq refused to create the sandbox.
        BriqRefused,
        /// briq's MCP server does not declare a tool or an argument the operator sends, or
        /// requires one it never sends (the message names each): no call is made with the key
        /// until its `tools/list` matches, checked again every minute.
        BriqInterfaceMismatch,
        /// The kernel answers: Executions run.
        KernelReady,
        /// Setup failed (pip, bridge or kernel); the sandbox was destroyed.
        SetupFailed,
        /// The executor will never run code again (timeout, lost kernel, uncertain outcome).
        Unusable,
        /// The executor names a sandbox (annotation or status) that belongs to another object;
        /// it is never used or destroyed, and the executor goes back to its own.
        SandboxNotOwned,
        /// The executor is being deleted and its sandbox destroyed.
        Terminating,
        /// Destroying the sandbox failed; it is retried.
        DestroyFailed,
        /// Expired: no Execution for `idleTimeoutSeconds`; the sandbox was destroyed and the
        /// executor never runs code again (final).
        IdleTimeout,
        /// Waiting for a Ready member of the pool named by `poolRef` (a cold create follows
        /// after `coldCreateAfterSeconds`).
        WaitingForPool,
        /// The claimer's spec differs from its pool's template in a field that shapes the
        /// sandbox; nothing is claimed or created (final).
        PoolMismatch,
        /// A pool member handed over to a claimer: it runs no code of its own, and its sandbox
        /// is the claimer's until the claimer is deleted.
        Claimed,
        /// On the `BriqReachable` condition, False: briq did not answer the executor's last
        /// probe (an outage, 5xx answers, timeouts). The kernel and its Python state are presumed
        /// intact and `Ready` is kept; Executions sent meanwhile wait for briq
        /// (`WaitingForBriq`). The condition goes once briq answers again.
        BriqUnreachable,
        /// `spec.suspend`: saving the kernel's namespace inside the sandbox and stopping the
        /// sandbox; Executions wait.
        Suspending,
        /// The sandbox is stopped with the kernel's namespace saved in it (`status.suspension`
        /// names what was not saved). An Execution, or `spec.suspend: false`, resumes it.
        Suspended,
        /// Starting the suspended sandbox, a new kernel, and restoring the namespace;
        /// Executions wait.
        Resuming,
        /// On the `Suspended` condition, False: the namespace could not be saved (the message
        /// says why), so the sandbox was not stopped and the kernel keeps running with its
        /// state. Tried again when the spec changes.
        SuspendFailed,
        /// On the `Suspended` condition, False: the executor was resumed (`status.suspension`
        /// says what came back).
        Resumed,
        /// Saving the kernel's namespace and working files for forks (`spec.forkFrom` of other
        /// executors); Executions wait until it is saved.
        Forking,
        /// A fork waits for its source to save a snapshot for it (the source finishes its
        /// running Execution first).
        WaitingForSnapshot,
        /// The fork's source (`spec.forkFrom`) does not exist in this namespace: the fork waits
        /// for it and creates nothing.
        ForkSourceNotFound,
        /// The fork's source cannot be forked into it: a pool member, another class or key, an
        /// executor that is unusable, stalled or being deleted, or the fork itself (the message
        /// says which); nothing is created (final).
        ForkRefused,
        /// The source's snapshot could not be saved or read into the fork (the message says
        /// why); the fork's sandbox was destroyed (final).
        ForkFailed,
    }
}

reasons! {
    /// Reasons of a BriqExecutorClass's `BriqInterface` condition.
    ClassReason {
        /// briq's MCP server declares every tool and argument the operator sends with the
        /// class's key.
        InterfaceMatches,
        /// briq's MCP server does not declare a tool or argument the operator sends with the
        /// class's key, or requires one it never sends (the message names each): its executors
        /// make no sandbox until it matches.
        BriqInterfaceMismatch,
    }
}

reasons! {
    /// Reasons of a BriqExecutorPool's `Ready` condition.
    PoolReason {
        /// `readyReplicas` reached `spec.replicas`.
        MembersReady,
        /// Members are being created, provisioned or replaced.
        Filling,
        /// The template names a `BriqExecutorClass` that does not exist (yet): no member is made
        /// or removed until it does.
        ClassNotFound,
    }
}

/// The reasons of `reasons`, one per line, for a CRD description.
pub fn describe<R: Copy + fmt::Display>(reasons: &[R], doc: impl Fn(R) -> String) -> String {
    reasons
        .iter()
        .map(|reason| format!("- `{reason}`: {}", doc(*reason)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Adds `text` as a paragraph of `schema`'s description (kept apart from the paragraph joining
/// below by a blank line, and listed one reason per line).
pub(super) fn append_description(schema: &mut schemars::Schema, text: &str) {
    let current = schema
        .get("description")
        .and_then(|d| d.as_str())
        .unwrap_or_default()
        .to_owned();
    schema.insert(
        "description".into(),
        format!("{current}\n\n{text}").trim().into(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_parses_back_from_its_string() {
        for reason in ExecutionReason::ALL {
            assert_eq!(ExecutionReason::parse(reason.as_str()), Some(*reason));
        }
        for reason in ExecutorReason::ALL {
            assert_eq!(ExecutorReason::parse(reason.as_str()), Some(*reason));
        }
        assert_eq!(ExecutionReason::parse("connection refused"), None);
    }

    #[test]
    fn phases_of_the_execution_reasons() {
        use ExecutionReason::*;
        let table = [
            (Queued, Phase::Waiting),
            (ExecutorNotFound, Phase::Waiting),
            (ExecutorNotReady, Phase::Waiting),
            (WaitingForCapacity, Phase::Waiting),
            (Running, Phase::Running),
            (WaitingForBriq, Phase::Running),
            (Completed, Phase::Succeeded),
            (FinalAnswer, Phase::Succeeded),
            (CodeError, Phase::Failed),
            (FinalAnswerRejected, Phase::Failed),
            (Timeout, Phase::Failed),
            (TransportError, Phase::Failed),
            (MalformedResponse, Phase::Failed),
            (KernelLost, Phase::Failed),
            (ExecutorUnusable, Phase::Failed),
            (ExecutorDeleted, Phase::Failed),
            (ExecutorNeverAppeared, Phase::Failed),
            (SandboxNotOwned, Phase::Failed),
            (Interrupted, Phase::Failed),
            (QueueFull, Phase::Failed),
            (Cancelled, Phase::Failed),
        ];
        assert_eq!(table.len(), ExecutionReason::ALL.len());
        for (reason, phase) in table {
            assert_eq!(reason.phase(), phase, "{reason}");
        }
    }

    #[test]
    fn an_outcome_that_can_only_follow_a_healthy_run_never_ends_the_executor() {
        use ExecutionReason::*;
        for reason in [Completed, FinalAnswer, CodeError, FinalAnswerRejected] {
            assert!(!reason.ends_the_executor(), "{reason}");
        }
        for reason in ExecutionReason::ALL {
            if reason.phase() != Phase::Failed {
                assert!(!reason.ends_the_executor(), "{reason}");
            }
        }
    }

    #[test]
    fn descriptions_are_single_lines() {
        for reason in ExecutionReason::ALL {
            let text = reason.description();
            assert!(
                !text.is_empty() && !text.contains('\n'),
                "{reason}: {text:?}"
            );
        }
        assert_eq!(
            ExecutorReason::Terminating.description(),
            "The executor is being deleted and its sandbox destroyed."
        );
    }
}
