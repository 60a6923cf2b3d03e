"""KubernetesExecutor keeps the contracts of smolagents 1.26's remote executors (DockerExecutor,
ModalExecutor, E2BExecutor, the RemotePythonExecutor base), against the real kube-apiserver,
operator and local sandbox server. Each test names the contract and whose it is."""

from __future__ import annotations

import io

import pytest
from kubernetes.client.rest import ApiException
from rich.console import Console
from smolagents.default_tools import FinalAnswerTool
from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.serialization import SerializationError
from smolagents.utils import AgentError, AgentExecutionError

from briq_operator_client import (
    CodeExecutionError,
    ExecutorClosedError,
    FinalAnswerRejectedError,
    KubernetesExecutor,
)

from .conftest import new_executor


def recording_logger(level: LogLevel = LogLevel.INFO) -> tuple[AgentLogger, io.StringIO]:
    text = io.StringIO()
    return AgentLogger(level, Console(file=text, force_terminal=False, width=200)), text


@pytest.fixture
def logged(shared_executor, kubeconfig):
    """A KubernetesExecutor on the shared BriqExecutor whose logger writes to a buffer."""
    logger, text = recording_logger()
    with KubernetesExecutor(
        [], logger, executor_name=shared_executor.executor_name, kubeconfig=kubeconfig
    ) as executor:
        yield executor, text


def test_a_code_error_raises_agent_execution_error_with_the_traceback_as_docker_executor_does(
    logged,
):
    executor, logs = logged
    with pytest.raises(AgentError) as raised:
        executor("print('be' + 'fore')\n1 / 0")
    error = raised.value
    assert isinstance(error, AgentExecutionError) and isinstance(error, CodeExecutionError)
    text = str(error)
    # The kernel's traceback, as DockerExecutor joins it (without ANSI colours).
    assert "Traceback (most recent call last)" in text, text
    assert text.rstrip().endswith("ZeroDivisionError: division by zero"), text
    assert "\x1b[" not in text
    assert error.message == text  # AgentError's own field
    assert error.name == "ZeroDivisionError" and error.error_message == "division by zero"
    # Not in str() (as theirs), but kept for the agent: CodeAgent shows state["_print_outputs"].
    assert "before" not in text  # (the traceback quotes the source: 'be' + 'fore')
    assert error.logs == "before\n" == executor.state["_print_outputs"]
    # AgentError logs itself when raised.
    assert "ZeroDivisionError: division by zero" in logs.getvalue()
    # A code error leaves the executor usable, its state intact.
    assert executor("1 + 1").output == "2"


def test_a_syntax_error_raises_agent_error_naming_it_as_docker_executor_does(executor):
    with pytest.raises(AgentError, match="SyntaxError"):
        executor('print("Missing Parenthesis')


def test_a_pickled_final_answer_raises_serialization_error_as_their_executors_do(executor):
    forged = (
        "class FinalAnswerException(BaseException):\n    pass\n"
        "raise FinalAnswerException('pickle:gASVAAAAAAAAAAA=')"
    )
    with pytest.raises(SerializationError) as raised:
        executor(forged)
    assert isinstance(raised.value, FinalAnswerRejectedError)
    assert isinstance(raised.value, AgentExecutionError)
    assert "pickle" in str(raised.value)


def test_the_constructor_takes_remote_python_executors_arguments_in_their_order(
    shared_executor, kubeconfig
):
    logger, _ = recording_logger(LogLevel.OFF)
    # RemotePythonExecutor(additional_imports, logger, allow_pickle=False): the same positions.
    with KubernetesExecutor(
        [], logger, False, executor_name=shared_executor.executor_name, kubeconfig=kubeconfig
    ) as executor:
        assert executor.additional_imports == [] and executor.logger is logger
        assert executor.allow_pickle is False
        assert executor.installed_packages == []
    with pytest.raises(ValueError, match="allow_pickle=True is not supported"):
        KubernetesExecutor([], logger, True, executor_name="any", kubeconfig=kubeconfig)


def test_a_failed_start_raises_runtime_error_as_docker_executor_does(stack, kubeconfig):
    logger, _ = recording_logger(LogLevel.OFF)
    with pytest.raises(RuntimeError, match="no-such-executor not found"):
        KubernetesExecutor([], logger, executor_name="no-such-executor", kubeconfig=kubeconfig)


def test_after_cleanup_every_call_raises_and_cleanup_stays_idempotent_as_docker_executor(
    shared_executor, kubeconfig, custom_objects
):
    logger, _ = recording_logger(LogLevel.OFF)
    executor = KubernetesExecutor(
        [], logger, executor_name=shared_executor.executor_name, kubeconfig=kubeconfig
    )
    assert executor("1 + 1").output == "2"
    executor.cleanup()
    executor.delete()  # DockerExecutor.delete() is cleanup(); both may be called again
    for call in (
        lambda: executor("1 + 1"),
        lambda: executor.send_variables({"x": 1}),
        lambda: executor.send_tools({}),
        lambda: executor.install_packages(["numpy"]),
    ):
        # An Exception (theirs fail with the closed connection's), not ExecutorUnusableError.
        with pytest.raises(ExecutorClosedError, match="closed by cleanup"):
            call()
    # The BriqExecutor it was given by name is still there, for a new KubernetesExecutor.
    custom_objects.get_namespaced_custom_object(
        "briq.cloud", "v1alpha1", "default", "briqexecutors", shared_executor.executor_name
    )


def test_a_failed_cleanup_is_logged_not_raised_as_docker_executor_does(kubeconfig, custom_objects):
    logger, logs = recording_logger(LogLevel.ERROR)
    executor = new_executor(kubeconfig)
    real = executor._api.delete_namespaced_custom_object

    def refused(*args, **kwargs):
        raise ApiException(status=403, reason="Forbidden")

    executor._api.delete_namespaced_custom_object = refused
    executor.logger = logger
    executor.cleanup()  # does not raise
    assert "Error during cleanup" in logs.getvalue() and "403" in logs.getvalue()
    with pytest.raises(ExecutorClosedError):
        executor("1")
    executor._api.delete_namespaced_custom_object = real
    executor.cleanup()  # retries the deletion, and waits until it is gone
    with pytest.raises(ApiException) as gone:
        custom_objects.get_namespaced_custom_object(
            "briq.cloud", "v1alpha1", "default", "briqexecutors", executor.executor_name
        )
    assert gone.value.status == 404


def test_empty_code_returns_an_empty_code_output_as_a_jupyter_kernel_does(executor):
    before = executor.last_execution
    assert executor("") == CodeOutput(output=None, logs="", is_final_answer=False)
    assert executor.last_execution == before  # no Execution: spec.code needs a character


def test_a_failed_install_is_logged_and_returns_the_packages_as_remote_python_executor_does(
    logged,
):
    executor, logs = logged
    # The shared executor's pip has no index (PIP_NO_INDEX=1): this cannot be installed.
    assert executor.install_packages(["briq-no-such-package"]) == ["briq-no-such-package"]
    text = logs.getvalue()
    assert "No matching distribution found for briq-no-such-package" in text, text  # pip's
    assert "pip install briq-no-such-package failed" in text, text  # the error
    assert executor("1 + 1").output == "2"


def test_a_failed_install_at_start_does_not_fail_the_constructor_as_docker_executor(
    shared_executor, kubeconfig
):
    logger, _ = recording_logger(LogLevel.OFF)
    with KubernetesExecutor(
        ["briq_no_such_module"],
        logger,
        executor_name=shared_executor.executor_name,
        kubeconfig=kubeconfig,
    ) as executor:
        assert executor.installed_packages == ["briq_no_such_module"]
        with pytest.raises(AgentError, match="No module named 'briq_no_such_module'"):
            executor("import briq_no_such_module")


# --- what is already the same: the scenarios of smolagents' remote-executor integration tests,
# written for this executor ---------------------------------------------------------------------


def test_state_imports_and_variables_persist_between_actions_as_in_docker_executor(executor):
    executor("import math as m; side = 2")
    output = executor("print(m.sqrt(side))")
    assert "1.41421" in output.logs and output.output is None


def test_code_output_fields_are_the_kernels_text_plain_and_streams_as_docker_executor(executor):
    output = executor("import sys\nprint('out')\nprint('err', file=sys.stderr)\n'x' * 3")
    # Docker joins every stream message (stdout and stderr) and takes text/plain.
    assert output == CodeOutput(output="'xxx'", logs="out\nerr\n", is_final_answer=False)
    assert executor("y = 1").output is None


@pytest.mark.parametrize(
    "code, answer",
    [
        ('final_answer("""one\ntwo""")', "one\ntwo"),
        ("text = '''has\nfinal_answer(5)\n'''\nfinal_answer(text)", "has\nfinal_answer(5)\n"),
        ("n = 2\nif n == 1:\n    final_answer('1')\nelif n == 2:\n    final_answer('2')", "2"),
        ("print('shown')\nfinal_answer({'t': (1, 2), 's': {3}, 'b': b'\\x00'})", None),
    ],
)
def test_final_answers_are_returned_decoded_as_their_executors_do(executor, code, answer):
    executor.send_tools({"final_answer": FinalAnswerTool()})
    output = executor(code)
    assert output.is_final_answer is True
    if answer is None:
        assert output.output == {"t": (1, 2), "s": {3}, "b": b"\x00"}
        assert output.logs == "shown\n"
    else:
        assert output.output == answer


def test_a_custom_final_answer_tool_with_its_own_inputs_as_their_executors(executor):
    class Joined(FinalAnswerTool):
        inputs = {
            "left": {"type": "string", "description": "Left part."},
            "right": {"type": "string", "description": "Right part."},
        }

        def forward(self, left: str, right: str) -> str:
            return left + "|" + right

    executor.send_tools({"final_answer": Joined()})
    output = executor("final_answer(left='a', right='b')")
    assert (output.output, output.is_final_answer) == ("a|b", True)


def test_send_variables_uses_smolagents_safe_serialization_and_ignores_an_empty_dict(executor):
    before = executor.last_execution
    executor.send_variables({})
    assert executor.last_execution == before  # no action, as RemotePythonExecutor
    executor.send_variables({"counter": 1, "tags": ("a", "b"), "blob": b"binary"})
    assert executor.last_execution != before
    assert executor("(counter, tags, blob)").output == "(1, ('a', 'b'), b'binary')"
    with pytest.raises(SerializationError):  # raised on the host: nothing is ever pickled
        executor.send_variables({"error": ValueError("boom")})


def test_send_tools_defines_the_tools_in_the_kernel_with_no_tools_one_action(executor):
    before = executor.last_execution
    executor.send_tools({})
    assert executor.last_execution != before  # RemotePythonExecutor runs the definitions code


# --- the deliberate difference --------------------------------------------------------------


@pytest.mark.parametrize(
    "code, tag",
    [
        ("import numpy as np\nfinal_answer(np.arange(3))", "ndarray"),
        ("from PIL import Image\nfinal_answer(Image.new('RGB', (10, 10)))", "PIL.Image"),
    ],
)
def test_an_array_or_image_final_answer_is_rejected_never_reconstructed_on_the_host(
    executor, code, tag
):
    executor.send_tools({"final_answer": FinalAnswerTool()})
    with pytest.raises(FinalAnswerRejectedError) as raised:
        executor(code)
    assert f"'{tag}'" in str(raised.value)
    assert "return arrays as lists and images as bytes" in str(raised.value)
    assert executor("1 + 1").output == "2"  # the executor stays usable
