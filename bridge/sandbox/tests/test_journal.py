"""The result journal (PROTOCOL.md "Attempts"): an attempt delivered twice runs once, and what
became of it can be asked for again, also after the runner that ran it is gone."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import bridge_env, new_nonce, parse_envelope, process_gone


@pytest.fixture(scope="module")
def briq_sandbox(bridge_module):
    return bridge_module


def new_attempt() -> str:
    return secrets.token_hex(8)


def counting_code(sandbox, marker: str, then: str = "'done'") -> str:
    """Code that appends a line to a file each time it runs, then evaluates `then`."""
    ran = sandbox.user_dir / f"{marker}.txt"
    return f"open({str(ran)!r}, 'a').write('ran\\n')\n{then}"


def runs(sandbox, marker: str) -> int:
    path = sandbox.user_dir / f"{marker}.txt"
    return path.read_text().count("ran\n") if path.exists() else 0


def deliver(sandbox, attempt: str, code: str, timeout: float = 30):
    """Deliver `code` as `attempt` the way the operator does (the run client)."""
    return sandbox.client(code, timeout, attempt=attempt)


def recall(sandbox, attempt: str):
    return sandbox.bridge("recall", "--attempt", attempt)


def start_delivery(sandbox, attempt: str, code: str, *options: str) -> tuple[subprocess.Popen, str]:
    """Start delivering `code` as `attempt` in the background; the process and its nonce."""
    name = f".briq/actions/{attempt}.py"
    (sandbox.root / name).write_text(code, encoding="utf-8")
    nonce = new_nonce()
    process = subprocess.Popen(
        [sys.executable, ".briq/bridge.py", "run", "--code", name, "--attempt", attempt, *options],
        cwd=sandbox.root,
        env=bridge_env(sandbox.env, nonce),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return process, nonce


def wait_for_file(path: Path, wait: float = 20.0) -> None:
    deadline = time.monotonic() + wait
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared (the code never started)"
        time.sleep(0.02)


def raw_bridge(sandbox, *options: str) -> subprocess.CompletedProcess:
    """The bridge's stdout, stderr and exit code, for calls that must print no envelope."""
    return subprocess.run(
        [sys.executable, ".briq/bridge.py", *options],
        cwd=sandbox.root,
        env=bridge_env(sandbox.env, new_nonce()),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_attempt_delivered_twice_runs_once_and_both_deliveries_get_its_result(
    shared_sandbox,
):
    attempt = new_attempt()
    code = counting_code(shared_sandbox, attempt, then="6 * 7")
    first = deliver(shared_sandbox, attempt, code)
    second = deliver(shared_sandbox, attempt, code)
    assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
    assert first.envelope["output"] == "42"
    assert second.envelope == first.envelope
    assert runs(shared_sandbox, attempt) == 1


def test_concurrent_deliveries_of_one_attempt_run_it_once(shared_sandbox):
    attempt = new_attempt()
    code = counting_code(shared_sandbox, attempt, then="import time\ntime.sleep(1)\n'slow'")
    with ThreadPoolExecutor(4) as pool:
        calls = list(pool.map(lambda _: deliver(shared_sandbox, attempt, code), range(4)))
    assert [c.returncode for c in calls] == [0] * 4, [c.stderr for c in calls]
    assert {c.envelope["output"] for c in calls} == {"'slow'"}
    assert runs(shared_sandbox, attempt) == 1


def test_recall_while_the_attempt_runs_waits_for_its_result(shared_sandbox):
    attempt = new_attempt()
    started = shared_sandbox.user_dir / f"{attempt}.started"
    code = f"open({str(started)!r}, 'w').close()\nimport time\ntime.sleep(2)\n'late'"
    running, nonce = start_delivery(shared_sandbox, attempt, code)
    try:
        wait_for_file(started)
        asked = recall(shared_sandbox, attempt)
        stdout, _ = running.communicate(timeout=30)
    finally:
        if running.poll() is None:
            running.kill()
    assert asked.returncode == 0, asked.stderr
    assert asked.envelope["output"] == "'late'"
    assert asked.envelope == parse_envelope(stdout, nonce, shared_sandbox.root)


def test_recall_of_an_attempt_never_delivered_says_it_was_not_accepted(shared_sandbox):
    asked = recall(shared_sandbox, new_attempt())
    assert asked.returncode == 0, asked.stderr
    assert asked.envelope["kind"] == "result"
    assert asked.envelope["status"] == "not_accepted"


def test_the_result_survives_the_runner_that_produced_it(fresh_sandbox):
    attempt = new_attempt()
    first = deliver(fresh_sandbox, attempt, counting_code(fresh_sandbox, attempt, then="'kept'"))
    assert first.envelope["output"] == "'kept'"
    runner = fresh_sandbox.runner_pid()
    assert runner is not None
    os.kill(runner, signal.SIGKILL)
    assert process_gone(runner)
    asked = recall(fresh_sandbox, attempt)
    assert asked.envelope == first.envelope
    again = deliver(fresh_sandbox, attempt, counting_code(fresh_sandbox, attempt))
    assert again.envelope == first.envelope
    assert runs(fresh_sandbox, attempt) == 1


def test_an_accepted_attempt_without_a_result_is_never_run_again(fresh_sandbox):
    """The runner is killed mid-run: the attempt stays accepted with no result. A second
    delivery neither runs it nor claims an outcome, once the first one's time is up."""
    attempt = new_attempt()
    started = fresh_sandbox.user_dir / f"{attempt}.txt"
    code = counting_code(fresh_sandbox, attempt, then="import time\ntime.sleep(3)\n'never'")
    first, _ = start_delivery(fresh_sandbox, attempt, code, "--timeout", "1")
    try:
        wait_for_file(started)
        runner = fresh_sandbox.runner_pid()
        assert runner is not None
        os.kill(runner, signal.SIGKILL)
        first.communicate(timeout=20)
    finally:
        if first.poll() is None:
            first.kill()
    name = f".briq/actions/{attempt}.py"
    second = raw_bridge(
        fresh_sandbox, "run", "--code", name, "--timeout", "1", "--attempt", attempt
    )
    assert second.returncode == 1
    assert "BRIQ-ENVELOPE" not in second.stdout
    assert "may or may not have run" in second.stderr
    assert runs(fresh_sandbox, attempt) == 1


def test_malformed_attempt_ids_are_refused_before_anything_runs(shared_sandbox):
    for bad in ["../../etc/passwd", "ABCDEF0123456789", "0123", "g" * 16]:
        call = raw_bridge(shared_sandbox, "recall", "--attempt", bad)
        assert call.returncode != 0
        assert "BRIQ-ENVELOPE" not in call.stdout


def journal_in(briq_sandbox, tmp_path, monkeypatch):
    monkeypatch.setattr(briq_sandbox, "split_users", lambda: False)
    return briq_sandbox.Journal(tmp_path / "journal")


def accept_and_finish(briq_sandbox, journal, attempt: str, now: float) -> None:
    assert journal.accept(attempt, now + 30)
    journal.finish(attempt, briq_sandbox.result_envelope("ok"), 0)


def age(tmp_path, attempt: str, seconds: float, now: float) -> None:
    """Make every file of `attempt`'s record `seconds` old."""
    for path in (tmp_path / "journal").glob(f"{attempt}.*"):
        os.utime(path, (now - seconds, now - seconds))


def kept(tmp_path) -> list[str]:
    return sorted({p.name.split(".")[0] for p in (tmp_path / "journal").iterdir()})


def test_the_journal_keeps_the_newest_acknowledged_records_and_drops_old_ones(
    briq_sandbox, tmp_path, monkeypatch
):
    monkeypatch.setattr(briq_sandbox, "JOURNAL_KEEP", 3)
    journal = journal_in(briq_sandbox, tmp_path, monkeypatch)
    attempts = [f"{i:016x}" for i in range(6)]
    now = time.time()
    for attempt in attempts:
        accept_and_finish(briq_sandbox, journal, attempt, now)
    for seconds, attempt in zip([7200, 50, 40, 30, 20, 10], attempts, strict=True):
        age(tmp_path, attempt, seconds, now)
    journal.prune(now)
    assert kept(tmp_path) == attempts[2:], (
        "the newest three acknowledged (the one over an hour old goes in any case), and the "
        "newest attempt, which no later one acknowledged"
    )
    for attempt in attempts[2:]:
        assert journal.finished(attempt) == (briq_sandbox.result_envelope("ok"), 0)


def test_a_record_the_operator_has_not_learnt_survives_the_clock_past_the_hour(
    briq_sandbox, tmp_path, monkeypatch
):
    """The operator went down while its last attempt ran, for longer than the retention: the
    sandbox still tells it the result, so the code is not sent a second time."""
    journal = journal_in(briq_sandbox, tmp_path, monkeypatch)
    now = time.time()
    earlier, last = "00000000000000e1", "00000000000000f2"
    accept_and_finish(briq_sandbox, journal, earlier, now)
    accept_and_finish(briq_sandbox, journal, last, now)
    journal.prune(now + 2 * briq_sandbox.JOURNAL_MAX_AGE_S)
    assert kept(tmp_path) == [last], "the acknowledged record went, the unlearnt one stayed"
    assert journal.finished(last) == (briq_sandbox.result_envelope("ok"), 0)
    assert journal.accepted(last) is not None


def test_a_record_the_operator_has_not_learnt_survives_more_than_256_later_records(
    briq_sandbox, tmp_path, monkeypatch
):
    journal = journal_in(briq_sandbox, tmp_path, monkeypatch)
    now = time.time()
    unlearnt = "ffffffffffffffff"
    assert journal.accept(unlearnt, now + 30)
    # Records of another executor's kind of history, each acknowledged when it was accepted
    # anew: made directly, as a copy of the journal from a long life would hold them.
    directory = tmp_path / "journal"
    for i in range(briq_sandbox.JOURNAL_KEEP + 44):
        for suffix in ("accepted", "acked"):
            (directory / f"{i:016x}.{suffix}").write_text("{}")
    journal.prune(now + 10)
    left = kept(tmp_path)
    assert unlearnt in left
    assert len(left) == briq_sandbox.JOURNAL_KEEP + 1
    assert journal.accepted(unlearnt) is not None


def test_a_new_attempt_acknowledges_every_earlier_record_and_recall_none(
    briq_sandbox, tmp_path, monkeypatch
):
    journal = journal_in(briq_sandbox, tmp_path, monkeypatch)
    now = time.time()
    first, second = "000000000000000a", "000000000000000b"
    accept_and_finish(briq_sandbox, journal, first, now)
    assert not (tmp_path / "journal" / f"{first}.acked").exists()
    assert not journal.accept(first, now + 30), "a second delivery acknowledges nothing"
    assert not (tmp_path / "journal" / f"{first}.acked").exists()
    accept_and_finish(briq_sandbox, journal, second, now)
    assert (tmp_path / "journal" / f"{first}.acked").exists()
    assert not (tmp_path / "journal" / f"{second}.acked").exists()


def test_a_tampered_record_is_no_result_but_still_counts_as_accepted(
    briq_sandbox, tmp_path, monkeypatch
):
    monkeypatch.setattr(briq_sandbox, "split_users", lambda: False)
    journal = briq_sandbox.Journal(tmp_path / "journal")
    attempt = new_attempt()
    assert journal.accept(attempt, time.time() - 1)
    Path(tmp_path / "journal" / f"{attempt}.finished").write_text(
        json.dumps({"envelope": {"kind": "result", "status": "ok"}, "exit_code": 0})
    )
    assert journal.finished(attempt) is None
    (tmp_path / "journal" / f"{attempt}.accepted").write_text("not json")
    assert journal.accepted(attempt) == {"wait_until": 0.0}
    assert not journal.accept(attempt, time.time() + 30)


def test_code_on_stdin_runs_as_the_attempt_and_a_second_delivery_does_not(shared_sandbox):
    """The operator's one call per action: the code on the exec's stdin, no upload."""
    attempt = new_attempt()
    code = counting_code(shared_sandbox, attempt, then="'from stdin ✓'")
    options = ["run", "--code", "-", "--timeout", "30", "--attempt", attempt]
    calls = []
    for _ in range(2):
        nonce = new_nonce()
        process = subprocess.run(
            [sys.executable, ".briq/bridge.py", *options],
            cwd=shared_sandbox.root,
            env=bridge_env(shared_sandbox.env, nonce),
            input=code,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert process.returncode == 0, process.stderr
        calls.append(parse_envelope(process.stdout, nonce, shared_sandbox.root))
    assert calls[0]["output"] == "'from stdin ✓'"
    assert calls[1] == calls[0]
    assert runs(shared_sandbox, attempt) == 1


def test_code_on_stdin_needs_an_attempt_to_name_its_file(shared_sandbox):
    call = raw_bridge(shared_sandbox, "run", "--code", "-")
    assert call.returncode == 1
    assert "needs --attempt" in call.stdout  # in the BridgeError envelope; nothing ran
