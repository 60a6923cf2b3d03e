//! The bridge a sandbox made by the previous release still runs: an upgrade adopts its sandboxes
//! and kernels as they are, so this operator must speak to the bridge that release installed
//! (`compat/<version>/bridge/`, as it shipped). Checked here without a kernel: every command line
//! this operator sends an adopted sandbox parses under that bridge's own parser, and every
//! envelope it prints (framed, spilled) parses here to what it meant. The run client's side of
//! the runner and the journal's files are checked in `bridge/sandbox/tests/test_compat.py`.

use std::{path::PathBuf, process::Command as Process, time::Duration};

use serde_json::{Value, json};

use super::*;

/// The releases whose bridges may still run in sandboxes this operator adopts.
const RELEASES: &[&str] = &["0.1.0"];

/// Asks the previous release's bridge module (imported, `main` not run) to parse `argvs` and to
/// print its envelopes framed with `nonce`; its answer as JSON.
fn ask_previous_bridge(release: &str, argvs: &[Vec<String>], nonce: &Nonce) -> Value {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let bridge = root
        .join("compat")
        .join(release)
        .join("bridge/briq_sandbox.py");
    let results = tempfile::tempdir().expect("a directory for spilled envelopes");
    let mut child = Process::new("python3")
        .args(["-I", "-c", PREVIOUS_BRIDGE_ANSWERS])
        .arg(&bridge)
        .arg(results.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs (the bridge's compatibility check needs it)");
    let request = json!({ "argvs": argvs, "nonce": nonce.as_str() });
    std::io::Write::write_all(
        child.stdin.as_mut().unwrap(),
        request.to_string().as_bytes(),
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{} answered {}: {}",
        bridge.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the helper prints JSON")
}

/// Imports the bridge given as argv[1]; for each argv of the request, what its parser makes of
/// it (its options, or the exit status it refused with); and its envelopes as it prints them.
const PREVIOUS_BRIDGE_ANSWERS: &str = r#"
import contextlib, importlib.util, io, json, pathlib, sys
path, results = sys.argv[1], pathlib.Path(sys.argv[2])
spec = importlib.util.spec_from_file_location("previous_bridge", path)
bridge = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bridge)
request = json.load(sys.stdin)
nonce = request["nonce"]

parsed = []
for argv in request["argvs"]:
    try:
        with contextlib.redirect_stderr(io.StringIO()) as refusal:
            options = vars(bridge.build_parser().parse_args(argv))
        parsed.append({k: v for k, v in options.items() if not callable(v)})
    except SystemExit as exc:
        parsed.append({"refused": f"exit {exc.code}: {refusal.getvalue().strip()}"})

result = bridge.result_envelope
error = bridge.error_info
samples = {
    "ok": result("ok", logs="hi\n", output="42", duration_ms=3),
    "error": result("error", logs="before\n", error=error("ZeroDivisionError", "division by zero", "Traceback")),
    "final_answer": result("final_answer", final_answer='safe:{"answer": 42}'),
    "final_answer_rejected": result("final_answer_rejected", error=error("FinalAnswerRejected", "a pickle")),
    "timeout": result("timeout", logs="slow\n", duration_ms=30000),
    "kernel_lost": result("kernel_lost"),
    "not_accepted": result("not_accepted"),
    "bridge_failure": bridge.bridge_failure("result", "bridge error: broken"),
    "kernel": bridge.kernel_envelope(True, False, 7, "running"),
    "setup": bridge.setup_envelope(True, False, "everything importable"),
}
framed = {name: bridge.envelope_text(nonce, envelope, results) for name, envelope in samples.items()}
large = result("ok", logs="x" * 60000, output="y" * 5000, duration_ms=1)
spilled_text = bridge.envelope_text(nonce, large, results)
files = [p for p in results.iterdir()]
print(json.dumps({
    "parsed": parsed,
    "framed": framed,
    "spilled": {
        "stdout": spilled_text,
        "files": [p.name for p in files],
        "content": files[0].read_text() if files else None,
        "directory": bridge.RESULTS_DIR,
    },
}))
"#;

/// Every command this operator sends a sandbox it did not set up itself: everything but setup,
/// which only a sandbox this operator creates receives. The run client (this release's text,
/// passed as the program) hands its options to the installed bridge as `run --code -` when no
/// runner takes the action.
fn commands_to_an_adopted_sandbox() -> Vec<Vec<String>> {
    let attempt = "0123456789abcdef0123456789abcdef";
    let commands = [
        Command::StartKernel {
            deadline: Duration::from_secs(30),
        },
        Command::Probe,
        Command::Recall { attempt },
    ];
    let mut argvs: Vec<Vec<String>> = commands
        .iter()
        .map(|command| command.argv()[2..].to_vec())
        .collect();
    let run = Command::Run {
        attempt,
        timeout: Duration::from_millis(30_500),
    }
    .argv();
    let client = run
        .iter()
        .position(|part| part == RUN_CLIENT)
        .expect("the run client is the program");
    let mut fallback = vec!["run".to_owned(), "--code".into(), "-".into()];
    assert_eq!(run[client + 1], "run");
    fallback.extend(run[client + 2..].iter().cloned());
    argvs.push(fallback);
    argvs
}

#[test]
fn every_command_this_operator_sends_an_adopted_sandbox_parses_under_the_previous_bridge() {
    let argvs = commands_to_an_adopted_sandbox();
    for release in RELEASES {
        let answer = ask_previous_bridge(release, &argvs, &Nonce::random());
        let parsed = answer["parsed"].as_array().unwrap();
        let expected = [
            json!({"command": "start-kernel", "state_dir": ".briq/state", "deadline": 30.0}),
            json!({"command": "probe", "state_dir": ".briq/state"}),
            json!({"command": "recall", "attempt": "0123456789abcdef0123456789abcdef"}),
            json!({"command": "run", "state_dir": ".briq/state", "code": "-", "timeout": 30.5,
                   "attempt": "0123456789abcdef0123456789abcdef"}),
        ];
        for ((argv, parsed), expected) in argvs.iter().zip(parsed).zip(expected) {
            for (key, value) in expected.as_object().unwrap() {
                assert_eq!(
                    &parsed[key], value,
                    "{release}'s bridge reads {argv:?} as {parsed}"
                );
            }
        }
    }
}

#[test]
fn every_envelope_the_previous_bridge_prints_parses_to_what_it_meant() {
    let nonce = Nonce::random();
    for release in RELEASES {
        let answer = ask_previous_bridge(release, &[], &nonce);
        let envelope = |name: &str| {
            let text = answer["framed"][name].as_str().unwrap();
            parse(text, &nonce).unwrap_or_else(|e| panic!("{release}'s {name} envelope: {e}"))
        };
        let result = |status, logs: &str| RunResult {
            status,
            logs: logs.into(),
            output: None,
            truncated: false,
            final_answer: None,
            error: None,
            display_dropped: 0,
            duration_ms: 0,
        };
        let error = |name: &str, message: &str, traceback: &str| {
            Some(CodeError {
                name: name.into(),
                message: message.into(),
                traceback: traceback.into(),
            })
        };
        let expected = [
            (
                "ok",
                Envelope::Result(RunResult {
                    output: Some("42".into()),
                    duration_ms: 3,
                    ..result(RunStatus::Ok, "hi\n")
                }),
            ),
            (
                "error",
                Envelope::Result(RunResult {
                    error: error("ZeroDivisionError", "division by zero", "Traceback"),
                    ..result(RunStatus::Error, "before\n")
                }),
            ),
            (
                "final_answer",
                Envelope::Result(RunResult {
                    final_answer: Some(r#"safe:{"answer": 42}"#.into()),
                    ..result(RunStatus::FinalAnswer, "")
                }),
            ),
            (
                "final_answer_rejected",
                Envelope::Result(RunResult {
                    error: error("FinalAnswerRejected", "a pickle", ""),
                    ..result(RunStatus::FinalAnswerRejected, "")
                }),
            ),
            (
                "timeout",
                Envelope::Result(RunResult {
                    duration_ms: 30_000,
                    ..result(RunStatus::Timeout, "slow\n")
                }),
            ),
            (
                "kernel_lost",
                Envelope::Result(result(RunStatus::KernelLost, "")),
            ),
            (
                "not_accepted",
                Envelope::Result(result(RunStatus::NotAccepted, "")),
            ),
            (
                "bridge_failure",
                Envelope::Result(RunResult {
                    error: error("BridgeError", "bridge error: broken", ""),
                    ..result(RunStatus::Error, "")
                }),
            ),
            (
                "kernel",
                Envelope::Kernel(KernelReport {
                    alive: true,
                    started: false,
                    pid: Some(7),
                    message: "running".into(),
                }),
            ),
            (
                "setup",
                Envelope::Setup(SetupReport {
                    ok: true,
                    installed: false,
                    message: "everything importable".into(),
                    pip_tail: None,
                }),
            ),
        ];
        for (name, meant) in expected {
            assert_eq!(envelope(name), meant, "{release}'s {name} envelope");
        }

        // Too large for briq's stdout: spilled to the file this operator reads, checked by size
        // and digest.
        let spilled = &answer["spilled"];
        let Ok(Envelope::Spilled(spill)) = parse(spilled["stdout"].as_str().unwrap(), &nonce)
        else {
            panic!("{release}'s large envelope is not spilled: {spilled}");
        };
        let (directory, file) = spill_file(&nonce)
            .rsplit_once('/')
            .map(|(d, f)| (d.to_owned(), f.to_owned()))
            .unwrap();
        assert_eq!(
            (&spilled["directory"], &spilled["files"]),
            (
                &json!(directory.strip_prefix(&format!("{WORKDIR}/")).unwrap()),
                &json!([file])
            ),
            "{release} spills where this operator looks"
        );
        let content = spilled["content"].as_str().unwrap().as_bytes();
        let Ok(Envelope::Result(large)) = parse_spilled(content, &spill, &nonce) else {
            panic!("{release}'s spilled envelope does not parse");
        };
        assert_eq!(
            (large.logs.len(), large.output.map(|o| o.len())),
            (60_000, Some(5_000))
        );
    }
}

/// `set-env` is new: a member made by the previous release cannot take a claimer's environment
/// at the handover. Its bridge must refuse the command outright (no envelope, which this
/// operator reads as malformed) so that the claimer is provisioned instead, which installs this
/// release's bridge first (claim/record.rs), and never be read as some other command.
#[test]
fn a_claimers_environment_sent_to_the_previous_bridge_is_refused_not_misread() {
    // What the run client hands the sandbox's own bridge when no runner takes the request: the
    // arguments it was given, as they are.
    let command = Command::SetEnv {
        deadline: Duration::from_secs(10),
    }
    .argv();
    let client = command
        .iter()
        .position(|part| part == RUN_CLIENT)
        .expect("the run client is the program");
    let argv = command[client + 1..].to_vec();
    for release in RELEASES {
        let answer = ask_previous_bridge(release, std::slice::from_ref(&argv), &Nonce::random());
        let refusal = answer["parsed"][0]["refused"].as_str().unwrap_or_else(|| {
            panic!(
                "{release}'s bridge reads {argv:?} as {}",
                answer["parsed"][0]
            )
        });
        assert!(refusal.starts_with("exit 2"), "{release}: {refusal}");
    }
}
