"""A real smolagents CodeAgent, a scripted model and KubernetesExecutor, against the real
kube-apiserver, operator and local sandbox server."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
import time

import pytest
from kubernetes.client.rest import ApiException
from opentelemetry import trace
from smolagents import CodeAgent, tool
from smolagents.monitoring import LogLevel

from briq_dev.demo_agent import FIRST_20, scripted_model
from briq_dev.local_stack import REPO
from briq_dev.scripted_model import ScriptedModel, action, messages_text
from briq_operator_client import (
    CodeExecutionError,
    ExecutorClosedError,
    ExecutorNotFoundError,
    ExecutorUnusableError,
    KubernetesExecutor,
)
from briq_operator_client.vocabulary import TRACEPARENT_ANNOTATION

from .conftest import NO_NETWORK_ENV, new_executor, quiet

GROUP, VERSION = "briq.cloud", "v1alpha1"


def agent_with(executor, script, tools=(), max_steps=4):
    model = script if isinstance(script, ScriptedModel) else ScriptedModel(script)
    agent = CodeAgent(
        tools=list(tools),
        model=model,
        executor=executor,
        max_steps=max_steps,
        verbosity_level=LogLevel.OFF,
    )
    return agent, model


def execution(custom_objects, name):
    return custom_objects.get_namespaced_custom_object(
        GROUP, VERSION, "default", "executions", name
    )


def reason(obj) -> str:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next(c["reason"] for c in conditions if c["type"] == "Succeeded")


@tool
def vector_norm(values: list[float]) -> float:
    """Euclidean norm of a vector, computed with numpy.

    Args:
        values: the vector's components.
    """
    import numpy as np

    return float(np.linalg.norm(np.array(values, dtype=float)))


def test_fibonacci_answer_is_the_first_20_numbers(executor, custom_objects):
    agent, model = agent_with(executor, scripted_model())

    answer = agent.run("Calculate the first 20 Fibonacci numbers.")

    assert answer == FIRST_20
    # Step 2 used `fib` from step 1's Execution: state lives in the kernel between Executions.
    assert "20 numbers: [0, 1, 1, 2" in messages_text(model.calls[1])
    last = execution(custom_objects, executor.last_execution)
    assert reason(last) == "FinalAnswer"
    assert last["spec"]["code"] == "final_answer(fib)"
    assert last["status"]["finalAnswer"].startswith("safe:")


def test_the_demo_script_prints_the_answer(shared_executor, kubeconfig):
    done = subprocess.run(
        [sys.executable, "-m", "briq_dev.demo_agent", "--executor"]
        + [shared_executor.executor_name, "--kubeconfig", kubeconfig],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "BRIQ_DEMO_MODEL"},
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"answer: {FIRST_20}" in done.stdout
    assert "step 2: Execution" in done.stdout
    # The first step's prints came while it ran: before the line printed once it ended.
    live = done.stdout.find("live | numbers 1 to 5: [0, 1, 1, 2, 3]")
    assert 0 <= live < done.stdout.find("step 1: Execution"), done.stdout


def install_logs(custom_objects, executor) -> list[str]:
    executions = custom_objects.list_namespaced_custom_object(
        GROUP, VERSION, "default", "executions"
    )["items"]
    return [
        e["status"].get("logs", "")
        for e in executions
        if e["spec"]["executorRef"]["name"] == executor.executor_name
        and "_briq_install" in e["spec"]["code"]
    ]


def test_a_tool_with_a_pip_requirement_works(executor, custom_objects):
    agent, _ = agent_with(
        executor,
        [action("I use the tool.", "final_answer(vector_norm(values=[3.0, 4.0, 12.0]))")],
        tools=[vector_norm],
    )

    assert agent.run("What is the norm of (3, 4, 12)?") == 13.0
    # The tool's numpy, and numpy and pillow for smolagents' patched final_answer.
    assert {"numpy", "pillow"} <= set(executor.installed_packages)
    # All importable already, so pip was not even asked.
    logs = install_logs(custom_objects, executor)
    assert any("already importable: " in entry and "numpy" in entry for entry in logs), logs


def test_install_packages_runs_pip_in_the_sandbox(executor, custom_objects):
    # pip in this sandbox has no index: only what is installed can satisfy a requirement.
    assert executor.run_code_raise_errors("import os\nos.environ['PIP_NO_INDEX']").output == "'1'"

    assert executor.install_packages(["numpy>=1.26"]) == ["numpy>=1.26"]

    logs = install_logs(custom_objects, executor)
    assert any("Requirement already satisfied: numpy>=1.26" in entry for entry in logs), logs


def test_additional_args_reach_the_kernel(executor):
    agent, _ = agent_with(
        executor,
        [
            action(
                "The variables are in the kernel already.",
                'final_answer({"label": label, "total": sum(numbers), "pair": pair, '
                '"year": when.year, "type": type(when).__name__})',
            )
        ],
    )

    answer = agent.run(
        "Sum the numbers.",
        additional_args={
            "numbers": [3, 1, 2],
            "label": "total",
            "pair": (1, 2),
            "when": datetime.date(2026, 1, 2),
        },
    )

    assert answer == {"label": "total", "total": 6, "pair": (1, 2), "year": 2026, "type": "date"}


def test_an_agent_step_during_a_briq_outage_waits_and_keeps_the_executors_state(
    executor, stack, custom_objects
):
    """briq's gateway answers 503 to everything for 20 s while an agent acts: the step's
    Execution waits for briq (WaitingForBriq), then runs once; the kernel keeps its state and
    the agent gets its answer, within the client's own deadline."""
    agent, _ = agent_with(executor, [action("I keep a value.", "kept = 41\nfinal_answer(kept)")])
    assert agent.run("Keep a value.") == 41

    stack.begin_outage(503, 20)
    agent, _ = agent_with(executor, [action("I use it.", "final_answer(kept + 1)")])
    assert agent.run("Use the value.") == 42

    execution = custom_objects.get_namespaced_custom_object(
        GROUP, VERSION, "default", "executions", executor.last_execution
    )
    succeeded = next(c for c in execution["status"]["conditions"] if c["type"] == "Succeeded")
    assert succeeded["reason"] == "FinalAnswer", succeeded
    executor_object = custom_objects.get_namespaced_custom_object(
        GROUP, VERSION, "default", "briqexecutors", executor.executor_name
    )
    assert not executor_object["status"].get("unusable"), executor_object["status"]


def test_a_code_error_is_shown_to_the_model_and_the_next_step_succeeds(executor):
    def after_error(messages) -> str:
        seen = messages_text(messages)
        assert "Error:" in seen and "ZeroDivisionError: division by zero" in seen, seen
        assert "about to divide" in seen, seen  # the logs printed before the error are kept
        return action("Division by zero; I use a non-zero divisor.", "final_answer(10 / 5)")

    agent, model = agent_with(
        executor,
        [action("I divide.", "print('about to divide')\nresult = 1 / 0"), after_error],
    )

    assert agent.run("Divide.") == 2.0
    assert len(model.calls) == 2
    assert "ZeroDivisionError" in str(agent.memory.steps[1].error)


def test_a_runaway_step_cancelled_is_shown_to_the_model_and_the_kernel_keeps_its_state(
    kubeconfig, custom_objects
):
    """`KubernetesExecutor.cancel` from another thread (a watchdog, a UI's stop button) while a
    step's code spins: the step ends, the model sees that it was cancelled, and the next step
    still has the variable an earlier step set. (An executor of its own: without the cancel,
    the loop runs to its deadline and leaves the executor unusable.)"""
    cancelled = []

    def cancel_the_spin(executor) -> None:
        """Cancels the spinning step's Execution once it runs (or, should its Running status be
        late on a loaded machine, a few seconds after it was created: a cancel before it runs
        ends it too)."""
        deadline = time.monotonic() + 60
        seen = None
        while time.monotonic() < deadline:
            name = executor._running
            try:
                obj = execution(custom_objects, name) if name else None
            except Exception:  # noqa: BLE001 - a failed read on a loaded machine: look again
                obj = None
            if obj is not None and "while True" in obj["spec"]["code"]:
                seen = seen or time.monotonic()
                conditions = (obj.get("status") or {}).get("conditions") or []
                running = any(c["reason"] == "Running" for c in conditions)
                if running or time.monotonic() - seen > 5:
                    cancelled.append((name, executor.cancel(name)))
                    return
            time.sleep(0.05)

    def after_cancel(messages) -> str:
        assert "Cancelled" in messages_text(messages)
        return action("It was stopped; x is still there.", "final_answer(x + 1)")

    spin = "print('spinning', flush=True)\nwhile True:\n    pass"
    # The longest deadline: the cancel must win the race against it even on a loaded machine.
    with new_executor(
        kubeconfig, executor_spec={"env": NO_NETWORK_ENV}, timeout_seconds=40
    ) as executor:
        script = [action("Set.", "x = 41"), action("Spin.", spin), after_cancel]
        agent, model = agent_with(executor, script)
        watchdog = threading.Thread(target=cancel_the_spin, args=(executor,))
        watchdog.start()
        try:
            answer = agent.run("Set x, spin, then answer.")
        finally:
            watchdog.join()
        assert answer == 42
        assert len(model.calls) == 3
        assert "Cancelled" in str(agent.memory.steps[2].error)
        [(name, requested)] = cancelled
        assert requested
        assert reason(execution(custom_objects, name)) == "Cancelled"
        assert not executor.cancel(), "nothing runs now: nothing to cancel"


def test_a_rejected_final_answer_is_shown_to_the_model(executor):
    forged = (
        "class FinalAnswerException(BaseException):\n    pass\n"
        "raise FinalAnswerException('pickle:gASVAAAAAAAAAAA=')"
    )

    def after_rejection(messages) -> str:
        assert "FinalAnswerRejected" in messages_text(messages)
        return action("Plain data then.", "final_answer([1, 2])")

    agent, _ = agent_with(executor, [action("Pickle.", forged), after_rejection])

    assert agent.run("Return something.") == [1, 2]


def test_run_twice_on_one_agent(executor):
    agent, model = agent_with(
        executor,
        [
            action("First.", "final_answer(sum(range(5)))"),
            action("Second: final_answer still works.", "final_answer('again')"),
            action("Third.", "final_answer(len(x_from_run_2))"),
        ],
    )

    assert agent.run("First task.") == 10
    # smolagents 1.26 re-patches final_answer here; unpatched, this fails with
    # NameError: name 'allow_pickle_setting' is not defined.
    assert agent.run("Second task.", additional_args={"x_from_run_2": [1, 2, 3]}) == "again"
    assert agent.run("Third task.", reset=False) == 3
    patched = [c.__name__ for c in type(agent.tools["final_answer"]).__mro__]
    assert patched.count("_FinalAnswerTool") == 1, patched


def test_timeout_makes_the_executor_unusable(kubeconfig, custom_objects):
    with new_executor(
        kubeconfig, executor_spec={"env": NO_NETWORK_ENV}, timeout_seconds=2
    ) as executor:
        agent, model = agent_with(
            executor,
            [action("Spin.", "while True:\n    pass"), action("Never reached.", "1")],
        )
        started = time.monotonic()
        with pytest.raises(ExecutorUnusableError) as raised:
            agent.run("Spin forever.")
        assert time.monotonic() - started < 30
        error = raised.value
        # Timeout; on a loaded machine the bridge may call it KernelLost instead (its wait for
        # the kernel's iopub shares the 2 s deadline). Either way the executor is unusable.
        assert error.reason in ("Timeout", "KernelLost"), error
        assert "create a new BriqExecutor" in str(error)
        assert len(model.calls) == 1  # the agent stopped: the model was not asked to retry

        # Later calls fail at once, without creating Executions.
        spun = executor.last_execution
        with pytest.raises(ExecutorUnusableError, match="create a new BriqExecutor"):
            executor.run_code_raise_errors("1 + 1")
        assert executor.last_execution == spun
        assert reason(execution(custom_objects, spun)) == error.reason
        status = custom_objects.get_namespaced_custom_object(
            GROUP, VERSION, "default", "briqexecutors", executor.executor_name
        )["status"]
        assert status["unusable"] is True


def test_create_executor_context_manager_deletes_it(kubeconfig, custom_objects):
    with new_executor(kubeconfig) as executor:
        name = executor.executor_name
        assert name.startswith("agent-")
        assert executor.run_code_raise_errors("x = 41\nx + 1").output == "42"
        assert executor.run_code_raise_errors("x").output == "41"

    with pytest.raises(ApiException) as gone:
        custom_objects.get_namespaced_custom_object(
            GROUP, VERSION, "default", "briqexecutors", name
        )
    assert gone.value.status == 404
    with pytest.raises(ExecutorClosedError):
        executor.run_code_raise_errors("1")
    executor.cleanup()  # idempotent


def test_a_missing_executor_is_a_clear_error(stack, kubeconfig):
    with pytest.raises(ExecutorNotFoundError, match="no-such-executor not found"):
        KubernetesExecutor([], quiet(), executor_name="no-such-executor", kubeconfig=kubeconfig)


def test_an_agents_executor_claimed_from_a_pool_starts_on_a_warm_kernel(kubeconfig, custom_objects):
    pool = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "BriqExecutorPool",
        "metadata": {"name": "warm-test"},
        "spec": {"replicas": 1, "template": {"env": NO_NETWORK_ENV}},
    }
    custom_objects.create_namespaced_custom_object(
        GROUP, VERSION, "default", "briqexecutorpools", pool
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            status = custom_objects.get_namespaced_custom_object(
                GROUP, VERSION, "default", "briqexecutorpools", "warm-test"
            ).get("status", {})
            if status.get("readyReplicas", 0) >= 1:
                break
            assert time.monotonic() < deadline, f"the pool never got a Ready member: {status}"
            time.sleep(0.2)

        with new_executor(
            kubeconfig,
            pool="warm-test",
            pool_env={"REGION": "eu"},
            executor_spec={"env": NO_NETWORK_ENV},
        ) as executor:
            created = custom_objects.get_namespaced_custom_object(
                GROUP, VERSION, "default", "briqexecutors", executor.executor_name
            )
            assert created["spec"]["poolRef"] == {
                "name": "warm-test",
                "coldCreateAfterSeconds": 30,
                "env": [{"name": "REGION", "value": "eu"}],
            }
            ready = next(c for c in created["status"]["conditions"] if c["type"] == "Ready")
            assert "handed over from BriqExecutorPool warm-test" in ready["message"]
            assert executor.run_code_raise_errors("x = 41\nx + 1").output == "42"
            region = executor.run_code_raise_errors("import os\nos.environ['REGION']")
            assert region.output == "'eu'"
    finally:
        custom_objects.delete_namespaced_custom_object(
            GROUP, VERSION, "default", "briqexecutorpools", "warm-test"
        )


def test_one_trace_holds_the_agent_step_the_client_span_and_the_operators_spans(
    executor, otlp, custom_objects
):
    """The agent's step, the client's span around the Execution and the operator's spans of
    its queueing, reads, briq exec (with briq's request id), kernel and status write: one trace,
    each span below the one that caused it."""
    agent, _ = agent_with(executor, [action("I multiply.", "final_answer(6 * 7)")])
    with trace.get_tracer("agent-tests").start_as_current_span("agent step") as step:
        assert agent.run("What is six times seven?") == 42
    trace_id = format(step.get_span_context().trace_id, "032x")
    obj = execution(custom_objects, executor.last_execution)
    assert obj["metadata"]["annotations"][TRACEPARENT_ANNOTATION].split("-")[1] == trace_id

    def of_step(spans):
        """The step's span, the client span of its last Execution and everything below it
        (the agent may have run other Executions in the step, to send tools or variables)."""
        in_trace = [s for s in spans if s.trace_id == trace_id]
        chosen = [
            s
            for s in in_trace
            if s.name == "agent step"
            or s.attributes.get("briq.execution") == executor.last_execution
            and s.name == "briq execution"
        ]
        ids = {s.span_id for s in chosen if s.name == "briq execution"}
        grown = True
        while grown:
            below = [s for s in in_trace if s.parent_span_id in ids and s.span_id not in ids]
            ids |= {s.span_id for s in below}
            chosen += below
            grown = bool(below)
        return chosen

    spans = of_step(
        otlp.wait_for(
            lambda spans: any(s.name == "execution" for s in of_step(spans)),
            timeout=60,
            what="operator span of the agent's step",
        )
    )
    by_name = {}
    for span in spans:
        assert span.name not in by_name, f"two {span.name!r} spans below one Execution"
        by_name[span.name] = span
    exec_call = "briq briq_exec"
    parents = {
        "briq execution": "agent step",
        "execution": "briq execution",
        "queued": "execution",
        "read queue": "execution",
        "check sandbox": "execution",
        "record attempt": "execution",
        "run code": "execution",
        "write result": "execution",
        exec_call: "run code",
        "kernel": exec_call,
    }
    # Only where they happen: the LIST that confirms a turn while the operator's cache lags, and
    # the `Running` write of an action that outlasts 100 ms (a shorter one's is folded into its
    # result write).
    optional = {"read queue", "record attempt"}
    for name, parent in parents.items():
        if name in optional and name not in by_name:
            continue
        assert name in by_name, f"no {name!r} span in the trace: {sorted(by_name)}"
        assert by_name[name].parent_span_id == by_name[parent].span_id, f"{name} under {parent}"
    assert by_name["agent step"].service == "agent-tests"
    assert by_name["briq execution"].service == "agent-tests"
    assert by_name["execution"].service == "briq-operator"
    assert by_name["execution"].attributes["briq.execution"] == executor.last_execution
    assert by_name["execution"].attributes["briq.reason"] == "FinalAnswer"
    assert by_name[exec_call].attributes["briq.request_id"]
    # Each step in its parent's time, in the order they happened (`record attempt` comes before
    # the run or beside it).
    steps = ["queued", "check sandbox", "run code", "write result"]
    starts = [by_name[name].start_ns for name in steps]
    assert starts == sorted(starts), steps
    for name, parent in parents.items():
        if name not in by_name:
            continue
        if by_name[parent].service == by_name[name].service:
            assert by_name[parent].start_ns <= by_name[name].start_ns, name
            assert by_name[name].end_ns <= by_name[parent].end_ns, name


def test_an_executors_provisioning_is_a_trace_of_its_own(shared_executor, otlp):
    def provisioning(spans):
        return [
            s
            for s in spans
            if s.name == "provision executor"
            and s.attributes.get("briq.executor") == shared_executor.executor_name
        ]

    spans = otlp.wait_for(lambda spans: provisioning(spans), timeout=60, what="provisioning trace")
    (root,) = provisioning(spans)
    assert root.parent_span_id == "" and root.service == "briq-operator"
    children = {s.name: s for s in spans if s.parent_span_id == root.span_id}
    assert set(children) == {"create sandbox", "set up bridge and kernel"}
    calls = [
        s.name for s in spans if s.parent_span_id == children["set up bridge and kernel"].span_id
    ]
    assert "briq briq_exec" in calls, calls


def test_a_failed_action_is_marked_failed_in_its_trace_by_the_client_and_the_operator(
    executor, otlp
):
    """A platform engineer looks for the failed steps: the client span names its Execution and
    is an error, and the operator's span below it says why."""
    with pytest.raises(CodeExecutionError):
        executor.run_code_raise_errors("1 / 0")
    name = executor.last_execution

    def found(spans):
        client = [
            s
            for s in spans
            if s.name == "briq execution" and s.attributes.get("briq.execution") == name
        ]
        operator = [
            s
            for s in spans
            if s.name == "execution" and client and s.parent_span_id == client[0].span_id
        ]
        return (client[0], operator[0]) if operator else None

    otlp.wait_for(lambda spans: found(spans) is not None, timeout=60, what="the failed step")
    client, operator = found(otlp.spans)
    assert client.error and operator.error
    assert operator.attributes["briq.reason"] == "CodeError"
