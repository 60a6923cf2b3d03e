//! Custom resources of the `briq.cloud` API group, and their generated CRDs.

mod class;
pub mod compat;
pub mod conditions;
mod execution;
mod executor;
mod keys;
mod pool;
pub mod reasons;
pub mod reference;
pub mod vocabulary;

pub use class::*;
pub use execution::*;
pub use executor::*;
pub use keys::*;
pub use pool::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Every CRD this operator serves, in install order.
pub fn all() -> Vec<CustomResourceDefinition> {
    [
        BriqExecutor::crd(),
        Execution::crd(),
        pool_template_rules(BriqExecutorPool::crd()),
        BriqExecutorClass::crd(),
    ]
    .into_iter()
    .map(unwrap_descriptions)
    .collect()
}

/// A pool's template is a BriqExecutor spec, but not an executor's: it may change (members are
/// replaced, claimed ones keep theirs), so the executor's immutability rule does not apply to
/// it; it may not claim from a pool itself.
fn pool_template_rules(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let mut value = serde_json::to_value(crd).expect("a CRD serializes to JSON");
    let template = value
        .pointer_mut("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/template")
        .and_then(|t| t.as_object_mut())
        .expect("the pool CRD has spec.template");
    template.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": "!has(self.poolRef)",
            "message": "a pool's template cannot itself claim from a pool",
        }]),
    );
    serde_json::from_value(value).expect("a CRD deserializes from its own JSON")
}

/// One paragraph's wrapped lines as one line; a list keeps one item per line.
fn join_lines(paragraph: &str) -> String {
    let mut joined = String::new();
    for line in paragraph.split('\n') {
        if !joined.is_empty() {
            joined.push(if line.starts_with("- ") { '\n' } else { ' ' });
        }
        joined.push_str(line);
    }
    joined
}

/// Doc comments are wrapped at 100 columns; `kubectl explain` wraps again on its own. Join the
/// lines of each paragraph so that descriptions read as prose.
fn unwrap_descriptions(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn walk(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, child) in map.iter_mut() {
                    match child {
                        serde_json::Value::String(text) if key == "description" => {
                            *text = text
                                .split("\n\n")
                                .map(join_lines)
                                .collect::<Vec<_>>()
                                .join("\n\n");
                        }
                        _ => walk(child),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(crd).expect("a CRD serializes to JSON");
    walk(&mut value);
    serde_json::from_value(value).expect("a CRD deserializes from its own JSON")
}

/// The CRDs as one multi-document YAML stream, exactly as checked in under `crds/`.
pub fn to_yaml() -> Result<String, serde_yaml_ng::Error> {
    let mut out = String::new();
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&crd)?);
    }
    Ok(out)
}

/// Server-side applies every CRD and waits until the API server serves them.
pub async fn install(client: &kube::Client) -> Result<(), kube::Error> {
    install_these(client, all()).await
}

/// Server-side applies `crds` (this tree's, or a release's as `compat/` holds them) and waits
/// until the API server serves them.
pub async fn install_these(
    client: &kube::Client,
    crds: Vec<CustomResourceDefinition>,
) -> Result<(), kube::Error> {
    use kube::{
        Api, ResourceExt,
        api::{Patch, PatchParams},
        runtime::wait::{await_condition, conditions},
    };
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("briq-operator").force();
    for crd in crds {
        let name = crd.name_any();
        api.patch(&name, &params, &Patch::Apply(&crd)).await?;
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        // An unestablished CRD after 30 s shows up as a 404 on first use, which names the kind.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(30), established).await;
    }
    Ok(())
}
