"""The runner: the per-kernel process `run` hands actions to (PROTOCOL.md "Runner").

A run "through the runner" is proven by running the bridge with jupyter_client and zmq made
unimportable: only the thin client path, which imports neither, can answer then.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    Call,
    bridge_env,
    kill_runner,
    new_nonce,
    parse_envelope,
    process_gone,
    runner_socket_closed,
)

RAISE_FINAL = """
class FinalAnswerException(BaseException):
    pass

raise FinalAnswerException({value!r})
"""


def thin_call(sandbox, blocker: Path, code: str, timeout: float = 30) -> Call:
    """Run `code` with jupyter_client and zmq unimportable: only the runner can run it."""
    sandbox._actions += 1
    name = f".briq/actions/thin_{sandbox._actions}.py"
    (sandbox.root / name).write_text(code, encoding="utf-8")
    env = dict(sandbox.env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(blocker), env.get("PYTHONPATH")]))
    return sandbox.bridge("run", "--code", name, "--timeout", str(timeout), env=env)


def thin_run(sandbox, blocker: Path, code: str, timeout: float = 30) -> dict:
    call = thin_call(sandbox, blocker, code, timeout)
    assert call.returncode == 0, (call.envelope, call.stderr)
    return call.envelope


def ask_runner(sandbox, payload: bytes, wait: float = 10) -> dict:
    """Send raw bytes to the runner socket; its one-line JSON answer."""
    cwd = os.getcwd()
    os.chdir(sandbox.state_dir)  # AF_UNIX paths are short; the tmp path may not be
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(wait)
            sock.connect("runner.sock")
            sock.sendall(payload)
            data = b""
            while b"\n" not in data:
                chunk = sock.recv(65_536)
                assert chunk, f"the runner closed the connection after {data!r}"
                data += chunk
    finally:
        os.chdir(cwd)
    return json.loads(data.split(b"\n")[0])


def ping(sandbox) -> int | None:
    with contextlib.suppress(OSError, AssertionError, KeyError, ValueError):
        return ask_runner(sandbox, b'{"op":"ping"}\n', wait=2)["kernel_pid"]
    return None


def wait_until(predicate, wait: float = 15.0) -> bool:
    deadline = time.monotonic() + wait
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def test_start_kernel_starts_a_runner(fresh_sandbox):
    sock = fresh_sandbox.state_dir / "runner.sock"
    mode = sock.stat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert ping(fresh_sandbox) == fresh_sandbox.kernel_pid()
    cmdline = Path(f"/proc/{fresh_sandbox.runner_pid()}/cmdline").read_bytes().split(b"\0")
    assert b"serve" in cmdline
    # Its output goes to its log, never anywhere near an envelope.
    assert "serving kernel" in (fresh_sandbox.state_dir / "runner.log").read_text()


def test_runs_go_through_the_runner(shared_sandbox, blocker):
    assert thin_run(shared_sandbox, blocker, "through_runner = [1]")["status"] == "ok"
    result = thin_run(shared_sandbox, blocker, "print('hi')\nthrough_runner.append(2)\n6 * 7")
    assert result["status"] == "ok" and result["logs"] == "hi\n" and result["output"] == "42"
    # Same kernel state whichever way a run comes in.
    assert shared_sandbox.run("through_runner")["output"] == "[1, 2]"

    error = thin_run(shared_sandbox, blocker, "print('before')\n{}['missing']")
    assert error["status"] == "error" and error["logs"] == "before\n"
    assert error["error"]["name"] == "KeyError" and "\x1b" not in error["error"]["traceback"]

    answer = thin_run(shared_sandbox, blocker, RAISE_FINAL.format(value="safe:[1, 2]"))
    assert answer["status"] == "final_answer" and answer["final_answer"] == "safe:[1, 2]"
    rejected = thin_run(shared_sandbox, blocker, RAISE_FINAL.format(value="pickle:gASVBQ=="))
    assert rejected["status"] == "final_answer_rejected"
    assert rejected["error"]["name"] == "FinalAnswerRejected"


def test_large_result_through_the_runner_is_spilled(shared_sandbox, blocker):
    call = thin_call(shared_sandbox, blocker, "'a' * 100_000 + 'b' * 100_000")
    assert call.returncode == 0 and call.spilled is not None
    assert call.envelope["truncated"] is True
    assert call.envelope["output"].startswith("'aaaa") and call.envelope["output"].endswith("bb'")


SAME_ENVELOPE_CODES = [
    "import sys\nprint('out', flush=True)\nprint('err', file=sys.stderr, flush=True)\n'x' * 3",
    "unused = 1",
    "print('before')\n{}['missing']",
    "def broken(:\n    pass",
    "from IPython.display import HTML, display\ndisplay(HTML('<b>x</b>'))\n'shown'",
    "for i in range(20_000):\n    print(f'line {i:06d}')\n'a' * 100_000",
    RAISE_FINAL.format(value='safe:{"a": [1, 2]}'),
    RAISE_FINAL.format(value='safe:[{"__type__": "ndarray", "data": []}]'),
]


def comparable(envelope: dict) -> dict:
    """The envelope without what differs between two executions of the same code."""
    envelope = dict(envelope, duration_ms=0)
    if envelope["error"] is not None:
        # Tracebacks name the cell by its execution count ("Cell In[7]").
        envelope["error"] = dict(envelope["error"], traceback="")
    return envelope


def test_runner_and_direct_runs_give_the_same_envelopes(fresh_sandbox, blocker):
    through_runner = [thin_run(fresh_sandbox, blocker, code) for code in SAME_ENVELOPE_CODES]
    direct = []
    for code in SAME_ENVELOPE_CODES:
        # No runner answers: `run` connects to the kernel itself, then starts a runner, which
        # is killed again before the next code.
        kill_runner(fresh_sandbox)
        direct.append(fresh_sandbox.run(code))
        assert wait_until(lambda: ping(fresh_sandbox) == fresh_sandbox.kernel_pid())
    for runner_result, direct_result in zip(through_runner, direct, strict=True):
        assert comparable(runner_result) == comparable(direct_result)
    assert [r["status"] for r in direct] == [
        "ok", "ok", "error", "error", "ok", "ok", "final_answer", "final_answer_rejected",
    ]  # fmt: skip


def test_run_falls_back_when_the_runner_is_dead_and_brings_it_back(fresh_sandbox, blocker):
    old = kill_runner(fresh_sandbox)
    # A stale socket file is left behind: connecting is refused, nothing is sent.
    assert (fresh_sandbox.state_dir / "runner.sock").exists()
    assert fresh_sandbox.run("fallback = 'direct'\nfallback")["output"] == "'direct'"
    # That run started a runner for the next ones.
    assert wait_until(lambda: ping(fresh_sandbox) == fresh_sandbox.kernel_pid())
    assert fresh_sandbox.runner_pid() not in (None, old)
    assert thin_run(fresh_sandbox, blocker, "fallback")["output"] == "'direct'"


def test_start_kernel_brings_back_a_missing_runner(fresh_sandbox, blocker):
    old = kill_runner(fresh_sandbox)
    (fresh_sandbox.state_dir / "runner.sock").unlink()
    again = fresh_sandbox.start_kernel()
    assert again["started"] is False and again["pid"] == fresh_sandbox.kernel_pid()
    # start-kernel waited for it: it answers right away.
    assert ping(fresh_sandbox) == fresh_sandbox.kernel_pid()
    assert fresh_sandbox.runner_pid() not in (None, old)
    assert thin_run(fresh_sandbox, blocker, "1 + 1")["output"] == "2"


def test_runner_killed_mid_run_gives_no_envelope_and_never_runs_twice(fresh_sandbox):
    ran = fresh_sandbox.user_dir / "ran.txt"
    code = f"open({str(ran)!r}, 'a').write('ran\\n')\nimport time\ntime.sleep(3)\n'finished'"
    (fresh_sandbox.root / ".briq/actions/once.py").write_text(code)
    nonce = new_nonce()
    process = subprocess.Popen(
        [sys.executable, ".briq/bridge.py", "run"]
        + ["--code", ".briq/actions/once.py", "--timeout", "30"],
        cwd=fresh_sandbox.root,
        env=bridge_env(fresh_sandbox.env, nonce),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_until(ran.exists, wait=20), "the code never started"
        kill_runner(fresh_sandbox)
        stdout, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1
    assert "BRIQ-ENVELOPE" not in stdout  # the operator reads this as malformed
    assert "may or may not have run" in stderr
    # The kernel finishes the first execution before this one; nothing ran it again meanwhile.
    assert fresh_sandbox.run("'after'")["output"] == "'after'"
    assert ran.read_text() == "ran\n"


@pytest.mark.parametrize("behaviour", ["hang_up", "malformed_answer", "silence"])
def test_no_answer_from_the_runner_means_no_envelope_and_no_second_run(fresh_sandbox, behaviour):
    """A stand-in runner takes the request and fails to answer: `run` must not run it itself."""
    kill_runner(fresh_sandbox)
    (fresh_sandbox.state_dir / "runner.sock").unlink()
    received = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        cwd = os.getcwd()
        os.chdir(fresh_sandbox.state_dir)
        try:
            server.bind("runner.sock")
        finally:
            os.chdir(cwd)
        server.listen(1)

        def fake_runner():
            conn, _ = server.accept()
            with conn:
                data = b""
                while b"\n" not in data:
                    data += conn.recv(4_096)
                received.append(json.loads(data))
                if behaviour == "malformed_answer":
                    conn.sendall(b'{"envelope":{"kind":"result"},"exit_code":0}\n')
                elif behaviour == "silence":
                    time.sleep(8)

        thread = threading.Thread(target=fake_runner, daemon=True)
        thread.start()
        ran = fresh_sandbox.user_dir / "ran"
        (fresh_sandbox.root / ".briq/actions/fake.py").write_text(f"open({str(ran)!r}, 'w')")
        nonce = new_nonce()
        started = time.monotonic()
        process = subprocess.run(
            [sys.executable, ".briq/bridge.py", "run"]
            + ["--code", ".briq/actions/fake.py", "--timeout", "1"],
            cwd=fresh_sandbox.root,
            env=bridge_env(fresh_sandbox.env, nonce),
            capture_output=True,
            text=True,
            timeout=60,
        )
        elapsed = time.monotonic() - started
        thread.join(10)
    assert received and received[0]["op"] == "run"
    assert process.returncode == 1
    assert "BRIQ-ENVELOPE" not in process.stdout
    assert "may or may not have run" in process.stderr
    if behaviour == "silence":
        assert 4.5 <= elapsed < 8  # timeout + interrupt grace + margin, not the fake's 8 s
    # The kernel never saw the code: nothing fell back to running it directly.
    assert fresh_sandbox.run("'still here'")["output"] == "'still here'"
    assert not ran.exists()


def test_timeout_through_the_runner_interrupts_the_kernel(fresh_sandbox, blocker):
    thin_run(fresh_sandbox, blocker, "kept = 'yes'")
    started = time.monotonic()
    spin = "print('spinning', flush=True)\nwhile True:\n    pass"
    result = thin_run(fresh_sandbox, blocker, spin, timeout=2)
    assert time.monotonic() - started < 10  # 2 s timeout + 2 s grace + process start
    assert result["status"] == "timeout"
    message = result["error"]["message"]
    assert "interrupted" in message and "idle again" in message
    assert result["logs"] == "spinning\n"
    assert thin_run(fresh_sandbox, blocker, "kept")["output"] == "'yes'"


def test_runner_exits_when_its_kernel_is_killed(fresh_sandbox):
    runner = fresh_sandbox.runner_pid()
    assert runner is not None and not process_gone(runner, wait=0)
    os.killpg(fresh_sandbox.kernel_pid(), signal.SIGKILL)
    assert process_gone(runner), "the runner outlived its kernel"
    assert not (fresh_sandbox.state_dir / "runner.sock").exists()
    assert fresh_sandbox.run("1 + 1")["status"] == "kernel_lost"


def test_runner_reports_a_kernel_dying_mid_run(fresh_sandbox, blocker):
    code = "import os, time\nprint('bye', flush=True)\ntime.sleep(0.5)\nos.kill(os.getpid(), 9)"
    result = thin_run(fresh_sandbox, blocker, code)
    assert result["status"] == "kernel_lost" and result["logs"] == "bye\n"


def test_a_stopped_runner_takes_no_connection_that_it_would_reset(fresh_sandbox, bridge_module):
    # A killed runner's threads outlive its main thread for a moment, and its socket still took
    # a connection then reset it after about 1 kill in 4: ten stops in a row all but never miss.
    state = bridge_module.KernelState(str(fresh_sandbox.state_dir))
    for _ in range(10):
        assert ping(fresh_sandbox) == fresh_sandbox.kernel_pid()
        bridge_module.stop_runner(state)
        assert runner_socket_closed(fresh_sandbox, wait=0), "the stopped runner's socket answers"
        assert fresh_sandbox.start_kernel()["started"] is False  # and starts a runner again


def test_replacing_the_kernel_replaces_its_runner(fresh_sandbox):
    old_kernel, old_runner = fresh_sandbox.kernel_pid(), fresh_sandbox.runner_pid()
    os.kill(old_kernel, signal.SIGSTOP)  # alive, not answering: its runner would stay
    replaced = fresh_sandbox.start_kernel()
    assert replaced["started"] is True and replaced["pid"] != old_kernel
    assert process_gone(old_runner), "the old kernel's runner was not stopped"
    assert ping(fresh_sandbox) == replaced["pid"]
    assert fresh_sandbox.run("1 + 1")["output"] == "2"


@pytest.mark.parametrize(
    "payload",
    [
        b"not json\n",
        b"[1, 2]\n",
        b'{"op":"ping","extra":1}\n',
        b'{"op":"run","code":"relative.py","timeout":1,"kernel_pid":1}\n',
        b'{"op":"run","code":"/abs.py","timeout":0,"kernel_pid":1}\n',
        b'{"op":"run","code":"/abs.py","timeout":true,"kernel_pid":1}\n',
        b'{"op":"run","code":"/abs.py","timeout":1,"kernel_pid":"1"}\n',
        b'{"op":"run","code":"/abs.py","timeout":1,"kernel_pid":1,"more":2}\n',
        b'{"op":"set-env","kernel_pid":1}\n',
        b'{"op":"set-env","kernel_pid":1,"env":{"PATH":"/tmp"}}\n',
        b'{"op":"set-env","kernel_pid":1,"env":{"A":"x"},"more":2}\n',
        b'{"op":"set-env","kernel_pid":0,"env":{"A":"x"}}\n',
        b"x" * 70_000,
    ],
)
def test_runner_refuses_malformed_requests(shared_sandbox, payload):
    answer = ask_runner(shared_sandbox, payload)
    assert set(answer) == {"envelope", "exit_code"} and answer["exit_code"] == 1
    envelope = answer["envelope"]
    assert envelope["kind"] == "result" and envelope["status"] == "error"
    assert envelope["error"]["name"] == "BridgeError"
    assert ping(shared_sandbox) == shared_sandbox.kernel_pid()


def test_runner_declines_a_request_for_another_kernel(shared_sandbox, tmp_path):
    action = tmp_path / "never.py"
    action.write_text(f"open({str(tmp_path / 'ran')!r}, 'w')")
    request = {"op": "run", "code": str(action), "timeout": 5, "kernel_pid": 2**22 + 1}
    answer = ask_runner(shared_sandbox, json.dumps(request).encode() + b"\n")
    assert set(answer) == {"declined"}
    assert not (tmp_path / "ran").exists()


def test_runner_answers_a_well_formed_request(shared_sandbox, tmp_path):
    action = tmp_path / "direct.py"
    action.write_text("'via socket'")
    request = {"op": "run", "code": str(action), "timeout": 5, "kernel_pid": None}
    request["kernel_pid"] = shared_sandbox.kernel_pid()
    answer = ask_runner(shared_sandbox, json.dumps(request).encode() + b"\n")
    assert answer["exit_code"] == 0 and answer["envelope"]["output"] == "'via socket'"
    # Exactly the fields of a result envelope (parse_envelope checks them): `run` prints it.
    nonce = new_nonce()
    payload = json.dumps(answer["envelope"])
    framed = f"<<<BRIQ-ENVELOPE {nonce}>>>\n{payload}\n<<<END-BRIQ-ENVELOPE {nonce}>>>\n"
    assert parse_envelope(framed, nonce) == answer["envelope"]
