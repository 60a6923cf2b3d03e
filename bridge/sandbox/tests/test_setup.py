"""`setup`: pip is skipped when everything is there, and bounded by the deadline when it runs.

pip itself is replaced by a fake `pip` package on PYTHONPATH (so `python -m pip` finds it
first): tests never reach a package index.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import bridge_env, new_nonce, parse_envelope, process_gone

FAKE_PIP = """
import os, subprocess, sys, time
from pathlib import Path

Path(os.environ["FAKE_PIP_ARGS"]).write_text("\\n".join(sys.argv[1:]))
mode = os.environ["FAKE_PIP_MODE"]
if mode == "fail":
    for i in range(2000):
        print(f"pip chatter line {i}")
    print("ERROR: No matching distribution found for briq-test-missing-dist")
    sys.exit(3)
if mode == "hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    Path(os.environ["FAKE_PIP_CHILD"]).write_text(str(child.pid))
    time.sleep(120)
print("Successfully installed briq-test-missing-dist-1.0")
"""


@pytest.fixture
def fake_pip(empty_sandbox, tmp_path: Path):
    package = tmp_path / "fake" / "pip"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(textwrap.dedent(FAKE_PIP))
    env = dict(empty_sandbox.env)
    env["PYTHONPATH"] = str(tmp_path / "fake")
    env["FAKE_PIP_ARGS"] = str(tmp_path / "pip-args.txt")
    env["FAKE_PIP_CHILD"] = str(tmp_path / "pip-child.txt")
    return env, tmp_path


def setup_call(sandbox, *options, env=None):
    return sandbox.bridge("setup", *options, env=env)


def test_setup_skips_pip_when_everything_is_importable(empty_sandbox, fake_pip):
    env, tmp = fake_pip
    env["FAKE_PIP_MODE"] = "fail"  # would fail the test if pip ran
    pytest_version = importlib.metadata.version("pytest")
    call = setup_call(
        empty_sandbox, "--requirement", "pytest", "--requirement", f"pytest=={pytest_version}",
        env=env,
    )  # fmt: skip
    assert call.returncode == 0
    assert call.envelope == {
        "kind": "setup",
        "ok": True,
        "installed": False,
        "message": call.envelope["message"],
        "pip_tail": None,
    }
    assert not (tmp / "pip-args.txt").exists()


def test_setup_runs_pip_for_missing_extra(empty_sandbox, fake_pip):
    env, tmp = fake_pip
    env["FAKE_PIP_MODE"] = "ok"
    call = setup_call(empty_sandbox, "--requirement", "briq-test-missing-dist", env=env)
    assert call.returncode == 0
    assert call.envelope["ok"] is True and call.envelope["installed"] is True
    assert "Successfully installed" in call.envelope["pip_tail"]
    args = (tmp / "pip-args.txt").read_text().split("\n")
    assert args[:3] == ["install", "--disable-pip-version-check", "--no-input"]
    for requirement in ("smolagents==1.26.0", "numpy>=1.26,<3", "pillow", "ipykernel>=6,<8"):
        assert requirement in args
    assert "jupyter-client>=8,<9" in args and args[-1] == "briq-test-missing-dist"


def test_setup_reports_pip_failure_with_tail(empty_sandbox, fake_pip):
    env, _ = fake_pip
    env["FAKE_PIP_MODE"] = "fail"
    call = setup_call(empty_sandbox, "--requirement", "briq-test-missing-dist>=1", env=env)
    assert call.returncode != 0
    envelope = call.envelope
    assert envelope["ok"] is False and envelope["installed"] is True
    assert "exit" in envelope["message"] and "3" in envelope["message"]
    assert len(envelope["pip_tail"]) <= 4_000
    assert envelope["pip_tail"].endswith("found for briq-test-missing-dist\n")


def test_setup_kills_pip_process_group_at_deadline(empty_sandbox, fake_pip):
    env, tmp = fake_pip
    env["FAKE_PIP_MODE"] = "hang"
    started = time.monotonic()
    call = setup_call(
        empty_sandbox, "--deadline", "4", "--requirement", "briq-test-missing-dist", env=env
    )
    assert time.monotonic() - started < 30
    assert call.returncode != 0
    assert call.envelope["ok"] is False
    assert "timed out" in call.envelope["message"]
    child = int((tmp / "pip-child.txt").read_text())
    assert process_gone(child), "pip's child survived the deadline"


def test_invalid_nonce_gets_no_envelope(empty_sandbox):
    process = subprocess.run(
        [sys.executable, ".briq/bridge.py", "probe", "--nonce", "short"],
        cwd=empty_sandbox.root,
        capture_output=True,
        text=True,
    )
    assert process.returncode == 2
    assert "BRIQ-ENVELOPE" not in process.stdout


def test_nonce_is_used_in_markers(empty_sandbox):
    nonce = new_nonce()
    call = empty_sandbox.bridge("probe", nonce=nonce)
    assert f"<<<BRIQ-ENVELOPE {nonce}>>>" in call.stdout


def test_setup_works_before_anything_is_installed(empty_sandbox, fake_pip):
    """`python -S` hides site-packages: no jupyter_client, no smolagents, like a cold sandbox."""
    env, tmp = fake_pip
    env["FAKE_PIP_MODE"] = "ok"
    nonce = new_nonce()
    process = subprocess.run(
        [sys.executable, "-S", ".briq/bridge.py", "setup"],
        cwd=empty_sandbox.root,
        env=bridge_env(env, nonce),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 0, process.stderr
    envelope = parse_envelope(process.stdout, nonce)
    assert envelope["ok"] is True and envelope["installed"] is True
    assert "jupyter-client>=8,<9 (found nothing)" in envelope["message"]
    assert (tmp / "pip-args.txt").exists()


def self_install_from(sandbox, program: str) -> dict:
    """`setup --self-install` run from `program` (relative to the sandbox root); its envelope."""
    nonce = new_nonce()
    process = subprocess.run(
        [sys.executable, program, "setup", "--self-install"],
        cwd=sandbox.root,
        env=bridge_env(sandbox.env, nonce),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return parse_envelope(process.stdout, nonce, sandbox.root)


def test_a_staged_bridge_installs_itself_by_rename_and_leaves_no_copy(empty_sandbox):
    """Two operators provisioning one sandbox each upload a staged copy; the bridge is only
    ever replaced whole (a command starting meanwhile reads the old file or the new one)."""
    briq = empty_sandbox.root / ".briq"
    installed = briq / "bridge.py"
    source = installed.read_bytes()
    installed.write_text("raise SystemExit('the old bridge')\n")
    staged = briq / "bridge-0123456789abcdef.py"
    staged.write_bytes(source)
    before = installed.stat().st_ino
    envelope = self_install_from(empty_sandbox, ".briq/bridge-0123456789abcdef.py")
    assert envelope["kind"] == "setup"
    assert installed.read_bytes() == source
    assert installed.stat().st_ino != before, "replaced by a rename, not rewritten in place"
    assert not staged.exists()
    assert [p.name for p in briq.iterdir() if p.name.startswith((".bridge.", "bridge-"))] == []


def test_self_install_refuses_to_run_from_anywhere_else(empty_sandbox):
    elsewhere = empty_sandbox.root / "bridge-0123456789abcdef.py"
    elsewhere.write_bytes((empty_sandbox.root / ".briq" / "bridge.py").read_bytes())
    envelope = self_install_from(empty_sandbox, "bridge-0123456789abcdef.py")
    assert envelope["ok"] is False
    assert "--self-install runs only from" in envelope["message"]
