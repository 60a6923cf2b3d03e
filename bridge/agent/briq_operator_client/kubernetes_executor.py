"""A smolagents 1.26 remote executor whose actions run as briq-operator `Execution` objects.

    from smolagents import CodeAgent
    from briq_operator_client import KubernetesExecutor

    with KubernetesExecutor(executor_name="py") as executor:  # an existing, Ready BriqExecutor
        agent = CodeAgent(tools=[], model=model, executor=executor)
        agent.run("Calculate the first 20 Fibonacci numbers.")

Each action (agent step, tool definitions, variables, package installs) becomes one `Execution`
(`generateName: <executor>-`) in the executor's namespace; the result is read from its status,
waiting on a watch (never polling) until its `Succeeded` condition leaves `Unknown`. Python state
lives in the executor's kernel and survives across actions. Nothing is evaluated on the host:
final answers are decoded with smolagents' own safe deserializer, pickle is never allowed.

How failures surface:
- code that raises: `CodeExecutionError`, an `AgentExecutionError` (smolagents' `AgentError`
  family, as `DockerExecutor`, `ModalExecutor` and `E2BExecutor` raise) whose `str()` is the
  kernel's traceback text, logged as an error when raised; the logs printed before it are also
  kept where the agent looks for them (`state["_print_outputs"]`), so the model sees both.
- a final answer the sandbox refuses (pickle, no `safe:` prefix, an array or an image, too
  large): `FinalAnswerRejectedError`, both a `CodeExecutionError` and smolagents'
  `SerializationError` (what theirs raise for a pickled or unprefixed answer).
- an executor that can never run code again (a timeout, an outcome briq never told, a malformed
  answer, a lost kernel, an interrupted action, a deleted executor): `ExecutorUnusableError`. It
  derives from `BaseException` on purpose: smolagents turns every `Exception` of an action into a
  message for the model and keeps going, which here would only replay code against a dead
  executor. It stops `agent.run()` instead; create a new executor. briq failing to answer for a
  while is not such a case: the operator learns the outcome from the sandbox's journal once briq
  answers again (`WaitingForBriq`), and this client waits meanwhile.
- anything else the cluster refuses (RBAC, a missing CRD, an invalid object, a full queue):
  `KubernetesExecutorError`.

Live output: while a step's Execution runs, what its code prints is relayed to the executor's
logger as it comes (`live_output=True`), read from the operator's aggregated API
(`executions/{name}/log` in `subresources.briq.cloud`). It is a view only: the step's result
still comes from the status, and without that API (an older operator, no RBAC for
`executions/log`) or when the stream breaks, steps run exactly as without it.
`stream_output()` reads the same stream for other callers.

Forking: `fork(n)` makes n new BriqExecutors (`spec.forkFrom`) whose kernels start with this
executor's Python state and working files, and returns a KubernetesExecutor on each: agents that
explore from a common point without redoing its steps.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from rich.text import Text
from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.serialization import SerializationError
from smolagents.utils import AgentExecutionError

# spec.code's and spec.timeoutSeconds' limits in the CRD, BriqExecutor
# spec.executionTimeoutSeconds' default, and the reasons after which the executor is unusable.
from ._trace import execution_span
from .vocabulary import (
    DEFAULT_TIMEOUT_SECONDS,
    MAX_CODE_CHARS,
    MAX_TIMEOUT_SECONDS,
    UNUSABLE_REASONS,
)

__all__ = [
    "CodeExecutionError",
    "ExecutionCancelledError",
    "ExecutorClosedError",
    "ExecutorNotFoundError",
    "ExecutorNotReadyError",
    "ExecutorUnusableError",
    "FinalAnswerRejectedError",
    "KubernetesExecutor",
    "KubernetesExecutorError",
]

GROUP = "briq.cloud"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
EXECUTORS = "briqexecutors"
EXECUTIONS = "executions"
ACTION_LABEL = "briq.cloud/action-id"
# What `kubectl briq fork` puts on a fork (its source's name) and the most forks one call makes.
FORKED_FROM_LABEL = "briq.cloud/forked-from"
MAX_FORKS = 100

# Waiting for a result: the action's own deadline plus this, for queueing, the operator's
# reconcile and the sandbox round trips. Past it the executor's state is uncertain.
RESULT_SLACK_SECONDS = 60.0
# pip inside an action: the subprocess gets less than the action's deadline, so a slow install
# fails as a code error instead of timing out (which would make the executor unusable).
PIP_ACTION_TIMEOUT_SECONDS = MAX_TIMEOUT_SECONDS
PIP_SUBPROCESS_TIMEOUT_SECONDS = 34

# The operator's aggregated API, served through kube-apiserver (absent before it, or turned off):
# an Execution's output, one JSON object a line with `format=json` ({"stream", "text"}, at most
# one {"cut"}, last {"end"}).
SUBRESOURCES_GROUP = "subresources.briq.cloud"
SUBRESOURCES_VERSION = "v1alpha1"
LOG_PATH = "/apis/{group}/{version}/namespaces/{namespace}/executions/{name}/log"
# After a step's result: how long its live output may take to finish on the logger.
LIVE_JOIN_SECONDS = 2.0
# How stderr's live text is shown (stdout's is plain).
LIVE_STDERR_STYLE = "red"


class KubernetesExecutorError(RuntimeError):
    """The cluster refused or failed a request; the executor itself may still be fine.

    A `RuntimeError`, as DockerExecutor's and BlaxelExecutor's failures to start are."""

    #: The HTTP status the API server answered, where one is the cause (`stream_output`,
    #: `fork`).
    status: int | None = None


class ExecutorNotFoundError(KubernetesExecutorError):
    """The named BriqExecutor does not exist in the namespace."""


class ExecutorNotReadyError(KubernetesExecutorError):
    """The BriqExecutor cannot become Ready (setup failed, unusable, being deleted, no API
    key, a refused or failed fork) or did not within the wait: create a new one or fix its
    spec."""

    #: The reason of its `Stalled` condition (`SetupFailed`, `ForkRefused`, ...), or of its
    #: `Ready` condition when the wait ran out; None when it is being deleted.
    reason: str | None = None


class ExecutorClosedError(KubernetesExecutorError):
    """`cleanup()` (or `delete()`, or leaving the `with` block) closed this KubernetesExecutor:
    it runs nothing more, like smolagents' executors after theirs. A BriqExecutor it was given
    by name is still there for a new KubernetesExecutor."""


class ExecutorUnusableError(BaseException):
    """The BriqExecutor can never run code again: create a new one.

    A `BaseException` (like smolagents' own `FinalAnswerException`) so that it ends
    `agent.run()` rather than being shown to the model as one more error to retry.
    """

    def __init__(
        self,
        executor: str,
        namespace: str,
        reason: str,
        detail: str,
        execution: str | None = None,
        logs: str = "",
    ):
        self.executor = executor
        self.namespace = namespace
        self.reason = reason
        self.detail = detail
        self.execution = execution
        self.logs = logs
        where = f" (Execution {execution})" if execution else ""
        super().__init__(
            f"BriqExecutor {namespace}/{executor} is unusable{where}: {reason}: "
            f"{detail.rstrip('.')}. "
            "Its Python state is lost or uncertain and it will not run code again: "
            "create a new BriqExecutor (and a new KubernetesExecutor) and start over."
        )


class CodeExecutionError(AgentExecutionError):
    """The action's code raised (or returned a final answer that was rejected).

    An `AgentExecutionError`, like the `AgentError` smolagents' remote executors raise for a code
    error: `str()` is the kernel's traceback text (what the model sees after "Error:"), and the
    error is logged through the executor's logger when raised. The logs printed before it are in
    `logs` (and in the executor's `state["_print_outputs"]`, where CodeAgent looks for them).
    """

    def __init__(
        self,
        text: str,
        logger: AgentLogger,
        *,
        name: str,
        message: str,
        traceback: str,
        logs: str,
        execution: str,
    ):
        super().__init__(text, logger)
        self.name = name
        self.traceback = traceback
        self.logs = logs
        self.execution = execution
        # AgentError keeps its text in `message`; the exception's own message is `error_message`.
        self.error_message = message


class FinalAnswerRejectedError(CodeExecutionError, SerializationError):
    """The final answer was refused: pickled, without the `safe:` prefix, too large, or holding
    an array or an image (never reconstructed on the host). Also a smolagents
    `SerializationError`, which is what their executors raise for a pickled answer."""


class ExecutionCancelledError(CodeExecutionError):
    """The action was cancelled (`KubernetesExecutor.cancel`, `kubectl briq cancel`, or its
    Execution deleted while it ran). `name` is `Cancelled` when the code never ran or was
    interrupted and the kernel kept its Python state, `KernelRestarted` when the code ignored
    the interrupt and a new kernel (without the old state) took its place. The executor stays
    usable either way; the model sees the message like any error of its code."""


# Failed Executions whose code ran and raised: the model's business. Every other failure that
# does not make the executor unusable (a full queue, ...) means the code did not run.
CODE_ERROR_REASONS = {
    "CodeError": CodeExecutionError,
    "FinalAnswerRejected": FinalAnswerRejectedError,
    "Cancelled": ExecutionCancelledError,
}


def _condition(obj: dict | None, type_: str) -> dict | None:
    for condition in ((obj or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_:
            return condition
    return None


def _is_patched_final_answer(tool: Any) -> bool:
    """Whether `tool` is a final_answer tool already patched to raise FinalAnswerException
    (by us, or by any smolagents remote executor)."""
    forward = getattr(type(tool), "forward", None)
    return getattr(type(tool), "_briq_final_answer_patched", False) or (
        "FinalAnswerException" in getattr(forward, "__source__", "")
    )


def _requirements(packages: list[str]) -> list[tuple[str | None, str]]:
    """(module to look for, pip requirement) pairs for a smolagents-style package list: tool
    requirements are top-level module names, authorized imports may be `pkg.*` or `*`, and
    `PIL` is `pillow` (smolagents passes `pillow`). A requirement with a version or extras has
    no module to look for."""
    pairs: list[tuple[str | None, str]] = []
    for package in packages:
        name = package.strip().removesuffix(".*")
        if not name or name == "*":
            continue
        if name.replace(".", "_").isidentifier():
            module = name.split(".")[0]  # a submodule: its top-level package
            module = "PIL" if module.lower() == "pillow" else module  # smolagents renames it
            pair = (module, "pillow" if module == "PIL" else module)
        else:
            pair = (None, name)
        if pair not in pairs:
            pairs.append(pair)
    return pairs


# Runs in the kernel: pip-installs what is not importable yet. A plain module name that is
# importable is not given to pip at all (its pip name may differ, and pip may be offline).
PIP_CODE = """
def _briq_install(requirements):
    import importlib, importlib.util, subprocess, sys

    needed = [r for m, r in requirements if m is None or importlib.util.find_spec(m) is None]
    if not needed:
        print("already importable:", ", ".join(m for m, _ in requirements))
        return
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
         "--progress-bar", "off", *needed],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=%(timeout)d,
    )
    print(done.stdout[-4000:], end="")
    if done.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(needed)} failed (exit {done.returncode})")
    importlib.invalidate_caches()

_briq_install(%(requirements)r)
del _briq_install
"""


def _api_client(kubeconfig: str | None) -> client.ApiClient:
    """An API client from `kubeconfig`, else the in-cluster service account, else the default
    kubeconfig (`$KUBECONFIG` or `~/.kube/config`)."""
    if kubeconfig is None:
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        except config.ConfigException:
            pass
    return config.new_client_from_config(config_file=kubeconfig, persist_config=False)


def _fork_spec(source: dict) -> dict:
    """The spec of a fork of `source`, as `kubectl briq fork` makes it: the source's own (its
    class or key, image and limits), without what a fork never takes (a pool to claim from, a
    suspension), with `forkFrom`."""
    spec = {
        key: value
        for key, value in (source.get("spec") or {}).items()
        if key not in ("poolRef", "suspend")
    }
    spec["forkFrom"] = {"name": source["metadata"]["name"]}
    return spec


def _claim_env_var(name: str, value: str | dict[str, str]) -> dict[str, Any]:
    """One `spec.poolRef.env` entry: a value, or `{"secret": NAME, "key": KEY}`."""
    if isinstance(value, str):
        return {"name": name, "value": value}
    if isinstance(value, dict) and set(value) == {"secret", "key"}:
        reference = {"name": value["secret"], "key": value["key"]}
        return {"name": name, "valueFrom": {"secretKeyRef": reference}}
    raise ValueError(f'pool_env[{name!r}] must be a string or {{"secret": NAME, "key": KEY}}')


class KubernetesExecutor(RemotePythonExecutor):
    """smolagents remote executor backed by a briq-operator `BriqExecutor`.

    Args:
        additional_imports: packages to pip-install in the sandbox before the first action
            (smolagents' convention; `pkg.*` and `*` entries are reduced to installable names).
            Prefer the BriqExecutor's `spec.packages` for anything slow to install: an action
            has at most 40 s.
        logger: a smolagents `AgentLogger` (default: one at INFO level).
        allow_pickle: only `False`, smolagents' default: the operator refuses pickled final
            answers and variables are never pickled (`True` raises `ValueError`).
        executor_name: the BriqExecutor to use. With `create_executor=True`, the name to create
            (default: a generated `agent-xxxxx`).
        namespace: namespace of the BriqExecutor and of the Executions.
        kubeconfig: path of a kubeconfig; when omitted, the in-cluster service account, else
            `$KUBECONFIG` / `~/.kube/config`.
        timeout_seconds: deadline of each action (1 to 40); default: the executor's
            `executionTimeoutSeconds`. An action that runs past it makes the executor unusable.
        create_executor: create a BriqExecutor and own it: `cleanup()` (or leaving the `with`
            block, or the agent's own cleanup) deletes it, which destroys its sandbox.
        executor_spec: spec of the created BriqExecutor (default `{}`: the operator's defaults).
        pool: name of a BriqExecutorPool: create a BriqExecutor (as `create_executor=True`)
            that takes a Ready member's sandbox and live kernel, Ready in milliseconds instead of
            a cold start; without a Ready member it creates its own sandbox after the pool's
            wait (`spec.poolRef.coldCreateAfterSeconds`).
        pool_env: with `pool`, environment variables of the claimed kernel
            (`spec.poolRef.env`), delivered at the claim without a cold start: a name to a
            value, or to `{"secret": NAME, "key": KEY}` for a key of a Secret in `namespace`
            labelled `briq.cloud/claim-env: "true"` (the value never appears in any object).
        ready_timeout: how long to wait for the BriqExecutor to be Ready, in seconds.
        api_client: a `kubernetes.client.ApiClient` to use instead of loading a configuration.
        live_output: while a step runs, relay what its code prints to `logger` as it comes (at
            INFO, so not when the logger is quieter; stderr in red), from the operator's
            aggregated API. A view only: the step's result is the same without it, and where
            the API is not served or not allowed (403/404) the executor stops asking and runs
            steps as before.

    One executor serves one agent; calls are serialized.
    """

    def __init__(
        self,
        additional_imports: list[str] | None = None,
        logger: AgentLogger | None = None,
        allow_pickle: bool = False,
        *,
        executor_name: str | None = None,
        namespace: str = "default",
        kubeconfig: str | None = None,
        timeout_seconds: int | None = None,
        create_executor: bool = False,
        executor_spec: dict | None = None,
        pool: str | None = None,
        pool_env: dict[str, str | dict[str, str]] | None = None,
        ready_timeout: float = 300.0,
        api_client: client.ApiClient | None = None,
        live_output: bool = True,
    ):
        if allow_pickle:
            raise ValueError(
                "allow_pickle=True is not supported: briq-operator refuses pickled final answers"
            )
        if pool_env and pool is None:
            raise ValueError("pool_env needs pool: only a claim takes a per-claim environment")
        if pool is not None:
            create_executor = True
            pool_ref: dict[str, Any] = {"name": pool}
            if pool_env:
                pool_ref["env"] = [_claim_env_var(n, v) for n, v in pool_env.items()]
            executor_spec = {**(executor_spec or {}), "poolRef": pool_ref}
        if executor_name is None and not create_executor:
            raise ValueError("executor_name is required unless create_executor=True")
        if timeout_seconds is not None and not 1 <= timeout_seconds <= MAX_TIMEOUT_SECONDS:
            raise ValueError(f"timeout_seconds must be 1 to {MAX_TIMEOUT_SECONDS}")
        super().__init__(
            list(additional_imports or []),
            logger if logger is not None else AgentLogger(level=LogLevel.INFO),
            allow_pickle=False,
        )
        self._configure(
            namespace,
            client.CustomObjectsApi(api_client or _api_client(kubeconfig)),
            timeout_seconds,
            create_executor,
            live_output,
        )

        if create_executor:
            body = {
                "apiVersion": API_VERSION,
                "kind": "BriqExecutor",
                "metadata": {"name": executor_name}
                if executor_name
                else {"generateName": "agent-"},
                "spec": dict(executor_spec or {}),
            }
            created = self._create_executor("creating a BriqExecutor", namespace, body)
            executor_name = created["metadata"]["name"]
            self.logger.log(
                f"Created BriqExecutor {namespace}/{executor_name}", level=LogLevel.INFO
            )
        self.executor_name: str = executor_name
        try:
            self.wait_ready(ready_timeout)
            if self.additional_imports:
                self.installed_packages = self.install_packages(self.additional_imports)
        except BaseException:
            self.cleanup()  # deletes what it created; logs, never raises
            raise

    def _configure(
        self,
        namespace: str,
        api: client.CustomObjectsApi,
        timeout_seconds: int | None,
        owns_executor: bool,
        live_output: bool,
    ) -> None:
        """Sets what every KubernetesExecutor holds besides smolagents' own attributes and its
        BriqExecutor's name."""
        self.namespace = namespace
        self.timeout_seconds = timeout_seconds
        self.owns_executor = owns_executor
        # What the agent shows as logs when an action fails (see CodeAgent._step_stream).
        self.state: dict[str, Any] = {"_print_outputs": ""}
        self._api = api
        self._lock = threading.RLock()
        self._unusable: ExecutorUnusableError | None = None
        self._closed = False
        self._deleted = False
        self._executor_timeout = DEFAULT_TIMEOUT_SECONDS
        self._executor_uid: str | None = None
        #: Name of the latest Execution this executor created.
        self.last_execution: str | None = None
        # The Execution the current step waits on, for `cancel` from another thread.
        self._running: str | None = None
        self.live_output = live_output
        # Why live output stopped for good (the API not served, or not allowed), once it did.
        self._live_unavailable: str | None = None

    # --- context manager -------------------------------------------------------------------

    def __enter__(self) -> KubernetesExecutor:
        return self

    def __exit__(self, *exc_info) -> None:
        self.cleanup()

    # --- the executor contract --------------------------------------------------------------

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """Runs `code` as one Execution and maps its status to a `CodeOutput`."""
        with self._lock:
            self._check_usable()
            if not code:
                # What a kernel answers for empty code; an Execution needs at least a character.
                self.state["_print_outputs"] = ""
                return CodeOutput(output=None, logs="", is_final_answer=False)
            if len(code) > MAX_CODE_CHARS:
                raise KubernetesExecutorError(
                    f"the action is {len(code)} characters; an Execution takes at most "
                    f"{MAX_CODE_CHARS}"
                )
            self.state["_print_outputs"] = ""
            timeout = self.timeout_seconds or self._executor_timeout
            return self._run(code, self.timeout_seconds, timeout + RESULT_SLACK_SECONDS)

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """pip-installs packages in the sandbox, through an Execution, and returns
        `additional_imports`. As RemotePythonExecutor's `!pip install`, a failed install raises
        nothing: pip's output is logged (and the error), and an import of the package fails
        later in the kernel, where the model sees it. Only an unusable or closed executor
        raises."""
        requirements = _requirements(additional_imports)
        if requirements:
            with self._lock:
                self._check_usable()
                names = ", ".join(requirement for _, requirement in requirements)
                self.logger.log(f"Installing {names} (when missing)", level=LogLevel.INFO)
                code = PIP_CODE % {
                    "timeout": PIP_SUBPROCESS_TIMEOUT_SECONDS,
                    "requirements": requirements,
                }
                try:
                    output = self._run(
                        code,
                        PIP_ACTION_TIMEOUT_SECONDS,
                        PIP_ACTION_TIMEOUT_SECONDS + RESULT_SLACK_SECONDS,
                    )
                except CodeExecutionError as error:  # logged as an error already
                    self.logger.log(error.logs)
                else:
                    self.logger.log(output.logs)
        return list(additional_imports)

    def _patch_final_answer_with_exception(self, final_answer_tool) -> None:
        # smolagents 1.26 patches again on every agent.run(); the second patch wraps the patched
        # forward, whose source then refers to the closure variable `allow_pickle_setting` and
        # every later final_answer() fails with NameError in the kernel. Patch once.
        if _is_patched_final_answer(final_answer_tool):
            return
        super()._patch_final_answer_with_exception(final_answer_tool)
        type(final_answer_tool)._briq_final_answer_patched = True

    def cleanup(self) -> None:
        """Closes this executor: later calls raise `ExecutorClosedError`. When it created its
        BriqExecutor, deletes it (its finalizer destroys the sandbox) and waits until it is gone;
        an executor given by name is left alone. Like smolagents' executors, a failure is logged,
        never raised; calling again retries the deletion."""
        self._closed = True
        if not self.owns_executor or self._deleted:
            return
        with self._lock:
            name = getattr(self, "executor_name", None)
            if name is None or self._deleted:
                return
            what = f"deleting BriqExecutor {self.namespace}/{name}"
            self.logger.log(f"Deleting BriqExecutor {self.namespace}/{name}", level=LogLevel.INFO)
            try:
                self._api.delete_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, EXECUTORS, name
                )
            except ApiException as error:
                if error.status != 404:
                    self.logger.log_error(f"Error during cleanup: {what}: {error}")
                    return
            except urllib3.exceptions.HTTPError as error:
                self.logger.log_error(f"Error during cleanup: {what}: {error}")
                return
            try:
                self._wait(
                    EXECUTORS,
                    name,
                    None,
                    time.monotonic() + 120,
                    lambda obj: True if obj is None else None,
                    "deletion",
                )
            except (_DeadlinePassed, KubernetesExecutorError) as error:
                late = isinstance(error, _DeadlinePassed)
                detail = "it was not gone within 120 s" if late else str(error)
                self.logger.log_error(
                    f"Error during cleanup: {what}: {detail} (its finalizer destroys the sandbox "
                    "first); call cleanup() again to keep waiting"
                )
                return
            self._deleted = True
            self.logger.log(f"Deleted BriqExecutor {self.namespace}/{name}", level=LogLevel.INFO)

    delete = cleanup

    def _check_usable(self) -> None:
        if self._closed:
            raise ExecutorClosedError(
                f"this KubernetesExecutor (BriqExecutor {self.namespace}/{self.executor_name}) "
                "was closed by cleanup(); create a new one"
            )
        if self._unusable is not None:
            raise self._unusable

    # --- readiness --------------------------------------------------------------------------

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Waits until the BriqExecutor reports Ready=True; raises when it cannot become ready."""
        name, namespace = self.executor_name, self.namespace
        last: dict = {}

        def check(obj: dict | None):
            if obj is None:
                raise ExecutorNotFoundError(
                    f"BriqExecutor {name} not found in namespace {namespace}"
                )
            last["obj"] = obj
            if (obj.get("metadata") or {}).get("deletionTimestamp"):
                raise ExecutorNotReadyError(
                    f"BriqExecutor {namespace}/{name} is being deleted; create a new BriqExecutor"
                )
            stalled = _condition(obj, "Stalled")
            if stalled and stalled.get("status") == "True":
                error = ExecutorNotReadyError(
                    f"BriqExecutor {namespace}/{name} cannot become ready "
                    f"({stalled.get('reason', 'Stalled')}: {stalled.get('message', '')}); "
                    "create a new BriqExecutor"
                )
                error.reason = stalled.get("reason") or "Stalled"
                raise error
            ready = _condition(obj, "Ready")
            return True if ready and ready.get("status") == "True" else None

        self.logger.log(
            f"Waiting for BriqExecutor {namespace}/{name} to be Ready", level=LogLevel.INFO
        )
        try:
            self._wait(EXECUTORS, name, None, time.monotonic() + timeout, check, "Ready")
        except _DeadlinePassed:
            ready = _condition(last.get("obj"), "Ready") or {}
            error = ExecutorNotReadyError(
                f"BriqExecutor {namespace}/{name} was not Ready within {timeout:.0f} s "
                f"({ready.get('reason', 'no status')}: {ready.get('message', '')})"
            )
            error.reason = ready.get("reason")
            raise error from None
        spec = (last.get("obj") or {}).get("spec") or {}
        self._executor_timeout = int(spec.get("executionTimeoutSeconds") or DEFAULT_TIMEOUT_SECONDS)
        self._executor_uid = ((last.get("obj") or {}).get("metadata") or {}).get("uid")

    # --- forking ----------------------------------------------------------------------------

    def fork(
        self, n: int = 1, *, wait: bool = True, timeout: float = 300.0
    ) -> list[KubernetesExecutor]:
        """Makes `n` forks (1 to 100) of this executor's BriqExecutor and returns a new
        KubernetesExecutor on each, configured as this one (namespace, API client, logger,
        `timeout_seconds`, `live_output`, the packages already installed).

        Each fork is a BriqExecutor of its own, `<source>-fork-xxxxx`, labelled
        `briq.cloud/forked-from: <source>`, with this one's spec (class or key, image, size,
        packages, env, timeouts, ...) but no `poolRef` or `suspend`, and `spec.forkFrom`. Its
        kernel starts with this one's Python namespace and the kernel user's working files
        (what pip installed there included), as they were between two actions; names that
        could not be saved (a generator, a lock, an open file) are missing, listed with why in
        the fork's `status.fork.unsaved`. This executor pauses while it saves (`Ready` False,
        reason `Forking`: its actions wait); one save serves every fork waiting then, so the
        forks of one call usually cost one. From then on each fork and this executor are
        independent: a change in one is seen by no other.

        Per-claim variables (`pool_env`) are never carried: a pool member, or an executor
        claimed from a pool (`pool=`), can neither fork nor be forked (`ForkRefused`).

        The forks belong to the returned executors: each one's `cleanup()` deletes its
        BriqExecutor, and none is deleted with this one (a fork outlives its source).

        With `wait`, returns once every fork is Ready, within `timeout` seconds for them all;
        without, at once (a fork's `wait_ready()` then waits for it before its first action).

        Raises, creating nothing: `ValueError` for `n` out of range; `ExecutorClosedError` or
        `ExecutorUnusableError` when this executor is closed or unusable;
        `ExecutorNotFoundError` when its BriqExecutor is gone. When a create is refused part way
        (a ResourceQuota, RBAC), the forks made so far are deleted and `KubernetesExecutorError`
        says how many had been created and why. With `wait`, when a fork cannot become Ready
        (reason `ForkRefused`, `ForkFailed`, ...) or is not Ready in time, every fork is
        deleted and its `ExecutorNotReadyError` is raised, with the fork's `reason`.
        """
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_FORKS:
            raise ValueError(f"n must be an integer from 1 to {MAX_FORKS}, not {n!r}")
        source_name, namespace = self.executor_name, self.namespace
        where = f"BriqExecutor {namespace}/{source_name}"
        with self._lock:
            self._check_usable()
            source = self._call(f"reading {where}", self._get, EXECUTORS, source_name)
            uid = ((source or {}).get("metadata") or {}).get("uid")
            if source is None or (self._executor_uid is not None and uid != self._executor_uid):
                raise ExecutorNotFoundError(f"{where} was deleted: there is nothing to fork")
            body = {
                "apiVersion": API_VERSION,
                "kind": "BriqExecutor",
                "metadata": {
                    "generateName": f"{source_name}-fork-",
                    "labels": {FORKED_FROM_LABEL: source_name},
                },
                "spec": _fork_spec(source),
            }
            forks: list[KubernetesExecutor] = []
            try:
                for _ in range(n):
                    created = self._create_executor(f"creating a fork of {where}", namespace, body)
                    forks.append(self._forked(created))
                    self.logger.log(
                        f"Created BriqExecutor {namespace}/{forks[-1].executor_name}, a fork of "
                        f"{source_name}",
                        level=LogLevel.INFO,
                    )
            except KubernetesExecutorError as error:
                raise self._fork_failure(error, forks, n) from error
            except BaseException:
                _discard(forks)
                raise
        if wait:
            deadline = time.monotonic() + timeout
            try:
                for fork in forks:
                    # At least a second each, so that a fork Ready by then is still seen Ready.
                    fork.wait_ready(max(deadline - time.monotonic(), 1.0))
            except BaseException as error:
                self.logger.log(
                    f"Deleting the {n} fork(s) of {where}: {error}", level=LogLevel.INFO
                )
                _discard(forks)
                raise
        return forks

    def _forked(self, created: dict) -> KubernetesExecutor:
        """A KubernetesExecutor configured as this one, on `created`: a fork of this one's
        BriqExecutor that it just made, hence its own; not waited on."""
        fork = type(self).__new__(type(self))
        RemotePythonExecutor.__init__(
            fork, list(self.additional_imports), self.logger, allow_pickle=False
        )
        fork._configure(self.namespace, self._api, self.timeout_seconds, True, self.live_output)
        # The fork's kernel has the source's working files, so what pip put there.
        fork.installed_packages = list(self.installed_packages)
        fork._live_unavailable = self._live_unavailable
        fork.executor_name = created["metadata"]["name"]
        fork._executor_uid = created["metadata"].get("uid")
        spec = created.get("spec") or {}
        fork._executor_timeout = int(spec.get("executionTimeoutSeconds") or DEFAULT_TIMEOUT_SECONDS)
        return fork

    def _fork_failure(
        self, error: KubernetesExecutorError, forks: list[KubernetesExecutor], n: int
    ) -> KubernetesExecutorError:
        """The error of a create that failed after `forks` were made, once they are deleted."""
        left = _discard(forks)
        if left:
            done = f"; {', '.join(left)} could not be deleted: delete them"
        elif forks:
            done = ", deleted again"
        else:
            done = ""
        cause = error.__cause__
        status = cause.status if isinstance(cause, ApiException) else None
        if status is None or status >= 500:
            # The request may have created one more that no answer named.
            done += (
                f" (the last create may have made a fork all the same: look for the label "
                f"{FORKED_FROM_LABEL}={self.executor_name})"
            )
        failure = KubernetesExecutorError(
            f"created {len(forks)} of {n} forks of BriqExecutor "
            f"{self.namespace}/{self.executor_name}{done}: {error}"
        )
        failure.status = status
        return failure

    # --- one action -------------------------------------------------------------------------

    def _run(self, code: str, timeout_seconds: int | None, wait_seconds: float) -> CodeOutput:
        # The action's client span; the operator's spans continue its trace.
        with execution_span(self.namespace, self.executor_name) as (span, annotations):
            before = self.last_execution
            try:
                return self._run_as_execution(code, timeout_seconds, wait_seconds, annotations)
            finally:
                # Named also when the action failed: those are the spans people look for.
                if span is not None and self.last_execution != before:
                    span.set_attribute("briq.execution", self.last_execution or "")

    def _run_as_execution(
        self,
        code: str,
        timeout_seconds: int | None,
        wait_seconds: float,
        annotations: dict[str, str],
    ) -> CodeOutput:
        deadline = time.monotonic() + wait_seconds
        action_id = uuid.uuid4().hex
        spec: dict[str, Any] = {"executorRef": {"name": self.executor_name}, "code": code}
        if timeout_seconds is not None:
            spec["timeoutSeconds"] = timeout_seconds
        metadata: dict[str, Any] = {
            "generateName": f"{self.executor_name}-",
            "labels": {ACTION_LABEL: action_id},
        }
        if annotations:
            metadata["annotations"] = dict(annotations)
        if self._executor_uid:
            # Part of the executor's history from the start (garbage collected with it): the
            # operator would otherwise add this with a write of its own.
            metadata["ownerReferences"] = [
                {
                    "apiVersion": API_VERSION,
                    "kind": "BriqExecutor",
                    "name": self.executor_name,
                    "uid": self._executor_uid,
                }
            ]
        body = {"apiVersion": API_VERSION, "kind": "Execution", "metadata": metadata, "spec": spec}
        created = self._create_execution(body, action_id)
        name = created["metadata"]["name"]
        self.last_execution = name
        self.logger.log(f"Execution {self.namespace}/{name} created", level=LogLevel.DEBUG)

        def check(obj: dict | None):
            if obj is None:
                return {"deleted": True}
            succeeded = _condition(obj, "Succeeded")
            if succeeded is None:
                return None
            if succeeded.get("status") in ("True", "False"):
                return obj
            if succeeded.get("reason") == "ExecutorNotFound":
                # It was Ready before: it has been deleted since.
                return {"deleted_executor": succeeded.get("message", "")}
            return None

        live = self._follow_live(name, wait_seconds)
        self._running = name
        try:
            result = self._wait(
                EXECUTIONS,
                name,
                created["metadata"].get("resourceVersion"),
                deadline,
                check,
                f"Execution {name} to finish",
                initial=created,
            )
        except KeyboardInterrupt:
            # The agent's process was interrupted (Ctrl-C) during the step: so is the step's
            # code, in its kernel, rather than left running on its own.
            with contextlib.suppress(Exception):
                self.cancel(name)
            raise
        except _DeadlinePassed:
            raise self._poison(
                "NoResult",
                f"Execution {name} reported no result within {wait_seconds:.0f} s; whether and "
                "when its code runs is unknown",
                name,
            ) from None
        finally:
            self._running = None
            if live is not None:
                live.finish(LIVE_JOIN_SECONDS)
        if "deleted" in result:
            raise self._poison(
                "ExecutionDeleted",
                f"Execution {name} was deleted before it reported a result; whether its code ran "
                "is unknown",
                name,
            )
        if "deleted_executor" in result:
            raise self._poison("ExecutorDeleted", result["deleted_executor"], name)
        return self._outcome(name, result)

    def cancel(self, execution: str | None = None) -> bool:
        """Cancels `execution` (default: the action running now, if any; safe to call from
        another thread while `run_code_raise_errors` waits): it never runs if it was not sent
        yet, else its code is interrupted in the kernel, which keeps its Python state. The
        step that ran it then raises `ExecutionCancelledError`. False when there was nothing
        to cancel (no action running, or the Execution is gone)."""
        name = execution or self._running
        if name is None:
            return False
        try:
            self._api.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                EXECUTIONS,
                name,
                {"spec": {"cancel": True}},
                _request_timeout=30,
            )
        except ApiException as error:
            if error.status == 404:
                return False
            raise KubernetesExecutorError(
                f"cancelling Execution {name}: {error.status} {error.reason}: {error.body}"
            ) from error
        self.logger.log(f"Execution {self.namespace}/{name} cancel requested", level=LogLevel.INFO)
        return True

    # --- live output ------------------------------------------------------------------------

    def stream_output(
        self, execution: str, follow: bool = True, *, read_timeout: float | None = None
    ) -> Iterator[tuple[str, str]]:
        """The output of Execution `execution` (in this executor's namespace) as
        `(stream, text)` pairs, `stream` being `"stdout"` or `"stderr"`, from the operator's
        aggregated API. With `follow`, pieces come while the action runs and the iterator ends
        with the action (its Succeeded reason is the generator's return value, for
        `yield from`); without it, what there is now. A running action relays its first 16,384
        characters live; after a cut the rest of what the status keeps comes once it ends, as
        stdout. A finished action's output is its status's logs, as one stdout piece.

        The request is made here: raises `KubernetesExecutorError` (its `status` 404 or 403)
        when the API is not served (an older operator) or the Execution does not exist, or when
        RBAC does not allow `get` on `executions/log` in `subresources.briq.cloud`; while
        iterating, when the stream breaks before its end. `read_timeout` (seconds) bounds each
        wait for more. Exhaust or `close()` the iterator to free the connection."""
        response = self._open_log(execution, follow, read_timeout)
        return self._output_pieces(response, execution, follow)

    def _output_pieces(self, response, execution: str, follow: bool):
        what = f"reading the output of Execution {self.namespace}/{execution}"
        try:
            for piece in _log_pieces(response):
                if "end" in piece:
                    return str(piece["end"])
                if "text" in piece:
                    yield str(piece.get("stream") or "stdout"), str(piece["text"])
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as error:
            raise KubernetesExecutorError(f"{what}: {error}") from error
        finally:
            _close(response)
        if follow:
            raise KubernetesExecutorError(f"{what}: the stream ended before the action did")
        return None

    def _open_log(self, execution: str, follow: bool, read_timeout: float | None):
        """The streaming response of `executions/{execution}/log` (JSON lines), through this
        executor's API client (its server, credentials and TLS)."""
        api_client = self._api.api_client
        what = f"reading the output of Execution {self.namespace}/{execution}"
        method, url, headers, _, _ = api_client.param_serialize(
            "GET",
            LOG_PATH,
            path_params={
                "group": SUBRESOURCES_GROUP,
                "version": SUBRESOURCES_VERSION,
                "namespace": self.namespace,
                "name": execution,
            },
            query_params=[("follow", "true" if follow else "false"), ("format", "json")],
            header_params={"Accept": "application/x-ndjson, application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            response = api_client.call_api(
                method, url, header_params=headers, _request_timeout=(30, read_timeout)
            ).response
        except ApiException as error:
            raise KubernetesExecutorError(f"{what}: {error.reason}") from error
        except urllib3.exceptions.HTTPError as error:
            raise KubernetesExecutorError(f"{what}: {error}") from error
        if 200 <= response.status <= 299:
            return response
        try:
            body = response.data.decode("utf-8", errors="replace")
        except Exception:  # noqa: BLE001 - the status is what matters
            body = ""
        finally:
            _close(response)
        try:
            message = json.loads(body).get("message") or body
        except (ValueError, AttributeError):
            message = body
        if response.status == 404:
            hint = (
                f"not found: either the operator's aggregated API ({SUBRESOURCES_GROUP}) is "
                "not served (an operator before it, or subresources turned off) or the "
                "Execution does not exist"
            )
        elif response.status == 403:
            hint = (
                f"forbidden: reading output needs `get` on `executions/log` in API group "
                f"{SUBRESOURCES_GROUP}"
            )
        else:
            hint = f"{response.status} {response.reason}"
        error = KubernetesExecutorError(f"{what}: {hint}: {message.strip()}")
        error.status = response.status
        raise error

    def _follow_live(self, execution: str, wait_seconds: float) -> _LiveOutput | None:
        if not self.live_output or self._live_unavailable is not None:
            return None
        if getattr(self.logger, "level", LogLevel.INFO) < LogLevel.INFO:
            return None  # it would show nothing: no stream to hold open
        return _LiveOutput(self, execution, wait_seconds)

    def _outcome(self, name: str, obj: dict) -> CodeOutput:
        status = obj.get("status") or {}
        succeeded = _condition(obj, "Succeeded") or {}
        reason = succeeded.get("reason", "")
        logs = status.get("logs") or ""
        self.state["_print_outputs"] = logs
        if succeeded.get("status") == "True":
            if status.get("isFinalAnswer"):
                encoded = status.get("finalAnswer") or ""
                try:
                    value = RemotePythonExecutor._deserialize_final_answer(
                        encoded, allow_pickle=False
                    )
                except Exception as error:
                    raise FinalAnswerRejectedError(
                        f"FinalAnswerRejected: the final answer could not be decoded: {error}",
                        self.logger,
                        name="FinalAnswerRejected",
                        message=str(error),
                        traceback="",
                        logs=logs,
                        execution=name,
                    ) from None
                return CodeOutput(output=value, logs=logs, is_final_answer=True)
            return CodeOutput(output=status.get("output"), logs=logs, is_final_answer=False)
        if reason in UNUSABLE_REASONS:
            raise self._poison(reason, succeeded.get("message", ""), name, logs)
        error_class = CODE_ERROR_REASONS.get(reason)
        if error_class is None:
            raise KubernetesExecutorError(
                f"Execution {self.namespace}/{name} did not run: {reason}: "
                f"{succeeded.get('message', '')}"
            )
        error = status.get("error") or {}
        error_name = error.get("name") or reason
        error_message = error.get("message") or succeeded.get("message", "")
        traceback = error.get("traceback") or ""
        text = traceback.strip() or f"{error_name}: {error_message}"
        raise error_class(
            text,
            self.logger,
            name=error_name,
            message=error_message,
            traceback=traceback,
            logs=logs,
            execution=name,
        )

    def _poison(
        self, reason: str, detail: str, execution: str | None = None, logs: str = ""
    ) -> ExecutorUnusableError:
        self._unusable = ExecutorUnusableError(
            self.executor_name, self.namespace, reason, detail, execution, logs
        )
        self.logger.log_error(str(self._unusable))
        return self._unusable

    def _create_execution(self, body: dict, action_id: str) -> dict:
        create = self._api.create_namespaced_custom_object
        try:
            return create(GROUP, VERSION, self.namespace, EXECUTIONS, body, _request_timeout=30)
        except ApiException as error:
            if error.status is not None and error.status < 500:
                raise KubernetesExecutorError(
                    f"creating an Execution for {self.executor_name}: {error.status} "
                    f"{error.reason}: {error.body}"
                ) from error
            cause: Exception = error
        except urllib3.exceptions.MaxRetryError as error:
            if isinstance(
                error.reason,
                urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError,
            ):
                raise KubernetesExecutorError(
                    f"cannot reach the Kubernetes API server: {error.reason}"
                ) from error
            cause = error
        except urllib3.exceptions.HTTPError as error:
            cause = error
        # The request may or may not have created the Execution: look for it by its label.
        try:
            found = self._api.list_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                EXECUTIONS,
                label_selector=f"{ACTION_LABEL}={action_id}",
                _request_timeout=30,
            )["items"]
        except (ApiException, urllib3.exceptions.HTTPError):
            found = []
        if found:
            return found[0]
        raise self._poison(
            "TransportError",
            f"creating an Execution failed ({cause}) and it cannot be told whether it was created",
        )

    # --- watching ---------------------------------------------------------------------------

    def _create_executor(self, what: str, namespace: str, body: dict) -> dict:
        return self._call(
            what,
            self._api.create_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            EXECUTORS,
            body,
            _request_timeout=30,
        )

    def _call(self, what: str, function, *args, **kwargs):
        try:
            return function(*args, **kwargs)
        except ApiException as error:
            raise KubernetesExecutorError(
                f"{what}: {error.status} {error.reason}: {error.body}"
            ) from error
        except urllib3.exceptions.HTTPError as error:
            raise KubernetesExecutorError(f"{what}: {error}") from error

    def _get(self, plural: str, name: str) -> dict | None:
        try:
            return self._api.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name, _request_timeout=30
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def _wait(
        self,
        plural: str,
        name: str,
        resource_version: str | None,
        deadline: float,
        check,
        what: str,
        initial: dict | None = None,
    ):
        """Watches one object (by name) until `check(obj)` returns something other than None
        (`obj` is None once the object is gone). Starts from `resource_version` when given (after
        checking `initial`), else from a fresh GET. Expired watches, dropped connections and
        API errors are resumed from a fresh GET until `deadline` (monotonic), then
        `_DeadlinePassed` is raised."""
        rv = resource_version
        if rv is not None and initial is not None:
            result = check(initial)
            if result is not None:
                return result
        failures = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _DeadlinePassed(what)
            try:
                if rv is None:
                    obj = self._get(plural, name)
                    result = check(obj)
                    if result is not None:
                        return result
                    rv = obj["metadata"]["resourceVersion"]
                stream = watch.Watch()
                try:
                    for event in stream.stream(
                        self._api.list_namespaced_custom_object,
                        GROUP,
                        VERSION,
                        self.namespace,
                        plural,
                        field_selector=f"metadata.name={name}",
                        resource_version=rv,
                        allow_watch_bookmarks=True,
                        timeout_seconds=max(1, math.ceil(min(remaining, 300))),
                        _request_timeout=(10, min(remaining, 300) + 15),
                        deserialize=False,
                    ):
                        obj = event.get("object") or {}
                        rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        if event.get("type") == "BOOKMARK":
                            continue
                        result = check(None if event.get("type") == "DELETED" else obj)
                        if result is not None:
                            return result
                        failures = 0
                finally:
                    stream.stop()
            except ApiException as error:
                if error.status == 410:  # resourceVersion too old: start over from a GET
                    rv = None
                    continue
                if error.status in (401, 403, 404):
                    raise KubernetesExecutorError(
                        f"watching {plural}/{name}: {error.status} {error.reason}"
                    ) from error
                failures += 1
                rv = None
            except urllib3.exceptions.HTTPError:
                # A dropped or timed-out connection: resume from the current state.
                failures += 1
                rv = None
            if failures:
                time.sleep(min(0.2 * 2**failures, 2.0, max(0.0, deadline - time.monotonic())))


class _DeadlinePassed(Exception):
    pass


def _discard(forks: list[KubernetesExecutor]) -> list[str]:
    """Deletes the BriqExecutors of `forks` (each waited until gone); the names left."""
    for fork in forks:
        fork.cleanup()
    return [fork.executor_name for fork in forks if not fork._deleted]


def _log_pieces(response) -> Iterator[dict]:
    """The JSON objects of a streaming response, one a line, each as soon as its line is
    complete (`read1` returns what has arrived, chunked or not)."""
    buffer = b""
    while True:
        data = response.read1(65536)
        if not data:
            break
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
    if buffer.strip():
        yield json.loads(buffer)


def _close(response) -> None:
    with contextlib.suppress(Exception):
        response.close()
    with contextlib.suppress(Exception):
        response.release_conn()


class _LiveOutput:
    """Relays one Execution's live output to its executor's logger, on a daemon thread of its
    own, until the end piece, an error (which only ends the view) or `finish`."""

    def __init__(self, executor: KubernetesExecutor, execution: str, read_timeout: float):
        self._executor = executor
        self._execution = execution
        self._read_timeout = read_timeout
        self._response = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._relay, name=f"briq-live-{execution}", daemon=True
        )
        self._thread.start()

    def finish(self, wait: float) -> None:
        """Lets the rest of the output arrive for up to `wait` seconds, then stops reading."""
        self._thread.join(wait)
        self._stopped.set()
        response = self._response
        if self._thread.is_alive() and response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()  # wakes the thread's blocked read

    def _relay(self) -> None:
        executor, logger = self._executor, self._executor.logger
        try:
            response = executor._open_log(self._execution, True, self._read_timeout)
        except Exception as error:  # noqa: BLE001 - a view only: never the step's business
            if getattr(error, "status", None) in (403, 404):
                executor._live_unavailable = str(error)
                logger.log(f"No live output: {error}", level=LogLevel.DEBUG)
            return
        self._response = response
        try:
            if self._stopped.is_set():
                return
            for piece in _log_pieces(response):
                if self._stopped.is_set() or "end" in piece:
                    return
                if "text" in piece:
                    stderr = piece.get("stream") == "stderr"
                    text = Text(str(piece["text"]), style=LIVE_STDERR_STYLE if stderr else "")
                    logger.log(text, level=LogLevel.INFO, end="")
                elif "cut" in piece:
                    logger.log(
                        Text(
                            f"\n… [live output stops after {piece['cut']} characters; the status "
                            "keeps the head and the tail] …\n",
                            style="dim",
                        ),
                        level=LogLevel.INFO,
                        end="",
                    )
        except Exception as error:  # noqa: BLE001 - a broken stream only ends the view
            if not self._stopped.is_set():
                logger.log(f"Live output stopped: {error}", level=LogLevel.DEBUG)
        finally:
            _close(response)
