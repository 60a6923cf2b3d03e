//! `briqexecutors/{name}/files?path=`: a file of the executor's sandbox, read (GET) or written
//! (PUT), up to [`MAX_FILE_BYTES`]. Both go through the bridge with the kernel user's rights, in
//! parts (briq moves at most 1 MB a call), the SHA-256 checked end to end: a write is uploaded
//! in parts, joined by the bridge and installed only when its digest is the one this server
//! computed (and the caller's, when sent); a read sends the digest the sandbox measured first
//! and breaks off when the bytes that follow do not match it. The bridge's own files are
//! refused, here and again in the sandbox.

use bytes::Bytes;
use http::StatusCode;
use sha2::{Digest as _, Sha256};

use crate::{
    bridge::{FileErrorCode, FileReport, WORKDIR, files::UPLOADS_DIR},
    crd::{
        BriqExecutor, POOL_MEMBER_ANNOTATION,
        conditions::{self, READY},
    },
};

/// The largest file moved either way.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// The header carrying a file's SHA-256 (hex): the sandbox's on a read, the caller's on a
/// write (optional).
pub const SHA256_HEADER: &str = "x-briq-sha256";

/// Why a file request is answered with an error, as the API server would say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
}

impl Refusal {
    fn new(code: StatusCode, reason: &'static str, message: String) -> Refusal {
        Refusal {
            code,
            reason,
            message,
        }
    }

    pub fn bad_request(message: String) -> Refusal {
        Refusal::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    pub fn forbidden(message: String) -> Refusal {
        Refusal::new(StatusCode::FORBIDDEN, "Forbidden", message)
    }

    pub fn not_found(message: String) -> Refusal {
        Refusal::new(StatusCode::NOT_FOUND, "NotFound", message)
    }

    pub fn unavailable(message: String) -> Refusal {
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            message,
        )
    }
}

/// The `path` of a query string, strictly decoded: a name that is not UTF-8 is refused rather
/// than read with replacement characters (which would name another file).
pub fn query_path(query: Option<&str>) -> Result<String, Refusal> {
    let malformed = || {
        Refusal::bad_request(
            "the query takes path=<an absolute path in the sandbox>, in UTF-8".into(),
        )
    };
    let value = query
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("path="))
        .ok_or_else(malformed)?
        .replace('+', "%20");
    percent_encoding::percent_decode_str(&value)
        .decode_utf8()
        .map(|path| path.into_owned())
        .map_err(|_| malformed())
}

/// Whether `path` is one a caller may ask for: absolute, plain, and not the bridge's.
pub fn checked_path(path: &str) -> Result<&str, Refusal> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(Refusal::bad_request(format!(
            "path {path:?} is not an absolute path"
        )));
    }
    if path.split('/').any(|part| part == ".." || part == ".") {
        return Err(Refusal::bad_request(format!(
            "path {path:?} has a . or .. part; give the plain path"
        )));
    }
    let bridge_dir = format!("{WORKDIR}/.briq");
    let squeezed = squeeze_slashes(path);
    if squeezed == bridge_dir || squeezed.starts_with(&format!("{bridge_dir}/")) {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "{bridge_dir} holds the bridge's own files (its journal, saved state and program); they are never moved"
            ),
        ));
    }
    Ok(path)
}

fn squeeze_slashes(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out.trim_end_matches('/').to_owned()
}

/// Whether files of `executor`'s sandbox can move now: a running sandbox of its own.
pub fn movable(executor: &BriqExecutor) -> Result<&str, Refusal> {
    let name = executor.metadata.name.as_deref().unwrap_or_default();
    let conflict = |why: String| {
        Err(Refusal::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!("BriqExecutor {name} {why}; no file moved"),
        ))
    };
    if executor.metadata.deletion_timestamp.is_some() {
        return conflict("is being deleted".into());
    }
    if executor
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(POOL_MEMBER_ANNOTATION))
        && executor.claimed_by().is_none()
    {
        return conflict("is an unclaimed pool member".into());
    }
    let status = executor.status.clone().unwrap_or_default();
    if status.unusable {
        return conflict("is unusable".into());
    }
    let suspended =
        conditions::find(&status.conditions, READY).is_some_and(|c| c.reason == "Suspended");
    if executor.spec.suspend || suspended {
        return conflict("is suspended (its sandbox is stopped); resume it first".into());
    }
    if !conditions::is_true(&status.conditions, READY) {
        return conflict("is not ready".into());
    }
    match executor
        .status
        .as_ref()
        .and_then(|s| s.sandbox_id.as_deref())
    {
        Some(sandbox) => Ok(sandbox),
        None => conflict("has no sandbox".into()),
    }
}

/// The refusal a failed bridge file command stands for.
pub fn refusal_of(report: &FileReport) -> Refusal {
    let message = report
        .error
        .as_ref()
        .map(|e| e.message.clone())
        .unwrap_or_else(|| "the bridge did not say why".into());
    let (code, reason) = match report.error.as_ref().map(|e| e.code) {
        Some(FileErrorCode::Refused) | Some(FileErrorCode::Permission) => {
            (StatusCode::FORBIDDEN, "Forbidden")
        }
        Some(FileErrorCode::NotFound) => (StatusCode::NOT_FOUND, "NotFound"),
        Some(FileErrorCode::IsDirectory) => (StatusCode::BAD_REQUEST, "BadRequest"),
        Some(FileErrorCode::TooLarge) => (StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge"),
        Some(FileErrorCode::Mismatch) => (StatusCode::BAD_REQUEST, "BadRequest"),
        Some(FileErrorCode::Other) | None => (StatusCode::INTERNAL_SERVER_ERROR, "InternalError"),
    };
    Refusal::new(code, reason, message)
}

/// The refusal of a write longer than the cap.
pub fn too_large(size: u64) -> Refusal {
    Refusal::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "RequestEntityTooLarge",
        format!(
            "{size} bytes is over the {MAX_FILE_BYTES}-byte limit of a file moved; nothing was written"
        ),
    )
}

/// An upload on its way: the parts of a body as they come, each at most `part` bytes, with the
/// digest of all so far.
pub struct Upload {
    /// The staging directory, relative to the bridge's directory (for `file-write`).
    pub staged: String,
    pending: Vec<u8>,
    part_bytes: usize,
    pub parts: usize,
    pub size: u64,
    digest: Sha256,
}

impl Upload {
    pub fn new(id: &str, part_bytes: usize) -> Upload {
        Upload {
            staged: format!("{UPLOADS_DIR}/{id}"),
            pending: Vec::new(),
            part_bytes,
            parts: 0,
            size: 0,
            digest: Sha256::new(),
        }
    }

    /// The absolute path of part `index` in the sandbox.
    pub fn part_path(&self, index: usize) -> String {
        format!("{WORKDIR}/{}/part-{index:05}", self.staged)
    }

    /// Takes `chunk` of the body; answers the parts now complete, in order, with their index.
    pub fn take(&mut self, chunk: &[u8]) -> Vec<(usize, Vec<u8>)> {
        self.size += chunk.len() as u64;
        self.digest.update(chunk);
        self.pending.extend_from_slice(chunk);
        let mut ready = Vec::new();
        while self.pending.len() >= self.part_bytes {
            let rest = self.pending.split_off(self.part_bytes);
            ready.push((self.parts, std::mem::replace(&mut self.pending, rest)));
            self.parts += 1;
        }
        ready
    }

    /// The last part (if any bytes are left), and the digest of the whole body.
    pub fn finish(mut self) -> (Option<(usize, Vec<u8>)>, usize, u64, String) {
        let last = (!self.pending.is_empty()).then(|| {
            self.parts += 1;
            (self.parts - 1, std::mem::take(&mut self.pending))
        });
        let digest = format!("{:x}", self.digest.finalize());
        (last, self.parts, self.size, digest)
    }
}

/// The bytes of a read part, decoded.
pub fn part_bytes(report: &FileReport) -> Result<Bytes, Refusal> {
    use base64::Engine as _;
    let data = report.data_base64.as_deref().unwrap_or_default();
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .map(Bytes::from)
        .map_err(|_| {
            Refusal::new(
                StatusCode::BAD_GATEWAY,
                "InternalError",
                "the sandbox answered a part that is not base64".into(),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_path_is_decoded_strictly() {
        assert_eq!(
            query_path(Some("path=%2Ftmp%2Fa+b.csv")),
            Ok("/tmp/a b.csv".into())
        );
        assert_eq!(
            query_path(Some("x=1&path=/tmp/%C3%A9")),
            Ok("/tmp/é".into())
        );
        assert!(query_path(Some("path=/tmp/%FF")).is_err());
        assert!(query_path(None).is_err());
    }

    #[test]
    fn paths_into_the_bridges_directory_or_not_plain_are_refused() {
        assert_eq!(checked_path("/work/data.csv"), Ok("/work/data.csv"));
        for path in [
            "/work/.briq/journal/x",
            "/work//.briq",
            "/work/.briq/",
            "//work/.briq/bridge.py",
        ] {
            assert_eq!(
                checked_path(path).unwrap_err().code,
                StatusCode::FORBIDDEN,
                "{path}"
            );
        }
        for path in ["work/x", "/work/../etc/passwd", "/work/./x", "/a\0b"] {
            assert_eq!(
                checked_path(path).unwrap_err().code,
                StatusCode::BAD_REQUEST,
                "{path}"
            );
        }
        // A name that merely starts like it is another file.
        assert!(checked_path("/work/.briqs").is_ok());
    }

    #[test]
    fn an_upload_is_cut_in_parts_of_the_given_size_in_order_with_the_whole_digest() {
        let mut upload = Upload::new("00ff00ff00ff00ff", 4);
        assert_eq!(upload.take(b"abc"), vec![]);
        assert_eq!(
            upload.take(b"defghij"),
            vec![(0, b"abcd".to_vec()), (1, b"efgh".to_vec())]
        );
        assert_eq!(
            upload.part_path(1),
            "/work/.briq/uploads/00ff00ff00ff00ff/part-00001"
        );
        let (last, parts, size, digest) = upload.finish();
        assert_eq!(last, Some((2, b"ij".to_vec())));
        assert_eq!((parts, size), (3, 10));
        assert_eq!(digest, format!("{:x}", Sha256::digest(b"abcdefghij")));
    }

    #[test]
    fn a_suspended_or_unusable_executor_moves_no_file() {
        let executor = |spec: serde_json::Value, status: serde_json::Value| -> BriqExecutor {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "py"}, "spec": spec, "status": status,
            }))
            .unwrap()
        };
        let ready = serde_json::json!({"sandboxId": "bq_1", "conditions": [
            {"type": "Ready", "status": "True", "reason": "Ready", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        assert_eq!(
            movable(&executor(serde_json::json!({}), ready.clone())),
            Ok("bq_1")
        );
        let suspended = executor(serde_json::json!({"suspend": true}), ready.clone());
        assert_eq!(movable(&suspended).unwrap_err().code, StatusCode::CONFLICT);
        let mut unusable = ready.clone();
        unusable["unusable"] = serde_json::json!(true);
        let refused = movable(&executor(serde_json::json!({}), unusable)).unwrap_err();
        assert!(refused.message.contains("unusable"), "{}", refused.message);
    }
}
