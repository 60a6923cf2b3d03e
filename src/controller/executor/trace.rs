//! An executor's provisioning trace: from its creation to its kernel's readiness (or its failed
//! setup), with the sandbox's create and the bridge's setup, each briq call a span of its own.
//! A trace of its own: no client span asked for it.

use std::time::SystemTime;

use crate::traces::{Noted, Span};

/// Who the trace is about.
#[derive(Debug, Clone, PartialEq)]
pub struct Subject<'a> {
    pub namespace: &'a str,
    pub executor: &'a str,
    pub sandbox: &'a str,
    pub created: SystemTime,
}

/// The spans of a provisioning that reached a verdict: `failure` when setup failed; `create`
/// when this reconcile created the sandbox (a retried setup's sandbox came earlier).
pub fn spans(
    subject: &Subject,
    create: Option<&Noted>,
    setup: &Noted,
    failure: Option<&str>,
    ended: SystemTime,
) -> Span {
    Span::new("provision executor", subject.created, ended)
        .attribute("k8s.namespace.name", subject.namespace)
        .attribute("briq.executor", subject.executor)
        .attribute("briq.sandbox", subject.sandbox)
        .failed(failure.map(str::to_owned))
        .children(create.and_then(|create| create.span("create sandbox")))
        .children(setup.span("set up bridge and kernel"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::traces::BriqCall;

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(5_000_000 + ms)
    }

    fn call(operation: &str, start: u64, end: u64) -> BriqCall {
        BriqCall {
            operation: operation.to_owned(),
            start: at(start),
            end: at(end),
            request_id: None,
            status: Some(200),
        }
    }

    #[test]
    fn a_provisioning_is_one_trace_of_its_create_and_its_setup() {
        let subject = Subject {
            namespace: "team-a",
            executor: "py",
            sandbox: "sb-1",
            created: at(0),
        };
        let create = Noted::between(at(10), at(40)).with_calls(vec![call("briq_run", 11, 39)]);
        let setup = Noted::between(at(45), at(900)).with_calls(vec![
            call("briq_files_put", 46, 60),
            call("briq_exec", 61, 899),
        ]);
        let root = || {
            Span::new("provision executor", at(0), at(905))
                .attribute("k8s.namespace.name", "team-a")
                .attribute("briq.executor", "py")
                .attribute("briq.sandbox", "sb-1")
        };
        let set_up = Span::new("set up bridge and kernel", at(45), at(900)).children([
            call("briq_files_put", 46, 60).span(),
            call("briq_exec", 61, 899).span(),
        ]);
        assert_eq!(
            spans(&subject, Some(&create), &setup, None, at(905)),
            root()
                .child(
                    Span::new("create sandbox", at(10), at(40))
                        .child(call("briq_run", 11, 39).span())
                )
                .child(set_up.clone())
        );
        // A setup retried on a sandbox an earlier reconcile created, and failed.
        assert_eq!(
            spans(&subject, None, &setup, Some("pip failed"), at(905)),
            root().failed(Some("pip failed".to_owned())).child(set_up)
        );
    }
}
