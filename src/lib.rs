//! briq-operator: sandboxed Python executors for AI-agent workloads, as Kubernetes resources.
//!
//! This crate is the operator and its kubectl-style CLI. Development tooling (local control
//! plane, local sandbox server, demo, benchmarks, test harness) is the `briq-dev` crate in `dev/`.

pub mod bridge;
pub mod briq;
pub mod cli;
pub mod controller;
pub mod crd;
#[cfg(test)]
mod docs;
pub mod http;
pub mod kube_client;
#[cfg(test)]
mod layering;
pub mod leader;
pub mod metrics;
pub mod operator;
pub mod subresources;
pub mod task;
pub mod telemetry;
pub mod traces;
pub mod usage;
