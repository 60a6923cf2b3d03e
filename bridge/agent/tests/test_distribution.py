"""The agent-side distribution is for agent hosts: no Jupyter kernel, no sandbox bridge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import tomllib

AGENT = Path(__file__).resolve().parents[1]
KERNEL_DISTRIBUTIONS = {"ipykernel", "jupyter-client"}
KERNEL_MODULES = {"briq_sandbox", "ipykernel", "jupyter_client"}


def distribution_name(requirement: str) -> str:
    """`jupyter_client>=8,<9` -> `jupyter-client` (PEP 503 normalization of the leading name)."""
    name = requirement
    for stop in "<>=!~;[ (@":
        name = name.split(stop, 1)[0]
    return name.strip().lower().replace("_", "-").replace(".", "-")


def test_agent_distribution_does_not_pull_the_kernel():
    project = tomllib.loads((AGENT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "briq-bridge"
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    names = {distribution_name(requirement) for requirement in requirements}
    assert names == {"smolagents", "kubernetes"}
    assert not names & KERNEL_DISTRIBUTIONS


def test_importing_the_executor_loads_no_kernel_module():
    code = (
        "import json, sys\n"
        "import briq_bridge\n"
        "from briq_bridge import KubernetesExecutor\n"
        "print(json.dumps([briq_bridge.__file__, sorted(sys.modules)]))\n"
    )
    # cwd is the agent project, so this checkout's briq_bridge is the one imported.
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=AGENT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    location, modules = json.loads(done.stdout.splitlines()[-1])
    assert Path(location).resolve() == AGENT / "briq_bridge" / "__init__.py"
    loaded = {module.split(".")[0] for module in modules}
    assert not loaded & KERNEL_MODULES, sorted(loaded & KERNEL_MODULES)
    assert "briq_bridge.kubernetes_executor" in modules
