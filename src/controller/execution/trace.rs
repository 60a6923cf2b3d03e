//! An Execution's trace: what its run noted, as the spans [`crate::traces::emit`] exports.
//!
//! The root span lasts from the Execution's creation to its result's write; below it, the
//! wait in the queue, the fresh read of the queue that confirmed its turn (when the cache could
//! not decide it), the check of the sandbox (its key, and briq's word on it until briq has
//! confirmed it as the executor's own), the recorded attempt, the run (each briq call a span,
//! the exec's with the kernel's own duration from the envelope below it) and the write of the
//! result.

use std::time::{Duration, SystemTime};

pub use crate::traces::Noted;
use crate::{
    briq::api::tools,
    crd::reasons::{ExecutionReason, Phase},
    traces::Span,
};

/// What one run of an Execution noted, step by step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    pub turn_read: Noted,
    pub sandbox_check: Noted,
    pub attempt_recorded: Noted,
    pub code: Noted,
    /// The kernel's own duration of the code, from the bridge's envelope.
    pub kernel: Option<Duration>,
    pub result_written: Noted,
}

/// Who the trace is about.
#[derive(Debug, Clone, PartialEq)]
pub struct Subject<'a> {
    pub namespace: &'a str,
    pub execution: &'a str,
    pub executor: &'a str,
    pub attempt: &'a str,
    pub created: SystemTime,
}

/// The spans of a finished run, from what it noted (`ended` when the result's write was not
/// noted).
pub fn spans(
    subject: &Subject,
    timeline: &Timeline,
    reason: ExecutionReason,
    message: &str,
    ended: SystemTime,
) -> Span {
    let end = timeline.result_written.end.unwrap_or(ended);
    // The wait ends when this operator first looked at the queue for its turn (else at its
    // attempt).
    let queue_end = timeline
        .turn_read
        .start
        .or(timeline.sandbox_check.start)
        .or(timeline.attempt_recorded.start);
    let failed = matches!(reason.phase(), Phase::Failed).then(|| format!("{reason}: {message}"));
    let mut root = Span::new("execution", subject.created, end)
        .attribute("k8s.namespace.name", subject.namespace)
        .attribute("briq.execution", subject.execution)
        .attribute("briq.executor", subject.executor)
        .attribute("briq.attempt", subject.attempt)
        .attribute("briq.reason", reason.as_str())
        .failed(failed);
    if let Some(queue_end) = queue_end {
        root = root.child(Span::new(
            "queued",
            subject.created,
            queue_end.max(subject.created),
        ));
    }
    let code = timeline.code.span("run code").map(|mut run| {
        if let (Some(kernel), Some(exec)) = (
            timeline.kernel,
            run.children
                .iter_mut()
                .rfind(|call| call.name.strip_prefix("briq ") == Some(tools::EXEC)),
        ) {
            // The envelope says how long the kernel ran, not when: it ran inside the exec, and
            // its answer closed it.
            let start = exec
                .end
                .checked_sub(kernel)
                .unwrap_or(exec.start)
                .max(exec.start);
            exec.children.push(Span::new("kernel", start, exec.end));
        }
        run
    });
    root.children(
        [
            timeline.turn_read.span("read queue"),
            timeline.sandbox_check.span("check sandbox"),
            timeline.attempt_recorded.span("record attempt"),
            code,
            timeline.result_written.span("write result"),
        ]
        .into_iter()
        .flatten(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traces::BriqCall;

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(1_000_000 + ms)
    }

    fn call(operation: &str, start: u64, end: u64, id: &str) -> BriqCall {
        BriqCall {
            operation: operation.to_owned(),
            start: at(start),
            end: at(end),
            request_id: Some(id.to_owned()),
            status: Some(200),
        }
    }

    const EXEC: &str = "briq_exec";
    const GET: &str = "briq_status";

    fn subject() -> Subject<'static> {
        Subject {
            namespace: "team-a",
            execution: "step-1",
            executor: "py",
            attempt: "00000000000000aa",
            created: at(0),
        }
    }

    fn root(end: u64, reason: &str) -> Span {
        Span::new("execution", at(0), at(end))
            .attribute("k8s.namespace.name", "team-a")
            .attribute("briq.execution", "step-1")
            .attribute("briq.executor", "py")
            .attribute("briq.attempt", "00000000000000aa")
            .attribute("briq.reason", reason)
    }

    fn full_run() -> Timeline {
        Timeline {
            turn_read: Noted::between(at(100), at(104)),
            sandbox_check: Noted::between(at(104), at(110))
                .with_calls(vec![call(GET, 105, 109, "r-get")]),
            attempt_recorded: Noted::between(at(110), at(115)),
            code: Noted::between(at(115), at(160)).with_calls(vec![call(EXEC, 116, 158, "r-exec")]),
            kernel: Some(Duration::from_millis(30)),
            result_written: Noted::between(at(160), at(166)),
        }
    }

    /// The spans of [`full_run`] from the sandbox check on, the kernel starting at `kernel`.
    fn from_sandbox_check(kernel: u64) -> [Span; 4] {
        [
            Span::new("check sandbox", at(104), at(110)).child(call(GET, 105, 109, "r-get").span()),
            Span::new("record attempt", at(110), at(115)),
            Span::new("run code", at(115), at(160)).child(
                call(EXEC, 116, 158, "r-exec").span().child(Span::new(
                    "kernel",
                    at(kernel),
                    at(158),
                )),
            ),
            Span::new("write result", at(160), at(166)),
        ]
    }

    #[test]
    fn a_run_is_one_tree_from_creation_to_the_written_result_with_the_kernel_inside_the_exec() {
        let got = spans(
            &subject(),
            &full_run(),
            ExecutionReason::Completed,
            "",
            at(999),
        );
        let expected = root(166, "Completed")
            .child(Span::new("queued", at(0), at(100)))
            .child(Span::new("read queue", at(100), at(104)))
            .children(from_sandbox_check(128));
        assert_eq!(got, expected);
    }

    #[test]
    fn a_failed_run_marks_the_root_and_a_kernel_longer_than_its_exec_is_clipped_to_it() {
        let timeline = Timeline {
            turn_read: Noted::default(),
            kernel: Some(Duration::from_secs(5)),
            ..full_run()
        };
        let got = spans(
            &subject(),
            &timeline,
            ExecutionReason::CodeError,
            "ZeroDivisionError",
            at(999),
        );
        let expected = root(166, "CodeError")
            .failed(Some("CodeError: ZeroDivisionError".to_owned()))
            // No fresh read of the queue: the wait ends at the sandbox check.
            .child(Span::new("queued", at(0), at(104)))
            .children(from_sandbox_check(116));
        assert_eq!(got, expected);
    }

    #[test]
    fn a_run_whose_result_write_was_not_noted_ends_when_it_was_emitted() {
        let timeline = Timeline {
            result_written: Noted::default(),
            code: Noted::between(at(115), at(160)),
            kernel: None,
            ..full_run()
        };
        let got = spans(
            &subject(),
            &timeline,
            ExecutionReason::Timeout,
            "deadline",
            at(170),
        );
        assert_eq!(got.end, at(170));
        assert_eq!(
            got.children
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>(),
            [
                "queued",
                "read queue",
                "check sandbox",
                "record attempt",
                "run code"
            ]
        );
    }
}
