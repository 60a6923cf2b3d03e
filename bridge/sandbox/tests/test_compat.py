"""The bridge a sandbox made by a previous release still runs (compat/<version>/bridge/, as that
release shipped it): an upgrade adopts sandboxes and kernels as they are. Without a kernel:
the previous runner serves this release's run client (the operator sends its text with every
action), and the journal and the kernel's state read the same whichever release wrote them (a
sandbox set up again installs this bridge over the files the previous one left; a rollback
goes the other way). The operator's command lines and its envelope parser are checked against
the same files in src/bridge/compat.rs."""

from __future__ import annotations

import importlib.util
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import RUN_CLIENT, SANDBOX_SCRIPT, bridge_env, new_nonce, parse_envelope

COMPAT = Path(__file__).resolve().parents[3] / "compat"
RELEASES = sorted(p.name for p in COMPAT.iterdir() if (p / "bridge" / "briq_sandbox.py").is_file())


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def current():
    return load(SANDBOX_SCRIPT, "current_bridge")


@pytest.fixture(scope="module", params=RELEASES)
def previous(request):
    return load(COMPAT / request.param / "bridge" / "briq_sandbox.py", f"bridge_{request.param}")


def test_a_previous_release_is_recorded():
    assert RELEASES, f"no released bridge under {COMPAT}"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory playing `/work` (the journal and the state dir are relative to it)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


class StandInKernel:
    """What the previous runner's kernel client would do, without a kernel: an envelope per
    action, counted."""

    def __init__(self, bridge) -> None:
        self.bridge = bridge
        self.actions: list[str] = []

    def execute(self, code: str, timeout: float):
        self.actions.append(code)
        envelope = self.bridge.result_envelope("ok", logs="ran\n", output=repr(len(code)))
        return envelope, 0, None


def serve_one_connection(previous, kernel: StandInKernel) -> tuple[threading.Thread, object]:
    """The previous release's runner on `.briq/state/runner.sock`, for one connection."""
    state_dir = Path(".briq/state")
    state_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
    state_dir.chmod(0o700)
    state = previous.KernelState(str(state_dir))
    listener, inode = previous.bind_runner_socket(state)
    pid = os.getpid()
    state.live_pid = lambda: pid  # the stand-in kernel is alive
    runner = previous.Runner(state, pid, None, listener, inode)
    runner.execute = kernel.execute

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            runner.handle(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread, listener


def run_client(attempt: str, code: bytes, nonce: str) -> subprocess.CompletedProcess:
    """This release's run client, exactly as the operator starts it."""
    options = ["--state-dir", ".briq/state", "--timeout", "5.000", "--attempt", attempt]
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", RUN_CLIENT, "run", *options],
        input=code,
        env=bridge_env(dict(os.environ), nonce),
        capture_output=True,
        timeout=30,
    )


def test_the_previous_runner_serves_this_releases_run_client_once_per_attempt(
    previous, current, workdir
):
    kernel = StandInKernel(previous)
    attempt = secrets.token_hex(16)
    answers = []
    for _ in range(2):  # a second delivery of the same attempt gets the recorded result
        thread, listener = serve_one_connection(previous, kernel)
        nonce = new_nonce()
        try:
            call = run_client(attempt, b"x = 6 * 7", nonce)
        finally:
            thread.join(15)
            listener.close()
        assert call.returncode == 0, call.stderr
        answers.append(parse_envelope(call.stdout.decode("ascii"), nonce, workdir))
    assert kernel.actions == ["x = 6 * 7"], "the code ran once"
    expected = previous.result_envelope("ok", logs="ran\n", output="9")
    assert answers == [expected, expected]
    assert current.Journal().finished(attempt) == (expected, 0), "this bridge reads its record"


def journal_round_trip(writer, reader, directory: Path) -> None:
    finished, running = secrets.token_hex(16), secrets.token_hex(16)
    envelope = writer.result_envelope("ok", logs="hi\n", output="42", duration_ms=3)
    wait_until = time.time() + 60
    written = writer.Journal(directory)
    assert written.accept(finished, wait_until)
    written.finish(finished, envelope, 0)
    assert written.accept(running, wait_until)

    read = reader.Journal(directory)
    assert read.finished(finished) == (envelope, 0)
    assert read.accepted(running) == {"wait_until": wait_until}, "accepted, still running"
    assert read.finished(running) is None
    assert not read.accept(running, wait_until), "an attempt accepted before never runs again"
    assert read.accepted(secrets.token_hex(16)) is None, "never accepted: recall says so"
    # Accepting `running` acknowledged `finished` (the operator sends an executor's next attempt
    # only once it learnt the last one): pruning ages that one out and keeps the other.
    read.prune(time.time() + 10 * 24 * 3600)
    assert read.accepted(running) == {"wait_until": wait_until}, "not learnt yet: kept"
    assert read.accepted(finished) is None, "learnt and old: pruned"


def test_this_bridge_reads_the_journal_the_previous_one_wrote(previous, current, workdir):
    journal_round_trip(previous, current, workdir / ".briq" / "journal")


def test_the_previous_bridge_reads_the_journal_this_one_wrote(previous, current, workdir):
    journal_round_trip(current, previous, workdir / ".briq" / "journal")


def test_the_kernel_state_is_where_and_what_it_was(previous, current, workdir):
    old, new = previous.KernelState(".briq/state"), current.KernelState(".briq/state")
    # Files this release added; every other is where the previous release keeps it.
    added = {"env_file"}  # the claimer's environment (set-env)
    kept = {name: path for name, path in vars(new).items() if name not in added}
    assert kept == vars(old), "the same files: connection, pids, logs, socket, lock"
    assert added <= set(vars(new)) and not added & set(vars(old)), "added ones are new"
    old.dir.mkdir(parents=True)
    old.write_pid(4321)
    assert new.read_pid() == 4321
    for name in ("JOURNAL_DIR", "RESULTS_DIR", "ACTIONS_DIR", "STATE_DIR"):
        assert getattr(current, name, None) == getattr(previous, name, None), name


def test_the_previous_bridge_prunes_live_files_with_their_records(previous, current, workdir):
    """A rollback: the previous bridge knows no live files, and removes them with the records of
    their attempts all the same (one attempt's files share its id)."""
    journal = current.Journal()
    learnt, last = "00000000000000e1", "00000000000000f2"
    now = time.time()
    for attempt in (learnt, last):
        assert journal.accept(attempt, now + 30)
        with current.LiveOutput.start(attempt) as live:
            live.stream("stdout", "hi\n")
            live.how = "done"
        journal.finish(attempt, current.result_envelope("ok"), 0)
    previous.Journal(journal.dir).prune(now + 10 * 24 * 3600)
    assert not journal.live_path(learnt).exists(), "learnt and old: pruned with its records"
    assert journal.live_path(last).exists(), "not learnt yet: kept"
