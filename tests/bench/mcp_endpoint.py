"""Scenario 16's client side: the MCP endpoint measured with the official MCP SDK, through
kube-apiserver, with a ServiceAccount token. One phase per run; its figures as one JSON line.

- `latency`: `run_python("1 + 1")` through MCP and `KubernetesExecutor.run_code_raise_errors`
  ("1 + 1") on the same executor, alternating, `--actions` of each.
- `sessions`: `--sessions` MCP sessions at once over the executors named, `--actions` each.
- `lag`: a print's time to reach an MCP client as a notification, and to reach a follower of the
  log subresource, the same code run once each way (`--prints` prints 200 ms apart).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time
import uuid

import httpx2
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

ACCOUNT = "bench-mcp-agent"
RULES = [
    {
        "apiGroups": ["briq.cloud"],
        "resources": ["briqexecutors", "executions"],
        "verbs": ["get", "list", "watch", "create", "patch"],
    },
    {
        "apiGroups": ["subresources.briq.cloud"],
        "resources": ["mcp"],
        "verbs": ["create", "deletecollection"],
    },
    {
        "apiGroups": ["subresources.briq.cloud"],
        "resources": ["executions/log"],
        "verbs": ["get"],
    },
]


def token(api: client.ApiClient, namespace: str) -> str:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    binding = {
        "metadata": {"name": ACCOUNT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACCOUNT},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}],
    }
    role = {"metadata": {"name": ACCOUNT}, "rules": RULES}
    for create, replace, body in (
        (core.create_namespaced_service_account, None, {"metadata": {"name": ACCOUNT}}),
        (rbac.create_namespaced_role, rbac.replace_namespaced_role, role),
        (rbac.create_namespaced_role_binding, None, binding),
    ):
        try:
            create(namespace, body)
        except ApiException as error:
            if error.status != 409:
                raise
            if replace is not None:
                replace(ACCOUNT, namespace, body)
    answer = core.create_namespaced_service_account_token(
        ACCOUNT, namespace, {"spec": {"expirationSeconds": 3600}}
    )
    return answer.status.token


class Endpoint:
    def __init__(self, api: client.ApiClient, namespace: str):
        self.url = (
            f"{api.configuration.host}/apis/subresources.briq.cloud/v1alpha1/namespaces/"
            f"{namespace}/mcp"
        )
        self.ca = api.configuration.ssl_ca_cert
        self.token = token(api, namespace)

    def session(self, **callbacks):
        endpoint = self

        class Opened:
            async def __aenter__(self):
                self.http = httpx2.AsyncClient(
                    headers={"Authorization": f"Bearer {endpoint.token}"},
                    verify=ssl.create_default_context(cafile=endpoint.ca),
                    timeout=120,
                )
                self.transport = streamable_http_client(endpoint.url, http_client=self.http)
                read, write = await self.transport.__aenter__()
                self.mcp = ClientSession(read, write, **callbacks)
                await self.mcp.__aenter__()
                await self.mcp.initialize()
                return self.mcp

            async def __aexit__(self, *exc):
                await self.mcp.__aexit__(*exc)
                await self.transport.__aexit__(*exc)
                await self.http.aclose()

        return Opened()


async def run_python(mcp: ClientSession, executor: str, code: str) -> dict:
    result = await mcp.call_tool("run_python", {"executor": executor, "code": code})
    if result.is_error:
        raise RuntimeError(result.content[0].text)
    return result.structured_content


async def latency(
    kubeconfig: str, endpoint: Endpoint, namespace: str, executor: str, actions: int
) -> dict:
    from smolagents.monitoring import AgentLogger, LogLevel

    from briq_operator_client import KubernetesExecutor

    kube = KubernetesExecutor(
        [],
        AgentLogger(level=LogLevel.OFF),
        executor_name=executor,
        namespace=namespace,
        kubeconfig=kubeconfig,
    )
    mcp_ms, client_ms = [], []
    try:
        async with endpoint.session() as mcp:
            for _ in range(actions):
                started = time.perf_counter()
                out = await run_python(mcp, executor, "1 + 1")
                mcp_ms.append((time.perf_counter() - started) * 1000)
                assert out["output"] == "2", out
                started = time.perf_counter()
                await asyncio.to_thread(kube.run_code_raise_errors, "1 + 1")
                client_ms.append((time.perf_counter() - started) * 1000)
    finally:
        kube.cleanup()
    return {"mcp_ms": mcp_ms, "client_ms": client_ms}


async def sessions(endpoint: Endpoint, executors: list[str], count: int, actions: int) -> dict:
    action_ms: list[float] = []
    failures: list[str] = []

    async def one(index: int) -> None:
        executor = executors[index % len(executors)]
        try:
            async with endpoint.session() as mcp:
                for step in range(actions):
                    started = time.perf_counter()
                    out = await run_python(mcp, executor, f"{index} * 1000 + {step}")
                    action_ms.append((time.perf_counter() - started) * 1000)
                    if out.get("output") != str(index * 1000 + step):
                        failures.append(f"session {index}: {out}")
        except Exception as error:  # noqa: BLE001 - counted and reported
            failures.append(f"session {index}: {error!r}"[:300])

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(count)))
    return {
        "wall_ms": (time.perf_counter() - started) * 1000,
        "action_ms": action_ms,
        "completed": len(action_ms) - len(failures),
        "failures": failures[:5],
        "failed": len(failures),
    }


CODE = (
    "import time\nfor _ in range({prints}):\n"
    "    print(time.time(), flush=True)\n    time.sleep(0.2)"
)


async def mcp_lag(endpoint: Endpoint, executor: str, prints: int) -> list[float]:
    lags: list[float] = []

    async def logged(params) -> None:
        received = time.time()
        for line in str(params.data).split():
            lags.append((received - float(line)) * 1000)

    async with endpoint.session(logging_callback=logged) as mcp:
        await run_python(mcp, executor, CODE.format(prints=prints))
    return lags


async def log_lag(
    api: client.ApiClient, endpoint: Endpoint, namespace: str, executor: str, prints: int
) -> list[float]:
    """The same code as an Execution, followed through the log subresource with the same token
    and HTTP client as the MCP session."""
    objects = client.CustomObjectsApi(api)
    name = f"lag-{uuid.uuid4().hex[:8]}"
    body = {
        "apiVersion": "briq.cloud/v1alpha1",
        "kind": "Execution",
        "metadata": {"name": name},
        "spec": {"executorRef": {"name": executor}, "code": CODE.format(prints=prints)},
    }
    objects.create_namespaced_custom_object("briq.cloud", "v1alpha1", namespace, "executions", body)
    url = (
        f"{api.configuration.host}/apis/subresources.briq.cloud/v1alpha1/namespaces/{namespace}"
        f"/executions/{name}/log?follow=true"
    )
    lags: list[float] = []
    async with httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {endpoint.token}"},
        verify=ssl.create_default_context(cafile=endpoint.ca),
        timeout=120,
    ) as http:
        async with http.stream("GET", url) as response:
            async for line in response.aiter_lines():
                received = time.time()
                if line.strip():
                    lags.append((received - float(line)) * 1000)
    return lags


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--executors", required=True, help="comma separated")
    parser.add_argument("--phase", choices=["latency", "sessions", "lag"], required=True)
    parser.add_argument("--actions", type=int, default=10)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--prints", type=int, default=20)
    args = parser.parse_args()
    api = config.new_client_from_config(config_file=args.kubeconfig, persist_config=False)
    endpoint = Endpoint(api, args.namespace)
    executors = args.executors.split(",")
    if args.phase == "latency":
        out = asyncio.run(
            latency(args.kubeconfig, endpoint, args.namespace, executors[0], args.actions)
        )
    elif args.phase == "sessions":
        out = asyncio.run(sessions(endpoint, executors, args.sessions, args.actions))
    else:
        out = {
            "mcp_ms": asyncio.run(mcp_lag(endpoint, executors[0], args.prints)),
            "log_ms": asyncio.run(
                log_lag(api, endpoint, args.namespace, executors[0], args.prints)
            ),
        }
    print(json.dumps(out), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
