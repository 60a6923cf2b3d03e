//! Client for briq, over its published MCP tools.
//!
//! [`BriqClient`] is the implementation of [`SandboxApi`] in production and in the integration
//! tests, which run it against the local sandbox server of the `briq-dev` crate (the same MCP
//! surface); the controllers' fast tier uses an in-memory one instead (`bridge::fake`). The
//! transport is [`mcp`] (JSON-RPC over Streamable HTTP); what is sent to and read from each tool
//! lives in [`api`], marked published or assumed; [`conformance`] checks it against the
//! server's `tools/list` at each key's first use, and again a while after a mismatch.
//!
//! Retries: `get`, `list`, `destroy`, `stop`, `start`, `write_file` and `read_file` are repeated on
//! [`ErrorClass::Retryable`] errors (3 attempts, exponential backoff with jitter, Retry-After
//! honoured). `create_sandbox` and `exec` are never repeated: a failed create may have created a
//! sandbox (look it up by [`sandbox_name`]), a failed exec may have run: whether it can have is
//! [`Error::exec_outcome`], not [`ErrorClass`] (a 5xx is worth retrying for a GET, yet a gateway
//! may answer it after the sandbox ran the command).

pub mod api;
mod client;
pub mod conformance;
mod error;
pub mod health;
mod key;
pub mod mcp;
mod name;
mod retry;
mod sandbox_api;

pub use api::{
    CreateSandbox, ExecOutput, ExecRequest, ExecResult, ExecResultArgs, ExecState, Sandbox,
    SandboxState, Stream,
};
pub use client::{BriqClient, ClientOptions, NewClientError};
pub use conformance::Mismatch;
pub use error::{Error, ErrorClass, ExecOutcome, Result};
pub use key::{ApiKey, InvalidApiKey, leaked_pieces};
pub use name::{sandbox_name, sandbox_name_prefix};
pub use sandbox_api::{DestroyOutcome, SandboxApi};
