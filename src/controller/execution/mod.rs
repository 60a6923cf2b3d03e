//! The `Execution` reconciler: runs each Execution at most once, one at a time per executor, in
//! creation order.
//!
//! kube-runtime never reconciles one object twice at once, but reconciles different
//! Executions concurrently; the per-executor lock and the turn check here serialize them.
//! "Running" is recorded with an attempt id *before* the code is sent, so an Execution found
//! running without a result (the operator stopped mid-run) is never sent again.
//!
//! Each reconcile observes (the caches first; only the head of a queue reads afresh), asks
//! [`decide`] what comes next, and performs it.

mod bookkeeping;
mod budget;
mod capacity;
mod codes;
mod decide;
mod trace;

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, Preconditions},
    runtime::{
        controller::Action,
        reflector::{ObjectRef, Store},
    },
};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{info, instrument, warn};

use self::{
    bookkeeping::Bookkeeping,
    decide::{Attempt, Expiry, Observed, Refusal, Sibling, Step, Turn, Verdict},
};
use super::{
    backoff::Backoff,
    cache::Freshness,
    class,
    context::{Error, Result, Shared},
    credentials::{api_key, made_under},
    fair::{FairShare, Held, Priority},
    index::of_executor,
    ownership::{Ownership, claimed_member, expected_sandbox_name, ownership},
    recheck::{self, Wait},
    requeue::{object_key, prune_backoff, retry, settle, waited},
    status::{apply_status, apply_status_at, apply_status_of, is_conflict, mark_unusable},
};
use crate::{
    bridge::session::{CallError, Session},
    briq::SandboxApi,
    crd::{
        BriqExecutor, DEFAULT_EXECUTION_TIMEOUT_SECONDS, EXECUTIONS_MANAGER, EXECUTOR_MANAGER,
        Execution, ExecutionStatus, conditions, history_owner, reasons::ExecutionReason,
    },
    traces,
};

/// Whether an Execution may use its executor's sandbox now.
enum Access {
    Granted(crate::briq::ApiKey, String),
    Denied(Action),
}
/// After a conditional write lost to another writer: the watch brings the change; look again
/// soon in any case.
const CONFLICT_RECHECK: Duration = Duration::from_secs(1);
/// How long an action sent with its code at hand runs before `Running` is written beside it:
/// most agents' steps end sooner, and their result write is then the only one. Whoever watches
/// sees `Running` this much later on longer actions.
const RUNNING_WRITE_AFTER: Duration = Duration::from_millis(100);

/// The execution controller's context: what it shares with the other controller, its caches
/// and its own bookkeeping.
pub struct Context<S> {
    pub shared: Arc<Shared<S>>,
    store: Store<Execution>,
    /// The executor controller's cache: Executions that cannot run yet are judged from it, so
    /// waiting costs the API server nothing.
    executors: Store<BriqExecutor>,
    wake: mpsc::UnboundedSender<ObjectRef<Execution>>,
    kept: Bookkeeping,
    backoff: Backoff,
    /// The controller's work slots, shared fairly across namespaces; a reconcile holds one
    /// except while it only waits (for briq to run its code, for its executor's turn).
    work: Arc<FairShare>,
    /// Each namespace's places under its classes' `maxRunningExecutions`.
    capacity: capacity::Capacity,
    /// Whether the Execution cache is current: the head's turn is then decided from it, without
    /// a LIST ([`decide::turn_from_cache`]).
    pub freshness: Freshness,
    /// The code of Executions not sent yet, within a budget (the cache drops it).
    pub codes: codes::Codes,
}

impl<S> Context<S> {
    pub fn new(
        shared: Arc<Shared<S>>,
        store: Store<Execution>,
        executors: Store<BriqExecutor>,
        wake: mpsc::UnboundedSender<ObjectRef<Execution>>,
    ) -> Self {
        Context {
            backoff: shared.backoff(),
            work: FairShare::new(shared.settings.execution_concurrency.into()),
            shared,
            store,
            executors,
            wake,
            kept: Bookkeeping::default(),
            capacity: capacity::Capacity::default(),
            freshness: Freshness::default(),
            codes: codes::Codes::default(),
        }
    }

    /// An Execution is gone: what was kept of it goes, and the next in its queue may run.
    pub fn deleted(&self, execution: &Execution) {
        if let Some(uid) = execution.uid() {
            self.kept.execution_deleted(&uid);
            self.codes.forget(&uid);
        }
        self.backoff.forget(&object_key(execution));
        self.wake_next(execution);
        self.wake_waiting_for_capacity(execution);
    }

    /// An executor is gone: what was kept of it goes.
    pub fn executor_deleted(&self, executor: &BriqExecutor) {
        if let Some(uid) = executor.uid() {
            self.kept.executor_deleted(&uid);
        }
    }

    pub fn bookkeeping(&self) -> usize {
        self.kept.len() + self.backoff.len() + self.capacity.len()
    }

    /// Writes the execution counts that changed since the last time, one status write per
    /// executor (`Settings::count_write_interval`).
    pub async fn write_counts(&self) {
        for count in self.kept.take_unwritten_counts() {
            let api = Api::<BriqExecutor>::namespaced(self.shared.client.clone(), &count.namespace);
            let counters = json!({
                "executionsTotal": count.total,
                "lastExecutionTime": count.last_execution,
            });
            match apply_status_of(&api, &count.name, EXECUTIONS_MANAGER, counters).await {
                Ok(()) => {}
                Err(Error::Kube(kube::Error::Api(response))) if response.code == 404 => {}
                Err(error) => {
                    warn!(%error, executor = %count.name, "could not write the execution count");
                    self.kept.unwritten_count(count);
                }
            }
        }
    }

    /// Drops what is kept of objects the caches no longer hold.
    pub fn sweep(&self) {
        let executions: HashSet<String> =
            self.store.state().iter().filter_map(|e| e.uid()).collect();
        let executors: HashSet<String> = self
            .executors
            .state()
            .iter()
            .filter_map(|e| e.uid())
            .collect();
        self.kept.retain(
            |uid| executions.contains(uid),
            |uid| executors.contains(uid),
        );
        self.codes.retain(|uid| executions.contains(uid));
        prune_backoff(&self.backoff, &self.store);
    }

    fn is_finished(&self, execution: &Execution) -> bool {
        match execution.uid() {
            Some(uid) => self.kept.is_finished(&uid, execution.finished()),
            None => execution.finished(),
        }
    }

    fn is_unusable(&self, executor: &BriqExecutor) -> bool {
        executor
            .uid()
            .is_some_and(|uid| self.kept.is_unusable(&uid))
    }

    /// Unfinished Executions of the same executor, in run order.
    fn queue(&self, namespace: &str, executor: &str) -> Vec<Arc<Execution>> {
        let mut queue: Vec<Arc<Execution>> = of_executor(&self.store, namespace, executor)
            .filter(|e| e.metadata.deletion_timestamp.is_none() && !self.is_finished(e))
            .collect();
        queue.sort_by_key(|e| e.run_order());
        queue
    }

    fn cached_executor(&self, namespace: &str, name: &str) -> Option<Arc<BriqExecutor>> {
        self.executors.get(&ObjectRef::new(name).within(namespace))
    }

    /// How many unfinished Executions come before `execution` in the cached queue; `None` when
    /// it is not in it. The watch delivers Executions in the order the API server stored them,
    /// so a cached Execution comes with every one stored before it; but the run order breaks
    /// ties within one creationTimestamp second by name, so an Execution stored a moment later
    /// may still come first: the head confirms its turn ([`Actor::take_turn`]).
    ///
    /// Also how many of them hold a place before it ([`decide::Observed::ahead`]): those before
    /// it in run order and those already placed. Both from one read of the cached queue.
    fn queue_place(&self, execution: &Execution) -> (Option<usize>, usize) {
        let namespace = execution.namespace().unwrap_or_default();
        let order = execution.run_order();
        let queue = self.queue(&namespace, &execution.spec.executor_ref.name);
        let position = queue.iter().position(|e| e.uid() == execution.uid());
        let places = queue
            .iter()
            .filter(|e| e.uid() != execution.uid() && (e.run_order() < order || e.holds_a_place()))
            .count();
        (position, places)
    }

    /// Whether it is `execution`'s turn, asked of the API server (metadata only, selected by
    /// executor): when the watch cache is known to lag (listing, or its watch failed), it may
    /// not hold an Execution created a while ago.
    async fn turn(&self, api: &Api<Execution>, execution: &Execution) -> Result<Turn> {
        let selector = format!("spec.executorRef.name={}", execution.spec.executor_ref.name);
        let listed = api
            .list_metadata(&ListParams::default().fields(&selector))
            .await?;
        let namespace = execution.namespace().unwrap_or_default();
        let cached: std::collections::HashMap<String, Arc<Execution>> =
            of_executor(&self.store, &namespace, &execution.spec.executor_ref.name)
                .filter_map(|e| e.uid().map(|uid| (uid, e)))
                .collect();
        let siblings: Vec<Sibling> = listed
            .items
            .iter()
            .map(|sibling| {
                let finished = sibling
                    .uid()
                    .and_then(|uid| cached.get(&uid))
                    .is_some_and(|e| self.is_finished(e));
                self::sibling(&sibling.metadata, finished)
            })
            .collect();
        Ok(decide::turn(
            execution.uid().as_deref(),
            &execution.run_order(),
            &siblings,
            Timestamp::now(),
        ))
    }

    /// [`Context::turn`] as far as the cache knows, without asking the API server. The cache
    /// can miss siblings created a moment ago but never invents one, so when it says to wait
    /// (a burst still settling), the API server would say so too.
    fn cached_turn(&self, execution: &Execution) -> Turn {
        let namespace = execution.namespace().unwrap_or_default();
        let siblings: Vec<Sibling> =
            of_executor(&self.store, &namespace, &execution.spec.executor_ref.name)
                .map(|e| sibling(&e.metadata, self.is_finished(&e)))
                .collect();
        decide::turn(
            execution.uid().as_deref(),
            &execution.run_order(),
            &siblings,
            Timestamp::now(),
        )
    }

    fn finish(&self, execution: &Execution) {
        if let Some(uid) = execution.uid() {
            self.kept.finished(&uid);
            self.codes.forget(&uid);
        }
        self.wake_next(execution);
        self.wake_waiting_for_capacity(execution);
    }

    /// `execution` ended or went: the Executions of its namespace waiting for a place under
    /// their class's `maxRunningExecutions` look again.
    fn wake_waiting_for_capacity(&self, execution: &Execution) {
        let namespace = execution.namespace().unwrap_or_default();
        let uid = execution.uid().unwrap_or_default();
        for waiting in self.capacity.ended(&namespace, &uid) {
            let _ = self.wake.send(waiting);
        }
    }

    /// `execution`'s namespace queue under `executor`'s class, when the class limits it and
    /// `execution` has not started: how many of the namespace's Executions on executors of the
    /// class wait (not started, not finished) before it: before it in run order, or placed
    /// already.
    fn namespace_queue(
        &self,
        execution: &Execution,
        executor: &BriqExecutor,
    ) -> Option<decide::NamespaceQueue> {
        if execution
            .status
            .as_ref()
            .is_some_and(|s| s.attempt_id.is_some())
        {
            return None;
        }
        let shared = self.shared.as_ref();
        let class = made_under(shared, executor)?;
        let max = class
            .spec
            .per_namespace
            .as_ref()
            .and_then(|limits| limits.max_queued_executions)?;
        let namespace = execution.namespace().unwrap_or_default();
        let class_name = class.name_any();
        let order = execution.run_order();
        let waiting_before = self
            .store
            .state()
            .iter()
            .filter(|e| {
                e.namespace().as_deref() == Some(namespace.as_str())
                    && e.uid() != execution.uid()
                    && e.metadata.deletion_timestamp.is_none()
                    && e.status.as_ref().is_none_or(|s| s.attempt_id.is_none())
                    && !self.is_finished(e)
                    && (e.run_order() < order || e.holds_a_place())
                    && self
                        .cached_executor(&namespace, &e.spec.executor_ref.name)
                        .and_then(|executor| made_under(shared, &executor))
                        .is_some_and(|c| c.name_any() == class_name)
            })
            .count();
        Some(decide::NamespaceQueue {
            class: class_name,
            max,
            waiting_before,
        })
    }

    /// Whether `execution`, on `executor`, may start now under its class's
    /// `maxRunningExecutions` in its namespace: `Err(message)` when the namespace has no place.
    fn place(&self, execution: &Execution, executor: &BriqExecutor) -> Result<(), String> {
        let shared = self.shared.as_ref();
        let Some(class) = made_under(shared, executor) else {
            return Ok(());
        };
        let Some(max) = class
            .spec
            .per_namespace
            .as_ref()
            .and_then(|limits| limits.max_running_executions)
        else {
            return Ok(());
        };
        let namespace = execution.namespace().unwrap_or_default();
        let class_name = class.name_any();
        let of_class = |e: &Execution| {
            self.cached_executor(&namespace, &e.spec.executor_ref.name)
                .and_then(|executor| made_under(shared, &executor))
                .is_some_and(|c| c.name_any() == class_name)
        };
        let executions: Vec<Arc<Execution>> = self
            .store
            .state()
            .into_iter()
            .filter(|e| e.namespace().as_deref() == Some(namespace.as_str()))
            .collect();
        let running: std::collections::HashSet<String> = executions
            .iter()
            .filter(|e| {
                e.status.as_ref().is_some_and(|s| s.attempt_id.is_some())
                    && !self.is_finished(e)
                    && of_class(e)
            })
            .filter_map(|e| e.uid())
            .collect();
        let settled = |uid: &str| {
            executions
                .iter()
                .find(|e| e.uid().as_deref() == Some(uid))
                .is_none_or(|e| self.is_finished(e))
        };
        let uid = execution.uid().unwrap_or_default();
        if self
            .capacity
            .admit(&namespace, &uid, max as usize, &running, settled)
        {
            return Ok(());
        }
        self.capacity
            .wait(&namespace, ObjectRef::from_obj(execution));
        Err(format!(
            "namespace {namespace} runs {} Executions of class {class_name} at once, its \
             perNamespace.maxRunningExecutions; this one runs when one of them ends",
            running.len().max(max as usize)
        ))
    }

    /// Reconciles the head of the queue `execution` was in, now that it has left it (finished
    /// or deleted), rather than at the head's next re-check.
    fn wake_next(&self, execution: &Execution) {
        let namespace = execution.namespace().unwrap_or_default();
        if let Some(next) = self
            .queue(&namespace, &execution.spec.executor_ref.name)
            .first()
        {
            let _ = self.wake.send(ObjectRef::from_obj(next.as_ref()));
        }
    }
}

/// A sibling in the queue, from its metadata: done once deleted or `finished`.
fn sibling(metadata: &ObjectMeta, finished: bool) -> Sibling {
    Sibling {
        uid: metadata.uid.clone(),
        order: crate::crd::run_order(metadata),
        done: metadata.deletion_timestamp.is_some() || finished,
    }
}

#[instrument(skip_all, fields(namespace = execution.namespace(), name = execution.name_any()))]
pub async fn reconcile<S: SandboxApi>(
    execution: Arc<Execution>,
    ctx: Arc<Context<S>>,
) -> Result<Action> {
    let namespace = execution.namespace().unwrap_or_default();
    let slot = Held::take(&ctx.work, &namespace, Priority::Foreground).await;
    // The watch cache can still show "Running" for an Execution this process just finished.
    // Most reconciles are of finished Executions (all of them at start-up, at once): they stop
    // here, before the full reconcile's future (some 7 KiB) is allocated.
    if ctx.is_finished(&execution) {
        return expire(&execution, &ctx).await;
    }
    let result = Box::pin(Actor::new(&execution, &ctx, slot).reconcile()).await;
    settle(&ctx.backoff, execution.as_ref(), result)
}

/// Deletes a finished Execution once its time to live is over, or asks to be back then.
async fn expire<S>(execution: &Execution, ctx: &Context<S>) -> Result<Action> {
    let namespace = execution.namespace().unwrap_or_default();
    let ttl = execution.spec.ttl_seconds_after_finished.or_else(|| {
        ctx.cached_executor(&namespace, &execution.spec.executor_ref.name)
            .and_then(|executor| executor.spec.execution_ttl_seconds_after_finished)
    });
    let completed = execution
        .status
        .as_ref()
        .and_then(|s| s.completion_time.as_ref())
        .map(|t| t.0);
    match decide::expiry(completed, ttl, Timestamp::now()) {
        Expiry::Keep => Ok(Action::await_change()),
        Expiry::DeleteAfter(left) => Ok(Action::requeue(left)),
        Expiry::DeleteNow => {
            let api: Api<Execution> = Api::namespaced(ctx.shared.client.clone(), &namespace);
            let uid = execution.uid().unwrap_or_default();
            let params = DeleteParams::default().preconditions(Preconditions {
                uid: Some(uid),
                resource_version: None,
            });
            match api.delete(&execution.name_any(), &params).await {
                Ok(_) => info!("deleted a finished Execution whose time to live is over"),
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error.into()),
            }
            Ok(Action::await_change())
        }
    }
}

pub fn error_policy<S>(execution: Arc<Execution>, error: &Error, ctx: Arc<Context<S>>) -> Action {
    retry(&ctx.backoff, execution.as_ref(), error)
}

/// Performs one Execution's steps.
struct Actor<'a, S> {
    execution: &'a Execution,
    ctx: &'a Context<S>,
    api: Api<Execution>,
    executors: Api<BriqExecutor>,
    namespace: String,
    /// What this reconcile's run noted for its trace.
    timeline: Mutex<trace::Timeline>,
    /// Its work slot ([`FairShare`]), given back while it only waits.
    slot: Held,
}

impl<'a, S: SandboxApi> Actor<'a, S> {
    fn new(execution: &'a Execution, ctx: &'a Context<S>, slot: Held) -> Self {
        let namespace = execution.namespace().unwrap_or_default();
        let client = ctx.shared.client.clone();
        Actor {
            execution,
            ctx,
            api: Api::namespaced(client.clone(), &namespace),
            executors: Api::namespaced(client, &namespace),
            namespace,
            timeline: Mutex::default(),
            slot,
        }
    }

    fn executor_name(&self) -> &str {
        &self.execution.spec.executor_ref.name
    }

    fn status(&self) -> ExecutionStatus {
        self.execution.status.clone().unwrap_or_default()
    }

    fn observed<'b>(&'b self, executor: Option<&'b BriqExecutor>, uid: &str) -> Observed<'b> {
        let name = self.executor_name();
        let (position, places_before) = self.ctx.queue_place(self.execution);
        Observed {
            executor_name: name,
            namespace: &self.namespace,
            unwritten_result: self.ctx.kept.unwritten(uid).is_some(),
            attempt: self.status().attempt_id.map(|_| Attempt {
                started: self.status().start_time.map(|t| t.0),
                timeout_seconds: executor.map_or_else(
                    || {
                        decide::timeout_seconds(
                            self.execution.spec.timeout_seconds,
                            DEFAULT_EXECUTION_TIMEOUT_SECONDS,
                            None,
                        )
                    },
                    |executor| self.timeout_seconds(executor),
                ),
            }),
            now: Timestamp::now(),
            adopted: self
                .execution
                .owner_references()
                .iter()
                .any(|owner| owner.kind == "BriqExecutor" && owner.name == name),
            executor,
            created: self
                .execution
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0),
            executor_wait: SignedDuration::try_from(self.ctx.shared.settings.executor_wait)
                .unwrap_or(SignedDuration::MAX),
            executor_known_unusable: executor.is_some_and(|e| self.ctx.is_unusable(e)),
            heads_queue: position == Some(0),
            placed: self.execution.holds_a_place(),
            ahead: places_before,
            namespace_queue: executor.and_then(|e| self.ctx.namespace_queue(self.execution, e)),
        }
    }

    async fn reconcile(&self) -> Result<Action> {
        let uid = self
            .execution
            .uid()
            .ok_or_else(|| Error::Invariant("an Execution without uid".into()))?;
        // Waiting costs the API server nothing: the cache decides, and only an executor missing
        // from it is read (it may have been created a moment ago).
        let executor = match self
            .ctx
            .cached_executor(&self.namespace, self.executor_name())
        {
            Some(executor) => Some(executor),
            None => self
                .executors
                .get_opt(self.executor_name())
                .await?
                .map(Arc::new),
        };
        let executor = executor.as_deref();
        match decide::decide(&self.observed(executor, &uid)) {
            Step::WriteResult => {
                let result = self.ctx.kept.unwritten(&uid).unwrap_or_default();
                self.write(&result).await?;
                self.ctx.kept.written(&uid);
                self.ctx.finish(self.execution);
                Ok(Action::await_change())
            }
            Step::Interrupt => self.interrupt().await,
            Step::Recover => {
                let executor = executor.expect("recovery is decided on an executor");
                self.recover(executor).await
            }
            Step::AwaitAttempt(left) => Ok(Action::requeue(left)),
            Step::Refuse(refusal) => self.refuse(refusal).await,
            Step::Queue => {
                self.adopt(executor).await?;
                self.queued(recheck::recheck(Wait::Turn)).await
            }
            Step::ConfirmTurn => {
                let executor = executor.expect("a turn is confirmed on an admitted executor");
                let version = self.adopt(Some(executor)).await?;
                self.take_turn(executor, &version).await
            }
        }
    }

    /// At the head of the cached queue: confirm the turn (from the cache where it can decide,
    /// else asked of the API server: [`decide::turn_from_cache`]), then run under the
    /// executor's lock.
    ///
    /// The executor is the cached one, admitted by [`decide::decide`]: a cache lagging behind
    /// its deletion at most lets this Execution run while the finalizer drains (it waits for
    /// it), its sandbox is confirmed with briq before any code goes to it, and an executor this
    /// process made unusable is known here before the cache says so.
    async fn take_turn(&self, executor: &BriqExecutor, version: &str) -> Result<Action> {
        let cached = self.ctx.cached_turn(self.execution);
        let turn = match decide::turn_from_cache(cached, self.ctx.freshness.current()) {
            Some(turn) => turn,
            None => {
                let (turn, read) = traces::noted(self.ctx.turn(&self.api, self.execution)).await;
                self.note(|t| t.turn_read = read);
                turn?
            }
        };
        match turn {
            Turn::Mine => {}
            Turn::Behind => return self.queued(recheck::recheck(Wait::Turn)).await,
            Turn::Settling(left) => return self.queued(left).await,
        }
        let lock = self.ctx.kept.lock(&executor.uid().unwrap_or_default());
        let _turn = self.slot.without(lock.lock()).await;
        if self.ctx.shared.stopping() {
            // Shutting down: nothing new starts; the next operator (or leader) runs it.
            return Ok(Action::await_change());
        }
        // Another Execution may have made the executor unusable while this one waited.
        if let Some(verdict) = decide::unable(executor, self.ctx.is_unusable(executor)) {
            return self.conclude(self.status(), &verdict, None).await;
        }
        if let Err(message) = self.ctx.place(self.execution, executor) {
            self.wait(ExecutionReason::WaitingForCapacity, message)
                .await?;
            return Ok(Action::requeue(recheck::recheck(Wait::Capacity)));
        }
        self.run(executor, version).await
    }

    /// Sends the code, at most once: its attempt id derives from the Execution
    /// ([`decide::attempt_id`]), and the sandbox's journal runs an attempt id once, whoever
    /// delivers it and however often. With its code at hand ([`codes`]) it goes at once, and
    /// `Running` is written beside the exec once the action outlasts [`RUNNING_WRITE_AFTER`]
    /// (an action that ends first has it folded into its result: one write); otherwise the
    /// `Running` write comes first and brings the code back. `version` is the Execution's
    /// resourceVersion this run was decided on: `Running` is recorded only at that version.
    async fn run(&self, executor: &BriqExecutor, version: &str) -> Result<Action> {
        let (access, checked) = traces::noted(self.sandbox(executor)).await;
        self.note(|t| t.sandbox_check = checked);
        let (key, sandbox_id) = match access? {
            Access::Granted(key, sandbox_id) => (key, sandbox_id),
            Access::Denied(action) => return Ok(action),
        };
        let uid = self.execution.uid().unwrap_or_default();
        let attempt = decide::attempt_id(&uid);
        let running = decide::running_status(
            &self.status(),
            self.execution.metadata.generation,
            self.executor_name(),
            attempt.clone(),
            conditions::now(),
        );
        let timeout = self.timeout_seconds(executor);
        let deadline = Duration::from_secs(timeout.into());
        let session = self.session(&key, &sandbox_id);
        let (outcome, sent) = match self.ctx.codes.get(&uid) {
            Some(code) => {
                self.ctx.kept.forget_waiting(&uid);
                let exec = traces::noted(session.run(&attempt, &code, deadline));
                self.slot
                    .without(self.record_beside(exec, &running, version))
                    .await
            }
            None => {
                let Some(recorded) = self.record_first(&running, version).await? else {
                    return Ok(Action::requeue(CONFLICT_RECHECK));
                };
                self.slot
                    .without(traces::noted(session.run(
                        &attempt,
                        &recorded.spec.code,
                        deadline,
                    )))
                    .await
            }
        };
        self.note(|t| {
            t.code = sent;
            t.kernel = outcome
                .as_ref()
                .ok()
                .map(|result| Duration::from_millis(result.duration_ms));
        });
        let (verdict, result) = match decide::ran(outcome, timeout) {
            Ok(judged) => judged,
            Err(unknown) => return self.await_briq(executor, running, unknown).await,
        };
        let action = self.finish_run(executor, running, &verdict, result).await;
        if action.is_ok() {
            self.emit_trace(&attempt, &verdict);
        }
        action
    }

    /// Records `running` before the code goes (conditionally, at `version`): the recorded
    /// Execution (the whole object, at the version decided on plus this status; the spec is
    /// immutable) brings the code, which the cache does not hold. `None` when the Execution
    /// changed since the decision (another operator recorded its attempt, or anyone wrote it):
    /// it is decided again on what it is now.
    async fn record_first(
        &self,
        running: &ExecutionStatus,
        version: &str,
    ) -> Result<Option<Execution>> {
        match self.record_running(running, version).await {
            Ok(recorded) => {
                self.ctx
                    .kept
                    .forget_waiting(&recorded.uid().unwrap_or_default());
                Ok(Some(recorded))
            }
            Err(error) if is_conflict(&error) => {
                info!("the Execution changed before its attempt was recorded; deciding again");
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// Awaits `exec`, the code already sent, and records `running` beside it (conditionally,
    /// at `version`) once the action outlasts [`RUNNING_WRITE_AFTER`]; an action that ends
    /// first has it folded into its result write. The record informs, it does not guard: the
    /// journal runs the attempt once, so a write that fails or finds the Execution changed (a
    /// second operator recorded the same attempt) is only logged, and the result is written in
    /// any case.
    async fn record_beside<F, T>(&self, exec: F, running: &ExecutionStatus, version: &str) -> T
    where
        F: Future<Output = T>,
    {
        let mut exec = std::pin::pin!(exec);
        tokio::select! {
            done = &mut exec => return done,
            () = tokio::time::sleep(RUNNING_WRITE_AFTER) => {}
        }
        let (done, recorded) = tokio::join!(exec, self.record_running(running, version));
        match recorded {
            Ok(_) => {}
            Err(error) if is_conflict(&error) => {
                info!(
                    "the Execution changed before its attempt was recorded; the journal runs it once"
                )
            }
            Err(error) => {
                warn!(%error, "recording the attempt beside its run failed; its result is written next")
            }
        }
        done
    }

    /// Writes `running`, only if the Execution is still at `version`; noted in its trace.
    async fn record_running(&self, running: &ExecutionStatus, version: &str) -> Result<Execution> {
        let status = serde_json::to_value(running).expect("status serializes");
        let (recorded, recording) = traces::noted(apply_status_at(
            &self.api,
            self.execution,
            EXECUTOR_MANAGER,
            status,
            Some(version),
        ))
        .await;
        self.note(|t| t.attempt_recorded = recording);
        recorded
    }

    /// briq did not answer whether the attempt in `base` ran: the Execution stays running, says
    /// it waits for briq, and asks the sandbox's journal again later ([`Actor::recover`]);
    /// once its patience is over, the outcome stayed unknown and the executor is unusable.
    async fn await_briq(
        &self,
        executor: &BriqExecutor,
        base: ExecutionStatus,
        error: CallError,
    ) -> Result<Action> {
        let attempt = Attempt {
            started: base.start_time.as_ref().map(|t| t.0),
            timeout_seconds: self.timeout_seconds(executor),
        };
        let patience = self.ctx.shared.settings.outage_patience;
        let now = Timestamp::now();
        let Some(left) = decide::patience_left(&attempt, patience, now) else {
            warn!(%error, "briq did not answer whether the code ran within the outage patience");
            let verdict = decide::outcome_stayed_unknown(&error, patience);
            return self.finish_run(executor, base, &verdict, None).await;
        };
        warn!(%error, ?left, "briq did not answer whether the code ran; its journal will be asked");
        let give_up = SignedDuration::try_from(left)
            .ok()
            .and_then(|left| now.checked_add(left).ok());
        let message = decide::waiting_for_briq_message(&error, give_up);
        self.wait_for_briq(base, message).await?;
        let waited = attempt
            .started
            .map(|started| now.duration_since(started).max(SignedDuration::ZERO))
            .map_or(Duration::ZERO, SignedDuration::unsigned_abs);
        Ok(Action::requeue(recheck::recheck(Wait::Briq {
            waited,
            left,
            retry_after: error.retry_after(),
        })))
    }

    /// Says the Execution waits for briq (`WaitingForBriq`), keeping the attempt of `base`
    /// recorded, unless it says so already: one write per wait, not one per question.
    async fn wait_for_briq(&self, base: ExecutionStatus, message: String) -> Result<()> {
        let uid = self.execution.uid().unwrap_or_default();
        let current = self
            .ctx
            .kept
            .waiting_written(&uid)
            .filter(|written| written.attempt_id == base.attempt_id)
            .unwrap_or(base);
        let reason = ExecutionReason::WaitingForBriq;
        let already = conditions::find(&current.conditions, conditions::SUCCEEDED)
            .is_some_and(|c| c.status == "Unknown" && c.reason == reason.as_str());
        if already {
            return Ok(());
        }
        let generation = self.execution.metadata.generation;
        if let Some(waiting) = decide::waiting_status(&current, generation, reason, message) {
            self.write(&waiting).await?;
            self.ctx.kept.wrote_waiting(&uid, waiting);
        }
        Ok(())
    }

    /// Notes a step of this run for its trace (when traces are exported).
    fn note(&self, step: impl FnOnce(&mut trace::Timeline)) {
        if traces::enabled() {
            step(&mut self.timeline.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }

    /// Exports the trace of this run, under the client's span when it named one.
    fn emit_trace(&self, attempt: &str, verdict: &Verdict) {
        if !traces::enabled() {
            return;
        }
        let name = self.execution.name_any();
        let subject = trace::Subject {
            namespace: &self.namespace,
            execution: &name,
            executor: self.executor_name(),
            attempt,
            created: self
                .execution
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or_else(SystemTime::now, |t| t.0.into()),
        };
        let timeline = self.timeline.lock().unwrap_or_else(|e| e.into_inner());
        let spans = trace::spans(
            &subject,
            &timeline,
            verdict.reason,
            &verdict.message,
            SystemTime::now(),
        );
        let parent = self
            .execution
            .annotations()
            .get(traces::TRACEPARENT_ANNOTATION)
            .map(String::as_str);
        traces::emit(parent, &spans);
    }

    /// The deadline of this Execution's code in `executor`, in seconds.
    /// The run's deadline, under the class the executor was made under.
    fn timeout_seconds(&self, executor: &BriqExecutor) -> u32 {
        let class = made_under(&self.ctx.shared, executor);
        let class = class.as_ref().map(|c| &c.spec);
        decide::timeout_seconds(
            self.execution.spec.timeout_seconds,
            class::effective(&executor.spec, class).execution_timeout_seconds,
            class.and_then(|c| c.max_execution_timeout_seconds),
        )
    }

    fn session<'s>(&'s self, key: &'s crate::briq::ApiKey, sandbox_id: &'s str) -> Session<'s, S> {
        Session {
            api: &self.ctx.shared.sandboxes,
            key,
            sandbox_id,
        }
    }

    /// The executor's key and sandbox, once briq confirms the sandbox is the executor's own; or
    /// what was done instead (waiting for a key; the Execution concluded, the executor poisoned
    /// when its sandbox is not its own).
    async fn sandbox(&self, executor: &BriqExecutor) -> Result<Access> {
        let key = match api_key(&self.ctx.shared, executor).await {
            Ok(key) => key,
            Err(Error::ApiKey(message)) => {
                self.wait(ExecutionReason::ExecutorNotReady, message)
                    .await?;
                let waited = waited(self.execution);
                let recheck = recheck::recheck(Wait::KeySecret { waited });
                return Ok(Access::Denied(Action::requeue(recheck)));
            }
            Err(error) => return Err(error),
        };
        let sandbox_id = executor
            .status
            .as_ref()
            .and_then(|s| s.sandbox_id.clone())
            .ok_or_else(|| {
                Error::Invariant(format!(
                    "BriqExecutor {} is ready without a sandbox",
                    self.executor_name()
                ))
            })?;
        if let Some(verdict) = self.verify_ownership(executor, &key, &sandbox_id).await? {
            if let Some(why) = &verdict.unusable {
                self.poison(executor, why).await?;
            }
            let action = self.conclude(self.status(), &verdict, None).await?;
            return Ok(Access::Denied(action));
        }
        Ok(Access::Granted(key, sandbox_id))
    }

    /// Recorded as running, with no result in this process: an operator restart, a fail-over
    /// or a second operator. The sandbox's journal says what became of the attempt; nothing
    /// runs twice, and only an attempt the sandbox never accepted is sent (as the same attempt).
    async fn recover(&self, executor: &BriqExecutor) -> Result<Action> {
        let base = self.status();
        let attempt = base
            .attempt_id
            .clone()
            .ok_or_else(|| Error::Invariant("recovering an Execution without attempt".into()))?;
        let access = match self.sandbox(executor).await {
            // Whose the sandbox is could not be asked: nor could the journal be.
            Err(Error::Briq(error)) => {
                return self.await_briq(executor, base, error.into()).await;
            }
            access => access?,
        };
        let (key, sandbox_id) = match access {
            Access::Granted(key, sandbox_id) => (key, sandbox_id),
            Access::Denied(action) => return Ok(action),
        };
        let lock = self.ctx.kept.lock(&executor.uid().unwrap_or_default());
        let _turn = self.slot.without(lock.lock()).await;
        if self.ctx.shared.stopping() {
            return Ok(Action::await_change());
        }
        let timeout = self.timeout_seconds(executor);
        let session = self.session(&key, &sandbox_id);
        let seconds = Duration::from_secs(timeout.into());
        let answer = session.recall(&attempt, seconds).await;
        let (verdict, result) = match decide::recovered(answer, timeout) {
            decide::Recovered::Judge(judged) => *judged,
            decide::Recovered::AskAgain(error) => {
                return self.await_briq(executor, base, error).await;
            }
            decide::Recovered::Resend => {
                // The cache holds no code; the Execution as it is now does, and must still be
                // at this attempt with no result (someone else may have recovered it).
                let fresh = self.api.get(&self.execution.name_any()).await?;
                let current = fresh.status.clone().unwrap_or_default();
                if current.attempt_id.as_deref() != Some(attempt.as_str()) || fresh.finished() {
                    return Ok(Action::requeue(CONFLICT_RECHECK));
                }
                info!(%attempt, "the attempt never reached the sandbox; sending it now");
                let outcome = session.run(&attempt, &fresh.spec.code, seconds).await;
                match decide::ran(outcome, timeout) {
                    Ok(judged) => judged,
                    Err(unknown) => return self.await_briq(executor, base, unknown).await,
                }
            }
        };
        info!(%attempt, "recovered an Execution the operator lost track of");
        self.finish_run(executor, base, &verdict, result).await
    }

    /// After a run (or a recovery): poisons the executor when the verdict says so, counts the
    /// execution on the executor, and writes the result.
    async fn finish_run(
        &self,
        executor: &BriqExecutor,
        base: ExecutionStatus,
        verdict: &Verdict,
        result: Option<crate::bridge::RunResult>,
    ) -> Result<Action> {
        info!(reason = %verdict.reason, "execution finished");

        // Poison the executor before anyone else can take the next turn.
        if let Some(why) = &verdict.unusable {
            self.poison(executor, why).await?;
        }
        let recorded = executor
            .status
            .as_ref()
            .and_then(|s| s.executions_total)
            .unwrap_or(0);
        // Written with the counts of other Executions later (Context::write_counts).
        self.ctx.kept.count_execution(
            &executor.uid().unwrap_or_default(),
            &self.namespace,
            &executor.name_any(),
            recorded,
        );
        let action = self.conclude(base, verdict, result).await?;
        self.prune(executor).await;
        Ok(action)
    }

    /// Why the code must not go to `sandbox`, if it must not: the executor's status names it, and
    /// status is tenant-writable, so briq confirms it is the executor's own (once per executor
    /// and sandbox; this process remembers the answer).
    async fn verify_ownership(
        &self,
        executor: &BriqExecutor,
        key: &crate::briq::ApiKey,
        sandbox: &str,
    ) -> Result<Option<Verdict>> {
        let uid = executor.uid().unwrap_or_default();
        if self.ctx.kept.owns(&uid, sandbox) {
            return Ok(None);
        }
        let found = self.ctx.shared.sandboxes.get_sandbox(key, sandbox).await;
        let member = claimed_member(executor, &self.ctx.executors, &self.ctx.shared.client).await?;
        let expected = expected_sandbox_name(executor, member.as_ref());
        let Some(ownership) = ownership(&expected, &found) else {
            return Err(found.expect_err("briq did not say").into());
        };
        if ownership == Ownership::Owned {
            self.ctx.kept.confirmed_owner(&uid, sandbox);
        }
        Ok(decide::ownership_verdict(sandbox, &ownership))
    }

    /// Recorded as running, but no result: the code may have run. Never send it again.
    async fn interrupt(&self) -> Result<Action> {
        if let Some(executor) = self.executors.get_opt(self.executor_name()).await? {
            let why = format!(
                "Execution {} was interrupted mid-run; the kernel state is uncertain",
                self.execution.name_any()
            );
            self.poison(&executor, &why).await?;
        }
        let verdict = Verdict::new(
            ExecutionReason::Interrupted,
            "the operator stopped while this Execution was running; it is not run again because it may have run",
        );
        self.conclude(self.status(), &verdict, None).await
    }

    async fn poison(&self, executor: &BriqExecutor, why: &str) -> Result<()> {
        if let Some(uid) = executor.uid() {
            self.ctx.kept.made_unusable(&uid);
        }
        mark_unusable(&self.ctx.shared, executor, why).await
    }

    async fn refuse(&self, refusal: Refusal) -> Result<Action> {
        match refusal {
            Refusal::Fail(verdict) => self.conclude(self.status(), &verdict, None).await,
            Refusal::Wait {
                reason,
                message,
                recheck,
            } => {
                self.wait(reason, message).await?;
                Ok(Action::requeue(recheck))
            }
        }
    }

    /// Writes the final status and lets the next Execution of the executor go.
    async fn conclude(
        &self,
        base: ExecutionStatus,
        verdict: &Verdict,
        result: Option<crate::bridge::RunResult>,
    ) -> Result<Action> {
        let status = decide::final_status(
            &base,
            self.execution.metadata.generation,
            verdict,
            result,
            conditions::now(),
        );
        let (written, writing) = traces::noted(self.write(&status)).await;
        self.note(|t| t.result_written = writing);
        if let Err(error) = written {
            // Keep the result: the retry writes it rather than calling the Execution interrupted.
            if let Some(uid) = self.execution.uid() {
                self.ctx.kept.keep_unwritten(&uid, status);
            }
            return Err(error);
        }
        self.ctx.shared.metrics.execution_finished(
            verdict.reason,
            status.start_time.as_ref(),
            status.completion_time.as_ref(),
        );
        self.ctx.finish(self.execution);
        Ok(Action::await_change())
    }

    async fn queued(&self, recheck: Duration) -> Result<Action> {
        let message = format!(
            "waiting for earlier Executions of BriqExecutor {}",
            self.executor_name()
        );
        self.wait(ExecutionReason::Queued, message).await?;
        Ok(Action::requeue(recheck))
    }

    /// Reports a not-yet-runnable Execution (Succeeded=Unknown) unless it already says so, or
    /// this process wrote so and its cache does not show it yet: an Execution waiting in a
    /// burst is reconciled on each of its own changes, which arrive after the next decision.
    async fn wait(&self, reason: ExecutionReason, message: String) -> Result<()> {
        let generation = self.execution.metadata.generation;
        let uid = self.execution.uid().unwrap_or_default();
        let current = self
            .ctx
            .kept
            .waiting_written(&uid)
            .unwrap_or_else(|| self.status());
        if let Some(waiting) = decide::waiting_status(&current, generation, reason, message) {
            self.write(&waiting).await?;
            self.ctx.kept.wrote_waiting(&uid, waiting);
        }
        Ok(())
    }

    async fn write(&self, status: &ExecutionStatus) -> Result<()> {
        let status = serde_json::to_value(status).expect("status serializes");
        apply_status(&self.api, self.execution, EXECUTOR_MANAGER, status).await
    }

    /// Makes the executor the Execution's owner, so that deleting an executor deletes its
    /// history.
    /// Returns the Execution's resourceVersion after it (the patched one, or the one seen).
    async fn adopt(&self, executor: Option<&BriqExecutor>) -> Result<String> {
        let seen = self.execution.resource_version().unwrap_or_default();
        let Some(uid) = executor.and_then(|e| e.uid()) else {
            return Ok(seen);
        };
        let executor = executor.expect("an executor with a uid");
        let mut owners = self.execution.owner_references().to_vec();
        if owners.iter().any(|owner| owner.uid == uid) {
            // Its creator set it (the Python client and kubectl-briq do): no write.
            return Ok(seen);
        }
        owners.extend(history_owner(executor));
        // Conditional too: an owner reference added on top of someone else's change would make
        // the decision look fresher than it is.
        let patch = json!({ "metadata": { "ownerReferences": owners, "resourceVersion": seen } });
        let adopted = self
            .api
            .patch(
                &self.execution.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        Ok(adopted.resource_version().unwrap_or_default())
    }

    /// Deletes the oldest finished Executions beyond the executor's `executionHistoryLimit`.
    async fn prune(&self, executor: &BriqExecutor) {
        let Some(limit) = executor.spec.execution_history_limit else {
            return;
        };
        let done = of_executor(&self.ctx.store, &self.namespace, self.executor_name())
            .filter(|e| e.metadata.deletion_timestamp.is_none() && self.ctx.is_finished(e))
            .map(|e| (e.run_order(), e.name_any()))
            .collect();
        for old in decide::beyond_history(done, limit as usize) {
            if let Err(error) = self.api.delete(&old, &DeleteParams::default()).await {
                warn!(%error, execution = %old, "could not prune an old Execution");
            }
        }
    }
}
