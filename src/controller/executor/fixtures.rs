//! What the table tests of the executor's steps build their cases from.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use super::status::state;
use crate::{
    briq::{self, SandboxState, api::ErrorCode},
    crd::{
        BriqExecutorStatus,
        conditions::{self, Desired},
        reasons::ExecutorReason,
    },
};

pub(super) fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(super) fn status(conditions: &[Desired], sandbox: Option<&str>) -> BriqExecutorStatus {
    BriqExecutorStatus {
        conditions: conditions::merge(&[], conditions, Some(1)),
        sandbox_id: sandbox.map(str::to_owned),
        ..Default::default()
    }
}

pub(super) fn ready() -> [Desired; 2] {
    state(
        "True",
        false,
        ExecutorReason::KernelReady,
        "the kernel answers",
    )
}

pub(super) fn sandbox(id: &str, created: &str) -> briq::Sandbox {
    briq::Sandbox {
        id: id.into(),
        name: "briq-x".into(),
        state: SandboxState::Running,
        image: "python:3.12-slim".into(),
        size: None,
        sleep: "30m".into(),
        created_at: created.parse::<Timestamp>().unwrap(),
    }
}

pub(super) fn not_found() -> briq::Error {
    briq::Error::NotFound {
        message: "no such sandbox".into(),
        request_id: None,
    }
}

pub(super) fn unavailable() -> briq::Error {
    briq::Error::Unavailable {
        status: 503,
        code: ErrorCode::Unavailable,
        message: "busy".into(),
        retry_after: None,
        request_id: None,
    }
}
