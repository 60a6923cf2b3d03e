"""Kernel lifecycle: start-kernel, probe, timeouts and lost kernels."""

from __future__ import annotations

import os
import signal
import time

from conftest import process_gone


def test_start_kernel_is_idempotent(shared_sandbox):
    first_pid = shared_sandbox.kernel_pid()
    again = shared_sandbox.start_kernel()
    assert again == {
        "kind": "kernel",
        "alive": True,
        "started": False,
        "pid": first_pid,
        "message": again["message"],
    }


def test_probe_reports_live_kernel(shared_sandbox):
    probe = shared_sandbox.probe()
    assert probe["alive"] is True
    assert probe["started"] is False
    assert probe["pid"] == shared_sandbox.kernel_pid()


def test_kernel_log_stays_in_state_dir(shared_sandbox):
    assert (shared_sandbox.root / ".briq" / "state" / "kernel.log").exists()
    assert (shared_sandbox.root / ".briq" / "state" / "kernel.json").exists()


def test_no_kernel_state(empty_sandbox):
    probe = empty_sandbox.probe()
    assert probe["alive"] is False and probe["pid"] is None
    result = empty_sandbox.run("1 + 1")
    assert result["status"] == "kernel_lost"
    assert result["error"]["name"] == "KernelLost"


def test_timeout_interrupts_and_kernel_survives(fresh_sandbox):
    fresh_sandbox.run("before_timeout = 'kept'")
    started = time.monotonic()
    result = fresh_sandbox.run("print('spinning', flush=True)\nwhile True:\n    pass", timeout=2)
    assert time.monotonic() - started < 20  # 2 s timeout + interrupt grace + process startup
    assert result["status"] == "timeout"
    assert "interrupted" in result["error"]["message"]
    assert result["logs"] == "spinning\n"
    # SIGINT became a KeyboardInterrupt: the kernel and its state are still there.
    probe = fresh_sandbox.probe()
    assert probe["alive"] is True
    assert fresh_sandbox.run("before_timeout")["output"] == "'kept'"


def test_killed_kernel_is_reported_lost(fresh_sandbox):
    pid = fresh_sandbox.kernel_pid()
    os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    result = fresh_sandbox.run("1 + 1", timeout=30)
    assert time.monotonic() - started < 15  # well before the 30 s deadline
    assert result["status"] == "kernel_lost"
    probe = fresh_sandbox.probe()
    assert probe["alive"] is False
    assert probe["pid"] is None
    # run/probe never restart it; start-kernel replaces it.
    assert fresh_sandbox.run("1 + 1")["status"] == "kernel_lost"
    replaced = fresh_sandbox.start_kernel()
    assert replaced["started"] is True and replaced["pid"] != pid
    assert "gone" in replaced["message"]
    assert fresh_sandbox.run("1 + 1")["output"] == "2"


def test_kernel_dying_mid_run_is_reported_lost(fresh_sandbox):
    started = time.monotonic()
    # The pause lets ipykernel's IOPub thread publish the output before the process dies.
    code = (
        "import os, time\nprint('last words', flush=True)\ntime.sleep(0.5)\nos.kill(os.getpid(), 9)"
    )
    result = fresh_sandbox.run(code, timeout=30)
    assert time.monotonic() - started < 15
    assert result["status"] == "kernel_lost"
    assert result["logs"] == "last words\n"
    assert fresh_sandbox.probe()["alive"] is False


def test_start_kernel_replaces_a_kernel_that_does_not_answer(fresh_sandbox):
    frozen = fresh_sandbox.kernel_pid()
    os.kill(frozen, signal.SIGSTOP)  # alive, but answers nothing
    replaced = fresh_sandbox.start_kernel()
    assert replaced["started"] is True and replaced["pid"] != frozen
    assert "not answering" in replaced["message"]
    assert fresh_sandbox.run("1 + 1")["output"] == "2"
    assert process_gone(frozen), "the frozen kernel was not killed"


def test_a_kernel_port_taken_between_its_choice_and_the_bind_is_chosen_again(
    bridge_module, tmp_path, monkeypatch
):
    """A chosen port can become the local end of another process's connection before the kernel
    binds it; the kernel then logs the bind failure and may hang instead of exiting. Start-kernel
    sees the failure in the log and launches it again on other ports, well within its deadline."""
    import argparse
    import socket

    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    choose = bridge_module.kernel_ports
    chosen: list[list[int]] = []

    def first_choice_collides(count: int = 5) -> list[int]:
        ports = choose(count)
        if not chosen:
            ports[1] = taken.getsockname()[1]  # the iopub port, as in the failure seen
        chosen.append(ports)
        return ports

    monkeypatch.setattr(bridge_module, "kernel_ports", first_choice_collides)
    monkeypatch.setattr(bridge_module, "split_users", lambda: False)
    args = argparse.Namespace(state_dir=str(tmp_path / "state"), deadline=60.0)
    state = bridge_module.KernelState(args.state_dir)
    try:
        envelope, code = bridge_module.cmd_start_kernel(args)
        assert (code, envelope["alive"], envelope["started"]) == (0, True, True), envelope
        assert len(chosen) == 2
        assert "Address already in use" in state.log_tail(100_000)
    finally:
        taken.close()
        bridge_module.stop_runner(state)
        pid = state.read_pid()
        if pid is not None:
            bridge_module.kill_kernel_group(pid)


def test_kernel_ports_are_never_taken_from_the_ephemeral_range(bridge_module):
    low, high = bridge_module.ephemeral_ports()
    for _ in range(20):
        ports = bridge_module.kernel_ports()
        assert len(set(ports)) == 5
        assert all(1024 <= port < low for port in ports), (ports, low, high)
