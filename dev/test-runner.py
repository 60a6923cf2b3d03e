#!/usr/bin/env python3
"""`make test`'s runner: times each set-up step, runs the Rust test binaries and the Python
suites (several at a time with `--jobs`), and ends with a report of where the time went: each
step, each binary or suite (wall time), and the slowest tests.

    python3 dev/test-runner.py reset
    python3 dev/test-runner.py step NAME -- COMMAND...
    python3 dev/test-runner.py run [--jobs N] [--skip-kind lib] [--suite DIR COMMAND]...

`step` runs COMMAND as is (its output goes to ours) and records its time; `reset` forgets the
recorded steps. `run` builds the test binaries (`cargo test --workspace --all-targets --no-run`),
runs each of them and each suite (COMMAND run in DIR; a `--junitxml=PATH` in it gives its tests'
times) with its output in a log file, prints a line as each ends and, for a failure, its log;
then the report. It fails when any binary or suite failed, or ran longer than its limit
(`BRIQ_TEST_JOB_LIMIT_SECONDS`, default 1200: a hang ends the run with the tests still running
named, well inside CI's budget). Everything it writes goes to
`$CARGO_TARGET_DIR/test-report/` (default `target/`), including each binary's and suite's time,
so that the next run starts the longest first.

Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLOWEST = 20
# The longest one binary or suite may run: the slowest takes a few minutes on a loaded 2-CPU
# machine; a hang is stopped here rather than by CI's limit.
JOB_LIMIT_SECONDS = float(os.environ.get("BRIQ_TEST_JOB_LIMIT_SECONDS", "1200"))


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")


def report_dir() -> Path:
    path = target_dir() / "test-report"
    path.mkdir(parents=True, exist_ok=True)
    return path


def steps_file() -> Path:
    return report_dir() / "steps.jsonl"


def record_step(name: str, seconds: float, ok: bool) -> None:
    with steps_file().open("a") as steps:
        steps.write(json.dumps({"name": name, "seconds": round(seconds, 1), "ok": ok}) + "\n")


@dataclass
class Job:
    """A test binary or a Python suite, run as one process."""

    label: str
    argv: list[str]
    cwd: Path
    env: dict[str, str]
    junit: Path | None = None
    # Filled in when it has run:
    seconds: float = 0.0
    returncode: int | None = None
    tests: list[tuple[str, float]] = field(default_factory=list)
    passed: int = 0
    failed: list[str] = field(default_factory=list)
    ignored: int = 0
    log: Path | None = None


def test_binaries(skip_kinds: set[str]) -> list[Job]:
    """Builds every test target of the workspace and returns its binaries as jobs."""
    command = [
        "cargo",
        "test",
        "--workspace",
        "--all-targets",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]
    started = time.monotonic()
    build = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    record_step(
        "cargo build of the test binaries", time.monotonic() - started, build.returncode == 0
    )
    if build.returncode != 0:
        sys.exit(build.returncode)
    jobs = []
    for line in build.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message["profile"]["test"]:
            continue  # an example or a binary built for the integration tests
        kinds = message["target"]["kind"]
        if skip_kinds & set(kinds):
            continue
        package = Path(message["manifest_path"]).parent
        source = Path(message["target"]["src_path"])
        label = str(source.relative_to(ROOT)) if source.is_relative_to(ROOT) else str(source)
        env = {
            # `--format json` and `--report-time` (each test's time) are unstable options of
            # libtest; a stable toolchain's test binaries accept them when RUSTC_BOOTSTRAP is set
            # where they run. Only the test binary sees it: nothing is compiled with it.
            "RUSTC_BOOTSTRAP": "1",
            # As `cargo test` runs them: in their package's directory, with its manifest's.
            "CARGO_MANIFEST_DIR": str(package),
            "CARGO_PKG_NAME": message["target"]["name"],
        }
        argv = [message["executable"], "--format", "json", "-Z", "unstable-options"]
        jobs.append(Job(label, argv + ["--report-time"], package, env))
    return jobs


def suite(directory: str, command: str) -> Job:
    argv = shlex.split(command)
    junit = next((Path(a.split("=", 1)[1]) for a in argv if a.startswith("--junitxml=")), None)
    cwd = ROOT / directory
    if junit is not None and not junit.is_absolute():
        junit = cwd / junit
    return Job(directory, argv, cwd, {}, junit=junit)


def run_limited(argv: list[str], **kwargs) -> tuple[int, str | None]:
    """Runs `argv` (its process group killed past JOB_LIMIT_SECONDS); its exit status (-9 when
    killed) and its stdout when piped."""
    with subprocess.Popen(argv, start_new_session=True, **kwargs) as process:
        try:
            stdout, _ = process.communicate(timeout=JOB_LIMIT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            stdout, _ = process.communicate()
            return -9, stdout
        return process.returncode, stdout


def still_running(stdout: str) -> list[str]:
    """The tests libtest's JSON events show started and not ended."""
    running: dict[str, None] = {}
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("type") != "test":
            continue
        if event.get("event") == "started":
            running[event.get("name", "?")] = None
        elif event.get("event") in ("ok", "failed", "ignored"):
            running.pop(event.get("name", "?"), None)
    return list(running)


def parse_libtest(job: Job, stdout: str) -> list[str]:
    """Reads libtest's JSON events; returns the output of the failed tests, to show."""
    shown = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            shown.append(line)  # something printed to stdout past the harness
            continue
        if event.get("type") != "test":
            continue
        # ("timeout" only says a test has run for over 60 s; its end comes as another event.)
        name, outcome = event.get("name", "?"), event.get("event")
        if outcome == "ok":
            job.passed += 1
            job.tests.append((name, float(event.get("exec_time", 0.0))))
        elif outcome == "failed":
            job.failed.append(name)
            job.tests.append((name, float(event.get("exec_time", 0.0))))
            shown.append(f"---- {job.label} {name} ----")
            shown.append(event.get("stdout", "").rstrip())
        elif outcome == "ignored":
            job.ignored += 1
    return shown


def parse_junit(job: Job) -> None:
    if job.junit is None or not job.junit.is_file():
        return
    for case in ElementTree.parse(job.junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        seconds = float(case.get("time") or 0.0)
        if case.find("skipped") is not None:
            job.ignored += 1
            continue
        if case.find("failure") is not None or case.find("error") is not None:
            job.failed.append(name)
        else:
            job.passed += 1
        job.tests.append((name, seconds))


def run_job(job: Job, logs: Path, print_lock: threading.Lock) -> Job:
    job.log = logs / (job.label.replace("/", "_") + ".log")
    if job.junit is not None:
        job.junit.unlink(missing_ok=True)  # a stale one would pass for this run's
    env = {**os.environ, **job.env}
    started = time.monotonic()
    with job.log.open("w") as log:
        if job.junit is None and job.argv[-1] == "--report-time":
            # libtest: JSON events on stdout, what the tests print past the harness on stderr.
            returncode, stdout = run_limited(
                job.argv,
                cwd=job.cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                text=True,
            )
            stdout = stdout or ""
            shown = parse_libtest(job, stdout)
            if returncode == -9:
                running = still_running(stdout)
                job.failed.extend(running)
                shown.append(
                    f"---- {job.label}: stopped after {JOB_LIMIT_SECONDS:.0f} s, "
                    f"still running: {', '.join(running) or '(none named)'} ----"
                )
            log.write("\n".join(["", "== libtest events", stdout]))
        else:
            returncode, _ = run_limited(
                job.argv,
                cwd=job.cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            parse_junit(job)
            shown = []
            if returncode == -9:
                log.write(f"\n---- stopped after {JOB_LIMIT_SECONDS:.0f} s ----\n")
    job.seconds = time.monotonic() - started
    job.returncode = returncode
    with print_lock:
        status = "ok" if returncode == 0 else f"FAILED (exit {returncode})"
        counts = f"{job.passed} passed, {len(job.failed)} failed, {job.ignored} ignored"
        print(f"{status:>6}  {job.seconds:7.1f} s  {job.label}  ({counts})", flush=True)
        if returncode != 0:
            text = job.log.read_text(errors="replace")
            if job.junit is None and job.argv[-1] == "--report-time":
                # Its stderr, then the failed tests' captured output.
                text = text.split("\n== libtest events\n", 1)[0] + "\n" + "\n".join(shown)
            print(f"---- output of {job.label} (also in {job.log}) ----")
            print(text.rstrip(), flush=True)
            print(f"---- end of {job.label} ----", flush=True)
    return job


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat (zeros elsewhere)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return (0, 0)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields) - idle, sum(fields))


def load_history() -> dict[str, float]:
    try:
        return json.loads((report_dir() / "history.json").read_text())
    except (OSError, ValueError):
        return {}


def report(jobs: list[Job], jobs_at_once: int, wall: float, busy: float | None) -> None:
    steps = []
    if steps_file().is_file():
        steps = [json.loads(line) for line in steps_file().read_text().splitlines() if line]
    print("\n== where the time went")
    print("set-up steps:")
    for step in steps:
        mark = "" if step["ok"] else "  (failed)"
        print(f"  {step['seconds']:7.1f} s  {step['name']}{mark}")
    total = sum(job.seconds for job in jobs)
    print(
        f"test binaries and suites, {jobs_at_once} at a time: {wall:.1f} s "
        f"(their sum: {total:.1f} s)"
        + (f", CPUs busy {busy:.0%} of that time" if busy is not None else "")
        + ":"
    )
    for job in sorted(jobs, key=lambda job: -job.seconds):
        if job.returncode == 0 and not job.tests:
            continue  # a target without tests
        print(f"  {job.seconds:7.1f} s  {job.label}  ({job.passed + len(job.failed)} tests)")
    tests = [(seconds, job.label, name) for job in jobs for name, seconds in job.tests]
    print(f"slowest {SLOWEST} tests:")
    for seconds, label, name in sorted(tests, reverse=True)[:SLOWEST]:
        print(f"  {seconds:7.1f} s  {label}  {name}")
    (report_dir() / "report.json").write_text(
        json.dumps(
            {
                "steps": steps,
                "jobs_at_once": jobs_at_once,
                "wall_seconds": round(wall, 1),
                "cpu_busy": busy,
                "jobs": [
                    {
                        "label": job.label,
                        "seconds": round(job.seconds, 1),
                        "returncode": job.returncode,
                        "tests": {name: round(seconds, 2) for name, seconds in job.tests},
                        "failed": job.failed,
                    }
                    for job in jobs
                ],
            },
            indent=1,
        )
    )


def run(args: argparse.Namespace) -> int:
    # The suites first: each holds many tests.
    jobs = [suite(directory, command) for directory, command in args.suite]
    jobs += test_binaries(set(args.skip_kind))
    # The longest first, as the last run timed them (unknown ones first of all, in the order
    # above), so that the last to end is a short one.
    history = load_history()
    jobs.sort(key=lambda job: -history.get(job.label, float("inf")))
    logs = report_dir() / "logs"
    logs.mkdir(exist_ok=True)
    print(f"running {len(jobs)} test binaries and suites, {args.jobs} at a time", flush=True)
    lock = threading.Lock()
    started, cpu_before = time.monotonic(), cpu_times()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        done = list(pool.map(lambda job: run_job(job, logs, lock), jobs))
    wall, cpu_after = time.monotonic() - started, cpu_times()
    spent = cpu_after[1] - cpu_before[1]
    busy = (cpu_after[0] - cpu_before[0]) / spent if spent > 0 else None
    history.update({job.label: round(job.seconds, 1) for job in done})
    (report_dir() / "history.json").write_text(json.dumps(history, indent=1, sort_keys=True))
    report(done, args.jobs, wall, busy)
    failed = [job for job in done if job.returncode != 0]
    if failed:
        print("\nFAILED:")
        for job in failed:
            names = ", ".join(job.failed) or f"exit {job.returncode}"
            print(f"  {job.label}: {names} (log: {job.log})")
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("reset", help="forget the recorded set-up steps")
    step = commands.add_parser("step", help="run and time a set-up step")
    step.add_argument("name")
    step.add_argument("argv", nargs=argparse.REMAINDER)
    runner = commands.add_parser("run", help="build and run the tests, then report")
    runner.add_argument("--jobs", type=int, default=default_jobs())
    runner.add_argument("--skip-kind", action="append", default=[], metavar="KIND")
    runner.add_argument("--suite", nargs=2, action="append", default=[], metavar=("DIR", "CMD"))
    args = parser.parse_args()
    if args.command == "reset":
        steps_file().unlink(missing_ok=True)
        return 0
    if args.command == "step":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        started = time.monotonic()
        returncode = subprocess.run(argv).returncode
        record_step(args.name, time.monotonic() - started, returncode == 0)
        return returncode
    return run(args)


def default_jobs() -> int:
    """One test binary or suite per CPU. Most of a test's time is spent waiting (on the API
    server, a kernel, a deadline), so a 2-core machine runs two at a time in about two thirds of
    the time of one at a time (418 s against 623 s), its CPUs busy 85% of it; three saturate them
    (98%) and stretch single tests up to twice as long for 7% less."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus)


if __name__ == "__main__":
    sys.exit(main())
