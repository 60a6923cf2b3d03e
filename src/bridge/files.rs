//! What the bridge's `file-write` and `file-read` answer: a file moved into or out of the
//! sandbox with the kernel user's rights, never the bridge's own.

use serde::Deserialize;

/// The most one `file-read` gives (raw bytes; its envelope carries them in base64).
pub const READ_PART_BYTES: u64 = 512 * 1024;
/// The most one part uploaded for `file-write` holds (briq moves at most 1 MB a call).
pub const WRITE_PART_BYTES: usize = 512 * 1024;
/// Where parts of an upload wait for `file-write`, relative to the bridge's directory.
pub const UPLOADS_DIR: &str = ".briq/uploads";

/// What `file-write` or `file-read` did.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FileReport {
    pub ok: bool,
    pub path: String,
    /// The whole file's size (none when the bridge failed before knowing it).
    #[serde(default)]
    pub size: Option<u64>,
    /// The whole file's SHA-256 (hex): written, or read from offset 0.
    #[serde(default)]
    pub sha256: Option<String>,
    #[serde(default)]
    pub error: Option<FileError>,
    /// `file-read`: where the data starts, and the data.
    #[serde(default)]
    pub offset: Option<u64>,
    #[serde(default)]
    pub data_base64: Option<String>,
}

/// Why `file-write` or `file-read` did nothing.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FileError {
    pub code: FileErrorCode,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileErrorCode {
    /// A path the bridge never moves: not absolute, `..`, or its own files.
    Refused,
    NotFound,
    IsDirectory,
    Permission,
    /// The parts were not the bytes announced.
    Mismatch,
    TooLarge,
    /// A code a newer bridge may send.
    #[serde(other)]
    Other,
}
