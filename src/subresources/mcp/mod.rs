//! An MCP server per namespace, at `namespaces/{namespace}/mcp` of the aggregated API: any
//! agent that speaks MCP (Streamable HTTP) reaches the namespace's executors under the
//! cluster's own authentication, and acts only where its caller could act itself.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `protocol` | JSON-RPC framing, the protocol's own answers, SSE events (pure) |
//! | `tools` | the tools' schemas, their arguments checked into a `Call`, the rights each needs (pure) |
//! | `sessions` | session ids bound to their user and namespace, bounded |
//! | `act` | what each tool does once its rights are confirmed; its answers built by pure functions |
//! | `endpoint` | the HTTP routes: POST one message, DELETE a session; GET is not offered |

mod act;
mod endpoint;
mod protocol;
pub(super) mod sessions;
mod tools;

pub use self::endpoint::{delete, get, post};
