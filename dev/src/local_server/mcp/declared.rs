//! The tools this server declares in `tools/list`, as data: briq's published names, titles,
//! annotations, parameters and required flags (`shared/reference/briq-mcp-tools.md`, section 5;
//! transcribed in `tests/fixtures/briq-mcp-published.json`), restricted to the tools this server
//! implements. `briq_run`'s schema is not published: it declares what this server accepts.
//!
//! Calls are checked against the same declaration (unknown, missing or mistyped arguments are
//! refused), and the admin API may change it ([`DeclaredChange`]) to play a server that lacks a
//! tool or a parameter, or asks for one more.

use std::borrow::Cow;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use briq_operator::briq::api::{
    DEFAULT_READ_BYTES, DEFAULT_WAIT_MS, MAX_OFFSET, MAX_READ_BYTES, MAX_WAIT_MS, tools,
};

/// A parameter's JSON type: declared in the schema, and checked before a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    String,
    Boolean,
    /// An array of strings (an argv).
    Strings,
    /// An object of string values (an environment).
    StringMap,
    /// A whole number within bounds.
    Integer {
        minimum: u64,
        maximum: u64,
    },
}

impl Kind {
    fn schema(self) -> Value {
        match self {
            Self::String => json!({"type": "string"}),
            Self::Boolean => json!({"type": "boolean"}),
            Self::Strings => json!({"type": "array", "items": {"type": "string"}}),
            Self::StringMap => {
                json!({"type": "object", "additionalProperties": {"type": "string"}})
            }
            Self::Integer { minimum, maximum } => {
                json!({"type": "integer", "minimum": minimum, "maximum": maximum})
            }
        }
    }

    fn admits(self, value: &Value) -> bool {
        match self {
            Self::String => value.is_string(),
            Self::Boolean => value.is_boolean(),
            Self::Strings => value
                .as_array()
                .is_some_and(|items| items.iter().all(Value::is_string)),
            Self::StringMap => value
                .as_object()
                .is_some_and(|map| map.values().all(Value::is_string)),
            Self::Integer { minimum, maximum } => value
                .as_u64()
                .is_some_and(|n| (minimum..=maximum).contains(&n)),
        }
    }

    fn described(self) -> &'static str {
        match self {
            Self::String => "a string",
            Self::Boolean => "a boolean",
            Self::Strings => "an array of strings",
            Self::StringMap => "an object of strings",
            Self::Integer { .. } => "a whole number within its bounds",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parameter {
    pub(crate) name: Cow<'static, str>,
    pub(crate) kind: Kind,
    pub(crate) required: bool,
    pub(crate) description: Cow<'static, str>,
    /// The default briq publishes, if any.
    pub(crate) default: Option<DefaultValue>,
    /// Declared as published, but not implemented here: a call that uses it (anything but
    /// `null` or `false`) is refused with a tool error.
    pub(crate) supported: bool,
}

/// A parameter's published default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DefaultValue {
    Boolean(bool),
    Integer(u64),
    String(&'static str),
}

impl DefaultValue {
    fn value(self) -> Value {
        match self {
            Self::Boolean(b) => json!(b),
            Self::Integer(n) => json!(n),
            Self::String(s) => json!(s),
        }
    }
}

/// The hints of a tool's `annotations`; `None` where briq publishes none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Annotations {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) read_only_hint: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) destructive_hint: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) idempotent_hint: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) open_world_hint: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tool {
    pub(crate) name: &'static str,
    pub(crate) title: &'static str,
    pub(crate) description: &'static str,
    pub(crate) annotations: Annotations,
    pub(crate) parameters: Cow<'static, [Parameter]>,
}

impl Parameter {
    /// An optional, supported parameter without a default.
    const fn new(name: &'static str, kind: Kind, description: &'static str) -> Self {
        Self {
            name: Cow::Borrowed(name),
            kind,
            required: false,
            description: Cow::Borrowed(description),
            default: None,
            supported: true,
        }
    }

    const fn required(mut self) -> Self {
        self.required = true;
        self
    }

    /// Published, but not implemented here.
    const fn unsupported(mut self) -> Self {
        self.supported = false;
        self
    }

    const fn default(mut self, value: DefaultValue) -> Self {
        self.default = Some(value);
        self
    }
}

const fn hints(
    read_only: Option<bool>,
    destructive: Option<bool>,
    idempotent: Option<bool>,
    open_world: Option<bool>,
) -> Annotations {
    Annotations {
        read_only_hint: read_only,
        destructive_hint: destructive,
        idempotent_hint: idempotent,
        open_world_hint: open_world,
    }
}

const BRIQ_ID: &str = "briq id (bq_...)";

/// Every tool this server implements, in the reference's order.
pub(crate) const DECLARED: &[Tool] = &[
    Tool {
        name: tools::RUN,
        title: "Run a briq",
        description: "Starts a sandbox for this agent (on the local server: a directory of this \
                      host, its commands host processes) and answers once it runs, unless \
                      `wait` is false. It sleeps after `sleep` without use; only briq_destroy \
                      removes it.",
        annotations: hints(None, None, None, None),
        parameters: Cow::Borrowed(&[
            Parameter::new(
                "image",
                Kind::String,
                "Any public OCI image (recorded; the local server runs commands on the host)",
            )
            .required(),
            Parameter::new("name", Kind::String, "Name of the briq"),
            Parameter::new("size", Kind::String, "Size of the briq"),
            Parameter::new(
                "sleep",
                Kind::String,
                "Sleep after this long without use (1 h by default on briq.cloud); string like \
                 \"30m\", \"3h\", \"7d\", \"never\"",
            ),
            Parameter::new(
                "env",
                Kind::StringMap,
                "Environment of the briq's commands: { NAME: value }",
            ),
            Parameter::new(
                "wait",
                Kind::Boolean,
                "Block until the service is ready (up to two minutes); pass false to return at \
                 once",
            )
            .default(DefaultValue::Boolean(true)),
        ]),
    },
    Tool {
        name: tools::LIST,
        title: "List briqs",
        description: "Lists the briqs of this key with their state. Destroyed briqs are hidden \
                      unless you pass `all`.",
        annotations: hints(Some(true), Some(false), Some(true), Some(false)),
        parameters: Cow::Borrowed(&[
            Parameter::new("all", Kind::Boolean, "Also include destroyed briqs"),
            Parameter::new(
                "stack",
                Kind::String,
                "Only the briqs of this stack (not supported by the local server)",
            )
            .unsupported(),
        ]),
    },
    Tool {
        name: tools::STATUS,
        title: "Status of a briq",
        description: "The state of one briq.",
        annotations: hints(Some(true), Some(false), Some(true), None),
        parameters: Cow::Borrowed(&[Parameter::new(
            "briq",
            Kind::String,
            "The briq whose state to report",
        )
        .required()]),
    },
    Tool {
        name: tools::EXEC,
        title: "Run a command in a briq",
        description: "Executes a command inside a running briq and returns stdout, stderr and \
                      the exit code, for up to 60 s (the last 64 KB of each stream). A sleeping \
                      briq is woken first; on a stopped briq, the error says why.",
        annotations: hints(None, Some(true), None, None),
        parameters: Cow::Borrowed(&[
            Parameter::new(
                "cmd",
                Kind::Strings,
                "argv run without a shell, e.g. [\"psql\",\"-c\",\"select 1\"]; use \
                 [\"sh\",\"-c\",...] for pipes/globs/$VARS",
            )
            .required(),
            Parameter::new(
                "env",
                Kind::StringMap,
                "Variables for this command only, over the briq's own ({ NAME: value }); kept \
                 out of status and audit log",
            ),
            Parameter::new("briq", Kind::String, BRIQ_ID).required(),
            Parameter::new(
                "async",
                Kind::Boolean,
                "Start and answer at once with an exec id, for a command that can take over a \
                 minute; read it with briq_exec_result",
            ),
            Parameter::new(
                "stdin",
                Kind::String,
                "Text fed to the command's standard input",
            ),
            Parameter::new(
                "clearEnv",
                Kind::Boolean,
                "Start from an empty environment: only the briq's PATH, HOME, LANG, then env (not \
                 supported by the local server)",
            )
            .unsupported(),
        ]),
    },
    Tool {
        name: tools::EXEC_RESULT,
        title: "Read a command started with async",
        description: "Reports where a command started with briq_exec async stands (running, \
                      exited with its exit code, timed_out, stopped or lost) with the last 64 KB \
                      of its stdout and stderr, waiting up to waitMs for it to finish. The whole \
                      output is kept in the briq, at the paths the answer names. With offset, \
                      reads the stream from that byte and answers the offset to pass next; the \
                      wait then ends as soon as there is new output.",
        annotations: hints(Some(true), None, Some(true), None),
        parameters: Cow::Borrowed(&[
            Parameter::new("briq", Kind::String, BRIQ_ID).required(),
            Parameter::new(
                "exec",
                Kind::String,
                "exec id (ex_...) returned by briq_exec",
            )
            .required(),
            Parameter::new(
                "offset",
                Kind::Integer {
                    minimum: 0,
                    maximum: MAX_OFFSET,
                },
                "Read from this byte of the stream instead of its tail: 0 first, then the next \
                 offset each answer gives",
            ),
            Parameter::new(
                "stream",
                Kind::String,
                "Which stream offset reads: stdout or stderr",
            )
            .default(DefaultValue::String("stdout")),
            Parameter::new(
                "waitMs",
                Kind::Integer {
                    minimum: 0,
                    maximum: MAX_WAIT_MS,
                },
                "How long to wait for the command to finish, or with offset for new output; 45 s \
                 at most",
            )
            .default(DefaultValue::Integer(DEFAULT_WAIT_MS)),
            Parameter::new(
                "maxBytes",
                Kind::Integer {
                    minimum: 1,
                    maximum: MAX_READ_BYTES,
                },
                "With offset: the most bytes to read in one call",
            )
            .default(DefaultValue::Integer(DEFAULT_READ_BYTES)),
        ]),
    },
    Tool {
        name: tools::EXEC_STOP,
        title: "Stop a command started with async",
        description: "Stops a command started with briq_exec async, and every process it \
                      started. A command that has already finished is answered as it is. Its \
                      output stays in the briq.",
        annotations: hints(None, Some(true), Some(true), None),
        parameters: Cow::Borrowed(&[
            Parameter::new("briq", Kind::String, BRIQ_ID).required(),
            Parameter::new(
                "exec",
                Kind::String,
                "exec id (ex_...) of the command to stop",
            )
            .required(),
        ]),
    },
    Tool {
        name: tools::FILES_PUT,
        title: "Write a file into a briq",
        description: "Uploads a file (base64, max 1 MB) into a running briq, creating parent \
                      directories. The answer gives the SHA-256 of the bytes written.",
        annotations: hints(None, Some(true), Some(true), None),
        parameters: Cow::Borrowed(&[
            Parameter::new("briq", Kind::String, BRIQ_ID).required(),
            Parameter::new(
                "path",
                Kind::String,
                "Absolute path inside the briq's own filesystem",
            )
            .required(),
            Parameter::new(
                "contentBase64",
                Kind::String,
                "File content as base64 (max 1 MB); truncated base64 is refused",
            )
            .required(),
        ]),
    },
    Tool {
        name: tools::FILES_GET,
        title: "Read a file from a briq",
        description: "Downloads a file as base64 (max 1 MB) from the briq's own filesystem. A \
                      PNG, JPEG, GIF or WebP comes back as an image content item.",
        annotations: hints(Some(true), Some(false), Some(true), Some(false)),
        parameters: Cow::Borrowed(&[
            Parameter::new("briq", Kind::String, BRIQ_ID).required(),
            Parameter::new(
                "path",
                Kind::String,
                "Path in the briq's own filesystem (file max 1 MB)",
            )
            .required(),
        ]),
    },
    Tool {
        name: tools::STOP,
        title: "Stop a briq",
        description: "Stops a briq. Its disk is kept, and it stays stopped until briq_start.",
        annotations: hints(None, None, Some(true), None),
        parameters: Cow::Borrowed(&[
            Parameter::new("briq", Kind::String, "The briq to stop").required()
        ]),
    },
    Tool {
        name: tools::START,
        title: "Start a briq",
        description: "Starts a stopped briq; a sleeping briq does not need it.",
        annotations: hints(None, Some(false), Some(true), None),
        parameters: Cow::Borrowed(&[Parameter::new(
            "briq",
            Kind::String,
            "The stopped briq to start",
        )
        .required()]),
    },
    Tool {
        name: tools::DESTROY,
        title: "Destroy a briq",
        description: "Destroys a briq and frees its disk. Pass `briq` (or, on briq, `stack`).",
        annotations: hints(None, Some(true), Some(true), None),
        parameters: Cow::Borrowed(&[
            Parameter::new(
                "briq",
                Kind::String,
                "The briq to destroy; pass this or stack",
            ),
            Parameter::new(
                "stack",
                Kind::String,
                "Instead of briq: destroy every briq of this stack (not supported by the local \
                 server)",
            )
            .unsupported(),
        ]),
    },
    Tool {
        name: tools::FORK,
        title: "Fork a briq or a whole stack",
        description: "Forks one briq: the fork keeps its source's config, credentials and boot \
                      files, gets its own address, and its processes start fresh. Its disk is \
                      copied only from a volume: what a briq without one wrote to its own disk \
                      stays with the source (the local server's sandboxes have none).",
        annotations: hints(None, None, None, None),
        parameters: Cow::Borrowed(&[
            Parameter::new("briq", Kind::String, BRIQ_ID),
            Parameter::new(
                "into",
                Kind::String,
                "Stack fork only: name of the new stack (not supported by the local server)",
            )
            .unsupported()
            .default(DefaultValue::String("<stack>-fork")),
            Parameter::new("name", Kind::String, "Single fork only: name of the fork")
                .default(DefaultValue::String("<name>-fork")),
            Parameter::new("wait", Kind::Boolean, "Wait until the forks are ready")
                .default(DefaultValue::Boolean(true)),
            Parameter::new(
                "sleep",
                Kind::String,
                "Sleep window, as briq_set_sleep takes it; the source's when left out",
            ),
            Parameter::new(
                "stack",
                Kind::String,
                "Instead of briq: fork every briq of this stack into a new stack (not supported \
                 by the local server)",
            )
            .unsupported(),
        ]),
    },
];

/// Why a call's arguments do not fit the tool's declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Misfit {
    /// Refused before the tool runs (JSON-RPC invalid params); names the parameter.
    Invalid(String),
    /// A published parameter this server does not implement.
    Unsupported(String),
}

impl Tool {
    fn parameter(&self, name: &str) -> Option<&Parameter> {
        self.parameters.iter().find(|p| p.name == name)
    }

    /// Checks `arguments` against the declaration; a `null` argument counts as left out.
    pub(crate) fn check(&self, arguments: &Map<String, Value>) -> Result<(), Misfit> {
        for (name, value) in arguments {
            let Some(parameter) = self.parameter(name) else {
                let declared: Vec<&str> = self.parameters.iter().map(|p| &*p.name).collect();
                return Err(Misfit::Invalid(format!(
                    "{}: unknown parameter `{name}` (it declares {})",
                    self.name,
                    declared.join(", ")
                )));
            };
            if !value.is_null() && !parameter.kind.admits(value) {
                return Err(Misfit::Invalid(format!(
                    "{}: parameter `{name}` must be {}",
                    self.name,
                    parameter.kind.described()
                )));
            }
        }
        let given = |name: &str| arguments.get(name).filter(|v| !v.is_null());
        if let Some(missing) = self
            .parameters
            .iter()
            .find(|p| p.required && given(&p.name).is_none())
        {
            return Err(Misfit::Invalid(format!(
                "{}: missing required parameter `{}`",
                self.name, missing.name
            )));
        }
        if let Some(used) = self
            .parameters
            .iter()
            .find(|p| !p.supported && given(&p.name).is_some_and(|v| *v != Value::Bool(false)))
        {
            return Err(Misfit::Unsupported(format!(
                "{}: parameter `{}` is not supported by the local server",
                self.name, used.name
            )));
        }
        Ok(())
    }

    /// The tool as `tools/list` lists it.
    pub(crate) fn listed(&self) -> Value {
        let properties: Map<String, Value> = self
            .parameters
            .iter()
            .map(|p| {
                let mut schema = p.kind.schema();
                schema["description"] = json!(p.description);
                if let Some(default) = p.default {
                    schema["default"] = default.value();
                }
                (p.name.to_string(), schema)
            })
            .collect();
        let required: Vec<&str> = self
            .parameters
            .iter()
            .filter(|p| p.required)
            .map(|p| &*p.name)
            .collect();
        json!({
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "inputSchema": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false,
            },
            "annotations": self.annotations,
        })
    }
}

/// Body of `POST /_admin/declared`: one change to what `tools/list` declares (and what calls
/// are checked against), until `DELETE /_admin/declared`. On the wire:
/// `{"drop_tool": "briq_exec"}`, `{"drop_parameter": {"tool", "parameter"}}`,
/// `{"require_parameter": {"tool", "parameter"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "ChangeOnTheWire", from = "ChangeOnTheWire")]
pub enum DeclaredChange {
    /// The tool is no longer declared (a call to it is an unknown tool).
    DropTool { tool: String },
    /// The tool no longer declares the parameter (a call using it is refused).
    DropParameter { tool: String, parameter: String },
    /// The tool requires the parameter, declaring it (as a string) if it did not.
    RequireParameter { tool: String, parameter: String },
}

/// [`DeclaredChange`] as it travels: a dropped tool is named by a bare string.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ChangeOnTheWire {
    DropTool(String),
    DropParameter { tool: String, parameter: String },
    RequireParameter { tool: String, parameter: String },
}

impl From<DeclaredChange> for ChangeOnTheWire {
    fn from(change: DeclaredChange) -> Self {
        match change {
            DeclaredChange::DropTool { tool } => Self::DropTool(tool),
            DeclaredChange::DropParameter { tool, parameter } => {
                Self::DropParameter { tool, parameter }
            }
            DeclaredChange::RequireParameter { tool, parameter } => {
                Self::RequireParameter { tool, parameter }
            }
        }
    }
}

impl From<ChangeOnTheWire> for DeclaredChange {
    fn from(change: ChangeOnTheWire) -> Self {
        match change {
            ChangeOnTheWire::DropTool(tool) => Self::DropTool { tool },
            ChangeOnTheWire::DropParameter { tool, parameter } => {
                Self::DropParameter { tool, parameter }
            }
            ChangeOnTheWire::RequireParameter { tool, parameter } => {
                Self::RequireParameter { tool, parameter }
            }
        }
    }
}

/// What the server declares now: [`DECLARED`] with the admin API's changes.
#[derive(Debug, Default)]
pub(crate) struct Declared {
    changes: Mutex<Vec<DeclaredChange>>,
}

impl Declared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<DeclaredChange>> {
        self.changes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn tools(&self) -> Vec<Tool> {
        let mut tools = DECLARED.to_vec();
        for change in self.lock().iter() {
            // Each was applied once before it was kept, so it applies again.
            let _ = apply(&mut tools, change);
        }
        tools
    }

    pub(crate) fn tool(&self, name: &str) -> Option<Tool> {
        self.tools().into_iter().find(|tool| tool.name == name)
    }

    /// Keeps `change`, unless it names a tool or parameter not declared now.
    pub(crate) fn change(&self, change: DeclaredChange) -> Result<(), String> {
        let mut changes = self.lock();
        let mut tools = DECLARED.to_vec();
        for earlier in changes.iter() {
            let _ = apply(&mut tools, earlier);
        }
        apply(&mut tools, &change)?;
        changes.push(change);
        Ok(())
    }

    /// Back to [`DECLARED`].
    pub(crate) fn restore(&self) {
        self.lock().clear();
    }
}

fn apply(tools: &mut Vec<Tool>, change: &DeclaredChange) -> Result<(), String> {
    let (name, parameter) = match change {
        DeclaredChange::DropTool { tool: name } => {
            let before = tools.len();
            tools.retain(|tool| tool.name != name);
            return if tools.len() < before {
                Ok(())
            } else {
                Err(format!("no tool {name} is declared"))
            };
        }
        DeclaredChange::DropParameter { tool, parameter }
        | DeclaredChange::RequireParameter { tool, parameter } => (tool, parameter),
    };
    let tool = tools
        .iter_mut()
        .find(|t| t.name == name)
        .ok_or_else(|| format!("no tool {name} is declared"))?;
    let parameters = tool.parameters.to_mut();
    let at = parameters.iter().position(|p| p.name == *parameter);
    match (change, at) {
        (DeclaredChange::DropParameter { .. }, Some(at)) => {
            parameters.remove(at);
        }
        (DeclaredChange::RequireParameter { .. }, Some(at)) => parameters[at].required = true,
        (DeclaredChange::RequireParameter { .. }, None) => parameters.push(Parameter {
            name: Cow::Owned(parameter.clone()),
            ..Parameter::new(
                "",
                Kind::String,
                "Required by this server (the admin API asked for it)",
            )
            .required()
        }),
        _ => return Err(format!("{name} declares no parameter {parameter}")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arguments(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn every_tool_the_server_calls_is_declared_with_what_the_client_sends() {
        for (name, sent) in briq_operator::briq::api::SENT {
            let tool = DECLARED.iter().find(|t| t.name == *name).unwrap();
            for argument in *sent {
                let parameter = tool.parameter(argument).unwrap();
                assert!(parameter.supported, "{name}.{argument}");
            }
        }
        // The operator now calls every tool the server declares.
        let beyond: Vec<&str> = DECLARED
            .iter()
            .map(|t| t.name)
            .filter(|name| {
                !briq_operator::briq::api::SENT
                    .iter()
                    .any(|(s, _)| s == name)
            })
            .collect();
        assert_eq!(beyond, Vec::<&str>::new());
    }

    #[test]
    fn arguments_are_checked_against_the_declaration() {
        let exec = DECLARED.iter().find(|t| t.name == tools::EXEC).unwrap();
        let fits = |value| exec.check(&arguments(value));
        assert_eq!(
            fits(json!({"briq": "bq_1", "cmd": ["true"], "env": {"A": "1"}, "async": false})),
            Ok(())
        );
        for (value, named) in [
            (
                json!({"briq": "bq_1", "cmd": ["true"], "cwd": "/"}),
                "`cwd`",
            ),
            (json!({"briq": "bq_1"}), "`cmd`"),
            (json!({"briq": "bq_1", "cmd": null}), "`cmd`"),
            (json!({"briq": "bq_1", "cmd": "true"}), "`cmd`"),
            (
                json!({"briq": "bq_1", "cmd": ["a"], "env": {"A": 1}}),
                "`env`",
            ),
        ] {
            match fits(value.clone()) {
                Err(Misfit::Invalid(message)) => assert!(message.contains(named), "{message}"),
                other => panic!("{value}: {other:?}"),
            }
        }
        assert!(matches!(
            fits(json!({"briq": "bq_1", "cmd": ["true"], "clearEnv": true})),
            Err(Misfit::Unsupported(m)) if m.contains("`clearEnv`")
        ));
    }

    #[test]
    fn the_admin_api_changes_what_is_declared_until_restored() {
        let declared = Declared::default();
        let change = |tool: &str, parameter: &str, require: bool| {
            let (tool, parameter) = (tool.to_owned(), parameter.to_owned());
            if require {
                DeclaredChange::RequireParameter { tool, parameter }
            } else {
                DeclaredChange::DropParameter { tool, parameter }
            }
        };
        declared
            .change(change(tools::EXEC, "stdin", false))
            .unwrap();
        declared.change(change(tools::EXEC, "cwd", true)).unwrap();
        declared
            .change(DeclaredChange::DropTool {
                tool: tools::STOP.to_owned(),
            })
            .unwrap();
        assert!(
            declared
                .change(change(tools::EXEC, "stdin", false))
                .is_err()
        );
        assert!(
            declared
                .change(DeclaredChange::DropTool {
                    tool: tools::STOP.to_owned(),
                })
                .is_err()
        );
        assert!(declared.tool(tools::STOP).is_none());
        let exec = declared.tool(tools::EXEC).unwrap();
        assert!(exec.parameter("stdin").is_none());
        assert!(exec.parameter("cwd").unwrap().required);
        assert_eq!(
            exec.listed()["inputSchema"]["required"],
            json!(["cmd", "briq", "cwd"])
        );
        declared.restore();
        assert_eq!(declared.tools(), DECLARED);
    }

    #[test]
    fn wire_shape_of_changes() {
        for (change, json) in [
            (
                DeclaredChange::DropTool {
                    tool: "briq_exec".into(),
                },
                json!({"drop_tool": "briq_exec"}),
            ),
            (
                DeclaredChange::DropParameter {
                    tool: "briq_exec".into(),
                    parameter: "stdin".into(),
                },
                json!({"drop_parameter": {"tool": "briq_exec", "parameter": "stdin"}}),
            ),
            (
                DeclaredChange::RequireParameter {
                    tool: "briq_exec".into(),
                    parameter: "cwd".into(),
                },
                json!({"require_parameter": {"tool": "briq_exec", "parameter": "cwd"}}),
            ),
        ] {
            assert_eq!(serde_json::to_value(&change).unwrap(), json);
            assert_eq!(
                serde_json::from_value::<DeclaredChange>(json).unwrap(),
                change
            );
        }
    }
}
