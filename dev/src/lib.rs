//! Development tooling for briq-operator: everything that runs the operator on this machine
//! rather than in a cluster. None of it ships in the operator.
//!
//! - [`control_plane`]: a real etcd + kube-apiserver on loopback.
//! - [`local_server`]: a local briq-compatible sandbox server (NOT an isolation boundary).
//! - [`stack`]: the one harness putting control plane, sandbox server and operator together,
//!   used by [`demo`], [`bench`](mod@bench) and the integration tests of the root package.
//! - [`operators`]: the operator under test, run inside this process.
//! - [`repo`], [`progress`], [`wait`]: the repository's build scripts, progress lines, waiting.

pub mod aggregated;
mod at_exit;
pub mod bench;
pub mod control_plane;
pub mod demo;
pub mod local_server;
pub mod operators;
pub mod progress;
pub mod repo;
pub mod stack;
pub mod wait;
