"""briq-operator's sandbox bridge, and the agent-side executor that drives it through Kubernetes.

`briq_bridge/sandbox.py` is the whole sandbox-side bridge: the operator uploads that one file
into the sandbox as `.briq/bridge.py`. `KubernetesExecutor` (install `briq-bridge[agent]`) is a
smolagents remote executor that runs each action as a briq-operator `Execution`; it is imported
lazily, so the bridge tests need neither smolagents nor the kubernetes client.
"""

from pathlib import Path

SANDBOX_SCRIPT = Path(__file__).with_name("sandbox.py")

_EXECUTOR_NAMES = {
    "CodeExecutionError",
    "ExecutorNotFoundError",
    "ExecutorNotReadyError",
    "ExecutorUnusableError",
    "KubernetesExecutor",
    "KubernetesExecutorError",
}

__all__ = ["SANDBOX_SCRIPT", *sorted(_EXECUTOR_NAMES)]


def __getattr__(name: str):
    if name in _EXECUTOR_NAMES:
        from . import kubernetes_executor

        return getattr(kubernetes_executor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
