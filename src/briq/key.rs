//! The briq API key, kept out of every log line, event, status and error.

use std::fmt;

/// A briq API key. Debug and Display print `ApiKey(<redacted>)`; only [`ApiKey::expose`] gives
/// the secret, for the `Authorization` header.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

/// Why a string cannot be an API key; never carries the string itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidApiKey {
    #[error("the API key is empty")]
    Empty,
    #[error("the API key contains characters not allowed in an HTTP header")]
    NotHeaderSafe,
}

impl ApiKey {
    /// Surrounding whitespace is dropped: keys from Secrets made with `--from-file` usually end
    /// in a newline, which would otherwise fail every request with a confusing 401.
    pub fn new(key: impl Into<String>) -> Result<Self, InvalidApiKey> {
        let key = key.into();
        let key = key.trim();
        if key.is_empty() {
            return Err(InvalidApiKey::Empty);
        }
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(InvalidApiKey::NotHeaderSafe);
        }
        Ok(Self(key.to_owned()))
    }

    /// The secret itself. Only for the `Authorization` header (and the local server's check).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The key's identity in memory (per-key health, sessions, conformance): its hash, never
    /// the key itself.
    pub(crate) fn fingerprint(&self) -> u64 {
        use std::hash::{DefaultHasher, Hash as _, Hasher as _};
        let mut hasher = DefaultHasher::new();
        self.0.hash(&mut hasher);
        hasher.finish()
    }
}

/// The 8-character pieces of `secret` that `text` contains: what a check that a key never
/// leaks looks for (a piece that long is as good as the key to someone guessing the rest).
pub fn leaked_pieces(secret: &str, text: &str) -> Vec<String> {
    let chars: Vec<char> = secret.chars().collect();
    chars
        .windows(8)
        .map(|w| w.iter().collect::<String>())
        .filter(|piece| text.contains(piece.as_str()))
        .collect()
}

impl std::str::FromStr for ApiKey {
    type Err = InvalidApiKey;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_the_secret() {
        let key = ApiKey::new("bk_live_s3cret").unwrap();
        assert_eq!(format!("{key}"), "ApiKey(<redacted>)");
        assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
        assert_eq!(key.expose(), "bk_live_s3cret");
    }

    #[test]
    fn trims_and_validates() {
        assert_eq!(ApiKey::new(" k\n").unwrap().expose(), "k");
        assert_eq!(ApiKey::new("\n"), Err(InvalidApiKey::Empty));
        assert_eq!(ApiKey::new("a b"), Err(InvalidApiKey::NotHeaderSafe));
    }
}
