"""Runs `briq-dev local-stack` (kube-apiserver + local sandbox server + operator) as a
subprocess, for the agent tests and the benchmark. Development only: the local sandbox server's
sandboxes are host processes, not an isolation boundary.

    with LocalStack() as stack:
        executor = KubernetesExecutor(create_executor=True, kubeconfig=stack.kubeconfig)
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # dev/python/briq_dev/local_stack.py
READY_MARKER = "ready: KUBECONFIG="


def dev_binary() -> Path:
    """`$BRIQ_DEV_BIN`, else the repository's `target/debug/briq-dev`."""
    configured = os.environ.get("BRIQ_DEV_BIN")
    binary = Path(configured) if configured else REPO / "target" / "debug" / "briq-dev"
    if not binary.is_absolute():
        binary = REPO / binary
    if not binary.is_file():
        raise FileNotFoundError(
            f"{binary} does not exist: run `cargo build -p briq-dev` (or set BRIQ_DEV_BIN)"
        )
    return binary


def _interrupt_with_parent() -> None:
    """In the child: get SIGINT (a clean teardown) should the parent die first."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class LocalStack:
    """`briq-dev local-stack` in a subprocess; output goes to files in `workdir`."""

    def __init__(
        self,
        binary: Path | None = None,
        ready_timeout: float = 900.0,
        env: dict[str, str] | None = None,
    ):
        self.binary = binary or dev_binary()
        # Added to this process's environment for the stack (the operator's OTEL_* settings).
        self.env = dict(env or {})
        self.ready_timeout = ready_timeout
        self.workdir = Path(tempfile.mkdtemp(prefix="briq-local-stack-"))
        self.kubeconfig = self.workdir / "kubeconfig"
        # The local sandbox server's URL and API key, for its admin API (faults, outages).
        self.sandbox_server_file = self.workdir / "sandbox-server.json"
        self.stdout_path = self.workdir / "stdout.log"
        self.stderr_path = self.workdir / "stderr.log"
        self.process: subprocess.Popen | None = None

    def output(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        stderr = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return "\n".join((self.output() + stderr).splitlines()[-lines:])

    def start(self) -> LocalStack:
        with open(self.stdout_path, "wb") as stdout, open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                [
                    str(self.binary),
                    "local-stack",
                    "--kubeconfig",
                    str(self.kubeconfig),
                    "--sandbox-server-file",
                    str(self.sandbox_server_file),
                ],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                preexec_fn=_interrupt_with_parent,
                env={**os.environ, **self.env},
            )
        deadline = time.monotonic() + self.ready_timeout
        # The child writes its progress to a file; reading that file is the simplest way to
        # wait for one line without a reader thread.
        while READY_MARKER not in self.output():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"local-stack exited with {self.process.returncode} before it was ready:\n"
                    + self.log_tail()
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"local-stack was not ready within {self.ready_timeout:.0f} s")
            time.sleep(0.1)
        return self

    def stop(self, timeout: float = 120.0) -> int:
        """SIGINT (the stack deletes every BriqExecutor, destroying the sandboxes, then stops);
        returns the exit status. Killed, and an error raised, if it takes longer than
        `timeout`."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise TimeoutError(
                    f"local-stack did not stop within {timeout:.0f} s:\n{self.log_tail()}"
                ) from None
        return self.process.returncode

    def begin_outage(self, status: int, seconds: float) -> None:
        """briq's gateway goes down: every call to the local sandbox server is answered `status`
        for `seconds`, and none is performed."""
        server = json.loads(self.sandbox_server_file.read_text())
        request = urllib.request.Request(
            # The URL is the MCP endpoint (`…/mcp`); the admin API is at the server's root.
            urllib.parse.urljoin(server["url"], "/_admin/outage"),
            data=json.dumps({"status": status, "duration_ms": int(seconds * 1000)}).encode(),
            headers={
                "Authorization": f"Bearer {server['api_key']}",
                "Content-Type": "application/json",
            },
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            if answer.status != 204:
                raise RuntimeError(f"beginning the outage: HTTP {answer.status}")

    def remove_workdir(self) -> None:
        """Removes the kubeconfig and the logs (keep them to look at a failure)."""
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        if self.stop() == 0 and exc_info[0] is None:
            self.remove_workdir()
