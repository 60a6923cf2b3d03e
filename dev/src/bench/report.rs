//! Everything a run measured ([`Report`]) and the machine it ran on; `table.rs` prints it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    agent, cancel, cold_start, counts::Counts, demand, fairness, fork, latency, live, mcp, memory,
    pools, scaling, simulated, suspend, traces,
};

/// Everything one run measured (the JSON of `--out`).
#[derive(Debug, Serialize)]
pub struct Report {
    /// Bumped when a field changes meaning.
    pub format: u32,
    pub quick: bool,
    pub machine: Machine,
    pub counts: Counts,
    pub wall_seconds: f64,
    pub latency: Option<latency::Latency>,
    pub agent_step: Option<agent::AgentStep>,
    pub scaling: Option<Vec<scaling::Point>>,
    pub api_cost: Option<latency::ApiCost>,
    pub memory: Option<memory::Memory>,
    pub cold_start: Option<cold_start::ColdStart>,
    pub cancel: Option<cancel::Cancel>,
    /// Scenario 12, one point per state size.
    pub suspend: Option<Vec<suspend::SuspendPoint>>,
    /// Scenario 14: live output and files through the aggregated API, beside their floors.
    pub live: Option<live::LiveFiles>,
    /// Scenario 15: forks of an executor holding 10 MB of state, beside their floors.
    pub fork: Option<fork::Forks>,
    /// Scenario 16: the MCP endpoint beside the Python client and the log subresource.
    pub mcp: Option<mcp::Mcp>,
    pub simulated: Option<Vec<simulated::Point>>,
    pub api_ceiling: Option<simulated::ApiCeiling>,
    pub pools: Option<pools::Pools>,
    /// Scenario 13: fixed and demand-sized pools under waves of claims.
    pub demand: Option<demand::Demand>,
    pub traces: Option<traces::Traces>,
    pub fairness: Option<fairness::Fairness>,
    /// Scenarios that failed, with why; the others still ran.
    pub errors: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
    /// 1, 5 and 15 minute load averages when the run started (the machine may be shared).
    pub load_average_at_start: String,
    /// `git describe --always --dirty` of the repository.
    pub commit: Option<String>,
}

impl Machine {
    pub fn describe() -> Machine {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, model)| model.trim().to_owned())
            .unwrap_or_else(|| "unknown".into());
        let memory_kib: f64 = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let commit = std::process::Command::new("git")
            .args(["describe", "--always", "--dirty"])
            .current_dir(crate::repo::repo_root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model,
            memory_gib: (memory_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            load_average_at_start: read("/proc/loadavg")
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
            commit,
        }
    }
}
