//! Whether the caller may do what they ask: a SubjectAccessReview for the user the front proxy
//! named, on the subresource in its namespace. kube-apiserver authorized the request before
//! proxying it; asking again holds even for a request that reached this server another way.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::{Api, Client, api::PostParams};

use super::front_proxy::User;

/// A request, as RBAC names it: on a subresource of this group (`executions/log`), or, for the
/// MCP endpoint's tools, the underlying right in `briq.cloud` (`create executions`). An empty
/// `subresource` or `name` is not sent (a `create` or a `list` names no object).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// `subresources.briq.cloud` or `briq.cloud`.
    pub group: &'a str,
    pub verb: &'a str,
    pub namespace: &'a str,
    /// `executions`.
    pub resource: &'a str,
    /// `log`.
    pub subresource: &'a str,
    pub name: &'a str,
}

pub fn review(user: &User, request: &Request) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(request.group.to_owned()),
                verb: Some(request.verb.to_owned()),
                namespace: Some(request.namespace.to_owned()),
                resource: Some(request.resource.to_owned()),
                subresource: given(request.subresource),
                name: given(request.name),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

fn given(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

/// `Ok(None)` when allowed, `Ok(Some(why))` when not.
pub async fn denied(
    client: &Client,
    user: &User,
    request: &Request<'_>,
) -> Result<Option<String>, kube::Error> {
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let answer = reviews
        .create(&PostParams::default(), &review(user, request))
        .await?;
    let status = answer.status.unwrap_or_default();
    if status.allowed && !status.denied.unwrap_or(false) {
        return Ok(None);
    }
    let why = status.reason.filter(|r| !r.is_empty()).unwrap_or_else(|| {
        let resource = match request.subresource {
            "" => request.resource.to_owned(),
            subresource => format!("{}/{subresource}", request.resource),
        };
        let name = match request.name {
            "" => String::new(),
            name => format!(" {name:?}"),
        };
        format!(
            "user {:?} cannot {} {resource}{name} in the API group {} in namespace {}",
            user.name, request.verb, request.group, request.namespace
        )
    });
    Ok(Some(why))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subresources::discovery::GROUP;

    #[test]
    fn the_review_asks_for_the_subresource_of_the_named_object_in_its_namespace() {
        let user = User {
            name: "alice".into(),
            groups: vec!["dev".into()],
            extra: Default::default(),
        };
        let request = Request {
            group: GROUP,
            verb: "get",
            namespace: "team-a",
            resource: "executions",
            subresource: "log",
            name: "step-1",
        };
        let review = serde_json::to_value(review(&user, &request)).unwrap();
        assert_eq!(
            review["spec"],
            serde_json::json!({
                "user": "alice", "groups": ["dev"],
                "resourceAttributes": {"group": "subresources.briq.cloud", "verb": "get",
                    "namespace": "team-a", "resource": "executions", "subresource": "log",
                    "name": "step-1"},
            })
        );
    }
}
