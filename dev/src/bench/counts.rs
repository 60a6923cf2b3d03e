//! How much each scenario does: in full, or scaled down for a smoke run (`--quick`).

use serde::Serialize;

use super::{demand, fork, live, mcp, pools, scaling};

/// How much each scenario does.
#[derive(Debug, Clone, Serialize)]
pub struct Counts {
    pub sequential_actions: usize,
    pub agent_steps: usize,
    pub scaling_executors: Vec<usize>,
    pub scaling_actions: usize,
    pub scaling_bound_seconds: u64,
    pub memory_executors: usize,
    pub memory_executions: usize,
    pub cold_start_runs: usize,
    /// Scenario 11: cancels of code that stops at the interrupt, and of code that ignores it
    /// (each costs the operator's grace before its kernel restart).
    pub cancel_runs: usize,
    pub cancel_restart_runs: usize,
    /// Scenario 12: suspend → resume runs at each state size (MB of user state).
    pub suspend_runs: usize,
    pub suspend_sizes_mb: Vec<usize>,
    /// Executions per round of scenario 9 (three rounds with traces off, three exported).
    pub traces_per_round: usize,
    pub simulated_executors: Vec<usize>,
    pub simulated_actions: usize,
    /// Scenario 7's bound of each phase of a point (executors getting Ready, Executions
    /// finishing): its targets need 1,000 Ready within 30 s and 10,000 Executions within 50 s,
    /// and a shorter bound keeps `make bench` within its budget when the operator is slower.
    pub simulated_bound_seconds: u64,
    /// Executions' worth of requests the API server is sent alone (scenario 7's ceiling).
    pub api_ceiling_executions: usize,
    /// Scenario 8: the simulated pool that claims come from one at a time, and how many claims
    /// (with as many cold creates beside).
    pub pool_replicas: usize,
    pub pool_claims: usize,
    /// Scenario 8: claims at once against a simulated pool as large.
    pub pool_burst: usize,
    /// Scenario 8: claims at once against a pool as large, on real kernels.
    pub pool_real_kernels: usize,
    /// Scenario 8's drained pool on real kernels: its members, its claims, the time between
    /// two claims, and each claimer's `coldCreateAfterSeconds`.
    pub drained_pool: usize,
    pub drained_claims: usize,
    pub drained_spacing_ms: u64,
    pub drained_cold_after_seconds: u32,
    /// Scenario 8's bound of every wait (the pool filling, a claim, a refill).
    pub pool_bound_seconds: u64,
    /// Scenario 13: claims per wave (the demand pools' `maxReady`, the larger fixed pool's
    /// replicas), the smaller fixed pool's replicas, the demand pools' `demandWindowSeconds`,
    /// and the time between two claims of a wave.
    pub demand_burst: usize,
    pub demand_fixed_replicas: usize,
    pub demand_window_seconds: u64,
    pub demand_claim_spacing_ms: u64,
    /// Scenario 10: long actions of one namespace in flight (more than the work slots), and
    /// one-line actions of another, one at a time.
    pub fairness_noisy: usize,
    pub fairness_quiet: usize,
    /// Scenario 14: lines each followed action prints (one every 200 ms); executors with an
    /// action each and followers of each action; file sizes (MB, 10^6 bytes) and round trips
    /// at each.
    pub live_lines: usize,
    pub live_executors: usize,
    pub live_followers_each: usize,
    pub file_sizes_mb: Vec<usize>,
    pub file_runs: usize,
    /// Scenario 15: forks one at a time (each beside a fresh executor and an action on the
    /// source), and forks created at once.
    pub fork_runs: usize,
    pub fork_burst: usize,
    /// Scenario 16: the MCP endpoint.
    pub mcp: mcp::McpCounts,
}

impl Counts {
    pub fn new(quick: bool) -> Counts {
        if quick {
            Counts {
                sequential_actions: 20,
                agent_steps: 10,
                scaling_executors: vec![1, 3, 10],
                scaling_actions: 5,
                scaling_bound_seconds: 120,
                memory_executors: 100,
                memory_executions: 1_000,
                cold_start_runs: 1,
                cancel_runs: 3,
                cancel_restart_runs: 1,
                suspend_runs: 2,
                suspend_sizes_mb: vec![1, 10],
                traces_per_round: 5,
                simulated_executors: vec![10, 50, 100],
                simulated_actions: 10,
                simulated_bound_seconds: 60,
                api_ceiling_executions: 500,
                pool_replicas: 10,
                pool_claims: 10,
                pool_burst: 20,
                pool_real_kernels: 3,
                drained_pool: 3,
                drained_claims: 8,
                drained_spacing_ms: 250,
                drained_cold_after_seconds: 5,
                pool_bound_seconds: 120,
                demand_burst: 10,
                demand_fixed_replicas: 2,
                demand_window_seconds: 20,
                demand_claim_spacing_ms: 100,
                fairness_noisy: 300,
                fairness_quiet: 5,
                live_lines: 25,
                live_executors: 2,
                live_followers_each: 5,
                file_sizes_mb: vec![1, 50],
                file_runs: 1,
                fork_runs: 3,
                fork_burst: 3,
                mcp: mcp::McpCounts {
                    actions: 20,
                    sessions: 20,
                    session_actions: 3,
                    executors: 2,
                    prints: 10,
                },
            }
        } else {
            Counts {
                sequential_actions: 200,
                agent_steps: 50,
                scaling_executors: vec![1, 10, 100],
                scaling_actions: 20,
                scaling_bound_seconds: 120,
                memory_executors: 1_000,
                memory_executions: 10_000,
                cold_start_runs: 5,
                cancel_runs: 10,
                cancel_restart_runs: 3,
                suspend_runs: 3,
                suspend_sizes_mb: vec![1, 10, 100],
                traces_per_round: 50,
                simulated_executors: vec![10, 100, 1_000],
                simulated_actions: 10,
                simulated_bound_seconds: 60,
                api_ceiling_executions: 3_000,
                pool_replicas: 10,
                pool_claims: 50,
                pool_burst: 100,
                pool_real_kernels: 3,
                drained_pool: 3,
                drained_claims: 20,
                drained_spacing_ms: 250,
                drained_cold_after_seconds: 5,
                pool_bound_seconds: 120,
                demand_burst: 20,
                demand_fixed_replicas: 2,
                demand_window_seconds: 30,
                demand_claim_spacing_ms: 100,
                fairness_noisy: 300,
                fairness_quiet: 20,
                live_lines: 50,
                live_executors: 10,
                live_followers_each: 10,
                file_sizes_mb: vec![1, 50],
                file_runs: 3,
                fork_runs: 10,
                fork_burst: 10,
                mcp: mcp::McpCounts {
                    actions: 100,
                    sessions: 100,
                    session_actions: 10,
                    executors: 10,
                    prints: 30,
                },
            }
        }
    }
}

impl Counts {
    pub(super) fn scaling(&self) -> Vec<scaling::Scale> {
        let (executors, actions) = (&self.scaling_executors, self.scaling_actions);
        scaling::Scale::each(executors, actions, self.scaling_bound_seconds)
    }

    pub(super) fn simulated(&self) -> Vec<scaling::Scale> {
        let (executors, actions) = (&self.simulated_executors, self.simulated_actions);
        scaling::Scale::each(executors, actions, self.simulated_bound_seconds)
    }

    pub(super) fn pools(&self) -> pools::Sizes {
        pools::Sizes {
            pool: self.pool_replicas,
            claims: self.pool_claims,
            burst: self.pool_burst,
            real_kernels: self.pool_real_kernels,
            drained_pool: self.drained_pool,
            drained_claims: self.drained_claims,
            drained_spacing: std::time::Duration::from_millis(self.drained_spacing_ms),
            drained_cold_after_seconds: self.drained_cold_after_seconds,
            bound: std::time::Duration::from_secs(self.pool_bound_seconds),
        }
    }

    pub(super) fn demand(&self) -> demand::Sizes {
        demand::Sizes {
            burst: self.demand_burst,
            fixed: self.demand_fixed_replicas,
            window: std::time::Duration::from_secs(self.demand_window_seconds),
            spacing: std::time::Duration::from_millis(self.demand_claim_spacing_ms),
            bound: std::time::Duration::from_secs(self.pool_bound_seconds),
        }
    }

    pub(super) fn live(&self) -> live::Sizes {
        live::Sizes {
            lines: self.live_lines,
            executors: self.live_executors,
            followers_each: self.live_followers_each,
            file_sizes_mb: self.file_sizes_mb.clone(),
            file_runs: self.file_runs,
        }
    }

    pub(super) fn mcp(&self) -> mcp::McpCounts {
        self.mcp.clone()
    }

    pub(super) fn fork(&self) -> fork::Sizes {
        fork::Sizes {
            runs: self.fork_runs,
            burst: self.fork_burst,
        }
    }
}
