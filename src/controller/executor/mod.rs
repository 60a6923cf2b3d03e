//! The `BriqExecutor` reconciler: creates the sandbox exactly once, provisions the bridge and
//! kernel, watches that the sandbox keeps running, and destroys it when the executor goes.
//!
//! Each reconcile observes the executor (from the cache, and afresh before any step that cannot
//! be taken back), asks [`decide`] for the next step, and performs it.

mod create_claim;
mod decide;
mod handover;
mod trace;

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
    runtime::{
        controller::Action,
        events::EventType,
        finalizer::{Event as FinalizerEvent, finalizer},
        reflector::{ObjectRef, Store},
    },
};
use serde_json::json;
use tracing::{info, instrument, warn};

use self::create_claim::PendingCreate;
use self::decide::{
    Adoption, ClaimPlan, Drain, Idleness, Ownership, ProbeVerdict, SandboxFields, SetupVerdict,
    Step, state, unusable_state,
};
use self::handover::{AfterClaim, Handovers};
use super::{
    backoff::Backoff,
    class,
    context::{Error, Result, Shared},
    credentials::{api_key, class_key, class_of, key_and_secret, made_under, own_key},
    fair::{FairShare, Held, Priority},
    index, orphans,
    ownership::{claimed_member, expected_sandbox_name},
    publish::{publish, publish_deferred},
    recheck::{self, Wait},
    requeue::{object_key, prune_backoff, retry, settle, waited},
    status::{apply_status, apply_status_at, is_conflict, landed, mark_unusable},
};
use crate::{
    bridge::session::{Provisioned, Session, SetupError},
    briq::{ApiKey, CreateSandbox, DestroyOutcome, ErrorClass, SandboxApi, sandbox_name},
    crd::{
        BriqExecutor, BriqExecutorClass, BriqExecutorPool, CLAIMED_BY_ANNOTATION, CLAIMED_BY_LABEL,
        CLAIMED_MEMBER_ANNOTATION, CLASS_ANNOTATION, CREATE_PENDING_ANNOTATION, EXECUTOR_MANAGER,
        Execution, FINALIZER, POOL_FALLBACK_ANNOTATION, POOL_LABEL, POOL_MEMBER_ANNOTATION,
        SANDBOX_ID_ANNOTATION, conditions, reasons::ExecutorReason,
    },
    traces,
};

/// After a conditional write lost to another writer: look again soon.
const CONFLICT_RECHECK: Duration = Duration::from_secs(1);
/// Conditional writes of a new sandbox's id before giving up (the next reconcile tries again).
const RECORD_ATTEMPTS: usize = 3;

/// What became of a create step.
enum Created {
    /// The executor's sandbox, created or adopted and recorded.
    Sandbox(String),
    /// None (yet): decide again after this long.
    Not(Duration),
}

/// The executor controller's context: what it shares with the other controller, and its own
/// bookkeeping.
pub struct Context<S> {
    pub shared: Arc<Shared<S>>,
    store: Store<BriqExecutor>,
    /// Read only: a deleted executor waits for its Executions to conclude.
    executions: Store<Execution>,
    backoff: Backoff,
    /// The controller's work slots, shared fairly across namespaces (see fair.rs).
    work: Arc<FairShare>,
    /// Read only: the pools claimers take members of.
    pools: Store<BriqExecutorPool>,
    /// Members this process is handing to claimers, until the cache shows the claims.
    handovers: Handovers,
}

impl<S> Context<S> {
    pub fn new(
        shared: Arc<Shared<S>>,
        store: Store<BriqExecutor>,
        executions: Store<Execution>,
        pools: Store<BriqExecutorPool>,
    ) -> Self {
        Context {
            backoff: shared.backoff(),
            work: FairShare::new(shared.settings.executor_concurrency.into()),
            shared,
            store,
            executions,
            pools,
            handovers: Handovers::default(),
        }
    }

    /// Drops what is kept of executors the cache no longer holds.
    pub fn sweep(&self) {
        prune_backoff(&self.backoff, &self.store);
        let live = self.store.state().iter().filter_map(|e| e.uid()).collect();
        self.handovers.retain(&live);
    }

    /// The executor is gone: nothing kept of it may outlive it.
    pub fn deleted(&self, executor: &BriqExecutor) {
        self.backoff.forget(&object_key(executor));
        if let Some(uid) = executor.uid() {
            self.handovers.settled(&uid);
        }
    }

    pub fn bookkeeping(&self) -> usize {
        self.backoff.len() + self.handovers.len()
    }
}

#[instrument(skip_all, fields(namespace = executor.namespace(), name = executor.name_any()))]
pub async fn reconcile<S: SandboxApi>(
    executor: Arc<BriqExecutor>,
    ctx: Arc<Context<S>>,
) -> Result<Action> {
    let object = executor.as_ref().clone();
    let api: Api<BriqExecutor> = Api::namespaced(
        ctx.shared.client.clone(),
        &executor.namespace().unwrap_or_default(),
    );
    let namespace = executor.namespace().unwrap_or_default();
    let claims = executor.spec.pool_ref.is_some();
    let step = decide::decide(&status_of(&executor), executor.annotations(), claims);
    if claims && !matches!(step, Step::Claim) {
        // The cache shows the claim recorded (or the claimer needs no member).
        let uid = executor.uid().unwrap_or_default();
        let since = ctx.handovers.reported_since(&uid);
        let probe_interval = ctx.shared.settings.probe_interval;
        let (after, settled) = handover::after_claim(since, &step, probe_interval);
        if settled {
            ctx.handovers.settled(&uid);
        }
        if let AfterClaim::Recheck(recheck) = after
            && executor.metadata.deletion_timestamp.is_none()
        {
            return Ok(Action::requeue(recheck));
        }
    }
    let actor = Actor {
        shared: &ctx.shared,
        api: &api,
        executions: &ctx.executions,
        executors: &ctx.store,
        pools: &ctx.pools,
        handovers: &ctx.handovers,
        slot: Held::take(&ctx.work, &namespace, priority(&executor)).await,
    };
    // A claimer holds nothing of its own until it takes a member (whose own finalizer guards
    // the member's sandbox), so its finalizer comes with the record of the claim: one write and
    // one watch round trip less per claim (see `record_claim`).
    if matches!(step, Step::Claim)
        && executor.metadata.deletion_timestamp.is_none()
        && !executor.finalizers().iter().any(|f| f == FINALIZER)
    {
        let claimed = actor.claim_step(&executor).await;
        return settle(&ctx.backoff, &object, claimed);
    }
    // The finalizer helper removes the finalizer once a cleanup returns, so the wait for the
    // executor's Executions comes before it.
    if executor.metadata.deletion_timestamp.is_some()
        && executor.finalizers().iter().any(|f| f == FINALIZER)
        && let Some(wait) = actor.drain(&executor).await.transpose()
    {
        return settle(&ctx.backoff, &object, wait);
    }
    let result = finalizer(&api, FINALIZER, executor, |event| async {
        match event {
            FinalizerEvent::Apply(executor) => actor.apply(&executor).await,
            FinalizerEvent::Cleanup(executor) => actor.cleanup(&executor).await,
        }
    })
    .await;
    let result = match result {
        // A reconcile of a stale copy found the executor already gone: its finalizer was removed
        // by the reconcile before (which the cleanup's own status write had queued again).
        Err(kube::runtime::finalizer::Error::RemoveFinalizer(kube::Error::Api(status)))
            if status.code == 404 =>
        {
            Ok(Action::await_change())
        }
        other => other.map_err(|error| Error::Finalizer(Box::new(error))),
    };
    settle(&ctx.backoff, &object, result)
}

/// A pool's member, claimed or not, is background work: nobody waits for it until it is
/// claimed, and once claimed its claimer does the work someone waits for. A burst of claims and
/// the refill it sets off share the API server; the claims go first.
fn priority(executor: &BriqExecutor) -> Priority {
    if executor.annotations().contains_key(POOL_MEMBER_ANNOTATION) {
        Priority::Background
    } else {
        Priority::Foreground
    }
}

pub fn error_policy<S>(executor: Arc<BriqExecutor>, error: &Error, ctx: Arc<Context<S>>) -> Action {
    retry(&ctx.backoff, executor.as_ref(), error)
}

/// Performs the executor's steps.
struct Actor<'a, S> {
    shared: &'a Shared<S>,
    api: &'a Api<BriqExecutor>,
    executions: &'a Store<Execution>,
    executors: &'a Store<BriqExecutor>,
    pools: &'a Store<BriqExecutorPool>,
    handovers: &'a Handovers,
    /// Its work slot ([`FairShare`]), given back while a sandbox is set up.
    slot: Held,
}

impl<S: SandboxApi> Actor<'_, S> {
    async fn apply(&self, cached: &BriqExecutor) -> Result<Action> {
        let claims = cached.spec.pool_ref.is_some();
        let mut step = decide::decide(&status_of(cached), cached.annotations(), claims);
        let fresh;
        let executor = if step.needs_fresh_read() {
            fresh = self.api.get(&cached.name_any()).await?;
            step = decide::decide(&status_of(&fresh), fresh.annotations(), claims);
            &fresh
        } else {
            cached
        };
        match step {
            Step::ReportUnusable { why } => {
                self.report(executor, unusable_state(&why), sandbox_fields(executor))
                    .await?;
                Ok(Action::await_change())
            }
            Step::Conclude {
                reason,
                leftover,
                message,
            } => {
                if let Some(id) = leftover {
                    // Never under a running Execution: one that took its turn before the
                    // executor concluded finishes first; no turn starts after.
                    let namespace = executor.namespace().unwrap_or_default();
                    if index::running(self.executions, &namespace, &executor.name_any()) > 0 {
                        return Ok(Action::requeue(recheck::DRAIN));
                    }
                    self.give_back(executor, &id, reason).await?;
                }
                let concluded = state("False", true, reason, message);
                self.report(executor, concluded, SandboxFields::default())
                    .await?;
                Ok(Action::await_change())
            }
            Step::CreateSandbox { pending } => {
                let class = match self.admit(executor, false).await? {
                    Ok(class) => class,
                    Err(wait) => return Ok(wait),
                };
                let Some(key) = self.credentials(executor).await? else {
                    return Ok(key_recheck(executor));
                };
                let (created, create) =
                    traces::noted(self.create_sandbox(executor, &key, pending, class)).await;
                let id = match created? {
                    Created::Sandbox(id) => id,
                    Created::Not(recheck) => return Ok(Action::requeue(recheck)),
                };
                let sandbox = SandboxFields {
                    id: Some(id.clone()),
                    created: Some(conditions::now()),
                    ready: None,
                };
                self.provision(executor, &key, sandbox, Some(create)).await
            }
            Step::Provision { sandbox } => {
                let Some(key) = self.credentials(executor).await? else {
                    return Ok(key_recheck(executor));
                };
                match self.ownership(executor, &key, &sandbox).await? {
                    Ownership::Owned => {}
                    Ownership::Foreign => {
                        return self.disown(executor, &key, &sandbox, false).await;
                    }
                    Ownership::Gone => {
                        // Before it was ready: its kernel held nothing yet; create another.
                        self.forget_sandbox(executor).await?;
                        return Ok(Action::await_change());
                    }
                }
                let current = sandbox_fields(executor);
                let fields = SandboxFields {
                    id: Some(sandbox),
                    created: current.created.or_else(|| Some(conditions::now())),
                    ready: current.ready,
                };
                self.provision(executor, &key, fields, None).await
            }
            Step::Claim => self.claim_step(executor).await,
            Step::HandedOver { claimer } => {
                let to = executor
                    .owner_references()
                    .iter()
                    .find(|owner| owner.uid == claimer)
                    .map_or(claimer.clone(), |owner| owner.name.clone());
                let message = format!(
                    "handed over to BriqExecutor {to}: its sandbox and kernel are that executor's"
                );
                let claimed = state("False", false, ExecutorReason::Claimed, message);
                self.report(executor, claimed, sandbox_fields(executor))
                    .await?;
                Ok(Action::await_change())
            }
            Step::Probe { sandbox } => {
                let recheck = match self.idleness(executor) {
                    Idleness::Expired { .. } => return self.expire(executor).await,
                    Idleness::IdleFor { remaining } => {
                        remaining.min(self.shared.settings.probe_interval)
                    }
                    Idleness::InUse => self.shared.settings.probe_interval,
                };
                let Some(key) = self.credentials(executor).await? else {
                    return Ok(key_recheck(executor));
                };
                let fields = SandboxFields {
                    id: Some(sandbox.clone()),
                    ..sandbox_fields(executor)
                };
                self.probe(executor, &key, &sandbox, fields, recheck).await
            }
        }
    }

    /// The executor's API key; `None` (reported in the status) while there is none to use. Its
    /// Secret, if it comes from one, is protected from deletion first: every step that asks for
    /// it has or makes a sandbox, which the finalizer must be able to destroy.
    async fn credentials(&self, executor: &BriqExecutor) -> Result<Option<ApiKey>> {
        match key_and_secret(self.shared, executor).await {
            Ok((key, secret)) => {
                if let Some(secret) = &secret {
                    orphans::protect(self.shared, secret).await?;
                }
                Ok(Some(key))
            }
            Err(Error::ClassMissing(name)) => {
                let message =
                    format!("no BriqExecutorClass {name}, which its sandbox was made under");
                let waiting = state("False", false, ExecutorReason::ClassNotFound, message);
                self.report(executor, waiting, sandbox_fields(executor))
                    .await?;
                Ok(None)
            }
            Err(Error::ApiKey(message)) => {
                let waiting = state("False", false, ExecutorReason::ApiKeyMissing, message);
                self.report(executor, waiting, sandbox_fields(executor))
                    .await?;
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// The class the executor's sandbox is made (or claimed) under, if it takes one: it must
    /// exist and allow the executor's spec and namespace. `Err`: it waits (reported in the
    /// status), woken when a class changes. An executor that has or is making a sandbox is not
    /// asked again (its class may change, and it keeps running) unless it is to get a sandbox
    /// of its own `anew`: then what its annotations say (copied with a manifest) counts for
    /// nothing.
    async fn admit(
        &self,
        executor: &BriqExecutor,
        anew: bool,
    ) -> Result<Result<Option<Arc<BriqExecutorClass>>, Action>> {
        let recorded = match anew {
            true => class::Recorded::NotYet,
            false => class::recorded(executor.annotations()),
        };
        let (resolved, labels) = class_of(self.shared, executor, recorded).await?;
        let class = match resolved {
            class::Resolved::Unclassed => return Ok(Ok(None)),
            class::Resolved::Class(class) => class,
            class::Resolved::Missing(name) => {
                let message = format!("no BriqExecutorClass {name}; waiting for it to be created");
                return self
                    .wait_for_class(executor, ExecutorReason::ClassNotFound, message)
                    .await;
            }
        };
        if recorded != class::Recorded::NotYet {
            return Ok(Ok(Some(class)));
        }
        let namespace = executor.namespace().unwrap_or_default();
        let broken = class::violations(
            &class.name_any(),
            &class.spec,
            &executor.spec,
            &namespace,
            &labels,
        );
        if broken.is_empty() {
            if let Some(message) = self.at_capacity(executor, &class, &labels) {
                return self
                    .wait_for_class(executor, ExecutorReason::WaitingForCapacity, message)
                    .await;
            }
            return Ok(Ok(Some(class)));
        }
        let message = format!(
            "{}; no sandbox is made (create an executor within the class's limits)",
            broken.join("; ")
        );
        self.wait_for_class(executor, ExecutorReason::ClassRefused, message)
            .await
    }

    /// Says the executor waits on its class for `reason` (`ClassRefused` is `Stalled`: only a
    /// change of the class ends it), with an Event when it starts to; woken by a change of a
    /// class or of an executor of its namespace, else rechecked.
    async fn wait_for_class<T>(
        &self,
        executor: &BriqExecutor,
        reason: ExecutorReason,
        message: String,
    ) -> Result<Result<T, Action>> {
        let already = conditions::find(&status_of(executor).conditions, conditions::READY)
            .is_some_and(|ready| ready.reason == reason.as_str());
        // The Event first: whoever sees the status can find it.
        if !already {
            let type_ = match reason {
                ExecutorReason::WaitingForCapacity => EventType::Normal,
                _ => EventType::Warning,
            };
            self.event(executor, type_, reason.as_str(), "Admit", message.clone())
                .await;
        }
        let stalled = reason == ExecutorReason::ClassRefused;
        let waiting = state("False", stalled, reason, message);
        self.report(executor, waiting, sandbox_fields(executor))
            .await?;
        Ok(Err(Action::requeue(recheck::recheck(Wait::Class))))
    }

    /// Why `executor`, not made yet, must wait for a place under `class`'s `maxExecutors` in
    /// its namespace (labelled `labels`), if it must: the executors of the class holding a
    /// sandbox there, and those waiting since before it, fill the places.
    fn at_capacity(
        &self,
        executor: &BriqExecutor,
        made_under: &BriqExecutorClass,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Option<String> {
        let max = made_under
            .spec
            .per_namespace
            .as_ref()
            .and_then(|limits| limits.max_executors)?;
        let name = made_under.name_any();
        let namespace = executor.namespace().unwrap_or_default();
        let classes = self.shared.classes.state();
        let others: Vec<class::Holder> = self
            .executors
            .state()
            .iter()
            .filter(|other| {
                other.namespace().as_deref() == Some(namespace.as_str())
                    && other.uid() != executor.uid()
                    && other.metadata.deletion_timestamp.is_none()
                    && !other.annotations().contains_key(CLAIMED_BY_ANNOTATION)
            })
            .map(|other| holder(other, &name, &classes, labels))
            .collect();
        let created = creation(executor);
        let ahead = class::executors_ahead(&others, &created, &executor.name_any());
        (ahead >= max as usize).then(|| {
            let holding = others.iter().filter(|o| o.holds).count();
            format!(
                "namespace {namespace} has {holding} executors of class {name} holding a sandbox \
                 and {} waiting before this one, its perNamespace.maxExecutors is {max}; this one \
                 makes its sandbox when one of them goes",
                ahead - holding
            )
        })
    }

    /// Applies the executor controller's part of the status, unless it already says that.
    async fn report(
        &self,
        executor: &BriqExecutor,
        state: impl AsRef<[conditions::Desired]>,
        sandbox: SandboxFields,
    ) -> Result<()> {
        let current = status_of(executor);
        let Some(status) = decide::status_update(
            &current,
            executor.metadata.generation,
            state.as_ref(),
            sandbox,
        ) else {
            return Ok(());
        };
        let status = serde_json::to_value(status).expect("status serializes");
        apply_status(self.api, executor, EXECUTOR_MANAGER, status).await
    }

    /// Says `Provisioning` once, when the executor has no `Ready` condition yet.
    async fn report_provisioning(&self, executor: &BriqExecutor, message: &str) -> Result<()> {
        // A wait for its class has ended once it provisions.
        let class_waits = [
            ExecutorReason::ClassNotFound.as_str(),
            ExecutorReason::ClassRefused.as_str(),
            ExecutorReason::WaitingForCapacity.as_str(),
        ];
        if conditions::find(&status_of(executor).conditions, conditions::READY)
            .is_some_and(|ready| !class_waits.contains(&ready.reason.as_str()))
        {
            return Ok(());
        }
        let provisioning = state("Unknown", false, ExecutorReason::Provisioning, message);
        self.report(executor, provisioning, sandbox_fields(executor))
            .await
    }

    /// Creates the executor's one sandbox, or adopts the one an uncertain create left; or says
    /// when to look again (another operator claimed the create, or briq refused for good, which
    /// is reported in the status).
    async fn create_sandbox(
        &self,
        executor: &BriqExecutor,
        key: &ApiKey,
        pending: bool,
        class: Option<Arc<BriqExecutorClass>>,
    ) -> Result<Created> {
        let name = sandbox_name(
            &executor.namespace().unwrap_or_default(),
            &executor.name_any(),
            &executor.uid().unwrap_or_default(),
        );
        let claim = executor
            .annotations()
            .get(CREATE_PENDING_ANNOTATION)
            .map(String::as_str)
            .filter(|_| pending);
        if let Some(claim) = claim {
            let settle = self.shared.settings.create_settle;
            let now = Timestamp::now();
            if let PendingCreate::Wait(left) =
                create_claim::pending_create(claim, &self.shared.holder, now, settle)
            {
                info!(
                    claim,
                    ?left,
                    "another operator claimed the sandbox's create"
                );
                return Ok(Created::Not(left));
            }
            // An earlier create has no recorded outcome. The name is deterministic, so look.
            let found = self
                .shared
                .sandboxes
                .find_sandboxes_by_name(key, &name)
                .await?;
            if let Some(Adoption { keep, duplicates }) = decide::adoption(found) {
                for duplicate in &duplicates {
                    self.shared
                        .sandboxes
                        .destroy_sandbox(key, duplicate)
                        .await?;
                    warn!(sandbox = %duplicate, "destroyed a duplicate sandbox left by an uncertain create");
                }
                if !self.record_created(executor, key, &keep).await? {
                    return Ok(Created::Not(CONFLICT_RECHECK));
                }
                let note = format!("found sandbox {keep} created before a restart");
                self.event(
                    executor,
                    EventType::Normal,
                    "SandboxAdopted",
                    "Create",
                    note,
                )
                .await;
                return Ok(Created::Sandbox(keep));
            }
            // Nothing by that name, and no create of that claim is in flight: it never took
            // effect. Claimed anew below, so that only one operator creates now.
        }
        // The claim to create is conditional on the version the decision was made on: of two
        // operators that decided at once, one claims and the other decides again.
        let claim = create_claim::claim_value(Timestamp::now(), &self.shared.holder);
        // With the claim, the class: the sandbox is made with its key, whatever becomes the
        // default later (none: a class a copied manifest brought goes).
        let annotations = json!({
            CREATE_PENDING_ANNOTATION: claim,
            CLASS_ANNOTATION: class.as_ref().map(|c| c.name_any()),
        });
        if !self.annotate_at(executor, annotations).await? {
            return Ok(Created::Not(CONFLICT_RECHECK));
        }
        self.report_provisioning(executor, "creating the sandbox")
            .await?;
        let effective = class::effective(&executor.spec, class.as_ref().map(|c| &c.spec));
        let request = CreateSandbox {
            name,
            image: effective.image,
            size: effective.size,
            sleep: effective.sleep,
            env: executor
                .spec
                .env
                .iter()
                .flatten()
                .map(|var| (var.name.clone(), var.value.clone()))
                .collect(),
        };
        // On any error the pending marker stays, and the next attempt looks before it creates.
        let sandbox = match self.shared.sandboxes.create_sandbox(key, &request).await {
            Ok(sandbox) => sandbox,
            Err(error) if error.class() == ErrorClass::Terminal => {
                let refused = state(
                    "False",
                    false,
                    ExecutorReason::BriqRefused,
                    error.to_string(),
                );
                self.report(executor, refused, sandbox_fields(executor))
                    .await?;
                return Err(error.into());
            }
            Err(error) => return Err(error.into()),
        };
        if !self.record_created(executor, key, &sandbox.id).await? {
            return Ok(Created::Not(CONFLICT_RECHECK));
        }
        let note = format!("created sandbox {}", sandbox.id);
        self.event(
            executor,
            EventType::Normal,
            "SandboxCreated",
            "Create",
            note,
        )
        .await;
        info!(sandbox = %sandbox.id, "sandbox created");
        Ok(Created::Sandbox(sandbox.id))
    }

    /// Merges `annotations` into the executor's only if it is still at the version `executor`
    /// was read at: `false` when someone wrote it since.
    async fn annotate_at(
        &self,
        executor: &BriqExecutor,
        annotations: serde_json::Value,
    ) -> Result<bool> {
        let patch = json!({ "metadata": {
            "annotations": annotations,
            "resourceVersion": executor.resource_version(),
        } });
        let patched = self
            .api
            .patch(
                &executor.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(Error::from);
        landed(patched)
    }

    /// Installs the bridge and its dependencies and starts the kernel; a failed setup destroys
    /// the sandbox.
    async fn provision(
        &self,
        executor: &BriqExecutor,
        key: &ApiKey,
        sandbox: SandboxFields,
        create: Option<traces::Noted>,
    ) -> Result<Action> {
        let id = sandbox.id.clone().unwrap_or_default();
        let provisioning = state(
            "Unknown",
            false,
            ExecutorReason::Provisioning,
            "installing the bridge and starting the kernel",
        );
        self.report(executor, provisioning, sandbox.clone()).await?;
        let session = Session {
            api: &self.shared.sandboxes,
            key,
            sandbox_id: &id,
        };
        let deadline = Duration::from_secs(executor.spec.setup_timeout_seconds.into());
        let packages = executor.spec.packages.clone().unwrap_or_default();
        let (outcome, setup) = self
            .slot
            .without(traces::noted(session.provision(deadline, &packages)))
            .await;
        let emit_trace = |failure: Option<&str>| {
            if traces::enabled() {
                let (namespace, name) = (
                    executor.namespace().unwrap_or_default(),
                    executor.name_any(),
                );
                let subject = trace::Subject {
                    namespace: &namespace,
                    executor: &name,
                    sandbox: &id,
                    created: executor
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map_or_else(SystemTime::now, |t| t.0.into()),
                };
                let spans = trace::spans(
                    &subject,
                    create.as_ref(),
                    &setup,
                    failure,
                    SystemTime::now(),
                );
                traces::emit(None, &spans);
            }
        };
        match decide::setup_verdict(&outcome) {
            SetupVerdict::Ready(provisioned) => {
                let ready = SandboxFields {
                    ready: Some(conditions::now()),
                    ..sandbox
                };
                self.report(executor, kernel_ready_of(executor), ready)
                    .await?;
                let note = decide::ready_note(&id, provisioned);
                self.event(executor, EventType::Normal, "Ready", "Provision", note)
                    .await;
                emit_trace(None);
                info!(sandbox = %id, "executor ready");
                self.shared
                    .metrics
                    .executor_ready(executor.metadata.creation_timestamp.as_ref());
                Ok(Action::requeue(self.shared.settings.probe_interval))
            }
            SetupVerdict::SandboxGone => {
                self.forget_sandbox(executor).await?;
                Err(retry_error(outcome))
            }
            SetupVerdict::Retry => Err(retry_error(outcome)),
            SetupVerdict::Failed(failure) => {
                // Say so first, so that a failed destroy is retried.
                self.event(
                    executor,
                    EventType::Warning,
                    "SetupFailed",
                    "Provision",
                    failure.clone(),
                )
                .await;
                emit_trace(Some(&failure));
                let failed = state("False", true, ExecutorReason::SetupFailed, failure);
                self.report(executor, failed, sandbox).await?;
                self.shared
                    .metrics
                    .executor_ended(ExecutorReason::SetupFailed);
                self.give_back(executor, &id, ExecutorReason::SetupFailed)
                    .await?;
                Ok(Action::await_change())
            }
        }
    }

    /// A sleeping, restarted or vanished sandbox has lost its kernel, and with it the Python
    /// state the Executions rely on: the executor becomes unusable. The probe is a GET, which
    /// does not count as use, so it does not keep an idle sandbox awake.
    async fn probe(
        &self,
        executor: &BriqExecutor,
        key: &ApiKey,
        id: &str,
        sandbox: SandboxFields,
        recheck: Duration,
    ) -> Result<Action> {
        let found = self.shared.sandboxes.get_sandbox(key, id).await;
        let expected = self.expected_name(executor).await?;
        match decide::probe_verdict(id, &expected, &found) {
            ProbeVerdict::Running => {
                self.report(executor, kernel_ready_of(executor), sandbox)
                    .await?;
                Ok(Action::requeue(recheck))
            }
            ProbeVerdict::NotOwned => self.disown(executor, key, id, true).await,
            ProbeVerdict::Unreachable(why) => {
                // Concludes nothing: probed again as usual, once briq's pause allows.
                let unreachable = decide::briq_unreachable(kernel_ready_of(executor), &why);
                self.report(executor, unreachable, sandbox).await?;
                Ok(Action::requeue(recheck))
            }
            ProbeVerdict::Retry => Err(found.expect_err("a retry follows an error").into()),
            ProbeVerdict::Lost(lost) => {
                // Its Warning Event (`Unusable`, with why) comes with the mark.
                mark_unusable(self.shared, executor, &lost).await?;
                self.report(executor, unusable_state(&lost), sandbox)
                    .await?;
                Ok(Action::await_change())
            }
        }
    }

    /// Whose the sandbox `id`, named in a tenant-writable field, is, as briq tells it.
    async fn ownership(
        &self,
        executor: &BriqExecutor,
        key: &ApiKey,
        id: &str,
    ) -> Result<Ownership> {
        let found = self.shared.sandboxes.get_sandbox(key, id).await;
        let expected = self.expected_name(executor).await?;
        match decide::ownership(&expected, &found) {
            Some(ownership) => Ok(ownership),
            None => Err(found.expect_err("briq did not say").into()),
        }
    }

    /// The executor names someone else's sandbox (a copied manifest, a restored backup, or a
    /// tenant trying to reach another's kernel): say so, never touch it, and go back to the
    /// executor's own sandbox, found under its own name. A ready executor whose own sandbox
    /// cannot be found has lost its kernel.
    async fn disown(
        &self,
        executor: &BriqExecutor,
        key: &ApiKey,
        foreign: &str,
        was_ready: bool,
    ) -> Result<Action> {
        let message = decide::not_owned_message(foreign);
        warn!(sandbox = %foreign, "refused a sandbox that belongs to another object");
        self.event(
            executor,
            EventType::Warning,
            "SandboxNotOwned",
            "Verify",
            message.clone(),
        )
        .await;
        let found = self
            .shared
            .sandboxes
            .find_sandboxes_by_name(key, &self.expected_name(executor).await?)
            .await?;
        match decide::adoption(found) {
            Some(Adoption { keep, .. }) => {
                // Duplicates, if any, are the create path's to settle; here only the record is
                // put right.
                self.record_sandbox(executor, &keep).await?;
                let fields = SandboxFields {
                    id: Some(keep),
                    ..sandbox_fields(executor)
                };
                let state = if was_ready {
                    kernel_ready_of(executor)
                } else {
                    state("Unknown", false, ExecutorReason::SandboxNotOwned, message)
                };
                self.report(executor, state, fields).await?;
                Ok(Action::await_change())
            }
            None if was_ready => {
                let lost = format!("{message}; its own sandbox no longer exists");
                mark_unusable(self.shared, executor, &lost).await?;
                self.report(executor, unusable_state(&lost), SandboxFields::default())
                    .await?;
                Ok(Action::await_change())
            }
            None => {
                // Nothing of its own yet (a copied manifest): it gets a sandbox of its own.
                let class = match self.admit(executor, true).await? {
                    Ok(class) => class,
                    Err(wait) => return Ok(wait),
                };
                // Its key is that of the class it gets now, not of what its annotations said.
                let key = &match &class {
                    Some(class) => class_key(self.shared, class).await?,
                    None => own_key(self.shared, executor).await?.0,
                };
                let id = match self.create_sandbox(executor, key, false, class).await? {
                    Created::Sandbox(id) => id,
                    Created::Not(recheck) => return Ok(Action::requeue(recheck)),
                };
                let fields = SandboxFields {
                    id: Some(id),
                    created: Some(conditions::now()),
                    ready: None,
                };
                self.provision(executor, key, fields, None).await
            }
        }
    }

    /// While a deleted executor's Executions have not concluded (see [`decide::drain`]): says
    /// so and when to look again.
    async fn drain(&self, executor: &BriqExecutor) -> Result<Option<Action>> {
        let unfinished = index::unfinished(
            self.executions,
            &executor.namespace().unwrap_or_default(),
            &executor.name_any(),
        );
        let deleted_at = executor.metadata.deletion_timestamp.as_ref().map(|t| t.0);
        let Drain::Wait { unfinished, left } =
            decide::drain(unfinished, deleted_at, Timestamp::now())
        else {
            return Ok(None);
        };
        let waiting = state(
            "False",
            false,
            ExecutorReason::Terminating,
            format!("waiting for {unfinished} Execution(s) to conclude"),
        );
        self.report(executor, waiting, sandbox_fields(executor))
            .await?;
        // Nothing wakes an executor when its Executions change: look again soon, within the limit.
        let left = left.unsigned_abs();
        Ok(Some(Action::requeue(recheck::recheck(Wait::Drain {
            left,
        }))))
    }

    /// Destroys every sandbox this executor may own. The finalizer is removed only when all are
    /// confirmed gone; each failure is an Event and a condition, and is retried with backoff.
    async fn cleanup(&self, executor: &BriqExecutor) -> Result<Action> {
        let Some(plan) = decide::cleanup(&status_of(executor), executor.annotations()) else {
            return Ok(Action::await_change());
        };
        let sandbox = sandbox_fields(executor);
        let mut ids = plan.ids;
        let listed = ids.iter().cloned().collect::<Vec<_>>().join(", ");
        let terminating = state(
            "False",
            false,
            ExecutorReason::Terminating,
            format!("destroying sandbox {listed}"),
        );
        // A failed destroy keeps saying so while it is retried.
        let ready_reason = conditions::find(&status_of(executor).conditions, conditions::READY)
            .map(|c| c.reason.clone());
        if ready_reason.as_deref() != Some(ExecutorReason::DestroyFailed.as_str()) {
            self.report(executor, terminating, sandbox.clone()).await?;
        }
        let outcome = async {
            let key = api_key(self.shared, executor).await?;
            if plan.look_up_by_name {
                let name = sandbox_name(
                    &executor.namespace().unwrap_or_default(),
                    &executor.name_any(),
                    &executor.uid().unwrap_or_default(),
                );
                let found = self.shared.sandboxes.find_sandboxes_by_name(&key, &name);
                ids.extend(found.await?.into_iter().map(|s| s.id));
            }
            for id in ids.clone() {
                if self.ownership(executor, &key, &id).await? == Ownership::Foreign {
                    ids.remove(&id);
                    let note = decide::not_owned_message(&id);
                    self.event(
                        executor,
                        EventType::Warning,
                        "SandboxNotOwned",
                        "Destroy",
                        note,
                    )
                    .await;
                }
            }
            for id in &ids {
                match self.shared.sandboxes.destroy_sandbox(&key, id).await? {
                    DestroyOutcome::Destroyed => info!(sandbox = %id, "sandbox destroyed"),
                    DestroyOutcome::AlreadyGone => info!(sandbox = %id, "sandbox was already gone"),
                }
            }
            Ok::<_, Error>(())
        }
        .await;
        match outcome {
            Ok(()) => {
                self.release_key(executor).await;
                let note = format!(
                    "destroyed sandbox {}",
                    ids.into_iter().collect::<Vec<_>>().join(", ")
                );
                self.event(
                    executor,
                    EventType::Normal,
                    "SandboxDestroyed",
                    "Destroy",
                    note,
                )
                .await;
                Ok(Action::await_change())
            }
            Err(error) => {
                let message = format!("destroying the sandbox failed, retrying: {error}");
                self.event(
                    executor,
                    EventType::Warning,
                    "DestroyFailed",
                    "Destroy",
                    message.clone(),
                )
                .await;
                let failed = state("False", false, ExecutorReason::DestroyFailed, message);
                if let Err(report_error) = self.report(executor, failed, sandbox).await {
                    warn!(%report_error, "could not report the failed destroy");
                }
                Err(error)
            }
        }
    }

    /// After a confirmed destroy: the executor's key Secret is released unless another executor
    /// of the namespace uses it. Two executors finishing at once may each still see the other;
    /// the sweeper, woken by their deletion, releases it then. A failure is only logged.
    async fn release_key(&self, executor: &BriqExecutor) {
        let Some(reference) = &executor.spec.api_key_secret_ref else {
            return;
        };
        let released = async {
            let others = self.api.list(&ListParams::default()).await?;
            let uid = executor.uid().unwrap_or_default();
            if orphans::secret_used_by_others(&others.items, &reference.name, &uid) {
                return Ok(());
            }
            let namespace = executor.namespace().unwrap_or_default();
            orphans::release(self.shared, &namespace, &reference.name).await
        }
        .await;
        if let Err(error) = released {
            warn!(%error, secret = %reference.name, "could not release the API key Secret; the sweeper will");
        }
    }

    /// The name briq must show for this executor's sandbox (a claimer's is its member's).
    async fn expected_name(&self, executor: &BriqExecutor) -> Result<String> {
        let member = claimed_member(executor, self.executors, &self.shared.client).await?;
        Ok(expected_sandbox_name(executor, member.as_ref()))
    }

    /// A claimer without a sandbox, once its class admits it: [`Actor::claim`].
    async fn claim_step(&self, executor: &BriqExecutor) -> Result<Action> {
        match self.admit(executor, false).await? {
            Ok(_) => self.claim(executor).await,
            Err(wait) => Ok(wait),
        }
    }

    /// A claimer without a sandbox: resume a handover this process or a crashed one began, else
    /// take a Ready member of its pool (the member's resourceVersion as precondition, so exactly
    /// one claimer wins it), else wait or fall back to a sandbox of its own.
    ///
    /// The claimer and its pool come from the caches. What they cannot show is this process's
    /// own handovers not seen yet, which [`Handovers`] remembers; the API server is asked only
    /// where neither can decide ([`decide::claim_lookup`]): after a member's write whose outcome
    /// is unknown, and before a fallback, which cannot be taken back. A claimer whose cached copy
    /// was stale is caught by its record's precondition ([`Actor::record_claim`]).
    async fn claim(&self, executor: &BriqExecutor) -> Result<Action> {
        let pool_ref = executor
            .spec
            .pool_ref
            .clone()
            .expect("a claimer has a poolRef");
        let uid = executor.uid().unwrap_or_default();
        if let Some(member) = self.handovers.taken(&uid) {
            return self.record_claim(executor, &pool_ref.name, member).await;
        }
        let handed_to_it = |member: &BriqExecutor| {
            member.annotations().get(CLAIMED_BY_ANNOTATION) == Some(&uid)
                && member.metadata.deletion_timestamp.is_none()
        };
        // A handover a crash interrupted: a restarted operator's cache shows it (the executors'
        // first list is a consistent read).
        let cached = self.executors.state().into_iter().find(|m| handed_to_it(m));
        if let Some(member) = cached {
            return self
                .record_claim(executor, &pool_ref.name, member.as_ref().clone())
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
        let plan = decide::claim_plan(
            &executor.spec,
            &pool_ref,
            pool.as_ref().map(|pool| &pool.spec),
            ready.iter().map(|m| m.name_any()).collect(),
            waited,
        );
        let lookup = decide::claim_lookup(&plan, self.handovers.uncertain(&uid));
        if lookup == decide::ClaimLookup::AskTheApiServer {
            let mine = ListParams::default().labels(&format!("{CLAIMED_BY_LABEL}={uid}"));
            let listed = self.api.list(&mine).await?.items;
            if let Some(member) = listed.into_iter().find(|m| handed_to_it(m)) {
                self.handovers.won(&uid, member.clone());
                return self.record_claim(executor, &pool_ref.name, member).await;
            }
            self.handovers.lost(&uid);
        }
        match plan {
            ClaimPlan::Take(_) => {
                for member in &decide::take_order(&ready, &uid) {
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
                    return self.record_claim(executor, &pool_ref.name, won).await;
                }
                Ok(Action::requeue(decide::CLAIM_RECHECK))
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

    /// Reports a claimer's state if it is still as the cache showed it; `false` when it
    /// changed (decide again on the change).
    async fn report_at(
        &self,
        executor: &BriqExecutor,
        state: impl AsRef<[conditions::Desired]>,
    ) -> Result<bool> {
        let current = status_of(executor);
        let Some(status) = decide::status_update(
            &current,
            executor.metadata.generation,
            state.as_ref(),
            SandboxFields::default(),
        ) else {
            return Ok(true);
        };
        let status = serde_json::to_value(status).expect("status serializes");
        let version = executor.resource_version();
        let written = apply_status_at(
            self.api,
            executor,
            EXECUTOR_MANAGER,
            status,
            version.as_deref(),
        )
        .await;
        landed(written)
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
        let uid = executor.uid().unwrap_or_default();
        let owner = executor.controller_owner_ref(&()).map(|mut owner| {
            owner.block_owner_deletion = Some(true);
            owner
        });
        let patch = json!({
            "metadata": {
                "resourceVersion": member.resource_version(),
                "annotations": { CLAIMED_BY_ANNOTATION: uid },
                "labels": { POOL_LABEL: null, CLAIMED_BY_LABEL: uid },
                "ownerReferences": [owner],
            }
        });
        match self
            .api
            .patch(
                &member.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(won) => Ok(Some(won)),
            // Changed since the cache saw it, or gone: another claimer's, or no longer offered.
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// The second half of a handover: the claimer records the member and its sandbox, with its
    /// finalizer, in one write conditional on the version it was decided on, and is Ready at
    /// once (the member's kernel answered; the first Execution confirms the sandbox with briq
    /// before any code goes there).
    ///
    /// A claimer that changed meanwhile is read afresh: recorded already (an earlier attempt),
    /// it only reports; holding another member (a second operator's claim), the member taken
    /// here is one too many and is deleted, sandbox and all, by its own finalizer.
    async fn record_claim(
        &self,
        executor: &BriqExecutor,
        pool: &str,
        member: BriqExecutor,
    ) -> Result<Action> {
        let member_status = status_of(&member);
        let Some(id) = decide::recorded_sandbox(&member_status, member.annotations()) else {
            return Err(Error::Invariant(format!(
                "pool member {} was claimed without a sandbox",
                member.name_any()
            )));
        };
        let uid = executor.uid().unwrap_or_default();
        // The member's sandbox was made with its class's key, which is the claimer's from now on.
        let made_under = member.annotations().get(CLASS_ANNOTATION);
        let mut claimer = executor.clone();
        let mut recorded = None;
        for _ in 0..RECORD_ATTEMPTS {
            let holds = claimer
                .annotations()
                .get(CLAIMED_MEMBER_ANNOTATION)
                .cloned();
            match decide::record_step(
                holds.as_deref(),
                &member.name_any(),
                claimer.metadata.deletion_timestamp.is_some(),
            ) {
                decide::RecordStep::Write => {}
                decide::RecordStep::Recorded => {
                    recorded = Some(claimer);
                    break;
                }
                decide::RecordStep::GiveBack => {
                    self.handovers.settled(&uid);
                    self.give_back_member(&member).await?;
                    return Ok(Action::await_change());
                }
                decide::RecordStep::LeaveToCollector => {
                    // Deleted before the record: the member it owns goes with it.
                    self.handovers.settled(&uid);
                    return Ok(Action::await_change());
                }
            }
            let mut finalizers = claimer.finalizers().to_vec();
            if !finalizers.iter().any(|f| f == FINALIZER) {
                finalizers.push(FINALIZER.to_owned());
            }
            let patch = json!({ "metadata": {
                "resourceVersion": claimer.resource_version(),
                "finalizers": finalizers,
                "annotations": {
                    CLAIMED_MEMBER_ANNOTATION: member.name_any(),
                    SANDBOX_ID_ANNOTATION: id,
                    CLASS_ANNOTATION: made_under,
                },
            } });
            let patched = self
                .api
                .patch(
                    &claimer.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(Error::from);
            match patched {
                Ok(written) => {
                    recorded = Some(written);
                    break;
                }
                Err(error) if is_conflict(&error) => {
                    match self.api.get_opt(&claimer.name_any()).await? {
                        Some(fresh) => claimer = fresh,
                        None => {
                            self.handovers.settled(&uid);
                            return Ok(Action::await_change());
                        }
                    }
                }
                Err(error) => return Err(error),
            }
        }
        let Some(claimer) = recorded else {
            return Ok(Action::requeue(CONFLICT_RECHECK));
        };
        let origin = decide::handover_text(pool, &member.name_any());
        let ready = decide::kernel_ready(Some(&origin));
        let fields = SandboxFields {
            id: Some(id.clone()),
            created: member_status.sandbox_created_time.clone(),
            ready: Some(conditions::now()),
        };
        self.report(&claimer, ready, fields).await?;
        self.handovers.reported(&uid, &member.name_any());
        let note = format!(
            "took sandbox {id} and its kernel from BriqExecutorPool {pool} (executor {})",
            member.name_any()
        );
        // Nothing is ordered against it; a burst of claims would wait on 100 of them.
        let claimed = super::publish::event(EventType::Normal, "Claimed", "Claim", note);
        publish_deferred(self.shared, &claimer, claimed);
        info!(sandbox = %id, member = %member.name_any(), "claimed a pool member");
        Ok(Action::requeue(self.shared.settings.probe_interval))
    }

    /// Deletes a member this claimer took one too many of; its finalizer destroys its sandbox.
    async fn give_back_member(&self, member: &BriqExecutor) -> Result<()> {
        warn!(member = %member.name_any(), "a claimer that holds another member took this one too: deleting it");
        match self
            .api
            .delete(&member.name_any(), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// Destroys the sandbox of an executor that ended for good (`why`), if it is the
    /// executor's own, and forgets it.
    async fn give_back(
        &self,
        executor: &BriqExecutor,
        id: &str,
        why: ExecutorReason,
    ) -> Result<()> {
        let key = api_key(self.shared, executor).await?;
        if self.ownership(executor, &key, id).await? == Ownership::Owned {
            self.shared.sandboxes.destroy_sandbox(&key, id).await?;
        }
        self.annotate(executor, json!({ SANDBOX_ID_ANNOTATION: null }))
            .await?;
        info!(sandbox = %id, reason = %why, "destroyed the sandbox of a concluded executor");
        Ok(())
    }

    /// Where the executor stands against its idle timeout, from its status and the cached
    /// Executions.
    fn idleness(&self, executor: &BriqExecutor) -> Idleness {
        let namespace = executor.namespace().unwrap_or_default();
        let activity = index::activity(self.executions, &namespace, &executor.name_any());
        let class = made_under(self.shared, executor);
        decide::idleness(
            class::idle_timeout_seconds(&executor.spec, class.as_ref().map(|c| &c.spec)),
            &status_of(executor),
            activity,
            Timestamp::now(),
        )
    }

    /// Idle for its timeout: decided again on a fresh read (it cannot be taken back), and said
    /// in the status first, so that no Execution takes a turn after and a failed destroy is
    /// retried; the `Conclude` step that this write leads to gives the sandbox back.
    async fn expire(&self, cached: &BriqExecutor) -> Result<Action> {
        let fresh = self.api.get(&cached.name_any()).await?;
        let still_ready = matches!(
            decide::decide(
                &status_of(&fresh),
                fresh.annotations(),
                fresh.spec.pool_ref.is_some()
            ),
            Step::Probe { .. }
        );
        let Idleness::Expired { message } = self.idleness(&fresh) else {
            return Ok(Action::requeue(CONFLICT_RECHECK));
        };
        if !still_ready {
            return Ok(Action::requeue(CONFLICT_RECHECK));
        }
        let expired = state("False", true, ExecutorReason::IdleTimeout, message.clone());
        self.report(&fresh, expired, sandbox_fields(&fresh)).await?;
        self.shared
            .metrics
            .executor_ended(ExecutorReason::IdleTimeout);
        self.event(&fresh, EventType::Normal, "Expired", "Reclaim", message)
            .await;
        info!("expired: idle for its idleTimeoutSeconds");
        Ok(Action::await_change())
    }

    /// Records `id`, a sandbox of this executor's own that this process just created or found,
    /// unless another one got recorded meanwhile (another operator's create won): then `id` is
    /// a duplicate, destroyed at once, and the answer is false.
    async fn record_created(
        &self,
        executor: &BriqExecutor,
        key: &ApiKey,
        id: &str,
    ) -> Result<bool> {
        for _ in 0..RECORD_ATTEMPTS {
            let fresh = self.api.get(&executor.name_any()).await?;
            let recorded = decide::recorded_sandbox(&status_of(&fresh), fresh.annotations());
            match recorded {
                Some(recorded) if recorded == id => return Ok(true),
                // Only a sandbox of this executor's own can have won; a foreign id (a copied
                // manifest) is overwritten.
                Some(recorded)
                    if self.ownership(executor, key, &recorded).await? == Ownership::Owned =>
                {
                    self.shared.sandboxes.destroy_sandbox(key, id).await?;
                    let note = format!(
                        "destroyed sandbox {id}: sandbox {recorded} was recorded first by another create"
                    );
                    warn!(sandbox = %id, %recorded, "destroyed a sandbox that lost the race to be recorded");
                    self.event(
                        executor,
                        EventType::Normal,
                        "SandboxDestroyed",
                        "Create",
                        note,
                    )
                    .await;
                    return Ok(false);
                }
                _ => {}
            }
            let annotations = json!({ SANDBOX_ID_ANNOTATION: id, CREATE_PENDING_ANNOTATION: null });
            if self.annotate_at(&fresh, annotations).await? {
                return Ok(true);
            }
        }
        Err(Error::Invariant(format!(
            "sandbox {id} could not be recorded: the executor kept changing"
        )))
    }

    async fn record_sandbox(&self, executor: &BriqExecutor, id: &str) -> Result<()> {
        self.annotate(
            executor,
            json!({ SANDBOX_ID_ANNOTATION: id, CREATE_PENDING_ANNOTATION: null }),
        )
        .await
    }

    async fn forget_sandbox(&self, executor: &BriqExecutor) -> Result<()> {
        self.annotate(
            executor,
            json!({ SANDBOX_ID_ANNOTATION: null, CREATE_PENDING_ANNOTATION: null }),
        )
        .await?;
        let message = "the sandbox disappeared before it was ready; creating another";
        let provisioning = state("Unknown", false, ExecutorReason::Provisioning, message);
        self.report(executor, provisioning, SandboxFields::default())
            .await
    }

    /// Merge-patches the executor's annotations (`null` removes one).
    async fn annotate(
        &self,
        executor: &BriqExecutor,
        annotations: serde_json::Value,
    ) -> Result<()> {
        let patch = json!({ "metadata": { "annotations": annotations } });
        self.api
            .patch(
                &executor.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        Ok(())
    }

    async fn event(
        &self,
        executor: &BriqExecutor,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        publish(self.shared, executor, type_, reason, action, note).await;
    }
}

/// When an executor waiting for its key Secret looks for it again.
/// `other`, as the `maxExecutors` of class `name` counts it (its namespace labelled `labels`).
fn holder(
    other: &BriqExecutor,
    name: &str,
    classes: &[Arc<BriqExecutorClass>],
    labels: &std::collections::BTreeMap<String, String>,
) -> class::Holder {
    let recorded = class::recorded(other.annotations());
    let holds = recorded == class::Recorded::Class(name)
        && (other.annotations().contains_key(SANDBOX_ID_ANNOTATION)
            || other.annotations().contains_key(CREATE_PENDING_ANNOTATION));
    let stalled = conditions::find(&status_of(other).conditions, conditions::STALLED)
        .is_some_and(|c| c.status == "True");
    let of_class = matches!(
        class::resolve(&other.spec, recorded, classes, labels),
        class::Resolved::Class(c) if c.name_any() == name
    );
    let waits = recorded == class::Recorded::NotYet && of_class && !stalled;
    class::Holder {
        holds,
        waits_since: waits.then(|| (creation(other), other.name_any())),
    }
}

/// When `executor` was created, as text that sorts in time.
fn creation(executor: &BriqExecutor) -> String {
    executor
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_default()
}

fn key_recheck(executor: &BriqExecutor) -> Action {
    Action::requeue(recheck::recheck(Wait::KeySecret {
        waited: waited(executor),
    }))
}

/// The error of a setup attempt that is retried: always a failed bridge call.
fn retry_error(outcome: Result<Provisioned, SetupError>) -> Error {
    match outcome {
        Err(SetupError::Call(error)) => error.into(),
        other => Error::Invariant(format!("setup retried after {other:?}")),
    }
}

/// Ready, saying where a claimer's kernel came from.
fn kernel_ready_of(executor: &BriqExecutor) -> [conditions::Desired; 2] {
    let origin = decide::handover(executor.spec.pool_ref.as_ref(), executor.annotations());
    decide::kernel_ready(origin.as_deref())
}

fn status_of(executor: &BriqExecutor) -> crate::crd::BriqExecutorStatus {
    executor.status.clone().unwrap_or_default()
}

fn sandbox_fields(executor: &BriqExecutor) -> SandboxFields {
    SandboxFields::of(&status_of(executor))
}
