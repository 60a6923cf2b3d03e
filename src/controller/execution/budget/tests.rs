use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::crd::ExecutionError;

#[test]
fn encoded_lengths_count_the_api_servers_escapes() {
    let table = [
        ("", 0),
        ("abc", 3),
        ("a<b", 8),
        ("<>&", 18),
        ("\u{2028}\u{2029}", 12),
        ("\"\\", 4),
        ("\n\r\t", 6),
        ("\u{1}\u{8}\u{c}\u{1f}", 24),
        ("é€😀", 2 + 3 + 4),
        ("\u{7f}'", 2),
    ];
    for (text, bytes) in table {
        assert_eq!(encoded_len(text), bytes, "{text:?}");
    }
    // The whole value, as compact JSON: `{"a":["<",1,true,null]}`.
    assert_eq!(value_len(&json!({ "a": ["<", 1, true, null] })), 28);
    let value = json!({ "k\"": "é", "n": -12, "f": false, "o": {}, "l": [] });
    assert_eq!(
        value_len(&value),
        serde_json::to_string(&value).unwrap().len()
    );
}

#[test]
fn cut_keeps_head_and_tail_within_the_bytes() {
    let marker = |n: usize| format!("\n… [{n} characters cut] …\n");
    let alphabet = "abcdefghijklmnopqrstuvwxyz";
    // (text, max, expected)
    let table: Vec<(String, usize, String)> = vec![
        ("short".into(), 5, "short".into()),
        ("short".into(), 100, "short".into()),
        // Not even the marker fits.
        ("0123456789".into(), 9, String::new()),
        // 52 characters: a marker for a two-digit count takes 31 bytes, leaving 9 (or 10).
        (alphabet.repeat(2), 40, format!("abcd{}vwxyz", marker(43))),
        (alphabet.repeat(2), 41, format!("abcde{}vwxyz", marker(42))),
        // `<` takes 6 bytes: only whole characters are kept.
        (
            "<<<<<<<<<<<<<<<<<<<<".into(),
            43,
            format!("<{}<", marker(18)),
        ),
        (
            "\u{2028}<".repeat(10),
            55,
            format!("\u{2028}<{}\u{2028}<", marker(16)),
        ),
    ];
    for (text, max, expected) in table {
        let cut = cut(&text, max);
        assert_eq!(cut, expected, "{text:?} to {max}");
        assert!(encoded_len(&cut) <= max, "{text:?} to {max}");
    }
}

#[test]
fn shares_leave_small_texts_whole_and_split_the_rest() {
    let table: [(&[usize], usize, &[usize]); 6] = [
        (&[], 10, &[]),
        (&[3, 4], 10, &[3, 4]),
        (&[3, 100], 10, &[3, 7]),
        (&[100, 3, 100], 13, &[5, 3, 5]),
        (&[100, 100, 100], 10, &[3, 3, 4]),
        (&[5, 5], 0, &[0, 0]),
    ];
    for (sizes, room, expected) in table {
        assert_eq!(shares(sizes, room), expected, "{sizes:?} in {room}");
    }
}

fn condition(message: &str) -> Condition {
    Condition {
        type_: "Succeeded".into(),
        status: "False".into(),
        reason: "CodeError".into(),
        message: message.into(),
        observed_generation: Some(1),
        last_transition_time: Time("2026-12-03T00:00:00Z".parse().expect("a timestamp")),
    }
}

#[test]
fn a_status_within_budget_is_unchanged() {
    let status = ExecutionStatus {
        logs: Some("<".repeat(100)),
        conditions: vec![condition("boom")],
        ..Default::default()
    };
    let size = status_len(&status);
    assert_eq!(
        size,
        serde_json::to_string(&status).unwrap().len() + 500,
        "each `<` counts 6 bytes"
    );
    assert_eq!(fit(status.clone(), size), status);
}

#[test]
fn an_oversized_status_is_cut_to_exactly_what_fits() {
    let status = ExecutionStatus {
        conditions: vec![condition(&"m".repeat(40))],
        logs: Some("L".repeat(1000)),
        output: Some("out".into()),
        error: Some(ExecutionError {
            name: "E".into(),
            message: "\u{2028}<".repeat(1000),
            traceback: Some("tb".into()),
        }),
        ..Default::default()
    };
    let fitted = fit(status.clone(), 1000);
    assert!(status_len(&fitted) <= 1000, "{}", status_len(&fitted));
    let marker = |n: usize| format!("\n… [{n} characters cut] …\n");
    // Without its texts the status takes 242 bytes, leaving 758. The small texts (3 + 1 + 2 +
    // 40 bytes) stay whole; logs (1,000 bytes) and message (12,000) get 356 each. Less a 33-byte
    // marker, each keeps 161 bytes of head and the rest of its 323 in tail: 161 + 162 `L`s, and
    // 26 + 27 characters of 6 bytes (318 bytes).
    assert_eq!(
        fitted,
        ExecutionStatus {
            conditions: vec![condition(&"m".repeat(40))],
            logs: Some(format!(
                "{}{}{}",
                "L".repeat(161),
                marker(677),
                "L".repeat(162)
            )),
            output: Some("out".into()),
            error: Some(ExecutionError {
                name: "E".into(),
                message: format!(
                    "{}{}<{}",
                    "\u{2028}<".repeat(13),
                    marker(1947),
                    "\u{2028}<".repeat(13)
                ),
                traceback: Some("tb".into()),
            }),
            truncated: true,
            ..Default::default()
        }
    );
}

fn text() -> impl Strategy<Value = String> {
    // Heavy on the characters that grow most when stored.
    prop::collection::vec(
        prop_oneof![
            Just('<'),
            Just('\u{2028}'),
            Just('\u{1}'),
            Just('"'),
            Just('a'),
            Just('é'),
            any::<char>()
        ],
        0..4000,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_status_fits_its_budget(
        logs in text(),
        output in prop::option::of(text()),
        message in text(),
        traceback in text(),
        condition_message in text(),
        answer in prop::option::of(text()),
        budget in 600usize..20_000,
    ) {
        let status = ExecutionStatus {
            conditions: vec![condition(&condition_message)],
            attempt_id: Some("00000000000000aa".into()),
            logs: Some(logs),
            output,
            final_answer: answer.map(|a| format!("safe:{a}")),
            error: Some(ExecutionError { name: "ValueError".into(), message, traceback: Some(traceback) }),
            duration_millis: Some(12),
            ..Default::default()
        };
        let fitted = fit(status.clone(), budget);
        prop_assert!(status_len(&fitted) <= budget, "{} > {budget}", status_len(&fitted));
        prop_assert_eq!(fitted.truncated, status_len(&status) > budget);
        if status_len(&status) <= budget {
            prop_assert_eq!(fitted, status);
        }
    }
}
