//! Counting one user's API requests in kube-apiserver's audit log (JSON lines, level Metadata,
//! RequestReceived omitted: see `control_plane::Options::audit_log`).

use std::{
    collections::{BTreeMap, HashSet},
    io::{Read, Seek, SeekFrom},
    path::Path,
    time::SystemTime,
};

use anyhow::Context as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use serde::{Deserialize, Serialize};

/// A user's requests in a stretch of the audit log.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RequestCounts {
    /// get, list.
    pub reads: u64,
    /// create, update, patch, delete, deletecollection.
    pub writes: u64,
    /// Watch requests started.
    pub watches: u64,
    /// Anything else (discovery, for instance).
    pub other: u64,
    /// Requests (of any kind) answered with a 5xx status or 429.
    pub errors: u64,
    /// Per `verb resource[/subresource]` (or `verb path` without an object), watches included.
    pub by_request: BTreeMap<String, u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(rename = "auditID")]
    audit_id: String,
    #[serde(default)]
    request_received_timestamp: Option<MicroTime>,
    #[serde(default)]
    stage_timestamp: Option<MicroTime>,
    stage: String,
    verb: String,
    #[serde(default)]
    request_uri: String,
    user: User,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    response_status: Option<ResponseStatus>,
}

#[derive(Deserialize)]
struct ResponseStatus {
    #[serde(default)]
    code: u16,
}

#[derive(Deserialize)]
struct User {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

/// One completed request, when the API server received it and when it answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Timed {
    pub user: String,
    pub verb: String,
    /// `resource[/subresource]`.
    pub what: String,
    pub name: String,
    pub received: SystemTime,
    pub completed: SystemTime,
}

/// The completed requests on named objects logged between byte offsets `from` and `to`, with
/// the API server's own timestamps (microseconds).
pub fn timed(path: &Path, from: u64, to: u64) -> anyhow::Result<Vec<Timed>> {
    Ok(timed_text(&read_range(path, from, to)?))
}

fn timed_text(text: &str) -> Vec<Timed> {
    text.lines()
        .filter_map(|line| serde_json::from_str::<Event>(line).ok())
        .filter(|event| event.stage == "ResponseComplete")
        .filter_map(|event| {
            let object = event.object_ref?;
            let what = match object.subresource {
                Some(sub) => format!("{}/{sub}", object.resource),
                None => object.resource,
            };
            Some(Timed {
                user: event.user.username,
                verb: event.verb,
                what,
                name: object.name?,
                received: event.request_received_timestamp?.0.into(),
                completed: event.stage_timestamp?.0.into(),
            })
        })
        .collect()
}

/// Where the log ends now: count from here to a later offset.
pub fn offset(path: &Path) -> anyhow::Result<u64> {
    Ok(std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len())
}

/// `user`'s requests logged between byte offsets `from` and `to`. A completed request is its
/// ResponseComplete event; a watch is counted when it starts (ResponseStarted).
pub fn count(path: &Path, from: u64, to: u64, user: &str) -> anyhow::Result<RequestCounts> {
    Ok(count_text(&read_range(path, from, to)?, user))
}

/// The log between byte offsets `from` and `to`.
fn read_range(path: &Path, from: u64, to: u64) -> anyhow::Result<String> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    file.seek(SeekFrom::Start(from))?;
    let mut text = String::new();
    file.take(to.saturating_sub(from))
        .read_to_string(&mut text)
        .context("reading the audit log")?;
    Ok(text)
}

fn count_text(text: &str, user: &str) -> RequestCounts {
    let mut counts = RequestCounts::default();
    let mut watches = HashSet::new();
    for line in text.lines() {
        // A line cut at the end of the stretch does not parse: it belongs to the next one.
        let Ok(event) = serde_json::from_str::<Event>(line) else {
            continue;
        };
        if event.user.username != user {
            continue;
        }
        let counted = match (event.verb.as_str(), event.stage.as_str()) {
            ("watch", "ResponseStarted") => watches.insert(event.audit_id.clone()),
            ("watch", _) => false,
            (_, "ResponseComplete" | "Panic") => true,
            _ => false,
        };
        if !counted {
            continue;
        }
        if event
            .response_status
            .as_ref()
            .is_some_and(|s| s.code >= 500 || s.code == 429)
        {
            counts.errors += 1;
        }
        match event.verb.as_str() {
            "get" | "list" => counts.reads += 1,
            "create" | "update" | "patch" | "delete" | "deletecollection" => counts.writes += 1,
            "watch" => counts.watches += 1,
            _ => counts.other += 1,
        }
        let what = match &event.object_ref {
            Some(object) if !object.resource.is_empty() => match &object.subresource {
                Some(sub) => format!("{}/{sub}", object.resource),
                None => object.resource.clone(),
            },
            _ => event
                .request_uri
                .split('?')
                .next()
                .unwrap_or_default()
                .to_owned(),
        };
        *counts
            .by_request
            .entry(format!("{} {what}", event.verb))
            .or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_one_users_completed_requests_and_started_watches() {
        let line = |id: &str, stage: &str, verb: &str, user: &str, sub: Option<&str>| {
            serde_json::json!({
                "kind": "Event", "level": "Metadata", "auditID": id, "stage": stage,
                "verb": verb, "requestURI": "/apis/briq.cloud/v1alpha1/namespaces/n/executions",
                "user": { "username": user, "groups": ["system:masters"] },
                "objectRef": { "resource": "executions", "subresource": sub },
            })
            .to_string()
        };
        let text = [
            line("1", "ResponseComplete", "get", "briq-operator", None),
            line(
                "2",
                "ResponseComplete",
                "patch",
                "briq-operator",
                Some("status"),
            ),
            line("3", "ResponseComplete", "patch", "admin", Some("status")),
            line("4", "ResponseStarted", "watch", "briq-operator", None),
            line("4", "ResponseComplete", "watch", "briq-operator", None),
            line("5", "ResponseComplete", "list", "briq-operator", None).replace(
                r#""stage""#,
                r#""responseStatus":{"metadata":{},"code":500},"stage""#,
            ),
            r#"{"kind":"Event","auditID":"6","sta"#.to_owned(),
        ]
        .join("\n");
        let counts = count_text(&text, "briq-operator");
        assert_eq!(
            (counts.reads, counts.writes, counts.watches, counts.other),
            (2, 1, 1, 0)
        );
        assert_eq!(counts.errors, 1);
        assert_eq!(counts.by_request["patch executions/status"], 1);
        assert_eq!(counts.by_request["watch executions"], 1);
    }

    #[test]
    fn completed_requests_on_named_objects_carry_the_api_servers_timestamps() {
        let line = |stage: &str, name: Option<&str>| {
            serde_json::json!({
                "kind": "Event", "auditID": "1", "stage": stage, "verb": "patch",
                "requestURI": "/apis/briq.cloud/v1alpha1/namespaces/n/executions/a/status",
                "user": { "username": "briq-operator" },
                "objectRef": { "resource": "executions", "subresource": "status", "name": name },
                "requestReceivedTimestamp": "2026-12-06T22:31:31.500000Z",
                "stageTimestamp": "2026-12-06T22:31:31.503250Z",
            })
            .to_string()
        };
        let text = [
            line("ResponseStarted", Some("a")),
            line("ResponseComplete", Some("a")),
            line("ResponseComplete", None),
        ]
        .join("\n");
        let timed = timed_text(&text);
        assert_eq!(timed.len(), 1, "{timed:?}");
        let request = &timed[0];
        assert_eq!(
            (
                request.user.as_str(),
                request.verb.as_str(),
                request.what.as_str()
            ),
            ("briq-operator", "patch", "executions/status")
        );
        assert_eq!(request.name, "a");
        assert_eq!(
            request.completed.duration_since(request.received).unwrap(),
            std::time::Duration::from_micros(3250)
        );
    }
}
