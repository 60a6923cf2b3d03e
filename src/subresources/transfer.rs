//! Moving a file of an executor's sandbox, for the files route (streamed) and for MCP's
//! `read_file`/`write_file` (whole): the executor found and its sandbox checked movable, then
//! the parts read or uploaded through the bridge, each way checked against the SHA-256.

use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use kube::Api;
use sha2::{Digest as _, Sha256};

use super::files::{self, Refusal, Upload};
use crate::{
    bridge::{files::WRITE_PART_BYTES, session::Session},
    briq::{ApiKey, SandboxApi},
    controller::ExecutorKeys,
    crd::BriqExecutor,
};

/// A file of a running sandbox, with the key that reaches it.
pub struct Target {
    pub path: String,
    pub sandbox: String,
    pub key: ApiKey,
}

/// The file at `path` (checked) of executor `name`, once its sandbox can move files. The
/// caller's right to do so was checked before.
pub async fn target<S: SandboxApi + 'static>(
    keys: &ExecutorKeys<S>,
    namespace: &str,
    name: &str,
    path: &str,
) -> Result<Target, Refusal> {
    let path = files::checked_path(path)?.to_owned();
    let executors: Api<BriqExecutor> = Api::namespaced(keys.client().clone(), namespace);
    let executor = match executors.get_opt(name).await {
        Ok(Some(executor)) => executor,
        Ok(None) => {
            return Err(Refusal::not_found(format!(
                "briqexecutors.briq.cloud \"{name}\" not found"
            )));
        }
        Err(error) => {
            return Err(Refusal::unavailable(format!(
                "reading the BriqExecutor: {error}"
            )));
        }
    };
    let sandbox = files::movable(&executor)?.to_owned();
    let key = keys
        .key(&executor)
        .await
        .map_err(|error| Refusal::unavailable(format!("the executor's briq key: {error}")))?;
    Ok(Target { path, sandbox, key })
}

/// A file read part by part, its size and digest known from the first part.
pub struct Reader<S> {
    sandboxes: Arc<S>,
    target: Target,
    limit: u64,
    pub size: u64,
    pub sha256: String,
    first: Option<Bytes>,
    sent: u64,
    /// A part came back empty before the size was reached: the file shrank.
    stalled: bool,
    hasher: Sha256,
    done: bool,
}

impl<S: SandboxApi> Reader<S> {
    /// Reads the first part: a file over `limit` bytes, missing or not readable is refused.
    pub async fn open(sandboxes: Arc<S>, target: Target, limit: u64) -> Result<Self, Refusal> {
        let session = Session::new(sandboxes.as_ref(), &target.key, &target.sandbox);
        let first = match session.file_read(&target.path, 0, limit).await {
            Ok(report) if report.ok => report,
            Ok(report) => return Err(files::refusal_of(&report)),
            Err(error) => {
                return Err(Refusal::unavailable(format!(
                    "reading the file in the sandbox: {error}"
                )));
            }
        };
        let part = files::part_bytes(&first)?;
        Ok(Reader {
            size: first.size.unwrap_or(0),
            sha256: first.sha256.clone().unwrap_or_default(),
            sandboxes,
            target,
            limit,
            first: Some(part),
            sent: 0,
            stalled: false,
            hasher: Sha256::new(),
            done: false,
        })
    }

    /// The next part, until the file is whole; then an error when it changed while it was read
    /// (another size, or bytes that do not match the digest the first part came with).
    pub async fn next(&mut self) -> Option<Result<Bytes, Refusal>> {
        if self.done {
            return None;
        }
        let part = match self.first.take() {
            Some(first) => Ok(first),
            None if self.sent < self.size && !self.stalled => self.read_part().await,
            None => {
                self.done = true;
                let digest = format!("{:x}", std::mem::take(&mut self.hasher).finalize());
                return (digest != self.sha256 || self.sent != self.size).then(|| {
                    Err(Refusal::bad_request(
                        "the file changed while it was read: its bytes do not match its SHA-256"
                            .into(),
                    ))
                });
            }
        };
        match part {
            Ok(part) => {
                self.hasher.update(&part);
                self.sent += part.len() as u64;
                self.stalled = part.is_empty();
                Some(Ok(part))
            }
            Err(refusal) => {
                self.done = true;
                Some(Err(refusal))
            }
        }
    }

    async fn read_part(&self) -> Result<Bytes, Refusal> {
        let session = Session::new(
            self.sandboxes.as_ref(),
            &self.target.key,
            &self.target.sandbox,
        );
        match session
            .file_read(&self.target.path, self.sent, self.limit)
            .await
        {
            Ok(report) if report.ok && report.size == Some(self.size) => files::part_bytes(&report),
            Ok(report) if report.ok => Err(Refusal::bad_request(
                "the file changed size while it was read".into(),
            )),
            Ok(report) => Err(files::refusal_of(&report)),
            Err(error) => Err(Refusal::bad_request(format!("reading a part: {error}"))),
        }
    }
}

/// What a write installed.
pub struct Written {
    pub path: String,
    pub size: Option<u64>,
    pub sha256: Option<String>,
}

/// Uploads `body` in parts and installs it at the target's path when its digest is `claimed`
/// (the caller's, when sent) or else the one measured here: bytes changed on the way are found
/// in the sandbox, and nothing is written.
pub async fn write<S: SandboxApi, E: std::fmt::Display>(
    sandboxes: &S,
    target: &Target,
    body: impl Stream<Item = Result<Bytes, E>>,
    claimed: Option<String>,
) -> Result<Written, Refusal> {
    let id = format!("{:032x}", rand::random::<u128>());
    let mut upload = Upload::new(&id, WRITE_PART_BYTES);
    let put = |path: String, part: Vec<u8>| async move {
        sandboxes
            .write_file(&target.key, &target.sandbox, &path, &part)
            .await
            .map_err(|error| {
                Refusal::unavailable(format!("uploading a part to the sandbox: {error}"))
            })
    };
    futures::pin_mut!(body);
    while let Some(frame) = body.next().await {
        let chunk =
            frame.map_err(|error| Refusal::bad_request(format!("reading the body: {error}")))?;
        for (index, part) in upload.take(&chunk) {
            put(upload.part_path(index), part).await?;
        }
    }
    let (staged, last_path) = (upload.staged.clone(), upload.part_path(upload.parts));
    let (last, parts, size, digest) = upload.finish();
    if let Some((_, part)) = last {
        put(last_path, part).await?;
    }
    let expected = claimed.unwrap_or(digest);
    let session = Session::new(sandboxes, &target.key, &target.sandbox);
    match session
        .file_write(&staged, parts, &target.path, size, &expected)
        .await
    {
        Ok(report) if report.ok => Ok(Written {
            path: report.path,
            size: report.size,
            sha256: report.sha256,
        }),
        Ok(report) => Err(files::refusal_of(&report)),
        Err(error) => Err(Refusal::unavailable(format!(
            "installing the file in the sandbox: {error}"
        ))),
    }
}
