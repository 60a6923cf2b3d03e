"""The released wheel works on its own: installed into a fresh venv (no checkout on its path,
dependencies from the wheelhouse .ci/python-env.sh filled, no network), it runs a CodeAgent step
against the real kube-apiserver, operator and local sandbox server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

from briq_dev import scripted_model

from .conftest import REPO

GROUP, VERSION = "briq.cloud", "v1alpha1"

# Run by the fresh venv's Python, from a directory holding only this and scripted_model.py.
STEP = """
import json, sys

import briq_bridge
import briq_operator_client
from briq_operator_client import KubernetesExecutor
from scripted_model import ScriptedModel, action
from smolagents import CodeAgent
from smolagents.monitoring import AgentLogger, LogLevel

kubeconfig, executor_name = sys.argv[1:]
model = ScriptedModel([action("The sandbox computes it.", "final_answer(6 * 7)")])
with KubernetesExecutor(
    [], AgentLogger(level=LogLevel.OFF), executor_name=executor_name, kubeconfig=kubeconfig
) as executor:
    agent = CodeAgent(
        tools=[], model=model, executor=executor, max_steps=2, verbosity_level=LogLevel.OFF
    )
    answer = agent.run("What is 6 times 7?")
    print(json.dumps({
        "file": briq_operator_client.__file__,
        "version": briq_operator_client.__version__,
        "alias": briq_bridge.KubernetesExecutor is KubernetesExecutor,
        "answer": answer,
        "model_calls": len(model.calls),
        "execution": executor.last_execution,
    }))
"""


def wheelhouse() -> Path:
    """.ci/python-env.sh's wheelhouse-HASH beside this venv-HASH."""
    venv = Path(sys.prefix)
    assert venv.name.startswith("venv-"), f"run the tests with .ci/python-env.sh's venv: {venv}"
    found = venv.with_name("wheelhouse-" + venv.name.removeprefix("venv-"))
    assert (found / ".briq-complete").is_file(), f"{found} is not filled: run .ci/python-env.sh"
    return found


def offline_env() -> dict[str, str]:
    """This environment without pip's settings (an index, find-links) and config files, and
    without PYTHONPATH: pip sees only the wheelhouse, Python only the fresh venv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def run(command: list, **options) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, **options)
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done


def test_the_built_wheel_installed_in_a_fresh_venv_runs_a_code_agent_step(
    release_python, shared_executor, kubeconfig, custom_objects, tmp_path
):
    fresh = tmp_path / "fresh"
    run([sys.executable, "-m", "venv", str(fresh)], env=offline_env())
    python = fresh / "bin" / "python"
    run(
        [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
        + ["--no-index", "--find-links", str(wheelhouse()), str(release_python["wheel"])],
        env=offline_env(),
    )

    work = tmp_path / "work"
    work.mkdir()
    (work / "step.py").write_text(STEP)
    shutil.copy(scripted_model.__file__, work / "scripted_model.py")
    # -E: no PYTHONPATH, -s: no user site; the script's directory is the only one added.
    done = run(
        [python, "-E", "-s", "step.py", kubeconfig, shared_executor.executor_name],
        cwd=work,
        env=offline_env(),
    )
    result = json.loads(done.stdout.splitlines()[-1])

    location = Path(result["file"]).resolve()
    assert location.is_relative_to(fresh.resolve()), location
    assert not location.is_relative_to(REPO), location
    version = tomllib.loads((REPO / "Cargo.toml").read_text())["package"]["version"]
    assert result["version"] == version
    assert result["alias"] is True
    assert result["answer"] == 42
    assert result["model_calls"] == 1
    execution = custom_objects.get_namespaced_custom_object(
        GROUP, VERSION, "default", "executions", result["execution"]
    )
    assert execution["spec"]["code"] == "final_answer(6 * 7)"
    conditions = execution["status"]["conditions"]
    assert [c["reason"] for c in conditions if c["type"] == "Succeeded"] == ["FinalAnswer"]
