//! `mcp [-n NAMESPACE]`: MCP over stdio, as desktop agents start their servers
//! (`claude mcp add briq -- kubectl briq mcp -n team-a`), relayed to the namespace's MCP
//! endpoint of the operator's aggregated API with the kubeconfig's credentials. One JSON-RPC
//! message a line each way; each request on a task of its own, so a long `run_python` holds no
//! `ping` or `cancel` behind it; its notifications reach stdout as they come.

use std::sync::{Arc, Mutex};

use futures::TryStreamExt as _;
use http_body_util::BodyExt as _;
use kube::Client;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader},
    sync::mpsc,
    task::JoinSet,
};

use super::{
    cluster::{Cluster, NamespaceArg},
    error::Error,
    exit::Exit,
};
use crate::subresources::{GROUP, VERSION};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub namespace: NamespaceArg,
}

/// The session the endpoint handed out at `initialize`, and the revision it chose.
#[derive(Default, Clone)]
struct Session {
    id: Option<String>,
    version: Option<String>,
}

/// Server-Sent Events, fed as lines: the `data` of each complete event.
#[derive(Default)]
pub struct Events {
    data: Vec<String>,
}

impl Events {
    /// Takes one line of the stream; an event's data once its blank line ends it.
    pub fn line(&mut self, line: &str) -> Option<String> {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            return (!self.data.is_empty()).then(|| std::mem::take(&mut self.data).join("\n"));
        }
        if let Some(data) = line.strip_prefix("data:") {
            self.data
                .push(data.strip_prefix(' ').unwrap_or(data).to_owned());
        }
        None
    }
}

/// The JSON-RPC error that tells the client why its request got no answer over HTTP
/// (kube-apiserver's 401 or 403, an operator that is not serving), with the id it sent.
pub fn http_refusal(message: &Value, status: u16, body: &[u8]) -> Option<Value> {
    let id = message.get("id")?.clone();
    if let Ok(answer) = serde_json::from_slice::<Value>(body)
        && answer.get("jsonrpc").is_some()
    {
        return Some(answer);
    }
    let why = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|status| status["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
    Some(json!({
        "jsonrpc": "2.0", "id": id,
        "error": { "code": -32603, "message": format!("the MCP endpoint answered HTTP {status}: {why}") },
    }))
}

pub async fn run(args: Args) -> Result<Exit, Error> {
    let cluster = Cluster::connect(args.namespace).await?;
    let path = format!(
        "/apis/{GROUP}/{VERSION}/namespaces/{}/mcp",
        cluster.namespace
    );
    let (out, mut lines_out) = mpsc::channel::<String>(64);
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = lines_out.recv().await {
            if stdout
                .write_all(format!("{line}\n").as_bytes())
                .await
                .is_err()
                || stdout.flush().await.is_err()
            {
                return;
            }
        }
    });
    let session = Arc::new(Mutex::new(Session::default()));
    let mut relays = JoinSet::new();
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = stdin.next_line().await {
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            if !line.trim().is_empty() {
                eprintln!("kubectl briq mcp: a line that is not JSON was dropped");
            }
            continue;
        };
        let initialize = message["method"] == "initialize";
        let relay = relay(
            cluster.client.clone(),
            path.clone(),
            session.clone(),
            message,
            out.clone(),
        );
        if initialize {
            // Later messages carry the session id this answer brings.
            relay.await;
        } else {
            relays.spawn(relay);
        }
    }
    while relays.join_next().await.is_some() {}
    let ended = session.lock().expect("session lock").clone();
    if let Some(id) = ended.id {
        let request = http::Request::delete(&path)
            .header("mcp-session-id", id)
            .body(kube::client::Body::empty())
            .expect("a DELETE request");
        let _ = cluster.client.send(request).await;
    }
    drop(out);
    let _ = writer.await;
    Ok(Exit::Ok)
}

/// Sends `message` and writes what answers it (one line, or the lines of its stream).
async fn relay(
    client: Client,
    path: String,
    session: Arc<Mutex<Session>>,
    message: Value,
    out: mpsc::Sender<String>,
) {
    let known = session.lock().expect("session lock").clone();
    let mut request = http::Request::post(&path)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(id) = &known.id {
        request = request.header("mcp-session-id", id);
    }
    if let Some(version) = &known.version {
        request = request.header("mcp-protocol-version", version);
    }
    let request = request
        .body(kube::client::Body::from(message.to_string().into_bytes()))
        .expect("a POST request");
    let response = match client.send(request).await {
        Ok(response) => response,
        Err(error) => {
            if let Some(answer) = http_refusal(&message, 502, error.to_string().as_bytes()) {
                let _ = out.send(answer.to_string()).await;
            }
            return;
        }
    };
    let status = response.status();
    if let Some(id) = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
    {
        session.lock().expect("session lock").id = Some(id.to_owned());
    }
    let streamed = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    if status.as_u16() == 202 {
        return;
    }
    if !status.is_success() || !streamed {
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .unwrap_or_default();
        let answer = if status.is_success() {
            serde_json::from_slice::<Value>(&body).ok()
        } else {
            http_refusal(&message, status.as_u16(), &body)
        };
        if let Some(answer) = answer {
            if message["method"] == "initialize"
                && let Some(version) = answer["result"]["protocolVersion"].as_str()
            {
                session.lock().expect("session lock").version = Some(version.to_owned());
            }
            let _ = out.send(answer.to_string()).await;
        }
        return;
    }
    let mut events = Events::default();
    let mut pending = String::new();
    let mut body = response.into_body().into_data_stream();
    while let Ok(Some(chunk)) = body.try_next().await {
        pending.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = pending.find('\n') {
            let line: String = pending.drain(..=end).collect();
            if let Some(data) = events.line(line.trim_end_matches('\n'))
                && out.send(data).await.is_err()
            {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_of_a_stream_is_one_line_out() {
        let mut events = Events::default();
        let mut seen = Vec::new();
        for line in [
            "event: message",
            "data: {\"a\":1}",
            "",
            ": a comment",
            "",
            "data: {\"b\":",
            "data: 2}\r",
            "\r",
        ] {
            seen.extend(events.line(line));
        }
        assert_eq!(seen, ["{\"a\":1}", "{\"b\":\n2}"]);
    }

    #[test]
    fn a_refusal_over_http_answers_the_request_it_refused() {
        let request = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"});
        let status = br#"{"kind":"Status","message":"mcp is forbidden: User \"x\" cannot create resource \"mcp\""}"#;
        assert_eq!(
            http_refusal(&request, 403, status),
            Some(json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32603,
                "message": "the MCP endpoint answered HTTP 403: mcp is forbidden: User \"x\" cannot create resource \"mcp\""}}))
        );
        let rpc = br#"{"jsonrpc":"2.0","id":7,"error":{"code":-32600,"message":"no session"}}"#;
        assert_eq!(
            http_refusal(&request, 400, rpc),
            Some(serde_json::from_slice(rpc).unwrap())
        );
        let notification = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        assert_eq!(http_refusal(&notification, 403, status), None);
    }
}
