//! `logs EXECUTION`: an Execution's result, printed the way `exec` prints it. What the code
//! produced goes to stdout (logs, output, final answer); the error and notes go to stderr.

use kube::{Api, runtime::wait::await_condition};

use super::{
    cluster::ExecutionArg, error::Error, exit::Exit, live, output::emit, status::succeeded,
};
use crate::crd::{Execution, ExecutionError};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: ExecutionArg,

    /// Wait (on a watch) until the Execution has finished.
    #[arg(long)]
    wait: bool,

    /// Print the output as the kernel produces it, then the result once it has finished
    /// (implies --wait).
    #[arg(short, long)]
    follow: bool,
}

pub async fn run(args: Args) -> Result<Exit, Error> {
    let (cluster, executions, named) = args.target.connect().await?;
    let name = &named;
    if args.follow {
        let shown = live::follow(&cluster.client, &cluster.namespace, name).await;
        let execution = await_finished(&executions, name, &cluster.namespace).await?;
        return Ok(print(&execution, shown));
    }
    let execution = if args.wait {
        await_finished(&executions, name, &cluster.namespace).await?
    } else {
        executions
            .get_opt(name)
            .await?
            .ok_or_else(|| Error::ExecutionNotFound {
                name: name.clone(),
                namespace: cluster.namespace.clone(),
            })?
    };
    Ok(print(&execution, live::Shown::Nothing))
}

/// The operator keeps an Execution whose executor does not exist waiting (`ExecutorNotFound`)
/// until one is created; a command line would wait forever, so that ends the wait too.
const EXECUTOR_NOT_FOUND: &str = "ExecutorNotFound";

/// Waits on a watch until `Succeeded` leaves Unknown.
pub async fn await_finished(
    executions: &Api<Execution>,
    name: &str,
    namespace: &str,
) -> Result<Execution, Error> {
    let ended = |execution: Option<&Execution>| execution.is_none_or(ended);
    let execution = await_condition(executions.clone(), name, ended).await?;
    once_ended(execution, name, namespace)
}

/// Whether waiting for the Execution is over: it has finished, or waits for an executor that
/// does not exist.
pub fn ended(execution: &Execution) -> bool {
    succeeded(execution).is_some_and(|c| c.status != "Unknown" || c.reason == EXECUTOR_NOT_FOUND)
}

/// The Execution once waiting for it has [`ended`]; an error when it is gone or its executor
/// does not exist.
pub fn once_ended(
    execution: Option<Execution>,
    name: &str,
    namespace: &str,
) -> Result<Execution, Error> {
    let execution = execution.ok_or_else(|| Error::ExecutionNotFound {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
    })?;
    match succeeded(&execution) {
        Some(c) if c.reason == EXECUTOR_NOT_FOUND => Err(Error::ExecutorNotFound {
            name: execution.spec.executor_ref.name.clone(),
            namespace: namespace.to_owned(),
        }),
        _ => Ok(execution),
    }
}

/// Prints the Execution's result, its logs unless `live` showed them all; the exit status says
/// how it ended.
pub fn print(execution: &Execution, live: live::Shown) -> Exit {
    let shown = Shown::after(execution, live);
    emit(&shown.stdout, &shown.stderr);
    shown.exit
}

/// An Execution's result as text.
struct Shown {
    stdout: String,
    stderr: String,
    exit: Exit,
}

impl Shown {
    #[cfg(test)]
    fn of(execution: &Execution) -> Shown {
        Shown::after(execution, live::Shown::Nothing)
    }

    fn after(execution: &Execution, live: live::Shown) -> Shown {
        let status = execution.status.clone().unwrap_or_default();
        let mut stdout = String::new();
        let mut stderr = String::new();
        if live == live::Shown::Part {
            push_line(
                &mut stderr,
                "note: the live output broke off; the logs as the status keeps them follow",
            );
        }
        let logs = status.logs.as_ref().filter(|_| live != live::Shown::All);
        for produced in [logs, status.output.as_ref()].into_iter().flatten() {
            push_line(&mut stdout, produced);
        }
        if let Some(answer) = status
            .final_answer
            .as_deref()
            .filter(|_| status.is_final_answer)
        {
            push_line(&mut stdout, &readable_final_answer(answer));
        }
        if status.truncated {
            push_line(
                &mut stderr,
                "note: logs and output were too long; their middle was cut",
            );
        }
        if let Some(dropped) = status.display_outputs_dropped {
            let note = format!("note: {dropped} rich display output(s) (images, HTML) not shown");
            push_line(&mut stderr, &note);
        }
        let exit = match succeeded(execution) {
            Some(c) if c.status == "True" => Exit::Ok,
            Some(c) if c.status == "False" => {
                let fallback = ExecutionError {
                    name: c.reason.clone(),
                    message: c.message.clone(),
                    traceback: None,
                };
                push_line(
                    &mut stderr,
                    &error_text(status.error.as_ref().unwrap_or(&fallback)),
                );
                Exit::ExecutionFailed
            }
            pending => {
                let why = pending.map_or("not picked up by the operator yet".into(), |c| {
                    format!("{}: {}", c.reason, c.message)
                });
                let name = execution.metadata.name.as_deref().unwrap_or_default();
                let note =
                    format!("Execution {name} has not finished ({why}); --wait waits for it");
                push_line(&mut stderr, &note);
                Exit::Ok
            }
        };
        Shown {
            stdout,
            stderr,
            exit,
        }
    }
}

fn push_line(out: &mut String, text: &str) {
    out.push_str(text);
    if !text.ends_with('\n') {
        out.push('\n');
    }
}

/// A final answer in smolagents' safe serialization (`safe:` + JSON) as indented JSON. It is
/// only parsed as JSON, never evaluated; smolagents' `{"__type__": ...}` tags stay as they are.
/// Anything else is shown as it is.
fn readable_final_answer(answer: &str) -> String {
    let Some(json) = answer.strip_prefix("safe:") else {
        return answer.to_owned();
    };
    serde_json::from_str::<serde_json::Value>(json)
        .and_then(|value| serde_json::to_string_pretty(&value))
        .unwrap_or_else(|_| json.to_owned())
}

/// The traceback followed by one `Name: message`, as Python prints it. IPython's traceback
/// already ends with a line naming the error, sometimes with less than the message (a syntax
/// error's location): that line gives way to the headline, never printed twice.
fn error_text(error: &ExecutionError) -> String {
    let headline = if error.message.is_empty() {
        error.name.clone()
    } else {
        format!("{}: {}", error.name, error.message)
    };
    let Some(traceback) = error.traceback.as_deref().map(str::trim_end) else {
        return headline;
    };
    let names_the_error = |line: &str| {
        let line = line.trim_end();
        line == error.name || line.starts_with(&format!("{}:", error.name))
    };
    let kept = match traceback.rsplit_once('\n') {
        Some((before, last)) if names_the_error(last) => before,
        None if names_the_error(traceback) => "",
        _ => traceback,
    };
    if kept.is_empty() {
        headline
    } else {
        format!("{kept}\n{headline}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn execution(status: serde_json::Value) -> Execution {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "py-abcde" },
            "spec": { "executorRef": { "name": "py" }, "code": "x" },
            "status": status,
        }))
        .unwrap()
    }

    fn succeeded_condition(status: &str, reason: &str) -> serde_json::Value {
        serde_json::json!([{
            "type": "Succeeded", "status": status, "reason": reason, "message": "the message",
            "lastTransitionTime": "2025-01-01T00:00:00Z"
        }])
    }

    #[test]
    fn final_answers_become_indented_json_and_nothing_else_is_touched() {
        assert_eq!(readable_final_answer("safe:[1, 2]"), "[\n  1,\n  2\n]");
        assert_eq!(
            readable_final_answer(r#"safe:{"__type__": "bytes", "data": "aGk="}"#),
            "{\n  \"__type__\": \"bytes\",\n  \"data\": \"aGk=\"\n}"
        );
        assert_eq!(readable_final_answer("safe:not json"), "not json");
        assert_eq!(readable_final_answer("pickle:gASV"), "pickle:gASV");
    }

    #[test]
    fn the_headline_follows_the_traceback_once() {
        let error = |traceback: Option<&str>| ExecutionError {
            name: "ZeroDivisionError".into(),
            message: "division by zero".into(),
            traceback: traceback.map(Into::into),
        };
        let ipython = "Cell In[1], line 1\n----> 1 1/0\n\nZeroDivisionError: division by zero\n";
        assert_eq!(error_text(&error(Some(ipython))), ipython.trim_end());
        assert_eq!(
            error_text(&error(Some("  File x"))),
            "  File x\nZeroDivisionError: division by zero"
        );
        assert_eq!(
            error_text(&error(None)),
            "ZeroDivisionError: division by zero"
        );
        // A syntax error: IPython's last line says less than the message, which names the
        // action (the bridge's doing); one headline, the full one.
        let syntax = ExecutionError {
            name: "SyntaxError".into(),
            message: "invalid syntax (<action>, line 1)".into(),
            traceback: Some(
                "  Cell In[3], line 1\n    def f(:\n          ^\nSyntaxError: invalid syntax\n"
                    .into(),
            ),
        };
        assert_eq!(
            error_text(&syntax),
            "  Cell In[3], line 1\n    def f(:\n          ^\nSyntaxError: invalid syntax (<action>, line 1)"
        );
        let bare = ExecutionError {
            traceback: Some("SyntaxError: invalid syntax".into()),
            ..syntax
        };
        assert_eq!(
            error_text(&bare),
            "SyntaxError: invalid syntax (<action>, line 1)"
        );
    }

    #[test]
    fn results_go_to_stdout_errors_to_stderr_with_the_exit_status() {
        let done = Shown::of(&execution(serde_json::json!({
            "conditions": succeeded_condition("True", "FinalAnswer"),
            "logs": "working\n", "isFinalAnswer": true, "finalAnswer": "safe:{\"a\": 1}",
        })));
        assert_eq!(done.stdout, "working\n{\n  \"a\": 1\n}\n");
        assert_eq!((done.stderr.as_str(), done.exit), ("", Exit::Ok));

        let timed_out = Shown::of(&execution(serde_json::json!({
            "conditions": succeeded_condition("False", "Timeout"),
            "error": { "name": "Timeout", "message": "too slow" },
        })));
        assert_eq!(timed_out.stderr, "Timeout: too slow\n");
        assert_eq!(timed_out.exit, Exit::ExecutionFailed);

        let without_error = Shown::of(&execution(serde_json::json!({
            "conditions": succeeded_condition("False", "ExecutorUnusable"),
        })));
        assert_eq!(without_error.stderr, "ExecutorUnusable: the message\n");

        let queued = Shown::of(&execution(serde_json::json!({
            "conditions": succeeded_condition("Unknown", "Queued"), "output": "partial",
        })));
        assert_eq!(queued.stdout, "partial\n");
        assert!(
            queued.stderr.contains("Queued: the message"),
            "{}",
            queued.stderr
        );
        assert_eq!(queued.exit, Exit::Ok);
    }
}
