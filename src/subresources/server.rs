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
    pki_types::{CertificateDer, pem::PemObject},
    server::WebPkiClientVerifier,
};
use serde_json::json;
use tokio::{net::TcpListener, sync::mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;

use super::{
    authorize::Request,
    certificate::{CertificateFiles, Pem, ServingCertificate},
    discovery::{self, GROUP, VERSION},
    files::{self, MAX_FILE_BYTES, SHA256_HEADER},
    front_proxy::{FrontProxy, User},
    live::Piece,
    log, mcp,
    mcp::sessions::Sessions,
    served::{Served, authorized, refused, status},
    transfer::{self, Reader, Target},
};
use crate::{briq::SandboxApi, controller::ExecutorKeys, crd::Execution, task::AbortOnDrop};

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
    /// The files they were read from, read again when they change (a renewal).
    pub files: Option<CertificateFiles>,
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

/// The common name of the connection's (verified) client certificate.
#[derive(Clone)]
struct Peer(String);

/// The TLS configuration: the serving certificate (replaceable), and a client certificate of
/// `proxy`'s CA required.
fn tls(
    serving: &Serving,
    proxy: &FrontProxy,
) -> Result<(ServerConfig, Arc<ServingCertificate>), Error> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let pem = Pem {
        cert: serving.cert_pem.clone(),
        key: serving.key_pem.clone(),
    };
    let certificate = Arc::new(ServingCertificate::new(pem, provider.clone()).map_err(Error::Pem)?);
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(proxy.ca_pem.as_bytes()) {
        let ca = ca.map_err(|e| Error::FrontProxyCa(e.to_string()))?;
        roots
            .add(ca)
            .map_err(|e| Error::FrontProxyCa(e.to_string()))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| Error::FrontProxyCa(e.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(certificate.clone());
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((config, certificate))
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
    let (config, certificate) = tls(&serving, &proxy)?;
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let _renewals = serving
        .files
        .clone()
        .map(|files| AbortOnDrop(tokio::spawn(certificate.follow(files))));
    let served = Arc::new(Served {
        sandboxes: Arc::new(keys.sandboxes().clone()),
        keys: Arc::new(keys),
        proxy,
        readers: Arc::default(),
        sessions: Sessions::default(),
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
        .route(
            &format!("{version}/namespaces/{{namespace}}/mcp"),
            axum::routing::post(mcp::post::<S>)
                .get(mcp::get)
                .delete(mcp::delete::<S>),
        )
        .route("/healthz", get(|| async { "ok" }))
        .fallback(|| async { status(StatusCode::NOT_FOUND, "NotFound", "no such path".into()) })
        .layer(axum::middleware::from_fn_with_state(
            served.clone(),
            front_proxy_only::<S>,
        ))
        .with_state(served)
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

/// The file the query names, once the caller may do `verb` on the executor's files.
async fn file_target<S: SandboxApi + Clone + 'static>(
    served: &Served<S>,
    user: &User,
    verb: &str,
    namespace: &str,
    name: &str,
    query: Option<&str>,
) -> Result<Target, Response> {
    let request = Request {
        group: GROUP,
        verb,
        namespace,
        resource: "briqexecutors",
        subresource: "files",
        name,
    };
    authorized(served, user, &request).await.map_err(refused)?;
    let path = files::query_path(query).map_err(refused)?;
    transfer::target(&served.keys, namespace, name, &path)
        .await
        .map_err(refused)
}

async fn read_file<S: SandboxApi + Clone + 'static>(
    State(served): State<Arc<Served<S>>>,
    Extension(user): Extension<User>,
    Path((namespace, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let target = match file_target(&served, &user, "get", &namespace, &name, query.as_deref()).await
    {
        Ok(target) => target,
        Err(response) => return response,
    };
    let mut reader = match Reader::open(served.sandboxes.clone(), target, MAX_FILE_BYTES).await {
        Ok(reader) => reader,
        Err(refusal) => return refused(refusal),
    };
    let (size, digest) = (reader.size, reader.sha256.clone());
    // One part in flight: a caller that reads slowly holds the reading, never a buffer.
    let (out, body) = mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    tokio::spawn(async move {
        while let Some(part) = reader.next().await {
            // Breaking the body off tells the caller the bytes are not the file it was promised.
            let part = part.map_err(|refusal| std::io::Error::other(refusal.message));
            if out.send(part).await.is_err() {
                return;
            }
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
    let target = match file_target(
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
    match transfer::write(
        served.sandboxes.as_ref(),
        &target,
        body.into_data_stream(),
        claimed,
    )
    .await
    {
        Ok(written) => (
            StatusCode::CREATED,
            Json(json!({"path": written.path, "size": written.size, "sha256": written.sha256})),
        )
            .into_response(),
        Err(refusal) => refused(refusal),
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
        group: GROUP,
        verb: "get",
        namespace: &namespace,
        resource: "executions",
        subresource: "log",
        name: &name,
    };
    if let Err(refusal) = authorized(&served, &user, &request).await {
        return refused(refusal);
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
    // A few batches in flight at most: a caller that reads slowly holds the writer, never a
    // buffer that grows.
    let (out, batches) = mpsc::channel::<Vec<Piece>>(8);
    tokio::spawn(log::produce(
        served.keys.clone(),
        served.sandboxes.clone(),
        served.readers.clone(),
        execution,
        query.follow,
        out,
    ));
    let body = Body::from_stream(tokio_stream::StreamExt::filter_map(
        ReceiverStream::new(batches),
        move |batch| {
            let text: String = batch
                .iter()
                .filter_map(|p| log::render(p, &query))
                .collect();
            (!text.is_empty()).then(|| Ok::<_, std::convert::Infallible>(Bytes::from(text)))
        },
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
