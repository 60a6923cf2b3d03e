"""End-to-end fixtures: a real kube-apiserver, the local sandbox server and the operator
(`briq-dev local-stack`, started once per session), and BriqExecutors on it.

The binary is `$BRIQ_DEV_BIN`, else `target/debug/briq-dev` (`cargo build -p briq-dev`). Nothing
here needs the network: the sandboxes run the test venv, and pip in them runs with
`PIP_NO_INDEX=1`, so only already-installed requirements can be satisfied.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client, config
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from smolagents.monitoring import AgentLogger, LogLevel

from briq_dev.local_stack import LocalStack
from briq_operator_client import KubernetesExecutor

from .otlp_receiver import OtlpReceiver

NO_NETWORK_ENV = [{"name": "PIP_NO_INDEX", "value": "1"}]
# This checkout (not necessarily the one the venv's editable briq_dev points at: a worktree).
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def release_python(tmp_path_factory) -> dict[str, Path]:
    """The agent client's wheel and sdist as `make release` builds them (dev/release-python.sh:
    offline, with this venv's build and twine; it fails unless `twine check --strict` passes),
    in a temporary directory: {"wheel": path, "sdist": path}."""
    out = tmp_path_factory.mktemp("release")
    done = subprocess.run(
        ["bash", str(REPO / "dev" / "release-python.sh"), sys.executable, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.count("PASSED") == 2, done.stderr  # twine check, one line per file
    wheel, sdist = (Path(line) for line in done.stdout.splitlines())
    return {"wheel": wheel, "sdist": sdist}


@pytest.fixture(scope="session")
def otlp():
    """An OTLP/HTTP receiver that the operator and this process export their spans to."""
    receiver = OtlpReceiver().start()
    provider = TracerProvider(resource=Resource.create({"service.name": "agent-tests"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces"))
    )
    trace.set_tracer_provider(provider)
    yield receiver
    provider.shutdown()
    receiver.stop()


@pytest.fixture(scope="session")
def stack(otlp):
    # The operator exports its traces to the receiver, in batches 100 ms apart.
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    stack = LocalStack(env=env).start()
    try:
        yield stack
    finally:
        code = stack.stop()
        output = stack.output()
    assert code == 0, f"local-stack exited with {code}:\n{stack.log_tail()}"
    assert "0 sandboxes left" in output, output
    stack.remove_workdir()


@pytest.fixture(scope="session")
def kubeconfig(stack) -> str:
    return str(stack.kubeconfig)


@pytest.fixture(scope="session")
def custom_objects(kubeconfig) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(
        config.new_client_from_config(config_file=kubeconfig, persist_config=False)
    )


def quiet() -> AgentLogger:
    return AgentLogger(level=LogLevel.OFF)


def new_executor(kubeconfig: str, **options) -> KubernetesExecutor:
    """A KubernetesExecutor that creates and owns a BriqExecutor."""
    return KubernetesExecutor([], quiet(), create_executor=True, kubeconfig=kubeconfig, **options)


@pytest.fixture(scope="session")
def shared_executor(kubeconfig):
    """One BriqExecutor (created and owned here) for the tests that leave it usable."""
    executor = new_executor(kubeconfig, executor_spec={"env": NO_NETWORK_ENV})
    yield executor
    executor.cleanup()


@pytest.fixture
def executor(shared_executor, kubeconfig):
    """A fresh KubernetesExecutor (one per agent) on the shared BriqExecutor."""
    with KubernetesExecutor(
        [], quiet(), executor_name=shared_executor.executor_name, kubeconfig=kubeconfig
    ) as executor:
        yield executor
