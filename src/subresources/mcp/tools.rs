//! The MCP tools, as data: their names, input and output schemas and descriptions (what an LLM
//! reads to act); a call's arguments checked into a [`Call`]; and the rights a call needs, each
//! asked of the API server as a SubjectAccessReview for the caller before the call does
//! anything (the operator acts only where the caller could act itself).

use base64::{Engine as _, engine::general_purpose::STANDARD as BASE64};
use serde_json::{Map, Value, json};

use crate::crd::{MAX_CODE_CHARS, MAX_EXECUTION_TIMEOUT_SECONDS};

/// The largest file `read_file` returns or `write_file` takes (larger files move through the
/// files subresource, `kubectl briq cp`, up to 64 MiB).
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// The most forks one `fork_executor` makes.
pub const MAX_FORKS: u32 = 10;
/// The longest `request_id`.
pub const MAX_REQUEST_ID_CHARS: usize = 128;

const CORE: &str = "briq.cloud";
const SUBRESOURCES: &str = super::super::discovery::GROUP;

/// A checked tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    CreateExecutor {
        name: Option<String>,
        pool: Option<String>,
        class: Option<String>,
    },
    ListExecutors,
    RunPython {
        executor: String,
        code: String,
        timeout_seconds: Option<u32>,
        request_id: Option<String>,
    },
    ReadFile {
        executor: String,
        path: String,
        encoding: Encoding,
    },
    WriteFile {
        executor: String,
        path: String,
        content: Vec<u8>,
    },
    CancelExecutor {
        executor: String,
    },
    CancelExecution {
        execution: String,
    },
    ForkExecutor {
        executor: String,
        count: u32,
    },
    DeleteExecutor {
        executor: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Text,
    Base64,
}

/// A right the caller must hold in the endpoint's namespace, as RBAC names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Right {
    pub group: &'static str,
    pub verb: &'static str,
    pub resource: &'static str,
    pub subresource: &'static str,
    /// Empty for a right on the namespace's collection (`create`, `list`).
    pub name: String,
}

fn right(verb: &'static str, resource: &'static str, name: &str) -> Right {
    Right {
        group: CORE,
        verb,
        resource,
        subresource: "",
        name: name.to_owned(),
    }
}

fn files_right(verb: &'static str, executor: &str) -> Right {
    Right {
        group: SUBRESOURCES,
        verb,
        resource: "briqexecutors",
        subresource: "files",
        name: executor.to_owned(),
    }
}

/// Why a call was not made: an unknown tool is a protocol error, bad arguments a tool error
/// the model can correct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    UnknownTool(String),
    Arguments(String),
}

impl Call {
    /// The call `name` with `arguments`, checked against the tool's schema and limits.
    pub fn parse(name: &str, arguments: &Value) -> Result<Call, Refused> {
        let empty = Map::new();
        let arguments = match arguments {
            Value::Object(object) => object,
            Value::Null => &empty,
            _ => return Err(Refused::Arguments("arguments must be an object".into())),
        };
        let Some(tool) = definitions()
            .into_iter()
            .find(|t| t["name"] == name)
            .map(|t| t["inputSchema"].clone())
        else {
            return Err(Refused::UnknownTool(name.to_owned()));
        };
        let known = tool["properties"].as_object().cloned().unwrap_or_default();
        if let Some(extra) = arguments.keys().find(|k| !known.contains_key(*k)) {
            return Err(Refused::Arguments(format!(
                "{name} takes no argument {extra:?}; it takes {}",
                known.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        let args = Args(arguments);
        let call = match name {
            "create_executor" => Call::CreateExecutor {
                name: args.name("name")?,
                pool: args.name("pool")?,
                class: args.name("class")?,
            },
            "list_executors" => Call::ListExecutors,
            "run_python" => Call::RunPython {
                executor: args.required_name("executor")?,
                code: args.code()?,
                timeout_seconds: args.integer(
                    "timeout_seconds",
                    1,
                    MAX_EXECUTION_TIMEOUT_SECONDS,
                )?,
                request_id: args.request_id()?,
            },
            "read_file" => Call::ReadFile {
                executor: args.required_name("executor")?,
                path: args.path()?,
                encoding: args.encoding()?,
            },
            "write_file" => {
                let content = args.required_string("content")?;
                let content = match args.encoding()? {
                    Encoding::Text => content.into_bytes(),
                    Encoding::Base64 => BASE64.decode(content.trim()).map_err(|error| {
                        Refused::Arguments(format!("content is not base64: {error}"))
                    })?,
                };
                if content.len() as u64 > MAX_FILE_BYTES {
                    return Err(Refused::Arguments(format!(
                        "content is {} bytes, over the {MAX_FILE_BYTES}-byte limit of write_file; \
                         nothing was written (kubectl briq cp moves files up to 64 MiB)",
                        content.len()
                    )));
                }
                Call::WriteFile {
                    executor: args.required_name("executor")?,
                    path: args.path()?,
                    content,
                }
            }
            "cancel" => match (args.name("executor")?, args.name("execution")?) {
                (Some(executor), None) => Call::CancelExecutor { executor },
                (None, Some(execution)) => Call::CancelExecution { execution },
                _ => {
                    return Err(Refused::Arguments(
                        "cancel takes one of executor (its running and queued actions) or \
                         execution (that one)"
                            .into(),
                    ));
                }
            },
            "fork_executor" => Call::ForkExecutor {
                executor: args.required_name("executor")?,
                count: args.integer("count", 1, MAX_FORKS)?.unwrap_or(1),
            },
            "delete_executor" => Call::DeleteExecutor {
                executor: args.required_name("executor")?,
            },
            other => return Err(Refused::UnknownTool(other.to_owned())),
        };
        Ok(call)
    }

    /// Every right the call needs, asked before it does anything.
    pub fn rights(&self) -> Vec<Right> {
        match self {
            Call::CreateExecutor { name, .. } => vec![
                right("create", "briqexecutors", ""),
                right("get", "briqexecutors", name.as_deref().unwrap_or_default()),
            ],
            Call::ListExecutors => vec![right("list", "briqexecutors", "")],
            Call::RunPython { .. } => vec![
                right("create", "executions", ""),
                right("get", "executions", ""),
            ],
            Call::ReadFile { executor, .. } => vec![files_right("get", executor)],
            Call::WriteFile { executor, .. } => vec![files_right("update", executor)],
            Call::CancelExecutor { .. } => vec![
                right("list", "executions", ""),
                right("patch", "executions", ""),
            ],
            Call::CancelExecution { execution } => vec![
                right("get", "executions", execution),
                right("patch", "executions", execution),
            ],
            Call::ForkExecutor { executor, .. } => vec![
                right("create", "briqexecutors", ""),
                right("get", "briqexecutors", executor),
            ],
            Call::DeleteExecutor { executor } => vec![right("delete", "briqexecutors", executor)],
        }
    }
}

struct Args<'a>(&'a Map<String, Value>);

impl Args<'_> {
    fn string(&self, key: &str) -> Result<Option<String>, Refused> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(Refused::Arguments(format!("{key} must be a string"))),
        }
    }

    fn required_string(&self, key: &str) -> Result<String, Refused> {
        self.string(key)?
            .ok_or_else(|| Refused::Arguments(format!("{key} is required")))
    }

    /// An object name (a DNS subdomain, as Kubernetes names objects).
    fn name(&self, key: &str) -> Result<Option<String>, Refused> {
        let Some(name) = self.string(key)? else {
            return Ok(None);
        };
        if !is_object_name(&name) {
            return Err(Refused::Arguments(format!(
                "{key} {name:?} is not a Kubernetes object name (lower-case letters, digits, \
                 '-' and '.', at most 253 characters, starting and ending alphanumeric)"
            )));
        }
        Ok(Some(name))
    }

    fn required_name(&self, key: &str) -> Result<String, Refused> {
        self.name(key)?
            .ok_or_else(|| Refused::Arguments(format!("{key} is required")))
    }

    fn integer(&self, key: &str, min: u32, max: u32) -> Result<Option<u32>, Refused> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value
                .as_u64()
                .filter(|n| (u64::from(min)..=u64::from(max)).contains(n))
                .map(|n| Some(n as u32))
                .ok_or_else(|| {
                    Refused::Arguments(format!("{key} must be an integer from {min} to {max}"))
                }),
        }
    }

    fn code(&self) -> Result<String, Refused> {
        let code = self.required_string("code")?;
        let chars = code.chars().count();
        if chars == 0 || chars > MAX_CODE_CHARS {
            return Err(Refused::Arguments(format!(
                "code is {chars} characters; an action takes 1 to {MAX_CODE_CHARS} (split it, or \
                 write it to a file with write_file and run that); nothing was run"
            )));
        }
        Ok(code)
    }

    fn request_id(&self) -> Result<Option<String>, Refused> {
        let Some(id) = self.string("request_id")? else {
            return Ok(None);
        };
        let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.:".contains(c);
        if id.is_empty() || id.len() > MAX_REQUEST_ID_CHARS || !id.chars().all(allowed) {
            return Err(Refused::Arguments(format!(
                "request_id must be 1 to {MAX_REQUEST_ID_CHARS} characters of letters, digits, \
                 '-', '_', '.' and ':'"
            )));
        }
        Ok(Some(id))
    }

    fn path(&self) -> Result<String, Refused> {
        let path = self.required_string("path")?;
        if !path.starts_with('/') {
            return Err(Refused::Arguments(format!(
                "path {path:?} must be absolute (the kernel's working directory is /work)"
            )));
        }
        Ok(path)
    }

    fn encoding(&self) -> Result<Encoding, Refused> {
        match self.string("encoding")?.as_deref() {
            None | Some("text") => Ok(Encoding::Text),
            Some("base64") => Ok(Encoding::Base64),
            Some(other) => Err(Refused::Arguments(format!(
                "encoding {other:?} is not one of text, base64"
            ))),
        }
    }
}

/// Whether `name` is a DNS subdomain, as Kubernetes object names are.
pub fn is_object_name(name: &str) -> bool {
    let label = |part: &str| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !part.starts_with('-')
            && !part.ends_with('-')
    };
    (1..=253).contains(&name.len()) && name.split('.').all(label)
}

fn name_schema(what: &str) -> Value {
    json!({ "type": "string", "minLength": 1, "maxLength": 253,
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
            "description": what })
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": properties, "required": required,
            "additionalProperties": false })
}

fn executor_state_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": { "type": "string" },
            "ready": { "type": "boolean" },
            "reason": { "type": "string" },
            "message": { "type": "string" },
            "class": { "type": "string" },
            "pool": { "type": "string" },
            "forkedFrom": { "type": "string" },
        },
        "required": ["name", "ready"],
    })
}

/// Every tool, as `tools/list` answers it.
pub fn definitions() -> Vec<Value> {
    let encoding = json!({ "type": "string", "enum": ["text", "base64"], "default": "text",
        "description": "text (UTF-8) or base64 (any bytes)" });
    let executor = name_schema("the BriqExecutor's name (list_executors shows them)");
    vec![
        json!({
            "name": "create_executor",
            "title": "Create a Python executor",
            "description": "Creates a BriqExecutor: a sandbox with its own persistent Python \
                kernel. With pool, it is claimed from that warm pool and ready in about a second; \
                otherwise a sandbox is made (tens of seconds). Answers once it is Ready, or says \
                why it is not yet within 45 s. Then use run_python with its name.",
            "inputSchema": object(json!({
                "name": name_schema("its name; generated (exec-…) when omitted"),
                "pool": name_schema("a BriqExecutorPool to claim a warm executor from"),
                "class": name_schema("the BriqExecutorClass (limits and key) to make it under"),
            }), &[]),
            "outputSchema": executor_state_schema(),
            "annotations": { "destructiveHint": false, "idempotentHint": false, "openWorldHint": false },
        }),
        json!({
            "name": "list_executors",
            "title": "List Python executors",
            "description": "The namespace's BriqExecutors with their state (a warm pool's \
                members are left out: create_executor with pool claims one): Ready ones take \
                run_python; the reason says why another is not (Provisioning, Suspended, …).",
            "inputSchema": object(json!({}), &[]),
            "outputSchema": { "type": "object", "properties": {
                "executors": { "type": "array", "items": executor_state_schema() } },
                "required": ["executors"] },
            "annotations": { "readOnlyHint": true, "openWorldHint": false },
        }),
        json!({
            "name": "run_python",
            "title": "Run Python code",
            "description": "Runs Python code in an executor's kernel as one action (recorded as \
                an Execution). Variables, imports and functions persist between calls on the same \
                executor, as in a notebook. Returns what it printed (logs), the value of its last \
                expression (output) and the exception it raised (error). Prints arrive as log \
                notifications while it runs. Send request_id to make a retry safe: the same id \
                runs once and answers the same result; an action still running after 45 s is \
                answered as running, and asking again with its request_id gives its result.",
            "inputSchema": object(json!({
                "executor": executor,
                "code": { "type": "string", "minLength": 1, "maxLength": MAX_CODE_CHARS,
                    "description": "Python source" },
                "timeout_seconds": { "type": "integer", "minimum": 1,
                    "maximum": MAX_EXECUTION_TIMEOUT_SECONDS,
                    "description": "the action's deadline; past it the kernel is interrupted and \
                        the executor becomes unusable (default: the executor's)" },
                "request_id": { "type": "string", "minLength": 1, "maxLength": MAX_REQUEST_ID_CHARS,
                    "pattern": "^[A-Za-z0-9._:-]+$",
                    "description": "an id of this action of your choosing: the same id runs once" },
            }), &["executor", "code"]),
            "outputSchema": { "type": "object", "properties": {
                "execution": { "type": "string" },
                "request_id": { "type": "string" },
                "finished": { "type": "boolean" },
                "succeeded": { "type": "boolean" },
                "reason": { "type": "string" },
                "logs": { "type": "string" },
                "output": { "type": "string" },
                "final_answer": { "type": "string" },
                "error": { "type": "object", "properties": {
                    "name": { "type": "string" }, "message": { "type": "string" },
                    "traceback": { "type": "string" } } },
                "truncated": { "type": "boolean" },
                "duration_ms": { "type": "integer" },
            }, "required": ["execution", "request_id", "finished"] },
            "annotations": { "destructiveHint": false, "idempotentHint": true, "openWorldHint": true },
        }),
        json!({
            "name": "read_file",
            "title": "Read a file of an executor",
            "description": format!("Reads a file of the executor's sandbox (at most \
                {MAX_FILE_BYTES} bytes), with the kernel user's rights. Text by default; \
                encoding base64 for binary files."),
            "inputSchema": object(json!({
                "executor": executor,
                "path": { "type": "string", "description": "absolute path, e.g. /work/out.csv" },
                "encoding": encoding,
            }), &["executor", "path"]),
            "outputSchema": { "type": "object", "properties": {
                "path": { "type": "string" }, "size": { "type": "integer" },
                "sha256": { "type": "string" }, "encoding": { "type": "string" },
                "content": { "type": "string" } },
                "required": ["path", "size", "encoding", "content"] },
            "annotations": { "readOnlyHint": true, "openWorldHint": false },
        }),
        json!({
            "name": "write_file",
            "title": "Write a file of an executor",
            "description": format!("Writes a file into the executor's sandbox (at most \
                {MAX_FILE_BYTES} bytes), with the kernel user's rights, replacing it whole."),
            "inputSchema": object(json!({
                "executor": executor,
                "path": { "type": "string", "description": "absolute path, e.g. /work/data.csv" },
                "content": { "type": "string" },
                "encoding": encoding,
            }), &["executor", "path", "content"]),
            "outputSchema": { "type": "object", "properties": {
                "path": { "type": "string" }, "size": { "type": "integer" },
                "sha256": { "type": "string" } }, "required": ["path"] },
            "annotations": { "destructiveHint": true, "idempotentHint": true, "openWorldHint": false },
        }),
        json!({
            "name": "cancel",
            "title": "Cancel actions",
            "description": "Cancels the running and queued actions of an executor (executor), or \
                one action (execution, the name run_python answered). A running action is \
                interrupted (KeyboardInterrupt) and the kernel keeps its state.",
            "inputSchema": object(json!({
                "executor": executor,
                "execution": name_schema("an Execution's name"),
            }), &[]),
            "outputSchema": { "type": "object", "properties": {
                "cancelled": { "type": "array", "items": { "type": "string" } } },
                "required": ["cancelled"] },
            "annotations": { "destructiveHint": true, "idempotentHint": true, "openWorldHint": false },
        }),
        json!({
            "name": "fork_executor",
            "title": "Fork an executor",
            "description": format!("Makes count (1 to {MAX_FORKS}) new executors that start with \
                the executor's Python state (variables, imports, files) as it is between two \
                actions; each then goes its own way. Answers their names at once; they are Ready \
                within seconds (list_executors)."),
            "inputSchema": object(json!({
                "executor": executor,
                "count": { "type": "integer", "minimum": 1, "maximum": MAX_FORKS, "default": 1 },
            }), &["executor"]),
            "outputSchema": { "type": "object", "properties": {
                "forks": { "type": "array", "items": { "type": "string" } } },
                "required": ["forks"] },
            "annotations": { "destructiveHint": false, "idempotentHint": false, "openWorldHint": false },
        }),
        json!({
            "name": "delete_executor",
            "title": "Delete an executor",
            "description": "Deletes an executor: its sandbox is destroyed and its Python state \
                lost. Its running action, if any, is cancelled.",
            "inputSchema": object(json!({ "executor": executor }), &["executor"]),
            "outputSchema": { "type": "object", "properties": {
                "deleted": { "type": "string" } }, "required": ["deleted"] },
            "annotations": { "destructiveHint": true, "idempotentHint": true, "openWorldHint": false },
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(name: &str, arguments: Value) -> Result<Call, Refused> {
        Call::parse(name, &arguments)
    }

    fn refused(name: &str, arguments: Value) -> String {
        match parse(name, arguments) {
            Err(Refused::Arguments(why)) => why,
            other => panic!("{name}: expected refused arguments, got {other:?}"),
        }
    }

    #[test]
    fn every_tool_named_in_the_issue_is_listed_with_an_object_schema() {
        let names: Vec<Value> = definitions().iter().map(|t| t["name"].clone()).collect();
        assert_eq!(
            names,
            [
                "create_executor",
                "list_executors",
                "run_python",
                "read_file",
                "write_file",
                "cancel",
                "fork_executor",
                "delete_executor"
            ]
        );
        for tool in definitions() {
            assert_eq!(tool["inputSchema"]["type"], "object", "{}", tool["name"]);
            assert_eq!(tool["outputSchema"]["type"], "object", "{}", tool["name"]);
            assert!(tool["description"].as_str().unwrap().len() > 40);
        }
    }

    #[test]
    fn arguments_become_calls() {
        assert_eq!(
            parse(
                "run_python",
                json!({"executor": "py", "code": "1 + 1", "request_id": "step-1:a"})
            ),
            Ok(Call::RunPython {
                executor: "py".into(),
                code: "1 + 1".into(),
                timeout_seconds: None,
                request_id: Some("step-1:a".into()),
            })
        );
        assert_eq!(
            parse("list_executors", Value::Null),
            Ok(Call::ListExecutors)
        );
        assert_eq!(
            parse(
                "write_file",
                json!({"executor": "py", "path": "/work/b", "content": "AAE=", "encoding": "base64"})
            ),
            Ok(Call::WriteFile {
                executor: "py".into(),
                path: "/work/b".into(),
                content: vec![0, 1]
            })
        );
        assert_eq!(
            parse("cancel", json!({"execution": "py-mcp-1"})),
            Ok(Call::CancelExecution {
                execution: "py-mcp-1".into()
            })
        );
        assert_eq!(
            parse("fork_executor", json!({"executor": "py"})),
            Ok(Call::ForkExecutor {
                executor: "py".into(),
                count: 1
            })
        );
    }

    #[test]
    fn bad_arguments_are_refused_with_what_to_send_instead() {
        assert_eq!(
            parse("rm_rf", json!({})),
            Err(Refused::UnknownTool("rm_rf".into()))
        );
        for (tool, arguments, says) in [
            ("run_python", json!({"code": "1"}), "executor is required"),
            ("run_python", json!({"executor": "py"}), "code is required"),
            (
                "run_python",
                json!({"executor": "Py_1", "code": "1"}),
                "not a Kubernetes object name",
            ),
            (
                "run_python",
                json!({"executor": "py", "code": ""}),
                "1 to 65536",
            ),
            (
                "run_python",
                json!({"executor": "py", "code": "x".repeat(MAX_CODE_CHARS + 1)}),
                "nothing was run",
            ),
            (
                "run_python",
                json!({"executor": "py", "code": "1", "timeout_seconds": 41}),
                "from 1 to 40",
            ),
            (
                "run_python",
                json!({"executor": "py", "code": "1", "timeout_seconds": "5"}),
                "from 1 to 40",
            ),
            (
                "run_python",
                json!({"executor": "py", "code": "1", "request_id": "a b"}),
                "request_id",
            ),
            (
                "run_python",
                json!({"executor": "py", "code": 1}),
                "code must be a string",
            ),
            (
                "run_python",
                json!({"executor": "py", "code": "1", "shell": true}),
                "no argument \"shell\"",
            ),
            (
                "read_file",
                json!({"executor": "py", "path": "out.csv"}),
                "must be absolute",
            ),
            (
                "read_file",
                json!({"executor": "py", "path": "/a", "encoding": "hex"}),
                "not one of",
            ),
            (
                "write_file",
                json!({"executor": "py", "path": "/a", "content": "%%", "encoding": "base64"}),
                "not base64",
            ),
            (
                "write_file",
                json!({"executor": "py", "path": "/a", "content": "x".repeat(MAX_FILE_BYTES as usize + 1)}),
                "over the 1048576-byte limit",
            ),
            ("cancel", json!({}), "one of executor"),
            (
                "cancel",
                json!({"executor": "a", "execution": "b"}),
                "one of executor",
            ),
            (
                "fork_executor",
                json!({"executor": "py", "count": 11}),
                "from 1 to 10",
            ),
            (
                "fork_executor",
                json!({"executor": "py", "count": 0}),
                "from 1 to 10",
            ),
            (
                "create_executor",
                json!({"name": "../x"}),
                "not a Kubernetes object name",
            ),
        ] {
            let why = refused(tool, arguments);
            assert!(why.contains(says), "{tool}: {why:?} should say {says:?}");
        }
        assert_eq!(
            parse("list_executors", json!([1])),
            Err(Refused::Arguments("arguments must be an object".into()))
        );
    }

    #[test]
    fn each_call_asks_the_caller_for_the_right_it_exercises() {
        let rights = |call: Call| -> Vec<(String, &str, String, String)> {
            call.rights()
                .into_iter()
                .map(|r| {
                    let resource = match r.subresource {
                        "" => r.resource.to_owned(),
                        s => format!("{}/{s}", r.resource),
                    };
                    (r.group.to_owned(), r.verb, resource, r.name)
                })
                .collect()
        };
        let core = |verb, resource: &str, name: &str| {
            (
                "briq.cloud".to_owned(),
                verb,
                resource.to_owned(),
                name.to_owned(),
            )
        };
        let files = |verb, name: &str| {
            (
                "subresources.briq.cloud".to_owned(),
                verb,
                "briqexecutors/files".to_owned(),
                name.to_owned(),
            )
        };
        let py = || "py".to_owned();
        for (call, expected) in [
            (
                Call::CreateExecutor {
                    name: Some("a".into()),
                    pool: Some("warm".into()),
                    class: None,
                },
                vec![
                    core("create", "briqexecutors", ""),
                    core("get", "briqexecutors", "a"),
                ],
            ),
            (Call::ListExecutors, vec![core("list", "briqexecutors", "")]),
            (
                Call::RunPython {
                    executor: py(),
                    code: "1".into(),
                    timeout_seconds: None,
                    request_id: None,
                },
                vec![
                    core("create", "executions", ""),
                    core("get", "executions", ""),
                ],
            ),
            (
                Call::ReadFile {
                    executor: py(),
                    path: "/a".into(),
                    encoding: Encoding::Text,
                },
                vec![files("get", "py")],
            ),
            (
                Call::WriteFile {
                    executor: py(),
                    path: "/a".into(),
                    content: vec![],
                },
                vec![files("update", "py")],
            ),
            (
                Call::CancelExecutor { executor: py() },
                vec![
                    core("list", "executions", ""),
                    core("patch", "executions", ""),
                ],
            ),
            (
                Call::CancelExecution {
                    execution: "e".into(),
                },
                vec![
                    core("get", "executions", "e"),
                    core("patch", "executions", "e"),
                ],
            ),
            (
                Call::ForkExecutor {
                    executor: py(),
                    count: 2,
                },
                vec![
                    core("create", "briqexecutors", ""),
                    core("get", "briqexecutors", "py"),
                ],
            ),
            (
                Call::DeleteExecutor { executor: py() },
                vec![core("delete", "briqexecutors", "py")],
            ),
        ] {
            assert_eq!(rights(call.clone()), expected, "{call:?}");
        }
    }

    #[test]
    fn object_names_are_dns_subdomains() {
        for good in ["py", "a.b-c", "x1", &"a".repeat(253)] {
            assert!(is_object_name(good), "{good}");
        }
        for bad in [
            "",
            "Py",
            "-a",
            "a-",
            "a..b",
            "a_b",
            "../x",
            &"a".repeat(254),
        ] {
            assert!(!is_object_name(bad), "{bad}");
        }
    }
}
