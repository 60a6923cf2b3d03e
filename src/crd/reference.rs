//! The API reference of the `briq.cloud` kinds, rendered as Markdown from the CRDs' own schemas
//! (what [`super::all`] generates and `crds/` holds), so that the book's reference page
//! (`docs/src/reference/api.md`) says exactly what the API server enforces: every field path
//! with its type, default, limits, CEL rules and description.
//!
//! Regenerate: `cargo run -q -- api-reference > docs/src/reference/api.md`.

use serde_json::Value;
use std::fmt::Write;

/// The command that regenerates the checked-in page (named by the drift test).
pub const REGENERATE: &str = "cargo run -q -- api-reference > docs/src/reference/api.md";

/// The Markdown page of every CRD [`super::all`] returns, in install order.
pub fn markdown() -> String {
    let crds: Vec<Value> = super::all()
        .into_iter()
        .map(|crd| serde_json::to_value(crd).expect("a CRD serializes to JSON"))
        .collect();
    render(&crds)
}

/// Renders CRDs (as JSON values) into the reference page.
pub fn render(crds: &[Value]) -> String {
    let mut out = String::new();
    out.push_str("# API reference\n\n");
    out.push_str(
        "<!-- Generated from the CRDs' schemas (src/crd/reference.rs); do not edit. -->\n\
         <!-- Regenerate: ",
    );
    out.push_str(REGENERATE);
    out.push_str(" -->\n\n");
    out.push_str(
        "Every field of the `briq.cloud` kinds as the CRDs in `crds/briq.cloud.yaml` declare \
         it, which is what the API server enforces: its path, type, default, limits and \
         description. *Limits* lists the OpenAPI bounds (minimum, maximum, lengths, items, \
         pattern, enum), whether the field is required, and the CEL rules \
         (`x-kubernetes-validations`) set on it, immutability rules included. Fields under \
         `status` are written by the operator only.\n\n",
    );
    out.push_str("| Kind | Group/version | Scope | Short names |\n|---|---|---|---|\n");
    for crd in crds {
        let spec = &crd["spec"];
        let kind = str_of(&spec["names"]["kind"]);
        let _ = writeln!(
            out,
            "| [{kind}](#{}) | `{}/{}` | {} | {} |",
            kind.to_lowercase(),
            str_of(&spec["group"]),
            versions(spec),
            str_of(&spec["scope"]),
            short_names(spec),
        );
    }
    out.push('\n');
    for crd in crds {
        render_kind(&mut out, crd);
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

fn str_of(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

fn versions(spec: &Value) -> String {
    spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| str_of(&v["name"]).to_owned())
        .collect::<Vec<_>>()
        .join(", ")
}

fn short_names(spec: &Value) -> String {
    let names: Vec<String> = spec["names"]["shortNames"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| format!("`{}`", str_of(n)))
        .collect();
    if names.is_empty() {
        "—".into()
    } else {
        names.join(", ")
    }
}

/// A table cell: one line, pipes escaped.
fn cell(text: &str) -> String {
    text.trim()
        .replace('|', "\\|")
        .replace("\n\n", "<br><br>")
        .replace('\n', "<br>")
}

fn render_kind(out: &mut String, crd: &Value) {
    let spec = &crd["spec"];
    let kind = str_of(&spec["names"]["kind"]);
    let group = str_of(&spec["group"]);
    let _ = writeln!(out, "## {kind}\n");
    let _ = writeln!(
        out,
        "- CRD: `{}`\n- Group: `{group}`\n- Scope: {}\n- Plural: `{}`; singular: `{}`; short names: {}",
        str_of(&crd["metadata"]["name"]),
        str_of(&spec["scope"]),
        str_of(&spec["names"]["plural"]),
        str_of(&spec["names"]["singular"]),
        short_names(spec),
    );
    for version in spec["versions"].as_array().into_iter().flatten() {
        let name = str_of(&version["name"]);
        let mut flags = Vec::new();
        if version["served"].as_bool() == Some(true) {
            flags.push("served");
        }
        if version["storage"].as_bool() == Some(true) {
            flags.push("storage");
        }
        if version["subresources"]["status"].is_object() {
            flags.push("status subresource");
        }
        let _ = writeln!(
            out,
            "- Version `{group}/{name}`: {}\n",
            if flags.is_empty() {
                "—".to_owned()
            } else {
                flags.join(", ")
            }
        );
        let root = &version["schema"]["openAPIV3Schema"];
        if let Some(description) = root["description"].as_str() {
            let _ = writeln!(out, "{}\n", description.trim());
        }
        if let Some(columns) = version["additionalPrinterColumns"].as_array() {
            let _ = writeln!(out, "### {kind} printer columns\n");
            out.push_str(
                "`kubectl get` shows these (priority 1: with `-o wide` only).\n\n\
                 | Column | Type | JSONPath | Priority | Description |\n|---|---|---|---|---|\n",
            );
            for column in columns {
                let _ = writeln!(
                    out,
                    "| {} | {} | `{}` | {} | {} |",
                    cell(str_of(&column["name"])),
                    cell(str_of(&column["type"])),
                    cell(str_of(&column["jsonPath"])),
                    column["priority"].as_i64().unwrap_or(0),
                    cell(str_of(&column["description"])),
                );
            }
            out.push('\n');
        }
        let _ = writeln!(out, "### {kind} fields\n");
        out.push_str("| Field | Type | Default | Limits | Description |\n|---|---|---|---|---|\n");
        let properties = root["properties"].as_object();
        for (field, schema) in properties.into_iter().flatten() {
            if matches!(field.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            let required = is_required(root, field);
            fields(out, field, schema, required);
        }
        out.push('\n');
    }
}

fn is_required(parent: &Value, field: &str) -> bool {
    parent["required"]
        .as_array()
        .is_some_and(|r| r.iter().any(|f| f.as_str() == Some(field)))
}

/// One row for `schema` at `path`, then one for each field below it.
fn fields(out: &mut String, path: &str, schema: &Value, required: bool) {
    let default = match &schema["default"] {
        Value::Null => String::new(),
        value => format!("`{}`", cell(&value.to_string())),
    };
    let _ = writeln!(
        out,
        "| `{}` | {} | {} | {} | {} |",
        cell(path),
        type_of(schema),
        default,
        limits(schema, required).join("<br>"),
        cell(str_of(&schema["description"])),
    );
    if let Some(properties) = schema["properties"].as_object() {
        for (field, child) in properties {
            fields(
                out,
                &format!("{path}.{field}"),
                child,
                is_required(schema, field),
            );
        }
    }
    let items = &schema["items"];
    if items.is_object() && (items["properties"].is_object() || items["items"].is_object()) {
        fields(out, &format!("{path}[]"), items, false);
    }
    let values = &schema["additionalProperties"];
    if values.is_object() && values["properties"].is_object() {
        fields(out, &format!("{path}.<key>"), values, false);
    }
}

fn type_of(schema: &Value) -> String {
    if schema["x-kubernetes-int-or-string"].as_bool() == Some(true) {
        return "integer or string".into();
    }
    if schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true)
        && schema["properties"].is_null()
    {
        return "any".into();
    }
    let base = str_of(&schema["type"]);
    let mut kind = match base {
        "array" => format!("array of {}", type_of(&schema["items"])),
        "object" if schema["additionalProperties"].is_object() => {
            format!("map of {}", type_of(&schema["additionalProperties"]))
        }
        "" => "any".into(),
        other => other.into(),
    };
    if let Some(format) = schema["format"].as_str() {
        let _ = write!(kind, " ({format})");
    }
    kind
}

/// A JSON number as written in a schema: `1.0` reads `1`.
fn number(value: &Value) -> String {
    match value.as_f64() {
        Some(n) if n.fract() == 0.0 && n.abs() < 1e15 => format!("{}", n as i64),
        _ => value.to_string(),
    }
}

fn limits(schema: &Value, required: bool) -> Vec<String> {
    let mut limits = Vec::new();
    if required {
        limits.push("required".to_owned());
    }
    for (key, label) in [
        ("minimum", "minimum"),
        ("maximum", "maximum"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("minProperties", "min properties"),
        ("maxProperties", "max properties"),
    ] {
        if !schema[key].is_null() {
            limits.push(format!("{label} {}", number(&schema[key])));
        }
    }
    if schema["exclusiveMinimum"].as_bool() == Some(true) {
        limits.push("minimum exclusive".into());
    }
    if schema["exclusiveMaximum"].as_bool() == Some(true) {
        limits.push("maximum exclusive".into());
    }
    if let Some(pattern) = schema["pattern"].as_str() {
        limits.push(format!("pattern `{}`", cell(pattern)));
    }
    if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .map(|v| format!("`{}`", cell(v.as_str().map_or(&v.to_string(), |s| s))))
            .collect();
        limits.push(format!("one of {}", values.join(", ")));
    }
    if let Some(list_type) = schema["x-kubernetes-list-type"].as_str() {
        let keys: Vec<String> = schema["x-kubernetes-list-map-keys"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|k| format!("`{}`", str_of(k)))
            .collect();
        if keys.is_empty() {
            limits.push(format!("list type {list_type}"));
        } else {
            limits.push(format!("list type {list_type}, keys {}", keys.join(", ")));
        }
    }
    for rule in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let message = str_of(&rule["message"]);
        let text = if message.is_empty() {
            str_of(&rule["rule"])
        } else {
            message
        };
        limits.push(format!("rule: {}", cell(text)));
    }
    limits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_in_api_reference_matches_the_crds() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/src/reference/api.md");
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            markdown() == checked_in,
            "docs/src/reference/api.md is stale (or missing): run `{REGENERATE}`"
        );
    }

    #[test]
    fn every_field_path_has_a_row_with_its_default_and_limits() {
        let page = markdown();
        for kind in [
            "BriqExecutor",
            "Execution",
            "BriqExecutorPool",
            "BriqExecutorClass",
        ] {
            assert!(page.contains(&format!("\n## {kind}\n")), "{kind}");
        }
        let row = page
            .lines()
            .find(|l| l.starts_with("| `spec.poolRef.coldCreateAfterSeconds` |"))
            .expect("a row for spec.poolRef.coldCreateAfterSeconds");
        assert!(row.contains("| `30` |"), "{row}");
        assert!(row.contains("maximum 600"), "{row}");
        // The executor's immutability rule, on its spec's row.
        assert!(page.contains("are immutable: the sandbox already exists"));
        // Nested: a pool's template is an executor spec.
        assert!(page.contains("| `spec.template.poolRef` |"));
    }

    #[test]
    fn cells_stay_on_one_line_with_pipes_escaped() {
        assert_eq!(cell("a | b\n\nc\nd"), "a \\| b<br><br>c<br>d");
        assert_eq!(number(&serde_json::json!(600.0)), "600");
        assert_eq!(number(&serde_json::json!(0.5)), "0.5");
    }
}
