//! What the table tests of the execution controller's steps build their cases from: times,
//! run orders, attempts, the bridge's results and briq's errors.

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

use super::send::Attempt;
use crate::{
    bridge::{CodeError, RunResult, RunStatus},
    briq::{self, api::ErrorCode},
    crd::RunOrder,
};

pub(super) fn at(seconds: &str) -> Timestamp {
    format!("2026-12-03T00:00:{seconds}Z").parse().unwrap()
}

pub(super) fn order(seconds: &str, name: &str) -> RunOrder {
    (Some(at(seconds)), name.to_owned())
}

pub(super) fn attempt(started: &str, timeout_seconds: u32) -> Attempt {
    Attempt {
        started: Some(at(started)),
        timeout_seconds,
    }
}

pub(super) fn time(seconds: &str) -> Time {
    Time(at(seconds))
}

pub(super) fn result(status: RunStatus, error: Option<(&str, &str)>) -> RunResult {
    RunResult {
        status,
        logs: "hi\n".into(),
        output: Some("2".into()),
        truncated: false,
        final_answer: None,
        error: error.map(|(name, message)| CodeError {
            name: name.into(),
            message: message.into(),
            traceback: "Traceback …".into(),
        }),
        display_dropped: 0,
        duration_ms: 7,
    }
}

pub(super) fn briq_error(status: u16, code: ErrorCode) -> briq::Error {
    briq::Error::Rejected {
        status,
        code,
        message: "no".into(),
        request_id: None,
    }
}

pub(super) fn unavailable(status: u16) -> briq::Error {
    briq::Error::Unavailable {
        status,
        code: ErrorCode::Unavailable,
        message: "bad gateway".into(),
        retry_after: None,
        request_id: Some("req_1".into()),
    }
}

pub(super) fn not_found() -> briq::Error {
    briq::Error::NotFound {
        message: "gone".into(),
        request_id: None,
    }
}
