//! The operator's aggregated API (`subresources.briq.cloud`), which kube-apiserver proxies to
//! under an `APIService`, as metrics-server's and KubeVirt's are: a running action's output as
//! it comes (`executions/{name}/log`), the files of an executor's sandbox
//! (`briqexecutors/{name}/files`) and an MCP server for agents (`namespaces/{namespace}/mcp`).
//! kube-apiserver authenticates the caller and names them
//! in headers; this server trusts those headers only over a connection whose client
//! certificate the front-proxy CA signed, and asks a SubjectAccessReview before it answers.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `discovery` | the group, its version and resources, as discovery documents |
//! | `front_proxy` | the front proxy's CA and headers (from `extension-apiserver-authentication`), the caller they name |
//! | `authorize` | the SubjectAccessReview of a caller's request |
//! | `live` | one shared reader of a running action's output per action, however many follow it |
//! | `log` | `executions/{name}/log`: what to answer for an Execution, pending, running or finished |
//! | `files` | `briqexecutors/{name}/files`: which paths and executors may move files, uploads in parts |
//! | `transfer` | a file moved: its executor found, read part by part or uploaded, the digest checked |
//! | `mcp` | `namespaces/{namespace}/mcp`: an MCP server whose tools act as the caller may |
//! | `served` | what the routes share; errors as `Status` objects; the caller's authorization |
//! | `certificate` | the serving certificate, read again when its files change (a renewal) |
//! | `server` | TLS with a required client certificate, the routes |

mod authorize;
mod certificate;
mod discovery;
mod files;
mod front_proxy;
mod live;
mod log;
mod mcp;
mod served;
mod server;
mod transfer;

pub use self::{
    certificate::{CertificateFiles, Pem, ServingCertificate},
    discovery::{GROUP, VERSION},
    files::{MAX_FILE_BYTES, SHA256_HEADER},
    front_proxy::FrontProxy,
    live::Piece,
    server::{Serving, serve},
};
