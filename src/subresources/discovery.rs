//! The discovery documents of `subresources.briq.cloud/v1alpha1`: kube-apiserver reads them to
//! mark the `APIService` available, and kubectl to learn the resources' verbs.

use serde_json::{Value, json};

pub const GROUP: &str = "subresources.briq.cloud";
pub const VERSION: &str = "v1alpha1";

/// The subresources served, as `(resource/subresource, kind, verbs)`.
pub const RESOURCES: &[(&str, &str, &[&str])] = &[
    ("executions/log", "Execution", &["get"]),
    ("briqexecutors/files", "BriqExecutor", &["get", "update"]),
];

pub fn group_version() -> String {
    format!("{GROUP}/{VERSION}")
}

/// `GET /apis/subresources.briq.cloud/v1alpha1`.
pub fn resource_list() -> Value {
    let resources: Vec<Value> = RESOURCES
        .iter()
        .map(|(name, kind, verbs)| {
            json!({"name": name, "singularName": "", "namespaced": true, "kind": kind, "verbs": verbs})
        })
        .collect();
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version(),
        "resources": resources,
    })
}

fn group_object() -> Value {
    let version = json!({"groupVersion": group_version(), "version": VERSION});
    json!({"name": GROUP, "versions": [version], "preferredVersion": version})
}

/// `GET /apis/subresources.briq.cloud`.
pub fn group() -> Value {
    let mut group = group_object();
    group["kind"] = json!("APIGroup");
    group["apiVersion"] = json!("v1");
    group
}

/// `GET /apis`.
pub fn group_list() -> Value {
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_object()]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resource_list_names_each_subresource_with_its_verbs() {
        let list = resource_list();
        assert_eq!(list["groupVersion"], "subresources.briq.cloud/v1alpha1");
        assert_eq!(
            list["resources"],
            json!([
                {"name": "executions/log", "singularName": "", "namespaced": true,
                 "kind": "Execution", "verbs": ["get"]},
                {"name": "briqexecutors/files", "singularName": "", "namespaced": true,
                 "kind": "BriqExecutor", "verbs": ["get", "update"]},
            ])
        );
        assert_eq!(group()["preferredVersion"]["version"], "v1alpha1");
        assert_eq!(group_list()["groups"][0]["name"], GROUP);
    }
}
