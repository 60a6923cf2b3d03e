"""How an Execution's status becomes a CodeOutput or an exception, without a cluster: the
reasons the e2e tests cannot provoke on demand (transport, malformed, interrupted, deleted)."""

from __future__ import annotations

import threading

import pytest
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.serialization import SerializationError
from smolagents.utils import AgentError, AgentExecutionError

from briq_operator_client.kubernetes_executor import (
    CodeExecutionError,
    ExecutorUnusableError,
    FinalAnswerRejectedError,
    KubernetesExecutor,
    KubernetesExecutorError,
    _claim_env_var,
    _requirements,
)


def offline_executor() -> KubernetesExecutor:
    """The mapping half of a KubernetesExecutor (no API client, no Ready wait)."""
    executor = object.__new__(KubernetesExecutor)
    executor.executor_name, executor.namespace = "py", "default"
    executor.logger = AgentLogger(level=LogLevel.OFF)
    executor.state = {"_print_outputs": ""}
    executor._unusable = None
    executor._closed = False
    executor._lock = threading.RLock()
    return executor


def finished(status: str, reason: str, message: str = "", **fields) -> dict:
    condition = {"type": "Succeeded", "status": status, "reason": reason, "message": message}
    return {"status": {"conditions": [condition], **fields}}


def test_completed_maps_logs_and_output():
    output = offline_executor()._outcome(
        "py-1", finished("True", "Completed", logs="hi\n", output="42")
    )
    assert (output.output, output.logs, output.is_final_answer) == ("42", "hi\n", False)


def test_final_answer_is_decoded_safely():
    executor = offline_executor()
    answer = executor._outcome(
        "py-1",
        finished(
            "True",
            "FinalAnswer",
            isFinalAnswer=True,
            finalAnswer='safe:{"__type__": "tuple", "data": [1, 2]}',
        ),
    )
    assert answer.is_final_answer and answer.output == (1, 2)
    with pytest.raises(FinalAnswerRejectedError, match="Pickle data rejected"):
        executor._outcome(
            "py-2", finished("True", "FinalAnswer", isFinalAnswer=True, finalAnswer="pickle:gA==")
        )


def test_a_code_error_carries_the_traceback_and_keeps_the_logs():
    executor = offline_executor()
    error = {"name": "KeyError", "message": "'x'", "traceback": "Traceback…\nKeyError: 'x'"}
    with pytest.raises(CodeExecutionError) as raised:
        executor._outcome("py-1", finished("False", "CodeError", logs="before\n", error=error))
    assert isinstance(raised.value, AgentExecutionError)
    assert str(raised.value) == "Traceback…\nKeyError: 'x'"
    assert raised.value.logs == "before\n"
    assert executor.state["_print_outputs"] == "before\n"  # where CodeAgent looks for logs
    assert executor._unusable is None  # a code error leaves the executor usable


def test_a_rejected_final_answer_is_a_code_error_and_a_serialization_error():
    refused = "pickle-serialized final answers are refused"
    error = {"name": "FinalAnswerRejected", "message": refused}
    with pytest.raises(FinalAnswerRejectedError) as raised:
        offline_executor()._outcome("py-1", finished("False", "FinalAnswerRejected", error=error))
    assert isinstance(raised.value, SerializationError)
    assert isinstance(raised.value, AgentExecutionError)
    assert str(raised.value) == f"FinalAnswerRejected: {refused}"


@pytest.mark.parametrize("reason", ["QueueFull", "SandboxNotOwned", "ExecutorNeverAppeared"])
def test_an_execution_that_did_not_run_is_a_cluster_error_not_a_code_error(reason):
    executor = offline_executor()
    with pytest.raises(KubernetesExecutorError, match=f"did not run: {reason}: full") as raised:
        executor._outcome("py-1", finished("False", reason, "full"))
    assert not isinstance(raised.value, AgentError)
    assert executor._unusable is None


@pytest.mark.parametrize(
    "reason",
    [
        "Timeout",
        "TransportError",
        "MalformedResponse",
        "KernelLost",
        "Interrupted",
        "ExecutorUnusable",
        "ExecutorDeleted",
    ],
)
def test_unusable_reasons_poison_the_executor(reason):
    executor = offline_executor()
    with pytest.raises(ExecutorUnusableError) as raised:
        executor._outcome("py-1", finished("False", reason, "it broke"))
    assert raised.value.reason == reason
    assert "create a new BriqExecutor" in str(raised.value)
    assert not isinstance(raised.value, Exception)  # smolagents must not turn it into a retry
    with pytest.raises(ExecutorUnusableError):
        executor.run_code_raise_errors("1")  # fails at once, no Execution


def test_requirements_for_pip():
    assert _requirements(
        ["numpy", "pandas.*", "*", "PIL", "pillow", "numpy>=2", "numpy.linalg", "  "]
    ) == [("numpy", "numpy"), ("pandas", "pandas"), ("PIL", "pillow"), (None, "numpy>=2")]


def test_a_claims_environment_names_values_and_secret_keys():
    assert _claim_env_var("REGION", "eu") == {"name": "REGION", "value": "eu"}
    assert _claim_env_var("TOKEN", {"secret": "tools", "key": "token"}) == {
        "name": "TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "tools", "key": "token"}},
    }
    with pytest.raises(ValueError, match="must be a string or"):
        _claim_env_var("TOKEN", {"secret": "tools"})


def test_a_claims_environment_without_a_pool_is_refused_before_anything_is_created():
    with pytest.raises(ValueError, match="pool_env needs pool"):
        KubernetesExecutor([], AgentLogger(level=LogLevel.OFF), pool_env={"REGION": "eu"})
