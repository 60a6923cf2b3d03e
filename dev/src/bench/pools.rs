//! Scenario 8: warm pools. A `BriqExecutor` with `spec.poolRef` takes a Ready member's sandbox
//! and kernel instead of making its own, so claim → Ready costs a few API writes where a cold
//! create costs a sandbox, a setup and a kernel start: the ratio of the two, measured in the same
//! run, is the point. On simulated sandboxes (what is measured is the operator and the API
//! server): claims one at a time from a pool of 10, each finding the pool full, with as many cold
//! creates beside; then a burst of claims all at once against a pool as large as the burst, how
//! long the pool takes to be full again, and the burst's floor (burst_floor.rs). On real kernels,
//! at a size this machine runs at once: a pool of 3, 3 claims at once, one cold create; then 3
//! claims at once again, each bringing a variable (`poolRef.env`, delivered before Ready). Then
//! a drained pool: claims arriving faster than it refills (one every quarter second against a
//! pool of 3 real kernels, each claimer waiting 5 s for a member before it creates its own
//! sandbox), where what counts is the wait and how many fell back to a cold create.
//!
//! In the bursts the operator's API writes are counted from kube-apiserver's audit log, from the
//! first create until every claimer is Ready, and divided by the claims: the claim's own (the
//! member's take and the claimer's record with its Ready, on the path to Ready, then the write
//! that settles it; `tests/pools.rs` counts them exactly) with the refill's beside them.
//!
//! A claimer is timed from its create call to `Ready=True` seen by one watch over the namespace,
//! as scenario 7 times its executors. Its Ready message says whether the pool handed it a member
//! ("handed over from BriqExecutorPool …") or it fell back to a cold create of its own (after
//! `coldCreateAfterSeconds`, 30 s by default): fallbacks are counted, not hidden in the latency.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use futures::{StreamExt as _, TryStreamExt as _, stream};
use kube::{
    Api, ResourceExt as _,
    api::{ListParams, PostParams},
};
use serde::Serialize;
use serde_json::json;

use super::{
    objects::{self, FirstSeen},
    scaling,
    stats::{Summary, millis, ratio},
};
use crate::{
    local_server::LocalServer,
    progress::Progress,
    stack::{self, Controllers, Stack},
};
use briq_operator::crd::{BriqExecutor, BriqExecutorPool, POOL_FALLBACK_ANNOTATION, POOL_LABEL};

/// The targets of the warm-pool issue for a claim one at a time, shown beside the figures.
pub const TARGET_CLAIM_P50_MS: f64 = 100.0;
pub const TARGET_CLAIM_P99_MS: f64 = 1_000.0;

/// Each phase has a namespace of its own, so that the next one's caches do not hold the last
/// one's hundreds of executors.
const ONE_AT_A_TIME_NAMESPACE: &str = "bench-pool";
const BURST_NAMESPACE: &str = "bench-pool-burst";
const REAL_NAMESPACE: &str = "bench-pool-real";
const DRAINED_NAMESPACE: &str = "bench-pool-drained";
const REAL_ENV_NAMESPACE: &str = "bench-pool-real-env";
/// The pool of every phase.
const POOL: &str = "warm";
/// How often a waiting phase looks at the pool (its status first; its members only once the
/// status says it is full).
const FULL_POLL: Duration = Duration::from_millis(50);

/// How much scenario 8 does.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Members of the pool the claims one at a time come from.
    pub pool: usize,
    /// Claims one at a time, and as many cold creates beside.
    pub claims: usize,
    /// Claims at once against a pool as large, on simulated sandboxes.
    pub burst: usize,
    /// Claims at once against a pool as large, on real kernels.
    pub real_kernels: usize,
    /// The drained pool on real kernels: its members, its claims, the time between two, and
    /// each claimer's `coldCreateAfterSeconds`.
    pub drained_pool: usize,
    pub drained_claims: usize,
    pub drained_spacing: Duration,
    pub drained_cold_after_seconds: u32,
    /// The bound of every wait: the pool filling, a claim, a cold create, a refill.
    pub bound: Duration,
}

/// The three phases; a phase that failed is `None` (its error is in the report's errors).
#[derive(Debug, Clone, Serialize)]
pub struct Pools {
    pub one_at_a_time: Option<Claims>,
    pub burst: Option<Claims>,
    pub real_kernels: Option<Claims>,
    /// The same, each claimer bringing one variable (`poolRef.env`, delivered before Ready).
    pub real_kernels_env: Option<Claims>,
    pub drained: Option<Claims>,
}

/// Claims against one pool, and cold creates beside them on the same sandbox server.
#[derive(Debug, Clone, Serialize)]
pub struct Claims {
    /// Whether the sandboxes were simulated (else real kernels).
    pub simulated: bool,
    /// Members the pool keeps.
    pub replicas: usize,
    /// Claims planned.
    pub claims: usize,
    /// All created at once (else one at a time, each finding the pool full, or paced).
    pub at_once: bool,
    /// Each claimer brings a variable (`poolRef.env`).
    pub with_env: bool,
    /// Paced: one claim this often, whatever the pool holds (a drained pool), each waiting
    /// `cold_after_seconds` for a member.
    pub spacing_ms: Option<u64>,
    pub cold_after_seconds: Option<u32>,
    /// The operator's API writes (and all its requests) per claim, from the first create until
    /// every claimer was Ready, the refill's included; when all at once.
    pub writes_per_claim: Option<f64>,
    pub requests_per_claim: Option<f64>,
    /// Pool created → full (every member Ready), before any claim; `None` past the bound.
    pub fill_seconds: Option<f64>,
    /// Create → Ready of each claimer Ready within the bound.
    pub claim_ms: Option<Summary>,
    /// When all at once: each claimer's create call, sent → answered (the API server taking
    /// the burst), and its answer → Ready (what is left for the operator).
    pub create_call_ms: Option<Summary>,
    pub after_create_ms: Option<Summary>,
    /// Claimers whose Ready message says the pool handed them a member's sandbox.
    pub handed_over: usize,
    /// Claimers that created a sandbox of their own instead (expected: none).
    pub fallbacks: usize,
    /// Create → pool full again: per claim when one at a time; once, from the first create,
    /// when all at once.
    pub refill_ms: Option<Summary>,
    /// Executors without `poolRef` on the same server, one at a time, create → Ready.
    pub cold_ms: Option<Summary>,
    /// Cold create median / claim median.
    pub cold_over_claim: Option<f64>,
    /// The burst's floor: the same claims' requests sent directly, no operator
    /// ([`super::burst_floor`]); when all at once on simulated sandboxes.
    pub floor_ms: Option<Summary>,
    /// Why the figures are partial, when a wait reached its bound.
    pub partial: Option<String>,
}

impl Claims {
    fn new(server: &Server, replicas: usize, claims: usize, at_once: bool) -> Claims {
        Claims {
            simulated: matches!(server, Server::Simulated),
            replicas,
            claims,
            at_once,
            with_env: false,
            spacing_ms: None,
            cold_after_seconds: None,
            writes_per_claim: None,
            requests_per_claim: None,
            fill_seconds: None,
            claim_ms: None,
            create_call_ms: None,
            after_create_ms: None,
            handed_over: 0,
            fallbacks: 0,
            refill_ms: None,
            cold_ms: None,
            cold_over_claim: None,
            floor_ms: None,
            partial: None,
        }
    }
}

enum Server {
    Simulated,
    Real,
}

impl Server {
    fn of<'a>(&self, stack: &'a Stack) -> &'a LocalServer {
        match self {
            Server::Simulated => stack.simulated_server(),
            Server::Real => stack.server(),
        }
    }
}

/// Runs the phases in turn; a failed phase does not stop the next. The figures, and the failed
/// phases' errors labelled for the report.
pub async fn run(
    stack: &Stack,
    progress: &Progress,
    sizes: Sizes,
) -> (Pools, Vec<(String, String)>) {
    let mut failures = Vec::new();
    // A failed clean-up is reported beside the figures, not instead of them.
    let mut keep = |label: &str, (measured, cleaned): Measured| {
        if let Err(error) = cleaned {
            progress.step(format!(
                "8: cleaning up the {label} phase failed: {error:#}"
            ));
            failures.push((format!("8 ({label}, clean-up)"), format!("{error:#}")));
        }
        match measured {
            Ok(claims) => Some(claims),
            Err(error) => {
                progress.step(format!("8: the {label} phase failed: {error:#}"));
                failures.push((format!("8 ({label})"), format!("{error:#}")));
                None
            }
        }
    };

    progress.step(format!(
        "8/9: a warm pool of {} on simulated sandboxes: {} claims one at a time, {} cold \
         creates beside",
        sizes.pool, sizes.claims, sizes.claims
    ));
    let plan = Plan::OneAtATime {
        replicas: sizes.pool,
        claims: sizes.claims,
    };
    let measured = phase(
        stack,
        ONE_AT_A_TIME_NAMESPACE,
        Server::Simulated,
        sizes,
        plan,
    )
    .await;
    let one_at_a_time = keep("one at a time", measured);

    progress.step(format!(
        "8: a warm pool of {0} on simulated sandboxes: {0} claims at once, then the refill",
        sizes.burst
    ));
    let plan = Plan::AtOnce {
        claims: sizes.burst,
        cold: 0,
        env: false,
    };
    let measured = phase(stack, BURST_NAMESPACE, Server::Simulated, sizes, plan).await;
    let mut burst = keep("burst", measured);
    if let Some(figures) = &mut burst {
        progress.step(format!(
            "8: the burst's floor: the same {} claims' requests sent directly, no operator",
            sizes.burst
        ));
        match burst_floor(stack, sizes.burst).await {
            Ok(each) => figures.floor_ms = Summary::of_millis(&each),
            Err(error) => progress.step(format!("8: the burst's floor failed: {error:#}")),
        }
    }

    progress.step(format!(
        "8: a warm pool of {0} on real kernels: {0} claims at once, the refill, 1 cold create",
        sizes.real_kernels
    ));
    let plan = Plan::AtOnce {
        claims: sizes.real_kernels,
        cold: 1,
        env: false,
    };
    let measured = phase(stack, REAL_NAMESPACE, Server::Real, sizes, plan).await;
    let real_kernels = keep("real kernels", measured);

    progress.step(format!(
        "8: a warm pool of {0} on real kernels: {0} claims at once, each bringing a variable",
        sizes.real_kernels
    ));
    let plan = Plan::AtOnce {
        claims: sizes.real_kernels,
        cold: 0,
        env: true,
    };
    let measured = phase(stack, REAL_ENV_NAMESPACE, Server::Real, sizes, plan).await;
    let real_kernels_env = keep("real kernels, with env", measured);

    progress.step(format!(
        "8: a drained pool of {} on real kernels: {} claims, one every {} ms, each creating its \
         own sandbox after {} s",
        sizes.drained_pool,
        sizes.drained_claims,
        sizes.drained_spacing.as_millis(),
        sizes.drained_cold_after_seconds
    ));
    let plan = Plan::Drained;
    let measured = phase(stack, DRAINED_NAMESPACE, Server::Real, sizes, plan).await;
    let drained = keep("drained", measured);

    let pools = Pools {
        one_at_a_time,
        burst,
        real_kernels,
        real_kernels_env,
        drained,
    };
    (pools, failures)
}

/// What a phase does.
enum Plan {
    /// [`Phase::one_at_a_time`].
    OneAtATime { replicas: usize, claims: usize },
    /// [`Phase::at_once`].
    AtOnce {
        claims: usize,
        cold: usize,
        env: bool,
    },
    /// [`Phase::drained`].
    Drained,
}

/// What a phase measured, and how its clean-up went.
type Measured = (anyhow::Result<Claims>, anyhow::Result<()>);

/// [`super::burst_floor::measure`] in a namespace of its own, deleted after.
async fn burst_floor(stack: &Stack, claims: usize) -> anyhow::Result<Vec<f64>> {
    stack.namespace(super::burst_floor::NAMESPACE).await?;
    let measured = super::burst_floor::measure(stack.admin(), claims).await;
    let executors: Api<BriqExecutor> =
        Api::namespaced(stack.admin().clone(), super::burst_floor::NAMESPACE);
    objects::delete_executors(&executors).await?;
    measured
}

/// Runs `plan` in namespace `namespace` with the controllers scoped to it on `server`, then
/// cleans up ([`Phase::finish`]) however it went.
async fn phase(
    stack: &Stack,
    namespace: &str,
    server: Server,
    sizes: Sizes,
    plan: Plan,
) -> Measured {
    let phase = match Phase::start(stack, namespace, server, sizes).await {
        Ok(phase) => phase,
        Err(error) => return (Err(error), Ok(())),
    };
    let measured = match plan {
        Plan::OneAtATime { replicas, claims } => phase.one_at_a_time(replicas, claims).await,
        Plan::AtOnce { claims, cold, env } => phase.at_once(claims, cold, env).await,
        Plan::Drained => phase.drained(sizes).await,
    };
    (measured, phase.finish().await)
}

/// One phase: a namespace of its own, the controllers scoped to it on one sandbox server, and
/// its pool's and executors' APIs.
struct Phase {
    server: Server,
    bound: Duration,
    /// kube-apiserver's audit log, where the operator's requests are counted.
    audit_log: Option<std::path::PathBuf>,
    operator: Controllers,
    pools: Api<BriqExecutorPool>,
    executors: Api<BriqExecutor>,
}

impl Phase {
    async fn start(
        stack: &Stack,
        namespace: &str,
        server: Server,
        sizes: Sizes,
    ) -> anyhow::Result<Phase> {
        stack.namespace(namespace).await?;
        Ok(Phase {
            operator: super::setup::controllers(stack, namespace, server.of(stack))?,
            server,
            bound: sizes.bound,
            audit_log: stack
                .plane()
                .and_then(|plane| plane.audit_log())
                .map(|log| log.to_owned()),
            pools: Api::namespaced(stack.admin().clone(), namespace),
            executors: Api::namespaced(stack.admin().clone(), namespace),
        })
    }

    /// Deletes the pool first (it would make members again as fast as they go), then every
    /// executor (their finalizers destroy the sandboxes), and stops the controllers.
    async fn finish(self) -> anyhow::Result<()> {
        let deleted = async {
            stack::delete_pools(&self.pools).await?;
            objects::delete_executors(&self.executors).await
        }
        .await;
        self.operator.stop().await;
        deleted
    }

    /// Claims one at a time, each once the pool is full, and a cold create after each once the
    /// pool is full again (so that neither competes with the refill).
    async fn one_at_a_time(&self, replicas: usize, claims: usize) -> anyhow::Result<Claims> {
        let mut figures = Claims::new(&self.server, replicas, claims, false);
        if !self.fill(&mut figures).await? {
            return Ok(figures);
        }
        let ready = self.watch_ready().await?;
        let (mut claim_ms, mut refill_ms, mut cold_ms) = (Vec::new(), Vec::new(), Vec::new());
        let mut sent_at = HashMap::new();
        for i in 0..claims {
            let name = format!("claim-{i:03}");
            let sent = self.create(&name, claimer()).await?;
            sent_at.insert(name.clone(), sent);
            let Some(at) = self.ready_at(&ready, &name, sent).await else {
                figures.partial = Some(format!("{name} was not Ready {}", self.within()));
                break;
            };
            claim_ms.push(millis(at - sent));
            let Some(full) = self.full_at(replicas, Instant::now() + self.bound).await? else {
                figures.partial = Some(format!("the pool was not full again {}", self.within()));
                break;
            };
            refill_ms.push(millis(full - sent));

            let name = format!("cold-{i:03}");
            let sent = self.create(&name, json!({})).await?;
            let Some(at) = self.ready_at(&ready, &name, sent).await else {
                figures.partial = Some(format!("{name} was not Ready {}", self.within()));
                break;
            };
            cold_ms.push(millis(at - sent));
        }
        (figures.handed_over, figures.fallbacks) = self.handovers(&sent_at, &ready).await?;
        drop(ready);
        figures.claim_ms = Summary::of_millis(&claim_ms);
        figures.refill_ms = Summary::of_millis(&refill_ms);
        figures.cold_ms = Summary::of_millis(&cold_ms);
        figures.cold_over_claim = cold_over_claim(&figures);
        Ok(figures)
    }

    /// A pool of `claims` members, `claims` claims created all at once (each bringing a
    /// variable when `env`), the pool full again, then `cold` cold creates one at a time.
    async fn at_once(&self, claims: usize, cold: usize, env: bool) -> anyhow::Result<Claims> {
        let mut figures = Claims::new(&self.server, claims, claims, true);
        figures.with_env = env;
        let spec = match env {
            true => {
                json!({ "poolRef": { "name": POOL, "env": [{ "name": "REGION", "value": "eu" }] } })
            }
            false => claimer(),
        };
        if !self.fill(&mut figures).await? {
            return Ok(figures);
        }
        let ready = self.watch_ready().await?;
        let plan = (0..claims)
            .map(|i| objects::executor(&format!("claim-{i:03}"), spec.clone()))
            .collect::<anyhow::Result<Vec<BriqExecutor>>>()?;
        let executors = &self.executors;
        let audit_from = self.audit_offset()?;
        let first = Instant::now();
        let calls: Vec<(String, Instant, Instant)> = stream::iter(plan)
            .map(|executor| async move {
                let at = Instant::now();
                executors.create(&PostParams::default(), &executor).await?;
                Ok::<_, anyhow::Error>((executor.name_any(), at, Instant::now()))
            })
            .buffer_unordered(claims.max(1))
            .try_collect()
            .await?;
        let sent_at: HashMap<String, Instant> = calls
            .iter()
            .map(|(name, sent, _)| (name.clone(), *sent))
            .collect();
        let answered_at: HashMap<String, Instant> = calls
            .iter()
            .map(|(name, _, answered)| (name.clone(), *answered))
            .collect();
        let names: Vec<String> = sent_at.keys().cloned().collect();
        let all_ready = ready.wait_for_names(&names, first + self.bound).await;
        if let Some(requests) = self.operator_requests(audit_from)? {
            let per_claim = |n: u64| n as f64 / claims.max(1) as f64;
            figures.writes_per_claim = Some(per_claim(requests.writes));
            figures.requests_per_claim = Some(per_claim(
                requests.reads + requests.writes + requests.watches + requests.other,
            ));
        }
        let ready_at = ready.times();
        figures.claim_ms = Summary::of_millis(&scaling::latencies(&sent_at, &ready_at));
        figures.create_call_ms = Summary::of_millis(&scaling::latencies(&sent_at, &answered_at));
        figures.after_create_ms = Summary::of_millis(&scaling::latencies(&answered_at, &ready_at));
        if all_ready {
            match self.full_at(claims, Instant::now() + self.bound).await? {
                Some(full) => figures.refill_ms = Summary::of_millis(&[millis(full - first)]),
                None => {
                    figures.partial =
                        Some(format!("the pool was not full again {}", self.within()));
                }
            }
        } else {
            let late = names.iter().filter(|n| !ready_at.contains_key(*n)).count();
            figures.partial = Some(format!(
                "{late} of {claims} claimers were not Ready {}",
                self.within()
            ));
        }

        let mut cold_ms = Vec::new();
        for i in 0..cold {
            let name = format!("cold-{i:03}");
            let sent = self.create(&name, json!({})).await?;
            let Some(at) = self.ready_at(&ready, &name, sent).await else {
                let why = format!("{name} was not Ready {}", self.within());
                figures.partial = Some(match figures.partial.take() {
                    Some(earlier) => format!("{earlier}; {why}"),
                    None => why,
                });
                break;
            };
            cold_ms.push(millis(at - sent));
        }
        (figures.handed_over, figures.fallbacks) = self.handovers(&sent_at, &ready).await?;
        drop(ready);
        figures.cold_ms = Summary::of_millis(&cold_ms);
        figures.cold_over_claim = cold_over_claim(&figures);
        Ok(figures)
    }

    /// A pool of `drained_pool` members and `drained_claims` claims, one every
    /// `drained_spacing` whatever the pool holds, each creating its own sandbox after
    /// `drained_cold_after_seconds` without a member: how long they waited, and how many fell
    /// back.
    async fn drained(&self, sizes: Sizes) -> anyhow::Result<Claims> {
        let mut figures = Claims::new(
            &self.server,
            sizes.drained_pool,
            sizes.drained_claims,
            false,
        );
        figures.spacing_ms = Some(u64::try_from(sizes.drained_spacing.as_millis())?);
        figures.cold_after_seconds = Some(sizes.drained_cold_after_seconds);
        if !self.fill(&mut figures).await? {
            return Ok(figures);
        }
        let ready = self.watch_ready().await?;
        let spec = json!({ "poolRef": {
            "name": POOL,
            "coldCreateAfterSeconds": sizes.drained_cold_after_seconds,
        } });
        let mut sent_at = HashMap::new();
        let first = Instant::now();
        for i in 0..sizes.drained_claims {
            let name = format!("claim-{i:03}");
            let sent = self.create(&name, spec.clone()).await?;
            sent_at.insert(name, sent);
            // Paced, as claims that keep coming whatever the pool holds.
            tokio::time::sleep_until((first + sizes.drained_spacing * (i as u32 + 1)).into()).await;
        }
        let names: Vec<String> = sent_at.keys().cloned().collect();
        let deadline = Instant::now() + self.bound;
        if !ready.wait_for_names(&names, deadline).await {
            let ready_at = ready.times();
            let late = names.iter().filter(|n| !ready_at.contains_key(*n)).count();
            figures.partial = Some(format!(
                "{late} of {} claimers were not Ready {}",
                names.len(),
                self.within()
            ));
        }
        figures.claim_ms = Summary::of_millis(&scaling::latencies(&sent_at, &ready.times()));
        (figures.handed_over, figures.fallbacks) = self.handovers(&sent_at, &ready).await?;
        Ok(figures)
    }

    /// Where the audit log ends now (0 without one).
    fn audit_offset(&self) -> anyhow::Result<u64> {
        self.audit_log
            .as_deref()
            .map_or(Ok(0), super::audit::offset)
    }

    /// The operator's requests since `from` in the audit log, if there is one.
    fn operator_requests(&self, from: u64) -> anyhow::Result<Option<super::audit::RequestCounts>> {
        let Some(log) = self.audit_log.as_deref() else {
            return Ok(None);
        };
        let to = super::audit::offset(log)?;
        Ok(Some(super::audit::count(
            log,
            from,
            to,
            super::setup::OPERATOR_USER,
        )?))
    }

    /// Creates the pool (template `{}`) and waits until it is full; whether it was within the
    /// bound (else the figures say so).
    async fn fill(&self, figures: &mut Claims) -> anyhow::Result<bool> {
        let pool: BriqExecutorPool = serde_json::from_value(json!({
            "apiVersion": "briq.cloud/v1alpha1",
            "kind": "BriqExecutorPool",
            "metadata": { "name": POOL },
            "spec": { "replicas": figures.replicas, "template": {} },
        }))?;
        let started = Instant::now();
        self.pools.create(&PostParams::default(), &pool).await?;
        match self.full_at(figures.replicas, started + self.bound).await? {
            Some(full) => {
                figures.fill_seconds = Some((full - started).as_secs_f64());
                Ok(true)
            }
            None => {
                figures.partial = Some(format!(
                    "the pool of {} was not full {}",
                    figures.replicas,
                    self.within()
                ));
                Ok(false)
            }
        }
    }

    /// When the pool was first seen full, polling until `deadline`: its status says `replicas`
    /// members, all Ready, for its current generation, and the unclaimed members its label
    /// selects are that many, all Ready and none being deleted (the status alone lags a claim).
    async fn full_at(&self, replicas: usize, deadline: Instant) -> anyhow::Result<Option<Instant>> {
        let want = i32::try_from(replicas)?;
        let selector = ListParams::default().labels(&format!("{POOL_LABEL}={POOL}"));
        loop {
            let pool = self.pools.get(POOL).await?;
            let status = pool.status.clone().unwrap_or_default();
            if status.replicas == want
                && status.ready_replicas == want
                && status.observed_generation == pool.metadata.generation
            {
                let members = self.executors.list(&selector).await?.items;
                if members.len() == replicas
                    && members
                        .iter()
                        .all(|m| objects::ready(m) && m.metadata.deletion_timestamp.is_none())
                {
                    return Ok(Some(Instant::now()));
                }
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(FULL_POLL).await;
        }
    }

    /// Creates executor `name`; when the create call was sent.
    async fn create(&self, name: &str, spec: serde_json::Value) -> anyhow::Result<Instant> {
        let executor = objects::executor(name, spec)?;
        let sent = Instant::now();
        self.executors
            .create(&PostParams::default(), &executor)
            .await?;
        Ok(sent)
    }

    /// When the watch saw executor `name` Ready, waiting at most the bound after `sent`.
    async fn ready_at(&self, ready: &FirstSeen, name: &str, sent: Instant) -> Option<Instant> {
        ready
            .wait_for_names(&[name.to_owned()], sent + self.bound)
            .await
            .then(|| ready.seen(name))
            .flatten()
    }

    /// One watch over the phase's executors: when each was first seen Ready, and its Ready
    /// message then (the first probe after a handover replaces it with "the kernel answers").
    async fn watch_ready(&self) -> anyhow::Result<FirstSeen> {
        let message = |executor: &BriqExecutor| {
            objects::ready_reason(executor)
                .map(|(_, _, message)| message)
                .unwrap_or_default()
        };
        FirstSeen::start_noting(self.executors.clone(), objects::ready, message).await
    }

    /// (handed over, fell back) among the claimers `sent_at` names: from their Ready message
    /// when first seen Ready, and the annotation a claimer that stopped waiting for its pool
    /// carries.
    async fn handovers(
        &self,
        sent_at: &HashMap<String, Instant>,
        ready: &FirstSeen,
    ) -> anyhow::Result<(usize, usize)> {
        let handed = format!("handed over from BriqExecutorPool {POOL}");
        let messages = ready.notes();
        let (mut handed_over, mut fallbacks) = (0, 0);
        for executor in self.executors.list(&ListParams::default()).await? {
            let name = executor.name_any();
            if !sent_at.contains_key(&name) {
                continue;
            }
            let fell_back = executor
                .annotations()
                .contains_key(POOL_FALLBACK_ANNOTATION);
            match messages.get(&name) {
                Some(message) if message.contains(&handed) && !fell_back => handed_over += 1,
                Some(_) => fallbacks += 1,
                None if fell_back => fallbacks += 1,
                None => {}
            }
        }
        Ok((handed_over, fallbacks))
    }

    fn within(&self) -> String {
        format!("within {} s", self.bound.as_secs())
    }
}

/// A claimer's spec: the pool's, with the default `coldCreateAfterSeconds` (30).
fn claimer() -> serde_json::Value {
    json!({ "poolRef": { "name": POOL } })
}

fn cold_over_claim(figures: &Claims) -> Option<f64> {
    ratio(
        figures.cold_ms.as_ref().map(|s| s.median),
        figures.claim_ms.as_ref().map(|s| s.median),
    )
}
