"""`KubernetesExecutor.fork`: new BriqExecutors (`spec.forkFrom`) whose kernels start with the
source's Python state and working files, against the real kube-apiserver, operator and local
sandbox server."""

from __future__ import annotations

import time

import pytest
from kubernetes.client.rest import ApiException
from smolagents import CodeAgent
from smolagents.monitoring import LogLevel

from briq_dev.scripted_model import ScriptedModel, action
from briq_operator_client import (
    ExecutorClosedError,
    ExecutorNotReadyError,
    ExecutorUnusableError,
    KubernetesExecutor,
    KubernetesExecutorError,
)

from .conftest import NO_NETWORK_ENV, new_executor, quiet

GROUP, VERSION = "briq.cloud", "v1alpha1"
FORKED_FROM = "briq.cloud/forked-from"
WAIT = 120  # seconds, for anything that should take well under one


def executor_object(custom_objects, name: str, namespace: str = "default") -> dict:
    return custom_objects.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "briqexecutors", name
    )


def forks_of(custom_objects, source: str, namespace: str = "default") -> list[str]:
    """The names of the BriqExecutors labelled as forks of `source`."""
    items = custom_objects.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "briqexecutors", label_selector=f"{FORKED_FROM}={source}"
    )["items"]
    return [item["metadata"]["name"] for item in items]


def run_agent(executor: KubernetesExecutor, code: str):
    """One CodeAgent run whose only step is `code`."""
    agent = CodeAgent(
        tools=[],
        model=ScriptedModel([action("Run it.", code)]),
        executor=executor,
        max_steps=2,
        verbosity_level=LogLevel.OFF,
    )
    return agent.run("Run the code.")


def test_three_forks_each_start_with_the_state_and_diverge(kubeconfig, custom_objects):
    source = new_executor(kubeconfig, executor_spec={"env": NO_NETWORK_ENV}, timeout_seconds=20)
    forks: list[KubernetesExecutor] = []
    try:
        assert run_agent(source, "x = 41\nsteps = ['a']\nfinal_answer(x)") == 41
        source.run_code_raise_errors(
            "def double(v):\n    return 2 * v\n"
            "numbers = (i for i in range(3))\n"  # a generator cannot be saved
            "with open('note.txt', 'w') as f:\n    f.write('kept')"
        )

        forks = source.fork(3)

        assert len({fork.executor_name for fork in forks}) == 3
        for fork in forks:
            assert fork.executor_name.startswith(f"{source.executor_name}-fork-")
            assert (fork.namespace, fork.timeout_seconds, fork.logger) == (
                "default",
                20,
                source.logger,
            )
            assert fork.owns_executor and fork.live_output == source.live_output
            obj = executor_object(custom_objects, fork.executor_name)
            assert obj["metadata"]["labels"][FORKED_FROM] == source.executor_name
            assert "ownerReferences" not in obj["metadata"]  # a fork outlives its source
            assert obj["spec"]["forkFrom"] == {"name": source.executor_name}
            assert obj["spec"]["env"] == NO_NETWORK_ENV
            origin = obj["status"]["fork"]
            assert origin["from"] == source.executor_name and origin["restoredTime"]
            unsaved = {u["name"]: u["why"] for u in origin["unsaved"]}
            assert "generator" in unsaved["numbers"], unsaved
            assert "x" not in unsaved and "double" not in unsaved
            state = fork.run_code_raise_errors("x, steps, double(x), open('note.txt').read()")
            assert state.output == "(41, ['a'], 82, 'kept')"
            assert fork.run_code_raise_errors("'numbers' in globals()").output == "False"

        assert run_agent(forks[0], "x = 1\nsteps.append('b')\nfinal_answer(x)") == 1
        forks[1].run_code_raise_errors("with open('note.txt', 'w') as f:\n    f.write('changed')")
        assert forks[0].run_code_raise_errors("x, steps").output == "(1, ['a', 'b'])"
        assert forks[1].run_code_raise_errors("open('note.txt').read()").output == "'changed'"
        for other in (source, forks[2]):
            seen = other.run_code_raise_errors("x, steps, open('note.txt').read()")
            assert seen.output == "(41, ['a'], 'kept')"

        source.cleanup()
        assert forks[2].run_code_raise_errors("x + 1").output == "42"
    finally:
        source.cleanup()
        for fork in forks:
            fork.cleanup()
    assert forks_of(custom_objects, source.executor_name) == []


def test_a_fork_count_out_of_range_creates_nothing(executor, custom_objects):
    for n in (0, -1, 101, True, 2.0):
        with pytest.raises(ValueError, match="1 to 100"):
            executor.fork(n)
    assert forks_of(custom_objects, executor.executor_name) == []
    assert executor.run_code_raise_errors("1 + 1").output == "2"


def test_a_closed_or_unusable_executor_forks_nothing(shared_executor, kubeconfig, custom_objects):
    closed = KubernetesExecutor(
        [], quiet(), executor_name=shared_executor.executor_name, kubeconfig=kubeconfig
    )
    closed.cleanup()
    with pytest.raises(ExecutorClosedError):
        closed.fork()
    assert forks_of(custom_objects, shared_executor.executor_name) == []

    with new_executor(kubeconfig, executor_spec={"env": NO_NETWORK_ENV}, timeout_seconds=2) as spun:
        with pytest.raises(ExecutorUnusableError):
            spun.run_code_raise_errors("while True:\n    pass")
        with pytest.raises(ExecutorUnusableError, match="create a new BriqExecutor"):
            spun.fork(2)
        assert forks_of(custom_objects, spun.executor_name) == []


def test_a_refused_fork_raises_with_its_reason_and_leaves_no_fork(kubeconfig, custom_objects):
    # A claimer of a pool that does not exist makes a sandbox of its own at once, and a pool
    # member or claimer is never forked: a refusal every time.
    with new_executor(
        kubeconfig, pool="no-such-pool", executor_spec={"env": NO_NETWORK_ENV}
    ) as claimer:
        unwaited = claimer.fork(2, wait=False)
        try:
            assert len(unwaited) == 2
            with pytest.raises(ExecutorNotReadyError) as refused:
                unwaited[0].wait_ready(WAIT)
            assert refused.value.reason == "ForkRefused"
        finally:
            for fork in unwaited:
                fork.cleanup()

        with pytest.raises(ExecutorNotReadyError, match="pool member or takes one") as raised:
            claimer.fork(2, timeout=WAIT)
        assert raised.value.reason == "ForkRefused"
        assert forks_of(custom_objects, claimer.executor_name) == []
        assert claimer.run_code_raise_errors("1 + 1").output == "2"


def test_a_create_refused_part_way_deletes_the_forks_made_and_names_the_count(
    executor, custom_objects
):
    """The API server refuses the third create (as a ResourceQuota or an admission policy would;
    injected here, since a quota's own count settles only eventually)."""
    executor.run_code_raise_errors("x = 41")
    create = executor._api.create_namespaced_custom_object
    made = []

    def refuse_the_third(group, version, namespace, plural, body, **kwargs):
        if plural == "briqexecutors" and len(made) == 2:
            raise ApiException(status=403, reason="Forbidden: exceeded quota: executors")
        created = create(group, version, namespace, plural, body, **kwargs)
        made.append(created["metadata"]["name"])
        return created

    executor._api.create_namespaced_custom_object = refuse_the_third
    try:
        with pytest.raises(KubernetesExecutorError, match="created 2 of 3 forks") as raised:
            executor.fork(3)
    finally:
        executor._api.create_namespaced_custom_object = create
    assert raised.value.status == 403
    assert "exceeded quota" in str(raised.value)
    assert len(made) == 2
    deadline = time.monotonic() + WAIT
    while forks_of(custom_objects, executor.executor_name):
        assert time.monotonic() < deadline, "the forks made were not deleted"
        time.sleep(0.1)
    # The source is untouched, and forks again.
    assert executor.run_code_raise_errors("x + 1").output == "42"
    [fork] = executor.fork(1)
    with fork:
        assert fork.run_code_raise_errors("x").output == "41"
