use super::*;

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + second).unwrap()
}

fn warm(second: i64) -> Claim {
    Claim {
        at: at(second),
        cold: false,
    }
}

fn bounds(min_ready: i32, max_ready: i32) -> Bounds {
    Bounds {
        min_ready,
        max_ready,
        window: Duration::from_secs(300),
    }
}

const REFILL: Duration = Duration::from_secs(5);

#[test]
fn demand_target_table() {
    let steady: Vec<i64> = (0..60).collect(); // one claim a second for a minute
    let burst: Vec<i64> = vec![100; 40]; // 40 claims in the same second
    // (case, bounds, claim times in seconds, now, members, claims in window, peak, recheck)
    type Case = (
        &'static str,
        Bounds,
        Vec<i64>,
        i64,
        i32,
        i32,
        i32,
        Option<u64>,
    );
    let cases: Vec<Case> = vec![
        (
            "no claims: minReady",
            bounds(2, 10),
            vec![],
            1000,
            2,
            0,
            0,
            None,
        ),
        (
            "no claims, no minimum: zero",
            bounds(0, 10),
            vec![],
            1000,
            0,
            0,
            0,
            None,
        ),
        (
            "one claim a second with a 5 s refill: six ready (claims stamped 5 s apart may have \
             come within 5 s: stamps are whole seconds)",
            bounds(0, 10),
            steady.clone(),
            60,
            6,
            60,
            6,
            Some(240),
        ),
        (
            "a burst: as many as it took, within maxReady",
            bounds(0, 30),
            burst.clone(),
            101,
            30,
            40,
            40,
            Some(299),
        ),
        (
            "the burst is kept for the whole window (the cooldown)",
            bounds(0, 100),
            burst.clone(),
            399,
            40,
            40,
            40,
            Some(1),
        ),
        (
            "a window after the burst: back to minReady",
            bounds(1, 100),
            burst,
            400,
            1,
            0,
            0,
            None,
        ),
        (
            "claims more than a refill apart need one member each time",
            bounds(0, 10),
            vec![0, 6, 12, 18],
            20,
            1,
            4,
            1,
            Some(280),
        ),
        (
            "claims stamped one refill apart count together",
            bounds(0, 10),
            vec![0, 5, 11],
            20,
            2,
            3,
            2,
            Some(280),
        ),
        (
            "claims just inside one refill count together",
            bounds(0, 10),
            vec![0, 4, 10],
            20,
            2,
            3,
            2,
            Some(280),
        ),
        (
            "a claim from the future (clock skew) is not counted yet",
            bounds(0, 10),
            vec![50],
            20,
            0,
            0,
            0,
            None,
        ),
        (
            "minReady above the peak holds",
            bounds(3, 10),
            vec![0],
            1,
            3,
            1,
            1,
            Some(299),
        ),
    ];
    for (case, bounds, claims, now, members, in_window, peak, recheck) in cases {
        let claims: Vec<Claim> = claims.into_iter().map(warm).collect();
        let target = demand_target(bounds, &claims, REFILL, at(now));
        assert_eq!(
            target,
            Target {
                members,
                seen: PoolDemand {
                    claims_in_window: in_window,
                    cold_in_window: 0,
                    peak_per_refill: peak,
                    refill_millis: 5000,
                },
                recheck: recheck.map(Duration::from_secs),
            },
            "{case}"
        );
    }
}

#[test]
fn the_refill_time_is_the_slowest_members_else_the_last_measured_else_a_default() {
    assert_eq!(refill_time(&[], None), DEFAULT_REFILL);
    assert_eq!(
        refill_time(&[], Some(Duration::from_secs(2))),
        Duration::from_secs(2)
    );
    assert_eq!(
        refill_time(
            &[(at(0), at(2)), (at(10), at(17)), (at(20), at(21))],
            Some(Duration::from_secs(30))
        ),
        Duration::from_secs(7)
    );
}

#[test]
fn a_burst_that_has_every_member_still_being_made_keeps_the_refill_it_measured() {
    // The fault a burst met: every Ready member claimed, the new ones not Ready yet, the rule
    // fell back to the 10 s default and the target swung, deleting members just made.
    let mut log = ClaimLog::default();
    assert_eq!(
        log.refill("ns/warm", &[(at(0), at(2))]),
        Duration::from_secs(2)
    );
    assert_eq!(log.refill("ns/warm", &[]), Duration::from_secs(2));
    assert_eq!(log.refill("ns/other", &[]), DEFAULT_REFILL);
    log.retain(&["ns/other".to_owned()].into());
    assert_eq!(
        log.refill("ns/warm", &[]),
        DEFAULT_REFILL,
        "a deleted pool's is forgotten"
    );
}

#[test]
fn a_burst_straddling_a_second_counts_as_one_with_a_sub_second_refill() {
    // Ten claims 100 ms apart from 0.5 s are stamped 0 (five) and 1 (five); members made in
    // 1.2 s measure 1 or 2 s. Either way the ten count together.
    let claims: Vec<Claim> = [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
        .into_iter()
        .map(warm)
        .collect();
    for refill in [Duration::from_millis(1200), Duration::from_secs(1)] {
        let target = demand_target(bounds(0, 10), &claims, refill, at(3));
        assert_eq!(target.members, 10, "{refill:?}");
    }
}

#[test]
fn bounds_come_from_the_spec_only_when_max_ready_is_set() {
    let spec = |value: serde_json::Value| -> BriqExecutorPoolSpec {
        serde_json::from_value(value).unwrap()
    };
    assert_eq!(
        Bounds::of(&spec(serde_json::json!({ "replicas": 3, "template": {} }))),
        None
    );
    assert_eq!(
        Bounds::of(&spec(serde_json::json!({
            "replicas": 3, "template": {}, "maxReady": 8, "minReady": 2, "demandWindowSeconds": 60,
        }))),
        Some(Bounds {
            min_ready: 2,
            max_ready: 8,
            window: Duration::from_secs(60)
        })
    );
    assert_eq!(
        Bounds::of(&spec(
            serde_json::json!({ "replicas": 3, "template": {}, "maxReady": 8 })
        )),
        Some(bounds(0, 8)),
        "minReady 0 and a 300 s window by default"
    );
}

#[test]
fn cold_claims_in_the_window_are_counted() {
    let claims = [
        Claim {
            at: at(0),
            cold: true,
        },
        warm(100),
        Claim {
            at: at(200),
            cold: true,
        },
    ];
    let target = demand_target(bounds(0, 10), &claims, REFILL, at(310));
    assert_eq!(
        (target.seen.claims_in_window, target.seen.cold_in_window),
        (2, 1),
        "the cold claim at 0 has left the window"
    );
}

#[test]
fn the_claim_log_keeps_deleted_claimers_for_the_window_and_forgets_older_ones() {
    let mut log = ClaimLog::default();
    let window = Duration::from_secs(60);
    let times = |claims: Vec<Claim>| {
        let mut times: Vec<(Timestamp, bool)> = claims.iter().map(|c| (c.at, c.cold)).collect();
        times.sort();
        times
    };
    let seen = log.record(
        "ns/warm",
        [("a".into(), warm(0)), ("b".into(), warm(10))],
        window,
        at(20),
    );
    assert_eq!(seen.len(), 2);
    // "a" was deleted: the cache shows only "b", now gone cold, and a new "c"; "a" still counts.
    let cold_b = Claim {
        at: at(10),
        cold: true,
    };
    let seen = log.record(
        "ns/warm",
        [("b".into(), cold_b), ("c".into(), warm(30))],
        window,
        at(30),
    );
    assert_eq!(
        times(seen),
        [(at(0), false), (at(10), true), (at(30), false)]
    );
    // Seen again without its fallback (a stale cache): it stays cold.
    let seen = log.record("ns/warm", [("b".into(), warm(10))], window, at(31));
    assert!(seen.iter().any(|c| c.at == at(10) && c.cold));
    // A window later, only "c" is left.
    let seen = log.record("ns/warm", [], window, at(80));
    assert_eq!(times(seen), [(at(30), false)]);
    let seen = log.record("ns/warm", [], window, at(200));
    assert!(seen.is_empty());
    assert_eq!(log.len(), 0, "an empty pool's log is dropped");
}
