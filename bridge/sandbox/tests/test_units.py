"""Pure helpers of briq_sandbox.py, without a kernel."""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from pathlib import Path

import pytest
from conftest import SPILL_THRESHOLD, parse_envelope

SANDBOX_IMAGE = Path(__file__).resolve().parents[3] / "images" / "sandbox"


@pytest.fixture(scope="module")
def sandbox(bridge_module):
    return bridge_module


def test_clipped_text_keeps_short_text(sandbox):
    text = sandbox.ClippedText(10)
    text.add("abc")
    text.add("def")
    assert text.render(10) == ("abcdef", False)


def test_clipped_text_keeps_head_and_tail_of_a_flood(sandbox):
    text = sandbox.ClippedText(1_000)
    for i in range(10_000):
        text.add(f"{i:05d}\n")
    assert len(text) == 60_000
    rendered, truncated = text.render(1_000)
    assert truncated and len(rendered) <= 1_000
    assert rendered.startswith("00000\n") and rendered.endswith("09999\n")
    head, _, rest = rendered.partition("\n… [truncated ")
    dropped = int(rest.split(" ")[0])
    tail = rest.split(" characters] …\n", 1)[1]
    assert len(head) + dropped + len(tail) == 60_000


def test_share_budget(sandbox):
    assert sandbox.share_budget(10, 20, 100) == (10, 20)
    assert sandbox.share_budget(1_000, 20, 100) == (80, 20)
    assert sandbox.share_budget(20, 1_000, 100) == (20, 80)
    assert sandbox.share_budget(1_000, 1_000, 100) == (50, 50)


def test_rejected_tags_match_smolagents_serialization(sandbox):
    import numpy as np
    import PIL.Image
    from smolagents.serialization import SafeSerializer

    tags = {
        SafeSerializer.to_json_safe(np.zeros(1))["__type__"],
        SafeSerializer.to_json_safe(PIL.Image.new("L", (1, 1)))["__type__"],
    }
    assert tags == sandbox.REJECTED_TAGS


def test_too_deeply_nested_answer_is_refused(sandbox):
    value = "safe:" + "[" * 5_000 + "]" * 5_000
    # Deeper than the json module recurses: refused, not a crash of the bridge.
    assert "not valid JSON" in sandbox.final_answer_problem(value)


def test_envelope_is_one_ascii_line_even_for_hostile_text(sandbox):
    stream = io.StringIO()
    hostile = "line\nbreak\r\u2028sep \ud800 lone surrogate \x00 nul 🙂"
    sandbox.write_envelope(stream, "N" * 16, sandbox.result_envelope("ok", logs=hostile))
    envelope = parse_envelope(stream.getvalue(), "N" * 16)
    assert envelope["logs"] == hostile.replace("\ud800", "?")
    json.dumps(envelope).encode("utf-8")  # valid Unicode throughout


def test_ansi_is_stripped(sandbox):
    coloured = "\x1b[0;31mred\x1b[0m \x1b]8;;http://x\x07link\x1b]8;;\x07"
    assert sandbox.strip_ansi(coloured) == "red link"


def sized_envelope(sandbox, nonce: str, size: int) -> dict:
    """A result envelope whose framed text is exactly `size` bytes."""
    base = len(sandbox.frame(nonce, sandbox.result_envelope("ok", logs="")))
    return sandbox.result_envelope("ok", logs="x" * (size - base))


def test_spill_threshold_is_exclusive(sandbox, tmp_path):
    nonce = "N" * 16
    at_limit = sized_envelope(sandbox, nonce, SPILL_THRESHOLD)
    assert len(sandbox.frame(nonce, at_limit)) == SPILL_THRESHOLD
    results = tmp_path / ".briq" / "results"
    stream = io.StringIO()
    sandbox.write_envelope(stream, nonce, at_limit, results)
    assert stream.getvalue() == sandbox.frame(nonce, at_limit)
    assert not results.exists()

    over = sized_envelope(sandbox, nonce, SPILL_THRESHOLD + 1)
    stream = io.StringIO()
    sandbox.write_envelope(stream, nonce, over, results)
    data = (results / f"{nonce}.out").read_bytes()
    assert data == sandbox.frame(nonce, over).encode("ascii")
    pointer = {"kind": "spilled", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert len(data) == SPILL_THRESHOLD + 1
    assert stream.getvalue() == sandbox.frame(nonce, pointer)
    assert parse_envelope(stream.getvalue(), nonce, tmp_path) == over


def test_spilling_removes_only_stale_files(sandbox, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    now = time.time()
    ages = {"old.out": 11 * 60, ".old.tmp": 60 * 60, "recent.out": 9 * 60, "fresh.out": 0}
    for name, age in ages.items():
        (results / name).write_text(name)
        os.utime(results / name, (now - age, now - age))
    (results / "old-dir").mkdir()
    os.utime(results / "old-dir", (now - 3600, now - 3600))
    nonce = "S" * 16
    sandbox.write_envelope(io.StringIO(), nonce, sized_envelope(sandbox, nonce, 40_000), results)
    assert sorted(p.name for p in results.iterdir()) == sorted(
        ["recent.out", "fresh.out", "old-dir", f"{nonce}.out"]
    )


def test_spill_file_that_cannot_be_written_is_a_bridge_failure(
    sandbox, tmp_path, monkeypatch, capsys
):
    big = sandbox.kernel_envelope(True, False, 1, "m" * 40_000)
    monkeypatch.setattr(sandbox, "cmd_probe", lambda args: (big, 0))
    # Not the root layout checks (they would refuse this .briq first): the spill itself fails.
    monkeypatch.setattr(sandbox, "split_users", lambda: False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".briq").mkdir()
    (tmp_path / ".briq" / "results").write_text("not a directory")
    nonce = "F" * 16
    monkeypatch.setenv("BRIQ_NONCE", nonce)
    assert sandbox.main(["probe"]) == 1
    envelope = parse_envelope(capsys.readouterr().out, nonce)
    assert envelope["kind"] == "kernel" and envelope["alive"] is False
    assert "could not write the large envelope to .briq/results" in envelope["message"]

    (tmp_path / ".briq" / "results").unlink()
    monkeypatch.setenv("BRIQ_NONCE", nonce)  # main() takes it out of the environment
    assert sandbox.main(["probe"]) == 0
    assert parse_envelope(capsys.readouterr().out, nonce, tmp_path) == big


def sandbox_image_pins() -> dict[str, str]:
    """images/sandbox/requirements.txt as {distribution (normalized): version}."""
    path = SANDBOX_IMAGE / "requirements.txt"
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{line!r} is not an exact pin"
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_the_sandbox_image_preinstalls_exactly_what_setup_accepts(sandbox):
    """An executor on the prebuilt image must make no pip call: each pin is inside the range
    setup accepts, and nothing setup checks is left out."""
    pins = sandbox_image_pins()
    wanted = {dist.lower(): accept for _, dist, _, accept in sandbox.BASE_PACKAGES}
    assert set(pins) == set(wanted)
    for distribution, version in pins.items():
        assert wanted[distribution](sandbox.release_tuple(version)), (distribution, version)
    dockerfile = (SANDBOX_IMAGE / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM python:3.12-slim" in dockerfile
    assert "-r /tmp/briq-requirements.txt" in dockerfile


def test_the_run_client_waits_as_long_as_the_bridge_does(sandbox):
    """briq_run.py cannot import the bridge (it imports built-ins only): its copies of the
    bridge's waits and limits are read from its source and compared."""
    import ast

    source = (Path(__file__).resolve().parents[1] / "briq_run.py").read_text()
    # Number and string literals, or arithmetic on them: nothing else is evaluated.
    constants = {
        node.targets[0].id: eval(compile(ast.Expression(node.value), "briq_run.py", "eval"))  # noqa: S307
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign)
        and node.targets[0].id.isupper()
        and all(
            isinstance(part, ast.Constant | ast.BinOp | ast.operator)
            for part in ast.walk(node.value)
        )
    }
    assert constants["ANSWER_MARGIN_S"] == (
        sandbox.RUNNER_ANSWER_MARGIN_S + sandbox.INTERRUPT_GRACE_S
    )
    assert constants["CONNECT_WAIT_S"] == sandbox.RUNNER_PING_WAIT_S
    assert constants["MAX_ANSWER_BYTES"] == sandbox.RUNNER_MAX_ANSWER_BYTES
    assert constants["ENV_MAX_BYTES"] == sandbox.ENV_MAX_BYTES
    assert constants["NONCE_ENV"] == sandbox.NONCE_ENV


def test_a_syntax_error_names_the_action_not_the_kernels_cell_file(sandbox):
    located = sandbox.action_located
    assert located("invalid syntax (2747763117.py, line 1)") == "invalid syntax (<action>, line 1)"
    assert (
        located("expected ':' (/tmp/ipykernel_77/3311.py, line 12)")
        == "expected ':' (<action>, line 12)"
    )
    # Messages that name something else keep it.
    assert located("division by zero") == "division by zero"
    assert located("bad input (module.py, line 3)") == "bad input (module.py, line 3)"
