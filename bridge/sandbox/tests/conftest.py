"""Fixtures that run the bridge exactly like the operator does.

Each sandbox is a temporary directory playing `/work`: `briq_sandbox.py` is copied to
`.briq/bridge.py`, actions are written to `.briq/actions/`, and every command is a subprocess
`BRIQ_NONCE=N python .briq/bridge.py <command> ...` with that directory as cwd. The envelope is
parsed as strictly as the Rust side parses it, following a `spilled` envelope to its file in
`.briq/results/` like the operator does.

Run as root (as in CI), the bridge runs the kernel as uid 65534: the sandboxes then live under a
directory every user can traverse (pytest's own temporary directories are private to root).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SANDBOX_SCRIPT = Path(__file__).resolve().parents[1] / "briq_sandbox.py"
# The run client: the operator sends its text as `python3 -I -S -c TEXT run ...`.
RUN_CLIENT = (Path(__file__).resolve().parents[1] / "briq_run.py").read_text(encoding="utf-8")
NONCE_ENV = "BRIQ_NONCE"
# Whether the bridge runs the kernel as another user (uid 65534): when the tests run as root.
SPLIT = os.geteuid() == 0
KERNEL_UID = 65534

ENVELOPE_FIELDS = {
    "spilled": {"kind", "bytes", "sha256"},
    "setup": {"kind", "ok", "installed", "message", "pip_tail"},
    "kernel": {"kind", "alive", "started", "pid", "message"},
    "state": {"kind", "ok", "saved", "unsaved", "bytes", "message"},
    "env": {"kind", "ok", "names", "message"},
    "file": {"kind", "ok", "path", "size", "sha256", "offset", "data_base64", "error"},
    "fork": {
        "kind",
        "ok",
        "message",
        "snapshot",
        "parts",
        "size",
        "sha256",
        "files",
        "skipped",
        "saved",
        "unsaved",
        "state_bytes",
        "error",
    },
    "result": {
        "kind",
        "status",
        "logs",
        "output",
        "truncated",
        "final_answer",
        "error",
        "display_dropped",
        "duration_ms",
    },
}
# Framed envelopes over this many bytes are spilled to .briq/results/<nonce>.out.
SPILL_THRESHOLD = 32_768
ERROR_FIELDS = {"name", "message", "traceback"}
RESULT_STATUSES = {
    "ok",
    "final_answer",
    "final_answer_rejected",
    "error",
    "timeout",
    "kernel_lost",
    "not_accepted",
    "cancelled",
}


def process_gone(pid: int, wait: float = 5.0) -> bool:
    """Whether `pid` exits (or becomes a zombie) within `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat.rpartition(")")[2].split()[0] in ("Z", "X"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def new_nonce() -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(32))


def spill_path(root: Path, nonce: str) -> Path:
    return root / ".briq" / "results" / f"{nonce}.out"


def parse_envelope(stdout: str, nonce: str, root: Path | None = None) -> dict:
    """The one envelope in `stdout`; fails the test on anything the operator calls malformed.

    A `spilled` envelope is followed to `<root>/.briq/results/<nonce>.out`, whose size and
    sha256 must match before its text is parsed (just as strictly) in its place.
    """
    # Whatever is on stdout fits well inside the 64 KB briq keeps.
    envelope = parse_framed(stdout, nonce, max_bytes=SPILL_THRESHOLD)
    if envelope["kind"] != "spilled":
        return envelope
    assert root is not None, "a spilled envelope needs the sandbox root to follow it"
    assert isinstance(envelope["bytes"], int) and envelope["bytes"] > SPILL_THRESHOLD
    assert re.fullmatch(r"[0-9a-f]{64}", envelope["sha256"])
    data = spill_path(root, nonce).read_bytes()
    assert len(data) == envelope["bytes"]
    assert hashlib.sha256(data).hexdigest() == envelope["sha256"]
    assert data.isascii()
    spilled = parse_framed(data.decode("ascii"), nonce)
    assert spilled["kind"] != "spilled", "a spill file must hold the real envelope"
    return spilled


def parse_framed(stdout: str, nonce: str, max_bytes: int | None = None) -> dict:
    """The one framed envelope in `stdout`, as strictly as the operator parses it."""
    lines = stdout.split("\n")  # like Rust's lines(): only "\n" ends a line
    begins = [i for i, line in enumerate(lines) if line.startswith("<<<BRIQ-ENVELOPE")]
    ends = [i for i, line in enumerate(lines) if line.startswith("<<<END-BRIQ-ENVELOPE")]
    assert len(begins) == 1 and len(ends) == 1, f"expected exactly one envelope in {stdout!r}"
    start = begins[0]
    assert lines[start] == f"<<<BRIQ-ENVELOPE {nonce}>>>"
    assert ends[0] == start + 2, "envelope payload must be exactly one line"
    assert lines[start + 2] == f"<<<END-BRIQ-ENVELOPE {nonce}>>>"
    payload = lines[start + 1]
    assert payload.isascii()
    if max_bytes is not None:
        framed = "\n".join(lines[start : start + 3]) + "\n"
        assert len(framed) + 1 <= max_bytes, "an envelope this large must be spilled"
    envelope = json.loads(payload)
    assert set(envelope) == ENVELOPE_FIELDS[envelope["kind"]]
    if envelope["kind"] == "result":
        assert envelope["status"] in RESULT_STATUSES
        assert envelope["error"] is None or set(envelope["error"]) == ERROR_FIELDS
        assert isinstance(envelope["logs"], str)
        assert isinstance(envelope["duration_ms"], int)
    return envelope


@dataclass
class Call:
    envelope: dict
    returncode: int
    stdout: str
    stderr: str
    # The `spilled` envelope stdout held, or None; `envelope` is then the one from its file.
    spilled: dict | None = None


def unix_listener(path: Path) -> socket.socket:
    """A Unix socket of this test process listening on `path` (bound by its short relative
    name: AF_UNIX paths are short, the temporary directories' are not)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    os.chdir(path.parent)
    try:
        server.bind(path.name)
    finally:
        os.chdir(cwd)
    server.listen(8)
    return server


@pytest.fixture(scope="session")
def blocker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose jupyter_client and zmq packages refuse to import: put first on
    PYTHONPATH, only code that imports neither (the run client, a runner already running) can
    run an action."""
    root = tmp_path_factory.mktemp("blocker")
    for name in ("jupyter_client", "zmq"):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"raise ImportError('{name} is blocked')\n")
    return root


def client_argv(timeout: float, attempt: str) -> list[str]:
    """The run client's argv, as the operator builds it (src/bridge/mod.rs)."""
    options = ["--state-dir", ".briq/state", "--timeout", str(timeout), "--attempt", attempt]
    return [sys.executable, "-I", "-S", "-c", RUN_CLIENT, "run", *options]


def set_env_argv(deadline: float = 10.0) -> list[str]:
    """The argv of the operator's `set-env` (src/bridge/mod.rs): the run client, which hands the
    variables to the kernel's runner or becomes `bridge.py set-env`."""
    options = ["--state-dir", ".briq/state", "--deadline", str(deadline)]
    return [sys.executable, "-I", "-S", "-c", RUN_CLIENT, "set-env", *options]


def bridge_env(env: dict, nonce: str) -> dict:
    """`env` with the nonce where the operator puts it."""
    return {**env, NONCE_ENV: nonce}


class Sandbox:
    """A directory playing `/work` with the bridge uploaded into it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)
        (root / ".briq" / "actions").mkdir(parents=True)
        shutil.copy(SANDBOX_SCRIPT, root / ".briq" / "bridge.py")
        self.env = dict(os.environ)
        # Keep IPython's profile and history out of the real home directory.
        self.env["IPYTHONDIR"] = str(root / ".ipython")
        self.env["JUPYTER_PLATFORM_DIRS"] = "1"
        self._actions = 0

    def bridge(
        self,
        command: str,
        *options: str,
        nonce: str | None = None,
        env: dict | None = None,
        stdin: str = "",
    ) -> Call:
        nonce = nonce or new_nonce()
        process = subprocess.run(
            [sys.executable, ".briq/bridge.py", command, *options],
            cwd=self.root,
            env=bridge_env(env or self.env, nonce),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        envelope = parse_envelope(process.stdout, nonce, self.root)
        outer = parse_framed(process.stdout, nonce)
        spilled = outer if outer["kind"] == "spilled" else None
        return Call(envelope, process.returncode, process.stdout, process.stderr, spilled)

    def client(
        self,
        code: str | bytes,
        timeout: float = 30,
        attempt: str | None = None,
        nonce: str | None = None,
        env: dict | None = None,
    ) -> Call:
        """Run `code` as the operator does: the run client with the code on stdin, as
        `attempt` (a new one unless given)."""
        nonce = nonce or new_nonce()
        attempt = attempt or secrets.token_hex(8)
        process = subprocess.run(
            client_argv(timeout, attempt),
            cwd=self.root,
            env=bridge_env(env or self.env, nonce),
            input=code.encode("utf-8") if isinstance(code, str) else code,
            capture_output=True,
            timeout=120,
        )
        stdout, stderr = process.stdout.decode(), process.stderr.decode()
        envelope = parse_envelope(stdout, nonce, self.root)
        outer = parse_framed(stdout, nonce)
        spilled = outer if outer["kind"] == "spilled" else None
        return Call(envelope, process.returncode, stdout, stderr, spilled)

    def set_env(self, text: str, env: dict | None = None) -> Call:
        """Give the kernel a claimer's variables (`text` on stdin) as the operator does."""
        nonce = new_nonce()
        process = subprocess.run(
            set_env_argv(),
            cwd=self.root,
            env=bridge_env(env or self.env, nonce),
            input=text.encode("utf-8"),
            capture_output=True,
            timeout=120,
        )
        stdout, stderr = process.stdout.decode(), process.stderr.decode()
        envelope = parse_envelope(stdout, nonce, self.root)
        return Call(envelope, process.returncode, stdout, stderr, None)

    def run_call(self, code: str, timeout: float = 30, nonce: str | None = None) -> Call:
        """Run `code` as a new attempt, the way the operator does."""
        call = self.client(code, timeout, nonce=nonce)
        assert call.returncode == 0, call.stderr
        assert call.envelope["kind"] == "result"
        return call

    def run(self, code: str, timeout: float = 30, nonce: str | None = None) -> dict:
        """Upload `code` as an action and run it; returns the result envelope."""
        return self.run_call(code, timeout, nonce).envelope

    def start_kernel(self) -> dict:
        call = self.bridge("start-kernel", "--deadline", "60")
        assert call.returncode == 0, (call.envelope, call.stderr)
        return call.envelope

    def probe(self) -> dict:
        call = self.bridge("probe")
        assert call.returncode == 0
        return call.envelope

    def kernel_pid(self) -> int | None:
        try:
            return int((self.root / ".briq" / "state" / "kernel.pid").read_text())
        except (OSError, ValueError):
            return None

    @property
    def state_dir(self) -> Path:
        return self.root / ".briq" / "state"

    @property
    def user_dir(self) -> Path:
        """Where user code can write: its own directory when it runs as another user, else the
        sandbox root (its cwd)."""
        return self.root / "home" if SPLIT else self.root

    def runner_pid(self) -> int | None:
        try:
            return int((self.state_dir / "runner.pid").read_text())
        except (OSError, ValueError):
            return None

    def stop_kernel(self) -> None:
        pid = self.kernel_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def bridge_module():
    """The bridge loaded as a module (one per test module), for its functions on their own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("briq_sandbox", SANDBOX_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def sandboxes_dir():
    """A directory every user can traverse (not list), holding the sandboxes."""
    base = Path(tempfile.mkdtemp(prefix="briq-sandboxes-"))
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def new_root(base: Path, prefix: str) -> Path:
    """A new `/work` path under `base`, its parent traversable by every user."""
    parent = Path(tempfile.mkdtemp(dir=base, prefix=prefix))
    parent.chmod(0o711)
    return parent / "work"


@pytest.fixture
def sandbox_root(sandboxes_dir: Path) -> Path:
    """A fresh sandbox root (`/work`) for one test."""
    return new_root(sandboxes_dir, "test-")


@pytest.fixture(scope="session")
def shared_sandbox(sandboxes_dir: Path):
    """One kernel for all tests that neither kill nor interrupt it."""
    sandbox = Sandbox(new_root(sandboxes_dir, "shared-"))
    envelope = sandbox.start_kernel()
    assert envelope["alive"] and envelope["started"]
    yield sandbox
    sandbox.stop_kernel()


@pytest.fixture
def fresh_sandbox(sandbox_root: Path):
    """A sandbox with its own kernel, for tests that kill or interrupt it."""
    sandbox = Sandbox(sandbox_root)
    assert sandbox.start_kernel()["started"]
    yield sandbox
    sandbox.stop_kernel()


@pytest.fixture
def empty_sandbox(sandbox_root: Path):
    """A sandbox where no kernel was ever started."""
    return Sandbox(sandbox_root)


def kill_runner(sandbox) -> int:
    pid = sandbox.runner_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert process_gone(pid)
    # A killed process shows as a zombie once its main thread is gone, while its other threads
    # (the kernel client's) may still hold its files: until they are gone, its socket still
    # takes a connection, which it then resets.
    assert runner_socket_closed(sandbox), "the killed runner's socket still takes connections"
    return pid


def runner_socket_closed(sandbox, wait: float = 5.0) -> bool:
    """Whether connecting to the runner socket is refused (or it is gone) within `wait` s."""
    deadline = time.monotonic() + wait
    while True:
        try:
            ask = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            cwd = os.getcwd()
            os.chdir(sandbox.state_dir)  # AF_UNIX paths are short; the tmp path may not be
            try:
                ask.connect("runner.sock")
            finally:
                os.chdir(cwd)
                ask.close()
        except (ConnectionRefusedError, FileNotFoundError):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
