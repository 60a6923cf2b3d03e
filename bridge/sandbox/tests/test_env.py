"""`set-env` (PROTOCOL.md "A claimer's environment"): a claimer's variables reach the live kernel
and every kernel started after it (a cancel's restart, a resume), are kept where only the bridge
can read them, and never in the user's namespace or history; names the bridge or the interpreter
rely on, and anything that is not names to text, are refused with nothing changed."""

from __future__ import annotations

import ast
import json
import os
import stat

import pytest
from conftest import SPLIT, kill_runner, process_gone

SECRET = "tok-3f9a\N{SNOWMAN} with spaces='quotes\"\n"


def set_env(sandbox, env) -> object:
    """`set-env` as the operator sends it: through the kernel's runner when one serves it, else
    the bridge's own command."""
    text = env if isinstance(env, str) else json.dumps(env)
    return sandbox.set_env(text)


def environ(sandbox, *names: str) -> list:
    result = sandbox.run(f"import os\nprint(repr([os.environ.get(n) for n in {list(names)!r}]))")
    assert result["status"] == "ok", result
    return ast.literal_eval(result["logs"].strip())


def test_a_claimers_variables_reach_the_live_kernel_and_its_subprocesses(fresh_sandbox):
    call = set_env(fresh_sandbox, {"TOOL_TOKEN": SECRET, "REGION": "eu"})
    assert (call.returncode, call.envelope["ok"]) == (0, True), (call.envelope, call.stderr)
    assert call.envelope["names"] == ["REGION", "TOOL_TOKEN"]
    assert environ(fresh_sandbox, "TOOL_TOKEN", "REGION") == [SECRET, "eu"]
    child = fresh_sandbox.run(
        "import subprocess, sys\n"
        "print(subprocess.run([sys.executable, '-c', 'import os; print(os.environ[\"REGION\"])'],"
        " capture_output=True, text=True).stdout.strip())"
    )
    assert child["logs"].strip() == "eu", child
    assert SECRET not in call.stdout + call.stderr, "the answer never carries a value"


def test_a_kernel_restarted_after_a_cancel_or_a_resume_starts_with_the_variables(fresh_sandbox):
    assert set_env(fresh_sandbox, {"TOOL_TOKEN": SECRET}).envelope["ok"]
    old = fresh_sandbox.kernel_pid()
    fresh_sandbox.stop_kernel()
    assert process_gone(old)
    started = fresh_sandbox.start_kernel()
    assert started["started"] and started["pid"] != old
    assert environ(fresh_sandbox, "TOOL_TOKEN") == [SECRET]


def test_variables_kept_without_a_live_kernel_reach_the_next_one(empty_sandbox):
    call = set_env(empty_sandbox, {"REGION": "us"})
    assert (call.returncode, call.envelope["ok"]) == (0, True), call.envelope
    assert "no live kernel" in call.envelope["message"]
    assert empty_sandbox.start_kernel()["started"]
    try:
        assert environ(empty_sandbox, "REGION") == ["us"]
    finally:
        empty_sandbox.stop_kernel()


def test_a_claims_variables_go_through_the_kernels_runner_without_a_kernel_client_of_their_own(
    fresh_sandbox, blocker
):
    # A kernel client of its own costs set-env importing jupyter_client and connecting afresh,
    # most of a warm claim's time: with both unimportable, only the runner can set them.
    env = dict(fresh_sandbox.env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(blocker), env.get("PYTHONPATH")]))
    call = fresh_sandbox.set_env(json.dumps({"TOOL_TOKEN": SECRET}), env=env)
    assert (call.returncode, call.envelope["ok"]) == (0, True), (call.envelope, call.stderr)
    assert "through its runner" in call.envelope["message"]
    assert environ(fresh_sandbox, "TOOL_TOKEN") == [SECRET]
    assert SECRET not in call.stdout + call.stderr, "the answer never carries a value"


def test_without_a_runner_set_env_sets_the_variables_itself(fresh_sandbox):
    kill_runner(fresh_sandbox)
    call = set_env(fresh_sandbox, {"REGION": "eu"})
    assert (call.returncode, call.envelope["ok"]) == (0, True), (call.envelope, call.stderr)
    assert "through its runner" not in call.envelope["message"]
    assert environ(fresh_sandbox, "REGION") == ["eu"]


def test_the_variables_leave_no_trace_in_the_namespace_or_the_history(fresh_sandbox):
    before = fresh_sandbox.run("print(sorted(k for k in globals() if not k.startswith('_')))")
    assert set_env(fresh_sandbox, {"TOOL_TOKEN": SECRET}).envelope["ok"]
    after = fresh_sandbox.run(
        "print(sorted(k for k in globals() if not k.startswith('_') and k != 'before'))"
    )
    assert after["logs"] == before["logs"]
    history = fresh_sandbox.run("print(repr(In))")
    assert "TOOL_TOKEN" not in history["logs"]


@pytest.mark.skipif(not SPLIT, reason="the kernel runs as another user only when run as root")
def test_user_code_cannot_read_the_kept_variables_file(fresh_sandbox):
    assert set_env(fresh_sandbox, {"TOOL_TOKEN": SECRET}).envelope["ok"]
    kept = fresh_sandbox.state_dir / "claim-env.json"
    assert stat.S_IMODE(os.lstat(kept).st_mode) == 0o600 and os.lstat(kept).st_uid == 0
    read = fresh_sandbox.run(f"open({str(kept)!r}).read()")
    assert read["status"] == "error" and read["error"]["name"] == "PermissionError", read


@pytest.mark.parametrize(
    "env, problem",
    [
        ("not json", "not JSON"),
        ('["A"]', "JSON object"),
        ({"1A": "x"}, "not an environment variable name"),
        ({"A-B": "x"}, "not an environment variable name"),
        ({"PYTHONPATH": "/tmp"}, "reserved"),
        ({"LD_PRELOAD": "/tmp/x.so"}, "reserved"),
        ({"BRIQ_NONCE": "x"}, "reserved"),
        ({"A": 1}, "text without NUL"),
        ({"A": "a\u0000b"}, "text without NUL"),
        ({f"V{i}": "x" for i in range(65)}, "over the limit of 64"),
        ({"A": "x" * 70_000}, "over 65536 bytes"),
    ],
)
def test_what_is_not_a_claimers_environment_is_refused_and_changes_nothing(
    fresh_sandbox, env, problem
):
    assert set_env(fresh_sandbox, {"KEPT": "yes"}).envelope["ok"]
    names = ["KEPT", *(sorted(env)[:3] if isinstance(env, dict) else [])]
    before = environ(fresh_sandbox, *names)
    call = set_env(fresh_sandbox, env)
    assert (call.returncode, call.envelope["ok"]) == (1, False)
    assert problem in call.envelope["message"], call.envelope
    assert environ(fresh_sandbox, *names) == before
    assert before[0] == "yes"
