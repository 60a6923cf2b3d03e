//! Fault injection and call counting.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use briq_operator::briq::api::ErrorCode;

/// The operations, as counted in stats and matched by faults: the MCP methods and each tool
/// (the legacy REST routes count as the tool they stand for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// `initialize`.
    Initialize,
    /// `tools/list`.
    ListTools,
    /// `briq_run`.
    Create,
    /// `briq_status`.
    Get,
    /// `briq_list`.
    List,
    /// `briq_destroy`.
    Destroy,
    /// `briq_exec`.
    Exec,
    /// `briq_files_put`.
    WriteFile,
    /// `briq_files_get`.
    ReadFile,
    /// `briq_stop`.
    Stop,
    /// `briq_start`.
    Start,
    /// `briq_fork`.
    Fork,
}

/// Which operations a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationMatch {
    Any,
    #[serde(untagged)]
    Only(Operation),
}

/// What happens to a call a fault fires on. Faults act on the HTTP answer of the call's POST
/// (on the legacy REST surface, of its route).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// The connection drops mid-answer; the operation is not performed.
    DropConnection,
    /// The operation is performed, then the connection drops: the client cannot know it happened.
    DropAfterEffect,
    /// The operation is performed and answered with a body that is not JSON.
    MalformedJson,
    /// The operation is performed, then answered with an event stream that ends after its
    /// opening comment, before the response event: the client cannot know it happened.
    SseCutAfterEffect,
    /// An error status; the operation is not performed. On the MCP surface the body is a
    /// JSON-RPC error (-32000) whose `data.code` is `code`; `code` defaults from the status.
    #[serde(untagged)]
    Status {
        status: u16,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<ErrorCode>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_seconds: Option<u64>,
    },
    /// The operation is performed, then answered with this error status (briq's error body),
    /// as a gateway does when its upstream acted but answered late or not at all.
    #[serde(untagged)]
    StatusAfterEffect { status_after_effect: u16 },
    /// The operation is performed after this delay, even if the client gave up meanwhile.
    #[serde(untagged)]
    Delay { delay_ms: u64 },
    /// The operation is performed at once, then the answer is held back this long and never
    /// sent (the connection drops): set it past the client's timeout, and the client gives up
    /// on an operation that already happened.
    #[serde(untagged)]
    HangAfterEffect { hang_after_effect_ms: u64 },
    /// A gateway's error page (HTML, not briq's JSON) that echoes the request's bearer key at
    /// many offsets, as a misconfigured proxy might; the operation is not performed.
    #[serde(untagged)]
    EchoPage { echo_status: u16 },
    /// A gateway's error page that echoes the request's body (an exec's: its command, its
    /// environment, its stdin), as a proxy might for a request it could not forward; the
    /// operation is not performed.
    #[serde(untagged)]
    EchoRequest { echo_request_status: u16 },
    /// A tool error with this code (`isError`, HTTP 200); the operation is not performed.
    #[serde(untagged)]
    ToolError { tool_error: ErrorCode },
    /// A JSON-RPC error with this code (HTTP 200); the operation is not performed.
    #[serde(untagged)]
    JsonRpcError { json_rpc_error: i64 },
}

impl Fault {
    pub fn status(status: u16) -> Self {
        Self::Status {
            status,
            code: None,
            retry_after_seconds: None,
        }
    }

    pub fn echo_page(status: u16) -> Self {
        Self::EchoPage {
            echo_status: status,
        }
    }

    pub fn echo_request(status: u16) -> Self {
        Self::EchoRequest {
            echo_request_status: status,
        }
    }

    pub fn delay(delay: Duration) -> Self {
        Self::Delay {
            delay_ms: millis(delay),
        }
    }

    pub fn status_after_effect(status: u16) -> Self {
        Self::StatusAfterEffect {
            status_after_effect: status,
        }
    }

    pub fn hang_after_effect(hang: Duration) -> Self {
        Self::HangAfterEffect {
            hang_after_effect_ms: millis(hang),
        }
    }

    pub fn tool_error(code: ErrorCode) -> Self {
        Self::ToolError { tool_error: code }
    }

    pub fn json_rpc_error(code: i64) -> Self {
        Self::JsonRpcError {
            json_rpc_error: code,
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Body of `POST /_admin/faults`: the next `count` matching calls get `fault`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRule {
    pub operation: OperationMatch,
    /// Only calls on this sandbox; such a rule never matches a call naming none (`initialize`,
    /// `tools/list`, create, list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    pub count: u32,
    pub fault: Fault,
}

impl FaultRule {
    /// Fires on the next call of `operation`.
    pub fn on(operation: Operation, fault: Fault) -> Self {
        Self {
            operation: OperationMatch::Only(operation),
            sandbox_id: None,
            count: 1,
            fault,
        }
    }

    pub fn times(mut self, count: u32) -> Self {
        self.count = count;
        self
    }

    pub fn for_sandbox(mut self, id: impl Into<String>) -> Self {
        self.sandbox_id = Some(id.into());
        self
    }

    fn matches(&self, operation: Operation, sandbox_id: Option<&str>) -> bool {
        let operation_matches = match self.operation {
            OperationMatch::Any => true,
            OperationMatch::Only(only) => only == operation,
        };
        let sandbox_matches = match &self.sandbox_id {
            None => true,
            Some(wanted) => sandbox_id == Some(wanted.as_str()),
        };
        operation_matches && sandbox_matches
    }
}

/// Body of `POST /_admin/outage`: briq's gateway is down for `duration_ms`. Every call
/// arriving meanwhile is answered `status` and not performed; a call in flight when the outage
/// begins is performed, and answered `status` if it ends during the outage, as a gateway whose
/// upstream went away answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outage {
    pub status: u16,
    pub duration_ms: u64,
}

impl Outage {
    pub fn new(status: u16, duration: Duration) -> Self {
        Self {
            status,
            duration_ms: millis(duration),
        }
    }
}

/// Pending faults, first added first used, and how often each operation was called.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    rules: Vec<FaultRule>,
    calls: BTreeMap<Operation, u64>,
    /// The status every call is answered until the instant, while an outage lasts.
    outage: Option<(u16, Instant)>,
}

impl Faults {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere must not turn every later call into a second panic.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn add(&self, rule: FaultRule) {
        if rule.count > 0 {
            self.lock().rules.push(rule);
        }
    }

    pub(crate) fn clear(&self) {
        let mut inner = self.lock();
        inner.rules.clear();
        inner.outage = None;
    }

    pub(crate) fn begin_outage(&self, outage: Outage) {
        let until = Instant::now() + Duration::from_millis(outage.duration_ms);
        self.lock().outage = Some((outage.status, until));
    }

    /// The status every call is answered now, while an outage lasts.
    pub(crate) fn outage(&self) -> Option<u16> {
        let mut inner = self.lock();
        match inner.outage {
            Some((status, until)) if Instant::now() < until => Some(status),
            Some(_) => {
                inner.outage = None;
                None
            }
            None => None,
        }
    }

    /// Counts the call and takes the fault to apply to it, if any.
    pub(crate) fn record(&self, operation: Operation, sandbox_id: Option<&str>) -> Option<Fault> {
        if let Some(status) = self.outage() {
            *self.lock().calls.entry(operation).or_default() += 1;
            return Some(Fault::status(status));
        }
        let mut inner = self.lock();
        *inner.calls.entry(operation).or_default() += 1;
        let index = inner
            .rules
            .iter()
            .position(|rule| rule.matches(operation, sandbox_id))?;
        let rule = &mut inner.rules[index];
        rule.count -= 1;
        let fault = rule.fault.clone();
        if rule.count == 0 {
            inner.rules.remove(index);
        }
        Some(fault)
    }

    pub(crate) fn calls(&self) -> BTreeMap<Operation, u64> {
        self.lock().calls.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_shapes() {
        let parse = |json: &str| serde_json::from_str::<FaultRule>(json).unwrap();
        let rule =
            parse(r#"{"operation":"any","count":2,"fault":{"status":503,"code":"unavailable"}}"#);
        assert_eq!(rule.operation, OperationMatch::Any);
        assert!(matches!(
            rule.fault,
            Fault::Status {
                status: 503,
                code: Some(ErrorCode::Unavailable),
                ..
            }
        ));
        let rule = parse(
            r#"{"operation":"exec","sandbox_id":"bq_1","count":1,"fault":"drop_after_effect"}"#,
        );
        assert_eq!(rule.operation, OperationMatch::Only(Operation::Exec));
        assert_eq!(rule.fault, Fault::DropAfterEffect);
        let rule = parse(r#"{"operation":"write_file","count":1,"fault":{"delay_ms":5}}"#);
        assert_eq!(rule.fault, Fault::Delay { delay_ms: 5 });
        let rule = parse(r#"{"operation":"exec","count":1,"fault":{"status_after_effect":502}}"#);
        assert_eq!(rule.fault, Fault::status_after_effect(502));
        let rule = parse(r#"{"operation":"exec","count":1,"fault":{"hang_after_effect_ms":2500}}"#);
        assert_eq!(
            rule.fault,
            Fault::hang_after_effect(Duration::from_millis(2500))
        );
        let rule = parse(r#"{"operation":"list_tools","count":1,"fault":"sse_cut_after_effect"}"#);
        assert_eq!(rule.operation, OperationMatch::Only(Operation::ListTools));
        assert_eq!(rule.fault, Fault::SseCutAfterEffect);
        let rule =
            parse(r#"{"operation":"initialize","count":1,"fault":{"tool_error":"not_found"}}"#);
        assert_eq!(rule.operation, OperationMatch::Only(Operation::Initialize));
        assert_eq!(rule.fault, Fault::tool_error(ErrorCode::NotFound));
        let rule =
            parse(r#"{"operation":"read_file","count":1,"fault":{"json_rpc_error":-32603}}"#);
        assert_eq!(rule.fault, Fault::json_rpc_error(-32603));
        for fault in [
            Fault::status_after_effect(504),
            Fault::hang_after_effect(Duration::from_secs(3)),
            Fault::status(503),
            Fault::delay(Duration::from_millis(7)),
            Fault::tool_error(ErrorCode::RateLimited),
            Fault::json_rpc_error(-32602),
            Fault::SseCutAfterEffect,
            Fault::echo_request(502),
        ] {
            let json = serde_json::to_string(&fault).unwrap();
            assert_eq!(
                serde_json::from_str::<Fault>(&json).unwrap(),
                fault,
                "{json}"
            );
        }
        assert_eq!(
            serde_json::to_string(&Fault::status_after_effect(502)).unwrap(),
            r#"{"status_after_effect":502}"#
        );
        assert_eq!(
            serde_json::to_string(&Fault::tool_error(ErrorCode::PlanLimit)).unwrap(),
            r#"{"tool_error":"plan_limit"}"#
        );
        assert_eq!(
            serde_json::to_string(&Fault::json_rpc_error(-32000)).unwrap(),
            r#"{"json_rpc_error":-32000}"#
        );
        // Every operation keeps its name; the one without a tool is gone.
        let names: Vec<String> = [
            Operation::Initialize,
            Operation::ListTools,
            Operation::Create,
            Operation::Get,
            Operation::List,
            Operation::Destroy,
            Operation::Exec,
            Operation::WriteFile,
            Operation::ReadFile,
            Operation::Stop,
            Operation::Start,
        ]
        .iter()
        .map(|o| {
            serde_json::to_value(o)
                .unwrap()
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
        assert_eq!(
            names,
            [
                "initialize",
                "list_tools",
                "create",
                "get",
                "list",
                "destroy",
                "exec",
                "write_file",
                "read_file",
                "stop",
                "start"
            ]
        );
        assert!(serde_json::from_str::<Operation>(r#""preview""#).is_err());
        let json =
            serde_json::to_string(&FaultRule::on(Operation::Get, Fault::MalformedJson)).unwrap();
        assert_eq!(
            json,
            r#"{"operation":"get","count":1,"fault":"malformed_json"}"#
        );
    }

    #[test]
    fn rules_fire_count_times_and_calls_are_always_counted() {
        let faults = Faults::default();
        faults.add(
            FaultRule::on(Operation::Get, Fault::status(503))
                .times(2)
                .for_sandbox("bq_a"),
        );
        assert_eq!(faults.record(Operation::Get, Some("bq_b")), None);
        assert!(faults.record(Operation::Get, Some("bq_a")).is_some());
        assert!(faults.record(Operation::Get, Some("bq_a")).is_some());
        assert_eq!(faults.record(Operation::Get, Some("bq_a")), None);
        assert_eq!(faults.calls()[&Operation::Get], 4);
    }

    #[test]
    fn an_outage_answers_every_call_until_it_ends_and_is_counted() {
        let faults = Faults::default();
        faults.add(FaultRule::on(Operation::Get, Fault::MalformedJson));
        faults.begin_outage(Outage::new(503, Duration::from_secs(3600)));
        for operation in [Operation::Create, Operation::Exec, Operation::Get] {
            assert_eq!(faults.record(operation, None), Some(Fault::status(503)));
        }
        assert_eq!(faults.outage(), Some(503));
        faults.begin_outage(Outage::new(503, Duration::ZERO));
        assert_eq!(faults.outage(), None);
        // A rule waiting behind the outage fires after it.
        assert_eq!(
            faults.record(Operation::Get, None),
            Some(Fault::MalformedJson)
        );
        assert_eq!(faults.calls()[&Operation::Get], 2);
        faults.begin_outage(Outage::new(502, Duration::from_secs(3600)));
        faults.clear();
        assert_eq!(faults.outage(), None);
    }
}
