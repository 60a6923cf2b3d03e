//! Everything a run measured ([`Report`]), the machine it ran on, and the table printed from it.

use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::{
    agent, cold_start,
    counts::Counts,
    fairness, latency, memory,
    pools::{self, Claims, TARGET_CLAIM_P50_MS, TARGET_CLAIM_P99_MS},
    scaling::{self, Burst},
    simulated::{
        self, Cpu, TARGET_CEILING_SHARE, TARGET_EXECUTIONS_PER_SECOND, TARGET_OPERATOR_CORES,
        TARGET_READS_PER_EXECUTION, TARGET_READY_SECONDS, TARGET_WRITES_PER_EXECUTION,
    },
    stats::Summary,
    traces,
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
    pub simulated: Option<Vec<simulated::Point>>,
    pub api_ceiling: Option<simulated::ApiCeiling>,
    pub pools: Option<pools::Pools>,
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

struct Row {
    scenario: &'static str,
    figure: String,
    median: String,
    p95: String,
    notes: String,
}

fn ms(value: f64) -> String {
    if value >= 1000.0 {
        format!("{:.2} s", value / 1000.0)
    } else if value >= 100.0 {
        format!("{value:.0} ms")
    } else {
        format!("{value:.1} ms")
    }
}

fn times(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".into(), |v| format!("{v:.2}×"))
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn timing(scenario: &'static str, figure: &str, summary: Option<&Summary>, notes: String) -> Row {
    let (median, p95) = summary.map_or_else(
        || ("n/a".into(), "n/a".into()),
        |s| (ms(s.median), ms(s.p95)),
    );
    let notes = match summary {
        Some(s) if notes.is_empty() => format!("n={}", s.n),
        Some(s) => format!("n={}; {notes}", s.n),
        None => notes,
    };
    Row {
        scenario,
        figure: figure.to_owned(),
        median,
        p95,
        notes,
    }
}

fn plain(scenario: &'static str, figure: &str, notes: String) -> Row {
    Row {
        scenario,
        figure: figure.to_owned(),
        median: String::new(),
        p95: String::new(),
        notes,
    }
}

/// Throughput, API cost and what went wrong of a burst of Executions; with scenario 7's
/// targets when `targets`.
fn burst_notes(b: &Burst, targets: bool) -> String {
    let mut notes = format!(
        "**{:.1} executions/s** ({} in {:.1} s",
        b.executions_per_second, b.finished, b.wall_seconds
    );
    if targets {
        let _ = write!(notes, "; target ≥ {TARGET_EXECUTIONS_PER_SECOND:.0}/s");
    }
    let _ = write!(
        notes,
        "); API reads {:.2}, writes {:.2} per Execution",
        b.reads_per_execution, b.writes_per_execution
    );
    if targets {
        let _ = write!(
            notes,
            " (targets ≤ {TARGET_READS_PER_EXECUTION}, ≤ {TARGET_WRITES_PER_EXECUTION:.0})"
        );
    }
    if !b.complete {
        let _ = write!(
            notes,
            "; **partial: {} of {} unfinished at the bound**, latency of the finished only",
            b.executions - b.finished,
            b.executions
        );
    }
    if b.api_errors > 0 {
        let _ = write!(notes, "; {} API 5xx/429 answers", b.api_errors);
    }
    if let Some(why) = &b.unverified {
        let _ = write!(notes, "; outputs not checked ({why})");
    }
    notes
}

/// The operator's and the API server's CPU per object of a phase (`count` of them); with the
/// operator's targets when `targets`.
fn cpu_notes(cpu: &Cpu, count: usize, targets: bool) -> String {
    let mut notes = format!(
        "operator **{:.2} ms** ({:.2} cores busy), API server (kube-apiserver + etcd) {:.2} ms",
        cpu.operator_per(count),
        cpu.operator_cores(),
        cpu.api_server_per(count),
    );
    if targets {
        let _ = write!(
            notes,
            " (targets: the operator below the API server, < {TARGET_OPERATOR_CORES:.0} core)"
        );
    }
    let _ = write!(notes, "; over {:.1} s", cpu.wall_ms / 1000.0);
    notes
}

/// Scenario 8's rows of one phase: its claims (with the targets when `targets`), its cold
/// creates and the ratio of the two.
fn pool_rows(rows: &mut Vec<Row>, c: &Claims, targets: bool) {
    let kind = if c.simulated {
        "simulated"
    } else {
        "real kernels"
    };
    let figure = if c.at_once {
        format!(
            "{} claim{} at once → Ready, pool of {} ({kind})",
            c.claims,
            if c.claims == 1 { "" } else { "s" },
            c.replicas
        )
    } else {
        format!(
            "claim → Ready, one at a time, pool of {} ({kind})",
            c.replicas
        )
    };
    let mut notes = Vec::new();
    if let Some(s) = &c.claim_ms {
        notes.push(if c.at_once && c.simulated {
            format!("p90 {}, p99 {}", ms(s.p90), ms(s.p99))
        } else if c.at_once {
            format!("max {}", ms(s.max))
        } else {
            format!("p99 **{}**", ms(s.p99))
        });
    }
    if let (Some(call), Some(after)) = (&c.create_call_ms, &c.after_create_ms) {
        notes.push(format!(
            "of which the create calls themselves p50 {}, p99 {}; answered → Ready p50 {}, p99 {}",
            ms(call.median),
            ms(call.p99),
            ms(after.median),
            ms(after.p99)
        ));
    }
    if targets {
        notes.push(format!(
            "target p50 ≤ {TARGET_CLAIM_P50_MS:.0} ms, p99 ≤ {:.0} s",
            TARGET_CLAIM_P99_MS / 1000.0
        ));
    }
    let claimed = c.claim_ms.as_ref().map_or(0, |s| s.n);
    notes.push(format!(
        "handed over {} of {claimed} Ready, **{} fell back** to a cold create",
        c.handed_over, c.fallbacks
    ));
    match (&c.refill_ms, c.at_once) {
        (Some(s), true) => notes.push(format!(
            "pool full again **{}** after the first create",
            ms(s.max)
        )),
        (Some(s), false) => notes.push(format!(
            "pool full again {} after each claim's create (median; max {})",
            ms(s.median),
            ms(s.max)
        )),
        (None, _) => {}
    }
    if let Some(fill) = c.fill_seconds {
        notes.push(format!("pool filled in {fill:.1} s at first"));
    }
    if let Some(why) = &c.partial {
        notes.push(format!("**partial: {why}**"));
    }
    let median = c.claim_ms.as_ref().map_or("n/a".into(), |s| ms(s.median));
    rows.push(Row {
        scenario: "8",
        figure,
        median,
        p95: c.claim_ms.as_ref().map_or("n/a".into(), |s| ms(s.p95)),
        notes: match &c.claim_ms {
            Some(s) => format!("n={}; {}", s.n, notes.join("; ")),
            None => notes.join("; "),
        },
    });
    if c.cold_ms.is_none() {
        return;
    }
    let extra = c
        .cold_ms
        .as_ref()
        .filter(|s| s.n > 1)
        .map(|s| format!("p99 {}; without poolRef, same server", ms(s.p99)));
    rows.push(timing(
        "8",
        &format!("cold create → Ready, one at a time ({kind})"),
        c.cold_ms.as_ref(),
        extra.unwrap_or_else(|| "without poolRef, same server".into()),
    ));
    rows.push(Row {
        scenario: "8",
        figure: format!("ratio cold create / claim ({kind}, medians)"),
        median: times(c.cold_over_claim),
        p95: String::new(),
        notes: "what a warm pool saves".into(),
    });
}

/// The figures as a Markdown table, headed by the machine.
pub fn table(report: &Report) -> String {
    let mut rows = Vec::new();
    if let Some(l) = &report.latency {
        rows.push(timing(
            "1",
            "per action via the operator (create → Succeeded, watched)",
            l.operator_ms.as_ref(),
            String::new(),
        ));
        rows.push(timing(
            "1",
            "per action, direct bridge call (`Session::run`, same sandbox)",
            l.direct_ms.as_ref(),
            String::new(),
        ));
        rows.push(Row {
            scenario: "1",
            figure: "ratio operator / direct".into(),
            median: times(l.ratio_median),
            p95: times(l.ratio_p95),
            notes: "target ≤ 2× (issue 28)".into(),
        });
        rows.push(Row {
            scenario: "1",
            figure: "… the operator path's API floor: 1 status write".into(),
            median: l
                .operator_api_floor_ms
                .map_or(String::new(), |ms| format!("{ms:.1} ms")),
            p95: String::new(),
            notes: format!(
                "measured alone on this API server: status write {1} (median; a LIST, which the \
                 path no longer makes, {0})",
                l.list_ms
                    .as_ref()
                    .map_or("n/a".into(), |s| format!("{:.1} ms", s.median)),
                l.status_write_ms
                    .as_ref()
                    .map_or("n/a".into(), |s| format!("{:.1} ms", s.median)),
            ),
        });
        rows.push(Row {
            scenario: "1",
            figure: "ratio direct / floor (exec of `true` + kernel time, medians)".into(),
            median: times(l.direct_over_floor),
            p95: String::new(),
            notes: format!(
                "target ≤ 1.5×; floor {}",
                l.floor_ms.map_or("n/a".into(), |ms| format!("{ms:.1} ms"))
            ),
        });
        rows.push(timing(
            "1",
            "… of which the kernel ran the code (bridge's `duration_ms`)",
            l.kernel_duration_ms.as_ref(),
            String::new(),
        ));
        rows.push(timing(
            "1",
            "sandbox exec of `python3 -I -S -c pass`",
            l.python_isolated_start_ms.as_ref(),
            "how the run client starts: every action pays it".into(),
        ));
        rows.push(timing(
            "1",
            "sandbox exec of `python3 -c pass`",
            l.python_start_ms.as_ref(),
            String::new(),
        ));
        rows.push(timing(
            "1",
            "sandbox exec of `python3` importing the Jupyter client",
            l.python_import_jupyter_client_ms.as_ref(),
            "what a bridge `run` would import without its runner".into(),
        ));
        rows.push(timing(
            "1",
            "raw sandbox exec of `true` (the floor)",
            l.raw_exec_true_ms.as_ref(),
            String::new(),
        ));
    }
    if let Some(a) = &report.agent_step {
        let figure = "agent step, `KubernetesExecutor.run_code_raise_errors`";
        match &a.unavailable {
            Some(reason) => rows.push(plain("2", figure, format!("n/a ({reason})"))),
            None => rows.push(timing("2", figure, a.executor_ms.as_ref(), String::new())),
        }
        rows.push(timing(
            "2",
            "agent step, direct bridge call",
            a.direct_ms.as_ref(),
            String::new(),
        ));
        rows.push(Row {
            scenario: "2",
            figure: "ratio executor / direct".into(),
            median: times(a.ratio_median),
            p95: String::new(),
            notes: String::new(),
        });
    }
    for p in report.scaling.iter().flatten() {
        let mut notes = burst_notes(&p.burst, false);
        if p.setup_failures > 0 {
            let _ = write!(
                notes,
                "; {} executor setups failed and were repeated",
                p.setup_failures
            );
        }
        rows.push(timing(
            "3",
            &format!(
                "{} executor{} × {} actions, all created at once",
                p.executors,
                if p.executors == 1 { "" } else { "s" },
                p.actions_per_executor
            ),
            p.burst.latency_ms.as_ref(),
            notes,
        ));
    }
    if let Some(c) = &report.api_cost {
        rows.push(plain(
            "4",
            "API requests per Execution (operator, audit log)",
            format!(
                "reads {:.2}, writes {:.2}, watch requests {:.2} ({} in {} Executions); target ≤ 1 read, ≤ 3 writes",
                c.reads_per_execution,
                c.writes_per_execution,
                c.watch_requests_per_execution,
                c.watch_requests,
                c.executions
            ),
        ));
        let mut by: Vec<(&String, &f64)> = c.requests_per_execution.iter().collect();
        by.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
        rows.push(plain(
            "4",
            "… by request",
            by.iter()
                .filter(|(what, _)| !what.starts_with("watch "))
                .map(|(what, per)| format!("{what} {per:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
        ));
        let w = &c.watch_events_per_execution;
        rows.push(plain(
            "4",
            "watch events per Execution",
            format!(
                "{:.2} (Execution {:.2}, BriqExecutor {:.2})",
                w.total, w.executions, w.executors
            ),
        ));
    }
    if let Some(m) = &report.memory {
        rows.push(plain(
            "5",
            "operator peak RSS (VmHWM), idle",
            format!("{} (RSS now {})", mib(m.idle_peak_kib), mib(m.idle_rss_kib)),
        ));
        rows.push(plain(
            "5",
            &format!(
                "operator peak RSS, {} Ready executors (simulated sandboxes)",
                m.executors
            ),
            format!(
                "{} (RSS now {}: {:+.1} KiB per executor)",
                mib(m.with_executors_peak_kib),
                mib(m.with_executors_rss_kib),
                m.per_executor_kib
            ),
        ));
        rows.push(plain(
            "5",
            &format!(
                "operator RSS, {} queued Executions of the largest code",
                m.queued_largest
            ),
            format!(
                "{} ({} with the executors alone)",
                mib(m.with_queued_rss_kib),
                mib(m.with_executors_rss_kib)
            ),
        ));
        rows.push(plain(
            "5",
            &format!("operator RSS after {} create/delete cycles", m.cycles),
            mib(m.after_cycles_rss_kib),
        ));
        rows.push(plain(
            "5",
            &format!(
                "operator peak RSS, started on {} Ready executors + {} finished Executions",
                m.executors, m.executions
            ),
            format!(
                "**{}** (target ≤ 64 MiB; RSS now {}: {:+.2} KiB per Execution)",
                mib(m.with_executions_peak_kib),
                mib(m.with_executions_rss_kib),
                m.per_execution_kib
            ),
        ));
    }
    if let Some(c) = &report.cold_start {
        rows.push(timing(
            "6",
            "cold start create → Ready, prebuilt image (every dependency present)",
            c.preinstalled_ms.as_ref(),
            format!(
                "setup made no pip call in **{} of {}** runs (the Ready Event says)",
                c.preinstalled_without_pip, c.runs
            ),
        ));
        let figure = "cold start create → Ready, dependencies pip-installed";
        match &c.pip_unavailable {
            Some(reason) => rows.push(plain("6", figure, format!("n/a ({reason})"))),
            None => rows.push(timing("6", figure, c.pip_ms.as_ref(), String::new())),
        }
    }
    if let Some(t) = &report.traces {
        rows.push(timing(
            "9",
            "Execution create → Succeeded, traces off (simulated sandbox, release operator)",
            t.off_ms.as_ref(),
            String::new(),
        ));
        let ratio = super::stats::ratio(
            t.on_ms.as_ref().map(|s| s.median),
            t.off_ms.as_ref().map(|s| s.median),
        );
        rows.push(timing(
            "9",
            "the same, every span exported over OTLP/HTTP",
            t.on_ms.as_ref(),
            format!(
                "**{}** the median with traces off; {} exports, {:.1} KiB for {} Executions and \
                 the executor's provisioning",
                times(ratio),
                t.exports,
                t.export_bytes as f64 / 1024.0,
                t.executions_traced
            ),
        ));
    }
    for p in report.simulated.iter().flatten() {
        let mut notes = format!("all Ready in **{:.1} s**", p.ready_seconds);
        if p.ready < p.executors {
            notes = format!(
                "**partial: {} of {} not Ready at the bound** ({:.1} s)",
                p.executors - p.ready,
                p.executors,
                p.ready_seconds
            );
        }
        let _ = write!(notes, " (target ≤ {TARGET_READY_SECONDS:.0} s for 1,000)");
        rows.push(timing(
            "7",
            &format!(
                "{} simulated executors created at once → all Ready",
                p.executors
            ),
            p.ready_ms.as_ref(),
            notes,
        ));
        let figure = format!(
            "{} simulated executors × {} actions, all created at once",
            p.executors, p.actions_per_executor
        );
        rows.push(plain(
            "7",
            &format!("… CPU per Ready executor ({} at once)", p.executors),
            cpu_notes(&p.ready_cpu, p.ready, false),
        ));
        match (&p.executions, &p.executions_cpu) {
            (Some(burst), cpu) => {
                rows.push(timing(
                    "7",
                    &figure,
                    burst.latency_ms.as_ref(),
                    burst_notes(burst, true),
                ));
                if let Some(cpu) = cpu {
                    rows.push(plain(
                        "7",
                        &format!(
                            "… CPU per Execution ({} × {})",
                            p.executors, p.actions_per_executor
                        ),
                        cpu_notes(cpu, burst.finished, true),
                    ));
                }
                if let Some(c) = &report.api_ceiling {
                    let share = burst.executions_per_second / c.executions_per_second.max(1e-9);
                    rows.push(plain(
                        "7",
                        &format!(
                            "… share of the API server's ceiling ({} × {})",
                            p.executors, p.actions_per_executor
                        ),
                        format!(
                            "**{:.0}%** ({:.1} of {:.1} executions/s; target ≥ {:.0}% at 1,000 × 10)",
                            share * 100.0,
                            burst.executions_per_second,
                            c.executions_per_second,
                            TARGET_CEILING_SHARE * 100.0
                        ),
                    ));
                }
            }
            (None, _) => rows.push(plain(
                "7",
                &figure,
                "not measured: the executors were not all Ready".into(),
            )),
        }
    }
    if let Some(c) = &report.api_ceiling {
        rows.push(plain(
            "7",
            "the API server alone: each Execution's create and 2 status writes",
            format!(
                "**{:.1} executions/s** ({} in {:.1} s, {} at once, no operator): the ceiling of the rows above on this machine",
                c.executions_per_second, c.executions, c.seconds, c.concurrency
            ),
        ));
    }
    if let Some(p) = &report.pools {
        if let Some(c) = &p.one_at_a_time {
            pool_rows(&mut rows, c, true);
        }
        if let Some(c) = &p.burst {
            pool_rows(&mut rows, c, false);
        }
        if let Some(c) = &p.real_kernels {
            pool_rows(&mut rows, c, false);
        }
    }
    if let Some(f) = &report.fairness {
        let target = format!(
            "target ≤ {:.0} ms; {} long actions of another namespace in flight, {} work slots",
            super::fairness::TARGET_QUIET_MS,
            f.noisy_in_flight,
            f.work_slots
        );
        rows.push(timing(
            "10",
            "a quiet namespace's one-line action, create → end, with more long actions of a noisy namespace in flight than work slots",
            f.quiet_ms.as_ref(),
            target,
        ));
    }
    for (scenario, error) in &report.errors {
        let line: String = error.split_whitespace().collect::<Vec<_>>().join(" ");
        let short: String = line.chars().take(300).collect();
        rows.push(plain("!", &format!("scenario {scenario} failed"), short));
    }

    let m = &report.machine;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "briq-bench ({} run, {:.0} s, commit {})",
        if report.quick { "quick" } else { "full" },
        report.wall_seconds,
        m.commit.as_deref().unwrap_or("unknown")
    );
    let _ = writeln!(
        out,
        "machine: {} CPUs ({}), {:.1} GiB, Linux {}; load average at start {}\n",
        m.cpus, m.cpu_model, m.memory_gib, m.kernel, m.load_average_at_start
    );
    let header = Row {
        scenario: "#",
        figure: "figure".into(),
        median: "median".into(),
        p95: "p95".into(),
        notes: "notes".into(),
    };
    let cells = |r: &Row| {
        [
            r.scenario.to_owned(),
            r.figure.clone(),
            r.median.clone(),
            r.p95.clone(),
            r.notes.clone(),
        ]
    };
    let all: Vec<[String; 5]> = std::iter::once(&header).chain(&rows).map(cells).collect();
    let mut widths = [0usize; 5];
    for row in &all {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |row: &[String; 5]| {
        let padded: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell}{}", " ".repeat(w - cell.chars().count())))
            .collect();
        format!("| {} |", padded.join(" | "))
    };
    let _ = writeln!(out, "{}", line(&all[0]));
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    let _ = writeln!(out, "|-{}-|", rule.join("-|-"));
    for row in &all[1..] {
        let _ = writeln!(out, "{}", line(row));
    }
    out
}
