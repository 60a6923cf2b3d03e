use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::controller::executor::fixtures::{ready, status};

#[test]
fn idleness_table() {
    let at = |seconds: i64| Timestamp::from_second(1_800_000_000 + seconds).unwrap();
    let time = |seconds: i64| Some(Time(at(seconds)));
    let ready_at_0 = BriqExecutorStatus {
        ready_time: time(0),
        ..status(&ready(), Some("bq_1"))
    };
    let counted_at_50 = BriqExecutorStatus {
        last_execution_time: time(50),
        ..ready_at_0.clone()
    };
    let idle = Activity::default();
    let created_at_80 = Activity {
        last: Some(at(80)),
        unfinished: 0,
    };
    let waiting = Activity {
        last: Some(at(0)),
        unfinished: 1,
    };
    let secs = std::time::Duration::from_secs;
    let expired = Idleness::Expired {
        message: "no Execution for 60s (idleTimeoutSeconds): expired, its sandbox destroyed; \
                  create a new BriqExecutor"
            .into(),
    };
    let cases = [
        ("no timeout", None, &ready_at_0, idle, 1000, Idleness::InUse),
        (
            "an Execution waits or runs, however long",
            Some(60),
            &ready_at_0,
            waiting,
            1000,
            Idleness::InUse,
        ),
        (
            "idle since ready, not long enough",
            Some(60),
            &ready_at_0,
            idle,
            45,
            Idleness::IdleFor {
                remaining: secs(15),
            },
        ),
        (
            "idle since ready for the timeout",
            Some(60),
            &ready_at_0,
            idle,
            60,
            expired.clone(),
        ),
        (
            "the counted last Execution restarts the clock",
            Some(60),
            &counted_at_50,
            idle,
            100,
            Idleness::IdleFor {
                remaining: secs(10),
            },
        ),
        (
            "a cached Execution later than the counts (they lag) wins",
            Some(60),
            &counted_at_50,
            created_at_80,
            130,
            Idleness::IdleFor {
                remaining: secs(10),
            },
        ),
        (
            "every source older than the timeout",
            Some(60),
            &counted_at_50,
            created_at_80,
            140,
            expired,
        ),
        (
            "a time ahead of this clock (skew) counts as now",
            Some(60),
            &counted_at_50,
            Activity {
                last: Some(at(500)),
                unfinished: 0,
            },
            400,
            Idleness::IdleFor {
                remaining: secs(60),
            },
        ),
        (
            "ready without a recorded time: the clock starts now",
            Some(60),
            &status(&ready(), Some("bq_1")),
            idle,
            1000,
            Idleness::IdleFor {
                remaining: secs(60),
            },
        ),
    ];
    for (name, timeout, status, activity, now, expected) in cases {
        assert_eq!(
            idleness(timeout, status, activity, at(now)),
            expected,
            "{name}"
        );
    }
}
