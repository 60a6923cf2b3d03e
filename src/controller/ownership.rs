//! Whose a sandbox is. Every id the operator records (annotations, status) is tenant-writable, so
//! before it adopts, runs code in or destroys a sandbox it asks briq, and only briq's answer
//! counts: the sandbox is an executor's when its name is that executor's deterministic name.

use crate::briq::{self, ErrorClass};

/// Whose a sandbox named in a tenant-writable field (annotation, status) is. Only briq's own
/// answer decides: the sandbox is this executor's when its name is this executor's
/// deterministic name (namespace, name and uid).
#[derive(Debug, PartialEq, Eq)]
pub enum Ownership {
    Owned,
    /// Another object's sandbox (or one nobody made for an executor): never touched.
    Foreign,
    Gone,
}

/// `None`: briq did not say (ask again later).
pub fn ownership(
    expected_name: &str,
    found: &Result<briq::Sandbox, briq::Error>,
) -> Option<Ownership> {
    match found {
        Ok(sandbox) if sandbox.name == expected_name => Some(Ownership::Owned),
        Ok(_) => Some(Ownership::Foreign),
        Err(error) if error.class() == ErrorClass::NotFound => Some(Ownership::Gone),
        Err(_) => None,
    }
}

/// Why an executor refuses the sandbox a field of it names.
pub fn not_owned_message(id: &str) -> String {
    format!(
        "sandbox {id}, named in this executor's annotations or status, belongs to another \
         object: it is never used or destroyed by this executor"
    )
}
