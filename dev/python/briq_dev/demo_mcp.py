"""The demo's MCP client: the official MCP Python SDK, as any agent framework's MCP client would
connect, on the namespace's endpoint of the operator's aggregated API.

    KUBECONFIG=... python -m briq_dev.demo_mcp --namespace default --executor demo

It authenticates as an agent in a pod would, with a ServiceAccount token: it makes (once) the
ServiceAccount `demo-mcp-agent` with a Role to run code on the namespace's executors, asks a
token for it, then lists the executors, runs two actions on `--executor` (the second sees the
first's variable) and prints each tool's text, then `answer: <output>`.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl

import httpx2
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

ACCOUNT = "demo-mcp-agent"
RULES = [
    {
        "apiGroups": ["briq.cloud"],
        "resources": ["briqexecutors", "executions"],
        "verbs": ["get", "list", "watch", "create"],
    },
    {
        "apiGroups": ["subresources.briq.cloud"],
        "resources": ["mcp"],
        "verbs": ["create", "deletecollection"],
    },
]


def _exists_ok(create, *args) -> None:
    try:
        create(*args)
    except ApiException as error:
        if error.status != 409:
            raise


def agent_token(api: client.ApiClient, namespace: str) -> str:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    _exists_ok(core.create_namespaced_service_account, namespace, {"metadata": {"name": ACCOUNT}})
    _exists_ok(
        rbac.create_namespaced_role, namespace, {"metadata": {"name": ACCOUNT}, "rules": RULES}
    )
    binding = {
        "metadata": {"name": ACCOUNT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACCOUNT},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}],
    }
    _exists_ok(rbac.create_namespaced_role_binding, namespace, binding)
    request = {"spec": {"expirationSeconds": 600}}
    return core.create_namespaced_service_account_token(ACCOUNT, namespace, request).status.token


async def converse(url: str, token: str, ca: str, executor: str) -> str:
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        verify=ssl.create_default_context(cafile=ca),
        timeout=60,
    )
    async with (
        http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as mcp,
    ):
        info = await mcp.initialize()
        tools = [tool.name for tool in (await mcp.list_tools()).tools]
        server = f"{info.server_info.name} {info.server_info.version}"
        print(f"connected to {server}: {', '.join(tools)}")
        listed = await mcp.call_tool("list_executors", {})
        print(f"list_executors: {listed.content[0].text}")
        for code in ("squares = [n * n for n in range(10)]\nprint('squares made')", "sum(squares)"):
            result = await mcp.call_tool("run_python", {"executor": executor, "code": code})
            if result.is_error:
                raise SystemExit(f"run_python failed: {result.content[0].text}")
            shown = code.replace("\n", "; ")
            print(f"run_python {shown!r}: {result.content[0].text.strip()}")
        return result.structured_content["output"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--executor", required=True)
    args = parser.parse_args()
    api = config.new_client_from_config(persist_config=False)
    token = agent_token(api, args.namespace)
    url = (
        f"{api.configuration.host}/apis/subresources.briq.cloud/v1alpha1/namespaces/"
        f"{args.namespace}/mcp"
    )
    output = asyncio.run(converse(url, token, api.configuration.ssl_ca_cert, args.executor))
    print(f"answer: {output}", flush=True)


if __name__ == "__main__":
    main()
