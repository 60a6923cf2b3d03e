"""Live output (PROTOCOL.md "Live output"): a running attempt's stream output is appended to its
live file as it comes, and `follow` relays that file's lines, ending with how the attempt ended.
No test sleeps to give something time to happen: each waits on what the follower prints or on
a file the code or the bridge writes."""

from __future__ import annotations

import fcntl
import json
import os
import queue
import secrets
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    SPLIT,
    bridge_env,
    client_argv,
    kill_runner,
    new_nonce,
    parse_envelope,
    process_gone,
)

LIVE_BUDGET = 16_384


def new_attempt() -> str:
    return secrets.token_hex(8)


def live_file(sandbox, attempt: str) -> Path:
    return sandbox.root / ".briq" / "journal" / f"{attempt}.live"


def follow_argv(attempt: str, *options: str) -> list[str]:
    return [sys.executable, ".briq/bridge.py", "follow", "--attempt", attempt, *options]


def follow(sandbox, attempt: str, *options: str) -> subprocess.CompletedProcess:
    """`follow` to its end; a --max-seconds of 60 unless given, so a follower that should have
    ended at once says `timeout` instead of hanging the test."""
    if "--max-seconds" not in options:
        options = (*options, "--max-seconds", "60")
    return subprocess.run(
        follow_argv(attempt, *options),
        cwd=sandbox.root,
        env=sandbox.env,
        capture_output=True,
        timeout=120,
    )


def records(stdout: bytes) -> list[dict]:
    assert stdout.endswith(b"\n"), "only complete lines"
    return [json.loads(line) for line in stdout.splitlines()]


def joined(found: list[dict]) -> list[dict]:
    """`found` with a stream's records joined up to their line's end. ipykernel may send one
    printed line as several stream messages (its flush timer can fire between `print`'s two
    writes on a loaded machine): where a line is cut is the kernel's, not the bridge's."""
    lines: list[dict] = []
    for record in found:
        previous = lines[-1] if lines else {}
        if "stream" in record and previous.get("stream") == record["stream"]:
            if not previous["text"].endswith("\n"):
                previous["text"] += record["text"]
                continue
        lines.append(dict(record))
    return lines


class Follower:
    """`follow` running in the background; its lines are read as they come."""

    def __init__(self, sandbox, attempt: str, *options: str) -> None:
        self.process = subprocess.Popen(
            follow_argv(attempt, *options),
            cwd=sandbox.root,
            env=sandbox.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(b"")  # its stdout closed

    def next_record(self, wait: float = 30.0) -> dict:
        line = self.lines.get(timeout=wait)
        assert line.endswith(b"\n"), f"not a complete line: {line!r}"
        return json.loads(line)

    def next_line(self, wait: float = 30.0) -> dict:
        """The next record, with the records after it that finish its line (see `joined`)."""
        record = self.next_record(wait)
        while "stream" in record and not record["text"].endswith("\n"):
            more = self.next_record(wait)
            assert more.get("stream") == record["stream"], (record, more)
            record = {"stream": record["stream"], "text": record["text"] + more["text"]}
        return record

    def rest(self, wait: float = 60.0) -> list[dict]:
        """Every record until its stdout closes, joined into lines, and its exit code 0."""
        found = []
        while (line := self.lines.get(timeout=wait)) != b"":
            found.append(json.loads(line))
        assert self.process.wait(timeout=wait) == 0, self.process.stderr.read()
        return joined(found)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def start_delivery(sandbox, attempt: str, code: str, timeout: float = 30):
    """Deliver `code` as `attempt` the way the operator does (the run client), in the
    background; the process and its nonce."""
    nonce = new_nonce()
    with tempfile.TemporaryFile() as stdin:
        stdin.write(code.encode("utf-8"))
        stdin.seek(0)
        process = subprocess.Popen(
            client_argv(timeout, attempt),
            cwd=sandbox.root,
            env=bridge_env(sandbox.env, nonce),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    return process, nonce


def wait_for_file(path: Path, wait: float = 30.0) -> None:
    deadline = time.monotonic() + wait
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def code_waiting_for(release: Path, before: str, after: str) -> str:
    """Code that prints `before`, waits (at most a minute) until `release` exists, then prints
    `after`."""
    return (
        "import os, time\n"
        f"print({before!r}, flush=True)\n"
        "deadline = time.monotonic() + 60\n"
        f"while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        f"print({after!r}, flush=True)\n"
    )


def test_a_follower_sees_the_first_line_while_the_code_still_runs(shared_sandbox):
    attempt = new_attempt()
    release = shared_sandbox.user_dir / f"{attempt}.release"
    code = code_waiting_for(release, "first", "second")
    running, nonce = start_delivery(shared_sandbox, attempt, code)
    follower = None
    try:
        # Once accepted, the attempt is followed (a follower before that is told `unknown`).
        wait_for_file(shared_sandbox.root / ".briq" / "journal" / f"{attempt}.accepted")
        follower = Follower(shared_sandbox, attempt)
        assert follower.next_line() == {"stream": "stdout", "text": "first\n"}
        # The code cannot end before the release exists: the line came while it ran.
        assert running.poll() is None
        release.touch()
        assert follower.rest() == [{"stream": "stdout", "text": "second\n"}, {"end": "done"}]
        stdout, stderr = running.communicate(timeout=60)
    finally:
        release.touch()
        if follower is not None:
            follower.stop()
        if running.poll() is None:
            running.kill()
    assert running.returncode == 0, stderr
    envelope = parse_envelope(stdout.decode(), nonce, shared_sandbox.root)
    assert envelope["logs"] == "first\nsecond\n"


def test_stdout_and_stderr_are_told_apart_in_the_kernels_order(shared_sandbox):
    attempt = new_attempt()
    code = (
        "import sys\n"
        "print('one', flush=True)\n"
        "print('two', file=sys.stderr, flush=True)\n"
        "print('three', flush=True)\n"
        "print('\\x1b[31mred\\x1b[0m', file=sys.stderr, flush=True)\n"
        "1 / 0\n"
    )
    call = shared_sandbox.client(code, attempt=attempt)
    assert call.envelope["status"] == "error"
    followed = follow(shared_sandbox, attempt)
    assert followed.returncode == 0, followed.stderr
    assert joined(records(followed.stdout)) == [
        {"stream": "stdout", "text": "one\n"},
        {"stream": "stderr", "text": "two\n"},
        {"stream": "stdout", "text": "three\n"},
        # As in the result's logs: the text as the kernel sent it.
        {"stream": "stderr", "text": "\x1b[31mred\x1b[0m\n"},
        # The code raised, but it ran to its end: the result says how.
        {"end": "done"},
    ]
    assert followed.stdout.isascii(), "one pure-ASCII JSON object per line"


def test_a_flood_leaves_only_the_budget_then_cut_then_end(shared_sandbox):
    attempt = new_attempt()
    code = "for i in range(5_000):\n    print(f'{i:07d}' + 'x' * 993)\n"  # 5 MB in 1,000-char lines
    call = shared_sandbox.client(code, attempt=attempt)
    assert call.envelope["truncated"] is True
    path = live_file(shared_sandbox, attempt)
    lines = path.read_bytes().splitlines()
    assert path.stat().st_size <= LIVE_BUDGET + 64 * len(lines)
    found = [json.loads(line) for line in lines]
    assert found[-2:] == [{"cut": LIVE_BUDGET}, {"end": "done"}]
    text = "".join(record["text"] for record in found[:-2])
    assert len(text) == LIVE_BUDGET, "as much as the budget, never more"
    assert call.envelope["logs"].startswith(text), "the head of what the code printed"
    assert records(follow(shared_sandbox, attempt).stdout) == found


def test_follow_from_an_offset_resumes_without_gaps_or_repeats(shared_sandbox):
    attempt = new_attempt()
    code = (
        "import sys\n"
        "for i in range(5):\n"
        "    print(i, file=[sys.stdout, sys.stderr][i % 2], flush=True)\n"
    )
    shared_sandbox.client(code, attempt=attempt)
    whole = follow(shared_sandbox, attempt).stdout
    assert joined(records(whole)) == [
        {"stream": "stdout", "text": "0\n"},
        {"stream": "stderr", "text": "1\n"},
        {"stream": "stdout", "text": "2\n"},
        {"stream": "stderr", "text": "3\n"},
        {"stream": "stdout", "text": "4\n"},
        {"end": "done"},
    ]
    ends = [i + 1 for i, byte in enumerate(whole) if byte == ord("\n")]
    for offset in [0, *ends]:
        resumed = follow(shared_sandbox, attempt, "--offset", str(offset))
        assert resumed.returncode == 0, resumed.stderr
        # A resume after the end line gets the end line again, never "lost".
        assert resumed.stdout == (whole[offset:] or whole[ends[-2] :]), offset
    # An offset inside a line skips the rest of that line: never a line in part.
    inside = follow(shared_sandbox, attempt, "--offset", str(ends[1] + 3))
    assert inside.stdout == whole[ends[2] :]


def test_a_follower_of_an_unknown_attempt_ends_at_once(empty_sandbox):
    followed = follow(empty_sandbox, new_attempt(), "--max-seconds", "600")
    assert followed.returncode == 0, followed.stderr
    assert records(followed.stdout) == [{"end": "unknown"}]


@pytest.mark.parametrize("bad", ["../journal/0123456789abcdef", "0123456789ABCDEF", "0123", ""])
def test_a_malformed_attempt_id_is_refused(empty_sandbox, bad):
    followed = follow(empty_sandbox, bad)
    assert followed.returncode == 2
    assert followed.stdout == b""
    assert b"attempt id is 16 to 64 lowercase hex digits" in followed.stderr


def test_an_attempt_cancelled_before_it_ran_is_gone(empty_sandbox):
    """Its result is recorded, and it never ran here: there is no live output to follow."""
    attempt = new_attempt()
    cancelled = empty_sandbox.bridge("cancel", "--attempt", attempt)
    assert cancelled.envelope["status"] == "cancelled"
    assert records(follow(empty_sandbox, attempt).stdout) == [{"end": "gone"}]


def planted_journal(sandbox, bridge_module, monkeypatch, attempt: str) -> Path:
    """`attempt` accepted in the sandbox's journal, its result not known yet, and the path of
    its live file (not made)."""
    monkeypatch.chdir(sandbox.root)
    journal = bridge_module.Journal()
    assert journal.accept(attempt, time.time() + 600)
    return journal.live_path(attempt).absolute()


def test_a_follower_of_a_writer_that_died_without_an_end_says_lost(
    empty_sandbox, bridge_module, monkeypatch
):
    attempt = new_attempt()
    path = planted_journal(empty_sandbox, bridge_module, monkeypatch, attempt)
    # What a writer killed in the middle of a line leaves: complete lines, a part, no lock.
    path.write_bytes(b'{"stream":"stdout","text":"before\\n"}\n{"stream":"std')
    followed = follow(empty_sandbox, attempt)
    assert records(followed.stdout) == [
        {"stream": "stdout", "text": "before\n"},
        {"end": "lost"},
    ]


def test_a_follower_waits_while_the_writer_holds_the_file_and_ends_with_its_end(
    empty_sandbox, bridge_module, monkeypatch
):
    attempt = new_attempt()
    path = planted_journal(empty_sandbox, bridge_module, monkeypatch, attempt)
    with open(path, "ab", buffering=0) as writer:
        fcntl.flock(writer, fcntl.LOCK_EX)  # a writer at work
        writer.write(b'{"stream":"stdout","text":"one\\n"}\n{"stream":')
        follower = Follower(empty_sandbox, attempt)
        try:
            assert follower.next_line() == {"stream": "stdout", "text": "one\n"}
            writer.write(b'"stderr","text":"two\\n"}\n')
            assert follower.next_line() == {"stream": "stderr", "text": "two\n"}
            writer.write(b'{"end":"deadline"}\n')
            assert follower.rest() == [{"end": "deadline"}]
        finally:
            follower.stop()


def test_a_follower_whose_writer_never_ends_stops_at_max_seconds(
    empty_sandbox, bridge_module, monkeypatch
):
    attempt = new_attempt()
    path = planted_journal(empty_sandbox, bridge_module, monkeypatch, attempt)
    with open(path, "ab") as writer:
        fcntl.flock(writer, fcntl.LOCK_EX)  # a writer that hangs
        followed = follow(empty_sandbox, attempt, "--max-seconds", "0.5")
    assert records(followed.stdout) == [{"end": "timeout"}]


def test_a_follower_of_a_runner_killed_mid_run_says_lost(fresh_sandbox):
    attempt = new_attempt()
    release = fresh_sandbox.user_dir / f"{attempt}.release"
    running, _ = start_delivery(fresh_sandbox, attempt, code_waiting_for(release, "up", "never"))
    follower = None
    try:
        wait_for_file(fresh_sandbox.root / ".briq" / "journal" / f"{attempt}.accepted")
        follower = Follower(fresh_sandbox, attempt)
        assert follower.next_line() == {"stream": "stdout", "text": "up\n"}
        runner = fresh_sandbox.runner_pid()
        os.kill(runner, signal.SIGKILL)
        assert process_gone(runner)
        assert follower.rest() == [{"end": "lost"}]
    finally:
        release.touch()
        if follower is not None:
            follower.stop()
        running.kill()
        running.wait()


def test_a_timed_out_attempt_ends_deadline(fresh_sandbox):
    attempt = new_attempt()
    code = "print('slow', flush=True)\nimport time\ntime.sleep(30)"
    call = fresh_sandbox.client(code, 1, attempt=attempt)
    assert call.envelope["status"] == "timeout"
    found = joined(records(follow(fresh_sandbox, attempt).stdout))
    assert found[0] == {"stream": "stdout", "text": "slow\n"}
    assert found[-1] == {"end": "deadline"}


def test_a_cancelled_attempt_ends_cancelled(fresh_sandbox):
    attempt = new_attempt()
    release = fresh_sandbox.user_dir / f"{attempt}.release"
    running, _ = start_delivery(fresh_sandbox, attempt, code_waiting_for(release, "up", "never"))
    follower = None
    try:
        wait_for_file(fresh_sandbox.root / ".briq" / "journal" / f"{attempt}.accepted")
        follower = Follower(fresh_sandbox, attempt)
        assert follower.next_line() == {"stream": "stdout", "text": "up\n"}
        cancelled = fresh_sandbox.bridge("cancel", "--attempt", attempt)
        assert cancelled.envelope["status"] == "cancelled", cancelled.envelope
        assert follower.rest() == [{"end": "cancelled"}]
        running.communicate(timeout=60)
    finally:
        release.touch()
        if follower is not None:
            follower.stop()
        if running.poll() is None:
            running.kill()


def test_a_second_delivery_leaves_the_first_runs_live_file_alone(shared_sandbox):
    attempt = new_attempt()
    first = shared_sandbox.client("print('once')", attempt=attempt)
    path = live_file(shared_sandbox, attempt)
    before = path.read_bytes(), os.stat(path).st_ino
    second = shared_sandbox.client("print('twice')", attempt=attempt)
    assert second.envelope == first.envelope
    assert (path.read_bytes(), os.stat(path).st_ino) == before
    assert joined(records(before[0])) == [{"stream": "stdout", "text": "once\n"}, {"end": "done"}]


def test_the_full_bridges_run_writes_the_live_file_with_a_runner_or_without(fresh_sandbox):
    """`bridge.py run` (the run client becomes it when no runner takes the action) hands the
    action to the runner, which collects the kernel's messages and writes the live file; with
    no runner, `run` collects them itself and writes it."""
    for attempt in (new_attempt(), new_attempt()):
        name = f".briq/actions/{attempt}.py"
        (fresh_sandbox.root / name).write_text(f"print({attempt!r})", encoding="utf-8")
        call = fresh_sandbox.bridge("run", "--code", name, "--attempt", attempt)
        assert call.envelope["logs"] == f"{attempt}\n", call.stderr
        assert joined(records(follow(fresh_sandbox, attempt).stdout)) == [
            {"stream": "stdout", "text": f"{attempt}\n"},
            {"end": "done"},
        ]
        kill_runner(fresh_sandbox)  # the second one runs without


def test_user_code_cannot_read_or_write_its_own_live_file(shared_sandbox):
    if not SPLIT:
        pytest.skip("the bridge is not root here, so user code runs as its uid (residual risk)")
    attempt = new_attempt()
    path = live_file(shared_sandbox, attempt)
    code = f"""
import os
print('written while it runs', flush=True)
done = []
attempts = {{
    'read': lambda: open({str(path)!r}).read(),
    'append': lambda: open({str(path)!r}, 'a').write('{{"end":"forged"}}\\n'),
    'list': lambda: os.listdir({str(path.parent)!r}),
    'create': lambda: open({str(path.parent / "x.live")!r}, 'w'),
}}
for name, attempt in attempts.items():
    try:
        attempt()
        done.append(name)
    except OSError:
        pass
done
"""
    call = shared_sandbox.client(code, attempt=attempt)
    assert call.envelope["output"] == "[]", call.envelope
    st = os.lstat(path)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
    journal = os.lstat(path.parent)
    assert journal.st_uid == 0 and journal.st_mode & 0o777 == 0o700
    assert records(path.read_bytes())[-1] == {"end": "done"}


def test_live_files_are_pruned_with_their_attempts_records(bridge_module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bridge_module, "split_users", lambda: False)
    journal = bridge_module.Journal()
    earlier, later = "00000000000000e1", "00000000000000f2"
    now = time.time()
    for attempt in (earlier, later):
        assert journal.accept(attempt, now + 30)
        with bridge_module.LiveOutput.start(attempt) as live:
            live.stream("stdout", "hi\n")
            live.how = "done"
        journal.finish(attempt, bridge_module.result_envelope("ok"), 0)
    journal.prune(now + 2 * bridge_module.JOURNAL_MAX_AGE_S)
    assert not journal.live_path(earlier).exists(), "learnt and old: pruned with its records"
    assert journal.live_path(later).exists(), "not learnt yet: kept, like its records"


def test_many_small_messages_stop_at_the_budget(bridge_module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bridge_module, "split_users", lambda: False)
    attempt = new_attempt()
    bridge_module.Journal().accept(attempt, time.time() + 30)
    with bridge_module.LiveOutput.start(attempt) as live:
        for i in range(LIVE_BUDGET):
            live.stream("stderr" if i % 2 else "stdout", "ab")
        live.how = "done"
    found = records(bridge_module.Journal().live_path(attempt).read_bytes())
    assert found[-2:] == [{"cut": LIVE_BUDGET}, {"end": "done"}]
    assert sum(len(record["text"]) for record in found[:-2]) == LIVE_BUDGET
    assert len(found) == LIVE_BUDGET // 2 + 2
