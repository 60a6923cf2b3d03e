use super::*;
use crate::{
    controller::executor::{
        fixtures::{annotations, ready, status},
        status::state,
    },
    crd::conditions::Desired,
};

fn provisioning() -> [Desired; 2] {
    state("Unknown", false, ExecutorReason::Provisioning, "creating")
}

fn setup_failed() -> [Desired; 2] {
    state("False", true, ExecutorReason::SetupFailed, "pip failed")
}

fn expired() -> [Desired; 2] {
    state("False", true, ExecutorReason::IdleTimeout, "idle")
}

#[test]
fn decide_table() {
    let unusable = BriqExecutorStatus {
        unusable: true,
        unusable_reason: Some("timed out".into()),
        ..status(&ready(), Some("bq_1"))
    };
    let none = annotations(&[]);
    let pending = annotations(&[(CREATE_PENDING_ANNOTATION, "2026-12-03T00:00:00Z")]);
    let by_annotation = annotations(&[(SANDBOX_ID_ANNOTATION, "bq_a")]);
    let cases: Vec<(&str, BriqExecutorStatus, &BTreeMap<String, String>, Step)> = vec![
        (
            "unusable wins over everything",
            unusable.clone(),
            &by_annotation,
            Step::ReportUnusable {
                why: "timed out".into(),
            },
        ),
        (
            "unusable without a reason",
            BriqExecutorStatus {
                unusable_reason: None,
                ..unusable
            },
            &none,
            Step::ReportUnusable {
                why: "unknown".into(),
            },
        ),
        (
            "failed setup with a sandbox left",
            status(&setup_failed(), Some("bq_1")),
            &none,
            Step::Conclude {
                reason: ExecutorReason::SetupFailed,
                leftover: Some("bq_1".into()),
                message: "pip failed".into(),
            },
        ),
        (
            "failed setup, sandbox already destroyed",
            status(&setup_failed(), None),
            &none,
            Step::Conclude {
                reason: ExecutorReason::SetupFailed,
                leftover: None,
                message: "pip failed".into(),
            },
        ),
        (
            "expired with its sandbox not yet given back",
            status(&expired(), Some("bq_1")),
            &by_annotation,
            Step::Conclude {
                reason: ExecutorReason::IdleTimeout,
                leftover: Some("bq_1".into()),
                message: "idle".into(),
            },
        ),
        (
            "expired, its sandbox given back",
            status(&expired(), None),
            &none,
            Step::Conclude {
                reason: ExecutorReason::IdleTimeout,
                leftover: None,
                message: "idle".into(),
            },
        ),
        (
            // Stalled for a reason that keeps the sandbox: not concluded.
            "stalled on a foreign sandbox",
            status(
                &state("False", true, ExecutorReason::SandboxNotOwned, "x"),
                Some("bq_1"),
            ),
            &none,
            Step::Provision {
                sandbox: "bq_1".into(),
            },
        ),
        (
            "new executor",
            BriqExecutorStatus::default(),
            &none,
            Step::CreateSandbox { pending: false },
        ),
        (
            "a create without a recorded outcome",
            status(&provisioning(), None),
            &pending,
            Step::CreateSandbox { pending: true },
        ),
        (
            "sandbox recorded in the status, kernel not ready",
            status(&provisioning(), Some("bq_1")),
            &none,
            Step::Provision {
                sandbox: "bq_1".into(),
            },
        ),
        (
            "status lost, the annotation still names the sandbox",
            BriqExecutorStatus::default(),
            &by_annotation,
            Step::Provision {
                sandbox: "bq_a".into(),
            },
        ),
        (
            "the status wins over the annotation",
            status(&ready(), Some("bq_1")),
            &by_annotation,
            Step::Probe {
                sandbox: "bq_1".into(),
            },
        ),
        (
            "ready",
            status(&ready(), Some("bq_1")),
            &none,
            Step::Probe {
                sandbox: "bq_1".into(),
            },
        ),
    ];
    for (name, status, annotations, expected) in cases {
        assert_eq!(
            decide(&status, annotations, &Asked::default()),
            expected,
            "{name}"
        );
    }
}

#[test]
fn decide_table_for_pools() {
    let none = annotations(&[]);
    let fallen_back = annotations(&[(POOL_FALLBACK_ANNOTATION, "pool gone")]);
    let claimed = annotations(&[(CLAIMED_BY_ANNOTATION, "uid-c")]);
    let handed_over = Step::HandedOver {
        claimer: "uid-c".into(),
    };
    let unusable = BriqExecutorStatus {
        unusable: true,
        ..status(&ready(), Some("bq_1"))
    };
    let cases = [
        (
            "a claimer without a sandbox claims",
            BriqExecutorStatus::default(),
            &none,
            true,
            Step::Claim,
        ),
        (
            "a claimer that fell back creates its own",
            BriqExecutorStatus::default(),
            &fallen_back,
            true,
            Step::CreateSandbox { pending: false },
        ),
        (
            "a claimer with its handed-over sandbox probes it",
            status(&ready(), Some("bq_1")),
            &none,
            true,
            Step::Probe {
                sandbox: "bq_1".into(),
            },
        ),
        (
            "a handed-over member leaves its sandbox to the claimer",
            status(&ready(), Some("bq_1")),
            &claimed,
            false,
            handed_over.clone(),
        ),
        (
            "even when an expiry was decided just before the claim",
            status(&expired(), Some("bq_1")),
            &claimed,
            false,
            handed_over.clone(),
        ),
        (
            "or it was marked unusable",
            unusable,
            &claimed,
            false,
            handed_over,
        ),
        (
            "a mismatched claimer is concluded",
            status(
                &state("False", true, ExecutorReason::PoolMismatch, "image differs"),
                None,
            ),
            &none,
            true,
            Step::Conclude {
                reason: ExecutorReason::PoolMismatch,
                leftover: None,
                message: "image differs".into(),
            },
        ),
    ];
    for (name, status, annotations, claims, expected) in cases {
        let asked = Asked {
            claims,
            ..Asked::default()
        };
        assert_eq!(decide(&status, annotations, &asked), expected, "{name}");
    }
}

#[test]
fn only_irreversible_steps_need_a_fresh_read() {
    let table = [
        (Step::ReportUnusable { why: "x".into() }, false),
        (
            Step::Conclude {
                reason: ExecutorReason::SetupFailed,
                leftover: None,
                message: "x".into(),
            },
            false,
        ),
        (Step::CreateSandbox { pending: false }, true),
        (Step::CreateSandbox { pending: true }, true),
        (
            Step::Provision {
                sandbox: "x".into(),
            },
            true,
        ),
        (
            Step::Probe {
                sandbox: "x".into(),
            },
            false,
        ),
        // Its writes are conditional; where the cache cannot decide, see claim_lookup.
        (Step::Claim, false),
        // A save over a namespace, a stop, a restore: decided on what the API server says.
        (
            Step::Suspend {
                sandbox: "x".into(),
            },
            true,
        ),
        (
            Step::Resume {
                sandbox: "x".into(),
            },
            true,
        ),
        (Step::StaySuspended, false),
    ];
    for (step, fresh) in table {
        assert_eq!(step.needs_fresh_read(), fresh, "{step:?}");
    }
}

fn phase(reason: ExecutorReason) -> [Desired; 2] {
    state("False", false, reason, "")
}

#[test]
fn decide_table_for_suspension() {
    let none = annotations(&[]);
    let claimed = annotations(&[(CLAIMED_BY_ANNOTATION, "uid-c")]);
    let suspend = |sandbox: &str| Step::Suspend {
        sandbox: sandbox.into(),
    };
    let resume = |sandbox: &str| Step::Resume {
        sandbox: sandbox.into(),
    };
    // (case, status, annotations, asked to suspend now, step)
    let cases = [
        (
            "ready and asked: suspend",
            status(&ready(), Some("bq_1")),
            &none,
            true,
            suspend("bq_1"),
        ),
        (
            "ready, not asked (or an Execution waits): probe",
            status(&ready(), Some("bq_1")),
            &none,
            false,
            Step::Probe {
                sandbox: "bq_1".into(),
            },
        ),
        (
            "suspending and still asked: go on (after a crash too)",
            status(&phase(ExecutorReason::Suspending), Some("bq_1")),
            &none,
            true,
            suspend("bq_1"),
        ),
        (
            "suspending, and an Execution came: resume (the kernel may still run)",
            status(&phase(ExecutorReason::Suspending), Some("bq_1")),
            &none,
            false,
            resume("bq_1"),
        ),
        (
            "suspended and still asked: nothing to do, no probe of a stopped sandbox",
            status(&phase(ExecutorReason::Suspended), Some("bq_1")),
            &none,
            true,
            Step::StaySuspended,
        ),
        (
            "suspended, and an Execution came or suspend: false: resume",
            status(&phase(ExecutorReason::Suspended), Some("bq_1")),
            &none,
            false,
            resume("bq_1"),
        ),
        (
            "resuming: finish the resume before any new suspension, or an empty new kernel \
             would be saved over the namespace",
            status(&phase(ExecutorReason::Resuming), Some("bq_1")),
            &none,
            true,
            resume("bq_1"),
        ),
        (
            "the sandbox recorded only by its annotation",
            status(&phase(ExecutorReason::Suspended), None),
            &annotations(&[(SANDBOX_ID_ANNOTATION, "bq_a")]),
            false,
            resume("bq_a"),
        ),
        (
            "provisioning is not suspended halfway",
            status(&provisioning(), Some("bq_1")),
            &none,
            true,
            Step::Provision {
                sandbox: "bq_1".into(),
            },
        ),
        (
            "a handed-over member is its claimer's to suspend",
            status(&ready(), Some("bq_1")),
            &claimed,
            true,
            Step::HandedOver {
                claimer: "uid-c".into(),
            },
        ),
    ];
    for (name, status, annotations, suspend, expected) in cases {
        let asked = Asked {
            suspend,
            ..Asked::default()
        };
        assert_eq!(decide(&status, annotations, &asked), expected, "{name}");
    }
}
