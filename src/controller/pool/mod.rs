//! The `BriqExecutorPool` controller: keeps `spec.replicas` unclaimed members (or, with
//! `spec.maxReady`, as many as its claims ask: [`demand`]) made from the current template,
//! replaces broken and outdated ones, and reports how many are Ready. Members are ordinary
//! `BriqExecutor`s (the executor controller provisions them), owned by the pool until claimed;
//! the claim itself is the claimer's ([`super::executor`]).

mod decide;
mod demand;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Instant,
};

use demand::{Bounds, Claim, ClaimLog, Target, demand_target};
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, PostParams},
    runtime::{controller::Action, reflector::Store},
};
use serde_json::json;
use tracing::{info, instrument};

use crate::controller::recheck::EXPECTATION_TIMEOUT;

use super::{
    backoff::Backoff,
    class,
    context::{Error, Result, Shared},
    index::{Member, members, view},
    recheck,
    requeue::{object_key, prune_backoff, reconciled, retry},
    status::apply_status,
};
use crate::crd::{
    BriqExecutor, BriqExecutorPool, BriqExecutorPoolStatus, EXECUTOR_MANAGER,
    POOL_FALLBACK_ANNOTATION, POOL_LABEL, POOL_MEMBER_ANNOTATION, TEMPLATE_HASH_LABEL, conditions,
    template_hash,
};

pub struct Context<S> {
    pub shared: Arc<Shared<S>>,
    pools: Store<BriqExecutorPool>,
    executors: Store<BriqExecutor>,
    backoff: Backoff,
    /// Members this process created that the cache may not show yet, per pool: counted as
    /// not-ready members until it does (or [`EXPECTATION_TIMEOUT`] passes), so that a reconcile
    /// woken before the cache caught up does not create them twice.
    expected: Mutex<HashMap<String, Vec<(String, Instant)>>>,
    /// The claims of demand-sized pools, kept for their window.
    claims: Mutex<ClaimLog>,
}

impl<S> Context<S> {
    pub fn new(
        shared: Arc<Shared<S>>,
        pools: Store<BriqExecutorPool>,
        executors: Store<BriqExecutor>,
    ) -> Self {
        Context {
            backoff: shared.backoff(),
            shared,
            pools,
            executors,
            expected: Mutex::default(),
            claims: Mutex::default(),
        }
    }

    pub fn sweep(&self) {
        prune_backoff(&self.backoff, &self.pools);
        let live: HashSet<String> = self
            .pools
            .state()
            .iter()
            .map(|p| object_key(p.as_ref()))
            .collect();
        self.expected().retain(|pool, _| live.contains(pool));
        self.claims().retain(&live);
    }

    pub fn bookkeeping(&self) -> usize {
        self.backoff.len() + self.expected().len() + self.claims().len()
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, ClaimLog> {
        self.claims.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many members `pool` keeps (`spec.replicas`, or its demand's target, with what the
    /// demand rule saw and when to look again), from the claimers and members the cache shows.
    fn requested(&self, pool: &BriqExecutorPool) -> (i32, Option<Target>) {
        let Some(bounds) = Bounds::of(&pool.spec) else {
            return (pool.spec.replicas, None);
        };
        let now = Timestamp::now();
        let claimers = claimers(&self.executors, pool);
        let claims = self
            .claims()
            .record(&object_key(pool), claimers, bounds.window, now);
        let made = made(&self.executors, pool);
        let refill = self.claims().refill(&object_key(pool), &made);
        let target = demand_target(bounds, &claims, refill, now);
        (target.members, Some(target))
    }

    fn expected(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(String, Instant)>>> {
        self.expected.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The members created for `pool` that the cache (`seen`) does not show yet.
    fn still_expected(&self, pool: &str, seen: &HashSet<String>) -> Vec<String> {
        let mut expected = self.expected();
        let Some(created) = expected.get_mut(pool) else {
            return Vec::new();
        };
        created.retain(|(name, at)| !seen.contains(name) && at.elapsed() < EXPECTATION_TIMEOUT);
        let names = created.iter().map(|(name, _)| name.clone()).collect();
        if created.is_empty() {
            expected.remove(pool);
        }
        names
    }

    fn created(&self, pool: &str, member: String) {
        self.expected()
            .entry(pool.to_owned())
            .or_default()
            .push((member, Instant::now()));
    }
}

#[instrument(skip_all, fields(namespace = pool.namespace(), name = pool.name_any()))]
pub async fn reconcile<S>(pool: Arc<BriqExecutorPool>, ctx: Arc<Context<S>>) -> Result<Action> {
    let result = act(&pool, &ctx).await;
    reconciled(&ctx.backoff, pool.as_ref(), result)
}

pub fn error_policy<S>(pool: Arc<BriqExecutorPool>, error: &Error, ctx: Arc<Context<S>>) -> Action {
    retry(&ctx.backoff, pool.as_ref(), error)
}

async fn act<S>(pool: &BriqExecutorPool, ctx: &Context<S>) -> Result<Action> {
    if pool.metadata.deletion_timestamp.is_some() {
        // Garbage collection deletes the members it still owns; claimed ones are not its own.
        return Ok(Action::await_change());
    }
    // Members are counted from the executor cache, which shows none before its first list (a
    // consistent read, slower than the pools' own list): a restarted or upgraded operator would
    // make a whole new set of members, each a sandbox, only to delete them once it sees the old.
    if !super::cache::until_ready(&ctx.executors).await {
        return Ok(Action::await_change()); // the watch is gone: the operator is stopping
    }
    let namespace = pool.namespace().unwrap_or_default();
    let executors: Api<BriqExecutor> = Api::namespaced(ctx.shared.client.clone(), &namespace);
    let hash = template_hash(pool);
    let key = object_key(pool);
    let seen: HashSet<String> = ctx
        .executors
        .state()
        .iter()
        .filter(|e| e.annotations().get(POOL_MEMBER_ANNOTATION) == Some(&pool.name_any()))
        .map(|e| e.name_any())
        .collect();
    let (requested, demand) = ctx.requested(pool);
    let mut members: Vec<Member> = members(&ctx.executors, pool)
        .iter()
        .map(|e| view(e, &hash))
        .collect();
    members.extend(
        ctx.still_expected(&key, &seen)
            .into_iter()
            .map(|name| Member {
                name,
                current: true,
                ready: false,
                broken: false,
                deleting: false,
                created: None,
            }),
    );
    super::credentials::classes_known(&ctx.shared).await?;
    let asked = match demand {
        Some(_) => decide::Asked::Demand,
        None => decide::Asked::Replicas,
    };
    let class = pool_class(&ctx.shared, pool);
    let (plan, ready, target) = match decide::size(requested, asked, &class) {
        decide::Size::Keep { desired, capped } => {
            let plan = decide::plan(desired, &members);
            for name in &plan.delete {
                match executors.delete(name, &DeleteParams::default()).await {
                    Ok(_) => info!(member = %name, "deleted a pool member"),
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(error) => return Err(error.into()),
                }
            }
            for _ in 0..plan.create {
                let member = new_member(pool, &hash)?;
                let made = executors.create(&PostParams::default(), &member).await?;
                info!(member = %made.name_any(), "created a pool member");
                ctx.created(&key, made.name_any());
            }
            let mut ready = decide::ready_condition(desired, plan.ready_replicas);
            if let Some(broken) = capped {
                ready.message = format!("{}; {broken}: kept at the maximum", ready.message);
            }
            (plan, ready, Some(desired))
        }
        decide::Size::ClassMissing(name) => {
            // Woken when a class comes (class_events); the members there are only reported.
            let plan = decide::plan(requested, &members);
            (plan, decide::class_missing_condition(&name), None)
        }
    };
    let filling = ready.status != "True";
    let current = pool.status.clone().unwrap_or_default();
    let status = BriqExecutorPoolStatus {
        observed_generation: pool.metadata.generation,
        replicas: plan.replicas,
        ready_replicas: plan.ready_replicas,
        target_replicas: target,
        demand: demand.as_ref().map(|d| d.seen.clone()),
        selector: Some(format!("{POOL_LABEL}={}", pool.name_any())),
        conditions: conditions::merge(&current.conditions, &[ready], pool.metadata.generation),
    };
    if status != current {
        let pools: Api<BriqExecutorPool> = Api::namespaced(ctx.shared.client.clone(), &namespace);
        let status = serde_json::to_value(status).expect("status serializes");
        apply_status(&pools, pool, EXECUTOR_MANAGER, status).await?;
    }
    let filling = (filling || plan.create > 0)
        // Members' changes wake the pool; this is the safety net.
        .then(|| recheck::recheck(recheck::Wait::PoolFilling));
    // A demand-sized pool looks again when its oldest claim leaves the window: it may shrink.
    let shrink = demand.and_then(|d| d.recheck);
    Ok(match filling.into_iter().chain(shrink).min() {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// The executors of `pool`'s namespace the cache shows that `of_pool` relates to the pool
/// (named by its name).
fn related(
    executors: &Store<BriqExecutor>,
    pool: &BriqExecutorPool,
    of_pool: impl Fn(&BriqExecutor, &str) -> bool,
) -> Vec<Arc<BriqExecutor>> {
    let namespace = pool.namespace();
    let name = pool.name_any();
    executors
        .state()
        .into_iter()
        .filter(|e| e.namespace() == namespace && of_pool(e, &name))
        .collect()
}

/// The (creation, first Ready) times of the members `pool` has made that the cache shows,
/// claimed ones too: during a burst every Ready member may be claimed while new ones are being
/// made.
fn made(executors: &Store<BriqExecutor>, pool: &BriqExecutorPool) -> Vec<(Timestamp, Timestamp)> {
    let member = |e: &BriqExecutor, name: &str| {
        e.annotations()
            .get(POOL_MEMBER_ANNOTATION)
            .map(String::as_str)
            == Some(name)
    };
    related(executors, pool, member)
        .iter()
        .filter_map(|e| {
            let created = e.metadata.creation_timestamp.as_ref()?.0;
            let ready = e.status.as_ref()?.ready_time.as_ref()?.0;
            Some((created, ready))
        })
        .collect()
}

/// The claimers of `pool` the cache shows, by uid: each is a claim (made warm or not) for the
/// demand rule.
fn claimers(executors: &Store<BriqExecutor>, pool: &BriqExecutorPool) -> Vec<(String, Claim)> {
    let claimer =
        |e: &BriqExecutor, name: &str| e.spec.pool_ref.as_ref().is_some_and(|r| r.name == name);
    related(executors, pool, claimer)
        .iter()
        .filter_map(|e| {
            let claim = Claim {
                at: e.metadata.creation_timestamp.as_ref()?.0,
                cold: e.annotations().contains_key(POOL_FALLBACK_ANNOTATION),
            };
            Some((e.uid()?, claim))
        })
        .collect()
}

/// The class a pool's members take: the one its template names, else the default class (one
/// whose selector leaves namespaces out counts for its members only).
fn pool_class<S>(shared: &Shared<S>, pool: &BriqExecutorPool) -> class::Resolved {
    let classes = shared.classes.state();
    let empty = std::collections::BTreeMap::new();
    class::resolve(
        &pool.spec.template,
        class::Recorded::NotYet,
        &classes,
        &empty,
    )
}

/// A member made from the pool's current template: owned by the pool (garbage collection
/// deletes it with the pool), labelled for the scale subresource's selector, and marked as a
/// member for good (an annotation only the operator may write).
fn new_member(pool: &BriqExecutorPool, hash: &str) -> Result<BriqExecutor> {
    let mut owner = pool
        .controller_owner_ref(&())
        .ok_or_else(|| Error::Invariant("a pool without a uid".into()))?;
    // A foreground deletion of the pool waits for its unclaimed members (and their sandboxes).
    owner.block_owner_deletion = Some(true);
    let name = pool.name_any();
    let member = json!({
        "apiVersion": BriqExecutor::api_version(&()),
        "kind": BriqExecutor::kind(&()),
        "metadata": {
            "generateName": format!("{name}-"),
            "labels": { POOL_LABEL: name, TEMPLATE_HASH_LABEL: hash },
            "annotations": { POOL_MEMBER_ANNOTATION: name },
            "ownerReferences": [owner],
        },
        "spec": pool.spec.template,
    });
    serde_json::from_value(member).map_err(|e| Error::Invariant(format!("a pool member: {e}")))
}
