//! The tools: each reads its arguments through `briq::api`'s argument type, performs the
//! operation on the server's sandboxes and answers through `briq::api`'s answer type.

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::answer;
use super::declared::{Misfit, Tool};
use crate::local_server::faults::Operation;
use crate::local_server::http::ApiError;
use crate::local_server::sandbox_io::{self, Command};
use crate::local_server::state::Shared;
use briq_operator::briq::api::{
    AsyncExecArgs, BriqArgs, BriqList, ExecAnswer, ExecArgs, ExecResultArgs, ExecStarted,
    ExecStopArgs, FilesGetAnswer, FilesGetArgs, FilesPutAnswer, FilesPutArgs, ListArgs,
    MAX_EXEC_TIMEOUT, RunArgs, SandboxState, TIMED_OUT_STATUS, Unwrapped, tools,
};

/// briq.cloud's default sleep (published: 1 h), for a `briq_run` that names none.
const DEFAULT_SLEEP: &str = "1h";

/// Why a call was refused or failed.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// Before the tool ran, for its arguments: a JSON-RPC invalid-params error.
    Params(String),
    /// By the tool: a tool error.
    Tool(ApiError),
}

impl From<ApiError> for Refusal {
    fn from(error: ApiError) -> Self {
        Self::Tool(error)
    }
}

/// The operation a tool call is counted as.
pub(crate) fn operation(tool: &str) -> Option<Operation> {
    Some(match tool {
        tools::RUN => Operation::Create,
        tools::LIST => Operation::List,
        tools::STATUS => Operation::Get,
        tools::EXEC | tools::EXEC_STOP => Operation::Exec,
        tools::EXEC_RESULT => Operation::Get,
        tools::FILES_PUT => Operation::WriteFile,
        tools::FILES_GET => Operation::ReadFile,
        tools::STOP => Operation::Stop,
        tools::START => Operation::Start,
        tools::DESTROY => Operation::Destroy,
        tools::FORK => Operation::Fork,
        _ => return None,
    })
}

/// Answer of `briq_destroy` (assumed shape, as the client reads it).
#[derive(Debug, Serialize)]
struct Destroyed {
    briq: String,
    state: SandboxState,
}

/// Calls `tool` (as declared now) with `arguments`; answers the `tools/call` result.
pub(crate) async fn call(
    shared: Arc<Shared>,
    tool: Tool,
    mut arguments: Map<String, Value>,
) -> Result<Value, Refusal> {
    tool.check(&arguments).map_err(|misfit| match misfit {
        Misfit::Invalid(message) => Refusal::Params(message),
        Misfit::Unsupported(message) => Refusal::Tool(ApiError::invalid(message)),
    })?;
    // Left out, as far as the argument types go.
    arguments.retain(|_, value| !value.is_null());
    let name = tool.name;
    match name {
        tools::RUN => {
            fill_run_defaults(&mut arguments);
            let args: RunArgs = parse(name, arguments)?;
            let sandbox = shared.create(args.create, args.wait).await?;
            Ok(answer::structured(&sandbox)?)
        }
        tools::FORK => {
            let Some(Value::String(source)) = arguments.remove("briq") else {
                return Err(Refusal::Params(format!(
                    "{name}: pass `briq` (a stack fork is not supported by the local server)"
                )));
            };
            let wait = arguments.remove("wait").and_then(|w| w.as_bool()) != Some(false);
            let text = |key: &str| {
                arguments
                    .get(key)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            let sandbox = shared
                .fork(&source, text("name"), text("sleep"), wait)
                .await?;
            Ok(answer::structured(&sandbox)?)
        }
        tools::LIST => {
            let args: ListArgs = parse(name, arguments)?;
            let briqs = shared.list(args.all);
            Ok(answer::structured(&BriqList { briqs })?)
        }
        tools::STATUS => {
            let args: BriqArgs = parse(name, arguments)?;
            Ok(answer::structured(&shared.entry(&args.briq)?.snapshot())?)
        }
        tools::STOP => {
            let args: BriqArgs = parse(name, arguments)?;
            let stopped = shared
                .kill_processes(&args.briq, SandboxState::Stopped)
                .await?;
            Ok(answer::structured(&stopped)?)
        }
        tools::START => {
            let args: BriqArgs = parse(name, arguments)?;
            Ok(answer::structured(&shared.start(&args.briq)?)?)
        }
        tools::DESTROY => {
            if !arguments.contains_key("briq") {
                return Err(Refusal::Params(format!("{name}: pass `briq`")));
            }
            let args: BriqArgs = parse(name, arguments)?;
            shared.destroy(&args.briq).await?;
            Ok(answer::structured(&Destroyed {
                briq: args.briq,
                state: SandboxState::Destroyed,
            })?)
        }
        tools::EXEC if arguments.get("async") == Some(&Value::Bool(true)) => {
            let args: AsyncExecArgs = parse(name, arguments)?;
            let ExecArgs {
                briq,
                cmd,
                env,
                stdin,
            } = args.exec;
            let exec = sandbox_io::exec_async(&shared, &briq, cmd, &env, stdin).await?;
            Ok(answer::structured(&ExecStarted { exec })?)
        }
        tools::EXEC => {
            arguments.remove("async");
            let args: ExecArgs = parse(name, arguments)?;
            Ok(answer::structured(&exec(&shared, args).await?)?)
        }
        tools::EXEC_RESULT => {
            let args: ExecResultArgs = parse(name, arguments)?;
            Ok(answer::structured(&shared.execs.result(args).await?)?)
        }
        tools::EXEC_STOP => {
            let args: ExecStopArgs = parse(name, arguments)?;
            Ok(answer::structured(&shared.execs.stop(args).await?)?)
        }
        tools::FILES_PUT => {
            let args: FilesPutArgs = parse(name, arguments)?;
            let content = args
                .content()
                .map_err(|e| ApiError::invalid(format!("contentBase64: {e}")))?;
            let written = sandbox_io::write_file(&shared, &args.briq, &args.path, &content).await?;
            Ok(answer::structured(&FilesPutAnswer {
                path: args.path,
                size: written.size,
                sha256: written.sha256,
            })?)
        }
        tools::FILES_GET => {
            let args: FilesGetArgs = parse(name, arguments)?;
            let content = sandbox_io::read_file(&shared, &args.briq, &args.path).await?;
            match answer::image_type(&content) {
                Some(mime_type) => Ok(answer::image(&content, mime_type)),
                None => Ok(answer::structured(&FilesGetAnswer::new(
                    &args.path, &content,
                ))?),
            }
        }
        _ => Err(Refusal::Params(format!("unknown tool {name}"))),
    }
}

fn parse<T: DeserializeOwned>(tool: &str, arguments: Map<String, Value>) -> Result<T, Refusal> {
    serde_json::from_value(Value::Object(arguments))
        .map_err(|e| Refusal::Params(format!("{tool}: {e}")))
}

/// What this server fills in for the `briq_run` arguments it declares optional: the name from
/// the image (`python:3.12-slim` → `python`), briq.cloud's sleep, and `wait` as published.
fn fill_run_defaults(arguments: &mut Map<String, Value>) {
    let image = arguments
        .get("image")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = image
        .rsplit('/')
        .next()
        .and_then(|last| last.split([':', '@']).next())
        .filter(|name| !name.is_empty())
        .unwrap_or("briq")
        .to_owned();
    arguments.entry("name").or_insert(Value::String(name));
    arguments
        .entry("sleep")
        .or_insert(Value::String(DEFAULT_SLEEP.to_owned()));
    arguments.entry("wait").or_insert(Value::Bool(true));
}

/// Runs `briq_exec`'s command. On a real sandbox it runs as given, in the sandbox's `/`, told
/// where that is so the prelude's `cd` lands inside it. A simulated sandbox answers the bridge
/// command inside the prelude, so the prelude's directory and limit are taken out of it; at the
/// prelude's limit it answers the exit status `timeout` would. At the server's own limit (60 s,
/// as briq's) the command was killed: no exit code.
async fn exec(shared: &Arc<Shared>, args: ExecArgs) -> Result<ExecAnswer, ApiError> {
    let unwrapped = shared
        .simulator
        .as_ref()
        .and_then(|_| Unwrapped::of(&args.cmd));
    // A limit of 0 means none to `timeout`; past 60 s the server's own limit comes first.
    let (argv, cwd, timeout, prelude_limit) = match unwrapped {
        Some(u) if !u.timeout.is_zero() && u.timeout <= MAX_EXEC_TIMEOUT => {
            (u.argv.to_vec(), u.cwd.to_owned(), u.timeout, true)
        }
        Some(u) => (u.argv.to_vec(), u.cwd.to_owned(), MAX_EXEC_TIMEOUT, false),
        None => (args.cmd.clone(), "/".to_owned(), MAX_EXEC_TIMEOUT, false),
    };
    let command = Command {
        argv,
        cwd,
        env: args.env,
        stdin: args.stdin,
        timeout,
        tell_root: shared.simulator.is_none(),
    };
    let output = sandbox_io::exec(shared, &args.briq, command).await?;
    let exit_code = match output.timed_out {
        true => prelude_limit.then_some(TIMED_OUT_STATUS),
        false => output.exit_code,
    };
    Ok(ExecAnswer {
        exit_code,
        stdout: output.stdout,
        stderr: output.stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_run_without_name_sleep_or_wait_gets_them() {
        for (image, name) in [
            ("python:3.12-slim", "python"),
            ("ghcr.io/org/tool@sha256:ab", "tool"),
            ("pgvector/pgvector:pg16", "pgvector"),
            (":", "briq"),
        ] {
            let mut arguments = json!({"image": image}).as_object().unwrap().clone();
            fill_run_defaults(&mut arguments);
            let args: RunArgs = parse(tools::RUN, arguments).unwrap();
            assert_eq!(args.create.name, name, "{image}");
            assert_eq!(args.create.sleep, "1h");
            assert!(args.wait);
        }
        let mut given = json!({"image": "python", "name": "n", "sleep": "30m", "wait": false})
            .as_object()
            .unwrap()
            .clone();
        fill_run_defaults(&mut given);
        let args: RunArgs = parse(tools::RUN, given).unwrap();
        assert_eq!(
            (
                args.create.name.as_str(),
                args.create.sleep.as_str(),
                args.wait
            ),
            ("n", "30m", false)
        );
    }
}
