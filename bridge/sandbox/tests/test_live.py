"""Live output (PROTOCOL.md "Live output"): a running attempt's stream output is appended to its
live file as it comes, at most a budget of it, and ends with how the attempt ended."""

from __future__ import annotations

import json
import os
import secrets
import stat
import time
from pathlib import Path

import pytest
from conftest import SPLIT

LIVE_BUDGET = 16_384


def new_attempt() -> str:
    return secrets.token_hex(8)


def live_file(sandbox, attempt: str) -> Path:
    return sandbox.root / ".briq" / "journal" / f"{attempt}.live"


def records(stdout: bytes) -> list[dict]:
    assert stdout.endswith(b"\n"), "only complete lines"
    return [json.loads(line) for line in stdout.splitlines()]


def test_a_second_delivery_leaves_the_first_runs_live_file_alone(shared_sandbox):
    attempt = new_attempt()
    first = shared_sandbox.client("print('once')", attempt=attempt)
    path = live_file(shared_sandbox, attempt)
    before = path.read_bytes(), os.stat(path).st_ino
    second = shared_sandbox.client("print('twice')", attempt=attempt)
    assert second.envelope == first.envelope
    assert (path.read_bytes(), os.stat(path).st_ino) == before
    assert records(before[0]) == [{"stream": "stdout", "text": "once\n"}, {"end": "done"}]


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
