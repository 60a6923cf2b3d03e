//! The command line (`exec`, `logs`, `get`, `describe`, and `kubectl briq`) as a user runs it: the built
//! binary against a real kube-apiserver, with the operator and the local sandbox server running
//! in this test process.

mod support;

use std::{path::Path, process::Stdio, time::Duration};

use briq_operator::crd::{BriqExecutor, Execution, run_order};
use kube::{
    ResourceExt,
    api::{ListParams, PostParams},
};
use support::{Operator, TestEnv, wait_for};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

const BINARY: &str = env!("CARGO_BIN_EXE_briq-operator");

/// Cold setup of a local sandbox plus one run, on a busy machine.
const COMMAND_SECONDS: u64 = 180;

/// Mirrors the `final_answer` tool smolagents sends to remote executors.
const FINAL_ANSWER_TOOL: &str = "from smolagents.serialization import SafeSerializer\n\
    class FinalAnswerException(BaseException):\n    pass\n\
    def final_answer(value):\n    raise FinalAnswerException(SafeSerializer.dumps(value))\n";

#[derive(Debug)]
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Ran {
    /// The Execution `exec` created, from its `execution.briq.cloud/NAME created` line.
    fn created(&self) -> String {
        self.stderr
            .lines()
            .find_map(|line| {
                line.strip_prefix("execution.briq.cloud/")?
                    .strip_suffix(" created")
            })
            .unwrap_or_else(|| panic!("no Execution created: {self:?}"))
            .to_owned()
    }
}

fn command(
    program: impl AsRef<std::ffi::OsStr>,
    kubeconfig: &Path,
    args: &[&str],
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    command
        .env("KUBECONFIG", kubeconfig)
        .env_remove("RUST_LOG")
        .args(args);
    command
}

async fn run(mut command: tokio::process::Command, stdin: &str) -> Ran {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("starting the command");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let output = tokio::time::timeout(
        Duration::from_secs(COMMAND_SECONDS),
        child.wait_with_output(),
    )
    .await
    .expect("the command did not finish in time")
    .unwrap();
    Ran {
        code: output.status.code().expect("an exit status"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `briq-operator ARGS -n NAMESPACE` against the test's cluster.
async fn briq(env: &TestEnv, args: &[&str]) -> Ran {
    briq_with_stdin(env, args, "").await
}

async fn briq_with_stdin(env: &TestEnv, args: &[&str], stdin: &str) -> Ran {
    let mut command = command(BINARY, &env.kubeconfig, args);
    command.args(["-n", &env.namespace]);
    run(command, stdin).await
}

async fn create_executor(env: &TestEnv, name: &str) {
    let executor: BriqExecutor =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name }, "spec": {} }))
            .unwrap();
    env.api::<BriqExecutor>()
        .create(&PostParams::default(), &executor)
        .await
        .unwrap();
}

async fn execution_names(env: &TestEnv) -> Vec<String> {
    let list = env.api::<Execution>().list(&ListParams::default()).await;
    let mut names: Vec<String> = list
        .unwrap()
        .items
        .into_iter()
        .filter_map(|execution| execution.metadata.name)
        .collect();
    names.sort();
    names
}

/// `missing` is how a command about Execution `nope`, which does not exist, ended: exit 2 and
/// one line that says so.
fn assert_not_found(env: &TestEnv, missing: &Ran) {
    assert_eq!(missing.code, 2, "{missing:?}");
    assert_eq!(
        missing.stderr,
        format!(
            "error: Execution nope not found in namespace {}\n",
            env.namespace
        )
    );
}

/// The reason of an Execution's `Succeeded` condition.
fn reason(execution: &Execution) -> Option<&str> {
    let conditions = &execution.status.as_ref()?.conditions;
    let succeeded = conditions.iter().find(|c| c.type_ == "Succeeded")?;
    Some(succeeded.reason.as_str())
}

/// An Execution (created directly, not by `exec`) that runs until `gate` exists: it keeps the
/// executor busy, so that others queue behind it, for as long as the test needs.
async fn create_gated_execution(env: &TestEnv, name: &str, gate: &Path) -> Execution {
    let code = format!(
        "import os, time\nwhile not os.path.exists({:?}):\n    time.sleep(0.05)\n",
        gate.to_str().unwrap()
    );
    create_execution(env, name, &code).await;
    wait_for(&env.api::<Execution>(), name, 60, |e| {
        reason(e) == Some("Running")
    })
    .await
}

async fn create_execution(env: &TestEnv, name: &str, code: &str) {
    let execution: Execution = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": { "executorRef": { "name": "py" }, "code": code, "timeoutSeconds": 40 },
    }))
    .unwrap();
    env.api::<Execution>()
        .create(&PostParams::default(), &execution)
        .await
        .unwrap();
}

/// The lines of `describe`'s section `title` (`Queue:`), up to the next unindented line.
fn section<'a>(described: &'a str, title: &str) -> Vec<&'a str> {
    described
        .lines()
        .skip_while(|line| !line.starts_with(title))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .collect()
}

/// The table's rows, each split into its cells.
fn cells(table: &str) -> Vec<Vec<&str>> {
    table
        .lines()
        .map(|line| line.split_whitespace().collect())
        .collect()
}

#[tokio::test]
async fn exec_waits_for_the_executor_prints_logs_and_output_and_keeps_the_record() {
    let env = TestEnv::new("cli-exec").await;
    let _operator = Operator::start(&env).await;
    create_executor(&env, "py").await;

    let first = briq(&env, &["exec", "py", "-c", "print('hello')\nx = 6\nx * 7"]).await;
    assert_eq!(
        (first.code, first.stdout.as_str()),
        (0, "hello\n42\n"),
        "{first:?}"
    );
    assert!(
        first
            .stderr
            .contains("waiting for BriqExecutor py to become ready"),
        "{first:?}"
    );
    let name = first.created();
    assert!(name.starts_with("py-"), "{name}");
    assert_eq!(
        execution_names(&env).await,
        [name.as_str()],
        "kept as the record"
    );

    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "print(x * 2)\n").unwrap();
    let from_file = briq(&env, &["exec", "py", "-f", file.path().to_str().unwrap()]).await;
    assert_eq!(
        (from_file.code, from_file.stdout.as_str()),
        (0, "12\n"),
        "{from_file:?}"
    );

    let from_stdin = briq_with_stdin(&env, &["exec", "py", "-f", "-"], "x + 1").await;
    assert_eq!(
        (from_stdin.code, from_stdin.stdout.as_str()),
        (0, "7\n"),
        "{from_stdin:?}"
    );

    let removed = briq(&env, &["exec", "py", "-c", "x", "--rm"]).await;
    assert_eq!(
        (removed.code, removed.stdout.as_str()),
        (0, "6\n"),
        "{removed:?}"
    );
    let kept = execution_names(&env).await;
    assert_eq!(kept.len(), 3, "--rm deletes its Execution only: {kept:?}");
    assert!(!kept.contains(&removed.created()));
}

#[tokio::test]
async fn a_final_answer_is_printed_as_readable_json() {
    let env = TestEnv::new("cli-answer").await;
    let _operator = Operator::start(&env).await;
    create_executor(&env, "py").await;
    let tool = briq(&env, &["exec", "py", "-c", FINAL_ANSWER_TOOL]).await;
    assert_eq!(tool.code, 0, "{tool:?}");

    let code = "fib = [0, 1]\nwhile len(fib) < 5:\n    fib.append(fib[-1] + fib[-2])\n\
                final_answer({'fib': fib, 'label': 'Fibonacci'})";
    let answer = briq(&env, &["exec", "py", "-c", code]).await;
    assert_eq!(answer.code, 0, "{answer:?}");
    assert_eq!(
        answer.stdout,
        "{\n  \"fib\": [\n    0,\n    1,\n    1,\n    2,\n    3\n  ],\n  \"label\": \"Fibonacci\"\n}\n"
    );
}

#[tokio::test]
async fn a_code_error_exits_1_with_the_traceback_and_logs_shows_it_again() {
    let env = TestEnv::new("cli-error").await;
    let _operator = Operator::start(&env).await;
    create_executor(&env, "py").await;

    let failed = briq(&env, &["exec", "py", "-c", "print('before')\n1 / 0"]).await;
    assert_eq!(
        (failed.code, failed.stdout.as_str()),
        (1, "before\n"),
        "{failed:?}"
    );
    assert!(failed.stderr.contains("1 / 0"), "the traceback: {failed:?}");
    assert!(
        failed
            .stderr
            .trim_end()
            .ends_with("ZeroDivisionError: division by zero"),
        "{failed:?}"
    );
    let name = failed.created();

    for args in [&["logs", &name][..], &["logs", &name, "--wait"]] {
        let logs = briq(&env, args).await;
        assert_eq!(
            (logs.code, logs.stdout.as_str()),
            (1, "before\n"),
            "{logs:?}"
        );
        assert!(logs.stderr.contains("ZeroDivisionError: division by zero"));
        assert!(!logs.stderr.contains("created"), "logs creates nothing");
    }

    let missing = briq(&env, &["logs", "nope"]).await;
    assert_not_found(&env, &missing);
}

#[tokio::test]
async fn cancel_stops_a_running_execution_prints_what_it_printed_and_exits_1() {
    let env = TestEnv::new("cli-cancel").await;
    let _operator = Operator::start(&env).await;
    create_executor(&env, "py").await;
    let gate = tempfile::tempdir().unwrap();
    create_gated_execution(&env, "stuck", &gate.path().join("never")).await;

    let cancelled = briq(&env, &["cancel", "stuck", "--wait"]).await;
    assert_eq!(cancelled.code, 1, "{cancelled:?}");
    assert!(
        cancelled
            .stderr
            .starts_with("execution/stuck cancel requested\n"),
        "{cancelled:?}"
    );
    assert!(cancelled.stderr.contains("Cancelled: "), "{cancelled:?}");
    let done = env.api::<Execution>().get("stuck").await.unwrap();
    assert_eq!(reason(&done), Some("Cancelled"));

    let again = briq(&env, &["cancel", "stuck"]).await;
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(
        again.stderr,
        "execution/stuck had already ended (Cancelled); nothing to cancel\n"
    );
    let missing = briq(&env, &["cancel", "nope"]).await;
    assert_not_found(&env, &missing);
    // The executor runs the next one: the interrupt kept its kernel.
    let next = briq(&env, &["exec", "py", "-c", "1 + 1"]).await;
    assert_eq!((next.code, next.stdout.as_str()), (0, "2\n"), "{next:?}");
}

#[tokio::test]
async fn after_a_timeout_exec_reports_the_executor_unusable() {
    let env = TestEnv::new("cli-unusable").await;
    let _operator = Operator::start(&env).await;
    create_executor(&env, "py").await;

    let spin = briq(
        &env,
        &["exec", "py", "--timeout", "1", "-c", "while True: pass"],
    )
    .await;
    assert_eq!(spin.code, 1, "{spin:?}");
    assert!(spin.stderr.contains("Timeout: "), "{spin:?}");

    let later = briq(&env, &["exec", "py", "-c", "1 + 1"]).await;
    assert_eq!(later.code, 2, "{later:?}");
    assert!(
        later
            .stderr
            .starts_with("error: BriqExecutor py is unusable (")
            && later.stderr.contains("); create a new BriqExecutor"),
        "{later:?}"
    );
    assert_eq!(execution_names(&env).await.len(), 1, "nothing was created");
}

#[tokio::test]
async fn get_shows_the_useful_columns_and_kubectl_briq_is_the_same_program() {
    let env = TestEnv::new("cli-get").await;
    let _operator =
        Operator::start_with(&env, |s| s.count_write_interval = Duration::from_secs(1)).await;
    create_executor(&env, "py").await;
    let name = briq(&env, &["exec", "py", "-c", "1 + 1"]).await.created();
    let execution = env.api::<Execution>().get(&name).await.unwrap();
    assert_eq!(
        execution.owner_references()[0].name,
        "py",
        "exec makes the Execution part of the executor's history"
    );
    // The count is written in batches, every `count_write_interval`.
    wait_for(&env.api::<BriqExecutor>(), "py", 10, |e| {
        e.status.as_ref().and_then(|s| s.executions_total) == Some(1)
    })
    .await;

    let executors = briq(&env, &["get", "executors"]).await;
    assert_eq!(executors.code, 0, "{executors:?}");
    let table = cells(&executors.stdout);
    assert_eq!(
        table[0],
        ["NAME", "READY", "REASON", "SANDBOX", "EXECUTIONS", "AGE"]
    );
    assert_eq!(table.len(), 2, "{executors:?}");
    assert_eq!(table[1][..3], ["py", "True", "KernelReady"]);
    assert!(table[1][3].starts_with("bq_"), "{executors:?}");
    assert_eq!(table[1][4], "1");
    assert!(table[1][5].ends_with('s'), "{executors:?}");

    let executions = briq(&env, &["get", "executions"]).await;
    let listed = cells(&executions.stdout);
    assert_eq!(
        listed[0],
        ["NAME", "EXECUTOR", "SUCCEEDED", "REASON", "DURATION", "AGE"]
    );
    assert_eq!(listed[1][..4], [name.as_str(), "py", "True", "Completed"]);
    assert!(listed[1][4].ends_with('s'), "{executions:?}");

    let both = briq(&env, &["get"]).await;
    let both = cells(&both.stdout);
    let headers: Vec<&str> = both.iter().filter_map(|row| row.first().copied()).collect();
    assert_eq!(headers, ["NAME", "py", "NAME", name.as_str()], "{both:?}");
    assert!(
        both[2].is_empty(),
        "a blank line between the tables: {both:?}"
    );

    let everywhere = command(BINARY, &env.kubeconfig, &["get", "bqx", "-A"]);
    let everywhere = run(everywhere, "").await;
    let table = cells(&everywhere.stdout);
    assert_eq!(table[0][..2], ["NAMESPACE", "NAME"]);
    assert!(
        table
            .iter()
            .any(|row| row[..2] == [env.namespace.as_str(), name.as_str()]),
        "{everywhere:?}"
    );

    // Installed as `kubectl-briq`, the binary is a kubectl plugin with the same commands.
    let plugins = tempfile::tempdir().unwrap();
    let plugin = plugins.path().join("kubectl-briq");
    std::os::unix::fs::symlink(BINARY, &plugin).unwrap();
    let direct = command(
        &plugin,
        &env.kubeconfig,
        &["get", "executions", "-n", &env.namespace],
    );
    let direct = run(direct, "").await;
    assert_eq!(cells(&direct.stdout)[1][..4], listed[1][..4], "{direct:?}");

    let path = std::env::join_paths(std::iter::once(plugins.path().to_owned()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let mut kubectl = command(&env.kubectl, &env.kubeconfig, &["briq", "exec", "py"]);
    kubectl
        .args(["-n", &env.namespace, "-c", "2 + 3"])
        .env("PATH", path);
    let through_kubectl = run(kubectl, "").await;
    assert_eq!(
        (through_kubectl.code, through_kubectl.stdout.as_str()),
        (0, "5\n"),
        "{through_kubectl:?}"
    );
}

#[tokio::test]
async fn exec_against_a_missing_executor_exits_2_and_creates_nothing() {
    let env = TestEnv::new("cli-missing").await;
    let missing = briq(&env, &["exec", "nope", "-c", "1"]).await;
    assert_eq!(missing.code, 2, "{missing:?}");
    assert_eq!(
        missing.stderr,
        format!(
            "error: BriqExecutor nope not found in namespace {}\n",
            env.namespace
        )
    );
    assert!(execution_names(&env).await.is_empty());

    let empty = briq(&env, &["get"]).await;
    assert_eq!((empty.code, empty.stdout.as_str()), (0, ""));
    assert_eq!(
        empty.stderr,
        format!(
            "No BriqExecutors found in namespace {0}.\nNo Executions found in namespace {0}.\n",
            env.namespace
        )
    );
}

#[tokio::test]
async fn without_a_cluster_commands_exit_2_with_a_readable_error() {
    let dir = tempfile::tempdir().unwrap();
    let nowhere = dir.path().join("no-such-kubeconfig");
    let mut no_config = command(BINARY, &nowhere, &["exec", "py", "-c", "1"]);
    no_config.env_remove("KUBERNETES_SERVICE_HOST");
    let no_config = run(no_config, "").await;
    assert_eq!(no_config.code, 2, "{no_config:?}");
    assert_eq!(
        no_config.stderr,
        format!(
            "error: no Kubernetes cluster configured: cannot read the kubeconfig {}: No such file \
             or directory (os error 2); not running inside a cluster either (set KUBECONFIG or \
             create ~/.kube/config)\n",
            nowhere.display()
        )
    );

    // A kubeconfig whose API server is not listening (port 1 on loopback).
    let unreachable = dir.path().join("unreachable");
    std::fs::write(
        &unreachable,
        "apiVersion: v1\nkind: Config\ncurrent-context: gone\n\
         clusters: [{name: gone, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n\
         users: [{name: gone, user: {token: t}}]\n\
         contexts: [{name: gone, context: {cluster: gone, user: gone}}]\n",
    )
    .unwrap();
    let down = run(command(BINARY, &unreachable, &["get"]), "").await;
    assert_eq!(down.code, 2, "{down:?}");
    assert!(
        down.stderr
            .starts_with("error: cannot use the Kubernetes API server at https://127.0.0.1:1/: "),
        "{down:?}"
    );
    assert!(down.stderr.contains("onnection refused"), "{down:?}");
}

#[tokio::test]
async fn describe_shows_the_sandbox_conditions_queue_depth_recent_executions_and_events() {
    let env = TestEnv::new("cli-describe").await;
    let _operator =
        Operator::start_with(&env, |s| s.count_write_interval = Duration::from_secs(1)).await;
    create_executor(&env, "py").await;
    let completed = briq(&env, &["exec", "py", "-c", "1 + 1"]).await;
    assert_eq!(completed.code, 0, "{completed:?}");
    let failed = briq(&env, &["exec", "py", "-c", "1 / 0"]).await;
    assert_eq!(failed.code, 1, "{failed:?}");
    wait_for(&env.api::<BriqExecutor>(), "py", 10, |e| {
        e.status.as_ref().and_then(|s| s.executions_total) == Some(2)
    })
    .await;
    // One runs until the gate opens, one waits behind it. `zz-` sorts after exec's `py-`
    // names, so within one creation second too these two are the newest.
    let gates = tempfile::tempdir().unwrap();
    let gate = gates.path().join("open");
    create_gated_execution(&env, "zz-gate", &gate).await;
    create_execution(&env, "zz-queued", "3").await;
    wait_for(&env.api::<Execution>(), "zz-queued", 30, |e| {
        reason(e) == Some("Queued")
    })
    .await;

    let described = briq(&env, &["describe", "py"]).await;
    assert_eq!(
        (described.code, described.stderr.as_str()),
        (0, ""),
        "{described:?}"
    );
    let out = described.stdout.as_str();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..2],
        ["Name:       py", &format!("Namespace:  {}", env.namespace)]
    );
    let status = section(out, "Status:");
    assert!(status[0].starts_with("  Sandbox:          bq_"), "{out}");
    assert!(status.contains(&"  Unusable:         no"), "{out}");
    assert!(status.contains(&"  Executions Run:   2"), "{out}");
    let conditions: Vec<Vec<&str>> = section(out, "Conditions:")
        .iter()
        .map(|row| row.split_whitespace().take(3).collect())
        .collect();
    assert_eq!(
        conditions,
        [
            ["TYPE", "STATUS", "REASON"],
            ["Ready", "True", "KernelReady"],
            ["Stalled", "False", "KernelReady"],
        ],
        "{out}"
    );
    let queue = section(out, "Queue:");
    assert_eq!(queue.len(), 2, "{out}");
    assert!(queue[0].starts_with("  Running:  zz-gate (for "), "{out}");
    assert_eq!(queue[1], "  Waiting:  1 (next: zz-queued)", "{out}");

    // Newest first, in the operator's run order: the two exec made, then the gated two.
    let mut made = Vec::new();
    for ran in [&completed, &failed] {
        made.push(env.api::<Execution>().get(&ran.created()).await.unwrap());
    }
    made.sort_by_key(|e| std::cmp::Reverse(run_order(&e.metadata)));
    let outcome = |e: &Execution| match reason(e) {
        Some("Completed") => "True",
        _ => "False",
    };
    let mut expected = vec![
        vec!["zz-queued".to_owned(), "Unknown".into(), "Queued".into()],
        vec!["zz-gate".to_owned(), "Unknown".into(), "Running".into()],
    ];
    for e in &made {
        let reason = reason(e).unwrap().to_owned();
        expected.push(vec![e.name_any(), outcome(e).into(), reason]);
    }
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("Executions ("))
            .count(),
        1
    );
    assert!(lines.contains(&"Executions (4 most recent of 4):"), "{out}");
    let executions = section(out, "Executions (");
    let rows: Vec<Vec<String>> = executions[1..]
        .iter()
        .map(|row| row.split_whitespace().take(3).map(str::to_owned).collect())
        .collect();
    assert_eq!(rows, expected, "{out}");
    assert_eq!(
        cells(executions[0]).concat(),
        ["NAME", "SUCCEEDED", "REASON", "DURATION", "AGE"]
    );
    let events = section(out, "Events:");
    assert!(
        events
            .iter()
            .any(|row| cells(row)[0][..2] == ["Normal", "Ready"]),
        "the operator's Ready event: {out}"
    );

    let two = briq(&env, &["describe", "py", "--executions", "2"]).await;
    let recent = section(&two.stdout, "Executions (2 most recent of 4):");
    assert_eq!(recent.len(), 3, "{two:?}");
    assert!(recent[1].starts_with("  zz-queued "), "{two:?}");

    std::fs::write(&gate, "").unwrap();
    wait_for(&env.api::<Execution>(), "zz-queued", 60, |e| {
        reason(e) == Some("Completed")
    })
    .await;

    let missing = briq(&env, &["describe", "nope"]).await;
    assert_eq!(
        (missing.code, missing.stdout.as_str()),
        (2, ""),
        "{missing:?}"
    );
    assert_eq!(
        missing.stderr,
        format!(
            "error: BriqExecutor nope not found in namespace {}\n",
            env.namespace
        )
    );
}

#[tokio::test]
async fn exec_progress_shows_queued_then_running_on_stderr_and_stdout_keeps_only_the_result() {
    let env = TestEnv::new("cli-progress").await;
    let _operator = Operator::start(&env).await;
    create_executor(&env, "py").await;
    let warm = briq(&env, &["exec", "py", "-c", "1"]).await;
    assert_eq!(warm.code, 0, "{warm:?}");
    let gates = tempfile::tempdir().unwrap();
    let gate = gates.path().join("open");
    create_gated_execution(&env, "zz-gate", &gate).await;

    let mut queued = command(BINARY, &env.kubeconfig, &["exec", "py", "--progress"]);
    // Long enough to be seen running: an action that ends within 100 ms of being sent has its
    // `Running` folded into its result write, and goes from queued straight to its result.
    queued
        .args([
            "-c",
            "import time; time.sleep(0.5); 6 * 7",
            "-n",
            &env.namespace,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = queued.spawn().unwrap();
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut progress = Vec::new();
    let deadline = Duration::from_secs(COMMAND_SECONDS);
    // The gate opens once the Execution has said it is queued.
    while !progress
        .last()
        .is_some_and(|l: &String| l.starts_with("queued"))
    {
        let line = tokio::time::timeout(deadline, stderr.next_line()).await;
        let line = line.expect("exec said nothing in time").unwrap();
        progress.push(line.unwrap_or_else(|| panic!("exec ended before it queued: {progress:?}")));
    }
    std::fs::write(&gate, "").unwrap();
    while let Some(line) = stderr.next_line().await.unwrap() {
        progress.push(line);
    }
    let output = tokio::time::timeout(deadline, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let name = env
        .api::<Execution>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| e.name_any())
        .find(|n| n != "zz-gate" && n != &warm.created())
        .unwrap();
    let created = format!("execution.briq.cloud/{name} created");
    // Between the gate finishing and the operator starting this one, it may be seen next.
    let seen_next = [
        created.as_str(),
        "queued (1 ahead)",
        "queued (next)",
        "running",
    ];
    assert!(
        progress == seen_next || progress == [created.as_str(), "queued (1 ahead)", "running"],
        "{progress:?}"
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "42\n");
    assert_eq!(output.status.code(), Some(0));

    // Without a terminal on stderr (scripts), no progress unless asked; --quiet leaves the
    // result alone on stdout.
    let piped = briq(&env, &["exec", "py", "-c", "6 * 7"]).await;
    assert_eq!(
        (piped.code, piped.stdout.as_str()),
        (0, "42\n"),
        "{piped:?}"
    );
    assert_eq!(
        piped.stderr,
        format!("execution.briq.cloud/{} created\n", piped.created())
    );
    let quiet = briq(&env, &["exec", "py", "--quiet", "-c", "6 * 7"]).await;
    assert_eq!(
        (quiet.code, quiet.stdout.as_str(), quiet.stderr.as_str()),
        (0, "42\n", ""),
        "{quiet:?}"
    );
}

#[tokio::test]
async fn fork_makes_n_executors_with_the_sources_state_and_a_missing_source_makes_none() {
    let env = TestEnv::new("cli-fork").await;
    let _operator = Operator::start(&env).await;
    create_executor(&env, "src").await;
    let set = briq(&env, &["exec", "src", "-c", "x = 41"]).await;
    assert_eq!(set.code, 0, "{set:?}");

    let forked = briq(&env, &["fork", "src", "--count", "2", "--wait", "120"]).await;
    assert_eq!(forked.code, 0, "{forked:?}");
    let names: Vec<&str> = forked
        .stdout
        .lines()
        .map(|line| line.strip_prefix("briqexecutor/").expect("a name per line"))
        .collect();
    assert_eq!(names.len(), 2, "{forked:?}");
    assert!(
        forked.stderr.ends_with("2 fork(s) of src Ready\n"),
        "{forked:?}"
    );
    for name in &names {
        assert!(name.starts_with("src-fork-"), "{name}");
        let fork = env.api::<BriqExecutor>().get(name).await.unwrap();
        assert_eq!(fork.labels()["briq.cloud/forked-from"], "src");
        let probed = briq(&env, &["exec", name, "-c", "x + 1"]).await;
        assert_eq!(
            (probed.code, probed.stdout.as_str()),
            (0, "42\n"),
            "{probed:?}"
        );
    }
    let described = briq(&env, &["describe", names[0]]).await;
    assert!(
        described.stdout.contains("Forked From:            src\n"),
        "{described:?}"
    );
    assert!(
        described.stdout.contains("Fork:\n  From:            src\n"),
        "{described:?}"
    );

    let missing = briq(&env, &["fork", "nope"]).await;
    assert_eq!(missing.code, 2, "{missing:?}");
    assert_eq!(
        missing.stderr,
        format!(
            "error: BriqExecutor nope not found in namespace {}\n",
            env.namespace
        )
    );
    let refused = briq(&env, &["fork", "src", "--count", "101"]).await;
    assert_eq!(refused.code, 2, "{refused:?}");
    let executors = env
        .api::<BriqExecutor>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(
        executors.items.len(),
        3,
        "nothing made by the refused forks"
    );
}
