//! `cp SRC DST`: a file into or out of an executor's sandbox, as `kubectl cp` reads:
//! `cp ./data.csv py:/work/data.csv`, `cp py:/work/out.png ./`. Through the operator's
//! aggregated API (`briqexecutors/{name}/files`), the SHA-256 checked end to end; a download
//! lands whole or not at all (a temporary file renamed once its digest matches).

use std::path::{Path, PathBuf};

use futures::TryStreamExt as _;
use http_body_util::BodyExt as _;
use kube::Client;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt as _;

use super::{
    cluster::{Cluster, NamespaceArg},
    error::Error,
    exit::Exit,
};
use crate::subresources::{GROUP, MAX_FILE_BYTES, SHA256_HEADER, VERSION};

#[derive(clap::Args)]
pub struct Args {
    /// What to copy: a local path, or EXECUTOR:/absolute/path in the executor's sandbox.
    source: String,

    /// Where to: EXECUTOR:/absolute/path, or a local path (a directory keeps the file's name).
    destination: String,

    #[command(flatten)]
    namespace: NamespaceArg,
}

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Local(PathBuf),
    Sandbox { executor: String, path: String },
}

/// `EXECUTOR:/path` is a sandbox's file (executor names never hold `/` or `:`); anything else
/// is local (`./a:b` stays local, as with kubectl).
pub fn place(text: &str) -> Place {
    match text.split_once(':') {
        Some((executor, path))
            if !executor.is_empty() && !executor.contains('/') && path.starts_with('/') =>
        {
            Place::Sandbox {
                executor: executor.to_owned(),
                path: path.to_owned(),
            }
        }
        _ => Place::Local(PathBuf::from(text)),
    }
}

fn files_path(namespace: &str, executor: &str, path: &str) -> String {
    let query = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("path", path)
        .finish();
    format!("/apis/{GROUP}/{VERSION}/namespaces/{namespace}/briqexecutors/{executor}/files?{query}")
}

fn failed(message: String) -> Error {
    Error::Copy(message)
}

pub async fn run(args: Args) -> Result<Exit, Error> {
    let cluster = Cluster::connect(args.namespace).await?;
    match (place(&args.source), place(&args.destination)) {
        (Place::Local(from), Place::Sandbox { executor, path }) => {
            upload(&cluster, &from, &executor, &path).await?
        }
        (Place::Sandbox { executor, path }, Place::Local(to)) => {
            download(&cluster, &executor, &path, &to).await?
        }
        _ => {
            return Err(failed(
                "one side is EXECUTOR:/absolute/path and the other a local path".into(),
            ));
        }
    }
    Ok(Exit::Ok)
}

/// The API server's error text from a response body (a `Status`), or the code.
async fn refusal(response: http::Response<kube::client::Body>) -> Error {
    let code = response.status();
    let body = response.into_body().collect().await.map(|b| b.to_bytes());
    let message = body
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| code.to_string());
    failed(message)
}

async fn send(
    client: &Client,
    request: http::Request<Vec<u8>>,
) -> Result<http::Response<kube::client::Body>, Error> {
    let response = client
        .send(request.map(kube::client::Body::from))
        .await
        .map_err(Error::Kube)?;
    if response.status().is_success() {
        Ok(response)
    } else {
        Err(refusal(response).await)
    }
}

async fn upload(cluster: &Cluster, from: &Path, executor: &str, path: &str) -> Result<(), Error> {
    let bytes = tokio::fs::read(from)
        .await
        .map_err(|e| failed(format!("cannot read {}: {e}", from.display())))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(failed(format!(
            "{} has {} bytes, over the {MAX_FILE_BYTES}-byte limit of a file copied",
            from.display(),
            bytes.len()
        )));
    }
    let digest = format!("{:x}", Sha256::digest(&bytes));
    let request = http::Request::put(files_path(&cluster.namespace, executor, path))
        .header(http::header::CONTENT_TYPE, "application/octet-stream")
        .header(SHA256_HEADER, &digest)
        .body(bytes)
        .map_err(|e| failed(e.to_string()))?;
    send(&cluster.client, request).await?;
    Ok(())
}

async fn download(cluster: &Cluster, executor: &str, path: &str, to: &Path) -> Result<(), Error> {
    let name = path
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("file");
    let to = if to.is_dir() {
        to.join(name)
    } else {
        to.to_owned()
    };
    let request = http::Request::get(files_path(&cluster.namespace, executor, path))
        .body(Vec::new())
        .map_err(|e| failed(e.to_string()))?;
    let response = send(&cluster.client, request).await?;
    let expected = response
        .headers()
        .get(SHA256_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| failed("the answer carries no SHA-256".into()))?;
    let partial = to.with_file_name(format!(
        ".{}.briq-cp-{:08x}",
        to.file_name().and_then(|n| n.to_str()).unwrap_or(name),
        rand::random::<u32>()
    ));
    let written = async {
        let mut file = tokio::fs::File::create(&partial).await?;
        let mut hasher = Sha256::new();
        let mut body = response.into_body().into_data_stream();
        while let Some(chunk) = body.try_next().await.map_err(std::io::Error::other)? {
            hasher.update(&chunk);
            file.write_all(&chunk).await?;
        }
        file.flush().await?;
        Ok::<_, std::io::Error>(format!("{:x}", hasher.finalize()))
    }
    .await;
    let outcome = match written {
        Ok(digest) if digest == expected => tokio::fs::rename(&partial, &to)
            .await
            .map_err(|e| failed(format!("cannot write {}: {e}", to.display()))),
        Ok(_) => Err(failed(format!(
            "the bytes of {executor}:{path} did not match their SHA-256; nothing was written"
        ))),
        Err(error) => Err(failed(format!(
            "copying {executor}:{path} broke off ({error}); nothing was written"
        ))),
    };
    if outcome.is_err() {
        let _ = tokio::fs::remove_file(&partial).await;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_side_is_the_sandboxs_only_as_executor_colon_absolute_path() {
        assert_eq!(
            place("py:/work/data.csv"),
            Place::Sandbox {
                executor: "py".into(),
                path: "/work/data.csv".into()
            }
        );
        assert_eq!(place("./a:b"), Place::Local("./a:b".into()));
        assert_eq!(place("py:relative"), Place::Local("py:relative".into()));
        assert_eq!(
            place("C:/x"),
            Place::Sandbox {
                executor: "C".into(),
                path: "/x".into()
            }
        );
    }

    #[test]
    fn the_path_travels_in_the_query_escaped() {
        assert_eq!(
            files_path("ns", "py", "/work/a b&c.csv"),
            "/apis/subresources.briq.cloud/v1alpha1/namespaces/ns/briqexecutors/py/files?path=%2Fwork%2Fa+b%26c.csv"
        );
    }
}
