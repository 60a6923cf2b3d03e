//! The aggregated API's HTTPS server: every connection must present a client certificate the
//! front-proxy CA signed (others are refused at the handshake), its common name must be one
//! the API server allows, and each request on a subresource is authorized for the user the
//! front proxy names. Errors are `Status` objects, as kubectl reads them.

use std::{sync::Arc, time::Duration};

use axum::{
    Extension, Json, Router,
    body::Body,
    extract::{Path, Query, RawQuery, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use bytes::Bytes;
use kube::Api;
use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::WebPkiClientVerifier,
};
use serde_json::json;
use tokio::{net::TcpListener, sync::mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;

use super::{
    authorize::{self, Request},
    discovery::{self, GROUP, VERSION},
    files::{self, MAX_FILE_BYTES, Refusal, SHA256_HEADER, Upload},
    front_proxy::{FrontProxy, User},
    live::Readers,
    log,
};
use crate::{
    bridge::{files::WRITE_PART_BYTES, session::Session},
    briq::{ApiKey, SandboxApi},
    controller::ExecutorKeys,
    crd::{BriqExecutor, Execution},
};

/// How long a client may take over the TLS handshake.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
/// The pause after a failed accept.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Where and as whom the aggregated API serves.
pub struct Serving {
    pub listener: TcpListener,
    /// The serving certificate chain and its key (PEM), valid for the Service's name
    /// (`<service>.<namespace>.svc`), which the `APIService` names.
    pub cert_pem: String,
    pub key_pem: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the serving certificate or key: {0}")]
    Pem(String),
    #[error("the front proxy's CA: {0}")]
    FrontProxyCa(String),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
}

struct Served<S> {
    keys: Arc<ExecutorKeys<S>>,
    sandboxes: Arc<S>,
    proxy: FrontProxy,
    readers: Arc<Readers>,
}

/// The common name of the connection's (verified) client certificate.
#[derive(Clone)]
struct Peer(String);

/// The TLS configuration: the serving certificate, and a client certificate of `proxy`'s CA
/// required.
fn tls(serving: &Serving, proxy: &FrontProxy) -> Result<ServerConfig, Error> {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(serving.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| Error::Pem(e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())
        .map_err(|e| Error::Pem(e.to_string()))?;
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(proxy.ca_pem.as_bytes()) {
        let ca = ca.map_err(|e| Error::FrontProxyCa(e.to_string()))?;
        roots
            .add(ca)
            .map_err(|e| Error::FrontProxyCa(e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| Error::FrontProxyCa(e.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The common name of a DER certificate's subject.
fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let name = cert
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_owned();
    Some(name)
}

/// Serves until the listener fails; each connection on a task of its own.
pub async fn serve<S: SandboxApi + Clone + 'static>(
    serving: Serving,
    keys: ExecutorKeys<S>,
    proxy: FrontProxy,
) -> Result<(), Error> {
    let acceptor = TlsAcceptor::from(Arc::new(tls(&serving, &proxy)?));
    let served = Arc::new(Served {
        sandboxes: Arc::new(keys.sandboxes().clone()),
        keys: Arc::new(keys),
        proxy,
        readers: Arc::default(),
    });
    let router = router(served);
    loop {
        let stream = match serving.listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors, say: accepting again at once would only spin.
                tracing::warn!(%error, "the aggregated API could not accept a connection");
                tokio::time::sleep(ACCEPT_PAUSE).await;
                continue;
            }
        };
        let (acceptor, router) = (acceptor.clone(), router.clone());
        tokio::spawn(async move {
            let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_LIMIT, acceptor.accept(stream)).await
            else {
                return;
            };
            let peer = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|leaf| common_name(leaf))
                .unwrap_or_default();
            let service =
                hyper_util::service::TowerToHyperService::new(router.layer(Extension(Peer(peer))));
            let io = hyper_util::rt::TokioIo::new(tls);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

fn router<S: SandboxApi + Clone + 'static>(served: Arc<Served<S>>) -> Router {
    let version = format!("/apis/{GROUP}/{VERSION}");
    Router::new()
        .route("/apis", get(|| async { Json(discovery::group_list()) }))
        .route(
            &format!("/apis/{GROUP}"),
            get(|| async { Json(discovery::group()) }),
        )
        .route(&version, get(|| async { Json(discovery::resource_list()) }))
        .route(
            &format!("{version}/namespaces/{{namespace}}/executions/{{name}}/log"),
            get(execution_log::<S>),
        )
        .route(
            &format!("{version}/namespaces/{{namespace}}/briqexecutors/{{name}}/files"),
            get(read_file::<S>).put(write_file::<S>),
        )
        .route("/healthz", get(|| async { "ok" }))
        .fallback(|| async { status(StatusCode::NOT_FOUND, "NotFound", "no such path".into()) })
        .layer(axum::middleware::from_fn_with_state(
            served.clone(),
            front_proxy_only::<S>,
        ))
        .with_state(served)
}

/// A `Status` object, as the API server answers errors.
fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, Json(body)).into_response()
}

/// Every request: its connection's certificate must have a name the front proxy may have, and
/// it must name a user.
async fn front_proxy_only<S>(
    State(served): State<Arc<Served<S>>>,
    Extension(Peer(peer)): Extension<Peer>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match served.proxy.user(&peer, request.headers()) {
        Ok(user) => {
            request.extensions_mut().insert(user);
            next.run(request).await
        }
        Err(why) => status(StatusCode::UNAUTHORIZED, "Unauthorized", why.to_string()),
    }
}

/// `Ok` when `user` may do `request`, else the error to answer.
async fn authorized<S: SandboxApi + 'static>(
    served: &Served<S>,
    user: &User,
    request: &Request<'_>,
) -> Result<(), Response> {
    match authorize::denied(served.keys.client(), user, request).await {
        Ok(None) => Ok(()),
        Ok(Some(why)) => Err(status(StatusCode::FORBIDDEN, "Forbidden", why)),
        Err(error) => Err(status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!("the authorization could not be asked: {error}"),
        )),
    }
}

fn refused(refusal: Refusal) -> Response {
    status(refusal.code, refusal.reason, refusal.message)
}

fn unavailable(what: &str, error: impl std::fmt::Display) -> Response {
    status(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        format!("{what}: {error}"),
    )
}

/// The executor, its sandbox and its key, once the caller may do `verb` on its files at
/// `path`.
async fn file_target<S: SandboxApi + Clone + 'static>(
    served: &Served<S>,
    user: &User,
    verb: &str,
    namespace: &str,
    name: &str,
    query: Option<&str>,
) -> Result<(String, String, ApiKey), Response> {
    let request = Request {
        verb,
        namespace,
        resource: "briqexecutors",
        subresource: "files",
        name,
    };
    authorized(served, user, &request).await?;
    let path = files::query_path(query).map_err(refused)?;
    let path = files::checked_path(&path).map_err(refused)?.to_owned();
    let executors: Api<BriqExecutor> = Api::namespaced(served.keys.client().clone(), namespace);
    let executor = match executors.get_opt(name).await {
        Ok(Some(executor)) => executor,
        Ok(None) => {
            return Err(status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("briqexecutors.briq.cloud \"{name}\" not found"),
            ));
        }
        Err(error) => return Err(unavailable("reading the BriqExecutor", error)),
    };
    let sandbox = files::movable(&executor).map_err(refused)?.to_owned();
    let key = served
        .keys
        .key(&executor)
        .await
        .map_err(|error| unavailable("the executor's briq key", error))?;
    Ok((path, sandbox, key))
}

async fn read_file<S: SandboxApi + Clone + 'static>(
    State(served): State<Arc<Served<S>>>,
    Extension(user): Extension<User>,
    Path((namespace, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let (path, sandbox, key) =
        match file_target(&served, &user, "get", &namespace, &name, query.as_deref()).await {
            Ok(target) => target,
            Err(response) => return response,
        };
    let session = Session::new(served.sandboxes.as_ref(), &key, &sandbox);
    let first = match session.file_read(&path, 0, MAX_FILE_BYTES).await {
        Ok(report) if report.ok => report,
        Ok(report) => return refused(files::refusal_of(&report)),
        Err(error) => return unavailable("reading the file in the sandbox", error),
    };
    let first_part = match files::part_bytes(&first) {
        Ok(bytes) => bytes,
        Err(refusal) => return refused(refusal),
    };
    let (size, digest) = (
        first.size.unwrap_or(0),
        first.sha256.clone().unwrap_or_default(),
    );
    // One part in flight: a caller that reads slowly holds the reading, never a buffer.
    let (out, body) = mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    let sandboxes = served.sandboxes.clone();
    let expected = digest.clone();
    tokio::spawn(async move {
        let session = Session::new(sandboxes.as_ref(), &key, &sandbox);
        let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
        let mut sent = 0u64;
        let mut part = first_part;
        loop {
            sha2::Digest::update(&mut hasher, &part);
            sent += part.len() as u64;
            let empty = part.is_empty();
            if out.send(Ok(part)).await.is_err() {
                return;
            }
            if sent >= size || empty {
                break;
            }
            let next = match session.file_read(&path, sent, MAX_FILE_BYTES).await {
                Ok(report) if report.ok && report.size == Some(size) => files::part_bytes(&report),
                Ok(report) if report.ok => Err(Refusal::bad_request(
                    "the file changed size while it was read".into(),
                )),
                Ok(report) => Err(files::refusal_of(&report)),
                Err(error) => Err(Refusal::bad_request(format!("reading a part: {error}"))),
            };
            match next {
                Ok(bytes) => part = bytes,
                Err(refusal) => {
                    let _ = out.send(Err(std::io::Error::other(refusal.message))).await;
                    return;
                }
            }
        }
        if format!("{:x}", sha2::Digest::finalize(hasher)) != expected || sent != size {
            // Breaking the body off tells the caller the bytes are not the file it was promised.
            let _ = out
                .send(Err(std::io::Error::other(
                    "the file changed while it was read: its bytes do not match its SHA-256",
                )))
                .await;
        }
    });
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, size.to_string()),
            (header::HeaderName::from_static(SHA256_HEADER), digest),
        ],
        Body::from_stream(ReceiverStream::new(body)),
    )
        .into_response()
}

async fn write_file<S: SandboxApi + Clone + 'static>(
    State(served): State<Arc<Served<S>>>,
    Extension(user): Extension<User>,
    Path((namespace, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (path, sandbox, key) = match file_target(
        &served,
        &user,
        "update",
        &namespace,
        &name,
        query.as_deref(),
    )
    .await
    {
        Ok(target) => target,
        Err(response) => return response,
    };
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let Some(length) = length else {
        return status(
            StatusCode::LENGTH_REQUIRED,
            "BadRequest",
            "a file is written with its Content-Length".into(),
        );
    };
    if length > MAX_FILE_BYTES {
        return refused(files::too_large(length));
    }
    let claimed = headers
        .get(SHA256_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase);
    let id = format!("{:032x}", rand::random::<u128>());
    let mut upload = Upload::new(&id, WRITE_PART_BYTES);
    let api = served.sandboxes.as_ref();
    let mut frames = body.into_data_stream();
    while let Some(frame) = futures::StreamExt::next(&mut frames).await {
        let chunk = match frame {
            Ok(chunk) => chunk,
            Err(error) => {
                return refused(Refusal::bad_request(format!("reading the body: {error}")));
            }
        };
        for (index, part) in upload.take(&chunk) {
            if let Err(error) = api
                .write_file(&key, &sandbox, &upload.part_path(index), &part)
                .await
            {
                return unavailable("uploading a part to the sandbox", error);
            }
        }
    }
    let (staged, last_path) = (upload.staged.clone(), upload.part_path(upload.parts));
    let (last, parts, size, digest) = upload.finish();
    if let Some((_, part)) = last
        && let Err(error) = api.write_file(&key, &sandbox, &last_path, &part).await
    {
        return unavailable("uploading a part to the sandbox", error);
    }
    // The caller's digest, when sent, is the one the bridge checks: bytes changed on the way
    // are then found in the sandbox, and nothing is written.
    let expected = claimed.unwrap_or(digest);
    let session = Session::new(api, &key, &sandbox);
    match session
        .file_write(&staged, parts, &path, size, &expected)
        .await
    {
        Ok(report) if report.ok => (
            StatusCode::CREATED,
            Json(json!({"path": report.path, "size": report.size, "sha256": report.sha256})),
        )
            .into_response(),
        Ok(report) => refused(files::refusal_of(&report)),
        Err(error) => unavailable("installing the file in the sandbox", error),
    }
}

async fn execution_log<S: SandboxApi + Clone + 'static>(
    State(served): State<Arc<Served<S>>>,
    Extension(user): Extension<User>,
    Path((namespace, name)): Path<(String, String)>,
    query: Result<Query<log::Query>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(query)) = query else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the query takes follow=true|false, format=text|json and stream=stdout|stderr".into(),
        );
    };
    let request = Request {
        verb: "get",
        namespace: &namespace,
        resource: "executions",
        subresource: "log",
        name: &name,
    };
    if let Err(response) = authorized(&served, &user, &request).await {
        return response;
    }
    let executions: Api<Execution> = Api::namespaced(served.keys.client().clone(), &namespace);
    let execution = match executions.get_opt(&name).await {
        Ok(Some(execution)) => execution,
        Ok(None) => {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("executions.briq.cloud \"{name}\" not found"),
            );
        }
        Err(error) => {
            return status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                format!("reading the Execution: {error}"),
            );
        }
    };
    let content_type = match query.format {
        log::Format::Json => "application/x-ndjson",
        log::Format::Text => "text/plain; charset=utf-8",
    };
    // A few pieces in flight at most: a caller that reads slowly holds the writer, never a
    // buffer that grows.
    let (out, body) = mpsc::channel::<Bytes>(8);
    tokio::spawn(log::produce(
        served.keys.clone(),
        served.sandboxes.clone(),
        served.readers.clone(),
        execution,
        query,
        out,
    ));
    let body = Body::from_stream(tokio_stream::StreamExt::map(
        ReceiverStream::new(body),
        Ok::<_, std::convert::Infallible>,
    ));
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_status_objects_kubectl_reads() {
        let response = status(StatusCode::FORBIDDEN, "Forbidden", "no".into());
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
    }
}
