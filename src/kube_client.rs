//! The one way this project makes a Kubernetes client: kube's own stack (TLS from the config,
//! timeouts, the base URI, authentication, extra headers, retries of server errors), on a TCP
//! connector that sets `TCP_NODELAY`.
//!
//! Why not `kube::Client::try_from(config)`: kube's default connector leaves Nagle's algorithm
//! on. A request whose headers and body leave in two TLS records then waits for the API server's
//! delayed ACK (40 ms on Linux) before its second record is sent, and a watch's first request can
//! wait the same way. The API server (Go) sets `TCP_NODELAY` on its side, as do kubectl's and the
//! Python client's HTTP stacks; scenario 1 of `make bench` measures what it costs here.

use http::{Request, Response};
use hyper_timeout::TimeoutConnector;
use hyper_util::{
    client::legacy::{Client as HyperClient, connect::HttpConnector},
    rt::TokioExecutor,
};
use kube::{
    Client, Config,
    client::{Body, ClientBuilder, ConfigExt, DynBody, retry::RetryPolicy},
};
use tower::{BoxError, ServiceBuilder, ServiceExt, retry::RetryLayer, util::BoxService};

/// The service stack a [`ClientBuilder`] from [`builder`] wraps.
pub type Stack = BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// A client for `config`, with `TCP_NODELAY` on its connections.
pub fn client(config: Config) -> kube::Result<Client> {
    Ok(builder(config)?.build())
}

/// The builder of [`client`], for callers that add layers of their own (tests that record or
/// slow requests). A proxy in the config is refused: this project's clusters are reached
/// directly, and kube's proxy connectors are behind features it does not enable.
pub fn builder(config: Config) -> kube::Result<ClientBuilder<Stack>> {
    if let Some(proxy_url) = config.proxy_url.as_ref() {
        return Err(kube::Error::ProxyProtocolUnsupported {
            proxy_url: Box::new(proxy_url.clone()),
        });
    }
    install_default_crypto_provider();
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let mut connector = TimeoutConnector::new(config.rustls_https_connector_with_connector(tcp)?);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http: HyperClient<_, Body> = HyperClient::builder(TokioExecutor::new()).build(connector);

    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .service(http.map_err(BoxError::from))
        .map_response(|response: Response<hyper::body::Incoming>| {
            response.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>
            })
        })
        .boxed();
    Ok(ClientBuilder::new(service, config.default_namespace))
}

/// kube installs aws-lc-rs as rustls's process-wide provider when it builds its own stack; this
/// stack needs it installed the same way (a no-op once any provider is).
fn install_default_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // An error means another thread installed one in between, which is as good.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use std::{
        net::SocketAddr,
        os::fd::{BorrowedFd, RawFd},
    };

    use super::*;

    /// The sockets of this process whose local address is `address` (read from `/proc/self/fd`,
    /// each through a duplicate of its descriptor, so the original is left alone).
    fn sockets_bound_to(address: SocketAddr) -> Vec<std::net::TcpStream> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd") {
            let entry = entry.expect("fd entry");
            let is_socket = std::fs::read_link(entry.path())
                .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
            let Some(fd) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<RawFd>().ok())
            else {
                continue;
            };
            if !is_socket {
                continue;
            }
            // SAFETY: the descriptor is only duplicated, and a descriptor closed in between
            // makes the duplicate fail rather than alias another file.
            let Ok(owned) = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned() else {
                continue;
            };
            let stream = std::net::TcpStream::from(owned);
            if stream.local_addr().is_ok_and(|local| local == address) {
                found.push(stream);
            }
        }
        found
    }

    /// Nagle's algorithm holds a request's second TLS record until the API server ACKs the
    /// first, and the server delays that ACK by up to 40 ms: scenario 1 of `make bench` lost
    /// about 40 ms on a third of its actions that way (2.4× the direct call; 1.5× without).
    #[tokio::test]
    async fn a_request_never_waits_for_a_delayed_ack_because_its_connection_sets_nodelay() {
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", server.local_addr().unwrap());
        let client = client(Config::new(url.parse().unwrap())).unwrap();
        let request = tokio::spawn(async move { client.apiserver_version().await });
        let (mut connection, client_address) = server.accept().await.unwrap();
        // The connector sets its options once connected, before the request is written: the
        // request's first bytes say they are set.
        let mut first = [0u8; 1];
        tokio::io::AsyncReadExt::read_exact(&mut connection, &mut first)
            .await
            .unwrap();

        let sockets = sockets_bound_to(client_address);
        assert_eq!(sockets.len(), 1, "the client's end of the connection");
        assert!(
            sockets[0].nodelay().unwrap(),
            "TCP_NODELAY is off on the client's connection"
        );
        request.abort();
    }
}
