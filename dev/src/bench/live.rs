//! Scenario 14: live output and files through the operator's aggregated API
//! (`subresources.briq.cloud`, served in this process, reached through kube-apiserver), each
//! figure beside its floor measured in the same run, on real kernels:
//!
//! - the lag of a print to a follower of `executions/{name}/log?follow=true`: the kernel prints
//!   `time.time()` (the sandbox is a host process: the same clock), the follower notes when the
//!   line arrives; the floor reads the same lines of the same action directly, starting the
//!   bridge's `follow` itself through briq's async exec (a second follower of the attempt);
//! - many followers of a few actions: this process's CPU time and RSS while they follow,
//!   against the same actions run without followers, and how many `follow` readers each action
//!   got (Python processes on the host whose argv is the bridge's `follow` of its attempt);
//! - a file's round trip through `briqexecutors/{name}/files` (PUT, then GET), against the
//!   direct briq calls for the same bytes (`briq_files_put` / `briq_files_get`, in the same
//!   512 KiB parts, to a scratch path).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, bail};
use futures::{AsyncBufReadExt as _, AsyncReadExt as _, TryStreamExt as _};
use kube::{Api, Client, ResourceExt as _, api::PostParams};
use rand::RngCore as _;
use serde::Serialize;
use serde_json::json;
use sha2::{Digest as _, Sha256};

use super::{objects, stats::Summary};
use crate::{progress::Progress, stack::Stack, wait};
use briq_operator::{
    bridge::{Command, WORKDIR, files::WRITE_PART_BYTES},
    briq::{ApiKey, BriqClient, ExecRequest, ExecResultArgs, ExecState, SandboxApi as _, Stream},
    crd::{BriqExecutor, Execution},
    subresources::{GROUP, Piece, SHA256_HEADER, VERSION},
};

const NAMESPACE: &str = "bench-live";
/// Bound of each wait (an action's start and end, a follower's stream).
const BOUND: Duration = Duration::from_secs(120);
/// The time between two printed lines.
const PERIOD_SECONDS: f64 = 0.2;
/// The printing starts this long after the action does: its followers are there by then, so a
/// line is not read late because nobody followed yet.
const QUIET_START_SECONDS: f64 = 3.0;
/// How long a direct `follow` may read.
const FOLLOW_DEADLINE: Duration = Duration::from_secs(90);

/// Where the files go in the sandbox (the kernel user may write there).
const SCRATCH: &str = "/tmp/bench-files";

/// The target: print → a follower's read, p50.
pub const TARGET_LAG_P50_MS: f64 = 250.0;

/// How much scenario 14 does.
#[derive(Debug, Clone)]
pub struct Sizes {
    pub lines: usize,
    pub executors: usize,
    pub followers_each: usize,
    pub file_sizes_mb: Vec<usize>,
    pub file_runs: usize,
}

/// Everything scenario 14 measured; a part that failed is `None` (its error labelled apart).
#[derive(Debug, Clone, Serialize)]
pub struct LiveFiles {
    pub lag: Option<Lag>,
    pub followers: Option<Followers>,
    pub files: Vec<FilePoint>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Lag {
    /// Lines printed, one every 200 ms.
    pub lines: usize,
    /// Kernel's `time.time()` at the print → the line read by a follower of the log
    /// subresource through kube-apiserver.
    pub operator_ms: Option<Summary>,
    /// The same lines of the same action read directly from the sandbox (the bridge's `follow`
    /// through briq's async exec; no API server, no operator).
    pub direct_ms: Option<Summary>,
    pub ratio_p50: Option<f64>,
    pub ratio_p99: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Followers {
    pub executors: usize,
    pub followers_each: usize,
    pub lines: usize,
    /// How many followers read every line and the end.
    pub complete: usize,
    /// This process's CPU time (utime + stime) and wall time while the actions ran with the
    /// followers, and while the same actions ran with none (the floor). Everything in this
    /// process counts: the controllers, the aggregated API, the local sandbox server's HTTP
    /// side and the followers' own clients; the kernels are processes of their own.
    pub followed_cpu_ms: f64,
    pub followed_wall_ms: f64,
    pub unfollowed_cpu_ms: f64,
    pub unfollowed_wall_ms: f64,
    /// VmRSS of this process before the followers came and once they all ended.
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    /// `follow` readers started per action (processes of the bridge's `follow` of its attempt,
    /// seen on the host every 250 ms), and the most that ran at once. A reader that starts
    /// before the sandbox knows the attempt exits at once and is started again 250 ms later.
    pub readers_per_action: Vec<usize>,
    pub readers_at_once_per_action: Vec<usize>,
    /// Print → read, over every follower's lines.
    pub lag_ms: Option<Summary>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FilePoint {
    pub bytes: usize,
    /// PUT and GET through the subresource (kube-apiserver, the operator, the bridge).
    pub put_ms: Option<Summary>,
    pub get_ms: Option<Summary>,
    /// The same bytes written and read with briq's file calls directly, in 512 KiB parts.
    pub direct_write_ms: Option<Summary>,
    pub direct_read_ms: Option<Summary>,
}

impl FilePoint {
    /// MB (10^6 bytes) per second at the median time.
    pub fn mb_per_second(&self, summary: Option<&Summary>) -> Option<f64> {
        summary
            .filter(|s| s.median > 0.0)
            .map(|s| self.bytes as f64 / 1e6 / (s.median / 1000.0))
    }
}

pub async fn run(
    stack: &Stack,
    progress: &Progress,
    sizes: &Sizes,
) -> (LiveFiles, Vec<(String, String)>) {
    let mut measured = LiveFiles {
        lag: None,
        followers: None,
        files: Vec::new(),
    };
    let mut failures = Vec::new();
    let mut fail = |label: &str, error: anyhow::Error| {
        progress.step(format!("14: {label} failed: {error:#}"));
        failures.push((format!("14 ({label})"), format!("{error:#}")));
    };
    if let Err(error) = stack.namespace(NAMESPACE).await {
        fail("setup", error);
        return (measured, failures);
    }
    let operator = match super::setup::controllers(stack, NAMESPACE, stack.server()) {
        Ok(operator) => operator,
        Err(error) => {
            fail("setup", error);
            return (measured, failures);
        }
    };
    let executors: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let names: Vec<String> = (0..sizes.executors.max(1))
        .map(|i| format!("live-{i:02}"))
        .collect();
    progress.step(format!(
        "14: live output and files on {} executors (real kernels)",
        names.len()
    ));
    match objects::create_ready(&executors, &names, &json!({}), 5).await {
        Err(error) => fail("setup", error),
        Ok(_) => {
            match lag(stack, progress, &names[0], sizes.lines).await {
                Ok(lag) => measured.lag = Some(lag),
                Err(error) => fail("lag", error),
            }
            match followers(stack, progress, &names, sizes).await {
                Ok(followers) => measured.followers = Some(followers),
                Err(error) => fail("many followers", error),
            }
            for &mb in &sizes.file_sizes_mb {
                match file_point(stack, progress, &names[0], mb, sizes.file_runs).await {
                    Ok(point) => measured.files.push(point),
                    Err(error) => fail(&format!("file {mb} MB"), error),
                }
            }
        }
    }
    if let Err(error) = objects::delete_executors(&executors).await {
        fail("clean-up", error);
    }
    operator.stop().await;
    (measured, failures)
}

/// Python printing `lines` lines `tick <i> <time.time()>`, one every 200 ms, after a quiet
/// start.
fn printer(lines: usize) -> String {
    format!(
        "import time\ntime.sleep({QUIET_START_SECONDS})\nfor i in range({lines}):\n    \
         print(f'tick {{i}} {{time.time():.6f}}', flush=True)\n    time.sleep({PERIOD_SECONDS})\n\
         {lines}"
    )
}

/// The lines `tick <i> <time>` of a stream of text, each with its lag at the time it was read.
#[derive(Default)]
struct Ticks {
    partial: String,
    lags: BTreeMap<usize, f64>,
}

impl Ticks {
    fn feed(&mut self, text: &str, received: SystemTime) {
        let now = received
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.partial.push_str(text);
        let Some(last) = self.partial.rfind('\n') else {
            return;
        };
        let rest = self.partial.split_off(last + 1);
        let complete = std::mem::replace(&mut self.partial, rest);
        for line in complete.lines() {
            let mut words = line.split_whitespace();
            if words.next() != Some("tick") {
                continue;
            }
            let (Some(Ok(i)), Some(Ok(printed))) = (
                words.next().map(str::parse::<usize>),
                words.next().map(str::parse::<f64>),
            ) else {
                continue;
            };
            self.lags.entry(i).or_insert((now - printed) * 1000.0);
        }
    }

    fn lags(&self) -> Vec<f64> {
        self.lags.values().copied().collect()
    }
}

/// Follows `name`'s log through kube-apiserver until its end piece; its ticks and the end.
async fn follow_operator(client: Client, name: String) -> anyhow::Result<(Ticks, String)> {
    let path = format!(
        "/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/executions/{name}/log?follow=true&format=json"
    );
    let request = http::Request::get(path).body(Vec::new())?;
    let stream = client
        .request_stream(request)
        .await
        .with_context(|| format!("following {name}'s log"))?;
    let mut lines = stream.lines();
    let mut ticks = Ticks::default();
    while let Some(line) = lines.try_next().await? {
        let received = SystemTime::now();
        match serde_json::from_str::<Piece>(&line)
            .with_context(|| format!("{name}'s log sent {line:?}"))?
        {
            Piece::Text { text, .. } => ticks.feed(&text, received),
            Piece::Cut { .. } => {}
            Piece::End { end } => return Ok((ticks, end)),
        }
    }
    bail!("{name}'s log ended without an end piece")
}

/// Follows `attempt` in `sandbox` directly: the bridge's `follow` started through briq's async
/// exec and read by offset, as the operator's reader does (`src/subresources/live.rs`).
async fn follow_direct(
    client: &BriqClient,
    key: &ApiKey,
    sandbox: &str,
    attempt: &str,
) -> anyhow::Result<(Ticks, String)> {
    let request = ExecRequest {
        argv: Command::Follow {
            attempt,
            deadline: FOLLOW_DEADLINE,
        }
        .argv(),
        cwd: Some(WORKDIR.to_owned()),
        env: Default::default(),
        timeout: FOLLOW_DEADLINE + Duration::from_secs(5),
        stdin: None,
    };
    // The sandbox may not know the attempt yet (it is recorded before its code gets there).
    for _ in 0..40 {
        let exec = client.exec_async(key, sandbox, &request).await?;
        let (mut offset, mut buffer, mut ticks) = (0u64, String::new(), Ticks::default());
        'reading: loop {
            let arguments = ExecResultArgs {
                briq: sandbox.to_owned(),
                exec: exec.clone(),
                offset: Some(offset),
                stream: Stream::Stdout,
                wait_ms: Some(10_000),
                max_bytes: None,
            };
            let result = client.exec_result(key, &arguments).await?;
            let received = SystemTime::now();
            let output = result.output.unwrap_or_default();
            offset = result.next_offset.unwrap_or(offset + output.len() as u64);
            buffer.push_str(&output);
            while let Some(end) = buffer.find('\n') {
                let line: String = buffer.drain(..=end).collect();
                if line.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<Piece>(&line)
                    .with_context(|| format!("follow printed {line:?}"))?
                {
                    Piece::Text { text, .. } => ticks.feed(&text, received),
                    Piece::Cut { .. } => {}
                    Piece::End { end } if end == "unknown" && ticks.lags.is_empty() => {
                        break 'reading;
                    }
                    Piece::End { end } => return Ok((ticks, end)),
                }
            }
            if result.state != ExecState::Running && output.is_empty() {
                bail!("follow exited with {:?} before an end", result.exit_code);
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bail!("the sandbox never knew attempt {attempt}")
}

fn sandbox_of(executor: &BriqExecutor) -> anyhow::Result<String> {
    executor
        .status
        .as_ref()
        .and_then(|s| s.sandbox_id.clone())
        .with_context(|| format!("{} has no sandbox", executor.name_any()))
}

/// Creates an Execution of `code` on `executor`; its attempt once recorded.
async fn start(
    executions: &Api<Execution>,
    executor: &BriqExecutor,
    name: &str,
    code: &str,
) -> anyhow::Result<String> {
    let execution = objects::execution_of(name, executor, code)?;
    executions
        .create(&PostParams::default(), &execution)
        .await?;
    let attempt = |e: &Execution| e.status.as_ref().and_then(|s| s.attempt_id.clone());
    let started = wait::for_object(executions, name, BOUND, |e| {
        attempt(e).is_some() || objects::finished(e)
    })
    .await?;
    attempt(&started).with_context(|| format!("{name} ended before it started: {started:?}"))
}

async fn finished(executions: &Api<Execution>, name: &str, lines: usize) -> anyhow::Result<()> {
    let ended = wait::for_object(executions, name, BOUND, objects::finished).await?;
    objects::check_output(&ended, &lines.to_string())
}

async fn lag(
    stack: &Stack,
    progress: &Progress,
    executor: &str,
    lines: usize,
) -> anyhow::Result<Lag> {
    progress.step(format!(
        "14: lag of {lines} printed lines to a follower of the log subresource and to a direct reader"
    ));
    let executors: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let executions: Api<Execution> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let executor = executors.get(executor).await?;
    let sandbox = sandbox_of(&executor)?;
    let name = "lag".to_owned();
    let execution = objects::execution_of(&name, &executor, &printer(lines))?;
    executions
        .create(&PostParams::default(), &execution)
        .await?;
    // The log follower waits for the start itself.
    let through_operator = tokio::spawn(follow_operator(stack.admin().clone(), name.clone()));
    let attempt = |e: &Execution| e.status.as_ref().and_then(|s| s.attempt_id.clone());
    let started = wait::for_object(&executions, &name, BOUND, |e| {
        attempt(e).is_some() || objects::finished(e)
    })
    .await?;
    let attempt = attempt(&started).context("the action ended before it started")?;
    let direct = follow_direct(stack.sandbox_client(), stack.key(), &sandbox, &attempt).await;
    let through_operator = through_operator.await?;
    finished(&executions, &name, lines).await?;
    // The end says how the action ended (the log's is its status's reason): not checked, the
    // lines are.
    let (operator, _) = through_operator?;
    let (direct, _) = direct?;
    for (who, ticks) in [
        ("the log follower", &operator),
        ("the direct reader", &direct),
    ] {
        if ticks.lags.len() != lines {
            bail!("{who} read {} of {lines} lines", ticks.lags.len());
        }
    }
    let operator_ms = Summary::of_millis(&operator.lags());
    let direct_ms = Summary::of_millis(&direct.lags());
    let ratio = |f: fn(&Summary) -> f64| {
        super::stats::ratio(operator_ms.as_ref().map(f), direct_ms.as_ref().map(f))
    };
    let lag = Lag {
        lines,
        ratio_p50: ratio(|s| s.median),
        ratio_p99: ratio(|s| s.p99),
        operator_ms,
        direct_ms,
    };
    progress.step(format!(
        "14: lag p50 {:.1} ms through the operator, {:.1} ms direct",
        lag.operator_ms.as_ref().map_or(f64::NAN, |s| s.median),
        lag.direct_ms.as_ref().map_or(f64::NAN, |s| s.median)
    ));
    Ok(lag)
}

/// utime + stime of this process, in ms.
pub(super) fn cpu_ms() -> f64 {
    let ticks = super::memory::cpu_ticks(std::process::id()) as f64;
    ticks * 1000.0 / super::memory::ticks_per_second()
}

pub(super) fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Notes, every 250 ms until stopped, which processes run the bridge's `follow` of each
/// attempt: how many were started per attempt, and the most that ran at once.
fn watch_readers(
    attempts: Vec<String>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(Vec<usize>, Vec<usize>)> {
    tokio::task::spawn_blocking(move || {
        let needles: Vec<Vec<u8>> = attempts
            .iter()
            .map(|a| format!("follow\0--attempt\0{a}\0").into_bytes())
            .collect();
        let mut seen: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); attempts.len()];
        let mut at_once = vec![0usize; attempts.len()];
        while !stop.load(Ordering::SeqCst) {
            let mut now = vec![0usize; attempts.len()];
            for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|p| p.parse::<u32>().ok())
                else {
                    continue;
                };
                let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                    continue;
                };
                // The reader itself: not the `timeout` the exec's prelude runs it under, whose
                // argv holds the same words.
                let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
                if !program.ends_with(b"python3") && !program.ends_with(b"python") {
                    continue;
                }
                for (i, needle) in needles.iter().enumerate() {
                    if cmdline
                        .windows(needle.len())
                        .any(|w| w == needle.as_slice())
                    {
                        seen[i].insert(pid);
                        now[i] += 1;
                    }
                }
            }
            for (most, now) in at_once.iter_mut().zip(now) {
                *most = (*most).max(now);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let started = seen.iter().map(BTreeSet::len).collect();
        (started, at_once)
    })
}

/// One round: an action printing `lines` lines on each executor, followed by `each` followers
/// (none for the floor); this process's CPU and wall time from the actions' start to the last
/// end, the RSS before and after, the readers per action, and every follower's ticks.
struct Round {
    cpu_ms: f64,
    wall_ms: f64,
    rss_before_kib: u64,
    rss_after_kib: u64,
    readers: (Vec<usize>, Vec<usize>),
    ticks: Vec<Ticks>,
}

async fn round(
    stack: &Stack,
    executors: &[BriqExecutor],
    label: &str,
    lines: usize,
    each: usize,
) -> anyhow::Result<Round> {
    let executions: Api<Execution> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let names: Vec<String> = (0..executors.len())
        .map(|i| format!("{label}-{i:02}"))
        .collect();
    let code = printer(lines);
    let attempts = futures::future::try_join_all(
        executors
            .iter()
            .zip(&names)
            .map(|(executor, name)| start(&executions, executor, name, &code)),
    )
    .await?;
    let stop = Arc::new(AtomicBool::new(false));
    let readers = watch_readers(attempts, stop.clone());
    let (rss_before_kib, cpu_before, started) = (rss_kib(), cpu_ms(), Instant::now());
    let followers: Vec<_> = names
        .iter()
        .flat_map(|name| std::iter::repeat_n(name, each))
        .map(|name| tokio::spawn(follow_operator(stack.admin().clone(), name.clone())))
        .collect();
    let ends =
        futures::future::try_join_all(names.iter().map(|n| finished(&executions, n, lines))).await;
    let mut ticks = Vec::new();
    let mut failed = Vec::new();
    for follower in followers {
        match follower.await? {
            Ok((t, _)) => ticks.push(t),
            Err(error) => failed.push(format!("{error:#}")),
        }
    }
    let (cpu_ms, wall_ms) = (
        cpu_ms() - cpu_before,
        started.elapsed().as_secs_f64() * 1000.0,
    );
    let rss_after_kib = rss_kib();
    stop.store(true, Ordering::SeqCst);
    let readers = readers.await?;
    ends?;
    if let Some(first) = failed.first() {
        bail!(
            "{} of {} followers failed: {first}",
            failed.len(),
            names.len() * each
        );
    }
    Ok(Round {
        cpu_ms,
        wall_ms,
        rss_before_kib,
        rss_after_kib,
        readers,
        ticks,
    })
}

async fn followers(
    stack: &Stack,
    progress: &Progress,
    names: &[String],
    sizes: &Sizes,
) -> anyhow::Result<Followers> {
    let (lines, each) = (sizes.lines, sizes.followers_each);
    progress.step(format!(
        "14: {} followers of {} actions ({each} each), against the same actions unfollowed",
        names.len() * each,
        names.len()
    ));
    let api: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let executors = futures::future::try_join_all(names.iter().map(|name| api.get(name))).await?;
    let unfollowed = round(stack, &executors, "unfollowed", lines, 0).await?;
    let followed = round(stack, &executors, "followed", lines, each).await?;
    let complete = followed
        .ticks
        .iter()
        .filter(|t| t.lags.len() == lines)
        .count();
    let lags: Vec<f64> = followed.ticks.iter().flat_map(Ticks::lags).collect();
    let measured = Followers {
        executors: names.len(),
        followers_each: each,
        lines,
        complete,
        followed_cpu_ms: followed.cpu_ms,
        followed_wall_ms: followed.wall_ms,
        unfollowed_cpu_ms: unfollowed.cpu_ms,
        unfollowed_wall_ms: unfollowed.wall_ms,
        rss_before_kib: followed.rss_before_kib,
        rss_after_kib: followed.rss_after_kib,
        readers_per_action: followed.readers.0,
        readers_at_once_per_action: followed.readers.1,
        lag_ms: Summary::of_millis(&lags),
    };
    if unfollowed.readers.0.iter().any(|&r| r > 0) {
        bail!(
            "follow readers ran with no follower: {:?}",
            unfollowed.readers
        );
    }
    progress.step(format!(
        "14: CPU {:.0} ms followed, {:.0} ms unfollowed; readers per action {:?}, at once {:?}",
        measured.followed_cpu_ms,
        measured.unfollowed_cpu_ms,
        measured.readers_per_action,
        measured.readers_at_once_per_action
    ));
    Ok(measured)
}

fn files_path(executor: &str, path: &str) -> String {
    format!(
        "/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/briqexecutors/{executor}/files?path={path}"
    )
}

async fn file_point(
    stack: &Stack,
    progress: &Progress,
    executor: &str,
    mb: usize,
    runs: usize,
) -> anyhow::Result<FilePoint> {
    let api: Api<BriqExecutor> = Api::namespaced(stack.admin().clone(), NAMESPACE);
    let sandbox = sandbox_of(&api.get(executor).await?)?;
    let bytes = mb * 1_000_000;
    let mut content = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut content);
    let digest = format!("{:x}", Sha256::digest(&content));
    let client = stack.admin();
    let (sandboxes, key) = (stack.sandbox_client(), stack.key());
    let (mut put, mut get, mut write, mut read) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs {
        let path = format!("{SCRATCH}/{mb}mb-{i}.bin");
        let request = http::Request::put(files_path(executor, &path))
            .header(http::header::CONTENT_TYPE, "application/octet-stream")
            .header(http::header::CONTENT_LENGTH, bytes)
            .header(SHA256_HEADER, &digest)
            .body(content.clone())?;
        let sent = Instant::now();
        client
            .request_text(request)
            .await
            .with_context(|| format!("PUT of {mb} MB"))?;
        put.push(sent.elapsed());

        let request = http::Request::get(files_path(executor, &path)).body(Vec::new())?;
        let sent = Instant::now();
        let mut body = Vec::with_capacity(bytes);
        client
            .request_stream(request)
            .await
            .with_context(|| format!("GET of {mb} MB"))?
            .read_to_end(&mut body)
            .await?;
        get.push(sent.elapsed());
        if body != content {
            bail!(
                "the GET of {mb} MB answered other bytes ({} of them)",
                body.len()
            );
        }
        drop(body);

        // The floor: the same bytes in the operator's parts, straight to briq.
        let scratch = format!("{SCRATCH}/direct-{mb}mb-{i}");
        let sent = Instant::now();
        for (part, chunk) in content.chunks(WRITE_PART_BYTES).enumerate() {
            let part_path = format!("{scratch}/part-{part:04}");
            sandboxes
                .write_file(key, &sandbox, &part_path, chunk)
                .await?;
        }
        write.push(sent.elapsed());
        let sent = Instant::now();
        let mut back = Vec::with_capacity(bytes);
        for part in 0..content.len().div_ceil(WRITE_PART_BYTES) {
            let part_path = format!("{scratch}/part-{part:04}");
            back.extend(sandboxes.read_file(key, &sandbox, &part_path).await?);
        }
        read.push(sent.elapsed());
        if back != content {
            bail!("the direct read of {mb} MB answered other bytes");
        }
        progress.step(format!(
            "14: {mb} MB: PUT {:.2}s GET {:.2}s; direct write {:.2}s read {:.2}s",
            put[i].as_secs_f64(),
            get[i].as_secs_f64(),
            write[i].as_secs_f64(),
            read[i].as_secs_f64()
        ));
    }
    Ok(FilePoint {
        bytes,
        put_ms: Summary::of(&put),
        get_ms: Summary::of(&get),
        direct_write_ms: Summary::of(&write),
        direct_read_ms: Summary::of(&read),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_read_across_pieces_and_once_each() {
        let mut ticks = Ticks::default();
        let at = UNIX_EPOCH + Duration::from_secs(100);
        ticks.feed("tick 0 99.750000\ntick 1 99.9", at);
        ticks.feed("00000\nnoise\n", at);
        ticks.feed("tick 1 50.0\n", at);
        let lags = ticks.lags();
        assert_eq!(lags.len(), 2);
        assert!((lags[0] - 250.0).abs() < 1e-6 && (lags[1] - 100.0).abs() < 1e-6);
        assert_eq!(ticks.partial, "");
    }

    #[test]
    fn the_printer_prints_its_lines_then_answers_their_count() {
        let code = printer(3);
        assert!(code.contains("range(3)") && code.ends_with("\n3"), "{code}");
        assert!(code.contains("print(f'tick {i} {time.time():.6f}', flush=True)"));
    }
}
