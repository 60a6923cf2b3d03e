//! Scenario 13: pools sized by demand (`spec.maxReady`) against fixed ones, under claims that
//! come in waves: a warm-up wave, a wave within the demand window of the first (a demand pool is
//! still sized for it), and a wave after an idle of about two windows (a demand pool is back at
//! `minReady` by then). Four pools in one namespace, on the same schedule, each shifted by a few
//! seconds so that their waves do not land at once: fixed at a few replicas, fixed at the
//! burst's size, and sized by demand (`maxReady` the burst's size, a short window) with
//! `minReady` 0 and 1. Claimers keep the default `coldCreateAfterSeconds` (30 s).
//!
//! The sandboxes are simulated (nothing runs), by a sandbox server of this scenario's own whose
//! provisioning takes about what a real kernel's does on this machine (1.2 s): a cold create
//! costs what it would, and the demand rule's refill time (measured on the pool's members) is
//! a real one. For each pool: the claims served warm (the claimer records a claimed member,
//! `status.claimedMember`, whether a member was Ready or it waited for one), the cold
//! fallbacks (`briq.cloud/pool-fallback`), claim → Ready (create call to `Ready=True` seen by a
//! watch), per wave and after the warm-up wave, and the warm sandbox-seconds per claim: the
//! unclaimed members alive (provisioning, Ready or being deleted), sampled from a watch every
//! 100 ms and integrated over the schedule, divided by the claims. Beside them, from the same
//! watches: the pool's target and demand as sampled, every time its target went down, and the
//! members it made (each seen on its creation): a demand pool that wavers makes and deletes
//! members no claim takes.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use kube::{
    Api, ResourceExt as _,
    api::{ListParams, PostParams},
    runtime::reflector,
};
use serde::Serialize;
use serde_json::json;

mod sampler;

use sampler::{PoolState, SAMPLE_EVERY, Sampler, Timeline};

use super::{
    objects::{self, FirstSeen},
    stats::{Summary, millis},
};
use crate::{
    local_server::{self, LocalServer, Simulation},
    progress::Progress,
    stack::{self, Stack},
};
use briq_operator::{
    briq::ApiKey,
    crd::{BriqExecutor, BriqExecutorPool, POOL_FALLBACK_ANNOTATION, PoolDemand},
};

/// The target of a demand-sized pool: claims served warm once it has seen a wave.
pub const TARGET_WARM_SHARE: f64 = 0.95;

const NAMESPACE: &str = "bench-demand";
/// The simulated provisioning of a sandbox: setup, then the kernel's start (together about a
/// real kernel's cold create on this machine, scenario 8).
const SETUP: Duration = Duration::from_millis(1_000);
const KERNEL_START: Duration = Duration::from_millis(200);
/// Each pool's schedule starts this long after the previous pool's.
const STAGGER: Duration = Duration::from_secs(3);
/// The schedule ends this long past the window after the last claim: a demand pool is back at
/// `minReady` by then, so its whole cool-down is counted.
const END_PAST_WINDOW: Duration = Duration::from_secs(5);

/// How much scenario 13 does.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Claims per wave; the demand pools' `maxReady` and the larger fixed pool's replicas.
    pub burst: usize,
    /// The smaller fixed pool's replicas.
    pub fixed: usize,
    /// The demand pools' `demandWindowSeconds`.
    pub window: Duration,
    /// Between two claims of a wave.
    pub spacing: Duration,
    /// The bound of every wait: the pools settling, the claimers getting Ready.
    pub bound: Duration,
}

/// Everything scenario 13 measured.
#[derive(Debug, Clone, Serialize)]
pub struct Demand {
    /// A simulated sandbox's setup + kernel start.
    pub provisioning_ms: f64,
    pub window_seconds: u64,
    /// Claims per wave, and the time between two of them.
    pub burst: usize,
    pub claim_spacing_ms: f64,
    /// When each wave starts, from the start of a pool's schedule.
    pub wave_offsets_seconds: Vec<f64>,
    /// A pool's schedule, start to end: what its sandbox-seconds are integrated over.
    pub schedule_seconds: f64,
    /// One schedule starts this long after the previous one.
    pub stagger_seconds: f64,
    pub pools: Vec<PoolRun>,
}

/// One pool's run through the schedule.
#[derive(Debug, Clone, Serialize)]
pub struct PoolRun {
    pub name: String,
    /// A fixed pool's `replicas`.
    pub replicas: Option<usize>,
    /// A demand pool's bounds.
    pub min_ready: Option<usize>,
    pub max_ready: Option<usize>,
    /// Every claim, and those after the warm-up wave.
    pub all: Tally,
    pub after_warmup: Tally,
    pub waves: Vec<Wave>,
    /// Unclaimed members alive × time, over the schedule.
    pub sandbox_seconds: f64,
    pub sandbox_seconds_per_claim: Option<f64>,
    /// The most unclaimed members at once during the schedule, not being deleted; and with
    /// those being deleted (alive until their sandbox is destroyed).
    pub peak_members: usize,
    pub peak_members_alive: usize,
    /// How many times the pool's target went down during the schedule (sized by demand: once
    /// or in a few steps as each wave's claims leave the window, else it wavered).
    pub target_drops: usize,
    /// Members the pool made from its creation to the end of the schedule, how many of them
    /// were claimed, and how many it deleted (or were still being deleted) unclaimed.
    pub members_made: usize,
    pub members_claimed: usize,
    pub members_deleted_unclaimed: usize,
}

impl PoolRun {
    /// "fixed pool, replicas 2", "demand pool, maxReady 10, minReady 0".
    pub fn label(&self) -> String {
        match (self.replicas, self.max_ready) {
            (Some(replicas), _) => format!("fixed pool, replicas {replicas}"),
            (None, Some(max)) => format!(
                "demand pool, maxReady {max}, minReady {}",
                self.min_ready.unwrap_or(0)
            ),
            (None, None) => self.name.clone(),
        }
    }

    pub fn sized_by_demand(&self) -> bool {
        self.max_ready.is_some()
    }
}

/// The claims of a wave, or of several.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Tally {
    pub claims: usize,
    /// Claimers that took a member (`status.claimedMember`).
    pub warm: usize,
    /// Claimers that created a sandbox of their own (`briq.cloud/pool-fallback`).
    pub fallbacks: usize,
    /// Claimers not Ready within the bound.
    pub unserved: usize,
    /// Create call → Ready of each claimer Ready within the bound.
    pub claim_ms: Option<Summary>,
}

impl Tally {
    pub fn warm_share(&self) -> Option<f64> {
        (self.claims > 0).then(|| self.warm as f64 / self.claims as f64)
    }
}

/// One wave of claims against one pool.
#[derive(Debug, Clone, Serialize)]
pub struct Wave {
    /// From the previous wave's last claim to this wave's first (none for the first).
    pub after_idle_seconds: Option<f64>,
    /// The pool as the wave's first claim found it (the last sample before it).
    pub at_start: PoolState,
    /// The highest target the pool's status showed from this wave's start to the next's (or
    /// the end), and what its demand rule saw then.
    pub peak_target: Option<i32>,
    pub demand_at_peak: Option<PoolDemand>,
    /// From this wave's start to the next's (or the end): the members the pool made, and how
    /// many times its target went down.
    pub members_made: usize,
    pub target_drops: usize,
    /// The lowest and highest refill time the pool's demand rule used over the same span, ms.
    pub refill_ms_range: Option<(u64, u64)>,
    pub tally: Tally,
}

/// How a pool is sized.
#[derive(Debug, Clone, Copy)]
enum Sizing {
    Fixed(usize),
    Demand { min_ready: usize },
}

#[derive(Debug, Clone)]
struct Plan {
    name: String,
    sizing: Sizing,
}

impl Plan {
    fn new(sizing: Sizing) -> Plan {
        let name = match sizing {
            Sizing::Fixed(replicas) => format!("fixed-{replicas}"),
            Sizing::Demand { min_ready } => format!("demand-min{min_ready}"),
        };
        Plan { name, sizing }
    }

    fn pool(&self, sizes: &Sizes) -> anyhow::Result<BriqExecutorPool> {
        let spec = match self.sizing {
            Sizing::Fixed(replicas) => json!({ "replicas": replicas, "template": {} }),
            Sizing::Demand { min_ready } => json!({
                "replicas": 0,
                "maxReady": sizes.burst,
                "minReady": min_ready,
                "demandWindowSeconds": sizes.window.as_secs(),
                "template": {},
            }),
        };
        Ok(serde_json::from_value(json!({
            "apiVersion": "briq.cloud/v1alpha1",
            "kind": "BriqExecutorPool",
            "metadata": { "name": self.name },
            "spec": spec,
        }))?)
    }

    /// The unclaimed members the pool keeps when nothing claims.
    fn idle_size(&self) -> usize {
        match self.sizing {
            Sizing::Fixed(replicas) => replicas,
            Sizing::Demand { min_ready } => min_ready,
        }
    }
}

/// When a pool's waves start, from the start of its schedule, and when the schedule ends.
struct Schedule {
    waves: Vec<Duration>,
    end: Duration,
}

impl Schedule {
    fn of(sizes: &Sizes) -> Schedule {
        let spread = sizes.spacing * u32::try_from(sizes.burst.saturating_sub(1)).unwrap_or(0);
        let within = spread + sizes.window / 2;
        // A window for the last claim to leave it, then about a window at `minReady`.
        let after_idle = within + spread + sizes.window * 2;
        let end = after_idle + spread + sizes.window + END_PAST_WINDOW;
        Schedule {
            waves: vec![Duration::ZERO, within, after_idle],
            end,
        }
    }
}

pub async fn run(stack: &Stack, progress: &Progress, sizes: Sizes) -> anyhow::Result<Demand> {
    let schedule = Schedule::of(&sizes);
    progress.step(format!(
        "13: waves of {} claims ({} ms apart) at {:?} s against fixed pools of {} and {} and \
         demand pools (maxReady {}, minReady 0 and 1, window {} s), simulated sandboxes of {:.1} s; \
         about {:.0} s",
        sizes.burst,
        sizes.spacing.as_millis(),
        schedule
            .waves
            .iter()
            .map(|w| w.as_secs_f64().round())
            .collect::<Vec<_>>(),
        sizes.fixed,
        sizes.burst,
        sizes.burst,
        sizes.window.as_secs(),
        (SETUP + KERNEL_START).as_secs_f64(),
        (schedule.end + STAGGER * 3).as_secs_f64(),
    ));
    let server = simulated_server().await?;
    stack.namespace(NAMESPACE).await?;
    let operator = super::setup::controllers(stack, NAMESPACE, &server)?;
    let pools: Api<BriqExecutorPool> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let executors: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let plans = vec![
        Plan::new(Sizing::Fixed(sizes.fixed)),
        Plan::new(Sizing::Fixed(sizes.burst)),
        Plan::new(Sizing::Demand { min_ready: 0 }),
        Plan::new(Sizing::Demand { min_ready: 1 }),
    ];
    let run = Run {
        sizes,
        schedule,
        pools,
        executors,
    };
    let measured = run.measure(progress, &plans).await;
    // Deleted however the run went: the next scenario finds a clean machine.
    let deleted = async {
        stack::delete_pools(&run.pools).await?;
        objects::delete_executors(&run.executors).await
    }
    .await;
    operator.stop().await;
    server.shutdown().await;
    let measured = measured?;
    deleted.context("deleting the pools and executors")?;
    Ok(measured)
}

/// A local sandbox server of simulated sandboxes whose provisioning takes [`SETUP`] +
/// [`KERNEL_START`].
async fn simulated_server() -> anyhow::Result<LocalServer> {
    let key = ApiKey::new(format!("local-{:016x}", rand::random::<u64>()))?;
    let mut config = local_server::Config::new(key);
    config.simulation = Some(Simulation {
        setup: SETUP,
        kernel_start: KERNEL_START,
    });
    local_server::spawn(config).await
}

struct Run {
    sizes: Sizes,
    schedule: Schedule,
    pools: Api<BriqExecutorPool>,
    executors: Api<BriqExecutor>,
}

/// How a claimer was served: the member it took, or a sandbox of its own.
#[derive(Debug, Clone, Default)]
struct Claimer {
    member: Option<String>,
    fell_back: bool,
}

impl Claimer {
    fn warm(&self) -> bool {
        self.member.is_some() && !self.fell_back
    }
}

/// A claim sent: its claimer's name, the wave (0-based), and when its create call was sent.
struct Sent {
    name: String,
    wave: usize,
    at: Instant,
}

impl Run {
    async fn measure(&self, progress: &Progress, plans: &[Plan]) -> anyhow::Result<Demand> {
        let names: Vec<String> = plans.iter().map(|p| p.name.clone()).collect();
        let sampler = Sampler::start(self.pools.clone(), self.executors.clone(), names).await?;
        for plan in plans {
            self.pools
                .create(&PostParams::default(), &plan.pool(&self.sizes)?)
                .await
                .with_context(|| format!("creating pool {}", plan.name))?;
        }
        self.until_idle_size(&sampler, plans).await?;
        let ready = FirstSeen::start(self.executors.clone(), objects::ready).await?;
        progress.step(format!(
            "13: pools {} at their idle size; the schedules start",
            plans
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));

        let first = Instant::now();
        let starts: Vec<Instant> = (0..plans.len())
            .map(|i| first + STAGGER * u32::try_from(i).unwrap_or(0))
            .collect();
        let drives = plans
            .iter()
            .zip(&starts)
            .map(|(plan, start)| self.drive(progress, plan, *start));
        let sent: Vec<Vec<Sent>> = futures::future::try_join_all(drives).await?;
        let last_end = starts.last().copied().unwrap_or(first) + self.schedule.end;
        tokio::time::sleep_until(last_end.into()).await;
        let timeline = sampler.stop();

        // Claimers still waiting, if any (a fallback is made within `coldCreateAfterSeconds`).
        let all_names: Vec<String> = sent.iter().flatten().map(|s| s.name.clone()).collect();
        let all_ready = ready
            .wait_for_names(&all_names, Instant::now() + self.sizes.bound)
            .await;
        if !all_ready {
            progress.step(format!(
                "13: some claimers were not Ready within {} s",
                self.sizes.bound.as_secs()
            ));
        }
        let ready_at = ready.times();
        drop(ready);
        let claimers: HashMap<String, Claimer> = self
            .executors
            .list(&ListParams::default())
            .await?
            .into_iter()
            .map(|e| {
                let annotations = e.annotations();
                let claimer = Claimer {
                    member: e.claimed_member().map(str::to_owned),
                    fell_back: annotations.contains_key(POOL_FALLBACK_ANNOTATION),
                };
                (e.name_any(), claimer)
            })
            .collect();

        let pools = plans
            .iter()
            .zip(&starts)
            .zip(&sent)
            .map(|((plan, start), sent)| {
                self.pool_run(plan, *start, sent, &ready_at, &claimers, &timeline)
            })
            .collect();
        Ok(Demand {
            provisioning_ms: millis(SETUP + KERNEL_START),
            window_seconds: self.sizes.window.as_secs(),
            burst: self.sizes.burst,
            claim_spacing_ms: millis(self.sizes.spacing),
            wave_offsets_seconds: self
                .schedule
                .waves
                .iter()
                .map(Duration::as_secs_f64)
                .collect(),
            schedule_seconds: self.schedule.end.as_secs_f64(),
            stagger_seconds: STAGGER.as_secs_f64(),
            pools,
        })
    }

    /// Waits until every pool keeps its idle size, all Ready, its status current and (sized by
    /// demand) its target at `minReady`.
    async fn until_idle_size(&self, sampler: &Sampler, plans: &[Plan]) -> anyhow::Result<()> {
        let deadline = Instant::now() + self.sizes.bound;
        loop {
            let at_idle_size = plans.iter().all(|plan| {
                let Some(pool) = sampler
                    .pools
                    .get(&reflector::ObjectRef::new(&plan.name).within(NAMESPACE))
                else {
                    return false;
                };
                let status = pool.status.clone().unwrap_or_default();
                let want = i32::try_from(plan.idle_size()).unwrap_or(i32::MAX);
                let state = sampler.latest(&plan.name);
                status.observed_generation == pool.metadata.generation
                    && status.replicas == want
                    && status.ready_replicas == want
                    && status.target_replicas == Some(want)
                    && state.members == plan.idle_size()
                    && state.deleting == 0
                    && state.ready == plan.idle_size()
            });
            if at_idle_size {
                return Ok(());
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "the pools did not reach their idle size within {} s",
                    self.sizes.bound.as_secs()
                );
            }
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
    }

    /// Sends `plan`'s waves, from `start`: each claim at its time, its create call not waited
    /// on before the next.
    async fn drive(
        &self,
        progress: &Progress,
        plan: &Plan,
        start: Instant,
    ) -> anyhow::Result<Vec<Sent>> {
        let mut sent = Vec::new();
        for (wave, offset) in self.schedule.waves.iter().enumerate() {
            let at = start + *offset;
            let mut calls = tokio::task::JoinSet::new();
            for i in 0..self.sizes.burst {
                let due = at + self.sizes.spacing * u32::try_from(i).unwrap_or(0);
                tokio::time::sleep_until(due.into()).await;
                let name = format!("{}-w{}-{i:03}", plan.name, wave + 1);
                let claimer =
                    objects::executor(&name, json!({ "poolRef": { "name": plan.name } }))?;
                let api = self.executors.clone();
                sent.push(Sent {
                    name,
                    wave,
                    at: Instant::now(),
                });
                calls.spawn(async move { api.create(&PostParams::default(), &claimer).await });
            }
            while let Some(call) = calls.join_next().await {
                call??;
            }
            progress.step(format!(
                "13: {}: wave {} of {} claims sent",
                plan.name,
                wave + 1,
                self.sizes.burst
            ));
        }
        Ok(sent)
    }

    fn pool_run(
        &self,
        plan: &Plan,
        start: Instant,
        sent: &[Sent],
        ready_at: &HashMap<String, Instant>,
        claimers: &HashMap<String, Claimer>,
        timeline: &Timeline,
    ) -> PoolRun {
        let end = start + self.schedule.end;
        let tally = |claims: &mut dyn Iterator<Item = &Sent>| {
            let mut tally = Tally::default();
            let mut claim_ms = Vec::new();
            for claim in claims {
                tally.claims += 1;
                let claimer = claimers.get(&claim.name).cloned().unwrap_or_default();
                tally.warm += usize::from(claimer.warm());
                tally.fallbacks += usize::from(claimer.fell_back);
                match ready_at.get(&claim.name) {
                    Some(at) => claim_ms.push(millis(at.saturating_duration_since(claim.at))),
                    None => tally.unserved += 1,
                }
            }
            tally.claim_ms = Summary::of_millis(&claim_ms);
            tally
        };
        let waves_at: Vec<Instant> = self.schedule.waves.iter().map(|w| start + *w).collect();
        let waves = (0..waves_at.len())
            .map(|wave| {
                let from = waves_at[wave];
                let to = waves_at.get(wave + 1).copied().unwrap_or(end);
                let previous_last = sent
                    .iter()
                    .filter(|s| s.wave + 1 == wave)
                    .map(|s| s.at)
                    .max();
                let first = sent.iter().filter(|s| s.wave == wave).map(|s| s.at).min();
                let (peak_target, demand_at_peak) = timeline.peak_target(&plan.name, from, to);
                Wave {
                    after_idle_seconds: previous_last
                        .zip(first)
                        .map(|(last, first)| first.saturating_duration_since(last).as_secs_f64()),
                    at_start: timeline.at(&plan.name, first.unwrap_or(from)),
                    peak_target,
                    demand_at_peak,
                    members_made: timeline.made(&plan.name, from, to),
                    target_drops: timeline.target_drops(&plan.name, from, to),
                    refill_ms_range: timeline.refill_range(&plan.name, from, to),
                    tally: tally(&mut sent.iter().filter(|s| s.wave == wave)),
                }
            })
            .collect();
        let all = tally(&mut sent.iter());
        let after_warmup = tally(&mut sent.iter().filter(|s| s.wave > 0));
        let sandbox_seconds = timeline.integral(&plan.name, start, end);
        let seen = timeline.seen.get(&plan.name);
        let made = seen.map_or(0, HashMap::len);
        let claimed = sent
            .iter()
            .filter_map(|s| claimers.get(&s.name)?.member.as_ref())
            .filter(|member| seen.is_some_and(|seen| seen.contains_key(*member)))
            .count();
        let left = timeline.at(&plan.name, end).members;
        let (replicas, min_ready, max_ready) = match plan.sizing {
            Sizing::Fixed(replicas) => (Some(replicas), None, None),
            Sizing::Demand { min_ready } => (None, Some(min_ready), Some(self.sizes.burst)),
        };
        PoolRun {
            name: plan.name.clone(),
            replicas,
            min_ready,
            max_ready,
            sandbox_seconds_per_claim: (all.claims > 0)
                .then(|| sandbox_seconds / all.claims as f64),
            all,
            after_warmup,
            waves,
            sandbox_seconds,
            peak_members: timeline.peak_members(&plan.name, start, end, false),
            peak_members_alive: timeline.peak_members(&plan.name, start, end, true),
            target_drops: timeline.target_drops(&plan.name, start, end),
            members_made: made,
            members_claimed: claimed,
            members_deleted_unclaimed: made.saturating_sub(claimed + left),
        }
    }
}
