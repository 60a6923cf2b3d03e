//! The `Execution` reconciler: runs each Execution at most once, one at a time per executor, in
//! creation order.
//!
//! kube-runtime never reconciles one object twice at once, but reconciles different
//! Executions concurrently; the per-executor lock and the order check here serialize them.
//! "Running" is recorded with an attempt id *before* the code is sent, so an Execution found
//! running without a result (the operator stopped mid-run) is never sent again.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::OwnerReference,
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
    runtime::{
        controller::Action,
        reflector::{ObjectRef, Store},
    },
};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{info, instrument, warn};

use super::{
    Context, EXECUTIONS_MANAGER, EXECUTOR_MANAGER, Error, Result, api_key, apply_status,
    conditions::{self, READY, STALLED, SUCCEEDED, desired},
    failure_key, mark_unusable,
    session::{CallError, Session},
};
use crate::{
    bridge::{RunResult, RunStatus},
    briq::SandboxApi,
    crd::{
        BriqExecutor, Execution, ExecutionError, ExecutionStatus, MAX_EXECUTION_TIMEOUT_SECONDS,
    },
};

/// Fallback re-check of a queued Execution, should the wake-up after its predecessor be missed
/// (it reads only the caches).
const QUEUED_RECHECK: Duration = Duration::from_secs(5);
const API_KEY_RECHECK: Duration = Duration::from_secs(30);

/// How long after its creationTimestamp (whole seconds) the head of a burst of Executions
/// created in one second waits before it runs: siblings of that second may still be arriving.
const BURST_SETTLE: SignedDuration = SignedDuration::from_secs(2);

/// Where an Execution stands in its executor's queue.
enum Turn {
    Mine,
    Behind,
    /// First so far, but of a burst that may still grow: ask again after this long.
    Settling(Duration),
}

/// In-process bookkeeping of the execution controller.
pub struct Runner {
    store: Store<Execution>,
    /// The executor controller's cache: Executions that cannot run yet are judged from it, so
    /// waiting costs the API server nothing.
    executors: Store<BriqExecutor>,
    wake: mpsc::UnboundedSender<ObjectRef<Execution>>,
    /// One lock per executor (by uid): at most one Execution runs in it at a time.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Executions this process finished; the watch cache may not show it yet.
    finished: Mutex<HashSet<String>>,
    /// Executors found unusable by this process, before the API server has said so.
    unusable: Mutex<HashSet<String>>,
    /// Results whose status write failed: written on the next reconcile instead of "Interrupted".
    unwritten: Mutex<HashMap<String, ExecutionStatus>>,
    /// Execution counts per executor, continued from the executor's status.
    counts: Mutex<HashMap<String, u64>>,
}

impl Runner {
    pub fn new(
        store: Store<Execution>,
        executors: Store<BriqExecutor>,
        wake: mpsc::UnboundedSender<ObjectRef<Execution>>,
    ) -> Self {
        Runner {
            store,
            executors,
            wake,
            locks: Mutex::default(),
            finished: Mutex::default(),
            unusable: Mutex::default(),
            unwritten: Mutex::default(),
            counts: Mutex::default(),
        }
    }

    pub fn forget_usable(&self, executor: &BriqExecutor) {
        if let Some(uid) = executor.uid() {
            self.unusable.lock().expect("poisoned").insert(uid);
        }
    }

    fn is_unusable(&self, executor: &BriqExecutor) -> bool {
        executor.status.as_ref().is_some_and(|s| s.unusable)
            || executor
                .uid()
                .is_some_and(|uid| self.unusable.lock().expect("poisoned").contains(&uid))
    }

    fn lock(&self, executor_uid: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .expect("poisoned")
            .entry(executor_uid.to_owned())
            .or_default()
            .clone()
    }

    fn is_finished(&self, execution: &Execution) -> bool {
        let Some(uid) = execution.uid() else {
            return finished(execution);
        };
        let mut finished_here = self.finished.lock().expect("poisoned");
        if finished(execution) {
            // The cache has caught up: the local record is no longer needed.
            finished_here.remove(&uid);
            return true;
        }
        finished_here.contains(&uid)
    }

    /// Unfinished Executions of the same executor, in run order.
    fn queue(&self, namespace: &str, executor: &str) -> Vec<Arc<Execution>> {
        let mut queue: Vec<Arc<Execution>> = of_executor(&self.store, namespace, executor)
            .filter(|e| e.metadata.deletion_timestamp.is_none() && !self.is_finished(e))
            .collect();
        queue.sort_by_key(|e| run_order(e));
        queue
    }

    fn cached_executor(&self, namespace: &str, name: &str) -> Option<Arc<BriqExecutor>> {
        self.executors.get(&ObjectRef::new(name).within(namespace))
    }

    /// Whether the cache puts `execution` at the head of its executor's queue. The watch
    /// delivers Executions in the order the API server stored them, so a cached Execution comes
    /// with every one stored before it; but the run order breaks ties within one
    /// creationTimestamp second by name, so an Execution stored a moment later may still come
    /// first: the head confirms with [`Runner::turn`].
    fn heads_queue(&self, execution: &Execution) -> bool {
        let namespace = execution.namespace().unwrap_or_default();
        self.queue(&namespace, &execution.spec.executor_ref.name)
            .first()
            .is_some_and(|head| head.uid() == execution.uid())
    }

    /// Whether it is `execution`'s turn, asked of the API server (metadata only, selected by
    /// executor): the watch cache may not hold yet an Execution created a moment ago.
    async fn turn(&self, api: &Api<Execution>, execution: &Execution) -> Result<Turn> {
        let selector = format!("spec.executorRef.name={}", execution.spec.executor_ref.name);
        let siblings = api
            .list_metadata(&ListParams::default().fields(&selector))
            .await?;
        let mine = run_order(execution);
        let namespace = execution.namespace().unwrap_or_default();
        let cached: HashMap<String, Arc<Execution>> =
            of_executor(&self.store, &namespace, &execution.spec.executor_ref.name)
                .filter_map(|e| e.uid().map(|uid| (uid, e)))
                .collect();
        let mut burst = false;
        for sibling in &siblings.items {
            // Not in the cache yet means not known to be finished: it counts as waiting.
            let done = sibling.metadata.deletion_timestamp.is_some()
                || sibling
                    .uid()
                    .and_then(|uid| cached.get(&uid).cloned())
                    .is_some_and(|e| self.is_finished(&e));
            if sibling.uid() == execution.uid() || done {
                continue;
            }
            let created = sibling.metadata.creation_timestamp.as_ref().map(|t| t.0);
            if (created, sibling.name_any()) < mine {
                return Ok(Turn::Behind);
            }
            burst |= created == mine.0;
        }
        // Created in the same second as others still waiting: one that sorts before it by name
        // may still be on its way. Let the second settle first.
        let settled = mine
            .0
            .and_then(|created| created.checked_add(BURST_SETTLE).ok());
        match settled.map(|at| Timestamp::now().duration_until(at)) {
            Some(left) if burst && left.is_positive() => Ok(Turn::Settling(left.unsigned_abs())),
            _ => Ok(Turn::Mine),
        }
    }

    fn finish(&self, execution: &Execution) {
        if let Some(uid) = execution.uid() {
            self.finished.lock().expect("poisoned").insert(uid);
        }
        self.wake_next(execution);
    }

    /// Reconciles the head of the queue `execution` was in, now that it has left it (finished
    /// or deleted), rather than at the head's next re-check.
    pub fn wake_next(&self, execution: &Execution) {
        let namespace = execution.namespace().unwrap_or_default();
        if let Some(next) = self
            .queue(&namespace, &execution.spec.executor_ref.name)
            .first()
        {
            let _ = self.wake.send(ObjectRef::from_obj(next.as_ref()));
        }
    }

    fn next_count(&self, executor: &BriqExecutor) -> u64 {
        let mut counts = self.counts.lock().expect("poisoned");
        let count = counts
            .entry(executor.uid().unwrap_or_default())
            .or_insert_with(|| {
                executor
                    .status
                    .as_ref()
                    .and_then(|s| s.executions_total)
                    .unwrap_or(0)
            });
        *count += 1;
        *count
    }
}

fn run_order(execution: &Execution) -> (Option<Timestamp>, String) {
    (
        execution.metadata.creation_timestamp.as_ref().map(|t| t.0),
        execution.name_any(),
    )
}

pub(super) fn finished(execution: &Execution) -> bool {
    execution
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, SUCCEEDED))
        .is_some_and(|c| c.status != "Unknown")
}

/// The unfinished Executions that wait on `executor` (for the watch on executors).
pub fn waiting_on(store: &Store<Execution>, executor: &BriqExecutor) -> Vec<ObjectRef<Execution>> {
    let namespace = executor.namespace().unwrap_or_default();
    of_executor(store, &namespace, &executor.name_any())
        .filter(|e| !finished(e))
        .map(|e| ObjectRef::from_obj(e.as_ref()))
        .collect()
}

/// Every cached Execution of executor `namespace/name`, finished or not.
fn of_executor<'a>(
    store: &Store<Execution>,
    namespace: &'a str,
    name: &'a str,
) -> impl Iterator<Item = Arc<Execution>> + 'a {
    store.state().into_iter().filter(move |e| {
        e.namespace().as_deref() == Some(namespace) && e.spec.executor_ref.name == name
    })
}

#[instrument(skip_all, fields(namespace = execution.namespace(), name = execution.name_any()))]
pub async fn reconcile<S: SandboxApi>(
    execution: Arc<Execution>,
    ctx: Arc<Context<S>>,
) -> Result<Action> {
    // The watch cache can still show "Running" for an Execution this process just finished.
    // Most reconciles are of finished Executions (all of them at start-up, at once): they stop
    // here, before the full reconcile's future (some 7 KiB) is allocated.
    if ctx.executions.is_finished(&execution) {
        return Ok(Action::await_change());
    }
    let failures = failure_key(execution.as_ref());
    let result = Box::pin(reconcile_one(&execution, &ctx)).await;
    if result.is_ok() {
        ctx.succeeded(&failures);
    }
    result
}

pub fn error_policy<S>(execution: Arc<Execution>, error: &Error, ctx: Arc<Context<S>>) -> Action {
    let delay = ctx.backoff(failure_key(execution.as_ref()));
    warn!(execution = %execution.name_any(), %error, ?delay, "execution reconcile failed; retrying");
    Action::requeue(delay)
}

/// How an Execution ended.
struct Verdict {
    succeeded: bool,
    reason: &'static str,
    message: String,
    /// Set when the executor must never run code again.
    unusable: Option<String>,
}

impl Verdict {
    fn failed(reason: &'static str, message: impl Into<String>) -> Verdict {
        Verdict {
            succeeded: false,
            reason,
            message: message.into(),
            unusable: None,
        }
    }

    fn poisons(mut self, why: impl Into<String>) -> Verdict {
        self.unusable = Some(why.into());
        self
    }
}

async fn reconcile_one<S: SandboxApi>(execution: &Execution, ctx: &Context<S>) -> Result<Action> {
    let namespace = execution.namespace().unwrap_or_default();
    let api: Api<Execution> = Api::namespaced(ctx.client.clone(), &namespace);
    let executors: Api<BriqExecutor> = Api::namespaced(ctx.client.clone(), &namespace);
    let runner = &ctx.executions;
    let status = execution.status.clone().unwrap_or_default();
    let uid = execution
        .uid()
        .ok_or_else(|| Error::Invariant("an Execution without uid".into()))?;
    let executor_name = &execution.spec.executor_ref.name;

    // 1. A result this process could not write yet.
    let unwritten = runner
        .unwritten
        .lock()
        .expect("poisoned")
        .get(&uid)
        .cloned();
    if let Some(result) = unwritten {
        write(&api, execution, &result).await?;
        runner.unwritten.lock().expect("poisoned").remove(&uid);
        runner.finish(execution);
        return Ok(Action::await_change());
    }

    // 2. Recorded as running, but no result: the code may have run. Never send it again.
    if status.attempt_id.is_some() {
        let executor = executors.get_opt(executor_name).await?;
        if let Some(executor) = &executor {
            let why = format!(
                "Execution {} was interrupted mid-run; the kernel state is uncertain",
                execution.name_any()
            );
            mark_unusable(ctx, executor, &why).await?;
        }
        let verdict = Verdict::failed(
            "Interrupted",
            "the operator stopped while this Execution was running; it is not run again because it may have run",
        );
        return conclude(&api, execution, status, &verdict, None, ctx).await;
    }

    // 3. The executor must exist and be ready; unusable ones fail fast. Waiting costs the API
    //    server nothing: the cache decides, and only an executor missing from it is read (it
    //    may have been created a moment ago).
    let cached = match runner.cached_executor(&namespace, executor_name) {
        Some(executor) => Some(executor),
        None => executors.get_opt(executor_name).await?.map(Arc::new),
    };
    let executor = match admit(execution, cached.as_deref(), runner) {
        Ok(executor) => executor,
        Err(refusal) => return refuse(&api, execution, status, refusal, ctx).await,
    };
    adopt(&api, execution, executor).await?;

    // 4. One at a time per executor, oldest first. Only the head of the queue reads anything
    //    afresh: its turn (the API server may hold a sibling the cache does not yet), then its
    //    executor (the cache can lag behind a deletion). It alone waits for the lock, briefly,
    //    while its predecessor writes its result.
    if !runner.heads_queue(execution) {
        return queued(&api, execution, QUEUED_RECHECK).await;
    }
    match runner.turn(&api, execution).await? {
        Turn::Mine => {}
        Turn::Behind => return queued(&api, execution, QUEUED_RECHECK).await,
        Turn::Settling(left) => return queued(&api, execution, left).await,
    }
    let fresh = executors.get_opt(executor_name).await?;
    let executor = match admit(execution, fresh.as_ref(), runner) {
        Ok(executor) => executor,
        Err(refusal) => return refuse(&api, execution, status, refusal, ctx).await,
    };
    let lock = runner.lock(&executor.uid().unwrap_or_default());
    let _turn = lock.lock().await;
    if ctx.stopping() {
        // Shutting down: nothing new starts; the next operator (or leader) runs it.
        return Ok(Action::await_change());
    }
    if let Some(verdict) = unable(executor, runner) {
        return conclude(&api, execution, status, &verdict, None, ctx).await;
    }
    let key = match api_key(ctx, executor).await {
        Ok(key) => key,
        Err(Error::ApiKey(message)) => {
            wait(&api, execution, "ExecutorNotReady", message).await?;
            return Ok(Action::requeue(API_KEY_RECHECK));
        }
        Err(error) => return Err(error),
    };
    let sandbox_id = executor
        .status
        .as_ref()
        .and_then(|s| s.sandbox_id.clone())
        .ok_or_else(|| {
            Error::Invariant(format!(
                "BriqExecutor {executor_name} is ready without a sandbox"
            ))
        })?;

    // 5. Record the attempt, then send the code: at most once.
    let attempt = format!("{:016x}", rand::random::<u64>());
    let running = ExecutionStatus {
        observed_generation: execution.metadata.generation,
        conditions: conditions::merge(
            &status.conditions,
            &[desired(
                SUCCEEDED,
                "Unknown",
                "Running",
                format!("running in BriqExecutor {executor_name}"),
            )],
            execution.metadata.generation,
        ),
        attempt_id: Some(attempt.clone()),
        start_time: Some(conditions::now()),
        ..Default::default()
    };
    write(&api, execution, &running).await?;
    let timeout = execution
        .spec
        .timeout_seconds
        .unwrap_or(executor.spec.execution_timeout_seconds)
        .clamp(1, MAX_EXECUTION_TIMEOUT_SECONDS);
    let session = Session {
        api: &ctx.sandboxes,
        key: &key,
        sandbox_id: &sandbox_id,
    };
    let outcome = session
        .run(
            &attempt,
            &execution.spec.code,
            Duration::from_secs(timeout.into()),
        )
        .await;
    let (verdict, result) = judge(outcome, timeout);
    info!(reason = verdict.reason, "execution finished");

    // 6. Poison the executor before anyone else can take the next turn.
    if let Some(why) = &verdict.unusable {
        mark_unusable(ctx, executor, why).await?;
    }
    let counters = json!({ "executionsTotal": runner.next_count(executor), "lastExecutionTime": conditions::now() });
    if let Err(error) = apply_status(&executors, executor, EXECUTIONS_MANAGER, counters).await {
        warn!(%error, "could not update the executor's execution count");
    }
    let action = conclude(&api, execution, running, &verdict, result, ctx).await?;
    prune(&api, executor, runner).await;
    Ok(action)
}

/// Why an Execution cannot run in its executor now.
enum Refusal {
    /// Never: the Execution fails.
    Fail(Verdict),
    /// Not yet: the Execution waits, with this reason and message.
    Wait(&'static str, String),
}

/// The executor `execution` may run in now (`None`: no executor of its name exists).
fn admit<'a>(
    execution: &Execution,
    executor: Option<&'a BriqExecutor>,
    runner: &Runner,
) -> Result<&'a BriqExecutor, Refusal> {
    let name = &execution.spec.executor_ref.name;
    let Some(executor) = executor else {
        // An Execution this controller adopted had its executor once: it was deleted.
        let adopted = execution
            .owner_references()
            .iter()
            .any(|owner| owner.kind == "BriqExecutor" && owner.name == *name);
        if adopted {
            let message = format!("BriqExecutor {name} was deleted");
            return Err(Refusal::Fail(Verdict::failed("ExecutorDeleted", message)));
        }
        let namespace = execution.namespace().unwrap_or_default();
        let message = format!("BriqExecutor {name} does not exist in namespace {namespace}");
        return Err(Refusal::Wait("ExecutorNotFound", message));
    };
    if let Some(verdict) = unable(executor, runner) {
        return Err(Refusal::Fail(verdict));
    }
    let conditions = executor
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    if !conditions::is_true(conditions, READY) {
        let why = conditions::find(conditions, READY)
            .map(|c| c.message.as_str())
            .unwrap_or_default();
        let message = format!("BriqExecutor {name} is not ready: {why}");
        return Err(Refusal::Wait("ExecutorNotReady", message));
    }
    Ok(executor)
}

async fn refuse<S>(
    api: &Api<Execution>,
    execution: &Execution,
    status: ExecutionStatus,
    refusal: Refusal,
    ctx: &Context<S>,
) -> Result<Action> {
    match refusal {
        Refusal::Fail(verdict) => conclude(api, execution, status, &verdict, None, ctx).await,
        Refusal::Wait(reason, message) => wait(api, execution, reason, message).await,
    }
}

/// Why `executor` can take no more Executions, if it cannot.
fn unable(executor: &BriqExecutor, runner: &Runner) -> Option<Verdict> {
    let name = executor.name_any();
    if executor.metadata.deletion_timestamp.is_some() {
        return Some(Verdict::failed(
            "ExecutorDeleted",
            format!("BriqExecutor {name} is being deleted"),
        ));
    }
    let status = executor.status.clone().unwrap_or_default();
    if runner.is_unusable(executor) {
        let why = status
            .unusable_reason
            .unwrap_or_else(|| "an earlier Execution made it unusable".into());
        return Some(Verdict::failed(
            "ExecutorUnusable",
            format!("BriqExecutor {name} is unusable ({why}); create a new BriqExecutor"),
        ));
    }
    conditions::find(&status.conditions, STALLED)
        .filter(|c| c.status == "True")
        .map(|stalled| {
            Verdict::failed(
                "ExecutorUnusable",
                format!(
                    "BriqExecutor {name} cannot run code ({}: {}); create a new BriqExecutor",
                    stalled.reason, stalled.message
                ),
            )
        })
}

/// Maps what the bridge answered to the Execution's outcome.
fn judge(outcome: Result<RunResult, CallError>, timeout: u32) -> (Verdict, Option<RunResult>) {
    let result = match outcome {
        Ok(result) => result,
        Err(CallError::Upload(error)) => {
            let message = format!("could not upload the code, so it did not run: {error}");
            return (Verdict::failed("TransportError", message), None);
        }
        Err(CallError::TimedOut(waited)) => {
            let message = format!(
                "the sandbox command did not return within {waited:?}; the executor is now unusable"
            );
            return (
                Verdict::failed("Timeout", message).poisons("an Execution's command timed out"),
                None,
            );
        }
        Err(error @ (CallError::Malformed(_) | CallError::UnexpectedKind(_))) => {
            let message =
                format!("malformed answer from the bridge ({error}); the executor is now unusable");
            return (
                Verdict::failed("MalformedResponse", message)
                    .poisons("the bridge answered malformed output"),
                None,
            );
        }
        Err(CallError::Briq(error)) if error.class() == crate::briq::ErrorClass::NotFound => {
            let message = format!("the sandbox is gone ({error}); the executor is now unusable");
            return (
                Verdict::failed("KernelLost", message).poisons("its sandbox no longer exists"),
                None,
            );
        }
        Err(error) if !error.is_uncertain() => {
            let message = format!("briq refused to run the code, so it did not run: {error}");
            return (Verdict::failed("TransportError", message), None);
        }
        Err(error) => {
            let message = format!("the outcome is unknown ({error}); the executor is now unusable");
            return (
                Verdict::failed("TransportError", message)
                    .poisons("a transport failure left an Execution's outcome unknown"),
                None,
            );
        }
    };
    let error_text = |fallback: &str| {
        result
            .error
            .as_ref()
            .map(|e| format!("{}: {}", e.name, e.message))
            .unwrap_or_else(|| fallback.to_owned())
    };
    let verdict = match result.status {
        RunStatus::Ok => Verdict { succeeded: true, reason: "Completed", message: "the code ran".into(), unusable: None },
        RunStatus::FinalAnswer => {
            Verdict { succeeded: true, reason: "FinalAnswer", message: "the code returned a final answer".into(), unusable: None }
        }
        RunStatus::Error => Verdict::failed("CodeError", error_text("the code raised an error")),
        RunStatus::FinalAnswerRejected => Verdict::failed("FinalAnswerRejected", error_text("the final answer was rejected")),
        RunStatus::Timeout => Verdict::failed(
            "Timeout",
            format!("the code ran past its {timeout}s deadline; the kernel was interrupted and the executor is now unusable"),
        )
        .poisons(format!("an Execution ran past its {timeout}s deadline")),
        RunStatus::KernelLost => Verdict::failed(
            "KernelLost",
            "the kernel is gone (the sandbox slept or restarted) and its Python state with it; the executor is now unusable",
        )
        .poisons("its kernel was lost (the sandbox slept or restarted)"),
    };
    (verdict, Some(result))
}

/// Writes the final status and lets the next Execution of the executor go.
async fn conclude<S>(
    api: &Api<Execution>,
    execution: &Execution,
    base: ExecutionStatus,
    verdict: &Verdict,
    result: Option<RunResult>,
    ctx: &Context<S>,
) -> Result<Action> {
    let generation = execution.metadata.generation;
    let mut status = ExecutionStatus {
        observed_generation: generation,
        conditions: conditions::merge(
            &base.conditions,
            &[desired(
                SUCCEEDED,
                if verdict.succeeded { "True" } else { "False" },
                verdict.reason,
                verdict.message.clone(),
            )],
            generation,
        ),
        attempt_id: base.attempt_id,
        start_time: base.start_time,
        completion_time: Some(conditions::now()),
        ..Default::default()
    };
    if let Some(result) = result {
        status.logs = Some(result.logs).filter(|logs| !logs.is_empty());
        status.output = result.output;
        status.is_final_answer = result.status == RunStatus::FinalAnswer;
        status.final_answer = result.final_answer;
        status.truncated = result.truncated;
        status.display_outputs_dropped = Some(result.display_dropped).filter(|n| *n > 0);
        status.duration_millis = Some(result.duration_ms);
        status.error = result.error.map(|e| ExecutionError {
            name: e.name,
            message: e.message,
            traceback: Some(e.traceback).filter(|t| !t.is_empty()),
        });
    } else if !verdict.succeeded {
        status.error = Some(ExecutionError {
            name: verdict.reason.to_owned(),
            message: verdict.message.clone(),
            traceback: None,
        });
    }
    if let Err(error) = write(api, execution, &status).await {
        // Keep the result: the retry writes it rather than calling the Execution interrupted.
        if let Some(uid) = execution.uid() {
            ctx.executions
                .unwritten
                .lock()
                .expect("poisoned")
                .insert(uid, status);
        }
        return Err(error);
    }
    ctx.metrics.execution_finished(
        verdict.reason,
        status.start_time.as_ref(),
        status.completion_time.as_ref(),
    );
    ctx.executions.finish(execution);
    Ok(Action::await_change())
}

async fn queued(api: &Api<Execution>, execution: &Execution, recheck: Duration) -> Result<Action> {
    let executor = &execution.spec.executor_ref.name;
    let message = format!("waiting for earlier Executions of BriqExecutor {executor}");
    wait(api, execution, "Queued", message).await?;
    Ok(Action::requeue(recheck))
}

/// Reports a not-yet-runnable Execution (Succeeded=Unknown) unless it already says so.
async fn wait(
    api: &Api<Execution>,
    execution: &Execution,
    reason: &'static str,
    message: String,
) -> Result<Action> {
    let status = execution.status.clone().unwrap_or_default();
    let generation = execution.metadata.generation;
    let want = [desired(SUCCEEDED, "Unknown", reason, message)];
    if !conditions::satisfied(&status.conditions, &want, generation)
        || status.observed_generation != generation
    {
        let waiting = ExecutionStatus {
            observed_generation: generation,
            conditions: conditions::merge(&status.conditions, &want, generation),
            ..Default::default()
        };
        write(api, execution, &waiting).await?;
    }
    Ok(Action::await_change())
}

async fn write(
    api: &Api<Execution>,
    execution: &Execution,
    status: &ExecutionStatus,
) -> Result<()> {
    apply_status(
        api,
        execution,
        EXECUTOR_MANAGER,
        serde_json::to_value(status).expect("status serializes"),
    )
    .await
}

/// Makes the executor the Execution's owner, so that deleting an executor deletes its history.
async fn adopt(api: &Api<Execution>, execution: &Execution, executor: &BriqExecutor) -> Result<()> {
    let Some(uid) = executor.uid() else {
        return Ok(());
    };
    let mut owners = execution.owner_references().to_vec();
    if owners.iter().any(|owner| owner.uid == uid) {
        return Ok(());
    }
    owners.push(OwnerReference {
        api_version: BriqExecutor::api_version(&()).into_owned(),
        kind: BriqExecutor::kind(&()).into_owned(),
        name: executor.name_any(),
        uid,
        // Not the controller reference: users and GitOps tools may have set their own.
        controller: None,
        block_owner_deletion: None,
    });
    let patch = json!({ "metadata": { "ownerReferences": owners } });
    api.patch(
        &execution.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Deletes the oldest finished Executions beyond the executor's `executionHistoryLimit`.
async fn prune(api: &Api<Execution>, executor: &BriqExecutor, runner: &Runner) {
    let Some(limit) = executor.spec.execution_history_limit else {
        return;
    };
    let (namespace, name) = (
        executor.namespace().unwrap_or_default(),
        executor.name_any(),
    );
    let mut done: Vec<Arc<Execution>> = of_executor(&runner.store, &namespace, &name)
        .filter(|e| e.metadata.deletion_timestamp.is_none() && runner.is_finished(e))
        .collect();
    done.sort_by_key(|e| run_order(e));
    let excess = done.len().saturating_sub(limit as usize);
    for old in &done[..excess] {
        if let Err(error) = api.delete(&old.name_any(), &DeleteParams::default()).await {
            warn!(%error, execution = %old.name_any(), "could not prune an old Execution");
        }
    }
}
