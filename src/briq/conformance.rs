//! The live conformance check: every tool and argument the operator sends ([`api::SENT`])
//! against what briq's server declares in `tools/list`, and every argument the server requires
//! against what the operator sends. A mismatch is named (tool and parameter) before any call
//! is made with the key, never learnt from a refusal.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::api;

/// A tool as `tools/list` declares it: its argument names, and which are required.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct DeclaredTool {
    pub name: String,
    #[serde(default, rename = "inputSchema")]
    pub input_schema: InputSchema,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct InputSchema {
    #[serde(default)]
    pub properties: serde_json::Map<String, Value>,
    #[serde(default)]
    pub required: Vec<String>,
}

/// One way the server's interface differs from what the operator sends.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Mismatch {
    /// The operator calls a tool the server does not declare.
    MissingTool { tool: String },
    /// The operator sends an argument the tool does not declare.
    UndeclaredParameter { tool: String, parameter: String },
    /// The tool requires an argument the operator never sends.
    RequiredNotSent { tool: String, parameter: String },
}

impl Mismatch {
    pub fn tool(&self) -> &str {
        match self {
            Self::MissingTool { tool }
            | Self::UndeclaredParameter { tool, .. }
            | Self::RequiredNotSent { tool, .. } => tool,
        }
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingTool { tool } => write!(f, "{tool}: the server declares no such tool"),
            Self::UndeclaredParameter { tool, parameter } => {
                write!(f, "{tool}.{parameter}: sent, but not declared")
            }
            Self::RequiredNotSent { tool, parameter } => {
                write!(f, "{tool}.{parameter}: required by the server, never sent")
            }
        }
    }
}

/// The mismatches between `declared` and what the operator sends (`sent`), in a stable order.
pub fn check(declared: &[DeclaredTool], sent: &[(&str, &[&str])]) -> Vec<Mismatch> {
    let mut mismatches = BTreeSet::new();
    for (tool, parameters) in sent {
        let Some(found) = declared.iter().find(|d| d.name == *tool) else {
            mismatches.insert(Mismatch::MissingTool {
                tool: tool.to_string(),
            });
            continue;
        };
        for parameter in *parameters {
            if !found.input_schema.properties.contains_key(*parameter) {
                mismatches.insert(Mismatch::UndeclaredParameter {
                    tool: tool.to_string(),
                    parameter: parameter.to_string(),
                });
            }
        }
        for required in &found.input_schema.required {
            if !parameters.contains(&required.as_str()) {
                mismatches.insert(Mismatch::RequiredNotSent {
                    tool: tool.to_string(),
                    parameter: required.clone(),
                });
            }
        }
    }
    mismatches.into_iter().collect()
}

/// [`check`] against what this build sends.
pub fn check_sent(declared: &[DeclaredTool]) -> Vec<Mismatch> {
    check(declared, api::SENT)
}

/// The mismatches as one line, for a status message or an error.
pub fn describe(mismatches: &[Mismatch]) -> String {
    mismatches
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tool(name: &str, properties: &[&str], required: &[&str]) -> DeclaredTool {
        serde_json::from_value(json!({
            "name": name,
            "inputSchema": {
                "type": "object",
                "properties": properties.iter().map(|p| (p.to_string(), json!({}))).collect::<serde_json::Map<String, Value>>(),
                "required": required,
            }
        }))
        .unwrap()
    }

    #[test]
    fn each_difference_is_named_by_tool_and_parameter() {
        let sent: &[(&str, &[&str])] = &[
            ("briq_exec", &["briq", "cmd", "stdin"]),
            ("briq_status", &["briq"]),
            ("briq_stop", &["briq"]),
        ];
        let cases: Vec<(Vec<DeclaredTool>, Vec<Mismatch>)> = vec![
            (
                vec![
                    tool(
                        "briq_exec",
                        &["briq", "cmd", "stdin", "async"],
                        &["briq", "cmd"],
                    ),
                    tool("briq_status", &["briq"], &["briq"]),
                    tool("briq_stop", &["briq"], &[]),
                ],
                vec![],
            ),
            (
                vec![
                    tool("briq_exec", &["briq", "cmd"], &["briq", "cmd", "cwd"]),
                    tool("briq_status", &["briq"], &["briq"]),
                ],
                vec![
                    Mismatch::MissingTool {
                        tool: "briq_stop".into(),
                    },
                    Mismatch::UndeclaredParameter {
                        tool: "briq_exec".into(),
                        parameter: "stdin".into(),
                    },
                    Mismatch::RequiredNotSent {
                        tool: "briq_exec".into(),
                        parameter: "cwd".into(),
                    },
                ],
            ),
        ];
        for (declared, expected) in cases {
            let mut expected = expected;
            expected.sort();
            assert_eq!(check(&declared, sent), expected);
        }
    }

    #[test]
    fn a_mismatch_reads_as_tool_and_parameter() {
        let mismatches = [
            Mismatch::MissingTool {
                tool: "briq_exec".into(),
            },
            Mismatch::UndeclaredParameter {
                tool: "briq_exec".into(),
                parameter: "stdin".into(),
            },
        ];
        assert_eq!(
            describe(&mismatches),
            "briq_exec: the server declares no such tool; briq_exec.stdin: sent, but not declared"
        );
    }

    /// briq's tools as published, transcribed from the reference with each field's source.
    fn published() -> Value {
        serde_json::from_str(include_str!("../../tests/fixtures/briq-mcp-published.json")).unwrap()
    }

    /// What the published schemas say, as `tools/list` would: a tool whose schema was not
    /// captured declares the arguments its description names.
    fn published_declared() -> Vec<DeclaredTool> {
        published()["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|tool| {
                let parameters = tool["parameters"].as_array().unwrap();
                let names: Vec<&str> = parameters
                    .iter()
                    .map(|p| p["name"].as_str().unwrap())
                    .collect();
                let required: Vec<&str> = parameters
                    .iter()
                    .filter(|p| p["required"] == json!(true))
                    .map(|p| p["name"].as_str().unwrap())
                    .collect();
                self::tool(tool["name"].as_str().unwrap(), &names, &required)
            })
            .collect()
    }

    #[test]
    fn what_the_operator_sends_is_published_or_named_in_a_description() {
        assert_eq!(check_sent(&published_declared()), vec![]);
    }

    #[test]
    fn only_briq_run_is_sent_arguments_its_schema_does_not_publish() {
        let published = published();
        let assumed: Vec<String> = api::SENT
            .iter()
            .flat_map(|(tool, parameters)| {
                let found = published["tools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|t| t["name"] == json!(tool))
                    .unwrap();
                parameters
                    .iter()
                    .filter(|parameter| {
                        found["parameters"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .find(|p| p["name"] == json!(parameter))
                            .is_some_and(|p| p["inDescriptionOnly"] == json!(true))
                    })
                    .map(move |parameter| format!("{tool}.{parameter}"))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(
            assumed,
            [
                "briq_run.image",
                "briq_run.name",
                "briq_run.size",
                "briq_run.sleep",
                "briq_run.env",
                "briq_run.wait"
            ]
        );
    }
}
