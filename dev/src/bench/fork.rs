//! Scenario 15: forking an executor (`spec.forkFrom`) that holds 10 MB of user state, on real
//! kernels, each figure beside a floor measured in the same run:
//!
//! - one fork → its first result (create → an Execution of `len(blob) + x`, created right
//!   after the fork and waiting for it to be Ready, `Succeeded`), one at a time, against a fresh
//!   executor of the same spec without `forkFrom` → its first result (`1 + 1`): what any new
//!   executor costs;
//! - many forks created at once → the last one's first result, and how many snapshots the source
//!   saved for them (the design: one for every fork waiting at that moment), against as many
//!   fresh executors created at once → the last one's first result;
//! - the source's pause per fork (its `Ready` reason `Forking` → `KernelReady`, as a watch sees
//!   them), against one action on the source (`len(blob)`, create → `Succeeded`);
//! - briq calls per fork and per fresh executor (the local server's counts), and the operator's
//!   API requests for each (kube-apiserver's audit log, by the operator's user: the scenario's
//!   controllers are the only ones running as that user meanwhile).
//!
//! Runs alternate (a fork, a fresh executor, an action on the source) so that a machine whose
//! load drifts weighs on each figure and its floor alike.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, PostParams},
    runtime::{wait::await_condition, watcher},
};
use serde::Serialize;
use serde_json::json;

use super::{
    audit::{self, RequestCounts},
    latency::sequential_of,
    objects::{self, lock},
    setup::OPERATOR_USER,
    stats::{Summary, ratio},
};
use crate::{
    local_server::{AdminClient, Operation, Stats},
    progress::Progress,
    stack::Stack,
    wait,
};
use briq_operator::crd::{
    BriqExecutor, Execution,
    conditions::{READY, STALLED, find, is_true},
};

const NAMESPACE: &str = "bench-fork";
const SOURCE: &str = "source";
/// Bound of each wait: a fork of 10 MB, or ten at once on a busy machine, with room to spare.
const BOUND: Duration = Duration::from_secs(180);
/// The source's user state: a bytes object of 10 MiB and a small int.
const STATE_BYTES: usize = 10 * 1024 * 1024;
/// How long after a first result the calls it caused are still counted (the source's and the
/// operator's last writes land just after it).
const SETTLE: Duration = Duration::from_secs(1);

/// The targets: one fork → first result, p50; ten forks at once → the last result.
pub const TARGET_FORK_SECONDS: f64 = 3.0;
pub const TARGET_BURST_SECONDS: f64 = 5.0;
pub const TARGET_BURST_FORKS: usize = 10;

/// The briq operations counted per fork, by their tool's name.
const OPERATIONS: [(&str, Operation); 9] = [
    ("briq_run", Operation::Create),
    ("briq_fork", Operation::Fork),
    ("briq_exec", Operation::Exec),
    ("briq_files_get", Operation::ReadFile),
    ("briq_files_put", Operation::WriteFile),
    ("briq_status", Operation::Get),
    ("briq_list", Operation::List),
    ("briq_start", Operation::Start),
    ("briq_stop", Operation::Stop),
];

/// How much scenario 15 does.
#[derive(Debug, Clone)]
pub struct Sizes {
    /// Forks one at a time (as many fresh executors and actions on the source beside them).
    pub runs: usize,
    /// Forks created at once.
    pub burst: usize,
}

/// Everything scenario 15 measured; a part that failed is `None` (its error labelled apart).
#[derive(Debug, Clone, Serialize)]
pub struct Forks {
    /// The source's user state, and the snapshot it saved for its forks (`status.snapshot`).
    pub state_bytes: usize,
    pub snapshot_bytes: Option<u64>,
    pub snapshot_parts: Option<u64>,
    pub one: Option<OneAtATime>,
    pub burst: Option<AtOnce>,
}

/// Forks one at a time, each beside a fresh executor and an action on the source.
#[derive(Debug, Clone, Serialize)]
pub struct OneAtATime {
    pub runs: usize,
    /// Fork create → its first Execution (`len(blob) + x`, created right after) `Succeeded`.
    pub fork_ms: Option<Summary>,
    /// The floor: a fresh executor (same spec, no `forkFrom`) create → its first Execution
    /// (`1 + 1`) `Succeeded`.
    pub fresh_ms: Option<Summary>,
    pub fork_over_fresh_p50: Option<f64>,
    /// The source's `Ready` reason `Forking` → `KernelReady`, each time a watch saw it (one per
    /// fork expected: `pauses` counts them).
    pub pause_ms: Option<Summary>,
    pub pauses: usize,
    /// One action on the source: `len(blob)`, create → `Succeeded`.
    pub source_action_ms: Option<Summary>,
    pub pause_over_action_p50: Option<f64>,
    /// briq calls per fork and per fresh executor, by tool, from the create to [`SETTLE`] after
    /// the first result (the deletion not counted).
    pub calls_per_fork: BTreeMap<String, f64>,
    pub calls_per_fresh: BTreeMap<String, f64>,
    /// The operator's API requests per fork and per fresh executor over the same windows, with
    /// the first Execution's; `None` without an audit log (`api_unmeasured` says why).
    pub api_per_fork: Option<ApiPer>,
    pub api_per_fresh: Option<ApiPer>,
    pub api_unmeasured: Option<String>,
}

/// The operator's API requests per executor made, from the audit log.
#[derive(Debug, Clone, Serialize)]
pub struct ApiPer {
    pub writes: f64,
    pub reads: f64,
    /// Every request, watches and others included.
    pub requests: f64,
    /// Per `verb resource[/subresource]`.
    pub by_request: BTreeMap<String, f64>,
}

/// Forks created at once.
#[derive(Debug, Clone, Serialize)]
pub struct AtOnce {
    pub forks: usize,
    /// The first fork's create → the last fork's first result.
    pub all_ms: f64,
    /// Each fork's create → its first result.
    pub each_ms: Option<Summary>,
    /// Snapshots the source saved for these forks, how many of them each served (in the order
    /// saved), and the source's pauses meanwhile.
    pub snapshots: usize,
    pub forks_per_snapshot: Vec<usize>,
    pub pauses: usize,
    /// `all_ms` over one fork's p50 (one at a time, same run).
    pub over_one_p50: Option<f64>,
    /// The floor: as many fresh executors (same spec, no `forkFrom`) created at once, each
    /// with an Execution of `1 + 1`: the first create → the last result, and each one's.
    pub fresh_all_ms: f64,
    pub fresh_each_ms: Option<Summary>,
    /// `all_ms` over `fresh_all_ms`.
    pub over_fresh: Option<f64>,
}

pub async fn run(
    stack: &Stack,
    progress: &Progress,
    sizes: &Sizes,
) -> (Forks, Vec<(String, String)>) {
    let mut measured = Forks {
        state_bytes: STATE_BYTES,
        snapshot_bytes: None,
        snapshot_parts: None,
        one: None,
        burst: None,
    };
    let mut failures = Vec::new();
    let mut fail = |label: &str, error: anyhow::Error| {
        progress.step(format!("15: {label} failed: {error:#}"));
        failures.push((format!("15 ({label})"), format!("{error:#}")));
    };
    if let Err(error) = stack.namespace(NAMESPACE).await {
        fail("setup", error);
        return (measured, failures);
    }
    let operator = match super::setup::controllers(stack, NAMESPACE, stack.server()) {
        Ok(operator) => operator,
        Err(error) => {
            fail("setup", error);
            return (measured, failures);
        }
    };
    let bench = Bench::new(stack);
    progress.step(format!(
        "15: forks of an executor holding {} MiB of state: {} one at a time (each beside a \
         fresh executor and an action on the source), then {} at once",
        STATE_BYTES / 1024 / 1024,
        sizes.runs,
        sizes.burst
    ));
    match bench.source().await {
        Err(error) => fail("setup", error),
        Ok(watch) => {
            match bench.one_at_a_time(progress, &watch, sizes.runs).await {
                Ok(one) => measured.one = Some(one),
                Err(error) => fail("one fork at a time", error),
            }
            let snapshot = bench
                .executors
                .get(SOURCE)
                .await
                .ok()
                .and_then(|s| s.status?.snapshot);
            measured.snapshot_bytes = snapshot.as_ref().map(|s| s.parts.size);
            measured.snapshot_parts = snapshot.as_ref().map(|s| s.parts.parts);
            let one_p50 = measured
                .one
                .as_ref()
                .and_then(|o| o.fork_ms.as_ref())
                .map(|s| s.median);
            match bench.at_once(progress, &watch, sizes.burst, one_p50).await {
                Ok(burst) => measured.burst = Some(burst),
                Err(error) => fail(&format!("{} forks at once", sizes.burst), error),
            }
        }
    }
    // Deleted whether or not the runs went well: the next scenario finds a clean machine.
    if let Err(error) = objects::delete_executors(&bench.executors).await {
        fail("clean-up", error);
    }
    operator.stop().await;
    (measured, failures)
}

/// What the scenario works with.
struct Bench {
    executors: Api<BriqExecutor>,
    executions: Api<Execution>,
    sandboxes: AdminClient,
    audit_log: Option<PathBuf>,
}

/// One executor made and its first result: how long it took, and the calls it cost.
struct Made {
    took: Duration,
    calls: BTreeMap<&'static str, u64>,
    api: Option<RequestCounts>,
}

/// Sums of what executors made one at a time cost.
#[derive(Default)]
struct Tally {
    times: Vec<Duration>,
    calls: BTreeMap<&'static str, u64>,
    api: RequestCounts,
}

impl Tally {
    fn add(&mut self, made: Made) {
        self.times.push(made.took);
        for (name, count) in made.calls {
            *self.calls.entry(name).or_default() += count;
        }
        if let Some(api) = made.api {
            let sum = &mut self.api;
            (sum.reads, sum.writes) = (sum.reads + api.reads, sum.writes + api.writes);
            (sum.watches, sum.other) = (sum.watches + api.watches, sum.other + api.other);
            sum.errors += api.errors;
            for (request, count) in api.by_request {
                *sum.by_request.entry(request).or_default() += count;
            }
        }
    }

    fn calls_per(&self) -> BTreeMap<String, f64> {
        let runs = self.times.len().max(1) as f64;
        OPERATIONS
            .iter()
            .map(|(name, _)| {
                let count = self.calls.get(name).copied().unwrap_or(0);
                ((*name).to_owned(), count as f64 / runs)
            })
            .collect()
    }

    fn api_per(&self) -> ApiPer {
        let runs = self.times.len().max(1) as f64;
        let a = &self.api;
        ApiPer {
            writes: a.writes as f64 / runs,
            reads: a.reads as f64 / runs,
            requests: (a.reads + a.writes + a.watches + a.other) as f64 / runs,
            by_request: a
                .by_request
                .iter()
                .map(|(request, count)| (request.clone(), *count as f64 / runs))
                .collect(),
        }
    }
}

fn counts(stats: &Stats) -> BTreeMap<&'static str, u64> {
    OPERATIONS
        .iter()
        .map(|(name, operation)| (*name, stats.calls(*operation)))
        .collect()
}

impl Bench {
    fn new(stack: &Stack) -> Bench {
        Bench {
            executors: Api::namespaced(stack.admin().clone(), NAMESPACE),
            executions: Api::namespaced(stack.admin().clone(), NAMESPACE),
            sandboxes: stack.server().admin(),
            audit_log: stack
                .plane()
                .and_then(|plane| plane.audit_log())
                .map(ToOwned::to_owned),
        }
    }

    /// The source, Ready and holding its state, and a watch of it.
    async fn source(&self) -> anyhow::Result<SourceWatch> {
        objects::create_ready(&self.executors, &[SOURCE.to_owned()], &json!({}), 1).await?;
        let source = self.executors.get(SOURCE).await?;
        let code = format!("blob = b'x' * {STATE_BYTES}\nx = 41\nlen(blob)");
        sequential_of(
            &self.executions,
            &source,
            "source-set",
            1,
            &code,
            &STATE_BYTES.to_string(),
        )
        .await
        .context("setting the source's state")?;
        SourceWatch::start(self.executors.clone()).await
    }

    async fn one_at_a_time(
        &self,
        progress: &Progress,
        watch: &SourceWatch,
        runs: usize,
    ) -> anyhow::Result<OneAtATime> {
        let source = self.executors.get(SOURCE).await?;
        let fork_spec = json!({ "forkFrom": { "name": SOURCE } });
        let forked = (STATE_BYTES + 41).to_string();
        let (mut forks, mut fresh, mut pauses, mut actions) =
            (Tally::default(), Tally::default(), Vec::new(), Vec::new());
        for i in 0..runs {
            let name = format!("fork-{i:02}");
            let started = Instant::now();
            let made = self
                .first_result(&name, &fork_spec, "len(blob) + x", &forked)
                .await
                .with_context(|| format!("fork {name}"))?;
            let fork_took = made.took;
            forks.add(made);
            let paused = watch.pauses_since(started);
            self.delete(&name).await?;

            let name = format!("fresh-{i:02}");
            let made = self
                .first_result(&name, &json!({}), "1 + 1", "2")
                .await
                .with_context(|| format!("fresh executor {name}"))?;
            let fresh_took = made.took;
            fresh.add(made);
            self.delete(&name).await?;

            let action = sequential_of(
                &self.executions,
                &source,
                &format!("source-action-{i:02}"),
                1,
                "len(blob)",
                &STATE_BYTES.to_string(),
            )
            .await
            .context("an action on the source")?;
            actions.extend(action.iter().map(|run| run.elapsed));
            progress.step(format!(
                "15: fork → first result {:.2}s (source paused {}), fresh executor {:.2}s, an \
                 action on the source {:.1} ms",
                fork_took.as_secs_f64(),
                paused
                    .iter()
                    .map(|p| format!("{:.0} ms", super::stats::millis(*p)))
                    .collect::<Vec<_>>()
                    .join(", "),
                fresh_took.as_secs_f64(),
                actions
                    .last()
                    .map_or(f64::NAN, |a| super::stats::millis(*a))
            ));
            pauses.extend(paused);
        }
        let fork_ms = Summary::of(&forks.times);
        let fresh_ms = Summary::of(&fresh.times);
        let pause_ms = Summary::of(&pauses);
        let source_action_ms = Summary::of(&actions);
        let p50 = |s: &Option<Summary>| s.as_ref().map(|s| s.median);
        let audited = self.audit_log.is_some();
        Ok(OneAtATime {
            runs,
            fork_over_fresh_p50: ratio(p50(&fork_ms), p50(&fresh_ms)),
            pause_over_action_p50: ratio(p50(&pause_ms), p50(&source_action_ms)),
            pauses: pauses.len(),
            calls_per_fork: forks.calls_per(),
            calls_per_fresh: fresh.calls_per(),
            api_per_fork: audited.then(|| forks.api_per()),
            api_per_fresh: audited.then(|| fresh.api_per()),
            api_unmeasured: (!audited).then(|| "the control plane has no audit log".to_owned()),
            fork_ms,
            fresh_ms,
            pause_ms,
            source_action_ms,
        })
    }

    /// Creates executor `name` (`spec`) and right after it an Execution of `code` on it; waits
    /// until that Execution has ended (`expected` its output). The time from the executor's
    /// create call to the end seen, and the briq calls and operator requests made until
    /// [`SETTLE`] after it.
    async fn first_result(
        &self,
        name: &str,
        spec: &serde_json::Value,
        code: &str,
        expected: &str,
    ) -> anyhow::Result<Made> {
        let before = counts(&self.sandboxes.stats().await?);
        let audit_from = self.audit_log.as_deref().map(audit::offset).transpose()?;
        let execution = format!("{name}-first");
        // Watching before the create costs nothing extra: the watch starts from a list.
        let done = tokio::spawn({
            let (api, execution) = (self.executions.clone(), execution.clone());
            async move {
                let finished = |e: Option<&Execution>| e.is_some_and(objects::finished);
                await_condition(api, &execution, finished).await
            }
        });
        let watching = done.abort_handle();
        let started = Instant::now();
        let ended = self
            .create_with_first(name, spec, &execution, code, done)
            .await;
        watching.abort();
        let finished = ended?;
        let took = started.elapsed();
        objects::check_output(&finished, expected)?;
        tokio::time::sleep(SETTLE).await;
        let after = counts(&self.sandboxes.stats().await?);
        let calls = after
            .into_iter()
            .map(|(op, n)| (op, n.saturating_sub(before.get(op).copied().unwrap_or(0))))
            .collect();
        let api = match (self.audit_log.as_deref(), audit_from) {
            (Some(log), Some(from)) => {
                Some(audit::count(log, from, audit::offset(log)?, OPERATOR_USER)?)
            }
            _ => None,
        };
        Ok(Made { took, calls, api })
    }

    /// Creates executor `name` and the Execution `execution` of `code` on it; the Execution
    /// once `done` (a watch of it started before) sees it end, or an error once the executor
    /// gives up or [`BOUND`] has passed.
    async fn create_with_first(
        &self,
        name: &str,
        spec: &serde_json::Value,
        execution: &str,
        code: &str,
        done: tokio::task::JoinHandle<Result<Option<Execution>, kube::runtime::wait::Error>>,
    ) -> anyhow::Result<Execution> {
        self.create_with_execution(name, spec, execution, code)
            .await?;
        tokio::select! {
            finished = tokio::time::timeout(BOUND, done) => match finished {
                Ok(joined) => joined??.with_context(|| format!("{execution} disappeared")),
                Err(_) => bail!(
                    "{execution} did not end within {BOUND:?}; {name} is {}",
                    self.ready_of(name).await
                ),
            },
            stalled = self.stalled(name) => bail!("{name} gave up: {stalled}"),
        }
    }

    /// Resolves once executor `name` is `Stalled` (its Ready reason and message); never
    /// otherwise.
    async fn stalled(&self, name: &str) -> String {
        let stalled = |e: &BriqExecutor| {
            e.status
                .as_ref()
                .is_some_and(|s| is_true(&s.conditions, STALLED))
        };
        match wait::for_object(&self.executors, name, BOUND * 2, stalled).await {
            Ok(executor) => ready_of(&executor),
            Err(_) => std::future::pending::<String>().await,
        }
    }

    /// Creates executor `name` of `spec` and, right after, Execution `execution` of `code` on
    /// it (it waits for the executor to be Ready); answers the executor as created.
    async fn create_with_execution(
        &self,
        name: &str,
        spec: &serde_json::Value,
        execution: &str,
        code: &str,
    ) -> anyhow::Result<BriqExecutor> {
        let created = self
            .executors
            .create(
                &PostParams::default(),
                &objects::executor(name, spec.clone())?,
            )
            .await?;
        self.executions
            .create(
                &PostParams::default(),
                &objects::execution_of(execution, &created, code)?,
            )
            .await?;
        Ok(created)
    }

    async fn ready_of(&self, name: &str) -> String {
        match self.executors.get_opt(name).await {
            Ok(Some(executor)) => ready_of(&executor),
            Ok(None) => "gone".into(),
            Err(error) => format!("unreadable ({error})"),
        }
    }

    /// Deletes executor `name` and waits until it is gone (its sandbox destroyed).
    async fn delete(&self, name: &str) -> anyhow::Result<()> {
        match self.executors.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(error) => return Err(error.into()),
        }
        wait::deleted(&self.executors, name, BOUND)
            .await
            .with_context(|| format!("deleting {name}"))
    }

    async fn at_once(
        &self,
        progress: &Progress,
        watch: &SourceWatch,
        count: usize,
        one_p50: Option<f64>,
    ) -> anyhow::Result<AtOnce> {
        progress.step(format!(
            "15: {count} forks created at once, an Execution on each right after its create; \
             then {count} fresh executors so"
        ));
        let fork_spec = json!({ "forkFrom": { "name": SOURCE } });
        let forked = (STATE_BYTES + 41).to_string();
        let started = Instant::now();
        let forks = self
            .burst("burst", count, &fork_spec, "len(blob) + x", &forked)
            .await
            .context("forks at once")?;
        let (served, pauses) = (
            watch.snapshots_for(&forks.uids),
            watch.pauses_since(started),
        );
        let snapshots = served.len();
        let fresh = self
            .burst("fresh-burst", count, &json!({}), "1 + 1", "2")
            .await
            .context("fresh executors at once")?;
        let all_ms = super::stats::millis(forks.all);
        let fresh_all_ms = super::stats::millis(fresh.all);
        progress.step(format!(
            "15: {count} forks at once: the last result {:.2}s after the first create, {} \
             snapshot(s) saved for them; {count} fresh executors at once {:.2}s",
            forks.all.as_secs_f64(),
            snapshots,
            fresh.all.as_secs_f64()
        ));
        Ok(AtOnce {
            forks: count,
            all_ms,
            each_ms: Summary::of(&forks.each),
            snapshots,
            forks_per_snapshot: served,
            pauses: pauses.len(),
            over_one_p50: ratio(Some(all_ms), one_p50),
            fresh_all_ms,
            fresh_each_ms: Summary::of(&fresh.each),
            over_fresh: ratio(Some(all_ms), Some(fresh_all_ms)),
        })
    }

    /// Creates `count` executors (`spec`) back to back, each followed at once by an Execution
    /// of `code` on it; waits for every one to end with `expected`, then deletes the
    /// executors.
    async fn burst(
        &self,
        prefix: &str,
        count: usize,
        spec: &serde_json::Value,
        code: &str,
        expected: &str,
    ) -> anyhow::Result<Burst> {
        let names: Vec<String> = (0..count).map(|i| format!("{prefix}-{i:02}")).collect();
        let firsts: Vec<String> = names.iter().map(|n| format!("{n}-first")).collect();
        let ended = objects::FirstSeen::start(self.executions.clone(), objects::finished).await?;
        let started = Instant::now();
        let (mut sent, mut uids) = (Vec::new(), Vec::new());
        for (name, first) in names.iter().zip(&firsts) {
            let at = Instant::now();
            let created = self.create_with_execution(name, spec, first, code).await?;
            sent.push(at);
            uids.extend(created.uid());
        }
        if !ended.wait_for_names(&firsts, started + BOUND).await {
            let mut states = Vec::new();
            for name in &names {
                states.push(format!("{name}: {}", self.ready_of(name).await));
            }
            bail!(
                "{} of {count} first Executions ended within {BOUND:?}; {}",
                firsts.iter().filter(|f| ended.seen(f).is_some()).count(),
                states.join("; ")
            );
        }
        let seen = ended.times();
        let last = firsts
            .iter()
            .filter_map(|f| seen.get(f))
            .max()
            .copied()
            .unwrap_or(started);
        let each = sent
            .iter()
            .zip(&firsts)
            .filter_map(|(at, f)| Some(seen.get(f)?.duration_since(*at)))
            .collect();
        for first in &firsts {
            objects::check_output(&self.executions.get(first).await?, expected)?;
        }
        for name in &names {
            self.delete(name).await?;
        }
        Ok(Burst {
            all: last.duration_since(started),
            each,
            uids,
        })
    }
}

/// Executors created at once: the first create → the last first result, each one's create →
/// its first result, and their uids.
struct Burst {
    all: Duration,
    each: Vec<Duration>,
    uids: Vec<String>,
}

/// `status/reason: message` of an executor's Ready condition.
fn ready_of(executor: &BriqExecutor) -> String {
    executor
        .status
        .as_ref()
        .and_then(|s| find(&s.conditions, READY))
        .map_or("no Ready condition".into(), |c| {
            format!("{}/{}: {}", c.status, c.reason, c.message)
        })
}

/// What a watch of the source saw: each pause (its Ready reason `Forking` first seen →
/// `KernelReady` first seen after it) and each snapshot it saved, with the forks it was for.
#[derive(Default)]
struct SourceLog {
    paused_since: Option<Instant>,
    pauses: Vec<(Instant, Instant)>,
    /// By snapshot id: when it was first seen, and the forks it was saved for.
    snapshots: BTreeMap<String, (Instant, Vec<String>)>,
}

impl SourceLog {
    /// How many of the forks `uids` each snapshot saved for any of them served, in the order
    /// the snapshots were seen.
    fn served(&self, uids: &[String]) -> Vec<usize> {
        let mut served: Vec<(Instant, usize)> = self
            .snapshots
            .values()
            .map(|(seen, forks)| (*seen, forks.iter().filter(|f| uids.contains(f)).count()))
            .filter(|(_, count)| *count > 0)
            .collect();
        served.sort();
        served.into_iter().map(|(_, count)| count).collect()
    }

    fn saw(&mut self, source: &BriqExecutor, now: Instant) {
        let Some(status) = source.status.as_ref() else {
            return;
        };
        let reason = find(&status.conditions, READY).map(|c| c.reason.as_str());
        match (reason, self.paused_since) {
            (Some("Forking"), None) => self.paused_since = Some(now),
            (Some("KernelReady"), Some(since)) => {
                self.pauses.push((since, now));
                self.paused_since = None;
            }
            _ => {}
        }
        if let Some(snapshot) = &status.snapshot {
            self.snapshots
                .entry(snapshot.parts.id.clone())
                .or_insert_with(|| (now, snapshot.forks.clone()));
        }
    }
}

/// A watch of the source, running from [`SourceWatch::start`] until dropped.
struct SourceWatch {
    log: Arc<Mutex<SourceLog>>,
    task: tokio::task::JoinHandle<()>,
}

impl SourceWatch {
    async fn start(api: Api<BriqExecutor>) -> anyhow::Result<SourceWatch> {
        let log: Arc<Mutex<SourceLog>> = Arc::default();
        let (synced_tx, synced) = tokio::sync::oneshot::channel::<()>();
        let config = watcher::Config::default().fields(&format!("metadata.name={SOURCE}"));
        let task = tokio::spawn({
            let log = Arc::clone(&log);
            async move {
                let mut synced_tx = Some(synced_tx);
                let mut events = watcher(api, config).boxed();
                while let Some(event) = events.next().await {
                    match event {
                        Ok(watcher::Event::InitDone) => {
                            if let Some(tx) = synced_tx.take() {
                                let _ = tx.send(());
                            }
                        }
                        Ok(watcher::Event::Apply(source) | watcher::Event::InitApply(source)) => {
                            lock(&log).saw(&source, Instant::now());
                        }
                        _ => {}
                    }
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(30), synced)
            .await
            .context("the watch of the source did not start")??;
        Ok(SourceWatch { log, task })
    }

    /// The pauses that began at or after `since`.
    fn pauses_since(&self, since: Instant) -> Vec<Duration> {
        lock(&self.log)
            .pauses
            .iter()
            .filter(|(from, _)| *from >= since)
            .map(|(from, to)| to.duration_since(*from))
            .collect()
    }

    fn snapshots_for(&self, uids: &[String]) -> Vec<usize> {
        lock(&self.log).served(uids)
    }
}

impl Drop for SourceWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(reason: &str, snapshot: Option<(&str, &[&str])>) -> BriqExecutor {
        let mut status = json!({
            "conditions": [{
                "type": "Ready", "status": if reason == "KernelReady" { "True" } else { "False" },
                "reason": reason, "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
            }],
        });
        if let Some((id, forks)) = snapshot {
            status["snapshot"] =
                json!({ "id": id, "parts": 1, "size": 1, "sha256": "00", "forks": forks });
        }
        let mut executor = objects::executor(SOURCE, json!({})).unwrap();
        executor.status = Some(serde_json::from_value(status).unwrap());
        executor
    }

    #[test]
    fn a_pause_runs_from_forking_first_seen_to_kernel_ready_and_snapshots_count_once() {
        let mut log = SourceLog::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        log.saw(&source("KernelReady", None), at(0));
        log.saw(&source("Forking", None), at(10));
        log.saw(&source("Forking", None), at(20));
        log.saw(&source("KernelReady", Some(("a", &["u1", "u2"]))), at(110));
        log.saw(&source("KernelReady", Some(("a", &["u1", "u2"]))), at(120));
        log.saw(&source("Forking", Some(("a", &["u1", "u2"]))), at(200));
        log.saw(&source("KernelReady", Some(("b", &["u3"]))), at(260));
        let pauses: Vec<u128> = log
            .pauses
            .iter()
            .map(|(from, to)| to.duration_since(*from).as_millis())
            .collect();
        assert_eq!(pauses, [100, 60]);
        assert_eq!(log.snapshots.len(), 2);
        let uids = |u: &[&str]| u.iter().map(|u| (*u).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            log.served(&uids(&["u3", "u2", "u1"])),
            [2, 1],
            "in the order saved"
        );
        assert_eq!(log.served(&uids(&["u3"])), [1]);
        assert!(log.paused_since.is_none());
    }
}
