//! The figures of a run as a Markdown table, headed by the machine.

use std::fmt::Write as _;

use super::{
    report::Report,
    rows::{
        Row, burst_notes, cpu_notes, demand_rows, fork_rows, mib, ms, plain, pool_rows, times,
        timing,
    },
    simulated::{TARGET_CEILING_SHARE, TARGET_READY_SECONDS},
};

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
        if let Some(parts) = &l.path_parts {
            let pieces = [
                (
                    "… the create call, sent → received (the API server's clock)",
                    &parts.create_sent_ms,
                ),
                ("… the create call, received → answered", &parts.create_ms),
                (
                    "… created → the operator's result write (its watch, reconcile, the exec)",
                    &parts.created_to_result_write_ms,
                ),
                ("… the result write itself", &parts.result_write_ms),
                (
                    "… written → the client's watch saw it",
                    &parts.written_to_seen_ms,
                ),
            ];
            for (figure, summary) in pieces {
                rows.push(timing("1", figure, summary.as_ref(), String::new()));
            }
        }
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
    if let Some(c) = &report.cancel {
        rows.push(timing(
            "11",
            "cancel → Cancelled, interrupted (kernel and state kept)",
            c.interrupted_ms.as_ref(),
            format!(
                "target ≤ {:.0} s",
                super::cancel::TARGET_INTERRUPTED_SECONDS
            ),
        ));
        let next = match (&c.next_after_restart_failed, &c.next_after_restart_ms) {
            (Some(_), _) => "**failed** (see below)".into(),
            (None, Some(s)) => format!("{} (median)", ms(s.median)),
            (None, None) => "n/a".into(),
        };
        rows.push(timing(
            "11",
            "cancel → Cancelled, kernel restarted (code ignores the interrupt)",
            c.restarted_ms.as_ref(),
            format!(
                "includes the {} s grace; the next action (first on the fresh kernel) create → \
                 Succeeded {next}",
                briq_operator::controller::CANCEL_GRACE.as_secs()
            ),
        ));
    }
    for point in report.suspend.iter().flatten() {
        let mb = point.state_mb;
        rows.push(timing(
            "12",
            &format!("suspend → Suspended, {mb} MB of user state (saved, sandbox stopped)"),
            point.suspend_ms.as_ref(),
            format!("{} bytes saved", point.saved_bytes),
        ));
        let target = if mb == super::suspend::TARGET_STATE_MB {
            format!("target ≤ {:.0} s", super::suspend::TARGET_RESUME_SECONDS)
        } else {
            String::new()
        };
        rows.push(timing(
            "12",
            &format!(
                "Execution created while suspended → Succeeded, {mb} MB (resume: start, kernel, \
                 restore; then the action)"
            ),
            point.resume_ms.as_ref(),
            target,
        ));
    }
    if let Some(l) = &report.live {
        live_rows(&mut rows, l);
    }
    if let Some(f) = &report.fork {
        fork_rows(&mut rows, f);
    }
    if let Some(m) = &report.mcp {
        mcp_rows(&mut rows, m);
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
        if let Some(c) = &p.real_kernels_env {
            pool_rows(&mut rows, c, false);
        }
        if let Some(c) = &p.drained {
            pool_rows(&mut rows, c, false);
        }
    }
    if let Some(d) = &report.demand {
        demand_rows(&mut rows, d);
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

/// Scenario 14's rows: each figure beside its floor, measured in the same run.
fn live_rows(rows: &mut Vec<Row>, l: &super::live::LiveFiles) {
    let p99 = |s: Option<&super::stats::Summary>| s.map_or("n/a".into(), |s| ms(s.p99));
    if let Some(lag) = &l.lag {
        rows.push(timing(
            "14",
            "print → line read, follower of the log subresource (kube-apiserver, aggregated API)",
            lag.operator_ms.as_ref(),
            format!(
                "p99 {}; target p50 ≤ {:.0} ms; a line every 200 ms",
                p99(lag.operator_ms.as_ref()),
                super::live::TARGET_LAG_P50_MS
            ),
        ));
        rows.push(timing(
            "14",
            "… floor: the same lines read directly (bridge `follow`, briq async exec)",
            lag.direct_ms.as_ref(),
            format!("p99 {}", p99(lag.direct_ms.as_ref())),
        ));
        rows.push(Row {
            scenario: "14",
            figure: "ratio follower / direct read (p50)".into(),
            median: times(lag.ratio_p50),
            p95: String::new(),
            notes: format!("p99 ratio {}", times(lag.ratio_p99)),
        });
    }
    if let Some(f) = &l.followers {
        let cores = |cpu: f64, wall: f64| if wall > 0.0 { cpu / wall } else { f64::NAN };
        let range = |counts: &[usize]| match (counts.iter().min(), counts.iter().max()) {
            (Some(min), Some(max)) if min == max => format!("{min}"),
            (Some(min), Some(max)) => format!("{min} to {max}"),
            _ => "n/a".into(),
        };
        let (readers, at_once) = (
            range(&f.readers_per_action),
            range(&f.readers_at_once_per_action),
        );
        rows.push(plain(
            "14",
            &format!(
                "{} followers of {} actions ({} each, {} lines): this process's CPU and RSS",
                f.executors * f.followers_each,
                f.executors,
                f.followers_each,
                f.lines
            ),
            format!(
                "CPU **{:.0} ms** over {:.1} s ({:.2} cores) against {:.0} ms over {:.1} s ({:.2} \
                 cores) for the same actions unfollowed (floor); RSS {} → {} ({:+.1} MiB); \
                 everything in-process counts (controllers, aggregated API, local sandbox \
                 server, the followers' clients); {} of {} followers read every line",
                f.followed_cpu_ms,
                f.followed_wall_ms / 1000.0,
                cores(f.followed_cpu_ms, f.followed_wall_ms),
                f.unfollowed_cpu_ms,
                f.unfollowed_wall_ms / 1000.0,
                cores(f.unfollowed_cpu_ms, f.unfollowed_wall_ms),
                mib(f.rss_before_kib),
                mib(f.rss_after_kib),
                (f.rss_after_kib as f64 - f.rss_before_kib as f64) / 1024.0,
                f.complete,
                f.executors * f.followers_each,
            ),
        ));
        rows.push(plain(
            "14",
            "`follow` readers started per action",
            format!(
                "**{readers}** started, **{at_once}** at once (bridge `follow` processes of \
                 each attempt seen on the host every 250 ms; one that starts before the sandbox \
                 knows the attempt exits and is started again; target 1)"
            ),
        ));
        rows.push(timing(
            "14",
            "… print → line read, over every follower",
            f.lag_ms.as_ref(),
            format!("p99 {}", p99(f.lag_ms.as_ref())),
        ));
    }
    for p in &l.files {
        let size = format!("{:.0} MB", p.bytes as f64 / 1e6);
        let rate = |s: Option<&super::stats::Summary>| {
            p.mb_per_second(s)
                .map_or("n/a".into(), |r| format!("{r:.1} MB/s"))
        };
        let pairs = [
            ("PUT", &p.put_ms, "write", &p.direct_write_ms),
            ("GET", &p.get_ms, "read", &p.direct_read_ms),
        ];
        for (verb, operator, direct_verb, direct) in pairs {
            let ratio = super::stats::ratio(
                operator.as_ref().map(|s| s.median),
                direct.as_ref().map(|s| s.median),
            );
            rows.push(Row {
                scenario: "14",
                figure: format!("file {verb} via the files subresource, {size} random bytes"),
                median: rate(operator.as_ref()),
                p95: String::new(),
                notes: format!(
                    "median {}, n={}; floor: direct briq {direct_verb} of the same bytes in 512 \
                     KiB parts {} ({}); **{}** the floor's time",
                    operator.as_ref().map_or("n/a".into(), |s| ms(s.median)),
                    operator.as_ref().map_or(0, |s| s.n),
                    rate(direct.as_ref()),
                    direct.as_ref().map_or("n/a".into(), |s| ms(s.median)),
                    times(ratio),
                ),
            });
        }
    }
}

fn mcp_rows(rows: &mut Vec<Row>, m: &super::mcp::Mcp) {
    rows.push(timing(
        "16",
        "MCP `run_python(\"1 + 1\")` (official SDK, kube-apiserver, ServiceAccount token)",
        m.run_python_ms.as_ref(),
        String::new(),
    ));
    rows.push(timing(
        "16",
        "floor: the same action through `KubernetesExecutor`",
        m.client_ms.as_ref(),
        String::new(),
    ));
    rows.push(Row {
        scenario: "16",
        figure: "ratio MCP / Python client (target p50 ≤ 1.3×)".into(),
        median: times(m.ratio_median),
        p95: times(m.ratio_p95),
        notes: String::new(),
    });
    rows.push(timing(
        "16",
        &format!(
            "{} MCP sessions at once × {} actions on {} executors: one action",
            m.sessions, m.session_actions, m.executors
        ),
        m.session_action_ms.as_ref(),
        format!(
            "{} completed, {} failed in {:.1} s; this process {:.1} s CPU, RSS {} → {}",
            m.completed,
            m.failed,
            m.sessions_wall_ms / 1000.0,
            m.sessions_cpu_ms / 1000.0,
            mib(m.rss_before_kib),
            mib(m.rss_after_kib)
        ),
    ));
    rows.push(timing(
        "16",
        "a print → its MCP notification at the client",
        m.notification_lag_ms.as_ref(),
        String::new(),
    ));
    rows.push(timing(
        "16",
        "floor: a print → a follower of the log subresource",
        m.log_lag_ms.as_ref(),
        String::new(),
    ));
    rows.push(Row {
        scenario: "16",
        figure: "ratio notification / log lag (target p50 ≤ 1.5×)".into(),
        median: times(m.lag_ratio_median),
        p95: String::new(),
        notes: String::new(),
    });
}
