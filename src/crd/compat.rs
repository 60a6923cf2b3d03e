//! Whether these CRDs can replace a released version's on a cluster that stores objects made
//! under it: an upgrade applies the new CRDs first, and every stored object must still be
//! valid and mean what it meant. Compared schema by schema (each kind's served versions), field
//! by field: a field removed, a default changed, or a validation narrowed (a new required
//! field, an enum value removed, a lower maximum or higher minimum, a shorter maximum length or
//! item count, a type changed) is reported with its path. Widening (new optional fields, new
//! enum values, looser bounds) and text (descriptions) are free. CEL rules are not compared:
//! `tests/crds.rs` exercises them against a real API server.

use serde_json::Value;

/// Every narrowing from `old` to `new` (CustomResourceDefinition documents, as YAML streams),
/// one line each: `<kind> <version> <path>: <what>`.
pub fn narrowings(old: &str, new: &str) -> Result<Vec<String>, serde_yaml_ng::Error> {
    let old = schemas(old)?;
    let new = schemas(new)?;
    let mut found = Vec::new();
    for ((kind, version), old_schema) in &old {
        let at = format!("{kind} {version}");
        match new
            .iter()
            .find(|(key, _)| key == &(kind.clone(), version.clone()))
        {
            None => found.push(format!("{at}: no longer served")),
            Some((_, new_schema)) => compare(&at, "", old_schema, new_schema, false, &mut found),
        }
    }
    Ok(found)
}

type Schemas = Vec<((String, String), Value)>;

fn schemas(stream: &str) -> Result<Schemas, serde_yaml_ng::Error> {
    let mut out = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(stream) {
        let crd: Value = serde::Deserialize::deserialize(document)?;
        if crd.is_null() {
            continue;
        }
        let kind = crd["spec"]["names"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        for version in crd["spec"]["versions"].as_array().into_iter().flatten() {
            let name = version["name"].as_str().unwrap_or_default().to_owned();
            out.push((
                (kind.clone(), name),
                version["schema"]["openAPIV3Schema"].clone(),
            ));
        }
    }
    Ok(out)
}

/// `always_stored`: the old schema required this field, so every stored object has it.
fn compare(
    at: &str,
    path: &str,
    old: &Value,
    new: &Value,
    always_stored: bool,
    found: &mut Vec<String>,
) {
    let mut narrowed = |what: String| found.push(format!("{at} {}: {what}", or_root(path)));
    if old.get("type") != new.get("type") && old.get("type").is_some() {
        narrowed(format!(
            "type {} became {}",
            show(&old["type"]),
            show(&new["type"])
        ));
    }
    // A default given to a field every stored object has applies to none of them.
    let default_for_new_objects_only = always_stored && old.get("default").is_none();
    if old.get("default") != new.get("default") && !default_for_new_objects_only {
        narrowed(format!(
            "default {} became {}",
            show(&old["default"]),
            show(&new["default"])
        ));
    }
    for (bound, tighter) in [
        ("maximum", Tighter::Lower),
        ("maxLength", Tighter::Lower),
        ("maxItems", Tighter::Lower),
        ("maxProperties", Tighter::Lower),
        ("minimum", Tighter::Higher),
        ("minLength", Tighter::Higher),
        ("minItems", Tighter::Higher),
    ] {
        let (before, after) = (old[bound].as_f64(), new[bound].as_f64());
        let narrower = match (before, after, tighter) {
            (None, Some(_), _) => true,
            (Some(b), Some(a), Tighter::Lower) => a < b,
            (Some(b), Some(a), Tighter::Higher) => a > b,
            _ => false,
        };
        if narrower {
            narrowed(format!(
                "{bound} {} became {}",
                show(&old[bound]),
                show(&new[bound])
            ));
        }
    }
    if old.get("pattern") != new.get("pattern") && new.get("pattern").is_some() {
        narrowed(format!(
            "pattern {} became {}",
            show(&old["pattern"]),
            show(&new["pattern"])
        ));
    }
    if let Some(after) = new["enum"].as_array() {
        match old["enum"].as_array() {
            None => narrowed("an enum where any value was allowed".into()),
            Some(before) => {
                for value in before.iter().filter(|v| !after.contains(v)) {
                    narrowed(format!("enum value {} removed", show(value)));
                }
            }
        }
    }
    let required = |schema: &Value| -> Vec<String> {
        schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let before = required(old);
    for field in required(new).iter().filter(|f| !before.contains(f)) {
        narrowed(format!("{field} became required"));
    }
    if let Some(properties) = old["properties"].as_object() {
        for (name, old_field) in properties {
            let child = format!("{path}.{name}");
            match new["properties"].get(name) {
                None if new["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true) => {}
                None => found.push(format!("{at} {child}: removed")),
                Some(new_field) => {
                    let stored = before.contains(name);
                    compare(at, &child, old_field, new_field, stored, found)
                }
            }
        }
    }
    for nested in ["items", "additionalProperties"] {
        if old[nested].is_object() && new[nested].is_object() {
            compare(
                at,
                &format!("{path}[{nested}]"),
                &old[nested],
                &new[nested],
                false,
                found,
            );
        }
    }
}

#[derive(Clone, Copy)]
enum Tighter {
    Lower,
    Higher,
}

fn or_root(path: &str) -> &str {
    if path.is_empty() { "." } else { path }
}

fn show(value: &Value) -> String {
    match value {
        Value::Null => "none".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-kind CRD stream whose `spec` schema is `spec`.
    fn crd(spec: serde_json::Value) -> String {
        let crd = serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": { "name": "things.briq.cloud" },
            "spec": {
                "names": { "kind": "Thing" },
                "versions": [{
                    "name": "v1alpha1",
                    "schema": { "openAPIV3Schema": {
                        "type": "object",
                        "properties": { "spec": spec },
                    } },
                }],
            },
        });
        format!("---\n{}", serde_yaml_ng::to_string(&crd).unwrap())
    }

    #[test]
    fn narrowings_table() {
        let base = serde_json::json!({
            "type": "object",
            "required": ["code"],
            "properties": {
                "code": { "type": "string", "maxLength": 100 },
                "size": { "type": "string", "enum": ["small", "large"] },
                "timeout": { "type": "integer", "minimum": 1, "maximum": 40, "default": 30 },
                "env": { "type": "array", "items": { "type": "string" } },
            },
        });
        let with = |change: &dyn Fn(&mut serde_json::Value)| {
            let mut spec = base.clone();
            change(&mut spec);
            spec
        };
        let cases: Vec<(&str, serde_json::Value, Vec<&str>)> = vec![
            ("unchanged", base.clone(), vec![]),
            (
                "widened: a new optional field, a new enum value, looser bounds, new text",
                with(&|s| {
                    s["properties"]["image"] = serde_json::json!({ "type": "string" });
                    s["properties"]["size"]["enum"] = serde_json::json!(["small", "large", "xl"]);
                    s["properties"]["timeout"]["maximum"] = 60.into();
                    s["properties"]["code"]["maxLength"] = 200.into();
                    s["properties"]["code"]["description"] = "the code".into();
                }),
                vec![],
            ),
            (
                "a field removed",
                with(&|s| {
                    s["properties"].as_object_mut().unwrap().remove("env");
                }),
                vec!["Thing v1alpha1 .spec.env: removed"],
            ),
            (
                "a default changed",
                with(&|s| s["properties"]["timeout"]["default"] = 10.into()),
                vec!["Thing v1alpha1 .spec.timeout: default 30 became 10"],
            ),
            (
                "a default given to a field that was required (every stored object has it)",
                with(&|s| {
                    s["required"] = serde_json::json!([]);
                    s["properties"]["code"]["default"] = "pass".into();
                }),
                vec![],
            ),
            (
                "a default given to a field that was optional",
                with(&|s| s["properties"]["size"]["default"] = "small".into()),
                vec!["Thing v1alpha1 .spec.size: default none became \"small\""],
            ),
            (
                "narrowed bounds and a removed enum value",
                with(&|s| {
                    s["properties"]["timeout"]["maximum"] = 20.into();
                    s["properties"]["timeout"]["minimum"] = 5.into();
                    s["properties"]["code"]["maxLength"] = 50.into();
                    s["properties"]["size"]["enum"] = serde_json::json!(["small"]);
                }),
                vec![
                    "Thing v1alpha1 .spec.code: maxLength 100 became 50",
                    "Thing v1alpha1 .spec.size: enum value \"large\" removed",
                    "Thing v1alpha1 .spec.timeout: maximum 40 became 20",
                    "Thing v1alpha1 .spec.timeout: minimum 1 became 5",
                ],
            ),
            (
                "a new required field, a type changed, an item bound added",
                with(&|s| {
                    s["required"] = serde_json::json!(["code", "image"]);
                    s["properties"]["image"] = serde_json::json!({ "type": "string" });
                    s["properties"]["timeout"]["type"] = "string".into();
                    s["properties"]["env"]["maxItems"] = 3.into();
                }),
                vec![
                    "Thing v1alpha1 .spec.env: maxItems none became 3",
                    "Thing v1alpha1 .spec.timeout: type \"integer\" became \"string\"",
                    "Thing v1alpha1 .spec: image became required",
                ],
            ),
        ];
        for (name, spec, expected) in cases {
            let mut got = narrowings(&crd(base.clone()), &crd(spec)).unwrap();
            got.sort();
            assert_eq!(got, expected, "{name}");
        }
        assert_eq!(
            narrowings(&crd(base.clone()), "").unwrap(),
            vec!["Thing v1alpha1: no longer served"]
        );
    }

    #[test]
    fn the_crds_keep_every_object_stored_under_the_last_release_valid() {
        let released = include_str!("../../compat/0.1.0/briq.cloud.yaml");
        let now = super::super::to_yaml().unwrap();
        assert_eq!(
            narrowings(released, &now).unwrap(),
            Vec::<String>::new(),
            "the CRDs narrow what release 0.1.0 stored (compat/README.md)"
        );
    }
}
