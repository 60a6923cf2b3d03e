"""The agent-side distribution, briq-operator-client: for agent hosts (no Jupyter kernel, no
sandbox bridge), versioned as the crate, importable under its former name, and released as a
wheel and an sdist whose metadata PyPI would accept (dev/release-python.sh, `make release`)."""

from __future__ import annotations

import email.parser
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import tomllib

AGENT = Path(__file__).resolve().parents[1]
REPO = AGENT.parents[1]
KERNEL_DISTRIBUTIONS = {"ipykernel", "jupyter-client"}
KERNEL_MODULES = {"briq_sandbox", "ipykernel", "jupyter_client"}
IMPORT_PACKAGES = {"briq_operator_client", "briq_bridge"}


def distribution_name(requirement: str) -> str:
    """`jupyter_client>=8,<9` -> `jupyter-client` (PEP 503 normalization of the leading name)."""
    name = requirement
    for stop in "<>=!~;[ (@":
        name = name.split(stop, 1)[0]
    return name.strip().lower().replace("_", "-").replace(".", "-")


def project() -> dict:
    return tomllib.loads((AGENT / "pyproject.toml").read_text())["project"]


def crate_version() -> str:
    return tomllib.loads((REPO / "Cargo.toml").read_text())["package"]["version"]


def run_in_checkout(code: str) -> list:
    """Runs `code` in a fresh interpreter whose cwd is the agent project, so this checkout's
    packages are the ones imported; returns the JSON of its last printed line."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=AGENT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_agent_distribution_does_not_pull_the_kernel():
    assert project()["name"] == "briq-operator-client"
    requirements = list(project().get("dependencies", []))
    for extra in project().get("optional-dependencies", {}).values():
        requirements += extra
    names = {distribution_name(requirement) for requirement in requirements}
    assert names == {"smolagents", "kubernetes"}
    assert not names & KERNEL_DISTRIBUTIONS


def test_importing_the_executor_loads_no_kernel_module():
    location, modules = run_in_checkout(
        "import json, sys\n"
        "import briq_operator_client\n"
        "from briq_operator_client import KubernetesExecutor\n"
        "print(json.dumps([briq_operator_client.__file__, sorted(sys.modules)]))\n"
    )
    assert Path(location).resolve() == AGENT / "briq_operator_client" / "__init__.py"
    loaded = {module.split(".")[0] for module in modules}
    assert not loaded & KERNEL_MODULES, sorted(loaded & KERNEL_MODULES)
    assert "briq_operator_client.kubernetes_executor" in modules


def test_the_client_version_is_the_crates():
    version = crate_version()
    assert project()["version"] == version, (
        f"bridge/agent/pyproject.toml has version {project()['version']}, Cargo.toml {version}: "
        "change both together"
    )
    (installed,) = run_in_checkout(
        "import json, briq_operator_client\nprint(json.dumps([briq_operator_client.__version__]))"
    )
    assert installed == version, "rerun .ci/python-env.sh: the editable install is stale"


def test_the_former_import_name_gives_the_same_objects():
    # The old names imported first, submodules included, then the new ones: one module each.
    same, public = run_in_checkout(
        "import json, sys\n"
        "import briq_bridge.kubernetes_executor\n"
        "from briq_bridge import KubernetesExecutor, ExecutorUnusableError\n"
        "from briq_bridge.vocabulary import TRACEPARENT_ANNOTATION, UNUSABLE_REASONS\n"
        "import briq_bridge, briq_operator_client\n"
        "from briq_operator_client import kubernetes_executor, vocabulary\n"
        "same = {\n"
        "    'KubernetesExecutor': KubernetesExecutor is briq_operator_client.KubernetesExecutor,\n"
        "    'ExecutorUnusableError': ExecutorUnusableError\n"
        "        is briq_operator_client.ExecutorUnusableError,\n"
        "    'kubernetes_executor': briq_bridge.kubernetes_executor is kubernetes_executor\n"
        "        and sys.modules['briq_bridge.kubernetes_executor'] is kubernetes_executor,\n"
        "    'vocabulary': sys.modules['briq_bridge.vocabulary'] is vocabulary\n"
        "        and UNUSABLE_REASONS is vocabulary.UNUSABLE_REASONS\n"
        "        and TRACEPARENT_ANNOTATION == vocabulary.TRACEPARENT_ANNOTATION,\n"
        "    '__version__': briq_bridge.__version__ == briq_operator_client.__version__,\n"
        "}\n"
        "public = {name: getattr(briq_bridge, name) is getattr(briq_operator_client, name)\n"
        "          for name in briq_operator_client.__all__}\n"
        "print(json.dumps([same, public]))\n"
    )
    assert all(same.values()), same
    assert public and all(public.values()), public


def test_the_wheel_and_the_sdist_pass_twine_and_hold_the_client_only(release_python):
    # `twine check --strict` passed on both (the fixture); here, what they hold.
    version = crate_version()
    wheel, sdist = release_python["wheel"], release_python["sdist"]
    assert wheel.name == f"briq_operator_client-{version}-py3-none-any.whl"
    assert sdist.name == f"briq_operator_client-{version}.tar.gz"

    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = f"briq_operator_client-{version}.dist-info"
        metadata = email.parser.Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
    tops = {name.split("/")[0] for name in names}
    assert tops == IMPORT_PACKAGES | {dist_info}, sorted(tops)
    for package in IMPORT_PACKAGES:
        assert f"{package}/__init__.py" in names
    assert "briq_operator_client/vocabulary.py" in names
    assert not [name for name in names if "test" in name.lower()], names

    assert metadata["Name"] == "briq-operator-client"
    assert metadata["Version"] == version
    assert metadata["Summary"] == project()["description"]
    assert metadata["License-Expression"] == "Apache-2.0"  # the crate's license (Cargo.toml)
    assert metadata["Requires-Python"] == ">=3.10"
    requires = {distribution_name(r) for r in metadata.get_all("Requires-Dist")}
    assert requires == {"smolagents", "kubernetes"}
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().strip() == (AGENT / "README.md").read_text().strip()
    assert "pip install briq-operator-client" in metadata.get_payload()

    with tarfile.open(sdist) as archive:
        members = [member.name for member in archive.getmembers()]
        pkg_info = archive.extractfile(f"briq_operator_client-{version}/PKG-INFO").read()
    root = f"briq_operator_client-{version}"
    for package in IMPORT_PACKAGES:
        assert f"{root}/{package}/__init__.py" in members
    assert f"{root}/pyproject.toml" in members and f"{root}/README.md" in members
    assert not [name for name in members if "/tests" in name], members
    assert email.parser.Parser().parsestr(pkg_info.decode())["Version"] == version
