"""Live output: a step's prints reach the executor's logger while it runs, read from the
operator's aggregated API (`executions/{name}/log`), and `stream_output` for other callers;
without the API, steps run as before. Against the real kube-apiserver, operator and local
sandbox server (whose kernels are host processes, run as `nobody`: a file in a directory they
can read is a gate they see)."""

from __future__ import annotations

import io
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from rich.console import Console
from rich.text import Text
from smolagents import CodeAgent
from smolagents.monitoring import AgentLogger, LogLevel

from briq_dev.scripted_model import ScriptedModel, action
from briq_operator_client import KubernetesExecutor, KubernetesExecutorError
from briq_operator_client import kubernetes_executor as module

WAIT = 120  # seconds, for anything that should take well under one


class CapturingLogger(AgentLogger):
    """An INFO logger that keeps the live pieces it is given (rich `Text`s), in order, and lets
    a test wait until their text holds something."""

    def __init__(self):
        super().__init__(level=LogLevel.INFO, console=Console(file=io.StringIO()))
        self.pieces: list[tuple[str, str]] = []  # (style, text)
        self._changed = threading.Condition()

    def log(self, *args, level=LogLevel.INFO, **kwargs) -> None:
        super().log(*args, level=level, **kwargs)
        if args and isinstance(args[0], Text):
            with self._changed:
                self.pieces.append((str(args[0].style), args[0].plain))
                self._changed.notify_all()

    def text(self) -> str:
        with self._changed:
            return "".join(text for _, text in self.pieces)

    def wait_for(self, wanted: str, timeout: float = WAIT) -> bool:
        with self._changed:
            return self._changed.wait_for(
                lambda: wanted in "".join(text for _, text in self.pieces), timeout
            )


@pytest.fixture
def gate():
    """A path that the kernel (another user) can see appear."""
    directory = Path(tempfile.mkdtemp(prefix="briq-gate-"))
    directory.chmod(0o755)
    yield directory / "gate"
    shutil.rmtree(directory)


def gated_code(gate, before: str, after: str) -> str:
    """Code that runs `before`, waits (within its 40 s deadline) until `gate` exists, then runs
    `after`."""
    return (
        f"import os, sys, time\n{before}\n"
        "deadline = time.monotonic() + 30\n"
        f"while not os.path.exists({str(gate)!r}):\n"
        "    if time.monotonic() > deadline:\n"
        "        raise TimeoutError('the gate never opened')\n"
        "    time.sleep(0.02)\n"
        f"{after}\n"
    )


def on_executor(shared_executor, kubeconfig, logger, **options) -> KubernetesExecutor:
    return KubernetesExecutor(
        [],
        logger,
        executor_name=shared_executor.executor_name,
        kubeconfig=kubeconfig,
        timeout_seconds=40,
        **options,
    )


def merged(pieces: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Consecutive pieces of one stream as one (how text is split into pieces is not fixed)."""
    out: list[tuple[str, str]] = []
    for stream, text in pieces:
        if out and out[-1][0] == stream:
            out[-1] = (stream, out[-1][1] + text)
        else:
            out.append((stream, text))
    return out


def test_a_steps_prints_reach_the_logger_while_the_step_runs(shared_executor, kubeconfig, gate):
    logger = CapturingLogger()
    events: list[str] = []

    def open_gate_once_logged() -> None:
        if logger.wait_for("first print\n"):
            events.append("first print logged")
            gate.touch()

    code = gated_code(
        gate,
        "print('first print', flush=True)\nprint('to stderr', file=sys.stderr, flush=True)",
        "print('second print', flush=True)",
    )
    with on_executor(shared_executor, kubeconfig, logger) as executor:
        step = executor.run_code_raise_errors

        def recorded(code: str):
            output = step(code)
            if "first print" in code:  # not the tools' and variables' actions
                events.append("step result")
            return output

        executor.run_code_raise_errors = recorded
        model = ScriptedModel(
            [action("Print, wait, print.", code), action("Done.", "final_answer(1)")]
        )
        agent = CodeAgent(
            tools=[], model=model, executor=executor, max_steps=3, verbosity_level=LogLevel.OFF
        )
        opener = threading.Thread(target=open_gate_once_logged, daemon=True)
        opener.start()
        try:
            assert agent.run("Print twice.") == 1
        finally:
            gate.touch()  # never leave the step waiting on its gate
            opener.join()

    assert events[:2] == ["first print logged", "step result"], events
    # The step's result is the status's, as without live output.
    observations = agent.memory.steps[1].observations
    assert "first print" in observations and "second print" in observations, observations
    assert "TimeoutError" not in observations
    live = merged(logger.pieces)
    assert ("red", "to stderr\n") in live, live  # stderr is told apart
    assert "second print\n" in logger.text()  # relayed before the step's result came back


def test_stream_output_yields_stdout_and_stderr_in_order_and_ends(
    shared_executor, kubeconfig, gate
):
    code = gated_code(
        gate,
        "print('one', flush=True)\nprint('two', file=sys.stderr, flush=True)\n"
        "print('three', flush=True)",
        "print('four', flush=True)",
    )
    with on_executor(shared_executor, kubeconfig, AgentLogger(LogLevel.OFF)) as executor:
        created = threading.Event()
        follow_live = executor._follow_live

        def noted(name: str, wait_seconds: float):
            created.set()
            return follow_live(name, wait_seconds)

        executor._follow_live = noted
        results: list = []
        step = threading.Thread(target=lambda: results.append(executor.run_code_raise_errors(code)))
        step.start()
        try:
            assert created.wait(WAIT)
            name = executor.last_execution
            pieces: list[tuple[str, str]] = []
            ends: list[str | None] = []

            def read():
                ends.append((yield from executor.stream_output(name, read_timeout=WAIT)))

            for stream, text in read():
                pieces.append((stream, text))
                if "three" in "".join(t for _, t in pieces):
                    gate.touch()  # the rest only once the first three have come, live
        finally:
            gate.touch()
            step.join(WAIT)

        assert merged(pieces) == [
            ("stdout", "one\n"),
            ("stderr", "two\n"),
            ("stdout", "three\nfour\n"),
        ]
        assert ends == ["Completed"]
        [output] = results
        assert "four" in output.logs
        # Once finished: what the status keeps, and the end, without following.
        after = list(executor.stream_output(name, follow=False))
        assert "".join(text for _, text in after) == output.logs
        with pytest.raises(KubernetesExecutorError, match="not found") as missing:
            executor.stream_output("no-such-execution")
        assert missing.value.status == 404


def test_without_the_aggregated_api_steps_run_as_before(shared_executor, kubeconfig, monkeypatch):
    code = "import sys\nprint('hello')\nprint('oops', file=sys.stderr)\n6 * 7"
    with on_executor(
        shared_executor, kubeconfig, AgentLogger(LogLevel.OFF), live_output=False
    ) as plain:
        expected = plain.run_code_raise_errors(code)

    # An operator before the aggregated API: the API server knows no such group (404).
    monkeypatch.setattr(module, "SUBRESOURCES_GROUP", "absent.briq.cloud")
    logger = CapturingLogger()
    with on_executor(shared_executor, kubeconfig, logger) as executor:
        opened = []
        open_log = executor._open_log

        def counted(*args, **kwargs):
            opened.append(args[0])
            return open_log(*args, **kwargs)

        executor._open_log = counted
        assert executor.run_code_raise_errors(code) == expected
        assert executor._live_unavailable is not None
        # An agent on it: no error, the same observations; the API is not asked again.
        model = ScriptedModel([action("Print.", code), action("Done.", "final_answer(2)")])
        agent = CodeAgent(
            tools=[], model=model, executor=executor, max_steps=3, verbosity_level=LogLevel.OFF
        )
        assert agent.run("Print.") == 2
        assert agent.memory.steps[1].error is None
        assert "hello" in agent.memory.steps[1].observations
        assert len(opened) == 1, opened
        assert logger.pieces == []
        with pytest.raises(KubernetesExecutorError, match="aggregated API") as missing:
            executor.stream_output(executor.last_execution)
        assert missing.value.status == 404
