"""The run client (briq_run.py, PROTOCOL.md "Runs"): what every action's exec starts. It hands
the action to the runner, falls back to the full bridge only while nothing can have run, and
never prints an envelope it cannot vouch for."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import bridge_env, client_argv, new_nonce, process_gone, unix_listener


def blocked_env(sandbox, blocker: Path) -> dict:
    """The sandbox's environment in which only the runner can run code: the full bridge, which
    the client falls back to, cannot import a kernel client."""
    env = dict(sandbox.env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(blocker), env.get("PYTHONPATH")]))
    return env


def ran_marker(sandbox, name: str) -> tuple[Path, str]:
    """A file the code appends to each time it runs, and that code."""
    path = sandbox.user_dir / f"{name}.txt"
    return path, f"open({str(path)!r}, 'a').write('ran\\n')\n'done'"


def stop_the_runner(sandbox) -> None:
    pid = sandbox.runner_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert process_gone(pid)
    (sandbox.state_dir / "runner.sock").unlink()


@contextlib.contextmanager
def stand_in_runner(path: Path, behaviour: str):
    """This test process on the runner socket, behaving as told; yields what it received."""
    received: list[bytes] = []
    server = unix_listener(path)

    def serve():
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            with conn:
                conn.settimeout(10)
                request = conn.recv(4_096)
                received.append(request)
                if behaviour == "declines" and b'"op":"exec"' in request:
                    # As a real runner whose kernel was replaced: it declines and goes away.
                    server.close()
                    path.unlink()
                    conn.sendall(b"declined: stand-in\n")
                    return
                if behaviour == "knows_no_set_env":
                    # As a runner of an earlier bridge: a request it does not know is malformed.
                    refusal = {"envelope": {"kind": "result"}, "exit_code": 1}
                    conn.sendall(json.dumps(refusal).encode() + b"\n")
                    return
                if behaviour == "never_ready":
                    conn.recv(1)  # until the client hangs up
                    return
                conn.sendall(b"ready\n")
                received.append(conn.recv(1 << 20))
                # "takes_the_code_and_dies": closes without an answer.

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        server.close()
        thread.join(15)


def test_the_client_hands_the_action_to_the_runner_and_imports_no_kernel_client(
    shared_sandbox, blocker
):
    call = shared_sandbox.client("x = 6 * 7\nx", env=blocked_env(shared_sandbox, blocker))
    assert call.returncode == 0, call.stderr
    assert call.envelope["output"] == "42"


def test_an_attempt_the_client_delivers_twice_runs_once(shared_sandbox):
    attempt = secrets.token_hex(8)
    ran, code = ran_marker(shared_sandbox, attempt)
    first = shared_sandbox.client(code, attempt=attempt)
    second = shared_sandbox.client(code, attempt=attempt)
    assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
    assert second.envelope == first.envelope
    assert ran.read_text() == "ran\n"


def test_code_larger_than_a_pipe_buffer_arrives_whole(shared_sandbox):
    text = "".join(secrets.choice("abcdef") for _ in range(200_000))
    call = shared_sandbox.client(f"s = {text!r}\nlen(s), s[-5:] == {text[-5:]!r}")
    assert call.returncode == 0, call.stderr
    assert call.envelope["output"] == "(200000, True)"


def test_without_a_runner_the_client_becomes_the_bridge_with_the_code_unread(fresh_sandbox):
    stop_the_runner(fresh_sandbox)
    attempt = secrets.token_hex(8)
    ran, code = ran_marker(fresh_sandbox, attempt)
    first = fresh_sandbox.client(code, attempt=attempt)
    assert first.returncode == 0, first.stderr
    assert first.envelope["output"] == "'done'"
    # The bridge journaled it: delivering it again (now through the runner the bridge started,
    # or the bridge again) does not run it again.
    assert fresh_sandbox.client(code, attempt=attempt).envelope == first.envelope
    assert ran.read_text() == "ran\n"


def test_a_declining_runner_sends_the_client_to_the_bridge(fresh_sandbox):
    stop_the_runner(fresh_sandbox)
    ran, code = ran_marker(fresh_sandbox, "declined")
    with stand_in_runner(fresh_sandbox.state_dir / "runner.sock", "declines") as received:
        call = fresh_sandbox.client(code)
    assert call.returncode == 0, call.stderr
    assert call.envelope["output"] == "'done'"
    assert json.loads(received[0])["op"] == "exec"
    assert ran.read_text() == "ran\n"


def test_a_runner_that_knows_no_set_env_leaves_it_to_the_bridge_before_any_variable_is_sent(
    fresh_sandbox,
):
    stop_the_runner(fresh_sandbox)
    with stand_in_runner(fresh_sandbox.state_dir / "runner.sock", "knows_no_set_env") as received:
        call = fresh_sandbox.set_env(json.dumps({"REGION": "eu-west"}))
    assert (call.returncode, call.envelope["ok"]) == (0, True), (call.envelope, call.stderr)
    assert "through its runner" not in call.envelope["message"]
    assert json.loads(received[0])["op"] == "set-env"
    assert b"eu-west" not in b"".join(received), "the variables went to the old runner"
    result = fresh_sandbox.run("import os\nos.environ.get('REGION')")
    assert result["output"] == "'eu-west'", result


def test_a_runner_that_takes_the_code_and_dies_gets_no_envelope_and_no_second_run(
    fresh_sandbox,
):
    stop_the_runner(fresh_sandbox)
    ran, code = ran_marker(fresh_sandbox, "died")
    with stand_in_runner(fresh_sandbox.state_dir / "runner.sock", "takes_the_code") as received:
        call = subprocess.run(
            client_argv(5, secrets.token_hex(8)),
            cwd=fresh_sandbox.root,
            env=bridge_env(fresh_sandbox.env, new_nonce()),
            input=code.encode(),
            capture_output=True,
        )
    assert call.returncode == 1
    assert b"BRIQ-ENVELOPE" not in call.stdout  # the operator reads this as malformed
    assert b"may or may not have run" in call.stderr
    assert received[1].endswith(code.encode())  # it did get the code
    assert not ran.exists()  # and nobody ran it in the client's place


def test_a_runner_that_never_says_ready_took_nothing_and_recall_says_so(fresh_sandbox):
    stop_the_runner(fresh_sandbox)
    attempt = secrets.token_hex(8)
    ran, code = ran_marker(fresh_sandbox, attempt)
    with stand_in_runner(fresh_sandbox.state_dir / "runner.sock", "never_ready"):
        call = subprocess.run(
            client_argv(0.5, attempt),
            cwd=fresh_sandbox.root,
            env=bridge_env(fresh_sandbox.env, new_nonce()),
            input=code.encode(),
            capture_output=True,
            timeout=30,
        )
    assert call.returncode == 1
    assert b"BRIQ-ENVELOPE" not in call.stdout
    assert b"it did not run" in call.stderr
    assert not ran.exists()
    recalled = fresh_sandbox.bridge("recall", "--attempt", attempt)
    assert recalled.envelope["status"] == "not_accepted"


STATE = ["--state-dir", ".briq/state"]


@pytest.mark.parametrize(
    ("options", "nonce"),
    [
        (["run", *STATE, "--timeout", "30"], "n" * 32),
        (["run", *STATE, "--timeout", "30", "--attempt", "XYZ"], "n" * 32),
        (["run", *STATE, "--timeout", "inf", "--attempt", "ab" * 8], "n" * 32),
        (["probe", *STATE], "n" * 32),
        (["run", *STATE, "--timeout", "30", "--attempt", "ab" * 8], "n-1"),
    ],
    ids=["no_attempt", "bad_attempt", "bad_timeout", "not_run", "bad_nonce"],
)
def test_malformed_client_calls_run_nothing_and_print_no_envelope(shared_sandbox, options, nonce):
    argv = client_argv(30, "ab" * 8)[:5] + options
    call = subprocess.run(
        argv,
        cwd=shared_sandbox.root,
        env=bridge_env(shared_sandbox.env, nonce),
        input=b"raise SystemExit('must not run')",
        capture_output=True,
        timeout=30,
    )
    assert call.returncode == 2
    assert call.stdout == b""
    assert call.stderr.startswith(b"bridge: ")
