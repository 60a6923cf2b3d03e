use super::*;
use crate::controller::executor::{
    fixtures::{not_found, sandbox, unavailable},
    status::kernel_ready,
};

fn found(name: &str, state: SandboxState) -> Result<briq::Sandbox, briq::Error> {
    Ok(briq::Sandbox {
        name: name.into(),
        state,
        ..sandbox("bq_1", "2026-12-03T00:00:01Z")
    })
}

#[test]
fn ownership_table() {
    let cases = [
        (
            found("bqe-ns-py-12345678", SandboxState::Running),
            Some(Ownership::Owned),
        ),
        (
            found("bqe-ns-py-12345678", SandboxState::Sleeping),
            Some(Ownership::Owned),
        ),
        (
            found("bqe-other-py-87654321", SandboxState::Running),
            Some(Ownership::Foreign),
        ),
        (
            found("bqe-ns-py-1234567", SandboxState::Running),
            Some(Ownership::Foreign),
        ),
        (Err(not_found()), Some(Ownership::Gone)),
        (Err(unavailable()), None),
    ];
    for (found, expected) in cases {
        assert_eq!(
            ownership("bqe-ns-py-12345678", &found),
            expected,
            "{found:?}"
        );
    }
}

#[test]
fn probe_verdict_table() {
    let mine = "bqe-ns-py-12345678";
    let cases: Vec<(Result<briq::Sandbox, briq::Error>, ProbeVerdict)> = vec![
        (found(mine, SandboxState::Running), ProbeVerdict::Running),
        (
            found(mine, SandboxState::Sleeping),
            ProbeVerdict::Lost(
                "sandbox bq_1 is sleeping: its kernel and Python state are lost".into(),
            ),
        ),
        (
            found(mine, SandboxState::Starting),
            ProbeVerdict::Lost(
                "sandbox bq_1 is starting: its kernel and Python state are lost".into(),
            ),
        ),
        (
            found("bqe-victim-py-87654321", SandboxState::Running),
            ProbeVerdict::NotOwned,
        ),
        (
            Err(not_found()),
            ProbeVerdict::Lost("sandbox bq_1 no longer exists".into()),
        ),
        // briq does not answer: nothing is concluded, the outage is said.
        (
            Err(unavailable()),
            ProbeVerdict::Unreachable(unavailable().to_string()),
        ),
        (
            Err(briq::Error::HeldBack {
                wait: std::time::Duration::from_secs(2),
            }),
            ProbeVerdict::Unreachable(
                "briq is not answering (an outage?): calls are held back for 2s, then briq \
                 is probed again"
                    .into(),
            ),
        ),
        // briq answers, but refuses to say: asked again after a backoff.
        (
            Err(briq::Error::Unauthorized {
                status: 401,
                message: "revoked".into(),
                request_id: None,
            }),
            ProbeVerdict::Retry,
        ),
    ];
    for (found, expected) in cases {
        assert_eq!(probe_verdict("bq_1", mine, &found), expected, "{found:?}");
    }
    let ready = kernel_ready(None);
    let unreachable = briq_unreachable(ready.clone(), "HTTP 503");
    assert_eq!(unreachable[..2], ready);
    assert_eq!(
        unreachable[2],
        desired(
            conditions::BRIQ_REACHABLE,
            "False",
            "BriqUnreachable",
            "briq did not answer the last probe (HTTP 503); Executions wait for it"
        )
    );
}
