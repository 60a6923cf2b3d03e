//! A claim ([`Claim`]) and the marks it leaves: on the member once taken (its claimer, as
//! annotation and label; no pool label; the claimer as its owner), on the claimer once recorded
//! (`status.claimedMember` and the sandbox, with its Ready) and once settled (its finalizer, and
//! the record's copy in its annotations, which survives a lost status). Every mark is written from
//! here and read back through here; [`first`] decides what a claimer's reconcile does before its
//! step.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::handover::{AfterClaim, after_claim};
use crate::{
    controller::executor::step::Step,
    crd::{
        BriqExecutor, CLAIMED_BY_ANNOTATION, CLAIMED_BY_LABEL, CLAIMED_MEMBER_ANNOTATION,
        CLASS_ANNOTATION, FINALIZER, POOL_LABEL, SANDBOX_ID_ANNOTATION,
    },
};

/// A claim as the claimer records it: the member, its sandbox, and the class the sandbox was
/// made under (whose key is the claimer's from now on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub member: String,
    pub sandbox: String,
    pub class: Option<String>,
}

impl Claim {
    /// `claimer` as it reads once settled, for what depends on the record before that (its key).
    pub fn applied_to(&self, claimer: &BriqExecutor) -> BriqExecutor {
        let mut claimer = claimer.clone();
        let annotations = claimer.annotations_mut();
        annotations.insert(CLAIMED_MEMBER_ANNOTATION.into(), self.member.clone());
        annotations.insert(SANDBOX_ID_ANNOTATION.into(), self.sandbox.clone());
        if let Some(class) = &self.class {
            annotations.insert(CLASS_ANNOTATION.into(), class.clone());
        }
        claimer
    }

    /// The write that settles the claim on `claimer`, conditional on the version it was read
    /// at: its finalizer and the record's annotations.
    pub fn settling(&self, claimer: &BriqExecutor) -> serde_json::Value {
        let mut finalizers = claimer.finalizers().to_vec();
        if !claimer.holds_finalizer() {
            finalizers.push(FINALIZER.to_owned());
        }
        json!({ "metadata": {
            "resourceVersion": claimer.resource_version(),
            "finalizers": finalizers,
            "annotations": {
                CLAIMED_MEMBER_ANNOTATION: self.member,
                SANDBOX_ID_ANNOTATION: self.sandbox,
                CLASS_ANNOTATION: self.class,
            },
        } })
    }
}

/// The write that takes `member` for `claimer`, conditional on the member's version (so exactly
/// one claimer wins it): its claimer as annotation and label (listed by it after a write whose
/// outcome is unknown), no pool label (the pool counts it no more), and the claimer as its owner
/// (deleting the pool leaves it alone; deleting the claimer deletes it).
pub fn taking(claimer: &BriqExecutor, member: &BriqExecutor) -> serde_json::Value {
    let uid = claimer.uid().unwrap_or_default();
    let owner: Option<OwnerReference> = claimer.controller_owner_ref(&()).map(|mut owner| {
        owner.block_owner_deletion = Some(true);
        owner
    });
    json!({
        "metadata": {
            "resourceVersion": member.resource_version(),
            "annotations": { CLAIMED_BY_ANNOTATION: uid },
            "labels": { POOL_LABEL: null, CLAIMED_BY_LABEL: uid },
            "ownerReferences": [owner],
        }
    })
}

/// Whether `member` is taken by the claimer with `uid` and live.
pub fn taken_by(member: &BriqExecutor, uid: &str) -> bool {
    member.claimed_by() == Some(uid) && member.metadata.deletion_timestamp.is_none()
}

/// Whether `claimer` holds its finalizer and the record of `member` in its annotations.
pub fn settled(claimer: &BriqExecutor, member: &str) -> bool {
    claimer.holds_finalizer()
        && claimer
            .annotations()
            .get(CLAIMED_MEMBER_ANNOTATION)
            .is_some_and(|annotated| annotated == member)
}

/// The member a live claimer records in its status without its finalizer and the record's
/// annotations yet: the write after its Ready did not land (a crash, an error) or is not in the
/// cache yet.
pub fn unsettled_member(claimer: &BriqExecutor) -> Option<&str> {
    if claimer.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let member = claimer.status.as_ref()?.claimed_member.as_deref()?;
    (!settled(claimer, member)).then_some(member)
}

/// What a reconcile of an executor does before its step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum First {
    /// Nothing before this long ([`AfterClaim::Recheck`]).
    Recheck(Duration),
    /// Settle the claim the claimer records of this member.
    Settle(String),
    /// Take a member: a claimer holds nothing of its own until it takes one (whose own finalizer
    /// guards the member's sandbox), so its finalizer comes after the record of the claim and
    /// its Ready — two writes to a claim's Ready.
    Claim,
    /// The step, through the finalizer (drain and cleanup on deletion).
    Step,
}

/// What `executor` (whose step is `step`) does first, reported Ready and settled by this
/// process `reported_since` ago, probed every `probe_interval`; and whether this process's
/// handover to it is over ([`after_claim`]).
pub fn first(
    executor: &BriqExecutor,
    step: &Step,
    reported_since: Option<Duration>,
    probe_interval: Duration,
) -> (First, bool) {
    let deleting = executor.metadata.deletion_timestamp.is_some();
    let mut handover_over = false;
    let mut settle = None;
    if executor.spec.pool_ref.is_some() {
        let unsettled = unsettled_member(executor);
        let after = after_claim(reported_since, step, unsettled.is_some(), probe_interval);
        handover_over = after.1;
        match after.0 {
            AfterClaim::Recheck(recheck) if !deleting => {
                return (First::Recheck(recheck), handover_over);
            }
            AfterClaim::Settle => settle = unsettled.map(str::to_owned),
            AfterClaim::Recheck(_) | AfterClaim::Go => {}
        }
    }
    if matches!(step, Step::Claim) && !deleting && !executor.holds_finalizer() {
        return (First::Claim, handover_over);
    }
    match settle {
        Some(member) => (First::Settle(member), handover_over),
        None => (First::Step, handover_over),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claimer(metadata: serde_json::Value, status: serde_json::Value) -> BriqExecutor {
        let mut metadata = metadata;
        metadata["name"] = json!("agent");
        serde_json::from_value(json!({
            "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
            "metadata": metadata, "spec": { "poolRef": { "name": "fast" } }, "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_claimer_recorded_in_its_status_is_settled_until_it_holds_its_finalizer_and_the_record() {
        let recorded = json!({ "sandboxId": "bq_1", "claimedMember": "m1" });
        let annotated = |member: &str| json!({ CLAIMED_MEMBER_ANNOTATION: member });
        let cases = [
            (
                "the Ready's write landed, the one after it did not",
                json!({}),
                recorded.clone(),
                Some("m1"),
            ),
            (
                "its finalizer without the record's annotations",
                json!({ "finalizers": [FINALIZER] }),
                recorded.clone(),
                Some("m1"),
            ),
            (
                "the record's annotations without its finalizer",
                json!({ "annotations": annotated("m1") }),
                recorded.clone(),
                Some("m1"),
            ),
            (
                "annotations naming another member: the status's record wins",
                json!({ "finalizers": [FINALIZER], "annotations": annotated("m0") }),
                recorded.clone(),
                Some("m1"),
            ),
            (
                "settled",
                json!({ "finalizers": [FINALIZER], "annotations": annotated("m1") }),
                recorded.clone(),
                None,
            ),
            (
                "being deleted: no finalizer can be added, its member goes with it",
                json!({ "deletionTimestamp": "2026-12-07T00:00:00Z" }),
                recorded.clone(),
                None,
            ),
            (
                "recorded by the previous release, in its annotations only",
                json!({ "finalizers": [FINALIZER], "annotations": annotated("m1") }),
                json!({ "sandboxId": "bq_1" }),
                None,
            ),
            ("no claim recorded", json!({}), json!({}), None),
        ];
        for (name, metadata, status, expected) in cases {
            assert_eq!(
                unsettled_member(&claimer(metadata, status)),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn first_table() {
        let s = Duration::from_secs;
        let probe = Step::Probe {
            sandbox: "bq_1".into(),
        };
        let recorded = json!({ "sandboxId": "bq_1", "claimedMember": "m1" });
        let settled_claim = json!({
            "finalizers": [FINALIZER],
            "annotations": { CLAIMED_MEMBER_ANNOTATION: "m1" },
        });
        let deleting = json!({ "deletionTimestamp": "2026-12-07T00:00:00Z" });
        let mut unclaiming = claimer(json!({}), json!({}));
        unclaiming.spec.pool_ref = None;
        let cases = [
            (
                "no poolRef: its step",
                unclaiming,
                probe.clone(),
                None,
                (First::Step, false),
            ),
            (
                "a claimer without a finalizer: take a member first",
                claimer(json!({}), json!({})),
                Step::Claim,
                None,
                (First::Claim, false),
            ),
            (
                "a claimer deleted before its claim: the finalizer's path",
                claimer(deleting.clone(), json!({})),
                Step::Claim,
                None,
                (First::Step, false),
            ),
            (
                "recorded, not settled, the cache caught up: settle it",
                claimer(json!({}), recorded.clone()),
                probe.clone(),
                None,
                (First::Settle("m1".into()), true),
            ),
            (
                "recorded and reported a second ago: the cache may lag",
                claimer(json!({}), recorded.clone()),
                probe.clone(),
                Some(s(1)),
                (First::Recheck(s(4)), false),
            ),
            (
                "settled, reported ten seconds ago: the probe is not due",
                claimer(settled_claim, recorded.clone()),
                probe.clone(),
                Some(s(10)),
                (First::Recheck(s(20)), true),
            ),
            (
                "being deleted: no recheck holds its cleanup back",
                claimer(deleting, recorded),
                probe,
                Some(s(1)),
                (First::Step, true),
            ),
        ];
        for (name, executor, step, since, expected) in cases {
            assert_eq!(first(&executor, &step, since, s(30)), expected, "{name}");
        }
    }
}
