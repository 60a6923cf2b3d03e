"""The operator's MCP endpoint (`/apis/subresources.briq.cloud/v1alpha1/namespaces/NS/mcp`)
through a real kube-apiserver, with real ServiceAccount tokens and RBAC, driven by clients no one
in this project wrote: the official MCP Python SDK (`mcp`) and the OpenAI Agents SDK's MCP client
with its scripted (deterministic) model, against real kernels of the local sandbox server.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import mcp_types
import pytest
from kubernetes import client, config
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

GROUP, VERSION = "briq.cloud", "v1alpha1"
TENANT, OTHER = "mcp-a", "mcp-b"
EXECUTOR = "mcp-py"
# The role a tenant's agent holds in its namespace: what `edit` gives with the chart's roles.
AGENT_RULES = [
    {
        "apiGroups": [GROUP],
        "resources": ["briqexecutors", "executions"],
        "verbs": ["get", "list", "watch", "create", "delete", "patch"],
    },
    {
        "apiGroups": ["subresources.briq.cloud"],
        "resources": ["mcp"],
        "verbs": ["create", "deletecollection"],
    },
    {
        "apiGroups": ["subresources.briq.cloud"],
        "resources": ["briqexecutors/files"],
        "verbs": ["get", "update"],
    },
]
# What `view` gives: reading, and the endpoint (each tool then asks for its own right).
VIEWER_RULES = [
    {
        "apiGroups": [GROUP],
        "resources": ["briqexecutors", "executions"],
        "verbs": ["get", "list", "watch"],
    },
    {
        "apiGroups": ["subresources.briq.cloud"],
        "resources": ["mcp"],
        "verbs": ["create", "deletecollection"],
    },
]


class Cluster:
    """The stack's kube-apiserver as tenants see it: its URL, its CA and their tokens."""

    def __init__(self, kubeconfig: str):
        self.api = config.new_client_from_config(config_file=kubeconfig, persist_config=False)
        self.host = self.api.configuration.host
        self.ca = self.api.configuration.ssl_ca_cert
        self.core = client.CoreV1Api(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)
        self.objects = client.CustomObjectsApi(self.api)
        self.tokens: dict[tuple[str, str], str] = {}

    def url(self, namespace: str) -> str:
        return f"{self.host}/apis/subresources.briq.cloud/v1alpha1/namespaces/{namespace}/mcp"

    def tenant(self, namespace: str) -> None:
        self.core.create_namespace({"metadata": {"name": namespace}})
        for account, rules in (("agent", AGENT_RULES), ("viewer", VIEWER_RULES)):
            self.core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
            self.rbac.create_namespaced_role(
                namespace, {"metadata": {"name": account}, "rules": rules}
            )
            self.rbac.create_namespaced_role_binding(
                namespace,
                {
                    "metadata": {"name": account},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role",
                        "name": account,
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": account, "namespace": namespace}
                    ],
                },
            )
            answer = self.core.create_namespaced_service_account_token(
                account, namespace, {"spec": {"expirationSeconds": 3600}}
            )
            self.tokens[(namespace, account)] = answer.status.token

    def http(self, token: str | None, timeout: float = 60.0) -> httpx2.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx2.AsyncClient(
            headers=headers,
            verify=ssl.create_default_context(cafile=self.ca),
            timeout=httpx2.Timeout(timeout, read=timeout),
        )

    def executions(self, namespace: str) -> list[dict]:
        return self.objects.list_namespaced_custom_object(GROUP, VERSION, namespace, "executions")[
            "items"
        ]

    def executor(self, namespace: str, name: str) -> dict:
        return self.objects.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "briqexecutors", name
        )


@pytest.fixture(scope="module")
def cluster(kubeconfig) -> Cluster:
    cluster = Cluster(kubeconfig)
    cluster.tenant(TENANT)
    cluster.tenant(OTHER)
    return cluster


@contextlib.asynccontextmanager
async def session(
    cluster: Cluster, namespace: str = TENANT, account: str = "agent", **callbacks
) -> AsyncIterator[ClientSession]:
    token = cluster.tokens[(namespace, account)]
    async with (
        cluster.http(token) as http,
        streamable_http_client(cluster.url(namespace), http_client=http) as (read, write),
        ClientSession(read, write, **callbacks) as mcp,
    ):
        await mcp.initialize()
        yield mcp


def run(coroutine):
    return asyncio.run(coroutine)


def text(result: mcp_types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if c.type == "text")


@pytest.fixture(scope="module")
def executor(cluster) -> str:
    """One executor of the tenant's, made through the endpoint by its agent."""

    async def create():
        async with session(cluster) as mcp:
            return await mcp.call_tool("create_executor", {"name": EXECUTOR})

    created = run(create())
    assert not created.is_error, text(created)
    assert created.structured_content["ready"] is True, created.structured_content
    return EXECUTOR


def test_an_agent_runs_python_whose_state_persists_and_whose_prints_arrive_while_it_runs(
    cluster, executor
):
    """The action cannot finish until the client has seen its first print: it waits for a file
    the client writes once the print's notification has arrived."""
    received: list[tuple[str, object]] = []

    async def logged(params: mcp_types.LoggingMessageNotificationParams) -> None:
        received.append(("log", params.data))

    async def scenario():
        async with session(cluster, logging_callback=logged) as mcp, session(cluster) as files:
            tools = {tool.name for tool in (await mcp.list_tools()).tools}
            assert tools == {
                "create_executor",
                "list_executors",
                "run_python",
                "read_file",
                "write_file",
                "cancel",
                "fork_executor",
                "delete_executor",
            }
            first = await mcp.call_tool(
                "run_python", {"executor": executor, "code": "import os\nx = 41\nos.getcwd()"}
            )
            assert not first.is_error, text(first)
            cwd = json.loads(first.structured_content["output"].replace("'", '"'))
            go = f"{cwd}/go-{time.monotonic_ns()}"

            released = asyncio.Event()

            async def release_when_printed(progress, total, message):
                received.append(("progress", message))
                if message and "waiting" in message:
                    written = await files.call_tool(
                        "write_file", {"executor": executor, "path": go, "content": "go"}
                    )
                    assert not written.is_error, text(written)
                    released.set()

            code = (
                "import os, time\n"
                "print('waiting', flush=True)\n"
                f"while not os.path.exists({go!r}):\n"
                "    time.sleep(0.05)\n"
                "print('released')\n"
                "x + 1"
            )
            result = await mcp.call_tool(
                "run_python",
                {"executor": executor, "code": code, "timeout_seconds": 30},
                progress_callback=release_when_printed,
            )
            # The callback runs beside the call: its write answered, the sessions may close.
            await asyncio.wait_for(released.wait(), 30)
            return result

    result = run(scenario())
    assert not result.is_error, text(result)
    assert result.structured_content["output"] == "42"
    assert result.structured_content["logs"] == "waiting\nreleased\n"
    assert ("log", "waiting\n") in received
    assert text(result) == "waiting\nreleased\nOut: 42\n"
    # The action is an Execution like any other client's, saying who asked.
    name = result.structured_content["execution"]
    recorded = next(e for e in cluster.executions(TENANT) if e["metadata"]["name"] == name)
    assert (
        recorded["metadata"]["annotations"]["briq.cloud/requested-by"]
        == f"system:serviceaccount:{TENANT}:agent"
    )
    assert recorded["metadata"]["ownerReferences"][0]["name"] == executor
    assert (
        cluster.executor(TENANT, executor)["metadata"]["annotations"]["briq.cloud/requested-by"]
        == f"system:serviceaccount:{TENANT}:agent"
    )


def test_a_retried_request_id_runs_once_and_answers_the_same(cluster, executor):
    code = "n = globals().get('n', 0) + 1\nn"

    async def scenario():
        async with session(cluster) as mcp:
            first = await mcp.call_tool(
                "run_python", {"executor": executor, "code": code, "request_id": "count-1"}
            )
            again = await mcp.call_tool(
                "run_python", {"executor": executor, "code": code, "request_id": "count-1"}
            )
            other = await mcp.call_tool(
                "run_python", {"executor": executor, "code": "n = 100", "request_id": "count-1"}
            )
            now = await mcp.call_tool("run_python", {"executor": executor, "code": "n"})
            return first, again, other, now

    first, again, other, now = run(scenario())
    assert first.structured_content["output"] == "1"
    assert again.structured_content == first.structured_content
    assert other.is_error and "already used" in text(other), text(other)
    assert now.structured_content["output"] == "1"


def test_a_client_that_disconnects_mid_run_leaves_the_action_to_finish_and_its_result_kept(
    cluster, executor
):
    """The raw transport: POST a call, read its stream up to the first print, hang up."""
    token = cluster.tokens[(TENANT, "agent")]

    async def scenario():
        async with cluster.http(token) as http:
            opened = await http.post(
                cluster.url(TENANT),
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-11-25",
                        "capabilities": {},
                        "clientInfo": {"name": "raw", "version": "0"},
                    },
                },
                headers={"Accept": "application/json, text/event-stream"},
            )
            assert opened.status_code == 200, opened.text
            headers = {
                "Accept": "application/json, text/event-stream",
                "Mcp-Session-Id": opened.headers["mcp-session-id"],
                "MCP-Protocol-Version": "2025-11-25",
            }
            call = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {
                    "name": "run_python",
                    "arguments": {
                        "executor": executor,
                        "code": "import time\nprint('started', flush=True)\ntime.sleep(2)\n'done'",
                        "request_id": "left-early",
                    },
                },
            }
            async with http.stream("POST", cluster.url(TENANT), json=call, headers=headers) as sse:
                assert sse.status_code == 200
                assert sse.headers["content-type"].startswith("text/event-stream")
                async for line in sse.aiter_lines():
                    if line.startswith("data:") and "started" in line:
                        break  # and hang up while the action sleeps

        async with session(cluster) as mcp:
            return await mcp.call_tool(
                "run_python",
                {
                    "executor": executor,
                    "code": "import time\nprint('started', flush=True)\ntime.sleep(2)\n'done'",
                    "request_id": "left-early",
                },
            )

    result = run(scenario())
    assert not result.is_error, text(result)
    assert result.structured_content["output"] == "'done'"
    named = [
        e
        for e in cluster.executions(TENANT)
        if e["metadata"].get("annotations", {}).get("briq.cloud/mcp-request-id") == "left-early"
    ]
    assert len(named) == 1, "the retry found the first Execution rather than making a second"
    assert named[0]["status"]["output"] == "'done'"


def test_a_viewer_may_list_executors_but_not_run_code_nor_delete(cluster, executor):
    before = len(cluster.executions(TENANT))

    async def scenario():
        async with session(cluster, account="viewer") as mcp:
            listed = await mcp.call_tool("list_executors", {})
            ran = await mcp.call_tool("run_python", {"executor": executor, "code": "1"})
            deleted = await mcp.call_tool("delete_executor", {"executor": executor})
            read = await mcp.call_tool("read_file", {"executor": executor, "path": "/etc/hostname"})
            return listed, ran, deleted, read

    listed, ran, deleted, read = run(scenario())
    assert not listed.is_error, text(listed)
    assert [e["name"] for e in listed.structured_content["executors"]] == [executor]
    for refused in (ran, deleted, read):
        assert refused.is_error and text(refused).startswith("Forbidden"), text(refused)
    assert "cannot create executions" in text(ran), text(ran)
    assert len(cluster.executions(TENANT)) == before
    assert cluster.executor(TENANT, executor)["metadata"].get("deletionTimestamp") is None


def test_a_token_of_another_namespace_or_none_reaches_nothing(cluster, executor):
    before = len(cluster.executions(TENANT))
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {}},
    }

    async def scenario():
        answers = {}
        for who, token in (("other tenant", cluster.tokens[(OTHER, "agent")]), ("no token", None)):
            async with cluster.http(token) as http:
                answer = await http.post(
                    cluster.url(TENANT),
                    json=initialize,
                    headers={"Accept": "application/json, text/event-stream"},
                )
                answers[who] = answer.status_code
        # The SDK's own client, with B's token on A's endpoint, fails at connect.
        with pytest.raises(Exception):  # noqa: B017 - any failure to connect is the point
            async with cluster.http(cluster.tokens[(OTHER, "agent")]) as http:
                async with (
                    streamable_http_client(cluster.url(TENANT), http_client=http) as (read, write),
                    ClientSession(read, write) as mcp,
                ):
                    await asyncio.wait_for(mcp.initialize(), 30)
        return answers

    answers = run(scenario())
    assert answers["other tenant"] == 403, answers
    assert answers["no token"] in (401, 403), answers
    assert len(cluster.executions(TENANT)) == before


def test_bad_input_is_answered_promptly_with_what_is_wrong_and_creates_nothing(cluster, executor):
    before = len(cluster.executions(TENANT))
    token = cluster.tokens[(TENANT, "agent")]

    async def scenario():
        async with session(cluster) as mcp:
            with pytest.raises(MCPError) as unknown:
                await mcp.call_tool("rm_rf", {})
            answers = {
                "unknown tool": str(unknown.value),
                "schema": await mcp.call_tool("run_python", {"executor": executor, "code": 7}),
                "no executor": await mcp.call_tool("run_python", {"executor": "nope", "code": "1"}),
                "over budget": await mcp.call_tool(
                    "run_python", {"executor": executor, "code": "#" * 65_537}
                ),
                "bad name": await mcp.call_tool("run_python", {"executor": "../x", "code": "1"}),
            }
        async with cluster.http(token) as http:
            url = cluster.url(TENANT)
            accept = {"Accept": "application/json, text/event-stream"}
            big = "x" * (3 * 1024 * 1024)
            answers["too large"] = (await http.post(url, content=big, headers=accept)).status_code
            no_session = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
            answers["no session"] = (
                await http.post(url, json=no_session, headers=accept)
            ).status_code
            forged = {**accept, "Mcp-Session-Id": "0" * 32}
            answers["unknown session"] = (
                await http.post(url, json=no_session, headers=forged)
            ).status_code
            answers["not json"] = (await http.post(url, content="{", headers=accept)).status_code
            answers["get"] = (await http.get(url, headers=accept)).status_code
            page = {**accept, "Origin": "https://evil.example"}
            answers["from a web page"] = (
                await http.post(url, json=no_session, headers=page)
            ).status_code
        return answers

    answers = run(scenario())
    assert "rm_rf" in answers["unknown tool"]
    assert answers["schema"].is_error and "code must be a string" in text(answers["schema"])
    assert answers["no executor"].is_error and "not found" in text(answers["no executor"])
    assert answers["over budget"].is_error and "nothing was run" in text(answers["over budget"])
    assert answers["bad name"].is_error and "not a Kubernetes object name" in text(
        answers["bad name"]
    )
    assert answers["too large"] == 413
    assert answers["no session"] == 400
    assert answers["unknown session"] == 404
    assert answers["not json"] == 400
    # GET is `list` on `mcp`, which no role grants: the server offers no stream of its own.
    assert answers["get"] == 403
    assert answers["from a web page"] == 403
    assert len(cluster.executions(TENANT)) == before


def test_files_move_both_ways_as_text_and_bytes(cluster, executor):
    payload = bytes(range(256))

    async def scenario():
        async with session(cluster) as mcp:
            cwd = await mcp.call_tool(
                "run_python", {"executor": executor, "code": "import os\nos.getcwd()"}
            )
            cwd = cwd.structured_content["output"].strip("'")
            wrote_text = await mcp.call_tool(
                "write_file", {"executor": executor, "path": f"{cwd}/notes.txt", "content": "héllo"}
            )
            wrote_bytes = await mcp.call_tool(
                "write_file",
                {
                    "executor": executor,
                    "path": f"{cwd}/blob.bin",
                    "content": base64.b64encode(payload).decode(),
                    "encoding": "base64",
                },
            )
            seen = await mcp.call_tool(
                "run_python",
                {
                    "executor": executor,
                    "code": "open('notes.txt').read(), len(open('blob.bin', 'rb').read())",
                },
            )
            read_text = await mcp.call_tool(
                "read_file", {"executor": executor, "path": f"{cwd}/notes.txt"}
            )
            read_bytes = await mcp.call_tool(
                "read_file", {"executor": executor, "path": f"{cwd}/blob.bin", "encoding": "base64"}
            )
            binary_as_text = await mcp.call_tool(
                "read_file", {"executor": executor, "path": f"{cwd}/blob.bin"}
            )
            missing = await mcp.call_tool(
                "read_file", {"executor": executor, "path": f"{cwd}/missing"}
            )
            return wrote_text, wrote_bytes, seen, read_text, read_bytes, binary_as_text, missing

    wrote_text, wrote_bytes, seen, read_text, read_bytes, binary_as_text, missing = run(scenario())
    assert not wrote_text.is_error, text(wrote_text)
    assert wrote_text.structured_content["size"] == len("héllo".encode())
    assert not wrote_bytes.is_error and wrote_bytes.structured_content["sha256"] == (
        hashlib.sha256(payload).hexdigest()
    )
    assert seen.structured_content["output"] == "('héllo', 256)"
    assert read_text.structured_content["content"] == "héllo"
    assert base64.b64decode(read_bytes.structured_content["content"]) == payload
    assert binary_as_text.is_error and "base64" in text(binary_as_text)
    assert missing.is_error


def test_cancel_interrupts_the_running_action_and_the_kernel_keeps_its_state(cluster, executor):
    async def scenario():
        async with session(cluster) as mcp, session(cluster) as other:
            await mcp.call_tool("run_python", {"executor": executor, "code": "kept = 'yes'"})
            printed = asyncio.Event()

            async def on_print(progress, total, message):
                printed.set()

            running = asyncio.create_task(
                mcp.call_tool(
                    "run_python",
                    {
                        "executor": executor,
                        "code": "import time\nprint('sleeping', flush=True)\ntime.sleep(30)",
                    },
                    progress_callback=on_print,
                )
            )
            await asyncio.wait_for(printed.wait(), 40)
            cancelled = await other.call_tool("cancel", {"executor": executor})
            ended = await running
            after = await mcp.call_tool("run_python", {"executor": executor, "code": "kept"})
            return cancelled, ended, after

    cancelled, ended, after = run(scenario())
    assert not cancelled.is_error and len(cancelled.structured_content["cancelled"]) == 1
    assert ended.is_error, text(ended)
    assert ended.structured_content["reason"] == "Cancelled", ended.structured_content
    assert after.structured_content["output"] == "'yes'"


def test_a_fork_starts_with_the_state_and_delete_destroys_it(cluster, executor):
    async def scenario():
        async with session(cluster) as mcp:
            await mcp.call_tool("run_python", {"executor": executor, "code": "forked = 7"})
            forked = await mcp.call_tool("fork_executor", {"executor": executor})
            (fork,) = forked.structured_content["forks"]
            deadline = time.monotonic() + 120
            while True:
                listed = await mcp.call_tool("list_executors", {})
                state = next(e for e in listed.structured_content["executors"] if e["name"] == fork)
                if state["ready"] or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            seen = await mcp.call_tool("run_python", {"executor": fork, "code": "forked"})
            deleted = await mcp.call_tool("delete_executor", {"executor": fork})
            return fork, state, seen, deleted

    fork, state, seen, deleted = run(scenario())
    assert state["ready"], state
    assert state["forkedFrom"] == executor
    assert seen.structured_content["output"] == "7"
    assert deleted.structured_content == {"deleted": fork}


def test_an_openai_agents_sdk_agent_runs_its_code_through_the_endpoint(cluster, executor):
    """An agent framework's own MCP client, driven by its scripted model: it calls run_python,
    reads the result and answers with it."""
    from agents import Agent, Runner, set_tracing_disabled
    from agents.mcp import MCPServerStreamableHttp
    from agents.testing.model import ModelStep, ScriptedModel
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    set_tracing_disabled(True)
    token = cluster.tokens[(TENANT, "agent")]

    def answer_with_the_tool_output(call) -> list:
        outputs = [
            item["output"]
            for item in call.input
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        return [
            ResponseOutputMessage(
                id="msg-1",
                type="message",
                role="assistant",
                status="completed",
                content=[
                    ResponseOutputText(type="output_text", text=str(outputs[-1]), annotations=[])
                ],
            )
        ]

    model = ScriptedModel(
        [
            [
                ResponseFunctionToolCall(
                    id="fc-1",
                    call_id="call-1",
                    type="function_call",
                    name="run_python",
                    arguments=json.dumps(
                        {
                            "executor": executor,
                            "code": "fib = [0, 1]\nfor _ in range(8):\n"
                            "    fib.append(fib[-1] + fib[-2])\nfib",
                        }
                    ),
                )
            ],
            ModelStep.respond(answer_with_the_tool_output),
        ]
    )

    def http_client(headers=None, timeout=None, auth=None):
        return httpx2.AsyncClient(
            headers={**(headers or {}), "Authorization": f"Bearer {token}"},
            verify=ssl.create_default_context(cafile=cluster.ca),
            timeout=timeout,
            auth=auth,
        )

    async def scenario():
        async with MCPServerStreamableHttp(
            params={
                "url": cluster.url(TENANT),
                "httpx_client_factory": http_client,
                "timeout": 60,
                "sse_read_timeout": 60,
            },
            client_session_timeout_seconds=60,
        ) as server:
            agent = Agent(
                name="fib", instructions="Use run_python.", mcp_servers=[server], model=model
            )
            return await Runner.run(agent, "The first 10 Fibonacci numbers?")

    result = run(scenario())
    assert "[0, 1, 1, 2, 3, 5, 8, 13, 21, 34]" in result.final_output, result.final_output
    model.assert_complete()


def operator_binary() -> Path:
    """The operator's binary, whose CLI is `kubectl briq` (built beside `$BRIQ_DEV_BIN`)."""
    dev = os.environ.get("BRIQ_DEV_BIN")
    target = Path(dev).parent if dev else Path(__file__).resolve().parents[3] / "target" / "debug"
    binary = target / "briq-operator"
    assert binary.exists(), f"{binary} is not built (cargo build)"
    return binary


def test_a_desktop_agent_reaches_the_endpoint_through_kubectl_briq_mcp(
    cluster, executor, kubeconfig
):
    """The SDK's stdio client starts `kubectl briq mcp -n NS` as a desktop agent starts its
    servers; the relay reaches the endpoint with the kubeconfig's credentials, prints included."""
    params = StdioServerParameters(
        command=str(operator_binary()),
        args=["mcp", "-n", TENANT],
        env={**os.environ, "KUBECONFIG": kubeconfig},
    )
    logs: list[object] = []

    async def logged(params: mcp_types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    async def scenario():
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write, logging_callback=logged) as mcp,
        ):
            await mcp.initialize()
            tools = {tool.name for tool in (await mcp.list_tools()).tools}
            result = await mcp.call_tool(
                "run_python", {"executor": executor, "code": "print('over stdio')\n6 * 7"}
            )
            unknown = await mcp.call_tool("run_python", {"executor": "nope", "code": "1"})
            return tools, result, unknown

    tools, result, unknown = run(scenario())
    assert "run_python" in tools
    assert not result.is_error, text(result)
    assert result.structured_content["output"] == "42"
    assert "over stdio\n" in logs
    assert unknown.is_error and "not found" in text(unknown)
