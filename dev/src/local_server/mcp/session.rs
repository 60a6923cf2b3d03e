//! MCP sessions: `initialize` opens one (its id in the `Mcp-Session-Id` answer header), every
//! later message must carry it, and `DELETE /mcp` closes it.

use std::collections::HashSet;
use std::sync::Mutex;

use crate::local_server::http::random_token;

/// The session header (HTTP header names are case-insensitive).
pub(crate) const SESSION_HEADER: &str = "mcp-session-id";

#[derive(Debug, Default)]
pub(crate) struct Sessions {
    open: Mutex<HashSet<String>>,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // A panicking handler must not take every later call down with it.
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A new session's id: `mcp_` and 24 random letters and digits.
    pub(crate) fn open(&self) -> String {
        let id = format!("mcp_{}", random_token(24));
        self.lock().insert(id.clone());
        id
    }

    pub(crate) fn is_open(&self, id: &str) -> bool {
        self.lock().contains(id)
    }

    pub(crate) fn close(&self, id: &str) {
        self.lock().remove(id);
    }
}
