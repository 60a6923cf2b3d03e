//! Prometheus metrics of the operator, served at `/metrics` (OpenMetrics text).
//!
//! Every label comes from a small fixed set: `controller` is `executor`, `execution` or `pool`;
//! `reason` is an [`ExecutionReason`] that ends an Execution, or on the ended-executors counter
//! one of [`EXECUTOR_ENDINGS`]; `class` is the name of a `BriqExecutorClass`, which the platform
//! team makes (a handful, cluster-scoped), and whose series go with it. Names, namespaces, UIDs
//! and error strings never become labels, so the number of series does not grow with the
//! number of objects or tenants.

use std::{future::Future, sync::Mutex, time::Instant};

use crate::crd::reasons::{ExecutionReason, ExecutorReason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// The controllers, as the `controller` label names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControllerKind {
    Executor,
    Execution,
    Pool,
}

impl ControllerKind {
    pub fn label(self) -> &'static str {
        match self {
            ControllerKind::Executor => "executor",
            ControllerKind::Pool => "pool",
            ControllerKind::Execution => "execution",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// How a claim on a pool was served: the `outcome` label of the pool claims counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// A Ready member's sandbox and kernel, handed over.
    Warm,
    /// No Ready member in time (or none coming): the claimer created a sandbox of its own.
    Cold,
}

impl ClaimOutcome {
    pub const ALL: [ClaimOutcome; 2] = [ClaimOutcome::Warm, ClaimOutcome::Cold];

    fn label(self) -> &'static str {
        match self {
            ClaimOutcome::Warm => "warm",
            ClaimOutcome::Cold => "cold",
        }
    }
}

/// The final `Ready` reasons of a BriqExecutor that will run no more code: the `reason` label of
/// the ended-executors counter takes exactly these values.
pub const EXECUTOR_ENDINGS: [ExecutorReason; 4] = [
    ExecutorReason::Unusable,
    ExecutorReason::SetupFailed,
    ExecutorReason::IdleTimeout,
    ExecutorReason::PoolMismatch,
];

/// What the controllers hold right now, read from their caches at scrape time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Live {
    /// Unfinished Executions that have not started yet.
    pub queued: i64,
    /// Seconds since the creation of the oldest of those (0 when none waits).
    pub oldest_queued_seconds: i64,
    /// Executions recorded as running and not finished.
    pub running: i64,
    /// BriqExecutors that hold a sandbox.
    pub sandboxes: i64,
    /// BriqExecutors suspended (`spec.suspend`): their sandbox stopped, their namespace saved.
    pub suspended: i64,
    /// Entries of the controllers' in-process bookkeeping (backoffs, locks, results not yet
    /// written, …); each goes with its object, so this falls back to 0 when the objects do.
    pub bookkeeping: i64,
    /// Executions whose outcome briq left unknown, waiting for briq to answer (`WaitingForBriq`).
    pub waiting_for_briq: i64,
    /// API keys with which briq answers no call now (`briq::health`).
    pub briq_unreachable_keys: i64,
    /// API keys whose server's MCP interface differs from what the operator sends
    /// (`briq::conformance`).
    pub briq_mismatched_keys: i64,
    /// What each class (by name) is used for, across namespaces.
    pub classes: std::collections::BTreeMap<String, crate::usage::Usage>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: String,
}

type LiveSource = Box<dyn Fn() -> Live + Send + Sync>;

type Histograms = Family<ControllerLabels, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    reconciles: Family<ControllerLabels, Counter>,
    reconcile_errors: Family<ControllerLabels, Counter>,
    reconcile_duration: Histograms,
    executor_ready: Histogram,
    execution_duration: Histogram,
    executions: Family<ReasonLabels, Counter>,
    orphans_destroyed: Counter,
    executors_ended: Family<ReasonLabels, Counter>,
    pool_claims: Family<OutcomeLabels, Counter>,
    queued: Gauge,
    oldest_queued: Gauge,
    running: Gauge,
    sandboxes: Gauge,
    suspended: Gauge,
    bookkeeping: Gauge,
    leader: Gauge,
    waiting_for_briq: Gauge,
    class_executors: Family<ClassLabels, Gauge>,
    class_executors_waiting: Family<ClassLabels, Gauge>,
    class_running: Family<ClassLabels, Gauge>,
    class_executions_waiting: Family<ClassLabels, Gauge>,
    class_queued: Family<ClassLabels, Gauge>,
    briq_unreachable: Gauge,
    briq_mismatched: Gauge,
    live: Mutex<Option<LiveSource>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn reconcile_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ])
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("briq_operator");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let reconcile_errors = Family::<ControllerLabels, Counter>::default();
        let reconcile_duration: Histograms = Family::new_with_constructor(reconcile_histogram);
        let executor_ready =
            Histogram::new([1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0]);
        let execution_duration =
            Histogram::new([0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0]);
        let executions = Family::<ReasonLabels, Counter>::default();
        let orphans_destroyed = Counter::default();
        registry.register(
            "orphans_destroyed",
            "Sandboxes with the operator's name prefix whose executor no longer exists, destroyed \
             by the orphan sweeper",
            orphans_destroyed.clone(),
        );
        let executors_ended = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "executors_ended",
            "BriqExecutors that will run no more code, by the final reason of their Ready \
             condition: Unusable (timeout, lost kernel, uncertain outcome), SetupFailed, \
             IdleTimeout, PoolMismatch",
            executors_ended.clone(),
        );
        let pool_claims = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "pool_claims",
            "Claims on BriqExecutorPools, by how they were served: warm (a Ready member handed \
             over) or cold (the claimer created a sandbox of its own: no Ready member within \
             coldCreateAfterSeconds, or the pool scaled to zero or missing)",
            pool_claims.clone(),
        );
        for outcome in ClaimOutcome::ALL {
            let _ = pool_claims.get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            });
        }
        let (queued, oldest_queued, running, sandboxes, bookkeeping, leader) = (
            Gauge::default(),
            Gauge::default(),
            Gauge::default(),
            Gauge::default(),
            Gauge::default(),
            Gauge::default(),
        );
        registry.register(
            "reconciles",
            "Reconciles run, per controller",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that ended in an error (and are retried with backoff), per controller",
            reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "How long one reconcile took, per controller",
            reconcile_duration.clone(),
        );
        registry.register(
            "executor_ready_seconds",
            "From a BriqExecutor's creation to Ready (cold setup: sandbox create, bridge, kernel)",
            executor_ready.clone(),
        );
        registry.register(
            "execution_duration_seconds",
            "From an Execution's start (Running) to its result",
            execution_duration.clone(),
        );
        registry.register(
            "executions_finished",
            "Executions finished, by terminal reason",
            executions.clone(),
        );
        registry.register(
            "executions_queued",
            "Unfinished Executions not started yet (queue depth)",
            queued.clone(),
        );
        // The age of the oldest queued Execution, rather than "queue depth > 0 while nothing
        // finishes": it also shows one executor's queue stuck while others move (an executor
        // that never becomes Ready, say), and it points at what to look at, the oldest
        // unfinished Execution. A queue is legitimately this old only behind a long backlog
        // (up to maxQueuedExecutions × executionTimeoutSeconds) or while its executor does not
        // exist yet (up to --executor-wait-seconds).
        registry.register(
            "executions_oldest_queued_seconds",
            "Age of the oldest unfinished Execution not started yet, in seconds since its \
             creation (0 when none waits)",
            oldest_queued.clone(),
        );
        registry.register(
            "executions_running",
            "Executions running now",
            running.clone(),
        );
        registry.register(
            "sandboxes_live",
            "BriqExecutors holding a briq sandbox",
            sandboxes.clone(),
        );
        let suspended = Gauge::default();
        registry.register(
            "executors_suspended",
            "BriqExecutors suspended: their sandbox stopped with the kernel's namespace saved in it",
            suspended.clone(),
        );
        registry.register(
            "bookkeeping_entries",
            "Entries of the controllers' in-process bookkeeping (pruned with their objects)",
            bookkeeping.clone(),
        );
        let (waiting_for_briq, briq_unreachable) = (Gauge::default(), Gauge::default());
        registry.register(
            "executions_waiting_for_briq",
            "Executions whose outcome briq left unknown (a 5xx, a timeout, an outage), waiting for \
             briq to answer their sandbox's attempt journal (reason WaitingForBriq)",
            waiting_for_briq.clone(),
        );
        registry.register(
            "briq_unreachable_keys",
            "briq API keys with which briq answers no call now: their calls are held back and \
             briq is probed by one call at a time (0 when briq answers)",
            briq_unreachable.clone(),
        );
        let briq_mismatched = Gauge::default();
        registry.register(
            "briq_interface_mismatched_keys",
            "briq API keys whose server's tools/list does not declare a tool or argument the \
             operator sends, or requires one it never sends: no call is made with them \
             (reason BriqInterfaceMismatch; 0 when the interface matches)",
            briq_mismatched.clone(),
        );
        let class_executors = Family::<ClassLabels, Gauge>::default();
        let class_executors_waiting = Family::<ClassLabels, Gauge>::default();
        let class_running = Family::<ClassLabels, Gauge>::default();
        let class_executions_waiting = Family::<ClassLabels, Gauge>::default();
        let class_queued = Family::<ClassLabels, Gauge>::default();
        registry.register(
            "class_executions_queued",
            "Executions of executors of each BriqExecutorClass not started yet",
            class_queued.clone(),
        );
        registry.register(
            "class_executors",
            "BriqExecutors holding a sandbox under each BriqExecutorClass",
            class_executors.clone(),
        );
        registry.register(
            "class_executors_waiting_for_capacity",
            "BriqExecutors waiting for a place under their class's perNamespace.maxExecutors",
            class_executors_waiting.clone(),
        );
        registry.register(
            "class_executions_running",
            "Executions running on executors of each BriqExecutorClass",
            class_running.clone(),
        );
        registry.register(
            "class_executions_waiting_for_capacity",
            "Executions waiting for a place under their class's perNamespace.maxRunningExecutions",
            class_executions_waiting.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica runs the controllers (holds the lease, or runs without leader election)",
            leader.clone(),
        );
        // Every series exists from the start (at 0): the set never changes while running.
        for controller in [
            ControllerKind::Executor,
            ControllerKind::Execution,
            ControllerKind::Pool,
        ] {
            let labels = ControllerLabels {
                controller: controller.label(),
            };
            let _ = reconciles.get_or_create(&labels);
            let _ = reconcile_errors.get_or_create(&labels);
            let _ = reconcile_duration.get_or_create(&labels);
        }
        for reason in ExecutionReason::terminal() {
            let _ = executions.get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            });
        }
        for reason in EXECUTOR_ENDINGS {
            let _ = executors_ended.get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            });
        }
        Metrics {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            executor_ready,
            execution_duration,
            executions,
            orphans_destroyed,
            executors_ended,
            pool_claims,
            queued,
            oldest_queued,
            running,
            sandboxes,
            suspended,
            bookkeeping,
            leader,
            waiting_for_briq,
            briq_unreachable,
            briq_mismatched,
            class_executors,
            class_executors_waiting,
            class_running,
            class_executions_waiting,
            class_queued,
            live: Mutex::default(),
        }
    }
}

impl Metrics {
    /// Runs one reconcile, counting and timing it.
    pub async fn reconcile<T, E>(
        &self,
        controller: ControllerKind,
        reconcile: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let labels = ControllerLabels {
            controller: controller.label(),
        };
        let started = Instant::now();
        let result = reconcile.await;
        self.reconcile_duration
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        self.reconciles.get_or_create(&labels).inc();
        if result.is_err() {
            self.reconcile_errors.get_or_create(&labels).inc();
        }
        result
    }

    /// The orphan sweeper destroyed a sandbox whose executor is gone.
    pub fn orphan_destroyed(&self) {
        self.orphans_destroyed.inc();
    }

    /// An executor reached a final state in which it runs no more code (`reason` is one of
    /// [`EXECUTOR_ENDINGS`]; any other is ignored, so the label set stays fixed).
    pub fn executor_ended(&self, reason: ExecutorReason) {
        if EXECUTOR_ENDINGS.contains(&reason) {
            self.executors_ended
                .get_or_create(&ReasonLabels {
                    reason: reason.as_str(),
                })
                .inc();
        }
    }

    /// A claim on a pool was served, warm or cold.
    pub fn pool_claimed(&self, outcome: ClaimOutcome) {
        self.pool_claims
            .get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            })
            .inc();
    }

    /// An executor became ready for the first time; `created` is its creationTimestamp.
    pub fn executor_ready(&self, created: Option<&Time>) {
        if let Some(created) = created {
            let waited = k8s_openapi::jiff::Timestamp::now().duration_since(created.0);
            self.executor_ready.observe(waited.as_secs_f64().max(0.0));
        }
    }

    /// An Execution got its final status.
    pub fn execution_finished(
        &self,
        reason: ExecutionReason,
        started: Option<&Time>,
        ended: Option<&Time>,
    ) {
        self.executions
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
        if let (Some(started), Some(ended)) = (started, ended) {
            let took = ended.0.duration_since(started.0);
            self.execution_duration.observe(took.as_secs_f64().max(0.0));
        }
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Where the gauges of live objects come from while the controllers run (`None`: they do
    /// not run, every such gauge reads 0).
    pub fn set_live(&self, source: Option<LiveSource>) {
        *self.live.lock().expect("metrics poisoned") = source;
    }

    /// The metrics in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let live = self
            .live
            .lock()
            .expect("metrics poisoned")
            .as_ref()
            .map(|source| source())
            .unwrap_or_default();
        self.queued.set(live.queued);
        self.oldest_queued.set(live.oldest_queued_seconds);
        self.running.set(live.running);
        self.sandboxes.set(live.sandboxes);
        self.suspended.set(live.suspended);
        self.bookkeeping.set(live.bookkeeping);
        self.waiting_for_briq.set(live.waiting_for_briq);
        self.briq_unreachable.set(live.briq_unreachable_keys);
        self.briq_mismatched.set(live.briq_mismatched_keys);
        // A deleted class's series go with it.
        let families = [
            &self.class_executors,
            &self.class_executors_waiting,
            &self.class_running,
            &self.class_executions_waiting,
            &self.class_queued,
        ];
        for family in families {
            family.clear();
        }
        for (class, usage) in &live.classes {
            let labels = ClassLabels {
                class: class.clone(),
            };
            let values = [
                usage.executors,
                usage.executors_waiting,
                usage.running,
                usage.executions_waiting,
                usage.queued,
            ];
            for (family, value) in families.iter().zip(values) {
                family.get_or_create(&labels).set(value as i64);
            }
        }
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String never fails");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_has_series_while_it_is_used_and_none_after() {
        use crate::usage::Usage;
        let metrics = std::sync::Arc::new(Metrics::default());
        let classes = std::sync::Arc::new(Mutex::new(std::collections::BTreeMap::from([(
            "standard".to_owned(),
            Usage {
                executors: 3,
                executors_waiting: 1,
                running: 2,
                executions_waiting: 4,
                queued: 5,
            },
        )])));
        let source = classes.clone();
        metrics.set_live(Some(Box::new(move || Live {
            classes: source.lock().unwrap().clone(),
            ..Live::default()
        })));
        let text = metrics.render();
        for line in [
            "briq_operator_class_executors{class=\"standard\"} 3",
            "briq_operator_class_executors_waiting_for_capacity{class=\"standard\"} 1",
            "briq_operator_class_executions_running{class=\"standard\"} 2",
            "briq_operator_class_executions_waiting_for_capacity{class=\"standard\"} 4",
            "briq_operator_class_executions_queued{class=\"standard\"} 5",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
        classes.lock().unwrap().clear();
        let text = metrics.render();
        assert!(!text.contains("class=\"standard\""), "{text}");
    }

    #[tokio::test]
    async fn series_stay_bounded_whatever_the_reasons() {
        let metrics = Metrics::default();
        let terminal: Vec<ExecutionReason> = ExecutionReason::terminal().collect();
        for i in 0..500 {
            metrics.execution_finished(terminal[i % terminal.len()], None, None);
            let _ = metrics
                .reconcile(ControllerKind::Execution, async { Err::<(), _>(i) })
                .await;
        }
        let text = metrics.render();
        let finished = text
            .lines()
            .filter(|line| line.starts_with("briq_operator_executions_finished_total{"))
            .collect::<Vec<_>>();
        assert_eq!(finished.len(), terminal.len());
        let last = terminal.len() - 1;
        let expected = format!(
            "briq_operator_executions_finished_total{{reason=\"{}\"}} {}",
            terminal[last],
            (0..500).filter(|i| i % terminal.len() == last).count()
        );
        assert!(finished.contains(&expected.as_str()), "{finished:#?}");
        assert!(
            text.contains("briq_operator_reconcile_errors_total{controller=\"execution\"} 500")
        );
    }

    #[test]
    fn ended_executors_are_counted_by_their_final_reason_only() {
        let metrics = Metrics::default();
        let text = metrics.render();
        for reason in EXECUTOR_ENDINGS {
            let series = format!("briq_operator_executors_ended_total{{reason=\"{reason}\"}} 0");
            assert!(text.contains(&series), "{series} missing at start:\n{text}");
        }
        for controller in ["executor", "execution", "pool"] {
            let series = format!("briq_operator_reconciles_total{{controller=\"{controller}\"}} 0");
            assert!(text.contains(&series), "{series} missing at start");
        }
        metrics.executor_ended(ExecutorReason::Unusable);
        metrics.executor_ended(ExecutorReason::Unusable);
        metrics.executor_ended(ExecutorReason::SetupFailed);
        // Not a final reason: no new series.
        metrics.executor_ended(ExecutorReason::Provisioning);
        let text = metrics.render();
        let ended = text
            .lines()
            .filter(|line| line.starts_with("briq_operator_executors_ended_total{"))
            .collect::<Vec<_>>();
        assert_eq!(ended.len(), EXECUTOR_ENDINGS.len(), "{ended:#?}");
        assert!(ended.contains(&"briq_operator_executors_ended_total{reason=\"Unusable\"} 2"));
        assert!(ended.contains(&"briq_operator_executors_ended_total{reason=\"SetupFailed\"} 1"));
    }

    #[test]
    fn pool_claims_are_counted_warm_or_cold_from_zero() {
        let metrics = Metrics::default();
        let text = metrics.render();
        for outcome in ["warm", "cold"] {
            let series = format!("briq_operator_pool_claims_total{{outcome=\"{outcome}\"}} 0");
            assert!(text.contains(&series), "{series} missing at start:\n{text}");
        }
        metrics.pool_claimed(ClaimOutcome::Warm);
        metrics.pool_claimed(ClaimOutcome::Warm);
        metrics.pool_claimed(ClaimOutcome::Cold);
        let text = metrics.render();
        assert!(text.contains("briq_operator_pool_claims_total{outcome=\"warm\"} 2"));
        assert!(text.contains("briq_operator_pool_claims_total{outcome=\"cold\"} 1"));
    }

    #[test]
    fn the_oldest_queued_age_comes_from_the_live_source_and_falls_back_to_0() {
        let metrics = Metrics::default();
        metrics.set_live(Some(Box::new(|| Live {
            queued: 3,
            oldest_queued_seconds: 1200,
            ..Live::default()
        })));
        let text = metrics.render();
        assert!(text.contains("\nbriq_operator_executions_oldest_queued_seconds 1200\n"));
        assert!(text.contains("\nbriq_operator_executions_queued 3\n"));
        metrics.set_live(None);
        let text = metrics.render();
        assert!(text.contains("\nbriq_operator_executions_oldest_queued_seconds 0\n"));
    }
}
