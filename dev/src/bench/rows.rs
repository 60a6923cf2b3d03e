//! The rows of the bench table: one figure each, and the notes that say what it is measured
//! against (targets, the load it ran under).

use std::{collections::BTreeMap, fmt::Write as _};

use super::{
    demand::{Demand, PoolRun, TARGET_WARM_SHARE, Tally, Wave},
    fork::{ApiPer, Forks, TARGET_BURST_FORKS, TARGET_BURST_SECONDS, TARGET_FORK_SECONDS},
    pools::{Claims, TARGET_CLAIM_P50_MS, TARGET_CLAIM_P99_MS},
    scaling::Burst,
    simulated::{
        Cpu, TARGET_EXECUTIONS_PER_SECOND, TARGET_OPERATOR_CORES, TARGET_READS_PER_EXECUTION,
        TARGET_WRITES_PER_EXECUTION,
    },
    stats::Summary,
};

pub(super) struct Row {
    pub(super) scenario: &'static str,
    pub(super) figure: String,
    pub(super) median: String,
    pub(super) p95: String,
    pub(super) notes: String,
}

pub(super) fn ms(value: f64) -> String {
    if value >= 1000.0 {
        format!("{:.2} s", value / 1000.0)
    } else if value >= 100.0 {
        format!("{value:.0} ms")
    } else {
        format!("{value:.1} ms")
    }
}

pub(super) fn times(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".into(), |v| format!("{v:.2}×"))
}

pub(super) fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

pub(super) fn timing(
    scenario: &'static str,
    figure: &str,
    summary: Option<&Summary>,
    notes: String,
) -> Row {
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

pub(super) fn plain(scenario: &'static str, figure: &str, notes: String) -> Row {
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
pub(super) fn burst_notes(b: &Burst, targets: bool) -> String {
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
pub(super) fn cpu_notes(cpu: &Cpu, count: usize, targets: bool) -> String {
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
pub(super) fn pool_rows(rows: &mut Vec<Row>, c: &Claims, targets: bool) {
    let kind = if c.simulated {
        "simulated"
    } else {
        "real kernels"
    };
    let figure = if let (Some(spacing), Some(after)) = (c.spacing_ms, c.cold_after_seconds) {
        format!(
            "{} claims, one every {spacing} ms → Ready, drained pool of {} ({kind}), cold create \
             after {after} s",
            c.claims, c.replicas
        )
    } else if c.at_once {
        format!(
            "{} claim{} at once → Ready, pool of {} ({kind}){}",
            c.claims,
            if c.claims == 1 { "" } else { "s" },
            c.replicas,
            if c.with_env {
                ", each bringing a variable"
            } else {
                ""
            }
        )
    } else {
        format!(
            "claim → Ready, one at a time, pool of {} ({kind})",
            c.replicas
        )
    };
    let mut notes = Vec::new();
    if let Some(s) = &c.claim_ms {
        notes.push(if c.at_once && c.simulated || c.spacing_ms.is_some() {
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
    if let (Some(writes), Some(requests)) = (c.writes_per_claim, c.requests_per_claim) {
        notes.push(format!(
            "the operator's API writes per claim **{writes:.1}** (all requests {requests:.1}), \
             the refill's included; target: the claim path ≤ 2 (it is 2: the take, the record \
             with Ready; a third settles it after)"
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
    if let (Some(floor), Some(claims)) = (&c.floor_ms, &c.claim_ms) {
        rows.push(Row {
            scenario: "8",
            figure: format!(
                "… its floor: the same {} claims' requests sent at once, directly (create, take, \
                 record with Ready; no operator)",
                c.claims
            ),
            median: ms(floor.median),
            p95: ms(floor.p95),
            notes: format!(
                "n={}; p99 {}; the burst over its floor: p50 **{:.2}×**, p99 **{:.2}×** \
                 (target p99 ≤ 2×)",
                floor.n,
                ms(floor.p99),
                claims.median / floor.median,
                claims.p99 / floor.p99
            ),
        });
    }
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

/// Scenario 13's rows of each pool: every claim (with each wave's), the claims after the
/// warm-up wave (with the target when sized by demand), and the warm sandbox-seconds per claim.
pub(super) fn demand_rows(rows: &mut Vec<Row>, d: &Demand) {
    for pool in &d.pools {
        let label = pool.label();
        let mut notes = tally_notes(&pool.all);
        for (i, wave) in pool.waves.iter().enumerate() {
            let notes_of = wave_notes(wave, pool.sized_by_demand());
            notes.push(format!("wave {}: {notes_of}", i + 1));
        }
        rows.push(tally_row(
            format!(
                "claim → Ready, {label}: {} waves of {} claims ({:.0} ms apart)",
                pool.waves.len(),
                d.burst,
                d.claim_spacing_ms
            ),
            &pool.all,
            notes,
        ));
        let mut notes = tally_notes(&pool.after_warmup);
        if pool.sized_by_demand() {
            notes.push(format!("target ≥ {:.0}% warm", TARGET_WARM_SHARE * 100.0));
        }
        rows.push(tally_row(
            format!(
                "… after the warm-up wave (waves 2–{}), {label}",
                pool.waves.len()
            ),
            &pool.after_warmup,
            notes,
        ));
        rows.push(sandbox_row(pool, d));
    }
}

fn percent(part: usize, whole: usize) -> String {
    if whole == 0 {
        return "n/a".into();
    }
    format!("{:.0}%", part as f64 * 100.0 / whole as f64)
}

/// p99, warm, fallbacks and unserved of a tally.
fn tally_notes(t: &Tally) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(s) = &t.claim_ms {
        notes.push(format!("p99 {}", ms(s.p99)));
    }
    notes.push(format!(
        "**warm {} of {} ({})**, {} fell back to a cold create",
        t.warm,
        t.claims,
        percent(t.warm, t.claims),
        t.fallbacks
    ));
    if t.unserved > 0 {
        notes.push(format!("**{} not Ready at the bound**", t.unserved));
    }
    notes
}

fn tally_row(figure: String, t: &Tally, notes: Vec<String>) -> Row {
    let (median, p95) = t.claim_ms.as_ref().map_or_else(
        || ("n/a".into(), "n/a".into()),
        |s| (ms(s.median), ms(s.p95)),
    );
    Row {
        scenario: "13",
        figure,
        median,
        p95,
        notes: match &t.claim_ms {
            Some(s) => format!("n={}; {}", s.n, notes.join("; ")),
            None => notes.join("; "),
        },
    }
}

/// A wave: what the pool was at its start, how far its target went (when sized by `demand`),
/// how the claims went.
fn wave_notes(w: &Wave, demand: bool) -> String {
    let mut notes = String::new();
    if let Some(idle) = w.after_idle_seconds {
        let _ = write!(notes, "after {idle:.1} s idle, ");
    }
    let s = &w.at_start;
    let _ = write!(notes, "pool at {} ({} Ready", s.members, s.ready);
    if demand {
        let target = s.target.map_or("n/a".into(), |t| t.to_string());
        let _ = write!(notes, ", target {target}");
    }
    notes.push(')');
    if let Some(peak) = w.peak_target.filter(|_| demand) {
        let _ = write!(notes, ", target up to {peak}");
        if let Some(d) = &w.demand_at_peak {
            let _ = write!(
                notes,
                " ({} claims in the window, {} per refill of {:.1} s)",
                d.claims_in_window,
                d.peak_per_refill,
                d.refill_millis as f64 / 1000.0
            );
        }
    }
    if let Some((low, high)) = w.refill_ms_range.filter(|_| demand) {
        let _ = write!(
            notes,
            ", refill time {:.1}–{:.1} s",
            low as f64 / 1000.0,
            high as f64 / 1000.0
        );
    }
    if demand {
        let _ = write!(
            notes,
            ", {} members made, target lowered {} times",
            w.members_made, w.target_drops
        );
    }
    let t = &w.tally;
    let _ = write!(
        notes,
        ": warm {} of {}, {} fell back",
        t.warm, t.claims, t.fallbacks
    );
    if t.unserved > 0 {
        let _ = write!(notes, ", {} not Ready", t.unserved);
    }
    if let Some(c) = &t.claim_ms {
        let _ = write!(notes, ", p50 {}, p99 {}", ms(c.median), ms(c.p99));
    }
    notes
}

/// The warm sandbox-seconds per claim of a pool over the schedule.
fn sandbox_row(pool: &PoolRun, d: &Demand) -> Row {
    let per_claim = pool
        .sandbox_seconds_per_claim
        .map_or("n/a".into(), |s| format!("{s:.1} s"));
    Row {
        scenario: "13",
        figure: format!("… warm sandbox-seconds per claim, {}", pool.label()),
        median: per_claim.clone(),
        p95: String::new(),
        notes: format!(
            "**{per_claim}** per claim: {:.0} sandbox-s of unclaimed members over the {:.0} s \
             schedule, {} claims; at most {} unclaimed at once ({} with those being deleted); \
             members made {}: {} claimed, {} deleted unclaimed; target lowered {} times",
            pool.sandbox_seconds,
            d.schedule_seconds,
            pool.all.claims,
            pool.peak_members,
            pool.peak_members_alive,
            pool.members_made,
            pool.members_claimed,
            pool.members_deleted_unclaimed,
            pool.target_drops
        ),
    }
}

/// Scenario 15's rows: a fork and its floor (a fresh executor), forks at once, the source's
/// pause beside one of its actions, and what a fork costs in briq calls and API requests.
pub(super) fn fork_rows(rows: &mut Vec<Row>, f: &Forks) {
    let state = format!("{:.0} MiB of state", f.state_bytes as f64 / 1024.0 / 1024.0);
    let snapshot = match (f.snapshot_bytes, f.snapshot_parts) {
        (Some(bytes), Some(parts)) => format!("snapshot {bytes} bytes in {parts} parts"),
        _ => "snapshot size n/a".into(),
    };
    if let Some(o) = &f.one {
        rows.push(timing(
            "15",
            &format!(
                "one fork → first result ({state}; create → `len(blob) + x` Succeeded, created \
                 right after the fork)"
            ),
            o.fork_ms.as_ref(),
            format!("target p50 ≤ {TARGET_FORK_SECONDS:.0} s; {snapshot}"),
        ));
        rows.push(timing(
            "15",
            "… floor: a fresh executor → first result (same spec, no `forkFrom`; `1 + 1`)",
            o.fresh_ms.as_ref(),
            "what any new executor costs".into(),
        ));
        rows.push(Row {
            scenario: "15",
            figure: "ratio fork / fresh executor (p50)".into(),
            median: times(o.fork_over_fresh_p50),
            p95: String::new(),
            notes: "what the state adds to a new executor".into(),
        });
        rows.push(timing(
            "15",
            "the source's pause per fork (`Forking` → `KernelReady`, seen by a watch)",
            o.pause_ms.as_ref(),
            format!(
                "{} pauses for {} forks; the source's Executions wait meanwhile",
                o.pauses, o.runs
            ),
        ));
        rows.push(timing(
            "15",
            "… beside: one action on the source (`len(blob)`, create → Succeeded)",
            o.source_action_ms.as_ref(),
            String::new(),
        ));
        rows.push(Row {
            scenario: "15",
            figure: "ratio pause / one action on the source (p50)".into(),
            median: times(o.pause_over_action_p50),
            p95: String::new(),
            notes: "a fork costs the source this many of its actions' time".into(),
        });
        let calls = |per: &BTreeMap<String, f64>| {
            let named: Vec<String> = per
                .iter()
                .filter(|(_, n)| **n > 0.0)
                .map(|(op, n)| format!("{op} {n:.1}"))
                .collect();
            if named.is_empty() {
                "none".into()
            } else {
                named.join(", ")
            }
        };
        rows.push(plain(
            "15",
            "briq calls per fork, create → first result (+1 s)",
            format!(
                "{}; a fresh executor: {}",
                calls(&o.calls_per_fork),
                calls(&o.calls_per_fresh)
            ),
        ));
        let api = |a: &ApiPer| {
            let mut by: Vec<(&String, &f64)> = a.by_request.iter().collect();
            by.sort_by(|x, y| y.1.total_cmp(x.1).then(x.0.cmp(y.0)));
            let by: Vec<String> = by
                .iter()
                .filter(|(what, _)| !what.starts_with("watch "))
                .map(|(what, n)| format!("{what} {n:.1}"))
                .collect();
            format!(
                "writes **{:.1}**, reads {:.1} (all requests {:.1}: {})",
                a.writes,
                a.reads,
                a.requests,
                by.join(", ")
            )
        };
        let figure =
            "the operator's API requests per fork, create → first result (+1 s; audit log)";
        match (&o.api_per_fork, &o.api_per_fresh, &o.api_unmeasured) {
            (Some(fork), Some(fresh), _) => rows.push(plain(
                "15",
                figure,
                format!(
                    "{}; a fresh executor: {}; each with its first Execution",
                    api(fork),
                    api(fresh)
                ),
            )),
            (_, _, why) => rows.push(plain(
                "15",
                figure,
                format!(
                    "not measured ({})",
                    why.as_deref().unwrap_or("no audit log")
                ),
            )),
        }
    }
    if let Some(b) = &f.burst {
        let target = if b.forks == TARGET_BURST_FORKS {
            format!("target ≤ {TARGET_BURST_SECONDS:.0} s; ")
        } else {
            format!("target ≤ {TARGET_BURST_SECONDS:.0} s for {TARGET_BURST_FORKS}; ")
        };
        let each = b.each_ms.as_ref().map_or("n/a".into(), |s| {
            format!(
                "each fork create → result p50 {}, max {}",
                ms(s.median),
                ms(s.max)
            )
        });
        rows.push(Row {
            scenario: "15",
            figure: format!(
                "{} forks at once → every fork's first result (first create → last result)",
                b.forks
            ),
            median: ms(b.all_ms),
            p95: String::new(),
            notes: format!(
                "{target}**{} snapshot(s)** saved for them (forks each served: {:?}; {} pause(s) of \
                 the source); {each}; **{}** one fork's p50",
                b.snapshots,
                b.forks_per_snapshot,
                b.pauses,
                times(b.over_one_p50)
            ),
        });
        let each = b.fresh_each_ms.as_ref().map_or("n/a".into(), |s| {
            format!(
                "each create → result p50 {}, max {}",
                ms(s.median),
                ms(s.max)
            )
        });
        rows.push(Row {
            scenario: "15",
            figure: format!(
                "… floor: {} fresh executors at once → every first result (same spec, `1 + 1`)",
                b.forks
            ),
            median: ms(b.fresh_all_ms),
            p95: String::new(),
            notes: format!(
                "{each}; the forks at once took **{}** this",
                times(b.over_fresh)
            ),
        });
    }
}
