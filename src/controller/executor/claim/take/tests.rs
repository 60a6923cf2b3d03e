use super::*;

fn spec(value: serde_json::Value) -> BriqExecutorSpec {
    serde_json::from_value(value).unwrap()
}

#[test]
fn pool_mismatch_table() {
    let template = spec(serde_json::json!({
        "image": "reg/briq-sandbox:1", "sleep": "2h", "packages": ["pandas==2.2.3"],
        "apiKeySecretRef": { "name": "team-key" },
    }));
    let cases: [(&str, serde_json::Value, Vec<&str>); 8] = [
        (
            "every shaping field left unset: the template's",
            serde_json::json!({ "apiKeySecretRef": { "name": "team-key" } }),
            vec![],
        ),
        (
            "equal to the template",
            serde_json::json!({
                "image": "reg/briq-sandbox:1", "sleep": "2h", "packages": ["pandas==2.2.3"],
                "apiKeySecretRef": { "name": "team-key" },
            }),
            vec![],
        ),
        (
            "per-action fields are the claimer's own",
            serde_json::json!({
                "executionTimeoutSeconds": 5, "maxQueuedExecutions": 3,
                "idleTimeoutSeconds": 60, "apiKeySecretRef": { "name": "team-key" },
            }),
            vec![],
        ),
        (
            "another image",
            serde_json::json!({ "image": "other:1", "apiKeySecretRef": { "name": "team-key" } }),
            vec!["image"],
        ),
        (
            "other packages and size",
            serde_json::json!({
                "packages": ["numpy"], "size": "large",
                "apiKeySecretRef": { "name": "team-key" },
            }),
            vec!["size", "packages"],
        ),
        (
            // The member's sandbox was made with the template's key: no default stands in.
            "no key where the template has one",
            serde_json::json!({}),
            vec!["apiKeySecretRef"],
        ),
        (
            "another key",
            serde_json::json!({ "apiKeySecretRef": { "name": "mine" } }),
            vec!["apiKeySecretRef"],
        ),
        (
            "a class where the template brings its own key",
            serde_json::json!({ "className": "standard" }),
            vec!["apiKeySecretRef", "className"],
        ),
    ];
    for (name, claimer, expected) in cases {
        assert_eq!(pool_mismatch(&spec(claimer), &template), expected, "{name}");
    }
    let classed = spec(serde_json::json!({ "className": "standard" }));
    for (claimer, expected) in [
        (serde_json::json!({ "className": "standard" }), vec![]),
        (
            serde_json::json!({ "className": "premium" }),
            vec!["className"],
        ),
        // The member's sandbox was made with the class's key: no default stands in.
        (serde_json::json!({}), vec!["className"]),
    ] {
        assert_eq!(
            pool_mismatch(&spec(claimer.clone()), &classed),
            expected,
            "{claimer}"
        );
    }
}

#[test]
fn claimers_spread_over_the_ready_members_and_each_tries_them_all() {
    let members = ["a", "b", "c", "d"];
    assert_eq!(take_order::<&str>(&[], "uid"), Vec::<&str>::new());
    let mut firsts = std::collections::BTreeSet::new();
    for uid in [
        "3f1c", "77aa", "b2d0", "0c9e", "e514", "5a5a", "91f3", "c0de",
    ] {
        let order = take_order(&members, uid);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, members, "{uid} tries every member once");
        let start = order[0];
        let rotation: Vec<&str> = members
            .iter()
            .cycle()
            .skip_while(|m| **m != start)
            .take(4)
            .copied()
            .collect();
        assert_eq!(
            order, rotation,
            "{uid} keeps the pool's order from where it starts"
        );
        firsts.insert(start);
    }
    assert!(
        firsts.len() >= 3,
        "claimers start at different members: {firsts:?}"
    );
}

#[test]
fn claim_plan_table() {
    let pool_ref = |after: u32| PoolRef {
        name: "fast".into(),
        cold_create_after_seconds: after,
        env: vec![],
    };
    let pool = |replicas: i32| -> BriqExecutorPool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutorPool",
            "metadata": { "name": "fast", "namespace": "team" },
            "spec": { "replicas": replicas, "template": {} },
        }))
        .unwrap()
    };
    let by_demand = |target: i32| -> BriqExecutorPool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutorPool",
            "metadata": { "name": "fast", "namespace": "team" },
            "spec": { "replicas": 0, "maxReady": 5, "template": {} },
            "status": { "targetReplicas": target },
        }))
        .unwrap()
    };
    let claimer = spec(serde_json::json!({}));
    let secs = std::time::Duration::from_secs;
    let members = || vec!["fast-a".to_string(), "fast-b".to_string()];
    let waiting = |recheck| ClaimPlan::Wait {
        message: "waiting for a Ready member of BriqExecutorPool fast; creating a sandbox \
                  of its own after 30s"
            .into(),
        recheck,
    };
    let cases = [
        (
            "ready members: take them in order",
            Some(pool(2)),
            members(),
            secs(0),
            ClaimPlan::Take(members()),
        ),
        (
            "no pool: at once",
            None,
            vec![],
            secs(0),
            ClaimPlan::FallBack("BriqExecutorPool fast does not exist".into()),
        ),
        (
            "scaled to zero: at once",
            Some(pool(0)),
            vec![],
            secs(0),
            ClaimPlan::FallBack("BriqExecutorPool fast is scaled to zero".into()),
        ),
        (
            "sized by demand to zero: at once",
            Some(by_demand(0)),
            vec![],
            secs(0),
            ClaimPlan::FallBack("BriqExecutorPool fast is scaled to zero".into()),
        ),
        (
            "sized by demand above zero (whatever its replicas): wait",
            Some(by_demand(2)),
            vec![],
            secs(10),
            waiting(CLAIM_RECHECK),
        ),
        (
            "none ready yet: wait",
            Some(pool(2)),
            vec![],
            secs(10),
            waiting(CLAIM_RECHECK),
        ),
        (
            "the last moments of the wait are not overshot",
            Some(pool(2)),
            vec![],
            secs(30) - std::time::Duration::from_millis(100),
            waiting(std::time::Duration::from_millis(100)),
        ),
        (
            "waited long enough",
            Some(pool(2)),
            vec![],
            secs(30),
            ClaimPlan::FallBack("no Ready member of BriqExecutorPool fast within 30s".into()),
        ),
    ];
    for (name, pool, ready, waited, expected) in cases {
        assert_eq!(
            claim_plan(&claimer, &pool_ref(30), pool.as_ref(), ready, waited),
            expected,
            "{name}"
        );
    }
    let odd = spec(serde_json::json!({ "image": "other:1" }));
    assert_eq!(
        claim_plan(&odd, &pool_ref(30), Some(&pool(2)), members(), secs(0)),
        ClaimPlan::Mismatch(
            "image differ from the template of BriqExecutorPool fast; leave them unset or \
             equal to the template's, in a new BriqExecutor"
                .into()
        ),
        "a mismatch wins over ready members"
    );
}

/// One plan of each kind: take, wait, fall back, mismatch.
fn plans() -> [ClaimPlan; 4] {
    [
        ClaimPlan::Take(vec!["m".into()]),
        ClaimPlan::Wait {
            message: "w".into(),
            recheck: CLAIM_RECHECK,
        },
        ClaimPlan::FallBack("gone".into()),
        ClaimPlan::Mismatch("image".into()),
    ]
}

#[test]
fn a_claim_asks_the_api_server_only_where_the_cache_cannot_decide() {
    let [take, wait, fall_back, mismatch] = plans();
    let cases = [
        (
            "taking a member: conditional writes",
            &take,
            false,
            ClaimLookup::Cache,
        ),
        ("waiting", &wait, false, ClaimLookup::Cache),
        ("a mismatch", &mismatch, false, ClaimLookup::Cache),
        (
            "a fallback cannot be taken back",
            &fall_back,
            false,
            ClaimLookup::AskTheApiServer,
        ),
        (
            "a member's write ended without an answer: it may have won",
            &take,
            true,
            ClaimLookup::AskTheApiServer,
        ),
        ("even to wait", &wait, true, ClaimLookup::AskTheApiServer),
    ];
    for (name, plan, uncertain, expected) in cases {
        assert_eq!(claim_lookup(plan, uncertain), expected, "{name}");
    }
}

#[test]
fn a_claim_reads_the_claimers_secrets_only_when_it_hands_over_makes_a_sandbox_or_begins_to_wait() {
    use ClaimLookup::{AskTheApiServer, Cache};
    let [take, wait, fall_back, mismatch] = plans();
    let cases = [
        ("taking a member", &take, Cache, true, true),
        (
            "falling back to a sandbox of its own",
            &fall_back,
            AskTheApiServer,
            true,
            true,
        ),
        ("beginning to wait", &wait, Cache, false, true),
        ("a recheck while waiting", &wait, Cache, true, false),
        (
            "waiting after a write without an answer (it may resume a handover)",
            &wait,
            AskTheApiServer,
            true,
            true,
        ),
        ("a mismatch (final)", &mismatch, Cache, false, false),
    ];
    for (name, plan, lookup, waiting_already, expected) in cases {
        assert_eq!(reads_env(plan, lookup, waiting_already), expected, "{name}");
    }
}
