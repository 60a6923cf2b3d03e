//! Scenario 8's floor for the burst of claims: what the API server alone takes for the same
//! claim-shaped requests, sent directly by the benchmark in a namespace no operator watches —
//! for each of N claimers at once, its create, the take of its member (a merge patch conditional
//! on the member's version, as the operator's) and its record with Ready (a server-side apply of
//! its status, conditional on its version). Timed from the create call to the record's answer,
//! as the burst is timed from the create call to Ready: the burst over this floor travels
//! between machines where the absolute time does not.

use std::time::Instant;

use futures::{StreamExt as _, TryStreamExt as _, stream};
use kube::{
    Api, Client, ResourceExt as _,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

use super::objects;
use briq_operator::crd::{
    BriqExecutor, CLAIMED_BY_ANNOTATION, CLAIMED_BY_LABEL, EXECUTOR_MANAGER, POOL_LABEL,
};

/// Where the floor is measured: no controller is started for it.
pub const NAMESPACE: &str = "bench-pool-burst-floor";

/// The milliseconds of each of `claims` claims made at once, directly.
pub async fn measure(admin: &Client, claims: usize) -> anyhow::Result<Vec<f64>> {
    let executors: Api<BriqExecutor> = Api::namespaced(admin.clone(), NAMESPACE);
    let members: Vec<BriqExecutor> = stream::iter(0..claims)
        .map(|i| {
            let executors = executors.clone();
            async move {
                let member = objects::executor(&format!("member-{i:03}"), json!({}))?;
                let made = executors.create(&PostParams::default(), &member).await?;
                Ok::<_, anyhow::Error>(made)
            }
        })
        .buffer_unordered(16)
        .try_collect()
        .await?;
    let timed: Vec<f64> = stream::iter(members.into_iter().enumerate())
        .map(|(i, member)| {
            let executors = executors.clone();
            async move { claim(&executors, i, &member).await }
        })
        .buffer_unordered(claims.max(1))
        .try_collect()
        .await?;
    Ok(timed)
}

/// One claim's requests, as the operator sends them for a warm claim; its milliseconds.
async fn claim(
    executors: &Api<BriqExecutor>,
    i: usize,
    member: &BriqExecutor,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let claimer = objects::executor(
        &format!("claim-{i:03}"),
        json!({ "poolRef": { "name": "floor" } }),
    )?;
    let claimer = executors.create(&PostParams::default(), &claimer).await?;
    let uid = claimer.uid().unwrap_or_default();
    let take = json!({
        "metadata": {
            "resourceVersion": member.resource_version(),
            "annotations": { CLAIMED_BY_ANNOTATION: uid },
            "labels": { POOL_LABEL: null, CLAIMED_BY_LABEL: uid },
            "ownerReferences": [{
                "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
                "name": claimer.name_any(), "uid": uid,
                "controller": true, "blockOwnerDeletion": true,
            }],
        }
    });
    executors
        .patch(
            &member.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&take),
        )
        .await?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let record = json!({
        "apiVersion": "briq.cloud/v1alpha1",
        "kind": "BriqExecutor",
        "metadata": { "resourceVersion": claimer.resource_version() },
        "status": {
            "conditions": [
                { "type": "Ready", "status": "True", "reason": "KernelReady",
                  "message": "the kernel answers", "lastTransitionTime": now },
                { "type": "Stalled", "status": "False", "reason": "KernelReady",
                  "message": "the kernel answers", "lastTransitionTime": now },
            ],
            "sandboxId": format!("bq_floor{i:03}"),
            "claimedMember": member.name_any(),
            "readyTime": now,
        }
    });
    let params = PatchParams::apply(EXECUTOR_MANAGER).force();
    executors
        .patch_status(&claimer.name_any(), &params, &Patch::Apply(&record))
        .await?;
    Ok(started.elapsed().as_secs_f64() * 1000.0)
}
