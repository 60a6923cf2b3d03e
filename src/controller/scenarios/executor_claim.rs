//! A claimer (a `BriqExecutor` with `spec.poolRef`) through the real `executor::reconcile`: it
//! takes a Ready member of its pool and is Ready after two writes, the member's take and its own
//! status recording the member with its Ready; one more write settles it (finalizer and the
//! record's annotations), and no briq call is made on the way.

use std::{sync::Arc, time::Duration};

use http::Method;
use kube::runtime::controller::Action;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::{
    api_server::MERGE_PATCH,
    world::{
        EXECUTOR, EXECUTOR_PATH, EXECUTOR_STATUS_PATH, EXECUTOR_UID, MEMBER, MEMBER_PATH, POOL,
        SANDBOX, World, briq_with_member_sandbox, new_executor, pool, ready_member, to_json,
    },
};
use crate::{
    controller::executor,
    crd::{
        BriqExecutor, CLAIMED_BY_ANNOTATION, CLAIMED_BY_LABEL, CLAIMED_MEMBER_ANNOTATION,
        CLASS_ANNOTATION, EXECUTOR_MANAGER, FINALIZER, POOL_LABEL, SANDBOX_ID_ANNOTATION,
    },
};

/// A new claimer of [`POOL`], as `kubectl apply` makes it (no finalizer), at resourceVersion "1".
fn new_claimer() -> BriqExecutor {
    let mut claimer = new_executor("1");
    claimer.spec.pool_ref =
        Some(serde_json::from_value(json!({ "name": POOL })).expect("a poolRef"));
    claimer
}

/// `value` at `pointer`, which must be a string (a timestamp the code under test took), taken
/// out so that the rest can be compared exactly.
fn take_string(value: &mut Value, pointer: &str) -> String {
    let taken = value
        .pointer_mut(pointer)
        .unwrap_or_else(|| panic!("no {pointer}"))
        .take();
    taken
        .as_str()
        .unwrap_or_else(|| panic!("{pointer} is {taken}"))
        .to_owned()
}

#[tokio::test]
async fn a_warm_claim_takes_a_ready_member_and_is_ready_after_two_writes_without_a_briq_call() {
    let (mut world, mut server) = World::new(briq_with_member_sandbox());
    let pool = pool();
    let member = ready_member(&pool, "7");
    let claimer = new_claimer();
    world.cache_pool(&pool);
    world.cache_executor(&member);
    world.cache_executor(&claimer);
    let (objects, written) = oneshot::channel();
    let verifier = {
        let (member, claimer) = (member.clone(), claimer.clone());
        tokio::spawn(async move {
            // Write 1, the take: the member becomes the claimer's (annotated, labelled and owned
            // as its, out of the pool's count), conditional on the version the cache showed.
            let mut taken = member.clone();
            taken.metadata.resource_version = Some("8".into());
            let take = server
                .expect(Method::PATCH, MEMBER_PATH)
                .await
                .reply(to_json(&taken));
            assert_eq!(take.content_type.as_deref(), Some(MERGE_PATCH));
            assert_eq!(
                take.body,
                json!({"metadata": {
                    "resourceVersion": "7",
                    "annotations": {CLAIMED_BY_ANNOTATION: EXECUTOR_UID},
                    "labels": {POOL_LABEL: null, CLAIMED_BY_LABEL: EXECUTOR_UID},
                    "ownerReferences": [{
                        "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
                        "name": EXECUTOR, "uid": EXECUTOR_UID,
                        "controller": true, "blockOwnerDeletion": true,
                    }],
                }})
            );
            // Write 2, the record with its Ready: the member and its sandbox, in the claimer's
            // status, conditional on the claimer's version. Ready here.
            let record = server.expect(Method::PATCH, EXECUTOR_STATUS_PATH).await;
            let mut recorded = claimer.clone();
            recorded.metadata.resource_version = Some("2".into());
            recorded.status =
                Some(serde_json::from_value(record.seen.body["status"].clone()).expect("a status"));
            let record = record.reply(to_json(&recorded));
            record.assert_applied_by(EXECUTOR_MANAGER);
            let mut body = record.body.clone();
            let ready_time = take_string(&mut body, "/status/readyTime");
            let ready_since = take_string(&mut body, "/status/conditions/0/lastTransitionTime");
            let stalled_since = take_string(&mut body, "/status/conditions/1/lastTransitionTime");
            assert_eq!([&ready_since, &stalled_since], [&ready_time, &ready_time]);
            assert_eq!(
                body,
                json!({
                    "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
                    "metadata": {"resourceVersion": "1"},
                    "status": {
                        "observedGeneration": 1,
                        "conditions": [
                            {"type": "Ready", "status": "True", "reason": "KernelReady",
                             "message": "the kernel answers: handed over from BriqExecutorPool \
                                         fast (executor fast-x7k2q)",
                             "observedGeneration": 1, "lastTransitionTime": null},
                            {"type": "Stalled", "status": "False", "reason": "KernelReady",
                             "message": "", "observedGeneration": 1,
                             "lastTransitionTime": null},
                        ],
                        "sandboxId": SANDBOX,
                        // The member's, not the claim's: the sandbox is as old as it is.
                        "sandboxCreatedTime": "2026-12-07T07:00:01Z",
                        "readyTime": null,
                        "claimedMember": MEMBER,
                    },
                }),
                "{record:#?}"
            );
            // Then, off the path to Ready: the finalizer and the record's copy in the
            // annotations, conditional on the version the record wrote.
            let mut settled = recorded.clone();
            settled.metadata.resource_version = Some("3".into());
            settled.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
            settled.metadata.annotations = Some(
                [
                    (CLAIMED_MEMBER_ANNOTATION.to_owned(), MEMBER.to_owned()),
                    (SANDBOX_ID_ANNOTATION.to_owned(), SANDBOX.to_owned()),
                ]
                .into(),
            );
            let settle = server
                .expect(Method::PATCH, EXECUTOR_PATH)
                .await
                .reply(to_json(&settled));
            assert_eq!(settle.content_type.as_deref(), Some(MERGE_PATCH));
            assert_eq!(
                settle.body,
                json!({"metadata": {
                    "resourceVersion": "2",
                    "finalizers": [FINALIZER],
                    "annotations": {
                        CLAIMED_MEMBER_ANNOTATION: MEMBER,
                        SANDBOX_ID_ANNOTATION: SANDBOX,
                        CLASS_ANNOTATION: null,
                    },
                }})
            );
            objects
                .send((taken, recorded, settled))
                .unwrap_or_else(|_| panic!("the scenario is gone"));
            // Nothing more: no Event for a claim (its Ready says where the kernel came from),
            // and the reconciles that see the writes in the cache write nothing again.
            server.done().await;
        })
    };
    let claimed = executor::reconcile(Arc::new(claimer), world.executor_ctx()).await;
    let Ok((taken, recorded, settled)) = written.await else {
        // The verifier failed before the claim's third write: its failure is the scenario's.
        world.finish(verifier).await;
        panic!("the verifier ended without the claim's three writes");
    };
    // The watch delivers the take, then the record with its Ready before what settles it: a
    // reconcile in between neither settles again nor goes back to the claim.
    world.cache_executor(&taken);
    world.cache_executor(&recorded);
    let between = executor::reconcile(Arc::new(recorded), world.executor_ctx()).await;
    world.cache_executor(&settled);
    let after = executor::reconcile(Arc::new(settled), world.executor_ctx()).await;
    let calls = world.finish(verifier).await;

    assert_eq!(
        claimed.unwrap(),
        Action::requeue(Duration::from_secs(30)),
        "Ready on the member's answering kernel: probed when the probe interval is up"
    );
    for (name, action) in [("between", between), ("after", after)] {
        let action = action.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_ne!(action, Action::await_change(), "{name}: a bounded recheck");
    }
    assert_eq!(
        calls,
        [],
        "no poolRef.env: the member's kernel is taken as it is, without a briq call"
    );
}
