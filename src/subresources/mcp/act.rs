//! What each tool does once the caller's rights are confirmed. The answers are built by pure
//! functions at the top (tested with exact outputs); below them, the calls to the API server
//! and to the sandbox, all through the objects every other client uses: an action is an
//! `Execution`, an executor a `BriqExecutor`, a file moves through the files path.

use std::time::{Duration, Instant};

use base64::{Engine as _, engine::general_purpose::STANDARD as BASE64};
use bytes::Bytes;
use kube::{
    Api,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    runtime::wait::await_condition,
};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio::sync::mpsc;

use super::{
    protocol,
    tools::{Call, Encoding, MAX_FILE_BYTES, Right},
};
use crate::{
    briq::{SandboxApi, Stream},
    crd::{
        BriqExecutor, Execution, MCP_REQUEST_ID_ANNOTATION, POOL_MEMBER_ANNOTATION,
        REQUESTED_BY_ANNOTATION,
        conditions::{self, READY, STALLED, SUCCEEDED},
    },
    subresources::{
        authorize::Request,
        front_proxy::User,
        live::Piece,
        log,
        served::{Served, authorized},
        transfer::{self, Reader},
    },
    task::AbortOnDrop,
};

/// How long a tool waits for what it started (an action's result, an executor Ready) before it
/// answers with the state so far: under kube-apiserver's 60 s limit on a request that is not a
/// watch, which would otherwise cut the answer off.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(45);

/// A tool's answer: its text (what a model reads), its structured content, and whether it
/// failed.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub text: String,
    pub structured: Option<Value>,
    pub is_error: bool,
}

impl Outcome {
    fn ok(text: String, structured: Value) -> Outcome {
        Outcome {
            text,
            structured: Some(structured),
            is_error: false,
        }
    }

    pub fn error(text: impl Into<String>) -> Outcome {
        Outcome {
            text: text.into(),
            structured: None,
            is_error: true,
        }
    }

    /// As `tools/call` answers it.
    pub fn result(&self) -> Value {
        let mut result = json!({
            "content": [{ "type": "text", "text": self.text }],
            "isError": self.is_error,
        });
        if let Some(structured) = &self.structured {
            result["structuredContent"] = structured.clone();
        }
        result
    }
}

/// Where a running action's prints go while it runs: MCP notifications on the call's own
/// stream (log messages, and progress when the call carried a token).
pub struct Relay {
    pub out: mpsc::Sender<Value>,
    pub progress_token: Option<Value>,
    sent: u64,
}

impl Relay {
    pub fn new(out: mpsc::Sender<Value>, progress_token: Option<Value>) -> Relay {
        Relay {
            out,
            progress_token,
            sent: 0,
        }
    }

    /// The notifications that relay `piece`.
    fn notifications(&mut self, piece: &Piece) -> Vec<Value> {
        let (logger, level, text) = match piece {
            Piece::Text { stream, text } => match stream {
                Stream::Stdout => ("stdout", "info", text.clone()),
                Stream::Stderr => ("stderr", "warning", text.clone()),
            },
            Piece::Cut { cut } => (
                "briq",
                "notice",
                format!(
                    "live output stops after {cut} characters; the result keeps its head and tail"
                ),
            ),
            Piece::End { .. } => return Vec::new(),
        };
        self.sent += 1;
        let mut out = vec![protocol::notification(
            "notifications/message",
            json!({ "level": level, "logger": logger, "data": text }),
        )];
        if let Some(token) = &self.progress_token {
            out.push(protocol::notification(
                "notifications/progress",
                json!({ "progressToken": token, "progress": self.sent, "message": text }),
            ));
        }
        out
    }
}

/// The name of the Execution that `user`'s `request_id` on `executor` makes: the same request
/// is the same object, so a retry finds the first one instead of running again.
pub fn execution_name(user: &str, executor: &str, request_id: &str) -> String {
    let digest = Sha256::digest(format!("{user}\n{executor}\n{request_id}"));
    let hash: String = digest.iter().take(10).map(|b| format!("{b:02x}")).collect();
    // 253 characters at most: the executor's name is shortened, the hash kept whole.
    let prefix: String = executor.chars().take(253 - 25).collect();
    format!("{}-mcp-{hash}", prefix.trim_end_matches(['-', '.']))
}

/// Why an Execution found under a request's name is not that request's: another user's, other
/// code, another executor.
pub fn not_the_same_request(
    found: &Execution,
    user: &str,
    executor: &str,
    code: &str,
    timeout_seconds: Option<u32>,
) -> Option<String> {
    let asked_by = found
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REQUESTED_BY_ANNOTATION));
    let name = found.metadata.name.as_deref().unwrap_or_default();
    if asked_by.map(String::as_str) != Some(user) {
        return Some(format!(
            "Execution {name} exists and was not made by this request; use another request_id"
        ));
    }
    let same = found.spec.executor_ref.name == executor
        && found.spec.code == code
        && found.spec.timeout_seconds == timeout_seconds;
    (!same).then(|| {
        format!(
            "request_id was already used for other code or another executor (Execution \
             {name}); a request_id names one action: use a new one"
        )
    })
}

/// The answer for `execution` (finished or not) of `request_id`.
pub fn execution_outcome(execution: &Execution, request_id: &str) -> Outcome {
    let name = execution.metadata.name.clone().unwrap_or_default();
    let status = execution.status.clone().unwrap_or_default();
    let succeeded = conditions::find(&status.conditions, SUCCEEDED);
    let finished = execution.finished();
    let mut structured = json!({
        "execution": name, "request_id": request_id, "finished": finished,
    });
    if !finished {
        let reason = succeeded.map(|c| c.reason.clone()).unwrap_or_default();
        structured["reason"] = json!(reason);
        let text = format!(
            "Execution {name} has not finished within {} s ({}); it goes on. Call run_python \
             again with request_id {request_id:?} and the same code to get its result.",
            ANSWER_WITHIN.as_secs(),
            if reason.is_empty() {
                "pending"
            } else {
                &reason
            }
        );
        return Outcome::ok(text, structured);
    }
    let condition = succeeded.expect("a finished Execution has Succeeded");
    let ok = condition.status == "True";
    structured["succeeded"] = json!(ok);
    structured["reason"] = json!(condition.reason);
    let mut text = String::new();
    if let Some(logs) = status.logs.as_deref().filter(|l| !l.is_empty()) {
        structured["logs"] = json!(logs);
        text.push_str(logs);
        if !logs.ends_with('\n') {
            text.push('\n');
        }
    }
    if let Some(output) = status.output.as_deref() {
        structured["output"] = json!(output);
        text.push_str(&format!("Out: {output}\n"));
    }
    if let Some(answer) = status
        .final_answer
        .as_deref()
        .filter(|_| status.is_final_answer)
    {
        structured["final_answer"] = json!(answer);
        text.push_str(&format!("Final answer: {answer}\n"));
    }
    if let Some(error) = &status.error {
        let mut object = json!({ "name": error.name, "message": error.message });
        if let Some(traceback) = &error.traceback {
            object["traceback"] = json!(traceback);
        }
        structured["error"] = object;
        text.push_str(&match &error.traceback {
            Some(traceback) => format!("{traceback}\n"),
            None => format!("{}: {}\n", error.name, error.message),
        });
    } else if !ok {
        text.push_str(&format!(
            "The action did not run to its end: {}: {}\n",
            condition.reason, condition.message
        ));
    }
    if status.truncated {
        structured["truncated"] = json!(true);
        text.push_str("(the output was cut to its budget, head and tail kept)\n");
    }
    if let Some(ms) = status.duration_millis {
        structured["duration_ms"] = json!(ms);
    }
    if text.is_empty() {
        text.push_str("(no output)\n");
    }
    Outcome {
        text,
        structured: Some(structured),
        is_error: !ok,
    }
}

/// What a model needs of an executor.
pub fn executor_state(executor: &BriqExecutor) -> Value {
    let status = executor.status.clone().unwrap_or_default();
    let ready = conditions::find(&status.conditions, READY);
    let mut state = json!({
        "name": executor.metadata.name.clone().unwrap_or_default(),
        "ready": ready.is_some_and(|c| c.status == "True") && !status.unusable,
        "reason": ready.map(|c| c.reason.clone()).unwrap_or_else(|| "Pending".into()),
        "message": ready.map(|c| c.message.clone()).unwrap_or_default(),
    });
    if status.unusable {
        state["reason"] = json!("Unusable");
        state["message"] = json!(status.unusable_reason.unwrap_or_default());
    }
    if let Some(class) = &executor.spec.class_name {
        state["class"] = json!(class);
    }
    if let Some(pool) = &executor.spec.pool_ref {
        state["pool"] = json!(pool.name);
    }
    if let Some(source) = &executor.spec.fork_from {
        state["forkedFrom"] = json!(source.name);
    }
    state
}

/// Whether `list_executors` shows `executor`: a pool's member is the pool's (claimed or not,
/// code runs in its claimer), so only the executors a caller can run code in are offered.
pub fn offered(executor: &BriqExecutor) -> bool {
    executor
        .metadata
        .annotations
        .as_ref()
        .is_none_or(|a| !a.contains_key(POOL_MEMBER_ANNOTATION))
}

fn state_line(state: &Value) -> String {
    let mark = if state["ready"] == true {
        "Ready"
    } else {
        "not ready"
    };
    let reason = state["reason"].as_str().unwrap_or_default();
    let message = state["message"].as_str().unwrap_or_default();
    let mut line = format!(
        "{}: {mark} ({reason})",
        state["name"].as_str().unwrap_or_default()
    );
    if !message.is_empty() && state["ready"] != true {
        line.push_str(&format!(": {message}"));
    }
    line
}

/// Whether `executor` has come to a state worth answering: Ready, or stuck for good.
fn settled(executor: &BriqExecutor) -> bool {
    let status = executor.status.clone().unwrap_or_default();
    conditions::is_true(&status.conditions, READY)
        || conditions::is_true(&status.conditions, STALLED)
        || status.unusable
}

fn api_error(what: &str, error: kube::Error) -> Outcome {
    match error {
        kube::Error::Api(status) => Outcome::error(format!("{what}: {}", status.message)),
        other => Outcome::error(format!("{what}: the API server did not answer: {other}")),
    }
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 409)
}

/// The caller's rights for `call`, each asked of the API server; the first refused one is the
/// answer.
pub async fn authorize<S: SandboxApi + 'static>(
    served: &Served<S>,
    user: &User,
    namespace: &str,
    rights: &[Right],
) -> Result<(), Outcome> {
    let asks = rights.iter().map(|right| async move {
        let request = Request {
            group: right.group,
            verb: right.verb,
            namespace,
            resource: right.resource,
            subresource: right.subresource,
            name: &right.name,
        };
        authorized(served, user, &request).await
    });
    for answer in futures::future::join_all(asks).await {
        if let Err(refusal) = answer {
            return Err(Outcome::error(format!(
                "{}: {}",
                refusal.reason, refusal.message
            )));
        }
    }
    Ok(())
}

/// Performs `call` for `user` in `namespace`, once each of its rights was confirmed.
pub async fn perform<S: SandboxApi + 'static>(
    served: &Served<S>,
    user: &User,
    namespace: &str,
    call: Call,
    relay: Option<Relay>,
) -> Outcome {
    if let Err(refused) = authorize(served, user, namespace, &call.rights()).await {
        return refused;
    }
    let client = served.keys.client().clone();
    let executors: Api<BriqExecutor> = Api::namespaced(client.clone(), namespace);
    let executions: Api<Execution> = Api::namespaced(client.clone(), namespace);
    match call {
        Call::CreateExecutor { name, pool, class } => {
            let mut spec = json!({});
            if let Some(pool) = pool {
                spec["poolRef"] = json!({ "name": pool });
            }
            if let Some(class) = class {
                spec["className"] = json!(class);
            }
            let mut metadata = json!({
                "annotations": { REQUESTED_BY_ANNOTATION: user.name },
            });
            match name {
                Some(name) => metadata["name"] = json!(name),
                None => metadata["generateName"] = json!("exec-"),
            }
            let object: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
                "metadata": metadata, "spec": spec,
            }))
            .expect("a BriqExecutor body");
            let dynamic: Api<DynamicObject> =
                Api::namespaced_with(client, namespace, &ApiResource::erase::<BriqExecutor>(&()));
            let created = match dynamic.create(&PostParams::default(), &object).await {
                Ok(created) => created,
                Err(error) => return api_error("creating the BriqExecutor", error),
            };
            let name = created.metadata.name.unwrap_or_default();
            let executor = tokio::time::timeout(
                ANSWER_WITHIN,
                await_condition(executors.clone(), &name, |e: Option<&BriqExecutor>| {
                    e.is_none_or(settled)
                }),
            )
            .await;
            let executor = match executor {
                Ok(Ok(Some(executor))) => executor,
                Ok(Ok(None)) => return Outcome::error(format!("BriqExecutor {name} was deleted")),
                _ => match executors.get(&name).await {
                    Ok(executor) => executor,
                    Err(error) => return api_error("reading the BriqExecutor", error),
                },
            };
            let state = executor_state(&executor);
            let text = if state["ready"] == true {
                format!("{}; run_python takes executor {name:?}", state_line(&state))
            } else {
                format!(
                    "{}; list_executors shows when it is Ready",
                    state_line(&state)
                )
            };
            Outcome::ok(text, state)
        }
        Call::ListExecutors => match executors.list(&ListParams::default()).await {
            Ok(list) => {
                let states: Vec<Value> = list
                    .items
                    .iter()
                    .filter(|e| offered(e))
                    .map(executor_state)
                    .collect();
                let text = if states.is_empty() {
                    format!("no executors in namespace {namespace}; create_executor makes one")
                } else {
                    states.iter().map(state_line).collect::<Vec<_>>().join("\n")
                };
                Outcome::ok(text, json!({ "executors": states }))
            }
            Err(error) => api_error("listing BriqExecutors", error),
        },
        Call::RunPython {
            executor,
            code,
            timeout_seconds,
            request_id,
        } => {
            let request_id =
                request_id.unwrap_or_else(|| format!("{:020x}", rand::random::<u128>() >> 48));
            run_python(
                served,
                user,
                RunRequest {
                    executors: &executors,
                    executions: &executions,
                    executor: &executor,
                    code: &code,
                    timeout_seconds,
                    request_id: &request_id,
                },
                relay,
            )
            .await
        }
        Call::ReadFile {
            executor,
            path,
            encoding,
        } => {
            let target = match transfer::target(&served.keys, namespace, &executor, &path).await {
                Ok(target) => target,
                Err(refusal) => return Outcome::error(refusal.message),
            };
            let mut reader =
                match Reader::open(served.sandboxes.clone(), target, MAX_FILE_BYTES).await {
                    Ok(reader) => reader,
                    Err(refusal) => return Outcome::error(refusal.message),
                };
            let mut bytes = Vec::with_capacity(reader.size as usize);
            while let Some(part) = reader.next().await {
                match part {
                    Ok(part) => bytes.extend_from_slice(&part),
                    Err(refusal) => return Outcome::error(refusal.message),
                }
            }
            let (size, sha256) = (reader.size, reader.sha256.clone());
            let content = match encoding {
                Encoding::Base64 => BASE64.encode(&bytes),
                Encoding::Text => match String::from_utf8(bytes) {
                    Ok(text) => text,
                    Err(_) => {
                        return Outcome::error(format!(
                            "{path} is not UTF-8 text; read it with encoding \"base64\""
                        ));
                    }
                },
            };
            let encoding = if encoding == Encoding::Text {
                "text"
            } else {
                "base64"
            };
            let text = match encoding {
                "text" => content.clone(),
                _ => format!("{path}: {size} bytes, base64 in structuredContent.content"),
            };
            Outcome::ok(
                text,
                json!({ "path": path, "size": size, "sha256": sha256, "encoding": encoding,
                        "content": content }),
            )
        }
        Call::WriteFile {
            executor,
            path,
            content,
        } => {
            let target = match transfer::target(&served.keys, namespace, &executor, &path).await {
                Ok(target) => target,
                Err(refusal) => return Outcome::error(refusal.message),
            };
            let body = futures::stream::once(async move {
                Ok::<_, std::convert::Infallible>(Bytes::from(content))
            });
            match transfer::write(served.sandboxes.as_ref(), &target, body, None).await {
                Ok(written) => Outcome::ok(
                    format!(
                        "wrote {} bytes to {}",
                        written.size.unwrap_or_default(),
                        written.path
                    ),
                    json!({ "path": written.path, "size": written.size, "sha256": written.sha256 }),
                ),
                Err(refusal) => Outcome::error(refusal.message),
            }
        }
        Call::CancelExecutor { executor } => {
            let params = ListParams::default().fields(&format!("spec.executorRef.name={executor}"));
            // One LIST: which are still queued or running is in their status.
            let pending: Vec<String> = match executions.list(&params).await {
                Ok(list) => list
                    .items
                    .into_iter()
                    .filter(|e| !e.finished() && !e.spec.cancel)
                    .filter_map(|e| e.metadata.name)
                    .collect(),
                Err(error) => return api_error("listing the executor's Executions", error),
            };
            let mut cancelled = Vec::new();
            for name in pending {
                if let Err(error) = cancel(&executions, &name).await {
                    return api_error(&format!("cancelling Execution {name}"), error);
                }
                cancelled.push(name);
            }
            let text = if cancelled.is_empty() {
                format!("nothing of {executor} was running or queued")
            } else {
                format!("cancel requested: {}", cancelled.join(", "))
            };
            Outcome::ok(text, json!({ "cancelled": cancelled }))
        }
        Call::CancelExecution { execution } => match executions.get_opt(&execution).await {
            Ok(Some(found)) if found.finished() => Outcome::ok(
                format!("Execution {execution} had already finished"),
                json!({ "cancelled": [] }),
            ),
            Ok(Some(_)) => match cancel(&executions, &execution).await {
                Ok(()) => Outcome::ok(
                    format!("cancel requested: {execution}"),
                    json!({ "cancelled": [execution] }),
                ),
                Err(error) => api_error("cancelling the Execution", error),
            },
            Ok(None) => Outcome::error(format!("Execution {execution} not found")),
            Err(error) => api_error("reading the Execution", error),
        },
        Call::ForkExecutor { executor, count } => {
            let source = match executors.get_opt(&executor).await {
                Ok(Some(source)) => source,
                Ok(None) => return Outcome::error(format!("BriqExecutor {executor} not found")),
                Err(error) => return api_error("reading the BriqExecutor", error),
            };
            let mut fork = source.fork();
            fork.metadata.annotations =
                Some([(REQUESTED_BY_ANNOTATION.to_owned(), user.name.clone())].into());
            let mut forks = Vec::new();
            for _ in 0..count {
                match executors.create(&PostParams::default(), &fork).await {
                    Ok(created) => forks.push(created.metadata.name.unwrap_or_default()),
                    Err(error) => {
                        let made = forks.len();
                        return api_error(
                            &format!("creating fork {} of {count} (made: {forks:?})", made + 1),
                            error,
                        );
                    }
                }
            }
            Outcome::ok(
                format!(
                    "{} fork(s) of {executor}: {}; each is Ready with {executor}'s state within \
                     seconds (list_executors)",
                    forks.len(),
                    forks.join(", ")
                ),
                json!({ "forks": forks }),
            )
        }
        Call::DeleteExecutor { executor } => {
            match executors.delete(&executor, &DeleteParams::default()).await {
                Ok(_) => Outcome::ok(
                    format!("BriqExecutor {executor} is being deleted; its sandbox is destroyed"),
                    json!({ "deleted": executor }),
                ),
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    Outcome::error(format!("BriqExecutor {executor} not found"))
                }
                Err(error) => api_error("deleting the BriqExecutor", error),
            }
        }
    }
}

async fn cancel(executions: &Api<Execution>, name: &str) -> Result<(), kube::Error> {
    let patch = Patch::Merge(json!({ "spec": { "cancel": true } }));
    executions
        .patch(name, &PatchParams::default(), &patch)
        .await
        .map(|_| ())
}

struct RunRequest<'a> {
    executors: &'a Api<BriqExecutor>,
    executions: &'a Api<Execution>,
    executor: &'a str,
    code: &'a str,
    timeout_seconds: Option<u32>,
    request_id: &'a str,
}

/// One action as an Execution named by its request: created (or found, when the request was
/// made before), its prints relayed while it runs, its result answered.
async fn run_python<S: SandboxApi + 'static>(
    served: &Served<S>,
    user: &User,
    run: RunRequest<'_>,
    relay: Option<Relay>,
) -> Outcome {
    let started = Instant::now();
    let executor = match run.executors.get_opt(run.executor).await {
        Ok(Some(executor)) => executor,
        Ok(None) => {
            return Outcome::error(format!(
                "BriqExecutor {} not found; list_executors shows the namespace's executors",
                run.executor
            ));
        }
        Err(error) => return api_error("reading the BriqExecutor", error),
    };
    let name = execution_name(&user.name, run.executor, run.request_id);
    let mut spec = json!({ "executorRef": { "name": run.executor }, "code": run.code });
    if let Some(seconds) = run.timeout_seconds {
        spec["timeoutSeconds"] = json!(seconds);
    }
    let body: Execution = serde_json::from_value(json!({
        "apiVersion": "briq.cloud/v1alpha1", "kind": "Execution",
        "metadata": {
            "name": name,
            "annotations": {
                REQUESTED_BY_ANNOTATION: user.name,
                MCP_REQUEST_ID_ANNOTATION: run.request_id,
            },
            // Part of the executor's history from the start, as every client's Executions are.
            "ownerReferences": [{
                "apiVersion": "briq.cloud/v1alpha1", "kind": "BriqExecutor",
                "name": run.executor, "uid": executor.metadata.uid,
            }],
        },
        "spec": spec,
    }))
    .expect("an Execution body");
    let execution = match run.executions.create(&PostParams::default(), &body).await {
        Ok(created) => created,
        Err(error) if is_conflict(&error) => match run.executions.get_opt(&name).await {
            Ok(Some(found)) => {
                if let Some(why) = not_the_same_request(
                    &found,
                    &user.name,
                    run.executor,
                    run.code,
                    run.timeout_seconds,
                ) {
                    return Outcome::error(why);
                }
                found
            }
            Ok(None) => {
                return Outcome::error(format!(
                    "Execution {name} of this request_id was deleted while it was looked up; \
                     whether it ran is not known: use a new request_id to run the code again"
                ));
            }
            Err(error) => return api_error("reading the request's Execution", error),
        },
        Err(error) => return api_error("creating the Execution", error),
    };
    let remaining = ANSWER_WITHIN.saturating_sub(started.elapsed());
    if let Some(relay) = relay.filter(|_| !execution.finished()) {
        // The prints, relayed until the action's end is in its status (the log's End comes
        // only then) or the answer is due.
        let _ =
            tokio::time::timeout(remaining, relay_output(served, execution.clone(), relay)).await;
    }
    let remaining = ANSWER_WITHIN.saturating_sub(started.elapsed());
    let finished = tokio::time::timeout(
        remaining,
        await_condition(run.executions.clone(), &name, |e: Option<&Execution>| {
            e.is_none_or(Execution::finished)
        }),
    )
    .await;
    match finished {
        Ok(Ok(Some(done))) => execution_outcome(&done, run.request_id),
        Ok(Ok(None)) => Outcome::error(format!(
            "Execution {name} was deleted before it reported a result; whether its code ran is \
             not known"
        )),
        Ok(Err(error)) => Outcome::error(format!("watching Execution {name}: {error}")),
        Err(_) => match run.executions.get_opt(&name).await {
            Ok(Some(now)) => execution_outcome(&now, run.request_id),
            _ => execution_outcome(&execution, run.request_id),
        },
    }
}

async fn relay_output<S: SandboxApi + 'static>(
    served: &Served<S>,
    execution: Execution,
    mut relay: Relay,
) {
    let (out, mut batches) = mpsc::channel::<Vec<Piece>>(8);
    let producer = tokio::spawn(log::produce(
        served.keys.clone(),
        served.sandboxes.clone(),
        served.readers.clone(),
        execution,
        true,
        out,
    ));
    let _abort = AbortOnDrop(producer);
    while let Some(batch) = batches.recv().await {
        for piece in &batch {
            if matches!(piece, Piece::End { .. }) {
                return;
            }
            for notification in relay.notifications(piece) {
                // A client that stopped reading stops the relay, never the action.
                if relay.out.send(notification).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn execution(status: Value) -> Execution {
        serde_json::from_value(json!({
            "apiVersion": "briq.cloud/v1alpha1", "kind": "Execution",
            "metadata": { "name": "py-mcp-1", "annotations": {
                REQUESTED_BY_ANNOTATION: "alice" } },
            "spec": { "executorRef": { "name": "py" }, "code": "print(1)\n1 + 1" },
            "status": status,
        }))
        .unwrap()
    }

    fn succeeded(status: &str, reason: &str, message: &str) -> Value {
        json!([{ "type": "Succeeded", "status": status, "reason": reason, "message": message,
                 "lastTransitionTime": "2026-12-08T00:00:00Z" }])
    }

    #[test]
    fn a_finished_action_answers_its_prints_value_and_error() {
        let done = execution(json!({
            "conditions": succeeded("True", "Succeeded", ""),
            "logs": "1\n", "output": "2", "durationMillis": 12,
        }));
        assert_eq!(
            execution_outcome(&done, "r1"),
            Outcome {
                text: "1\nOut: 2\n".into(),
                structured: Some(json!({
                    "execution": "py-mcp-1", "request_id": "r1", "finished": true,
                    "succeeded": true, "reason": "Succeeded", "logs": "1\n", "output": "2",
                    "duration_ms": 12,
                })),
                is_error: false,
            }
        );
        let raised = execution(json!({
            "conditions": succeeded("False", "CodeError", "ZeroDivisionError"),
            "error": { "name": "ZeroDivisionError", "message": "division by zero",
                       "traceback": "Traceback …\nZeroDivisionError: division by zero" },
        }));
        let outcome = execution_outcome(&raised, "r2");
        assert!(outcome.is_error);
        assert_eq!(
            outcome.text,
            "Traceback …\nZeroDivisionError: division by zero\n"
        );
        assert_eq!(
            outcome.structured.unwrap()["error"]["name"],
            "ZeroDivisionError"
        );
        let refused = execution(json!({
            "conditions": succeeded("False", "ExecutorUnusable", "its kernel died"),
        }));
        assert_eq!(
            execution_outcome(&refused, "r3").text,
            "The action did not run to its end: ExecutorUnusable: its kernel died\n"
        );
    }

    #[test]
    fn an_action_still_running_is_answered_with_how_to_get_its_result() {
        let running = execution(json!({
            "conditions": succeeded("Unknown", "Running", ""),
        }));
        let outcome = execution_outcome(&running, "step-9");
        assert!(!outcome.is_error);
        assert_eq!(
            outcome.structured,
            Some(
                json!({ "execution": "py-mcp-1", "request_id": "step-9", "finished": false,
                         "reason": "Running" })
            )
        );
        assert!(
            outcome.text.contains("request_id \"step-9\""),
            "{}",
            outcome.text
        );
    }

    #[test]
    fn a_request_names_one_execution_per_user_and_executor() {
        let name = execution_name("alice", "py", "r1");
        assert_eq!(name, execution_name("alice", "py", "r1"));
        assert_ne!(name, execution_name("bob", "py", "r1"));
        assert_ne!(name, execution_name("alice", "py2", "r1"));
        assert_ne!(name, execution_name("alice", "py", "r2"));
        assert!(name.starts_with("py-mcp-") && name.len() == "py-mcp-".len() + 20);
        let long = execution_name("alice", &"a".repeat(253), "r1");
        assert_eq!(long.len(), 253);
    }

    #[test]
    fn a_request_id_reused_for_other_code_or_by_another_user_is_refused() {
        let found = execution(json!({}));
        assert_eq!(
            not_the_same_request(&found, "alice", "py", "print(1)\n1 + 1", None),
            None
        );
        for (user, executor, code, timeout) in [
            ("mallory", "py", "print(1)\n1 + 1", None),
            ("alice", "py", "import os", None),
            ("alice", "py2", "print(1)\n1 + 1", None),
            ("alice", "py", "print(1)\n1 + 1", Some(5)),
        ] {
            assert!(
                not_the_same_request(&found, user, executor, code, timeout).is_some(),
                "{user} {executor} {code} {timeout:?}"
            );
        }
    }

    #[test]
    fn prints_are_relayed_as_log_messages_and_as_progress_when_asked() {
        let (out, _rx) = mpsc::channel(1);
        let mut relay = Relay::new(out, Some(json!("tok")));
        let piece = Piece::Text {
            stream: Stream::Stderr,
            text: "warn\n".into(),
        };
        assert_eq!(
            relay.notifications(&piece),
            vec![
                json!({ "jsonrpc": "2.0", "method": "notifications/message",
                        "params": { "level": "warning", "logger": "stderr", "data": "warn\n" } }),
                json!({ "jsonrpc": "2.0", "method": "notifications/progress",
                        "params": { "progressToken": "tok", "progress": 1, "message": "warn\n" } }),
            ]
        );
        let (out, _rx) = mpsc::channel(1);
        let mut quiet = Relay::new(out, None);
        assert_eq!(quiet.notifications(&piece).len(), 1);
        assert!(
            quiet
                .notifications(&Piece::End { end: "done".into() })
                .is_empty()
        );
    }

    #[test]
    fn a_pools_members_are_not_offered_their_claimers_are() {
        let executor = |annotations: Value| -> BriqExecutor {
            serde_json::from_value(json!({
                "metadata": { "name": "x", "annotations": annotations }, "spec": {},
            }))
            .unwrap()
        };
        assert!(offered(&executor(json!({}))));
        assert!(offered(&executor(
            json!({ "briq.cloud/claimed-member": "warm-1" })
        )));
        assert!(!offered(&executor(
            json!({ POOL_MEMBER_ANNOTATION: "warm" })
        )));
    }

    #[test]
    fn an_executor_is_described_by_its_ready_condition() {
        let executor: BriqExecutor = serde_json::from_value(json!({
            "metadata": { "name": "py" },
            "spec": { "poolRef": { "name": "warm" } },
            "status": { "conditions": [{ "type": "Ready", "status": "False",
                "reason": "Provisioning", "message": "installing the bridge",
                "lastTransitionTime": "2026-12-08T00:00:00Z" }] },
        }))
        .unwrap();
        assert_eq!(
            executor_state(&executor),
            json!({ "name": "py", "ready": false, "reason": "Provisioning",
                    "message": "installing the bridge", "pool": "warm" })
        );
        assert_eq!(
            state_line(&executor_state(&executor)),
            "py: not ready (Provisioning): installing the bridge"
        );
    }
}
