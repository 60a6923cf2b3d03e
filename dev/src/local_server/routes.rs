//! The briq API routes, served from the same paths and wire types the client uses.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use sha2::{Digest as _, Sha256};

use super::faults::{Fault, Operation};
use super::http::{
    ApiError, RequestId, dropped_connection, echo_page, echo_request_page, malformed_json,
};
use super::paths::resolve;
use super::process::{self, CommandSpec};
use super::state::Shared;
use briq_operator::bridge::NONCE_ENV;
use briq_operator::briq::api::{
    CreateSandbox, ExecBody, FileContent, FileQuery, ListQuery, MAX_EXEC_TIMEOUT, MAX_FILE_BYTES,
    PreviewAnswer, SandboxList, SandboxState, WriteFileAnswer, paths,
};

type Ctx = (State<Arc<Shared>>, Extension<RequestId>);

pub(crate) fn router() -> Router<Arc<Shared>> {
    Router::new()
        .route(paths::SANDBOXES, post(create).get(list))
        .route(paths::SANDBOX, get(get_one).delete(destroy))
        .route(paths::EXEC, post(exec))
        .route(paths::FILES, get(read_file).put(write_file))
        .route(paths::PREVIEW, get(preview))
        .route(paths::STOP, post(stop))
        .route(paths::START, post(start))
}

/// Counts the call, applies a pending fault, and runs `effect` in its own task so that it
/// completes even when the client hangs up, as it would on a real server. Faults named
/// `…AfterEffect` break the answer only after the operation was performed (whether it succeeded
/// or failed).
async fn perform<F>(
    shared: &Shared,
    request_id: &RequestId,
    operation: Operation,
    sandbox_id: Option<String>,
    effect: F,
) -> Response
where
    F: Future<Output = Result<Response, ApiError>> + Send + 'static,
{
    perform_echoing(shared, request_id, operation, sandbox_id, None, effect).await
}

/// [`perform`], with the request's body as text, which a gateway's page may echo
/// ([`Fault::EchoRequest`]).
async fn perform_echoing<F>(
    shared: &Shared,
    request_id: &RequestId,
    operation: Operation,
    sandbox_id: Option<String>,
    request: Option<String>,
    effect: F,
) -> Response
where
    F: Future<Output = Result<Response, ApiError>> + Send + 'static,
{
    let fault = shared.faults.record(operation, sandbox_id.as_deref());
    let delay = match &fault {
        Some(Fault::Status {
            status,
            code,
            retry_after_seconds,
        }) => {
            return ApiError::injected(*status, *code, *retry_after_seconds)
                .respond(Some(request_id));
        }
        Some(Fault::DropConnection) => return dropped_connection(),
        Some(Fault::EchoPage { echo_status }) => {
            return echo_page(*echo_status, shared.api_key.expose());
        }
        Some(Fault::EchoRequest {
            echo_request_status,
        }) => {
            return echo_request_page(*echo_request_status, request.as_deref().unwrap_or(""));
        }
        Some(Fault::Delay { delay_ms }) => Duration::from_millis(*delay_ms),
        _ => Duration::ZERO,
    };
    let outcome = tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        effect.await
    })
    .await
    .unwrap_or_else(|e| Err(ApiError::internal(format!("operation failed: {e}"))));
    if let Some(status) = shared.faults.outage() {
        // The gateway went down while the operation ran: performed, answered with the outage.
        return ApiError::injected(status, None, None).respond(Some(request_id));
    }
    match (fault, outcome) {
        (Some(Fault::DropAfterEffect), _) => dropped_connection(),
        (
            Some(Fault::StatusAfterEffect {
                status_after_effect,
            }),
            _,
        ) => ApiError::injected(status_after_effect, None, None).respond(Some(request_id)),
        (
            Some(Fault::HangAfterEffect {
                hang_after_effect_ms,
            }),
            _,
        ) => {
            tokio::time::sleep(Duration::from_millis(hang_after_effect_ms)).await;
            dropped_connection()
        }
        (Some(Fault::MalformedJson), Ok(_)) => malformed_json(),
        (_, Ok(response)) => response,
        (_, Err(error)) => error.respond(Some(request_id)),
    }
}

fn json_body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(body)| body)
        .map_err(|e| ApiError::invalid(e.body_text()))
}

async fn create(
    (State(shared), Extension(rid)): Ctx,
    body: Result<Json<CreateSandbox>, JsonRejection>,
) -> Response {
    let inner = Arc::clone(&shared);
    perform(&shared, &rid, Operation::Create, None, async move {
        let sandbox = inner.create(json_body(body)?).await?;
        Ok((StatusCode::CREATED, Json(sandbox)).into_response())
    })
    .await
}

async fn list(
    (State(shared), Extension(rid)): Ctx,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let inner = Arc::clone(&shared);
    perform(&shared, &rid, Operation::List, None, async move {
        let Query(query) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
        let sandboxes = inner.list(query.name.as_deref());
        Ok(Json(SandboxList { sandboxes }).into_response())
    })
    .await
}

async fn get_one((State(shared), Extension(rid)): Ctx, Path(id): Path<String>) -> Response {
    let inner = Arc::clone(&shared);
    perform(
        &shared,
        &rid,
        Operation::Get,
        Some(id.clone()),
        async move { Ok(Json(inner.entry(&id)?.snapshot()).into_response()) },
    )
    .await
}

async fn destroy((State(shared), Extension(rid)): Ctx, Path(id): Path<String>) -> Response {
    let inner = Arc::clone(&shared);
    perform(
        &shared,
        &rid,
        Operation::Destroy,
        Some(id.clone()),
        async move {
            inner.destroy(&id).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        },
    )
    .await
}

/// Stop: processes end, files stay; idempotent.
async fn stop((State(shared), Extension(rid)): Ctx, Path(id): Path<String>) -> Response {
    let inner = Arc::clone(&shared);
    perform(
        &shared,
        &rid,
        Operation::Stop,
        Some(id.clone()),
        async move {
            let stopped = inner.kill_processes(&id, SandboxState::Stopped).await?;
            Ok(Json(stopped).into_response())
        },
    )
    .await
}

/// Start: runs again with its files; idempotent.
async fn start((State(shared), Extension(rid)): Ctx, Path(id): Path<String>) -> Response {
    let inner = Arc::clone(&shared);
    perform(
        &shared,
        &rid,
        Operation::Start,
        Some(id.clone()),
        async move { Ok(Json(inner.start(&id)?).into_response()) },
    )
    .await
}

async fn exec(
    (State(shared), Extension(rid)): Ctx,
    Path(id): Path<String>,
    body: Result<Json<ExecBody>, JsonRejection>,
) -> Response {
    let inner = Arc::clone(&shared);
    let request = body
        .as_ref()
        .ok()
        .and_then(|Json(body)| serde_json::to_string(body).ok());
    perform_echoing(
        &shared,
        &rid,
        Operation::Exec,
        Some(id.clone()),
        request,
        async move {
            let body = json_body(body)?;
            let timeout = Duration::from_secs(body.timeout_seconds);
            if body.argv.is_empty() {
                return Err(ApiError::invalid("argv is empty"));
            }
            if timeout.is_zero() || timeout > MAX_EXEC_TIMEOUT {
                return Err(ApiError::invalid(format!(
                    "timeout_seconds must be 1 to {}",
                    MAX_EXEC_TIMEOUT.as_secs()
                )));
            }
            let entry = inner.entry(&id)?;
            entry.wake()?;
            let cwd = resolve(&entry.fs, body.cwd.as_deref().unwrap_or("/"))
                .map_err(|e| ApiError::invalid(e.to_string()))?;
            tokio::fs::create_dir_all(&cwd)
                .await
                .map_err(|e| ApiError::invalid(format!("cannot create cwd: {e}")))?;
            let output = match &inner.simulator {
                Some(simulator) => {
                    let nonce = body.env.get(NONCE_ENV).map(String::as_str);
                    let stdin = body.stdin.as_deref();
                    simulator
                        .exec(&entry.simulated, &cwd, &body.argv, nonce, stdin, timeout)
                        .await
                }
                None => {
                    let command = CommandSpec {
                        argv: body.argv,
                        cwd,
                        env: entry.command_env(&inner, &body.env),
                        stdin: body.stdin,
                        timeout,
                    };
                    process::run(command, || !entry.is_destroyed()).await
                }
            };
            Ok(Json(output).into_response())
        },
    )
    .await
}

async fn write_file(
    (State(shared), Extension(rid)): Ctx,
    Path(id): Path<String>,
    body: Result<Json<FileContent>, JsonRejection>,
) -> Response {
    let inner = Arc::clone(&shared);
    perform(
        &shared,
        &rid,
        Operation::WriteFile,
        Some(id.clone()),
        async move {
            let body = json_body(body)?;
            let content = body
                .content()
                .map_err(|e| ApiError::invalid(format!("content_base64: {e}")))?;
            if content.len() > MAX_FILE_BYTES {
                return Err(ApiError::invalid(format!(
                    "file is {} bytes, the limit is {MAX_FILE_BYTES}",
                    content.len()
                )));
            }
            let entry = inner.entry(&id)?;
            entry.wake()?;
            let host =
                resolve(&entry.fs, &body.path).map_err(|e| ApiError::invalid(e.to_string()))?;
            if let Some(parent) = host.parent() {
                tokio::fs::create_dir_all(parent).await.map_err(|e| {
                    ApiError::invalid(format!("cannot create parent directory: {e}"))
                })?;
            }
            tokio::fs::write(&host, &content)
                .await
                .map_err(|e| ApiError::invalid(format!("cannot write {}: {e}", body.path)))?;
            Ok(Json(WriteFileAnswer {
                path: body.path,
                size: content.len() as u64,
                sha256: format!("{:x}", Sha256::digest(&content)),
            })
            .into_response())
        },
    )
    .await
}

async fn read_file(
    (State(shared), Extension(rid)): Ctx,
    Path(id): Path<String>,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Response {
    let inner = Arc::clone(&shared);
    perform(
        &shared,
        &rid,
        Operation::ReadFile,
        Some(id.clone()),
        async move {
            let Query(query) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
            let entry = inner.entry(&id)?;
            entry.wake()?;
            let host =
                resolve(&entry.fs, &query.path).map_err(|e| ApiError::invalid(e.to_string()))?;
            let metadata = tokio::fs::metadata(&host)
                .await
                .map_err(|_| ApiError::not_found(format!("no file {}", query.path)))?;
            if !metadata.is_file() {
                return Err(ApiError::invalid(format!("{} is not a file", query.path)));
            }
            if metadata.len() > MAX_FILE_BYTES as u64 {
                return Err(ApiError::invalid(format!(
                    "{} is {} bytes, the limit is {MAX_FILE_BYTES}",
                    query.path,
                    metadata.len()
                )));
            }
            let content = tokio::fs::read(&host)
                .await
                .map_err(|e| ApiError::invalid(format!("cannot read {}: {e}", query.path)))?;
            Ok(Json(FileContent::new(&query.path, &content)).into_response())
        },
    )
    .await
}

async fn preview(
    (State(shared), Extension(rid)): Ctx,
    path: Result<Path<(String, u16)>, PathRejection>,
) -> Response {
    let (id, port) = match path {
        Ok(Path(values)) => values,
        Err(e) => return ApiError::invalid(e.body_text()).respond(Some(&rid)),
    };
    let inner = Arc::clone(&shared);
    perform(
        &shared,
        &rid,
        Operation::Preview,
        Some(id.clone()),
        async move {
            let entry = inner.entry(&id)?;
            entry.wake()?;
            // Sandbox processes are host processes: their ports are the host's.
            let url = format!("http://{}/", SocketAddr::new(inner.preview_host, port));
            Ok(Json(PreviewAnswer { url }).into_response())
        },
    )
    .await
}
