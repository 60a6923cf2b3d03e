//! The code of Executions not sent yet, kept beside the cache (which drops every Execution's
//! code: see `controller::cache`) within a byte budget. With its code at hand, an Execution is
//! sent at once and its `Running` status written beside the exec, or folded into the result
//! write when the action ends first; without it (beyond the budget), the `Running` write comes
//! first and brings the code back. Either way the attempt id derives from the Execution
//! ([`super::run::attempt_id`]), so the sandbox's journal runs any delivery at most once.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use kube::ResourceExt;

use crate::crd::Execution;

/// The bytes of code kept at most: 16 MiB, e.g. 4,096 actions of 4 KiB (agents' steps are
/// mostly shorter), or 64 of the largest (65,536 four-byte characters).
pub const BUDGET_BYTES: usize = 16 << 20;

#[derive(Debug)]
pub struct Codes {
    budget: usize,
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    codes: HashMap<String, Arc<str>>,
    bytes: usize,
}

impl Default for Codes {
    fn default() -> Self {
        Codes::with_budget(BUDGET_BYTES)
    }
}

impl Codes {
    pub fn with_budget(budget: usize) -> Self {
        Codes {
            budget,
            kept: Mutex::default(),
        }
    }

    /// What the watch delivered, before the cache drops its code: an Execution not sent yet
    /// has its code kept while the budget allows; one sent, finished or being deleted has it
    /// dropped.
    pub fn heard(&self, execution: &Execution) {
        let Some(uid) = execution.uid() else {
            return;
        };
        let sent = execution
            .status
            .as_ref()
            .is_some_and(|s| s.attempt_id.is_some());
        if sent || execution.finished() || execution.metadata.deletion_timestamp.is_some() {
            self.forget(&uid);
            return;
        }
        let mut kept = self.kept.lock().expect("codes lock");
        let size = execution.spec.code.len();
        if kept.codes.contains_key(&uid) || kept.bytes + size > self.budget {
            return;
        }
        kept.bytes += size;
        kept.codes.insert(uid, execution.spec.code.as_str().into());
    }

    pub fn get(&self, uid: &str) -> Option<Arc<str>> {
        self.kept
            .lock()
            .expect("codes lock")
            .codes
            .get(uid)
            .cloned()
    }

    pub fn forget(&self, uid: &str) {
        let mut kept = self.kept.lock().expect("codes lock");
        if let Some(code) = kept.codes.remove(uid) {
            kept.bytes -= code.len();
        }
    }

    /// Keeps only the codes of `live` Executions (those the cache still holds).
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        let mut kept = self.kept.lock().expect("codes lock");
        let Kept { codes, bytes } = &mut *kept;
        codes.retain(|uid, code| {
            let keep = live(uid);
            if !keep {
                *bytes -= code.len();
            }
            keep
        });
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.kept.lock().expect("codes lock").bytes
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn execution(uid: &str, code: &str, status: serde_json::Value) -> Execution {
        serde_json::from_value(json!({
            "apiVersion": "briq.cloud/v1alpha1",
            "kind": "Execution",
            "metadata": { "name": uid, "namespace": "ns", "uid": uid },
            "spec": { "executorRef": { "name": "py" }, "code": code },
            "status": status,
        }))
        .unwrap()
    }

    fn running() -> serde_json::Value {
        json!({ "attemptId": "00112233445566778899aabbccddeeff" })
    }

    #[test]
    fn the_code_of_an_execution_not_sent_is_kept_until_it_is_sent() {
        let codes = Codes::with_budget(100);
        codes.heard(&execution("a", "x = 1", json!({})));
        assert_eq!(codes.get("a").as_deref(), Some("x = 1"));
        codes.heard(&execution("a", "x = 1", running()));
        assert_eq!(codes.get("a"), None, "sent: the code is not needed again");
        assert_eq!(codes.bytes(), 0);
    }

    #[test]
    fn beyond_the_budget_nothing_more_is_kept() {
        let codes = Codes::with_budget(10);
        codes.heard(&execution("a", "123456", json!({})));
        codes.heard(&execution("b", "123456", json!({})));
        assert_eq!(
            codes.get("b"),
            None,
            "over the budget: read back by the Running write"
        );
        codes.heard(&execution("a", "123456", json!({})));
        assert_eq!(codes.bytes(), 6, "heard again, counted once");
        codes.forget("a");
        codes.heard(&execution("b", "123456", json!({})));
        assert_eq!(codes.get("b").as_deref(), Some("123456"));
    }

    #[test]
    fn finished_and_gone_executions_keep_no_code() {
        let codes = Codes::with_budget(100);
        codes.heard(&execution("a", "1", json!({})));
        codes.heard(&execution("b", "2", json!({})));
        let done = json!({ "conditions": [{
            "type": "Succeeded", "status": "True", "reason": "Completed", "message": "",
            "lastTransitionTime": "2026-12-04T00:00:00Z",
        }] });
        codes.heard(&execution("a", "1", done));
        assert_eq!(codes.get("a"), None);
        codes.retain(|uid| uid != "b");
        assert_eq!((codes.get("b"), codes.bytes()), (None, 0));
    }
}
