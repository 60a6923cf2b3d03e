//! `exec EXECUTOR (-f FILE | -c CODE)`: one Execution, created, waited for and printed.

use std::{
    io::{IsTerminal as _, Read as _},
    path::PathBuf,
    time::Duration,
};

use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ObjectMeta, PostParams},
    runtime::wait::await_condition,
};

use super::{
    cluster::{Cluster, NamespaceArg},
    error::Error,
    exit::Exit,
    live, logs,
    output::printable,
    progress,
    status::condition,
};
use crate::crd::{
    BriqExecutor, Execution, ExecutionSpec, ExecutorRef, MAX_EXECUTION_TIMEOUT_SECONDS,
    history_owner,
};

#[derive(clap::Args)]
pub struct Args {
    /// The BriqExecutor whose kernel runs the code.
    executor: String,

    #[command(flatten)]
    code: CodeSource,

    #[command(flatten)]
    namespace: NamespaceArg,

    /// Deadline of the Execution in seconds [default: the executor's executionTimeoutSeconds].
    /// Running past it makes the executor unusable.
    #[arg(long, value_name = "SECONDS",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_EXECUTION_TIMEOUT_SECONDS)))]
    timeout: Option<u32>,

    /// How long to wait for a BriqExecutor that is not ready yet.
    #[arg(long, value_name = "SECONDS", default_value_t = 180)]
    ready_timeout: u64,

    /// Delete the Execution after printing its result (by default it is kept as the record).
    #[arg(long)]
    rm: bool,

    /// Report on stderr while the Execution waits in the executor's queue and runs: `queued (2
    /// ahead)`, `running` [default: when stderr is a terminal]. stdout has the result only.
    #[arg(long, visible_alias = "follow")]
    progress: bool,

    /// Print nothing on stderr but the Execution's error and failures: no progress, no notes
    /// (the created Execution's name, waiting for the executor).
    #[arg(short, long, conflicts_with = "progress")]
    quiet: bool,
}

#[derive(clap::Args)]
#[group(required = true, multiple = false)]
struct CodeSource {
    /// Python file to run; `-` reads standard input.
    #[arg(short, long, value_name = "FILE")]
    file: Option<PathBuf>,

    /// Python code to run.
    #[arg(short, long, value_name = "CODE")]
    code: Option<String>,
}

impl CodeSource {
    fn read(self) -> Result<String, Error> {
        let Some(path) = self.file else {
            return Ok(self.code.unwrap_or_default());
        };
        let read = if path.as_os_str() == "-" {
            let mut code = String::new();
            std::io::stdin().read_to_string(&mut code).map(|_| code)
        } else {
            std::fs::read_to_string(&path)
        };
        read.map_err(|source| Error::ReadCode { path, source })
    }
}

/// The Execution's trace annotation from the `TRACEPARENT` variable (OpenTelemetry's carrier
/// for a command run inside a traced step), so that the operator's spans join that trace. The
/// operator checks its form; here only an empty value is dropped.
fn traceparent_annotation(
    traceparent: Option<String>,
) -> Option<std::collections::BTreeMap<String, String>> {
    let value = traceparent?.trim().to_owned();
    (!value.is_empty()).then(|| [(crate::traces::TRACEPARENT_ANNOTATION.to_owned(), value)].into())
}

pub async fn run(args: Args) -> Result<Exit, Error> {
    let code = args.code.read()?;
    let cluster = Cluster::connect(args.namespace).await?;
    let ready_timeout = Duration::from_secs(args.ready_timeout);
    let executor = await_ready(&cluster, &args.executor, ready_timeout, args.quiet).await?;
    let progress = !args.quiet && (args.progress || std::io::stderr().is_terminal());

    let executions = cluster.api::<Execution>();
    let execution = Execution {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", args.executor)),
            owner_references: history_owner(&executor).map(|owner| vec![owner]),
            annotations: traceparent_annotation(std::env::var("TRACEPARENT").ok()),
            ..ObjectMeta::default()
        },
        spec: ExecutionSpec {
            executor_ref: ExecutorRef {
                name: args.executor.clone(),
            },
            code,
            timeout_seconds: args.timeout,
            ttl_seconds_after_finished: None,
            cancel: false,
        },
        status: None,
    };
    let name = executions
        .create(&PostParams::default(), &execution)
        .await?
        .name_any();
    if !args.quiet {
        eprintln!("execution.briq.cloud/{name} created");
    }

    let shown = async {
        let namespace = &cluster.namespace;
        let finished = async {
            match progress {
                true => progress::follow(&executions, &args.executor, &name, namespace).await,
                false => logs::await_finished(&executions, &name, namespace).await,
            }
        };
        // The output as it comes, while the result is awaited.
        let (live, finished) =
            tokio::join!(live::follow(&cluster.client, namespace, &name), finished);
        Ok(logs::print(&finished?, live))
    }
    .await;
    if args.rm {
        delete(&executions, &name).await?;
    }
    shown
}

async fn delete(executions: &Api<Execution>, name: &str) -> Result<(), Error> {
    match executions.delete(name, &DeleteParams::default()).await {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other.map(drop).map_err(Error::from),
    }
}

const NOT_REPORTED: &str = "the operator has not reported on it yet";

/// Whether an executor can take an Execution now.
#[derive(Debug, PartialEq)]
enum Readiness {
    Ready,
    /// Not yet; why, as its `Ready` condition says.
    Pending(String),
    /// Never again; why.
    Unusable(String),
}

fn readiness(executor: &BriqExecutor) -> Readiness {
    if executor.metadata.deletion_timestamp.is_some() {
        return Readiness::Unusable("it is being deleted".into());
    }
    let Some(status) = &executor.status else {
        return Readiness::Pending(NOT_REPORTED.into());
    };
    if status.unusable {
        let why = status.unusable_reason.as_deref();
        return Readiness::Unusable(
            why.unwrap_or("an earlier Execution made it unusable")
                .into(),
        );
    }
    if let Some(stalled) = condition(&status.conditions, "Stalled").filter(|c| c.status == "True") {
        return Readiness::Unusable(format!("{}: {}", stalled.reason, stalled.message));
    }
    match condition(&status.conditions, "Ready") {
        Some(ready) if ready.status == "True" => Readiness::Ready,
        Some(ready) => Readiness::Pending(format!("{}: {}", ready.reason, ready.message)),
        None => Readiness::Pending(NOT_REPORTED.into()),
    }
}

/// The executor once it is Ready; waits (on a watch, at most `timeout`) while it is getting
/// ready, saying so unless `quiet`, and fails when it is missing or unusable.
pub(super) async fn await_ready(
    cluster: &Cluster,
    name: &str,
    timeout: Duration,
    quiet: bool,
) -> Result<BriqExecutor, Error> {
    let executors = cluster.api::<BriqExecutor>();
    let not_found = || Error::ExecutorNotFound {
        name: name.to_owned(),
        namespace: cluster.namespace.clone(),
    };
    let mut executor = executors.get_opt(name).await?.ok_or_else(not_found)?;
    if let Readiness::Pending(why) = readiness(&executor) {
        if !quiet {
            let why = printable(&why);
            eprintln!("waiting for BriqExecutor {name} to become ready ({why})");
        }
        let decided = |executor: Option<&BriqExecutor>| {
            executor.is_none_or(|executor| !matches!(readiness(executor), Readiness::Pending(_)))
        };
        let wait = await_condition(executors.clone(), name, decided);
        executor = match tokio::time::timeout(timeout, wait).await {
            Ok(decided) => decided?.ok_or_else(not_found)?,
            Err(_) => executors.get_opt(name).await?.ok_or_else(not_found)?,
        };
    }
    match readiness(&executor) {
        Readiness::Ready => Ok(executor),
        Readiness::Unusable(reason) => Err(Error::ExecutorUnusable {
            name: name.to_owned(),
            reason,
        }),
        Readiness::Pending(reason) => Err(Error::ExecutorNotReady {
            name: name.to_owned(),
            seconds: timeout.as_secs(),
            reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_in_the_environment_goes_on_the_execution() {
        let value = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert_eq!(
            traceparent_annotation(Some(format!(" {value}\n"))),
            Some([("briq.cloud/traceparent".to_owned(), value.to_owned())].into())
        );
        assert_eq!(traceparent_annotation(Some("  ".to_owned())), None);
        assert_eq!(traceparent_annotation(None), None);
    }

    fn executor(status: serde_json::Value) -> BriqExecutor {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "py" }, "spec": {}, "status": status
        }))
        .unwrap()
    }

    fn conditions(ready: &str, stalled: &str, reason: &str) -> serde_json::Value {
        let condition = |type_: &str, status: &str| {
            serde_json::json!({
                "type": type_, "status": status, "reason": reason, "message": "why",
                "lastTransitionTime": "2025-01-01T00:00:00Z"
            })
        };
        serde_json::json!({ "conditions": [condition("Ready", ready), condition("Stalled", stalled)] })
    }

    #[test]
    fn readiness_follows_the_conditions_and_the_unusable_flag() {
        assert_eq!(
            readiness(&executor(conditions("True", "False", "KernelReady"))),
            Readiness::Ready
        );
        assert_eq!(
            readiness(&executor(conditions("False", "False", "Provisioning"))),
            Readiness::Pending("Provisioning: why".into())
        );
        assert_eq!(
            readiness(&executor(conditions("False", "True", "SetupFailed"))),
            Readiness::Unusable("SetupFailed: why".into())
        );
        let mut unusable = conditions("False", "True", "Unusable");
        unusable["unusable"] = true.into();
        unusable["unusableReason"] = "an Execution's command timed out".into();
        assert_eq!(
            readiness(&executor(unusable)),
            Readiness::Unusable("an Execution's command timed out".into())
        );
        assert!(matches!(
            readiness(&executor(serde_json::Value::Null)),
            Readiness::Pending(_)
        ));
    }
}
