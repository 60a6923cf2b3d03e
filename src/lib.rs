//! briq-operator: sandboxed Python executors for AI-agent workloads, as Kubernetes resources.

pub mod bench;
pub mod bridge;
pub mod briq;
pub mod cli;
pub mod control_plane;
pub mod controller;
pub mod crd;
pub mod demo;
pub mod http;
pub mod leader;
pub mod local_server;
pub mod metrics;
pub mod operator;
pub mod telemetry;
