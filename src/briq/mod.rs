//! Client for the briq sandbox API.
//!
//! [`BriqClient`] is the one implementation of [`SandboxApi`], in production and in the tests,
//! which run it against the local sandbox server of the `briq-dev` crate. The controllers'
//! decisions are unit-tested as pure functions, without any sandbox. The wire format lives in
//! [`api`], most of it assumed.
//!
//! Retries: `get`, `list`, `destroy`, `write_file`, `read_file` and `preview_url` are repeated on
//! [`ErrorClass::Retryable`] errors (3 attempts, exponential backoff with jitter, Retry-After
//! honoured). `create_sandbox` and `exec` are never repeated: a failed create may have created a
//! sandbox (look it up by [`sandbox_name`]), a failed exec may have run: whether it can have is
//! [`Error::exec_outcome`], not [`ErrorClass`] (a 5xx is worth retrying for a GET, yet a gateway
//! may answer it after the sandbox ran the command).

pub mod api;
mod client;
mod error;
pub mod health;
mod key;
mod name;
mod retry;
mod sandbox_api;

pub use api::{CreateSandbox, ExecOutput, ExecRequest, Sandbox, SandboxState};
pub use client::{BriqClient, ClientOptions, NewClientError};
pub use error::{Error, ErrorClass, ExecOutcome, Result};
pub use key::{ApiKey, InvalidApiKey, leaked_pieces};
pub use name::{sandbox_name, sandbox_name_prefix};
pub use sandbox_api::{DestroyOutcome, SandboxApi};
