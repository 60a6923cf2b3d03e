//! The `BriqExecutor` reconciler: creates the sandbox exactly once, provisions the bridge and
//! kernel, watches that the sandbox keeps running, and destroys it when the executor goes.

use std::{collections::BTreeSet, sync::Arc};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        controller::Action,
        events::EventType,
        finalizer::{Event as FinalizerEvent, finalizer},
    },
};
use serde_json::json;
use tracing::{info, instrument, warn};

use super::{
    Context, EXECUTOR_MANAGER, Error, Result, api_key, apply_status,
    conditions::{self, Desired, READY, STALLED, desired},
    failure_key, mark_unusable, publish,
    session::{CallError, Session, SetupError},
};
use crate::{
    briq::{CreateSandbox, DestroyOutcome, ErrorClass, SandboxApi, SandboxState, sandbox_name},
    crd::{BriqExecutor, BriqExecutorStatus},
};

pub const FINALIZER: &str = "briq.cloud/destroy-sandbox";
/// Set before a sandbox is created and removed once its id is recorded: if the operator stops in
/// between, the next reconcile looks the sandbox up by its deterministic name instead of
/// creating a second one.
pub const CREATE_PENDING_ANNOTATION: &str = "briq.cloud/sandbox-create-pending";
/// The sandbox id, kept in metadata too so that it survives a lost or rewritten status.
pub const SANDBOX_ID_ANNOTATION: &str = "briq.cloud/sandbox-id";

#[instrument(skip_all, fields(namespace = executor.namespace(), name = executor.name_any()))]
pub async fn reconcile<S: SandboxApi>(
    executor: Arc<BriqExecutor>,
    ctx: Arc<Context<S>>,
) -> Result<Action> {
    let failures = failure_key(executor.as_ref());
    let api: Api<BriqExecutor> = Api::namespaced(
        ctx.client.clone(),
        &executor.namespace().unwrap_or_default(),
    );
    let result = finalizer(&api, FINALIZER, executor, |event| async {
        match event {
            FinalizerEvent::Apply(executor) => apply(&executor, &ctx, &api).await,
            FinalizerEvent::Cleanup(executor) => cleanup(&executor, &ctx, &api).await,
        }
    })
    .await
    .map_err(|error| Error::Finalizer(Box::new(error)));
    if result.is_ok() {
        ctx.succeeded(&failures);
    }
    result
}

pub fn error_policy<S>(executor: Arc<BriqExecutor>, error: &Error, ctx: Arc<Context<S>>) -> Action {
    let delay = ctx.backoff(failure_key(executor.as_ref()));
    warn!(executor = %executor.name_any(), %error, ?delay, "executor reconcile failed; retrying");
    Action::requeue(delay)
}

/// The executor's state as its two conditions say it.
fn state(
    ready: &'static str,
    stalled: bool,
    reason: &'static str,
    message: impl Into<String>,
) -> [Desired; 2] {
    let message = message.into();
    let stalled_condition = if stalled {
        desired(STALLED, "True", reason, message.clone())
    } else {
        desired(STALLED, "False", reason, "")
    };
    [desired(READY, ready, reason, message), stalled_condition]
}

/// Fields the executor controller owns besides the conditions.
#[derive(Clone, Default, PartialEq)]
struct Sandbox {
    id: Option<String>,
    created: Option<Time>,
    ready: Option<Time>,
}

impl Sandbox {
    fn of(status: &BriqExecutorStatus) -> Sandbox {
        Sandbox {
            id: status.sandbox_id.clone(),
            created: status.sandbox_created_time.clone(),
            ready: status.ready_time.clone(),
        }
    }
}

/// Applies the executor controller's part of the status, unless it already says that.
async fn report(
    api: &Api<BriqExecutor>,
    executor: &BriqExecutor,
    state: [Desired; 2],
    sandbox: Sandbox,
) -> Result<()> {
    let current = executor.status.clone().unwrap_or_default();
    let generation = executor.metadata.generation;
    if conditions::satisfied(&current.conditions, &state, generation)
        && current.observed_generation == generation
        && Sandbox::of(&current) == sandbox
    {
        return Ok(());
    }
    let status = BriqExecutorStatus {
        observed_generation: generation,
        conditions: conditions::merge(&current.conditions, &state, generation),
        sandbox_id: sandbox.id,
        sandbox_created_time: sandbox.created,
        ready_time: sandbox.ready,
        ..Default::default()
    };
    apply_status(
        api,
        executor,
        EXECUTOR_MANAGER,
        serde_json::to_value(status).expect("status serializes"),
    )
    .await
}

fn recorded_sandbox_id(executor: &BriqExecutor) -> Option<String> {
    executor
        .status
        .as_ref()
        .and_then(|status| status.sandbox_id.clone())
        .or_else(|| executor.annotations().get(SANDBOX_ID_ANNOTATION).cloned())
}

fn stalled_reason(status: &BriqExecutorStatus) -> Option<&str> {
    conditions::find(&status.conditions, STALLED)
        .filter(|condition| condition.status == "True")
        .map(|condition| condition.reason.as_str())
}

async fn apply<S: SandboxApi>(
    executor: &BriqExecutor,
    ctx: &Context<S>,
    api: &Api<BriqExecutor>,
) -> Result<Action> {
    let status = executor.status.clone().unwrap_or_default();
    let sandbox = Sandbox::of(&status);

    // 1. Unusable and failed executors are final: report it and never touch the sandbox again
    //    (it is destroyed on deletion; a failed setup already destroyed it).
    if status.unusable {
        let reason = status.unusable_reason.as_deref().unwrap_or("unknown");
        return report_unusable(api, executor, reason, sandbox).await;
    }
    if stalled_reason(&status) == Some("SetupFailed") {
        if let Some(id) = recorded_sandbox_id(executor) {
            destroy_failed_setup(executor, ctx, api, &id).await?;
        }
        let message = conditions::find(&status.conditions, READY)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        report(
            api,
            executor,
            state("False", true, "SetupFailed", message),
            Sandbox::default(),
        )
        .await?;
        return Ok(Action::await_change());
    }
    if conditions::find(&status.conditions, READY).is_none() {
        report(
            api,
            executor,
            state("Unknown", false, "Provisioning", "creating the sandbox"),
            sandbox.clone(),
        )
        .await?;
    }

    // 2. Credentials.
    let key = match api_key(ctx, executor).await {
        Ok(key) => key,
        Err(Error::ApiKey(message)) => {
            report(
                api,
                executor,
                state("False", false, "ApiKeyMissing", message),
                sandbox,
            )
            .await?;
            return Ok(Action::requeue(std::time::Duration::from_secs(30)));
        }
        Err(error) => return Err(error),
    };

    // 3. The sandbox, created at most once.
    let id = match ensure_sandbox(executor, ctx, api, &key).await {
        Ok(id) => id,
        Err(Error::Briq(error)) if error.class() == ErrorClass::Terminal => {
            report(
                api,
                executor,
                state("False", false, "BriqRefused", error.to_string()),
                sandbox,
            )
            .await?;
            return Err(Error::Briq(error));
        }
        Err(error) => return Err(error),
    };
    let sandbox = Sandbox {
        id: Some(id.clone()),
        created: sandbox.created.or_else(|| Some(conditions::now())),
        ready: sandbox.ready,
    };

    // 4. Ready executors only check that the sandbox still runs. The watch cache can lag
    //    behind this controller's own last write, so a fresh read decides before provisioning
    //    again.
    if conditions::is_true(&status.conditions, READY) {
        return probe(executor, ctx, api, &key, sandbox).await;
    }
    let fresh = api.get(&executor.name_any()).await?;
    let fresh_status = fresh.status.clone().unwrap_or_default();
    if conditions::is_true(&fresh_status.conditions, READY) {
        let sandbox = Sandbox {
            id: Some(id.clone()),
            ..Sandbox::of(&fresh_status)
        };
        return probe(&fresh, ctx, api, &key, sandbox).await;
    }

    // 5. Provision: bridge, dependencies, kernel.
    report(
        api,
        executor,
        state(
            "Unknown",
            false,
            "Provisioning",
            "installing the bridge and starting the kernel",
        ),
        sandbox.clone(),
    )
    .await?;
    let session = Session {
        api: &ctx.sandboxes,
        key: &key,
        sandbox_id: &id,
    };
    let deadline = std::time::Duration::from_secs(executor.spec.setup_timeout_seconds.into());
    let packages = executor.spec.packages.clone().unwrap_or_default();
    let failure = match session.provision(deadline, &packages).await {
        Ok(()) => {
            let ready = Sandbox {
                ready: Some(conditions::now()),
                ..sandbox
            };
            report(
                api,
                executor,
                state("True", false, "KernelReady", "the kernel answers"),
                ready,
            )
            .await?;
            publish(
                ctx,
                executor,
                EventType::Normal,
                "Ready",
                "Provision",
                format!("sandbox {id} is ready"),
            )
            .await;
            info!(sandbox = %id, "executor ready");
            ctx.metrics
                .executor_ready(executor.metadata.creation_timestamp.as_ref());
            return Ok(Action::requeue(ctx.settings.probe_interval));
        }
        Err(SetupError::Call(CallError::Briq(error))) if error.class() == ErrorClass::NotFound => {
            forget_sandbox(api, executor).await?;
            return Err(Error::Briq(error));
        }
        Err(SetupError::Call(error))
            if !matches!(
                error,
                CallError::Malformed(_) | CallError::UnexpectedKind(_)
            ) =>
        {
            return Err(error.into());
        }
        Err(SetupError::Failed { message, pip_tail }) => match pip_tail {
            Some(tail) if !tail.is_empty() => format!("{message}; pip output ends:\n{tail}"),
            _ => message,
        },
        Err(other) => other.to_string(),
    };

    // 6. A failed setup destroys the sandbox: say so first, so that a failed destroy is retried.
    publish(
        ctx,
        executor,
        EventType::Warning,
        "SetupFailed",
        "Provision",
        failure.clone(),
    )
    .await;
    report(
        api,
        executor,
        state("False", true, "SetupFailed", failure),
        sandbox,
    )
    .await?;
    destroy_failed_setup(executor, ctx, api, &id).await?;
    Ok(Action::await_change())
}

async fn ensure_sandbox<S: SandboxApi>(
    executor: &BriqExecutor,
    ctx: &Context<S>,
    api: &Api<BriqExecutor>,
    key: &crate::briq::ApiKey,
) -> Result<String> {
    if let Some(id) = recorded_sandbox_id(executor) {
        return Ok(id);
    }
    // The watch cache may not show yet what the previous reconcile wrote: decide on a fresh
    // read, since creating twice is the one mistake that costs a sandbox.
    let fresh = api.get(&executor.name_any()).await?;
    if let Some(id) = recorded_sandbox_id(&fresh) {
        return Ok(id);
    }
    let executor = &fresh;
    let name = sandbox_name(
        &executor.namespace().unwrap_or_default(),
        &executor.name_any(),
        &executor.uid().unwrap_or_default(),
    );
    if executor
        .annotations()
        .contains_key(CREATE_PENDING_ANNOTATION)
    {
        // An earlier create has no recorded outcome. The name is deterministic, so look.
        let mut found = ctx.sandboxes.find_sandboxes_by_name(key, &name).await?;
        found.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        if let Some((keep, duplicates)) = found.split_first() {
            for duplicate in duplicates {
                ctx.sandboxes.destroy_sandbox(key, &duplicate.id).await?;
                warn!(sandbox = %duplicate.id, "destroyed a duplicate sandbox left by an uncertain create");
            }
            record_sandbox(api, executor, &keep.id).await?;
            publish(
                ctx,
                executor,
                EventType::Normal,
                "SandboxAdopted",
                "Create",
                format!("found sandbox {} created before a restart", keep.id),
            )
            .await;
            return Ok(keep.id.clone());
        }
        // Nothing by that name: the create never took effect, so creating now is safe.
    } else {
        let started = conditions::now().0.to_string();
        annotate(api, executor, json!({ CREATE_PENDING_ANNOTATION: started })).await?;
    }
    let request = CreateSandbox {
        name,
        image: executor.spec.image.clone(),
        size: executor.spec.size.clone(),
        sleep: executor.spec.sleep.clone(),
        env: executor
            .spec
            .env
            .iter()
            .flatten()
            .map(|var| (var.name.clone(), var.value.clone()))
            .collect(),
    };
    // On any error the pending marker stays, and the next attempt looks before it creates.
    let sandbox = ctx.sandboxes.create_sandbox(key, &request).await?;
    record_sandbox(api, executor, &sandbox.id).await?;
    publish(
        ctx,
        executor,
        EventType::Normal,
        "SandboxCreated",
        "Create",
        format!("created sandbox {}", sandbox.id),
    )
    .await;
    info!(sandbox = %sandbox.id, "sandbox created");
    Ok(sandbox.id)
}

/// Merge-patches the executor's annotations (`null` removes one).
async fn annotate(
    api: &Api<BriqExecutor>,
    executor: &BriqExecutor,
    annotations: serde_json::Value,
) -> Result<()> {
    let patch = json!({ "metadata": { "annotations": annotations } });
    api.patch(
        &executor.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

async fn record_sandbox(api: &Api<BriqExecutor>, executor: &BriqExecutor, id: &str) -> Result<()> {
    annotate(
        api,
        executor,
        json!({ SANDBOX_ID_ANNOTATION: id, CREATE_PENDING_ANNOTATION: null }),
    )
    .await
}

async fn forget_sandbox(api: &Api<BriqExecutor>, executor: &BriqExecutor) -> Result<()> {
    annotate(
        api,
        executor,
        json!({ SANDBOX_ID_ANNOTATION: null, CREATE_PENDING_ANNOTATION: null }),
    )
    .await?;
    let message = "the sandbox disappeared before it was ready; creating another";
    report(
        api,
        executor,
        state("Unknown", false, "Provisioning", message),
        Sandbox::default(),
    )
    .await
}

async fn destroy_failed_setup<S: SandboxApi>(
    executor: &BriqExecutor,
    ctx: &Context<S>,
    api: &Api<BriqExecutor>,
    id: &str,
) -> Result<()> {
    let key = api_key(ctx, executor).await?;
    ctx.sandboxes.destroy_sandbox(&key, id).await?;
    annotate(api, executor, json!({ SANDBOX_ID_ANNOTATION: null })).await?;
    info!(sandbox = %id, "destroyed the sandbox of a failed setup");
    Ok(())
}

/// A sleeping, restarted or vanished sandbox has lost its kernel, and with it the Python state
/// the Executions rely on: the executor becomes unusable. The probe is a GET, which does not
/// count as use, so it does not keep an idle sandbox awake.
async fn probe<S: SandboxApi>(
    executor: &BriqExecutor,
    ctx: &Context<S>,
    api: &Api<BriqExecutor>,
    key: &crate::briq::ApiKey,
    sandbox: Sandbox,
) -> Result<Action> {
    let id = sandbox.id.clone().unwrap_or_default();
    let lost = match ctx.sandboxes.get_sandbox(key, &id).await {
        Ok(found) if found.state == SandboxState::Running => {
            report(
                api,
                executor,
                state("True", false, "KernelReady", "the kernel answers"),
                sandbox,
            )
            .await?;
            return Ok(Action::requeue(ctx.settings.probe_interval));
        }
        Ok(found) => format!(
            "sandbox {id} is {}: its kernel and Python state are lost",
            found.state
        ),
        Err(error) if error.class() == ErrorClass::NotFound => {
            format!("sandbox {id} no longer exists")
        }
        Err(error) => return Err(error.into()),
    };
    mark_unusable(ctx, executor, &lost).await?;
    publish(
        ctx,
        executor,
        EventType::Warning,
        "KernelLost",
        "Probe",
        lost.clone(),
    )
    .await;
    report_unusable(api, executor, &lost, sandbox).await
}

async fn report_unusable(
    api: &Api<BriqExecutor>,
    executor: &BriqExecutor,
    why: &str,
    sandbox: Sandbox,
) -> Result<Action> {
    let message =
        format!("{why}. An unusable executor never runs code again: create a new BriqExecutor");
    report(
        api,
        executor,
        state("False", true, "Unusable", message),
        sandbox,
    )
    .await?;
    Ok(Action::await_change())
}

/// Destroys every sandbox this executor may own. The finalizer is removed only when all are
/// confirmed gone; each failure is an Event and a condition, and is retried with backoff.
async fn cleanup<S: SandboxApi>(
    executor: &BriqExecutor,
    ctx: &Context<S>,
    api: &Api<BriqExecutor>,
) -> Result<Action> {
    let mut ids: BTreeSet<String> = executor
        .status
        .iter()
        .filter_map(|s| s.sandbox_id.clone())
        .collect();
    ids.extend(executor.annotations().get(SANDBOX_ID_ANNOTATION).cloned());
    let pending = executor
        .annotations()
        .contains_key(CREATE_PENDING_ANNOTATION);
    if ids.is_empty() && !pending {
        return Ok(Action::await_change());
    }
    let sandbox = Sandbox::of(&executor.status.clone().unwrap_or_default());
    let outcome = async {
        let key = api_key(ctx, executor).await?;
        if pending {
            let name = sandbox_name(
                &executor.namespace().unwrap_or_default(),
                &executor.name_any(),
                &executor.uid().unwrap_or_default(),
            );
            ids.extend(
                ctx.sandboxes
                    .find_sandboxes_by_name(&key, &name)
                    .await?
                    .into_iter()
                    .map(|s| s.id),
            );
        }
        for id in &ids {
            match ctx.sandboxes.destroy_sandbox(&key, id).await? {
                DestroyOutcome::Destroyed => info!(sandbox = %id, "sandbox destroyed"),
                DestroyOutcome::AlreadyGone => info!(sandbox = %id, "sandbox was already gone"),
            }
        }
        Ok::<_, Error>(())
    }
    .await;
    match outcome {
        Ok(()) => {
            let note = format!(
                "destroyed sandbox {}",
                ids.into_iter().collect::<Vec<_>>().join(", ")
            );
            publish(
                ctx,
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
            publish(
                ctx,
                executor,
                EventType::Warning,
                "DestroyFailed",
                "Destroy",
                message.clone(),
            )
            .await;
            if let Err(report_error) = report(
                api,
                executor,
                state("False", false, "DestroyFailed", message),
                sandbox,
            )
            .await
            {
                warn!(%report_error, "could not report the failed destroy");
            }
            Err(error)
        }
    }
}
