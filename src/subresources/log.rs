//! `executions/{name}/log`: an action's output. While the action runs, the pieces its sandbox
//! relays ([`live`](super::live)); once it has ended, what its status holds. Within the same
//! 65,536-character budget as the status: the live view relays the head and says where it
//! stops, and after the end the status's tail follows, so a follower reads what the status
//! keeps. `?follow=true` streams until the action ends; `?format=json` gives one JSON object a
//! line (`{"stream","text"}`, `{"cut"}`, `{"end"}`), otherwise the text itself.

use std::{sync::Arc, time::Duration};

use kube::{Api, runtime::wait::await_condition};
use serde::Deserialize;
use tokio::sync::mpsc;

use super::live::{Action, Follower, Piece, Readers};
use crate::{
    briq::{SandboxApi, Stream},
    controller::ExecutorKeys,
    crd::{
        BriqExecutor, DEFAULT_EXECUTION_TIMEOUT_SECONDS, Execution,
        conditions::{self, SUCCEEDED},
    },
};

/// How long a follower of an Execution not started yet waits for it to start.
const START_WAIT: Duration = Duration::from_secs(3600);
/// How long after its live output ends an action's result may take to land in its status.
const RESULT_WAIT: Duration = Duration::from_secs(120);
/// Without `follow`, how long a running action's output so far may take to come.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Query {
    #[serde(default)]
    pub follow: bool,
    #[serde(default)]
    pub format: Format,
    /// Only this stream's text.
    pub stream: Option<Stream>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    #[default]
    Text,
    Json,
}

/// Where an Execution's output is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    NotStarted,
    /// Sent as `attempt`: its sandbox relays it.
    Running {
        attempt: String,
    },
    /// In the status, with the reason it ended.
    Finished {
        reason: String,
    },
}

pub fn source(execution: &Execution) -> Source {
    let status = execution.status.clone().unwrap_or_default();
    if let Some(ended) =
        conditions::find(&status.conditions, SUCCEEDED).filter(|c| c.status != "Unknown")
    {
        return Source::Finished {
            reason: ended.reason.clone(),
        };
    }
    match status.attempt_id {
        Some(attempt) => Source::Running { attempt },
        None => Source::NotStarted,
    }
}

/// What the status keeps after its cut (its tail), when its logs were cut.
pub fn status_tail(logs: &str) -> Option<&str> {
    const CUT_BEGINS: &str = "\n… [truncated ";
    const CUT_ENDS: &str = " characters] …\n";
    let begins = logs.find(CUT_BEGINS)?;
    let ends = logs[begins..].find(CUT_ENDS)? + begins + CUT_ENDS.len();
    Some(&logs[ends..])
}

/// The pieces of a finished Execution: its logs, then its end.
pub fn finished_pieces(execution: &Execution, reason: &str) -> Vec<Piece> {
    let logs = execution
        .status
        .as_ref()
        .and_then(|s| s.logs.clone())
        .unwrap_or_default();
    let mut pieces = Vec::new();
    if !logs.is_empty() {
        pieces.push(Piece::Text {
            stream: Stream::Stdout,
            text: logs,
        });
    }
    pieces.push(Piece::End {
        end: reason.to_owned(),
    });
    pieces
}

/// `piece` as the caller asked for it: a JSON line, or its text (nothing for an end).
pub fn render(piece: &Piece, query: &Query) -> Option<String> {
    if let (Piece::Text { stream, .. }, Some(wanted)) = (piece, query.stream)
        && *stream != wanted
    {
        return None;
    }
    match (query.format, piece) {
        (Format::Json, piece) => {
            Some(serde_json::to_string(piece).expect("a piece serializes") + "\n")
        }
        (Format::Text, Piece::Text { text, .. }) => Some(text.clone()),
        (Format::Text, Piece::Cut { cut }) => Some(format!(
            "\n… [live output stops after {cut} characters; the status keeps the head and the tail] …\n"
        )),
        (Format::Text, Piece::End { .. }) => None,
    }
}

/// Sends the output of `execution` to `out`, batch by batch, until it ends (the last batch
/// carries its `End`), the caller leaves (`out` closes) or a wait runs out. Without `follow`,
/// only what it printed so far.
pub async fn produce<S: SandboxApi + 'static>(
    keys: Arc<ExecutorKeys<S>>,
    sandboxes: Arc<S>,
    readers: Arc<Readers>,
    execution: Execution,
    follow: bool,
    out: mpsc::Sender<Vec<Piece>>,
) {
    let namespace = execution.metadata.namespace.clone().unwrap_or_default();
    let name = execution.metadata.name.clone().unwrap_or_default();
    let api: Api<Execution> = Api::namespaced(keys.client().clone(), &namespace);
    let send = |pieces: Vec<Piece>| {
        let out = out.clone();
        async move { pieces.is_empty() || out.send(pieces).await.is_ok() }
    };
    let mut execution = execution;
    if source(&execution) == Source::NotStarted {
        if !follow {
            return;
        }
        match wait_for(&api, &name, START_WAIT, |e| source(e) != Source::NotStarted).await {
            Some(started) => execution = started,
            None => {
                send(vec![Piece::End { end: "gone".into() }]).await;
                return;
            }
        }
    }
    let attempt = match source(&execution) {
        Source::Finished { reason } => {
            send(finished_pieces(&execution, &reason)).await;
            return;
        }
        Source::Running { attempt } => attempt,
        Source::NotStarted => unreachable!("waited for its start"),
    };
    let mut follower = match follower_of(&keys, sandboxes, &readers, &execution, attempt).await {
        Ok(follower) => follower,
        Err(why) => {
            send(vec![Piece::End { end: why }]).await;
            return;
        }
    };
    let mut cut = false;
    loop {
        let next = if follow {
            follower.next().await
        } else {
            tokio::time::timeout(SNAPSHOT_WAIT, follower.next())
                .await
                .ok()
                .flatten()
        };
        let Some(mut pieces) = next else {
            if !follow {
                return;
            }
            break;
        };
        cut |= pieces.iter().any(|p| matches!(p, Piece::Cut { .. }));
        // The end comes from the status, once the result has landed there.
        let ended = pieces.iter().any(|p| matches!(p, Piece::End { .. }));
        pieces.retain(|p| !matches!(p, Piece::End { .. }));
        if !send(pieces).await {
            return;
        }
        if ended {
            break;
        }
        if !follow {
            return;
        }
    }
    let finished = wait_for(&api, &name, RESULT_WAIT, |e| {
        matches!(source(e), Source::Finished { .. })
    })
    .await;
    let mut pieces = Vec::new();
    match finished.as_ref().map(|e| (e, source(e))) {
        Some((finished, Source::Finished { reason })) => {
            let logs = finished
                .status
                .as_ref()
                .and_then(|s| s.logs.as_deref())
                .unwrap_or_default();
            if let Some(tail) = status_tail(logs).filter(|_| cut) {
                pieces.push(Piece::Text {
                    stream: Stream::Stdout,
                    text: tail.to_owned(),
                });
            }
            pieces.push(Piece::End { end: reason });
        }
        _ => pieces.push(Piece::End {
            end: "its result did not land in its status in time".into(),
        }),
    }
    send(pieces).await;
}

/// A follower of `execution`'s running `attempt`, read from its executor's sandbox; or why
/// there is none.
async fn follower_of<S: SandboxApi + 'static>(
    keys: &ExecutorKeys<S>,
    sandboxes: Arc<S>,
    readers: &Readers,
    execution: &Execution,
    attempt: String,
) -> Result<Follower, String> {
    let namespace = execution.metadata.namespace.clone().unwrap_or_default();
    let name = &execution.spec.executor_ref.name;
    let executors: Api<BriqExecutor> = Api::namespaced(keys.client().clone(), &namespace);
    let executor = executors
        .get_opt(name)
        .await
        .map_err(|error| format!("reading BriqExecutor {name}: {error}"))?
        .ok_or_else(|| format!("BriqExecutor {name} is gone"))?;
    let sandbox = executor
        .status
        .as_ref()
        .and_then(|s| s.sandbox_id.clone())
        .ok_or_else(|| format!("BriqExecutor {name} has no sandbox"))?;
    let key = keys
        .key(&executor)
        .await
        .map_err(|error| format!("the briq key of BriqExecutor {name}: {error}"))?;
    let seconds = execution
        .spec
        .timeout_seconds
        .unwrap_or(DEFAULT_EXECUTION_TIMEOUT_SECONDS);
    let deadline = Duration::from_secs(u64::from(seconds)) + RESULT_WAIT;
    let live = readers.live(sandboxes, key, Action { sandbox, attempt }, deadline);
    Ok(live.follow())
}

/// `name` once `condition` holds of it, within `limit`; `None` when it is gone or the time ran
/// out.
async fn wait_for(
    api: &Api<Execution>,
    name: &str,
    limit: Duration,
    condition: impl Fn(&Execution) -> bool,
) -> Option<Execution> {
    let holds = move |e: Option<&Execution>| e.is_none_or(&condition);
    tokio::time::timeout(limit, await_condition(api.clone(), name, holds))
        .await
        .ok()?
        .ok()?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_tail_is_what_follows_its_cut() {
        let logs = "head\n… [truncated 1200 characters] …\ntail\n";
        assert_eq!(status_tail(logs), Some("tail\n"));
        assert_eq!(status_tail("whole\n"), None);
    }

    #[test]
    fn text_keeps_the_asked_stream_and_json_every_piece() {
        let out = Piece::Text {
            stream: Stream::Stdout,
            text: "1\n".into(),
        };
        let err = Piece::Text {
            stream: Stream::Stderr,
            text: "w\n".into(),
        };
        let only_stdout = Query {
            stream: Some(Stream::Stdout),
            ..Query::default()
        };
        assert_eq!(render(&out, &only_stdout).as_deref(), Some("1\n"));
        assert_eq!(render(&err, &only_stdout), None);
        let json = Query {
            format: Format::Json,
            ..Query::default()
        };
        assert_eq!(
            render(&err, &json).as_deref(),
            Some("{\"stream\":\"stderr\",\"text\":\"w\\n\"}\n")
        );
        assert_eq!(
            render(&Piece::End { end: "x".into() }, &Query::default()),
            None
        );
    }
}
