//! `describe EXECUTOR`: one BriqExecutor the way `kubectl describe` shows an object: its spec
//! essentials, sandbox, conditions, queue, most recent Executions and Events. Everything shown
//! is read, never acted on; text from the cluster is made [`printable`] first.

use k8s_openapi::{
    api::events::v1::Event, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp,
};
use kube::{Api, ResourceExt, api::ListParams};

use super::{
    cluster::{Cluster, NamespaceArg},
    error::Error,
    exit::Exit,
    get::Listed,
    output::{emit, printable},
    status::{phase, without_results},
    table::{self, age, elapsed, human},
};
use crate::crd::{BriqExecutor, Execution, reasons::Phase, run_order};

#[derive(clap::Args)]
pub struct Args {
    /// The BriqExecutor to describe.
    executor: String,

    #[command(flatten)]
    namespace: NamespaceArg,

    /// How many of its most recent Executions to list.
    #[arg(long, value_name = "N", default_value_t = 10)]
    executions: usize,
}

pub async fn run(args: Args) -> Result<Exit, Error> {
    let cluster = Cluster::connect(args.namespace).await?;
    let executor = cluster
        .api::<BriqExecutor>()
        .get_opt(&args.executor)
        .await?
        .ok_or_else(|| Error::ExecutorNotFound {
            name: args.executor.clone(),
            namespace: cluster.namespace.clone(),
        })?;
    let executions = executions_of(&cluster.api(), &args.executor).await?;
    // As kubectl describe: Events that cannot be read (no RBAC on them) are noted, not fatal.
    let (events, note) = match events_about(&cluster.api(), &executor).await {
        Ok(events) => (Some(events), String::new()),
        Err(error) => (None, format!("warning: cannot list Events: {error}\n")),
    };
    let shown = View {
        executor: &executor,
        executions: &executions,
        events: events.as_deref(),
        recent: args.executions,
        now: Timestamp::now(),
    };
    emit(&shown.render(), &note);
    Ok(Exit::Ok)
}

/// Every Execution of `executor` (selected by the API server on `spec.executorRef.name`), a
/// page at a time, kept [`without_results`].
async fn executions_of(api: &Api<Execution>, executor: &str) -> Result<Vec<Execution>, Error> {
    let selector = format!("spec.executorRef.name={executor}");
    let mut params = ListParams::default().fields(&selector).limit(500);
    let mut all = Vec::new();
    loop {
        let page = api.list(&params).await?;
        all.extend(page.items.into_iter().map(without_results));
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(all),
        }
    }
}

/// The Events about this very executor (its uid: not a deleted namesake's), as the operator
/// records them (`events.k8s.io/v1`).
async fn events_about(api: &Api<Event>, executor: &BriqExecutor) -> Result<Vec<Event>, Error> {
    let Some(uid) = executor.uid() else {
        return Ok(Vec::new());
    };
    let params = ListParams::default().fields(&format!("regarding.uid={uid}"));
    Ok(api.list(&params).await?.items)
}

/// What `describe` prints, from objects already fetched.
struct View<'a> {
    executor: &'a BriqExecutor,
    /// The executor's Executions, in any order.
    executions: &'a [Execution],
    /// `None` when they could not be listed.
    events: Option<&'a [Event]>,
    /// How many of the most recent Executions to list.
    recent: usize,
    now: Timestamp,
}

const NONE: &str = "<none>";

/// How many Executions ran: the executor's count, which is written in batches (at most every
/// 30 s), or, while it lags behind the finished Executions listed here, those, said as such.
fn executions_run(written: Option<u64>, listed_finished: usize) -> String {
    let written = written.unwrap_or(0);
    let listed = listed_finished as u64;
    if listed > written {
        format!("{listed} (as listed; the count written so far, {written}, lags by up to 30 s)")
    } else {
        written.to_string()
    }
}

impl View<'_> {
    fn render(&self) -> String {
        let executor = self.executor;
        let spec = &executor.spec;
        let status = executor.status.clone().unwrap_or_default();
        let mut out = String::new();
        fields(
            &mut out,
            "",
            &[
                ("Name", executor.name_any()),
                ("Namespace", executor.namespace().unwrap_or_default()),
                ("Age", age(executor, self.now)),
            ],
        );
        out.push_str("Spec:\n");
        fields(
            &mut out,
            "  ",
            &[
                ("Image", spec.image.clone()),
                ("Size", spec.size.clone().unwrap_or("<plan default>".into())),
                (
                    "Packages",
                    or_none(spec.packages.as_deref().map(|p| p.join(", "))),
                ),
                (
                    "Pool",
                    or_none(spec.pool_ref.as_ref().map(|p| p.name.clone())),
                ),
                (
                    "Forked From",
                    or_none(spec.fork_from.as_ref().map(|f| f.name.clone())),
                ),
                ("Sleep", spec.sleep.clone()),
                ("Setup Timeout", format!("{}s", spec.setup_timeout_seconds)),
                (
                    "Execution Timeout",
                    format!("{}s", spec.execution_timeout_seconds),
                ),
                ("Idle Timeout", seconds(spec.idle_timeout_seconds)),
                ("Idle Action", format!("{:?}", spec.idle_action)),
                (
                    "Max Queued Executions",
                    spec.max_queued_executions.to_string(),
                ),
                (
                    "History Limit",
                    or_none(spec.execution_history_limit.map(|n| n.to_string())),
                ),
                (
                    "Execution TTL",
                    seconds(spec.execution_ttl_seconds_after_finished),
                ),
            ],
        );
        out.push_str("Status:\n");
        let unusable = match (status.unusable, status.unusable_reason) {
            (false, _) => "no".to_owned(),
            (true, reason) => format!("yes: {}", reason.as_deref().unwrap_or("-")),
        };
        fields(
            &mut out,
            "  ",
            &[
                ("Sandbox", or_none(status.sandbox_id)),
                (
                    "Sandbox Created",
                    self.ago(status.sandbox_created_time.as_ref()),
                ),
                ("Kernel Ready", self.ago(status.ready_time.as_ref())),
                ("Unusable", unusable),
                (
                    "Executions Run",
                    executions_run(
                        status.executions_total,
                        self.executions.iter().filter(|e| e.finished()).count(),
                    ),
                ),
                (
                    "Last Execution",
                    self.ago(status.last_execution_time.as_ref()),
                ),
            ],
        );

        if let Some(suspension) = &status.suspension {
            self.suspension(&mut out, suspension);
        }
        if let Some(fork) = &status.fork {
            self.fork(&mut out, fork);
        }

        out.push_str("Conditions:\n");
        let conditions: Vec<Vec<String>> = status
            .conditions
            .iter()
            .map(|c| {
                vec![
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    human(elapsed(&c.last_transition_time, self.now)),
                    c.message.clone(),
                ]
            })
            .collect();
        indented_table(
            &mut out,
            &["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"],
            &conditions,
        );

        self.queue(&mut out);
        self.recent_executions(&mut out);
        self.events(&mut out);
        out
    }

    /// The running Execution(s) (one, unless a status says otherwise) and how many wait.
    fn queue(&self, out: &mut String) {
        let mut live: Vec<&Execution> = self
            .executions
            .iter()
            .filter(|e| e.metadata.deletion_timestamp.is_none())
            .collect();
        live.sort_by_key(|e| run_order(&e.metadata));
        let running: Vec<String> = live
            .iter()
            .filter(|e| phase(e) == Phase::Running)
            .map(|e| {
                let started = e.status.as_ref().and_then(|s| s.start_time.as_ref());
                match started {
                    Some(start) => {
                        format!("{} (for {})", e.name_any(), human(elapsed(start, self.now)))
                    }
                    None => e.name_any(),
                }
            })
            .collect();
        let waiting: Vec<&&Execution> =
            live.iter().filter(|e| phase(e) == Phase::Waiting).collect();
        let waiting = match waiting.first() {
            Some(next) => format!("{} (next: {})", waiting.len(), next.name_any()),
            None => "0".to_owned(),
        };
        out.push_str("Queue:\n");
        fields(
            out,
            "  ",
            &[
                ("Running", or_none(Some(running.join(", ")))),
                ("Waiting", waiting),
            ],
        );
    }

    /// The most recent Executions, newest first, as `get executions` shows them (without the
    /// executor column: it is this one).
    fn recent_executions(&self, out: &mut String) {
        let mut newest: Vec<&Execution> = self.executions.iter().collect();
        newest.sort_by_key(|e| std::cmp::Reverse(run_order(&e.metadata)));
        newest.truncate(self.recent);
        out.push_str(&format!(
            "Executions ({} most recent of {}):\n",
            newest.len(),
            self.executions.len()
        ));
        let keep = |header: &&str| *header != "EXECUTOR";
        let headers: Vec<&str> = Execution::HEADERS.iter().copied().filter(keep).collect();
        let rows: Vec<Vec<String>> = newest
            .iter()
            .map(|e| {
                e.row(self.now)
                    .into_iter()
                    .zip(Execution::HEADERS)
                    .filter(|(_, header)| keep(header))
                    .map(|(cell, _)| cell)
                    .collect()
            })
            .collect();
        indented_table(out, &headers, &rows);
    }

    /// The Events, oldest first as kubectl lists them.
    fn events(&self, out: &mut String) {
        let Some(events) = self.events else {
            out.push_str("Events:  <unknown>\n");
            return;
        };
        let mut events: Vec<&Event> = events.iter().collect();
        events.sort_by_key(|e| last_seen(e));
        let rows: Vec<Vec<String>> = events
            .iter()
            .map(|e| {
                let count = e.series.as_ref().map_or(1, |s| s.count);
                let mut when = last_seen(e).map_or("-".into(), |t| self.since(t));
                if let (true, Some(first)) = (count > 1, e.event_time.as_ref()) {
                    when = format!("{when} (x{count} over {})", self.since(first.0));
                }
                vec![
                    e.type_.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    when,
                    e.reporting_controller.clone().unwrap_or_default(),
                    e.note.clone().unwrap_or_default(),
                ]
            })
            .collect();
        out.push_str("Events:");
        if rows.is_empty() {
            out.push_str(&format!("  {NONE}\n"));
            return;
        }
        out.push('\n');
        indented_table(out, &["TYPE", "REASON", "AGE", "FROM", "MESSAGE"], &rows);
    }

    fn since(&self, time: Timestamp) -> String {
        human(elapsed(&Time(time), self.now))
    }

    /// The executor's last suspension: when, what was saved, and what was not (with why).
    fn suspension(&self, out: &mut String, suspension: &crate::crd::Suspension) {
        out.push_str("Suspension:\n");
        fields(
            out,
            "  ",
            &[
                ("Suspended", self.ago(suspension.suspended_time.as_ref())),
                ("Resumed", self.ago(suspension.resumed_time.as_ref())),
                (
                    "Saved",
                    format!(
                        "{} names, {} bytes",
                        suspension.saved_names, suspension.saved_bytes
                    ),
                ),
            ],
        );
        not_saved(out, &suspension.unsaved);
    }

    /// Where a fork came from: its source, the snapshot it took, and the names that did not come.
    fn fork(&self, out: &mut String, fork: &crate::crd::ForkOrigin) {
        out.push_str("Fork:\n");
        fields(
            out,
            "  ",
            &[
                ("From", fork.from.clone()),
                ("Source Sandbox", fork.source_sandbox.clone()),
                (
                    "Snapshot",
                    format!("{} ({} bytes)", fork.snapshot.id, fork.snapshot.size),
                ),
                ("Saved", format!("{} names", fork.saved_names)),
                ("Restored", self.ago(fork.restored_time.as_ref())),
            ],
        );
        not_saved(out, &fork.unsaved);
    }

    fn ago(&self, time: Option<&Time>) -> String {
        time.map_or(NONE.into(), |t| format!("{} ago", self.since(t.0)))
    }
}

/// The names of a namespace that were not saved or restored, with why, as a table.
fn not_saved(out: &mut String, unsaved: &[crate::crd::UnsavedName]) {
    if unsaved.is_empty() {
        return;
    }
    out.push_str("  Not Saved:\n");
    let rows: Vec<Vec<String>> = unsaved
        .iter()
        .map(|u| vec![u.name.clone(), u.why.clone()])
        .collect();
    let mut table = String::new();
    indented_table(&mut table, &["NAME", "WHY"], &rows);
    for line in table.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
}

/// When an Event was last seen: its series' last observation, else its time.
fn last_seen(event: &Event) -> Option<Timestamp> {
    let series = event.series.as_ref().map(|s| s.last_observed_time.0);
    let first = event.event_time.as_ref().map(|t| t.0);
    series
        .or(first)
        .or(event.deprecated_last_timestamp.as_ref().map(|t| t.0))
}

fn or_none(value: Option<String>) -> String {
    value
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| NONE.into())
}

fn seconds(value: Option<u32>) -> String {
    or_none(value.map(|s| format!("{s}s")))
}

/// `Key:  value` lines, values aligned, made [`printable`].
fn fields(out: &mut String, indent: &str, fields: &[(&str, String)]) {
    let width = fields
        .iter()
        .map(|(key, _)| key.len() + 1)
        .max()
        .unwrap_or(0);
    for (key, value) in fields {
        let key = format!("{key}:");
        out.push_str(&format!("{indent}{key:<width$}  {}\n", printable(value)));
    }
}

/// A [`table::render`]ed table, two spaces in; `<none>` when it has no rows.
fn indented_table(out: &mut String, headers: &[&str], rows: &[Vec<String>]) {
    if rows.is_empty() {
        out.push_str(&format!("  {NONE}\n"));
        return;
    }
    for line in table::render(headers, rows).lines() {
        out.push_str(&format!("  {line}\n"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn executor() -> BriqExecutor {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "py", "namespace": "team", "uid": "u-1",
                "creationTimestamp": "2025-01-01T00:00:00Z"
            },
            "spec": { "packages": ["pandas==2.2.3", "numpy"], "idleTimeoutSeconds": 600 },
            "status": {
                "sandboxId": "bq_123",
                "sandboxCreatedTime": "2025-01-01T00:00:05Z",
                "readyTime": "2025-01-01T00:00:20Z",
                "executionsTotal": 2,
                "lastExecutionTime": "2025-01-01T00:09:00Z",
                "conditions": [
                    { "type": "Ready", "status": "True", "reason": "KernelReady",
                      "message": "the kernel answers", "lastTransitionTime": "2025-01-01T00:00:20Z" },
                    { "type": "Stalled", "status": "False", "reason": "KernelReady",
                      "message": "\u{1b}]0;title\u{7}", "lastTransitionTime": "2025-01-01T00:00:20Z" },
                ],
            },
        }))
        .unwrap()
    }

    fn execution(name: &str, created: &str, succeeded: &str, reason: &str) -> Execution {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "creationTimestamp": created },
            "spec": { "executorRef": { "name": "py" }, "code": "1" },
            "status": {
                "startTime": if reason == "Queued" { None } else { Some(created) },
                "durationMillis": if succeeded == "Unknown" { None } else { Some(350) },
                "conditions": [{
                    "type": "Succeeded", "status": succeeded, "reason": reason, "message": "",
                    "lastTransitionTime": created
                }],
            },
        }))
        .unwrap()
    }

    fn executions() -> Vec<Execution> {
        vec![
            execution("py-c", "2025-01-01T00:09:50Z", "Unknown", "Queued"),
            execution("py-a", "2025-01-01T00:08:00Z", "True", "Completed"),
            execution("py-d", "2025-01-01T00:09:50Z", "Unknown", "Queued"),
            execution("py-b", "2025-01-01T00:09:00Z", "False", "CodeError"),
            execution("py-r", "2025-01-01T00:09:40Z", "Unknown", "Running"),
        ]
    }

    fn event(reason: &str, at: &str, count: Option<(i32, &str)>) -> Event {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": reason },
            "type": "Normal", "reason": reason, "note": format!("{reason} note"),
            "reportingController": "briq-operator", "eventTime": at,
            "series": count.map(|(count, last)| serde_json::json!({
                "count": count, "lastObservedTime": last
            })),
        }))
        .unwrap()
    }

    fn now() -> Timestamp {
        "2025-01-01T00:10:00Z".parse().unwrap()
    }

    #[test]
    fn describe_shows_spec_sandbox_conditions_queue_recent_executions_and_events() {
        let executor = executor();
        let executions = executions();
        let events = [
            event("Ready", "2025-01-01T00:00:20Z", None),
            event(
                "Provisioning",
                "2025-01-01T00:00:01Z",
                Some((3, "2025-01-01T00:00:10Z")),
            ),
        ];
        let view = View {
            executor: &executor,
            executions: &executions,
            events: Some(&events),
            recent: 4,
            now: now(),
        };
        assert_eq!(
            view.render(),
            "\
Name:       py
Namespace:  team
Age:        10m
Spec:
  Image:                  python:3.12-slim
  Size:                   <plan default>
  Packages:               pandas==2.2.3, numpy
  Pool:                   <none>
  Forked From:            <none>
  Sleep:                  30m
  Setup Timeout:          60s
  Execution Timeout:      30s
  Idle Timeout:           600s
  Idle Action:            Expire
  Max Queued Executions:  100
  History Limit:          <none>
  Execution TTL:          <none>
Status:
  Sandbox:          bq_123
  Sandbox Created:  9m55s ago
  Kernel Ready:     9m40s ago
  Unusable:         no
  Executions Run:   2
  Last Execution:   60s ago
Conditions:
  TYPE      STATUS   REASON        AGE     MESSAGE
  Ready     True     KernelReady   9m40s   the kernel answers
  Stalled   False    KernelReady   9m40s   \\u{1b}]0;title\\u{7}
Queue:
  Running:  py-r (for 20s)
  Waiting:  2 (next: py-c)
Executions (4 most recent of 5):
  NAME   SUCCEEDED   REASON      DURATION   AGE
  py-d   Unknown     Queued      -          10s
  py-c   Unknown     Queued      -          10s
  py-r   Unknown     Running     20s        20s
  py-b   False       CodeError   350ms      60s
Events:
  TYPE     REASON         AGE                     FROM            MESSAGE
  Normal   Provisioning   9m50s (x3 over 9m59s)   briq-operator   Provisioning note
  Normal   Ready          9m40s                   briq-operator   Ready note
"
        );
    }

    #[test]
    fn a_suspended_executor_shows_what_was_saved_and_what_was_not() {
        let mut executor = executor();
        let status = executor.status.as_mut().unwrap();
        status.suspension = Some(
            serde_json::from_value(serde_json::json!({
                "suspendedTime": "2025-01-01T00:09:00Z", "savedBytes": 2048, "savedNames": 3,
                "unsaved": [{ "name": "sock", "why": "cannot pickle 'socket' object" }],
            }))
            .unwrap(),
        );
        let view = View {
            executor: &executor,
            executions: &[],
            events: None,
            recent: 1,
            now: now(),
        };
        let shown = view.render();
        let block: Vec<&str> = shown
            .lines()
            .skip_while(|l| *l != "Suspension:")
            .take_while(|l| *l != "Conditions:")
            .collect();
        assert_eq!(
            block,
            [
                "Suspension:",
                "  Suspended:  60s ago",
                "  Resumed:    <none>",
                "  Saved:      3 names, 2048 bytes",
                "  Not Saved:",
                "    NAME   WHY",
                "    sock   cannot pickle 'socket' object",
            ]
        );
    }

    #[test]
    fn a_fork_shows_where_it_was_forked_from_and_what_did_not_come() {
        let mut executor = executor();
        executor.spec.fork_from = Some(crate::crd::ForkFrom { name: "src".into() });
        executor.status.as_mut().unwrap().fork = Some(
            serde_json::from_value(serde_json::json!({
                "from": "src", "sourceSandbox": "bq_src",
                "snapshot": {"id": "ab12", "parts": 1, "size": 4096, "sha256": "00"},
                "savedNames": 2, "restoredTime": "2025-01-01T00:09:30Z",
                "unsaved": [{ "name": "sock", "why": "cannot pickle 'socket' object" }],
            }))
            .unwrap(),
        );
        let view = View {
            executor: &executor,
            executions: &[],
            events: None,
            recent: 1,
            now: now(),
        };
        let shown = view.render();
        assert!(shown.contains("  Forked From:            src\n"), "{shown}");
        let block: Vec<&str> = shown
            .lines()
            .skip_while(|l| *l != "Fork:")
            .take_while(|l| *l != "Conditions:")
            .collect();
        assert_eq!(
            block,
            [
                "Fork:",
                "  From:            src",
                "  Source Sandbox:  bq_src",
                "  Snapshot:        ab12 (4096 bytes)",
                "  Saved:           2 names",
                "  Restored:        30s ago",
                "  Not Saved:",
                "    NAME   WHY",
                "    sock   cannot pickle 'socket' object",
            ]
        );
    }

    #[test]
    fn a_new_executor_shows_none_and_events_that_cannot_be_listed_show_unknown() {
        let executor: BriqExecutor = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "fresh", "namespace": "team" }, "spec": {}
        }))
        .unwrap();
        let view = View {
            executor: &executor,
            executions: &[],
            events: None,
            recent: 10,
            now: now(),
        };
        let shown = view.render();
        let tail: Vec<&str> = shown.lines().skip_while(|l| *l != "Status:").collect();
        assert_eq!(
            tail,
            [
                "Status:",
                "  Sandbox:          <none>",
                "  Sandbox Created:  <none>",
                "  Kernel Ready:     <none>",
                "  Unusable:         no",
                "  Executions Run:   0",
                "  Last Execution:   <none>",
                "Conditions:",
                "  <none>",
                "Queue:",
                "  Running:  <none>",
                "  Waiting:  0",
                "Executions (0 most recent of 0):",
                "  <none>",
                "Events:  <unknown>",
            ]
        );
        assert!(shown.starts_with("Name:       fresh\nNamespace:  team\nAge:        -\n"));
    }

    #[test]
    fn the_run_count_never_says_fewer_than_the_finished_executions_listed() {
        let cases = [
            (None, 0, "0"),
            (Some(5), 3, "5"),
            (Some(3), 3, "3"),
            (
                None,
                3,
                "3 (as listed; the count written so far, 0, lags by up to 30 s)",
            ),
            (
                Some(1),
                3,
                "3 (as listed; the count written so far, 1, lags by up to 30 s)",
            ),
        ];
        for (written, listed, expected) in cases {
            assert_eq!(
                executions_run(written, listed),
                expected,
                "{written:?} {listed}"
            );
        }
    }
}
