use super::*;
use crate::controller::execution::fixtures::{at, order};

fn sibling(uid: &str, seconds: &str, name: &str, done: bool) -> Sibling {
    Sibling {
        uid: Some(uid.into()),
        order: order(seconds, name),
        done,
    }
}

#[test]
fn turn_table() {
    let me = order("10", "b");
    let myself = sibling("me", "10", "b", false);
    let cases: Vec<(&str, Vec<Sibling>, Timestamp, Turn)> = vec![
        ("alone", vec![myself.clone()], at("20"), Turn::Mine),
        (
            "an older one waits",
            vec![sibling("x", "09", "z", false), myself.clone()],
            at("20"),
            Turn::Behind,
        ),
        (
            "an older one finished",
            vec![sibling("x", "09", "z", true), myself.clone()],
            at("20"),
            Turn::Mine,
        ),
        (
            "same second, sorts first by name",
            vec![sibling("x", "10", "a", false)],
            at("20"),
            Turn::Behind,
        ),
        (
            "same second, sorts after: the second passes first",
            vec![sibling("x", "10", "c", false)],
            at("11"),
            Turn::BurstArriving(Duration::from_secs(1)),
        ),
        (
            "same second, passed",
            vec![sibling("x", "10", "c", false)],
            at("12"),
            Turn::Mine,
        ),
        (
            "a later second does not hold it back",
            vec![sibling("x", "11", "a", false)],
            at("10"),
            Turn::Mine,
        ),
        (
            "a listed sibling without a creation time sorts first",
            vec![Sibling {
                uid: Some("x".into()),
                order: (None, "z".into()),
                done: false,
            }],
            at("20"),
            Turn::Behind,
        ),
    ];
    for (name, siblings, now, expected) in cases {
        assert_eq!(turn(Some("me"), &me, &siblings, now), expected, "{name}");
    }
}
