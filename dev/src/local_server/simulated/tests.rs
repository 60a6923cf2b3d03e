use std::path::PathBuf;

use briq_operator::bridge::{self, Envelope, Nonce, RunStatus};

use super::*;

const ATTEMPT: &str = "00000000000000aa";

struct Fixture {
    simulator: Simulator,
    sandbox: Arc<SimulatedSandbox>,
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        Self {
            simulator: Simulator::new(Simulation {
                setup: Duration::from_millis(1),
                kernel_start: Duration::from_millis(1),
            }),
            sandbox: Arc::default(),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn cwd(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// Execs `line` (split at spaces) with `stdin`, a fresh nonce and a 10 s exec timeout.
    async fn exec(&self, line: &str, stdin: Option<&str>) -> ExecOutput {
        self.exec_with(line, stdin, Duration::from_secs(10)).await.1
    }

    async fn exec_with(
        &self,
        line: &str,
        stdin: Option<&str>,
        timeout: Duration,
    ) -> (Nonce, ExecOutput) {
        let argv: Vec<String> = line.split(' ').map(str::to_owned).collect();
        let nonce = Nonce::random();
        let output = self
            .simulator
            .exec(
                &self.sandbox,
                &self.cwd(),
                &argv,
                Some(nonce.as_str()),
                stdin,
                timeout,
            )
            .await;
        (nonce, output)
    }

    /// The envelope of `line`, parsed as strictly as the operator does.
    async fn envelope(&self, line: &str, stdin: Option<&str>) -> Envelope {
        let (nonce, output) = self.exec_with(line, stdin, Duration::from_secs(10)).await;
        assert_eq!(output.exit_code, Some(0), "{line}: {output:?}");
        bridge::parse(&output.stdout, &nonce).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    async fn kernel(&self, line: &str) -> bridge::KernelReport {
        match self.envelope(line, None).await {
            Envelope::Kernel(report) => report,
            other => panic!("{line}: {other:?}"),
        }
    }

    async fn result(&self, line: &str, code: Option<&str>) -> bridge::RunResult {
        match self.envelope(line, code).await {
            Envelope::Result(result) => result,
            other => panic!("{line}: {other:?}"),
        }
    }

    /// Uploads the staged bridge, sets up and starts the kernel, as provisioning does.
    async fn provision(&self) -> i64 {
        std::fs::create_dir_all(self.dir.path().join(".briq")).unwrap();
        std::fs::write(self.dir.path().join(".briq/bridge-01.py"), "# bridge").unwrap();
        let setup = self
            .envelope(
                "python3 .briq/bridge-01.py setup --self-install --deadline 55.000",
                None,
            )
            .await;
        assert!(
            matches!(setup, Envelope::Setup(ref s) if s.ok && !s.installed),
            "{setup:?}"
        );
        assert!(self.dir.path().join(INSTALLED_BRIDGE).is_file());
        assert!(!self.dir.path().join(".briq/bridge-01.py").exists());
        let kernel = self.kernel(START).await;
        assert!(kernel.alive && kernel.started, "{kernel:?}");
        kernel.pid.unwrap()
    }
}

const START: &str = "python3 .briq/bridge.py start-kernel --state-dir .briq/state --deadline 30";
const PROBE: &str = "python3 .briq/bridge.py probe --state-dir .briq/state";

fn run_line(attempt: &str, timeout: &str) -> String {
    format!(
        "python3 -I -S -c source run --state-dir .briq/state --timeout {timeout} --attempt {attempt}"
    )
}

fn recall_line(attempt: &str) -> String {
    format!("python3 .briq/bridge.py recall --attempt {attempt}")
}

#[tokio::test]
async fn provisioning_starts_one_kernel_that_probe_reports() {
    let fixture = Fixture::new();
    let pid = fixture.provision().await;
    let again = fixture.kernel(START).await;
    assert_eq!(
        (again.alive, again.started, again.pid),
        (true, false, Some(pid))
    );
    let probe = fixture.kernel(PROBE).await;
    assert_eq!((probe.alive, probe.pid), (true, Some(pid)));
    fixture.sandbox.kill_kernel();
    let probe = fixture.kernel(PROBE).await;
    assert_eq!((probe.alive, probe.pid), (false, None));
    let restarted = fixture.kernel(START).await;
    assert!(
        restarted.started && restarted.pid != Some(pid),
        "{restarted:?}"
    );
}

#[tokio::test]
async fn runs_answer_by_their_code() {
    let fixture = Fixture::new();
    fixture.provision().await;
    for (attempt, code, timeout, status, output) in [
        (
            "00000000000000a1",
            "1 + 1",
            "30",
            RunStatus::Ok,
            Some("1 + 1"),
        ),
        (
            "00000000000000a2",
            "# sleep-ms: 20\nx = 3\nx",
            "30",
            RunStatus::Ok,
            Some("x"),
        ),
        ("00000000000000a3", "# nothing", "30", RunStatus::Ok, None),
        (
            "00000000000000a4",
            "# sleep-ms: 5000\n1",
            "0.050",
            RunStatus::Timeout,
            None,
        ),
    ] {
        let result = fixture
            .result(&run_line(attempt, timeout), Some(code))
            .await;
        assert_eq!(result.status, status, "{code:?}: {result:?}");
        assert_eq!(result.output.as_deref(), output, "{code:?}");
    }
    let slept = fixture
        .result(
            &run_line("00000000000000b1", "30"),
            Some("# sleep-ms: 30\n1"),
        )
        .await;
    assert!(slept.duration_ms >= 30, "{slept:?}");
}

#[tokio::test]
async fn an_attempt_runs_at_most_once() {
    let fixture = Fixture::new();
    fixture.provision().await;
    let not_yet = fixture.result(&recall_line(ATTEMPT), None).await;
    assert_eq!(not_yet.status, RunStatus::NotAccepted);
    let code = "# sleep-ms: 40\n1 + 1";
    let line = run_line(ATTEMPT, "30");
    // A second delivery while the first runs waits for the first one's result; a recall too.
    let (first, second, recalled) = tokio::join!(
        fixture.result(&line, Some(code)),
        async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            fixture.result(&line, Some("other code")).await
        },
        async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            fixture.result(&recall_line(ATTEMPT), None).await
        },
    );
    assert_eq!(first.output.as_deref(), Some("1 + 1"));
    assert_eq!(second, first);
    assert_eq!(recalled, first);
    let later = fixture.result(&line, Some("1 + 2")).await;
    assert_eq!(later, first);
}

#[tokio::test]
async fn a_run_outlives_an_abandoned_exec() {
    let fixture = Fixture::new();
    fixture.provision().await;
    let line = run_line(ATTEMPT, "30");
    let (_, abandoned) = fixture
        .exec_with(&line, Some("# sleep-ms: 50\n7"), Duration::from_millis(10))
        .await;
    assert!(abandoned.timed_out, "{abandoned:?}");
    let recalled = fixture.result(&recall_line(ATTEMPT), None).await;
    assert_eq!(
        (recalled.status, recalled.output.as_deref()),
        (RunStatus::Ok, Some("7"))
    );
}

#[tokio::test]
async fn a_lost_kernel_is_reported() {
    let fixture = Fixture::new();
    let never_started = fixture
        .result(&run_line("00000000000000c1", "30"), Some("1"))
        .await;
    assert_eq!(never_started.status, RunStatus::KernelLost);
    fixture.provision().await;
    let line = run_line("00000000000000c2", "30");
    let (result, ()) = tokio::join!(fixture.result(&line, Some("# sleep-ms: 50\n1")), async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        fixture.sandbox.kill_kernel();
    },);
    assert_eq!(result.status, RunStatus::KernelLost, "{result:?}");
}

#[tokio::test]
async fn what_is_not_a_bridge_command_fails_as_a_process_would() {
    let fixture = Fixture::new();
    for (line, code, stderr) in [
        ("true", 127, "not python3"),
        ("python3 -c pass", 127, "no bridge subcommand"),
        (
            "python3 .briq/bridge.py recall",
            127,
            "--attempt needs a value",
        ),
        // No setup yet: the bridge is not there.
        (PROBE, 2, "can't open file"),
        ("python3 ../bridge.py probe", 2, "can't open file"),
    ] {
        let output = fixture.exec(line, None).await;
        assert_eq!(output.exit_code, Some(code), "{line}: {output:?}");
        assert!(output.stderr.contains(stderr), "{line}: {output:?}");
        assert!(output.stdout.is_empty(), "{line}");
    }
    let argv: Vec<String> = run_line(ATTEMPT, "30")
        .split(' ')
        .map(str::to_owned)
        .collect();
    let no_nonce = fixture
        .simulator
        .exec(
            &fixture.sandbox,
            &fixture.cwd(),
            &argv,
            None,
            Some("1"),
            Duration::from_secs(1),
        )
        .await;
    assert_eq!(no_nonce.exit_code, Some(2), "{no_nonce:?}");
}
