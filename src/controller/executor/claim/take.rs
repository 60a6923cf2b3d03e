//! Claiming: a claimer (an executor with a `poolRef`) takes a Ready member of its pool and the
//! member's sandbox and kernel with it, else waits, else falls back to a sandbox of its own
//! ([`claim_plan`]). Taking a member is the first half of a handover; the claimer's record of
//! it is the second (record.rs), and this process's handovers in between are remembered
//! in handover.rs.

use kube::{
    Api, ResourceExt,
    api::ListParams,
    runtime::{controller::Action, events::EventType, reflector::ObjectRef},
};
use serde_json::json;

use super::marks::{taken_by, taking};
use crate::controller::executor::{
    actor::Actor,
    admit::key_recheck,
    status::{state, status_of},
};
use crate::{
    bridge::session::ClaimEnv,
    briq::SandboxApi,
    controller::{
        context::{Error, Result},
        index,
        recheck::CLAIM_RECHECK,
        recheck::CONFLICT_RECHECK,
        requeue::waited,
    },
    crd::{
        BriqExecutor, BriqExecutorPool, BriqExecutorSpec, CLAIMED_BY_LABEL,
        POOL_FALLBACK_ANNOTATION, PoolRef, conditions, reasons::ExecutorReason,
    },
    metrics::ClaimOutcome,
};

/// The fields of a claimer's spec that shape its sandbox and differ from its pool's template
/// (a field left at its default takes the template's value): with any, it claims nothing.
fn pool_mismatch(claimer: &BriqExecutorSpec, template: &BriqExecutorSpec) -> Vec<&'static str> {
    let unset = BriqExecutorSpec::default_for_comparison();
    // (its name, the field, its default). The member's sandbox was made with the template's
    // key and class: no default stands in for them.
    macro_rules! field {
        ($name:literal, $field:ident, $default:expr) => {
            ($name, differs(&claimer.$field, &template.$field, $default))
        };
    }
    let fields = [
        field!("image", image, Some(&unset.image)),
        field!("size", size, Some(&None)),
        field!("sleep", sleep, Some(&unset.sleep)),
        field!(
            "setupTimeoutSeconds",
            setup_timeout_seconds,
            Some(&unset.setup_timeout_seconds)
        ),
        field!("packages", packages, Some(&None)),
        field!("env", env, Some(&None)),
        field!("apiKeySecretRef", api_key_secret_ref, None),
        field!("className", class_name, None),
    ];
    fields
        .into_iter()
        .filter_map(|(name, differs)| differs.then_some(name))
        .collect()
}

/// Whether a claimer's field keeps it from the template's sandbox: it is not the template's,
/// nor left at `default` (a field with no default must be the template's).
fn differs<T: PartialEq>(claimer: &T, template: &T, default: Option<&T>) -> bool {
    claimer != template && default.is_none_or(|default| claimer != default)
}

/// What a claimer does now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ClaimPlan {
    /// Try these Ready members, in this order, until one is won.
    Take(Vec<String>),
    /// No Ready member: wait, and look again after this long.
    Wait {
        message: String,
        recheck: std::time::Duration,
    },
    /// Stop waiting: create a sandbox of its own, for this reason.
    FallBack(String),
    /// Its spec cannot take the template's sandbox (final).
    Mismatch(String),
}

fn claim_plan(
    claimer: &BriqExecutorSpec,
    pool_ref: &PoolRef,
    pool: Option<&BriqExecutorPool>,
    ready_members: Vec<String>,
    waited: std::time::Duration,
) -> ClaimPlan {
    let name = &pool_ref.name;
    let Some(pool) = pool else {
        return ClaimPlan::FallBack(format!("BriqExecutorPool {name} does not exist"));
    };
    let mismatch = pool_mismatch(claimer, &pool.spec.template);
    if !mismatch.is_empty() {
        return ClaimPlan::Mismatch(format!(
            "{} differ from the template of BriqExecutorPool {name}; leave them unset or equal \
             to the template's, in a new BriqExecutor",
            mismatch.join(", ")
        ));
    }
    if !ready_members.is_empty() {
        return ClaimPlan::Take(ready_members);
    }
    if pool.scaled_to_zero() {
        return ClaimPlan::FallBack(format!("BriqExecutorPool {name} is scaled to zero"));
    }
    let patience = std::time::Duration::from_secs(pool_ref.cold_create_after_seconds.into());
    if waited >= patience {
        return ClaimPlan::FallBack(format!(
            "no Ready member of BriqExecutorPool {name} within {}s",
            patience.as_secs()
        ));
    }
    ClaimPlan::Wait {
        message: format!(
            "waiting for a Ready member of BriqExecutorPool {name}; creating a sandbox of its own \
             after {}s",
            patience.as_secs()
        ),
        recheck: CLAIM_RECHECK.min(patience - waited),
    }
}

/// Where a claim's knowledge of the claimer's handovers comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClaimLookup {
    /// The executor cache and this process's own handovers decide.
    Cache,
    /// A list of the members labelled as the claimer's: a consistent read.
    AskTheApiServer,
}

/// Whether a claim may go by the cache (`plan`, and whether an earlier write of a member to
/// this claimer ended without an answer): the API server is asked only where the cache cannot
/// decide. A write without an answer may have won, and the watch may not show it yet; a fallback
/// makes a sandbox, which cannot be taken back. Taking a member needs no read: its write is
/// conditional, and the claimer's record is too.
fn claim_lookup(plan: &ClaimPlan, uncertain_write: bool) -> ClaimLookup {
    if uncertain_write || matches!(plan, ClaimPlan::FallBack(_)) {
        ClaimLookup::AskTheApiServer
    } else {
        ClaimLookup::Cache
    }
}

/// Whether a claim reads the claimer's environment (its Secrets) now: when it may hand a kernel
/// over (taking a member, or a handover the API server may show) or make a sandbox of its own,
/// both of which need every variable; and when it begins to wait, so that a Secret it cannot
/// have says `EnvUnavailable` at once rather than once a member is Ready. A claimer already
/// waiting reads nothing on its rechecks: one GET per Secret per second and claimer, while a
/// drained pool refills, for an answer the take will read anyway.
fn reads_env(plan: &ClaimPlan, lookup: ClaimLookup, waiting_already: bool) -> bool {
    match plan {
        ClaimPlan::Take(_) | ClaimPlan::FallBack(_) => true,
        ClaimPlan::Mismatch(_) => false,
        ClaimPlan::Wait { .. } => lookup == ClaimLookup::AskTheApiServer || !waiting_already,
    }
}

/// The order in which a claimer tries the Ready members: the pool's order (longest Ready
/// first), started at a place that depends on the claimer's uid, so that claimers arriving
/// together mostly try different members instead of all racing for the first.
fn take_order<T: Clone>(members: &[T], claimer_uid: &str) -> Vec<T> {
    if members.is_empty() {
        return Vec::new();
    }
    let spread = claimer_uid.bytes().fold(0u64, |hash, byte| {
        hash.wrapping_mul(31).wrapping_add(byte.into())
    });
    let start = (spread % members.len() as u64) as usize;
    members[start..]
        .iter()
        .chain(&members[..start])
        .cloned()
        .collect()
}

impl<S: SandboxApi> Actor<'_, S> {
    /// A claimer without a sandbox, once its class admits it: [`Actor::claim`].
    pub(crate) async fn claim_step(&self, executor: &BriqExecutor) -> Result<Action> {
        if let Err(wait) = self.admit(executor, false).await? {
            return Ok(wait);
        }
        self.claim(executor).await
    }

    /// The claimer's environment (env.rs), or, while it cannot have all of it (reported
    /// as `EnvUnavailable`), when to look again: it takes no member and makes no sandbox.
    async fn env_or_recheck(&self, executor: &BriqExecutor) -> Result<Result<ClaimEnv, Action>> {
        Ok(self
            .claim_env(executor)
            .await?
            .ok_or_else(|| key_recheck(executor)))
    }

    /// A claimer without a sandbox: resume a handover this process or a crashed one began, else
    /// take a Ready member of its pool (the member's resourceVersion as precondition, so exactly
    /// one claimer wins it), else wait or fall back to a sandbox of its own.
    ///
    /// The claimer and its pool come from the caches. What they cannot show is this process's
    /// own handovers not seen yet, which [`Handovers`](super::handover::Handovers) remembers;
    /// the API server is asked only where neither can decide ([`claim_lookup`]): after a
    /// member's write whose outcome is unknown, and before a fallback, which cannot be taken
    /// back. A claimer whose cached copy was stale is caught by its record's precondition
    /// ([`Actor::record_claim`]).
    async fn claim(&self, executor: &BriqExecutor) -> Result<Action> {
        let pool_ref = executor
            .spec
            .pool_ref
            .clone()
            .expect("a claimer has a poolRef");
        let uid = executor.uid().unwrap_or_default();
        let handed_to_it = |member: &BriqExecutor| taken_by(member, &uid);
        // A handover this process began, or one a crash interrupted: a restarted operator's
        // cache shows it (the executors' first list is a consistent read).
        let resumed = self.handovers.taken(&uid).or_else(|| {
            let cached = self.executors.state().into_iter().find(|m| handed_to_it(m));
            cached.map(|member| member.as_ref().clone())
        });
        if let Some(member) = resumed {
            let env = match self.env_or_recheck(executor).await? {
                Ok(env) => env,
                Err(recheck) => return Ok(recheck),
            };
            return self
                .record_claim(executor, &pool_ref.name, member, &env)
                .await;
        }
        let namespace = executor.namespace().unwrap_or_default();
        let pool = self.pool(&namespace, &pool_ref.name).await?;
        let spoken_for = self.handovers.spoken_for(&uid);
        let ready: Vec<BriqExecutor> = pool
            .as_ref()
            .map(|pool| index::ready_members(self.executors, pool))
            .unwrap_or_default()
            .into_iter()
            .filter(|member| !spoken_for.contains(&member.name_any()))
            .collect();
        let waited = waited(executor);
        let plan = claim_plan(
            &executor.spec,
            &pool_ref,
            pool.as_ref(),
            ready.iter().map(|m| m.name_any()).collect(),
            waited,
        );
        let lookup = claim_lookup(&plan, self.handovers.uncertain(&uid));
        let waiting_already = conditions::find(&status_of(executor).conditions, conditions::READY)
            .is_some_and(|ready| ready.reason == ExecutorReason::WaitingForPool.as_str());
        let env = if reads_env(&plan, lookup, waiting_already) {
            match self.env_or_recheck(executor).await? {
                Ok(env) => env,
                Err(recheck) => return Ok(recheck),
            }
        } else {
            ClaimEnv::new()
        };
        if lookup == ClaimLookup::AskTheApiServer {
            let mine = ListParams::default().labels(&format!("{CLAIMED_BY_LABEL}={uid}"));
            let listed = self.api.list(&mine).await?.items;
            if let Some(member) = listed.into_iter().find(|m| handed_to_it(m)) {
                self.handovers.won(&uid, member.clone());
                return self
                    .record_claim(executor, &pool_ref.name, member, &env)
                    .await;
            }
            self.handovers.lost(&uid);
        }
        match plan {
            ClaimPlan::Take(_) => {
                for member in &take_order(&ready, &uid) {
                    // Another claimer of this process took it since `spoken_for` was read.
                    if !self.handovers.reserve(&uid, &member.name_any()) {
                        continue;
                    }
                    // An error leaves the reservation: the write may have won (see
                    // `claim_lookup`).
                    let Some(won) = self.take(executor, member).await? else {
                        self.handovers.lost(&uid);
                        continue;
                    };
                    self.handovers.won(&uid, won.clone());
                    return self.record_claim(executor, &pool_ref.name, won, &env).await;
                }
                Ok(Action::requeue(CLAIM_RECHECK))
            }
            ClaimPlan::Wait { message, recheck } => {
                let waiting = state("False", false, ExecutorReason::WaitingForPool, message);
                if !self.report_at(executor, waiting).await? {
                    return Ok(Action::requeue(CONFLICT_RECHECK));
                }
                Ok(Action::requeue(recheck))
            }
            ClaimPlan::FallBack(why) => {
                if !self
                    .annotate_at(executor, json!({ POOL_FALLBACK_ANNOTATION: why }))
                    .await?
                {
                    return Ok(Action::requeue(CONFLICT_RECHECK));
                }
                self.shared.metrics.pool_claimed(ClaimOutcome::Cold);
                self.event(
                    executor,
                    EventType::Normal,
                    "ColdCreate",
                    "Claim",
                    format!("{why}: creating a sandbox of its own"),
                )
                .await;
                Ok(Action::await_change())
            }
            ClaimPlan::Mismatch(message) => {
                let stalled = state("False", true, ExecutorReason::PoolMismatch, message.clone());
                if !self.report_at(executor, stalled).await? {
                    return Ok(Action::requeue(CONFLICT_RECHECK));
                }
                self.event(
                    executor,
                    EventType::Warning,
                    "PoolMismatch",
                    "Claim",
                    message,
                )
                .await;
                self.shared
                    .metrics
                    .executor_ended(ExecutorReason::PoolMismatch);
                Ok(Action::await_change())
            }
        }
    }

    /// The claimer's pool: from the cache, else (a pool created together with its claimer,
    /// not seen yet) from the API server, so that a missing pool is never concluded from a
    /// cache that has not caught up.
    async fn pool(&self, namespace: &str, name: &str) -> Result<Option<BriqExecutorPool>> {
        let key = ObjectRef::<BriqExecutorPool>::new(name).within(namespace);
        if let Some(cached) = self.pools.get(&key) {
            return Ok(Some(cached.as_ref().clone()));
        }
        let pools: Api<BriqExecutorPool> = Api::namespaced(self.shared.client.clone(), namespace);
        Ok(pools.get_opt(name).await?)
    }

    /// Marks `member` as this executor's, unless it changed since the cache saw it (another
    /// claimer, its pool, an expiry): `None`. Its owner becomes the claimer, so deleting the
    /// pool leaves it alone and deleting the claimer deletes it; its pool label goes, so the
    /// pool counts it no more.
    async fn take(
        &self,
        executor: &BriqExecutor,
        member: &BriqExecutor,
    ) -> Result<Option<BriqExecutor>> {
        let patch = taking(executor, member);
        match self.merge(&member.name_any(), &patch).await {
            Ok(won) => Ok(Some(won)),
            // Changed since the cache saw it, or gone: another claimer's, or no longer offered.
            Err(Error::Kube(kube::Error::Api(status)))
                if status.code == 409 || status.code == 404 =>
            {
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }
}

#[cfg(test)]
mod tests;
