use super::*;
use crate::controller::executor::fixtures::{ready, status};

#[test]
fn a_claimer_says_where_its_kernel_came_from_on_every_probe() {
    let pool = PoolRef {
        name: "fast".into(),
        cold_create_after_seconds: 30,
        env: vec![],
    };
    let claimed = Some("fast-x1");
    assert_eq!(
        handover(Some(&pool), claimed).as_deref(),
        Some("handed over from BriqExecutorPool fast (executor fast-x1)")
    );
    assert_eq!(handover(Some(&pool), None), None, "fell back to its own");
    assert_eq!(handover(None, claimed), None, "not a claimer");
    assert_eq!(
        kernel_ready(Some(
            "handed over from BriqExecutorPool fast (executor fast-x1)"
        ))[0]
            .message,
        "the kernel answers: handed over from BriqExecutorPool fast (executor fast-x1)"
    );
    assert_eq!(kernel_ready(None)[0].message, "the kernel answers");
}

#[test]
fn a_status_that_already_says_it_is_not_written_again() {
    let current = status(&ready(), Some("bq_1"));
    let current = BriqExecutorStatus {
        observed_generation: Some(1),
        ..current
    };
    let same = SandboxFields::of(&current);
    assert_eq!(
        status_update(&current, Some(1), &ready(), same.clone()),
        None
    );
    assert!(
        status_update(&current, Some(2), &ready(), same.clone()).is_some(),
        "a new generation"
    );
    let lost = unusable_state("its kernel was lost");
    let update = status_update(&current, Some(1), &lost, same).expect("a change");
    let ready_condition = conditions::find(&update.conditions, READY).unwrap();
    assert_eq!(
        (
            ready_condition.status.as_str(),
            ready_condition.reason.as_str()
        ),
        ("False", "Unusable")
    );
    assert_eq!(
        ready_condition.message,
        "its kernel was lost. An unusable executor never runs code again: create a new BriqExecutor"
    );
    assert!(conditions::is_true(&update.conditions, STALLED));
    assert_eq!(update.sandbox_id.as_deref(), Some("bq_1"));
}
