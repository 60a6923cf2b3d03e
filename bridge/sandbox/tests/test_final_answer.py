"""Final answers produced by smolagents' own remote-executor patching code."""

from __future__ import annotations

import pytest
from smolagents.default_tools import FinalAnswerTool
from smolagents.local_python_executor import CodeOutput
from smolagents.remote_executors import RemotePythonExecutor

FIBONACCI_20 = [0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584, 4181]


class _QuietLogger:
    def log(self, *args, **kwargs):
        pass


class RecordingExecutor(RemotePythonExecutor):
    """Captures the code smolagents would send to a remote kernel instead of running it."""

    def __init__(self) -> None:
        super().__init__([], _QuietLogger())
        self.sent: list[str] = []

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        self.sent.append(code)
        return CodeOutput(output=None, logs="", is_final_answer=False)

    def install_packages(self, additional_imports):
        return additional_imports  # the test kernel has them; no pip (and no network) in tests


@pytest.fixture(scope="module")
def agent_kernel(shared_sandbox):
    """The shared kernel prepared the way CodeAgent prepares a remote executor."""
    executor = RecordingExecutor()
    executor.send_tools({"final_answer": FinalAnswerTool()})
    executor.send_variables({"n_fib": 20})
    assert len(executor.sent) == 2
    for code in executor.sent:
        result = shared_sandbox.run(code)
        assert result["status"] == "ok", result
    return shared_sandbox


def test_fibonacci_final_answer_round_trips(agent_kernel):
    code = (
        "fib = [0, 1]\n"
        "while len(fib) < n_fib:\n"
        "    fib.append(fib[-1] + fib[-2])\n"
        "print('computed', len(fib))\n"
        "final_answer(fib)\n"
    )
    result = agent_kernel.run(code)
    assert result["status"] == "final_answer"
    assert result["error"] is None
    assert result["logs"] == "computed 20\n"
    value = result["final_answer"]
    assert value.startswith("safe:")
    answer = RemotePythonExecutor._deserialize_final_answer(value, allow_pickle=False)
    assert answer == FIBONACCI_20


def test_other_tagged_types_are_accepted(agent_kernel):
    result = agent_kernel.run("final_answer({'pair': (1, 2), 'raw': b'\\x00\\xff', 7: 'seven'})")
    assert result["status"] == "final_answer"
    answer = RemotePythonExecutor._deserialize_final_answer(result["final_answer"])
    assert answer == {"pair": (1, 2), "raw": b"\x00\xff", 7: "seven"}


def assert_rejected(result: dict, *fragments: str) -> None:
    assert result["status"] == "final_answer_rejected"
    assert result["final_answer"] is None
    assert result["error"]["name"] == "FinalAnswerRejected"
    for fragment in fragments:
        assert fragment in result["error"]["message"]


def test_ndarray_answer_is_rejected(agent_kernel):
    result = agent_kernel.run("import numpy as np\nfinal_answer(np.arange(5))")
    assert_rejected(result, "ndarray", "return arrays as lists and images as bytes")


def test_pil_image_answer_is_rejected(agent_kernel):
    result = agent_kernel.run("import PIL.Image\nfinal_answer(PIL.Image.new('RGB', (2, 2)))")
    assert_rejected(result, "PIL.Image", "return arrays as lists and images as bytes")


def test_nested_ndarray_is_rejected(agent_kernel):
    code = "import numpy as np\nfinal_answer({'rows': [1, {'deep': (np.zeros(2),)}]})"
    assert_rejected(agent_kernel.run(code), "ndarray", "return arrays as lists")


def test_numpy_scalars_become_plain_numbers(agent_kernel):
    result = agent_kernel.run("import numpy as np\nfinal_answer([np.int64(3), np.float64(0.5)])")
    assert result["status"] == "final_answer"
    assert RemotePythonExecutor._deserialize_final_answer(result["final_answer"]) == [3, 0.5]


def test_oversized_answer_is_rejected(agent_kernel):
    assert_rejected(agent_kernel.run("final_answer('x' * 70_000)"), "65536")


def test_answer_at_the_limit_is_accepted(agent_kernel):
    # 'safe:' + the JSON string's two quotes + the payload is exactly 65,536 characters.
    result = agent_kernel.run("final_answer('x' * (65_536 - 7))")
    assert result["status"] == "final_answer"
    assert len(result["final_answer"]) == 65_536


RAISE_RAW = """
class FinalAnswerException(BaseException):
    pass

raise FinalAnswerException({value!r})
"""


def test_pickle_answer_is_rejected(shared_sandbox):
    result = shared_sandbox.run(RAISE_RAW.format(value="pickle:gASVBQAAAAAAAABLAS4="))
    assert_rejected(result, "pickle")


def test_pickle_answer_from_smolagents_is_rejected(shared_sandbox):
    executor = RecordingExecutor()
    executor.allow_pickle = True  # what a host configured for pickle would send
    executor.send_tools({"final_answer": FinalAnswerTool()})
    for code in executor.sent:
        assert shared_sandbox.run(code)["status"] == "ok"
    result = shared_sandbox.run("final_answer(object())\n")
    assert_rejected(result, "pickle")
    # Put the safe-only tool back for the other tests sharing this kernel.
    executor = RecordingExecutor()
    executor.send_tools({"final_answer": FinalAnswerTool()})
    for code in executor.sent:
        assert shared_sandbox.run(code)["status"] == "ok"


def test_unprefixed_answer_is_rejected(shared_sandbox):
    assert_rejected(shared_sandbox.run(RAISE_RAW.format(value="[1, 2]")), "safe:")


def test_invalid_json_answer_is_rejected(shared_sandbox):
    assert_rejected(shared_sandbox.run(RAISE_RAW.format(value="safe:{not json")), "JSON")


def test_hand_made_ndarray_tag_is_rejected(shared_sandbox):
    value = 'safe:[{"__type__": "PIL.Image", "data": ""}]'
    assert_rejected(shared_sandbox.run(RAISE_RAW.format(value=value)), "PIL.Image")


def test_tag_text_inside_a_string_is_fine(shared_sandbox):
    value = 'safe:"{\\"__type__\\": \\"ndarray\\"}"'
    result = shared_sandbox.run(RAISE_RAW.format(value=value))
    assert result["status"] == "final_answer"
    assert result["final_answer"] == value
