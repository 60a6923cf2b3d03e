"""briq-operator's agent-side client: a smolagents remote executor driven through Kubernetes.

`KubernetesExecutor` runs each agent action as a briq-operator `Execution` (`pip install
./bridge/agent`). It is imported lazily, so `import briq_bridge` needs neither smolagents nor the
kubernetes client. The sandbox-side bridge is a separate distribution
(`bridge/sandbox/briq_sandbox.py`) that the operator uploads into each sandbox; nothing here
imports it.
"""

_EXECUTOR_NAMES = {
    "CodeExecutionError",
    "ExecutorNotFoundError",
    "ExecutorNotReadyError",
    "ExecutorUnusableError",
    "KubernetesExecutor",
    "KubernetesExecutorError",
}

__all__ = sorted(_EXECUTOR_NAMES)


def __getattr__(name: str):
    if name in _EXECUTOR_NAMES:
        from . import kubernetes_executor

        return getattr(kubernetes_executor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
