"""`save-state` / `restore-state` (PROTOCOL.md "Saving and restoring the namespace"): the kernel
pickles its own user namespace into a file in its user's directory, and a fresh kernel unpickles
it; what cannot be saved is listed by name with why; the bridge reports only the kernel's answer
to its own request, so user code can neither leave the snippet's traces nor forge its summary."""

from __future__ import annotations

import ast
import copy
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import KERNEL_UID, SPLIT, process_gone

STATE_FILE = (".briq-state", "namespace.pickle")


def save(sandbox, *options: str):
    return sandbox.bridge("save-state", *options)


def restore(sandbox, *options: str):
    return sandbox.bridge("restore-state", *options)


def ok(call) -> dict:
    """The envelope of a call that succeeded."""
    assert (call.returncode, call.envelope["ok"]) == (0, True), (call.envelope, call.stderr)
    return call.envelope


def replace_kernel(sandbox) -> None:
    """Kill the kernel (its Python state is gone) and start a fresh one, as a resume does."""
    old = sandbox.kernel_pid()
    sandbox.stop_kernel()
    assert process_gone(old), "the old kernel did not die"
    started = sandbox.start_kernel()
    assert started["started"] and started["pid"] != old


def value(sandbox, expression: str):
    """`expression` evaluated in the kernel, as a Python literal."""
    result = sandbox.run(expression)
    assert result["status"] == "ok", result
    return ast.literal_eval(result["output"])


def state_file(sandbox):
    return sandbox.user_dir.joinpath(*STATE_FILE)


def test_values_functions_classes_and_module_aliases_come_back_in_a_fresh_kernel(fresh_sandbox):
    setup = fresh_sandbox.run(
        "import json as j\n"
        "x = 41\n"
        "d = {'a': [1, 2], 'b': {'c': None}}\n"
        "def f(n):\n"
        "    return n + x\n"
        "class C:\n"
        "    def __init__(self, v):\n"
        "        self.v = v\n"
        "    def twice(self):\n"
        "        return 2 * self.v\n"
        "c = C(21)\n"
    )
    assert setup["status"] == "ok", setup
    saved = ok(save(fresh_sandbox))
    assert sorted(saved["saved"]) == sorted(["j", "x", "d", "f", "C", "c"])
    assert saved["unsaved"] == []
    path = state_file(fresh_sandbox)
    assert saved["bytes"] == path.stat().st_size > 0
    if SPLIT:  # written by the kernel, as its own user
        assert path.stat().st_uid == KERNEL_UID

    replace_kernel(fresh_sandbox)
    assert fresh_sandbox.run("x")["status"] == "error"  # the fresh kernel knows nothing
    restored = ok(restore(fresh_sandbox))
    assert sorted(restored["saved"]) == sorted(saved["saved"])
    assert restored["unsaved"] == []
    assert restored["bytes"] == saved["bytes"]
    assert value(
        fresh_sandbox,
        "(x, d, f(1), c.twice(), isinstance(c, C), C(2).twice(), j.dumps([1]), j.__name__)",
    ) == (41, {"a": [1, 2], "b": {"c": None}}, 42, 42, True, 4, "[1]", "json")


def test_a_restored_namespace_saves_and_restores_again(fresh_sandbox):
    # Restored functions and classes (one without any method) keep their source for the next
    # save; an alias of a function is saved by reference to it.
    setup = fresh_sandbox.run(
        "import functools\n"
        "@functools.lru_cache\n"
        "def square(n):\n"
        "    return n * n\n"
        "class Empty:\n"
        "    pass\n"
        "class Base:\n"
        "    kind = 'base'\n"
        "class Child(Base):\n"
        "    def kind_of(self):\n"
        "        return self.kind\n"
        "alias = Child\n"
        "e = Empty()\n"
    )
    assert setup["status"] == "ok", setup
    names = ["functools", "square", "Empty", "Base", "Child", "alias", "e"]
    for _cycle in range(2):
        assert sorted(ok(save(fresh_sandbox))["saved"]) == sorted(names)
        replace_kernel(fresh_sandbox)
        restored = ok(restore(fresh_sandbox))
        assert (sorted(restored["saved"]), restored["unsaved"]) == (sorted(names), [])
        expected = (9, "base", True, "Empty")
        check = "(square(3), alias().kind_of(), alias is Child, type(e).__name__)"
        assert value(fresh_sandbox, check) == expected


def test_what_cannot_be_saved_is_listed_with_why_and_the_rest_still_comes_back(fresh_sandbox):
    setup = fresh_sandbox.run(
        "import socket, threading\n"
        "before = 1\n"
        "sock = socket.socket()\n"
        "gen = (i for i in range(3))\n"
        "lock = threading.Lock()\n"
        "square = lambda n: n * n\n"
        "after = [before, 2]\n"
    )
    assert setup["status"] == "ok", setup
    saved = ok(save(fresh_sandbox))
    assert saved["saved"] == ["socket", "threading", "before", "after"]
    why = {entry["name"]: entry["why"] for entry in saved["unsaved"]}
    assert list(why) == ["sock", "gen", "lock", "square"]
    assert "socket" in why["sock"] and "generator" in why["gen"] and "lock" in why["lock"]
    assert "lambda" in why["square"]
    assert all(0 < len(text) <= 200 for text in why.values())
    for name in why:
        assert name in saved["message"]

    replace_kernel(fresh_sandbox)
    restored = ok(restore(fresh_sandbox))
    assert (restored["saved"], restored["unsaved"]) == (saved["saved"], [])
    assert value(fresh_sandbox, "(before, after, 'sock' in globals(), 'gen' in globals())") == (
        1,
        [1, 2],
        False,
        False,
    )


def test_restore_with_nothing_saved_is_ok_and_empty(fresh_sandbox):
    assert not state_file(fresh_sandbox).exists()
    restored = ok(restore(fresh_sandbox))
    assert (restored["saved"], restored["unsaved"], restored["bytes"]) == ([], [], 0)
    assert "nothing was saved" in restored["message"]


def test_save_with_an_empty_namespace_is_ok_and_empty(fresh_sandbox):
    saved = ok(save(fresh_sandbox))
    assert (saved["saved"], saved["unsaved"]) == ([], [])
    # The file is written all the same, so that an older state can never come back.
    assert saved["bytes"] == state_file(fresh_sandbox).stat().st_size
    restored = ok(restore(fresh_sandbox))
    assert (restored["saved"], restored["unsaved"]) == ([], [])


SNAPSHOT = (
    "__import__('builtins').__dict__.setdefault('briq_test_snapshots', []).append(("
    "sorted(get_ipython().user_ns), list(In), get_ipython().execution_count, "
    "list(get_ipython().history_manager.input_hist_raw), "
    "{k: repr(v) for k, v in get_ipython().user_ns.items() if k in ('a', 'b')}))"
)


def test_saving_and_restoring_leave_no_trace_in_the_namespace_or_the_history(fresh_sandbox):
    setup = fresh_sandbox.run("import json as j\na = 1\nb = {'k': [a]}\ndef f():\n    return a")
    assert setup["status"] == "ok", setup
    fresh_sandbox.run(SNAPSHOT)
    ok(save(fresh_sandbox))
    ok(restore(fresh_sandbox))
    fresh_sandbox.run(SNAPSHOT)
    first, second = value(fresh_sandbox, "__import__('builtins').briq_test_snapshots")
    names, inputs, count, history, values = first
    # Exactly what running the second snapshot cell itself adds: its input and `_iN`.
    assert sorted(set(second[0]) - set(names)) == [f"_i{count}"]
    assert set(names) - set(second[0]) == set()
    assert len(second[1]) == len(inputs) + 1 and second[1][:-1] == inputs
    assert second[2] == count + 1
    assert second[3][:-1] == history and second[3][-1] == SNAPSHOT
    assert second[4] == values
    assert sorted(os.listdir(state_file(fresh_sandbox).parent)) == ["namespace.pickle"]


FORGED = '{"kind":"state","ok":true,"saved":["forged"],"unsaved":[],"bytes":1,"message":"x"}'


def test_user_code_cannot_forge_the_summary(fresh_sandbox):
    # A snippet that printed its summary, or serialized it with the kernel's json module, would
    # report these forgeries; printed text also comes on every request through a hook.
    forge = (
        "import builtins, json, sys\n"
        f"FORGED = {FORGED!r}\n"
        "_dumps, _loads, _print = json.dumps, json.loads, builtins.print\n"
        "def _forged_dumps(obj, *args, **kwargs):\n"
        "    if isinstance(obj, dict) and 'saved' in obj:\n"
        "        obj = {**obj, 'saved': ['forged']}\n"
        "    return _dumps(obj, *args, **kwargs)\n"
        "def _forged_loads(text, *args, **kwargs):\n"
        "    obj = _loads(text, *args, **kwargs)\n"
        "    if isinstance(obj, dict) and 'saved' in obj:\n"
        "        obj['saved'] = ['forged']\n"
        "    return obj\n"
        "json.dumps, json.loads = _forged_dumps, _forged_loads\n"
        "builtins.print = lambda *args, **kwargs: _print(FORGED, **kwargs)\n"
        "get_ipython().events.register('pre_execute', lambda: _print(FORGED, flush=True))\n"
        "print('anything')\n"
        "real = 1\n"
    )
    result = fresh_sandbox.run(forge)
    assert result["status"] == "ok" and FORGED in result["logs"], result
    saved = ok(save(fresh_sandbox))
    assert saved["saved"] == ["builtins", "json", "sys", "FORGED", "real"]
    assert saved["unsaved"] == [] and saved["bytes"] == state_file(fresh_sandbox).stat().st_size
    restored = ok(restore(fresh_sandbox))
    assert restored["saved"] == saved["saved"]


def test_names_that_shadow_builtins_do_not_break_saving(fresh_sandbox):
    shadows = ["list", "dict", "len", "str", "type", "isinstance", "exec", "print", "open"]
    setup = fresh_sandbox.run("\n".join(f"{name} = {index}" for index, name in enumerate(shadows)))
    assert setup["status"] == "ok", setup
    saved = ok(save(fresh_sandbox))
    assert (sorted(saved["saved"]), saved["unsaved"]) == (sorted(shadows), [])
    replace_kernel(fresh_sandbox)
    assert sorted(ok(restore(fresh_sandbox))["saved"]) == sorted(shadows)
    assert value(fresh_sandbox, "(list, open, exec)") == (0, 8, 6)


def test_save_state_on_a_dead_kernel_says_the_kernel_is_gone(fresh_sandbox):
    pid = fresh_sandbox.kernel_pid()
    os.kill(pid, signal.SIGKILL)
    assert process_gone(pid)
    for command in (save, restore):
        call = command(fresh_sandbox)
        assert call.returncode == 1
        envelope = call.envelope
        assert (envelope["ok"], envelope["saved"], envelope["unsaved"]) == (False, [], [])
        assert "gone" in envelope["message"] and str(pid) in envelope["message"]


def test_a_save_past_its_deadline_is_interrupted_and_the_previous_file_stays(fresh_sandbox):
    fresh_sandbox.run("kept = 1")
    first = ok(save(fresh_sandbox))
    before = state_file(fresh_sandbox).read_bytes()
    setup = fresh_sandbox.run(
        "class Slow:\n"
        "    def __reduce__(self):\n"
        "        while True:\n"
        "            pass\n"
        "slow = Slow()\n"
    )
    assert setup["status"] == "ok", setup
    call = save(fresh_sandbox, "--deadline", "2")
    assert call.returncode == 1 and call.envelope["ok"] is False
    assert "deadline" in call.envelope["message"] and "idle again" in call.envelope["message"]
    assert state_file(fresh_sandbox).read_bytes() == before
    assert sorted(os.listdir(state_file(fresh_sandbox).parent)) == ["namespace.pickle"]
    assert first["saved"] == ["kept"]
    assert value(fresh_sandbox, "kept + 1") == 2  # the kernel still works


@pytest.mark.parametrize(
    ("chatty", "says"),
    [(False, "did not answer"), (True, "busy and had not started it")],
    ids=["quiet", "chatty"],
)
def test_a_kernel_busy_with_an_action_is_not_interrupted(fresh_sandbox, chatty, says):
    # The operator saves idle executors only; should it ask a busy one, the action (run by the
    # runner) is left alone and the save says why it did not happen. A quiet action keeps the
    # bridge from even subscribing (nothing is sent); a chatty one lets it queue its request.
    running_file, go = fresh_sandbox.user_dir / "running", fresh_sandbox.user_dir / "go"
    action = (
        "import os, time\n"
        f"open({str(running_file)!r}, 'w').close()\n"
        f"while not os.path.exists({str(go)!r}):\n"
        f"    {'print(1, flush=True)' if chatty else 'pass'}\n"
        "    time.sleep(0.05)\n"
        "'finished'"
    )
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(fresh_sandbox.run, action, 60)
        deadline = time.monotonic() + 30
        while not running_file.exists():  # the kernel is busy with the action
            assert time.monotonic() < deadline and not running.done()
            time.sleep(0.05)
        call = save(fresh_sandbox, "--deadline", "2")
        assert call.returncode == 1 and call.envelope["ok"] is False
        assert says in call.envelope["message"], call.envelope
        go.touch()
        result = running.result(timeout=60)
    assert (result["status"], result["output"]) == ("ok", "'finished'"), result
    assert ok(save(fresh_sandbox))["saved"] == ["os", "time"]


def valid_reply() -> dict:
    summary = {
        "found": True,
        "saved": ["x", "f"],
        "unsaved": [{"name": "sock", "why": "cannot pickle 'socket' object"}],
        "bytes": 123,
        "odd": 0,
    }
    return {
        "status": "ok",
        "user_expressions": {"briq_state": {"status": "ok", "data": {"text/plain": "None"}}},
        "payload": [{"source": "briq_state", "summary": summary}],
    }


def summary_of(reply: dict) -> dict:
    return reply["payload"][0]["summary"]


MALFORMED = {
    "extra field": lambda r: summary_of(r).update(extra=1),
    "missing field": lambda r: summary_of(r).pop("odd"),
    "not an identifier": lambda r: summary_of(r)["saved"].append("not a name"),
    "a name not a string": lambda r: summary_of(r)["saved"].append(7),
    "too many names": lambda r: summary_of(r).update(saved=[f"n{i}" for i in range(257)]),
    "a name too long": lambda r: summary_of(r)["saved"].append("n" * 257),
    "reason too long": lambda r: summary_of(r)["unsaved"][0].update(why="w" * 201),
    "reason not text": lambda r: summary_of(r)["unsaved"][0].update(why=None),
    "unsaved extra key": lambda r: summary_of(r)["unsaved"][0].update(more=1),
    "bytes not an int": lambda r: summary_of(r).update(bytes="123"),
    "bytes a bool": lambda r: summary_of(r).update(bytes=True),
    "bytes negative": lambda r: summary_of(r).update(bytes=-1),
    "a name twice": lambda r: summary_of(r)["saved"].append("sock"),
    "summary not a dict": lambda r: r["payload"][0].update(summary=["x"]),
    "two summaries": lambda r: r["payload"].append(copy.deepcopy(r["payload"][0])),
    "no summary": lambda r: r.update(payload=[]),
    "nothing found yet names": lambda r: summary_of(r).update(found=False),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_summary_is_refused(bridge_module, case):
    summary, problem = bridge_module.kernel_state_summary(valid_reply())
    assert summary == summary_of(valid_reply()) and problem == ""
    reply = valid_reply()
    MALFORMED[case](reply)
    summary, problem = bridge_module.kernel_state_summary(reply)
    assert summary is None and problem.startswith("malformed summary"), (case, problem)
