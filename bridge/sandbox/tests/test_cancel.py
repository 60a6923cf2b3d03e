"""`cancel` (PROTOCOL.md "Cancel"): a running action is interrupted and the kernel kept; code
that will not stop costs the kernel (restarted, its state gone) but not the executor; an action
cancelled before it came never runs; a finished one keeps its result. Every result recorded for
a cancelled attempt says `cancelled`, whoever records it, and every delivery answers it."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import bridge_env, client_argv, new_nonce, parse_envelope, process_gone


@pytest.fixture(scope="module")
def briq_sandbox(bridge_module):
    return bridge_module


def new_attempt() -> str:
    return secrets.token_hex(8)


def cancel(sandbox, attempt: str, grace: float = 3.0):
    return sandbox.bridge("cancel", "--attempt", attempt, "--grace", str(grace))


def recall(sandbox, attempt: str):
    return sandbox.bridge("recall", "--attempt", attempt)


def wait_for_file(path: Path, wait: float = 20.0) -> None:
    deadline = time.monotonic() + wait
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared (the code never started)"
        time.sleep(0.02)


class Delivery:
    """An action delivered in the background as the operator does (the run client, the code
    on stdin), with a long timeout: only a cancel ends it."""

    def __init__(self, sandbox, attempt: str, code: str, timeout: float = 120) -> None:
        self.sandbox = sandbox
        self.nonce = new_nonce()
        self.process = subprocess.Popen(
            client_argv(timeout, attempt),
            cwd=sandbox.root,
            env=bridge_env(sandbox.env, self.nonce),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.process.stdin.write(code.encode("utf-8"))
        self.process.stdin.close()
        self.process.stdin = None  # sent whole: communicate() has nothing more to send

    def answer(self, wait: float = 30) -> tuple[dict | None, int, str]:
        """The envelope (None when there is none), the exit code and stderr."""
        try:
            stdout, stderr = self.process.communicate(timeout=wait)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.communicate()
        text = stdout.decode()
        envelope = parse_envelope(text, self.nonce, self.sandbox.root) if "BRIQ" in text else None
        return envelope, self.process.returncode, stderr.decode()


def looping(sandbox, name: str, loop: str, before: str = "") -> tuple[Path, str]:
    """Code that says (a file) when it is in its loop, and that file."""
    started = sandbox.user_dir / f"{name}.started"
    return started, f"{before}open({str(started)!r}, 'w').close()\n{loop}"


RUNAWAY = "while True:\n    pass"
SWALLOWS_INTERRUPTS = (
    "import time\n"
    "while True:\n"
    "    try:\n"
    "        time.sleep(0.1)\n"
    "    except KeyboardInterrupt:\n"
    "        pass"
)


def counting_code(sandbox, marker: str) -> str:
    ran = sandbox.user_dir / f"{marker}.txt"
    return f"open({str(ran)!r}, 'a').write('ran\\n')\n'done'"


def runs(sandbox, marker: str) -> int:
    path = sandbox.user_dir / f"{marker}.txt"
    return path.read_text().count("ran\n") if path.exists() else 0


def test_a_runaway_loop_is_interrupted_within_seconds_and_the_kernel_keeps_its_state(
    fresh_sandbox,
):
    assert fresh_sandbox.run("x = 41")["status"] == "ok"
    pid = fresh_sandbox.kernel_pid()
    attempt = new_attempt()
    started, code = looping(fresh_sandbox, attempt, RUNAWAY)
    delivery = Delivery(fresh_sandbox, attempt, code)
    wait_for_file(started)
    began = time.monotonic()
    cancelled = cancel(fresh_sandbox, attempt)
    answer, exit_code, stderr = delivery.answer()
    elapsed = time.monotonic() - began
    assert cancelled.returncode == 0, cancelled.stderr
    envelope = cancelled.envelope
    assert envelope["status"] == "cancelled"
    assert envelope["error"]["name"] == "Cancelled"
    assert "KeyboardInterrupt" in envelope["error"]["message"]
    assert "keeps its state" in envelope["error"]["message"]
    assert envelope["final_answer"] is None
    assert elapsed < 3, f"the interrupt took {elapsed:.1f} s"
    assert exit_code == 0, stderr
    assert answer == envelope, "the run's answer is the record the journal holds"
    assert recall(fresh_sandbox, attempt).envelope == envelope
    assert fresh_sandbox.kernel_pid() == pid
    assert fresh_sandbox.run("x + 1")["output"] == "42"


def test_code_that_swallows_the_interrupt_is_stopped_by_a_new_kernel(fresh_sandbox):
    assert fresh_sandbox.run("x = 41")["status"] == "ok"
    old = fresh_sandbox.kernel_pid()
    attempt = new_attempt()
    started, code = looping(fresh_sandbox, attempt, SWALLOWS_INTERRUPTS)
    delivery = Delivery(fresh_sandbox, attempt, code)
    wait_for_file(started)
    cancelled = cancel(fresh_sandbox, attempt, grace=1)
    answer, exit_code, stderr = delivery.answer()
    assert cancelled.returncode == 0, cancelled.stderr
    envelope = cancelled.envelope
    assert envelope["status"] == "cancelled"
    assert envelope["error"]["name"] == "KernelRestarted"
    assert "within 1 s of the interrupt" in envelope["error"]["message"]
    assert "state is gone" in envelope["error"]["message"]
    assert exit_code == 0, stderr
    assert answer == envelope, "the runner answered the record the journal holds"
    assert recall(fresh_sandbox, attempt).envelope == envelope
    assert process_gone(old)
    new = fresh_sandbox.probe()
    assert new["alive"] and new["pid"] not in (None, old)
    lost = fresh_sandbox.run("x")
    assert lost["status"] == "error" and lost["error"]["name"] == "NameError"
    assert fresh_sandbox.run("6 * 7")["output"] == "42"


def test_an_attempt_cancelled_before_it_was_delivered_never_runs(shared_sandbox):
    attempt = new_attempt()
    cancelled = cancel(shared_sandbox, attempt)
    assert cancelled.returncode == 0, cancelled.stderr
    envelope = cancelled.envelope
    assert envelope["status"] == "cancelled"
    assert envelope["error"] == {
        "name": "Cancelled",
        "message": "cancelled before it ran: the code never ran",
        "traceback": "",
    }
    code = counting_code(shared_sandbox, attempt)
    # Through the runner (the run client), then through the full bridge: neither runs it.
    assert shared_sandbox.client(code, attempt=attempt).envelope == envelope
    nonce = new_nonce()
    full = subprocess.run(
        [sys.executable, ".briq/bridge.py", "run", "--code", "-", "--attempt", attempt],
        cwd=shared_sandbox.root,
        env=bridge_env(shared_sandbox.env, nonce),
        input=code,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert full.returncode == 0, full.stderr
    assert parse_envelope(full.stdout, nonce, shared_sandbox.root) == envelope
    assert recall(shared_sandbox, attempt).envelope == envelope
    assert runs(shared_sandbox, attempt) == 0


def test_a_cancel_before_delivery_acknowledges_no_earlier_record(shared_sandbox):
    """An earlier attempt may still be running when the operator cancels a later one: its record
    must not become prunable before the operator learnt it."""
    earlier = new_attempt()
    assert shared_sandbox.client("'earlier'", attempt=earlier).returncode == 0
    journal = shared_sandbox.root / ".briq" / "journal"
    assert not (journal / f"{earlier}.acked").exists()
    assert cancel(shared_sandbox, new_attempt()).envelope["status"] == "cancelled"
    assert not (journal / f"{earlier}.acked").exists()


def test_a_cancel_after_the_attempt_finished_returns_its_result_unchanged(shared_sandbox):
    attempt = new_attempt()
    pid = shared_sandbox.kernel_pid()
    done = shared_sandbox.client("6 * 7", attempt=attempt)
    assert done.returncode == 0 and done.envelope["output"] == "42"
    late = cancel(shared_sandbox, attempt)
    assert late.returncode == 0, late.stderr
    assert late.envelope == done.envelope
    assert recall(shared_sandbox, attempt).envelope == done.envelope
    assert shared_sandbox.kernel_pid() == pid


def test_output_printed_before_the_cancel_is_kept_in_the_cancelled_result(fresh_sandbox):
    attempt = new_attempt()
    before = "print('made it this far', flush=True)\n"
    started, code = looping(fresh_sandbox, attempt, RUNAWAY, before=before)
    delivery = Delivery(fresh_sandbox, attempt, code)
    wait_for_file(started)
    cancelled = cancel(fresh_sandbox, attempt)
    answer, _, _ = delivery.answer()
    assert cancelled.envelope["status"] == "cancelled"
    assert "made it this far\n" in cancelled.envelope["logs"]
    assert answer == cancelled.envelope


def test_two_cancels_at_once_of_code_that_will_not_stop_give_one_record(fresh_sandbox):
    old = fresh_sandbox.kernel_pid()
    attempt = new_attempt()
    started, code = looping(fresh_sandbox, attempt, SWALLOWS_INTERRUPTS)
    delivery = Delivery(fresh_sandbox, attempt, code)
    wait_for_file(started)
    with ThreadPoolExecutor(2) as pool:
        calls = list(pool.map(lambda _: cancel(fresh_sandbox, attempt, grace=1), range(2)))
    answer, _, _ = delivery.answer()
    assert [c.returncode for c in calls] == [0, 0], [c.stderr for c in calls]
    assert calls[0].envelope == calls[1].envelope == answer
    assert answer["status"] == "cancelled"
    assert answer["error"]["name"] == "KernelRestarted"
    new = fresh_sandbox.probe()
    assert new["alive"] and new["pid"] != old
    assert fresh_sandbox.run("'usable'")["output"] == "'usable'"


def test_a_cancel_records_the_attempt_itself_when_the_runner_died_with_it(fresh_sandbox):
    """The runner is killed mid-run (nobody will record the attempt) and the code ignores the
    interrupt: the cancel restarts the kernel and records the attempt itself."""
    attempt = new_attempt()
    started, code = looping(fresh_sandbox, attempt, SWALLOWS_INTERRUPTS)
    delivery = Delivery(fresh_sandbox, attempt, code)
    wait_for_file(started)
    runner = fresh_sandbox.runner_pid()
    assert runner is not None
    os.kill(runner, signal.SIGKILL)
    assert process_gone(runner)
    answer, exit_code, _ = delivery.answer()
    assert answer is None and exit_code == 1, "the outcome was unknown to the delivery"
    cancelled = cancel(fresh_sandbox, attempt, grace=1)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.envelope["status"] == "cancelled"
    assert cancelled.envelope["error"]["name"] == "KernelRestarted"
    assert recall(fresh_sandbox, attempt).envelope == cancelled.envelope
    assert fresh_sandbox.run("'usable'")["output"] == "'usable'"


def journal_in(briq_sandbox, tmp_path, monkeypatch):
    monkeypatch.setattr(briq_sandbox, "split_users", lambda: False)
    return briq_sandbox.Journal(tmp_path / "journal")


def test_a_second_writer_of_a_result_gets_the_first_ones_record(
    briq_sandbox, tmp_path, monkeypatch
):
    """A cancel that records an attempt itself must not overwrite what the runner recorded in
    the meantime, nor the other way round: the first record stands and both answer it."""
    journal = journal_in(briq_sandbox, tmp_path, monkeypatch)
    attempt = new_attempt()
    assert journal.accept(attempt, time.time() + 30)
    first = briq_sandbox.result_envelope("ok", output="1")
    second = briq_sandbox.result_envelope("ok", output="2")
    assert journal.finish(attempt, first, 0) == (first, 0)
    assert journal.finish(attempt, second, 0) == (first, 0)
    assert journal.finished(attempt) == (first, 0)
    leftovers = [p.name for p in (tmp_path / "journal").iterdir() if p.name.startswith(".")]
    assert leftovers == [], "no temporary file is left behind"


def test_every_writer_records_a_cancelled_attempt_as_cancelled(briq_sandbox, tmp_path, monkeypatch):
    journal = journal_in(briq_sandbox, tmp_path, monkeypatch)
    attempt = new_attempt()
    assert journal.accept(attempt, time.time() + 30)
    assert journal.mark_cancel(attempt)
    assert not journal.mark_cancel(attempt), "a second cancel finds the first one's marker"
    final = briq_sandbox.result_envelope(
        "final_answer", logs="so far\n", final_answer='safe:"x"', duration_ms=1500
    )
    envelope, exit_code = journal.finish(attempt, final, 0)
    assert exit_code == 0
    assert envelope["status"] == "cancelled"
    assert envelope["final_answer"] is None
    assert envelope["logs"] == "so far\n" and envelope["duration_ms"] == 1500
    assert envelope["error"]["name"] == "Cancelled"
    assert journal.finished(attempt) == (envelope, 0)
    assert (tmp_path / "journal" / f"{attempt}.cancel").stat().st_mode & 0o777 == 0o600
