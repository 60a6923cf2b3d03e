//! Scenario 13's sampler: watches of the pools and of their unclaimed members, sampled every
//! [`SAMPLE_EVERY`] into a [`Timeline`] (members alive, Ready, being deleted; each pool's target
//! and its every fall; the members made).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use futures::StreamExt as _;
use kube::{
    Api, ResourceExt as _,
    runtime::{
        WatchStreamExt as _,
        reflector::{self, Store},
        watcher,
    },
};
use serde::Serialize;

use super::super::objects;
use briq_operator::crd::{
    BriqExecutor, BriqExecutorPool, CLAIMED_BY_ANNOTATION, POOL_LABEL, PoolDemand,
};

/// How often the unclaimed members and the pools' status are sampled (from watches).
pub(super) const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// How long a watch may take to list what is there.
const WATCH_START: Duration = Duration::from_secs(30);

/// The pool at one sample: unclaimed members alive (being deleted or not), being deleted, Ready,
/// and its status's target.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PoolState {
    pub members: usize,
    pub deleting: usize,
    pub ready: usize,
    pub target: Option<i32>,
    #[serde(skip)]
    pub demand: Option<PoolDemand>,
}

/// Watches of the pools and of their members, sampled every [`SAMPLE_EVERY`] into a
/// [`Timeline`].
pub(super) struct Sampler {
    pub(super) pools: Store<BriqExecutorPool>,
    timeline: Arc<Mutex<Timeline>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What the sampler saw.
#[derive(Default)]
pub(super) struct Timeline {
    samples: Vec<(Instant, HashMap<String, PoolState>)>,
    /// Every member seen unclaimed, by pool: when it was first seen.
    pub(super) seen: HashMap<String, HashMap<String, Instant>>,
    /// Each pool's target as last seen, and when it went down.
    targets: HashMap<String, i32>,
    drops: Vec<(Instant, String)>,
}

impl Sampler {
    pub(super) async fn start(
        pools: Api<BriqExecutorPool>,
        executors: Api<BriqExecutor>,
        names: Vec<String>,
    ) -> anyhow::Result<Sampler> {
        let timeline: Arc<Mutex<Timeline>> = Arc::default();
        // Every change of a pool, for the target's every move (a sample may fall between two).
        let (pools, pools_task) = store(pools, watcher::Config::default(), {
            let timeline = Arc::clone(&timeline);
            move |pool: &BriqExecutorPool| lock(&timeline).pool_changed(pool)
        })
        .await?;
        // Members only: a claimed member loses the pool's label. Every change, for the members
        // made.
        let config = watcher::Config::default().labels(POOL_LABEL);
        let (members, members_task) = store(executors, config, {
            let timeline = Arc::clone(&timeline);
            move |member: &BriqExecutor| lock(&timeline).member_seen(member)
        })
        .await?;
        let sampling = tokio::spawn({
            let pools = pools.clone();
            let timeline = Arc::clone(&timeline);
            async move {
                let mut tick = tokio::time::interval(SAMPLE_EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    sample(&pools, &members, &names, &timeline);
                }
            }
        });
        Ok(Sampler {
            pools,
            timeline,
            tasks: vec![pools_task, members_task, sampling],
        })
    }

    /// Pool `name` at the latest sample.
    pub(super) fn latest(&self, name: &str) -> PoolState {
        lock(&self.timeline)
            .samples
            .last()
            .and_then(|(_, pools)| pools.get(name).cloned())
            .unwrap_or_default()
    }

    /// Stops sampling; what was sampled.
    pub(super) fn stop(self) -> Timeline {
        for task in &self.tasks {
            task.abort();
        }
        std::mem::take(&mut *lock(&self.timeline))
    }
}

/// A store of `api`'s objects that `config` selects, kept by a watch that shows `changed` each
/// object it sees created or changed; returns once the store holds them.
async fn store<K>(
    api: Api<K>,
    config: watcher::Config,
    changed: impl Fn(&K) + Send + Sync + 'static,
) -> anyhow::Result<(Store<K>, tokio::task::JoinHandle<()>)>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config))
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(async move {
        stream
            .for_each(|object| {
                if let Ok(object) = object {
                    changed(&object);
                }
                std::future::ready(())
            })
            .await;
    });
    tokio::time::timeout(WATCH_START, reader.wait_until_ready())
        .await
        .context("the watch did not start")??;
    Ok((reader, task))
}

fn sample(
    pools: &Store<BriqExecutorPool>,
    members: &Store<BriqExecutor>,
    names: &[String],
    timeline: &Mutex<Timeline>,
) {
    let at = Instant::now();
    let members = members.state();
    let pools = pools.state();
    let mut timeline = lock(timeline);
    let mut states = HashMap::new();
    for name in names {
        let mut state = PoolState::default();
        for member in members
            .iter()
            .filter(|m| m.labels().get(POOL_LABEL) == Some(name))
        {
            // Claimed (its label goes in the same write, so this is a cache's lag at most).
            if member.annotations().contains_key(CLAIMED_BY_ANNOTATION) {
                continue;
            }
            state.members += 1;
            state.deleting += usize::from(member.metadata.deletion_timestamp.is_some());
            state.ready += usize::from(objects::ready(member));
        }
        if let Some(status) = pools
            .iter()
            .find(|p| p.name_any() == *name)
            .and_then(|p| p.status.clone())
        {
            state.target = status.target_replicas;
            state.demand = status.demand;
        }
        states.insert(name.clone(), state);
    }
    timeline.samples.push((at, states));
}

impl Timeline {
    fn member_seen(&mut self, member: &BriqExecutor) {
        let Some(pool) = member.labels().get(POOL_LABEL) else {
            return;
        };
        if member.annotations().contains_key(CLAIMED_BY_ANNOTATION) {
            return;
        }
        self.seen
            .entry(pool.clone())
            .or_default()
            .entry(member.name_any())
            .or_insert_with(Instant::now);
    }

    fn pool_changed(&mut self, pool: &BriqExecutorPool) {
        let Some(target) = pool.status.as_ref().and_then(|s| s.target_replicas) else {
            return;
        };
        let name = pool.name_any();
        if let Some(before) = self.targets.insert(name.clone(), target)
            && target < before
        {
            self.drops.push((Instant::now(), name));
        }
    }

    /// Pool `name` at the last sample at or before `at`.
    pub(super) fn at(&self, name: &str, at: Instant) -> PoolState {
        self.samples
            .iter()
            .take_while(|(when, _)| *when <= at)
            .last()
            .and_then(|(_, pools)| pools.get(name).cloned())
            .unwrap_or_default()
    }

    /// Unclaimed members × seconds of pool `name` from `from` to `to`, each sample's count
    /// holding until the next.
    pub(super) fn integral(&self, name: &str, from: Instant, to: Instant) -> f64 {
        let count = |pools: &HashMap<String, PoolState>| pools.get(name).map_or(0, |s| s.members);
        let mut total = 0.0;
        for pair in self.samples.windows(2) {
            let ((a, pools), (b, _)) = (&pair[0], &pair[1]);
            let (start, end) = ((*a).max(from), (*b).min(to));
            if end > start {
                total += count(pools) as f64 * (end - start).as_secs_f64();
            }
        }
        total
    }

    /// The most unclaimed members of pool `name` from `from` to `to`, with those being deleted
    /// when `deleting`.
    pub(super) fn peak_members(
        &self,
        name: &str,
        from: Instant,
        to: Instant,
        deleting: bool,
    ) -> usize {
        self.during(from, to)
            .filter_map(|pools| pools.get(name))
            .map(|s| {
                if deleting {
                    s.members
                } else {
                    s.members - s.deleting
                }
            })
            .max()
            .unwrap_or(0)
    }

    /// The lowest and highest refill time the demand rule of pool `name` used from `from` to
    /// `to`.
    pub(super) fn refill_range(
        &self,
        name: &str,
        from: Instant,
        to: Instant,
    ) -> Option<(u64, u64)> {
        let refills: Vec<u64> = self
            .during(from, to)
            .filter_map(|pools| Some(pools.get(name)?.demand.as_ref()?.refill_millis))
            .collect();
        Some((*refills.iter().min()?, *refills.iter().max()?))
    }

    /// The members of pool `name` first seen from `from` to `to`.
    pub(super) fn made(&self, name: &str, from: Instant, to: Instant) -> usize {
        self.seen.get(name).map_or(0, |seen| {
            seen.values().filter(|at| **at >= from && **at < to).count()
        })
    }

    /// How many times the target of pool `name` went down from `from` to `to`.
    pub(super) fn target_drops(&self, name: &str, from: Instant, to: Instant) -> usize {
        self.drops
            .iter()
            .filter(|(at, pool)| pool == name && *at >= from && *at < to)
            .count()
    }

    /// The highest target of pool `name` from `from` to `to`, and its demand then.
    pub(super) fn peak_target(
        &self,
        name: &str,
        from: Instant,
        to: Instant,
    ) -> (Option<i32>, Option<PoolDemand>) {
        self.during(from, to)
            .filter_map(|pools| pools.get(name))
            .filter(|s| s.target.is_some())
            .max_by_key(|s| s.target)
            .map_or((None, None), |s| (s.target, s.demand.clone()))
    }

    fn during(
        &self,
        from: Instant,
        to: Instant,
    ) -> impl Iterator<Item = &HashMap<String, PoolState>> {
        self.samples
            .iter()
            .filter(move |(at, _)| *at >= from && *at <= to)
            .map(|(_, pools)| pools)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
