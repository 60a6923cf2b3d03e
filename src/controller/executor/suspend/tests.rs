use serde_json::json;

use super::*;
use crate::bridge::Unsaved;

fn executor(
    suspend: bool,
    annotations: serde_json::Value,
    conditions: serde_json::Value,
) -> BriqExecutor {
    serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
        "metadata": { "name": "py", "namespace": "team", "generation": 3,
                      "annotations": annotations },
        "spec": { "suspend": suspend },
        "status": { "conditions": conditions },
    }))
    .unwrap()
}

fn save_failed_at(generation: i64) -> serde_json::Value {
    json!([{
        "type": "Suspended", "status": "False", "reason": "SuspendFailed", "message": "",
        "observedGeneration": generation, "lastTransitionTime": "2026-12-06T10:00:00Z",
    }])
}

fn idle() -> Activity {
    Activity::default()
}

#[test]
fn suspend_is_wanted_only_when_asked_and_nothing_needs_the_kernel() {
    let busy = Activity {
        unfinished: 1,
        ..Activity::default()
    };
    // (case, executor with spec.suspend, its Executions, idle past its timeout with
    // idleAction: Suspend allowed, wanted)
    let cases = [
        (
            "asked, idle",
            executor(true, json!({}), json!([])),
            idle(),
            false,
            true,
        ),
        (
            "not asked",
            executor(false, json!({}), json!([])),
            idle(),
            false,
            false,
        ),
        (
            "not asked by its spec, idle past its timeout with idleAction: Suspend",
            executor(false, json!({}), json!([])),
            idle(),
            true,
            true,
        ),
        (
            "asked, an Execution waits or runs",
            executor(true, json!({}), json!([])),
            busy,
            false,
            false,
        ),
        (
            "an unclaimed pool member stays warm",
            executor(true, json!({ POOL_MEMBER_ANNOTATION: "warm" }), json!([])),
            idle(),
            false,
            false,
        ),
        (
            "an unclaimed pool member idle past its timeout expires, never suspends",
            executor(false, json!({ POOL_MEMBER_ANNOTATION: "warm" }), json!([])),
            idle(),
            true,
            false,
        ),
        (
            "its save failed under this spec: not again until the spec changes",
            executor(true, json!({}), save_failed_at(3)),
            idle(),
            false,
            false,
        ),
        (
            "its save failed under this spec while idle: it expires instead",
            executor(false, json!({}), save_failed_at(3)),
            idle(),
            true,
            false,
        ),
        (
            "its save failed under an earlier spec: try again",
            executor(true, json!({}), save_failed_at(2)),
            idle(),
            false,
            true,
        ),
    ];
    for (name, executor, activity, idle_over, wanted) in cases {
        assert_eq!(
            suspend_wanted(&executor, activity, idle_over),
            wanted,
            "{name}"
        );
    }
}

fn report(ok: bool, saved: &[&str], unsaved: &[(&str, &str)]) -> StateReport {
    StateReport {
        ok,
        saved: saved.iter().map(|s| s.to_string()).collect(),
        unsaved: unsaved
            .iter()
            .map(|(name, why)| Unsaved {
                name: name.to_string(),
                why: why.to_string(),
            })
            .collect(),
        bytes: 1234,
        message: if ok { "saved" } else { "too many names" }.into(),
    }
}

#[test]
fn a_save_records_what_was_saved_and_names_what_was_not() {
    let suspension = saved(&report(
        true,
        &["x", "f"],
        &[("sock", "cannot pickle 'socket'")],
    ))
    .expect("a good report stands");
    assert_eq!(suspension.saved_bytes, 1234);
    assert_eq!(suspension.saved_names, 2);
    assert_eq!(
        suspension.unsaved,
        [UnsavedName {
            name: "sock".into(),
            why: "cannot pickle 'socket'".into()
        }]
    );
    assert!(suspension.suspended_time.is_some() && suspension.resumed_time.is_none());
    let [ready, stalled, suspended] = suspended_state(&suspension, Cause::Spec);
    assert_eq!((ready.status, ready.reason), ("False", "Suspended"));
    assert_eq!(stalled.status, "False");
    assert_eq!((suspended.status, suspended.reason), ("True", "Suspended"));
    assert!(
        ready.message.contains("2 names")
            && ready
                .message
                .contains("not saved (status.suspension says why): sock"),
        "{}",
        ready.message
    );
}

#[test]
fn a_failed_or_malformed_save_stops_nothing() {
    assert_eq!(
        saved(&report(false, &[], &[])),
        Err("too many names".into())
    );
    let not_a_name = report(true, &["os.system"], &[]);
    assert!(
        saved(&not_a_name)
            .unwrap_err()
            .contains("not a Python identifier")
    );
}

#[test]
fn many_unsaved_names_are_counted_beyond_the_first_ten() {
    let unsaved: Vec<UnsavedName> = (0..12)
        .map(|i| UnsavedName {
            name: format!("n{i}"),
            why: "x".into(),
        })
        .collect();
    let said = names_left(&unsaved);
    assert!(said.ends_with("n9 and 2 more"), "{said}");
    assert_eq!(names_left(&[]), "every name was saved");
}

#[test]
fn a_resume_says_what_came_back() {
    let last = Suspension {
        saved_names: 2,
        unsaved: vec![UnsavedName {
            name: "sock".into(),
            why: "socket".into(),
        }],
        ..Suspension::default()
    };
    let (kept, message) = resumed(Some(last.clone()), None);
    assert!(message.contains("kept running"), "{message}");
    assert_eq!(kept.unsaved, last.unsaved);
    assert!(kept.resumed_time.is_some());

    let restored = report(true, &["x"], &[("f", "NameError")]);
    let (after, message) = resumed(Some(last.clone()), Some(&restored));
    assert_eq!(
        after
            .unsaved
            .iter()
            .map(|u| u.name.as_str())
            .collect::<Vec<_>>(),
        ["sock", "f"],
        "a name that failed to restore is gone too"
    );
    assert!(message.contains("1 names restored"), "{message}");

    let (_, message) = resumed(Some(last), Some(&report(false, &[], &[])));
    assert!(message.contains("WITHOUT its namespace"), "{message}");
}

#[test]
fn a_bridge_that_cannot_save_fails_the_suspension_and_an_outage_tries_again() {
    use crate::bridge::Malformed;
    let old_bridge = CallError::Malformed(Malformed::Missing);
    assert_eq!(
        not_saved(&old_bridge).as_deref(),
        Some("the sandbox's bridge did not save it: bridge output has no envelope for this call")
    );
    let slow = CallError::TimedOut(std::time::Duration::from_secs(60));
    assert!(not_saved(&slow).is_some());
    assert!(not_saved(&CallError::UnexpectedKind("result")).is_some());
    let outage = CallError::Briq(crate::briq::Error::Unavailable {
        status: 503,
        code: crate::briq::api::ErrorCode::Unavailable,
        message: "maintenance".into(),
        retry_after: None,
        request_id: None,
    });
    assert_eq!(not_saved(&outage), None, "briq did not carry it: try again");
}
