//! The previous release's REST surface (`/v1/sandboxes…`), served only with
//! [`super::Config::legacy_rest`]: the upgrade test runs the previous release's operator, which
//! speaks it, next to this tree's, which speaks MCP, on the same sandboxes.

mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::faults::Operation;
use super::http::{
    ApiError, RequestId, code_of_status, dropped_connection, status_of_code, with_retry_after,
};
use super::perform::{Call, Surface, perform};
use super::sandbox_io::{self, Command};
use super::state::Shared;
use briq_operator::briq::api::{ErrorCode, MAX_EXEC_TIMEOUT, SandboxState};
use wire::{
    CreateSandbox, ErrorBody, ErrorDetail, ExecBody, ExecOutput, FileContent, FileQuery, ListQuery,
    PreviewAnswer, SandboxList, WriteFileAnswer, paths,
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

/// An error answer in the REST surface's shape (the admin API's too).
pub(crate) fn error_response(error: ApiError, request_id: Option<&RequestId>) -> Response {
    let body = ErrorBody {
        error: ErrorDetail {
            code: error.code,
            message: error.message,
            request_id: request_id.map(|id| id.0.clone()),
        },
    };
    (error.status, Json(body)).into_response()
}

/// The REST surface's wording of errors and faults: every error is a status with the error body.
struct Rest(RequestId);

impl Surface for Rest {
    type Error = ApiError;

    fn error(&self, error: ApiError) -> Response {
        error_response(error, Some(&self.0))
    }

    fn internal(&self, message: String) -> ApiError {
        ApiError::internal(message)
    }

    fn status(
        &self,
        status: StatusCode,
        code: Option<ErrorCode>,
        retry_after: Option<u64>,
    ) -> Response {
        let code = code.unwrap_or_else(|| code_of_status(status));
        let error = ApiError::new(status, code, "injected fault");
        with_retry_after(self.error(error), retry_after)
    }

    fn tool_error(&self, code: ErrorCode) -> Response {
        self.error(ApiError::new(status_of_code(code), code, "injected fault"))
    }

    fn json_rpc_error(&self, code: i64) -> Response {
        let code = ErrorCode::of_json_rpc(code);
        self.error(ApiError::new(status_of_code(code), code, "injected fault"))
    }

    fn cut_stream(&self) -> Response {
        dropped_connection()
    }
}

/// Performs one REST call under the fault rules.
async fn performed<F>(
    shared: &Shared,
    rid: RequestId,
    operation: Operation,
    sandbox_id: Option<&str>,
    request: &str,
    effect: F,
) -> Response
where
    F: Future<Output = Result<Response, ApiError>> + Send + 'static,
{
    let call = Call::new(operation, sandbox_id, request);
    perform(shared, &Rest(rid), call, effect).await
}

/// [`performed`] for a call on sandbox `id` whose body no error page echoes (only exec's is):
/// the effect is given the server and the id.
async fn on_sandbox<F, Fut>(
    (State(shared), Extension(rid)): Ctx,
    operation: Operation,
    id: String,
    effect: F,
) -> Response
where
    F: FnOnce(Arc<Shared>, String) -> Fut,
    Fut: Future<Output = Result<Response, ApiError>> + Send + 'static,
{
    let on = id.clone();
    let effect = effect(Arc::clone(&shared), id);
    performed(&shared, rid, operation, Some(&on), "", effect).await
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
    performed(&shared, rid, Operation::Create, None, "", async move {
        let sandbox = inner.create(json_body(body)?.into(), false).await?;
        Ok((StatusCode::CREATED, Json(wire::Sandbox::from(sandbox))).into_response())
    })
    .await
}

async fn list(
    (State(shared), Extension(rid)): Ctx,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let inner = Arc::clone(&shared);
    performed(&shared, rid, Operation::List, None, "", async move {
        let Query(query) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
        let sandboxes = inner
            .list(false)
            .into_iter()
            .filter(|s| query.name.as_ref().is_none_or(|name| &s.name == name))
            .map(wire::Sandbox::from)
            .collect();
        Ok(Json(SandboxList { sandboxes }).into_response())
    })
    .await
}

async fn get_one(ctx: Ctx, Path(id): Path<String>) -> Response {
    on_sandbox(ctx, Operation::Get, id, async move |inner, id| {
        let sandbox = inner.entry(&id)?.snapshot();
        Ok(Json(wire::Sandbox::from(sandbox)).into_response())
    })
    .await
}

async fn destroy(ctx: Ctx, Path(id): Path<String>) -> Response {
    on_sandbox(ctx, Operation::Destroy, id, async move |inner, id| {
        inner.destroy(&id).await?;
        Ok(StatusCode::NO_CONTENT.into_response())
    })
    .await
}

/// Stop: processes end, files stay; idempotent.
async fn stop(ctx: Ctx, Path(id): Path<String>) -> Response {
    on_sandbox(ctx, Operation::Stop, id, async move |inner, id| {
        let stopped = inner.kill_processes(&id, SandboxState::Stopped).await?;
        Ok(Json(wire::Sandbox::from(stopped)).into_response())
    })
    .await
}

/// Start: runs again with its files; idempotent.
async fn start(ctx: Ctx, Path(id): Path<String>) -> Response {
    on_sandbox(ctx, Operation::Start, id, async move |inner, id| {
        Ok(Json(wire::Sandbox::from(inner.start(&id)?)).into_response())
    })
    .await
}

async fn exec(
    (State(shared), Extension(rid)): Ctx,
    Path(id): Path<String>,
    body: Result<Json<ExecBody>, JsonRejection>,
) -> Response {
    let request = body
        .as_ref()
        .ok()
        .and_then(|Json(body)| serde_json::to_string(body).ok())
        .unwrap_or_default();
    let inner = Arc::clone(&shared);
    let on = id.clone();
    performed(
        &shared,
        rid,
        Operation::Exec,
        Some(&on),
        &request,
        async move {
            let body = json_body(body)?;
            let timeout = Duration::from_secs(body.timeout_seconds);
            if timeout.is_zero() || timeout > MAX_EXEC_TIMEOUT {
                return Err(ApiError::invalid(format!(
                    "timeout_seconds must be 1 to {}",
                    MAX_EXEC_TIMEOUT.as_secs()
                )));
            }
            let command = Command {
                argv: body.argv,
                cwd: body.cwd.unwrap_or_else(|| "/".to_owned()),
                env: body.env,
                stdin: body.stdin,
                timeout,
                tell_root: false,
            };
            let output = sandbox_io::exec(&inner, &id, command).await?;
            Ok(Json(ExecOutput::from(output)).into_response())
        },
    )
    .await
}

async fn write_file(
    ctx: Ctx,
    Path(id): Path<String>,
    body: Result<Json<FileContent>, JsonRejection>,
) -> Response {
    on_sandbox(ctx, Operation::WriteFile, id, async move |inner, id| {
        let body = json_body(body)?;
        let content = BASE64
            .decode(&body.content_base64)
            .map_err(|e| ApiError::invalid(format!("content_base64: {e}")))?;
        let written = sandbox_io::write_file(&inner, &id, &body.path, &content).await?;
        Ok(Json(WriteFileAnswer {
            path: body.path,
            size: written.size,
            sha256: written.sha256,
        })
        .into_response())
    })
    .await
}

async fn read_file(
    ctx: Ctx,
    Path(id): Path<String>,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Response {
    on_sandbox(ctx, Operation::ReadFile, id, async move |inner, id| {
        let Query(query) = query.map_err(|e| ApiError::invalid(e.body_text()))?;
        let content = sandbox_io::read_file(&inner, &id, &query.path).await?;
        Ok(Json(FileContent {
            content_base64: BASE64.encode(&content),
            path: query.path,
        })
        .into_response())
    })
    .await
}

/// Counted as a get: the tools have no preview, and a preview only reads the sandbox.
async fn preview(ctx: Ctx, path: Result<Path<(String, u16)>, PathRejection>) -> Response {
    let (id, port) = match path {
        Ok(Path(values)) => values,
        Err(e) => return error_response(ApiError::invalid(e.body_text()), Some(&ctx.1.0)),
    };
    on_sandbox(ctx, Operation::Get, id, async move |inner, id| {
        let entry = inner.entry(&id)?;
        entry.wake()?;
        // Sandbox processes are host processes: their ports are the host's.
        let url = format!("http://{}/", SocketAddr::new(inner.preview_host, port));
        Ok(Json(PreviewAnswer { url }).into_response())
    })
    .await
}
