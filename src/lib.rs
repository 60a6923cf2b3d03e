//! briq-operator: sandboxed Python executors for AI-agent workloads, as Kubernetes resources.

pub mod bridge;
pub mod control_plane;
pub mod crd;
