#!/usr/bin/env python3
"""Measure KubernetesExecutor's per-step overhead against calling the bridge directly.

Times `KubernetesExecutor.run_code_raise_errors("1 + 1")` on a warm executor (one Execution per
call: create, operator reconcile, the sandbox commands, status write, watch event) and the same
action through the bridge CLI in a local kernel (what bench_bridge.py measures), N runs each,
and prints the medians, p95s and the difference. Not a test: numbers depend on the machine.

    python bridge/tools/bench_executor.py [--runs 30]                 # starts local-stack
    python bridge/tools/bench_executor.py --kubeconfig K --executor E  # an existing executor
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_bridge  # noqa: E402  (this directory's sibling script)

WARMUP = 3


def time_executor(executor, runs: int) -> list[float]:
    for _ in range(WARMUP):
        executor.run_code_raise_errors("1 + 1")
    wall_ms = []
    for _ in range(runs):
        started = time.perf_counter()
        result = executor.run_code_raise_errors("1 + 1")
        wall_ms.append((time.perf_counter() - started) * 1000)
        if result.output != "2":
            sys.exit(f"unexpected result: {result}")
    return wall_ms


def time_bridge(runs: int) -> list[float]:
    work = Path(tempfile.mkdtemp(prefix="briq-bench-"))
    (work / ".briq" / "actions").mkdir(parents=True)
    shutil.copy(bench_bridge.SANDBOX_SCRIPT, work / ".briq" / "bridge.py")
    (work / ".briq" / "actions" / "trivial.py").write_text("1 + 1\n")
    kernel = bench_bridge.bridge(work, "start-kernel")
    if not kernel["alive"]:
        sys.exit(f"kernel did not start: {kernel['message']}")
    try:
        run = ("run", "--code", ".briq/actions/trivial.py", "--timeout", "30")
        for _ in range(WARMUP):
            bench_bridge.bridge(work, *run)
        wall_ms = []
        for _ in range(runs):
            started = time.perf_counter()
            result = bench_bridge.bridge(work, *run)
            wall_ms.append((time.perf_counter() - started) * 1000)
            if result["status"] != "ok" or result["output"] != "2":
                sys.exit(f"unexpected result: {result}")
        return wall_ms
    finally:
        os.killpg(kernel["pid"], signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--kubeconfig", help="use this cluster instead of starting local-stack")
    parser.add_argument("--executor", help="an existing Ready BriqExecutor (with --kubeconfig)")
    parser.add_argument("--namespace", default="default")
    args = parser.parse_args()

    from smolagents.monitoring import AgentLogger, LogLevel

    from briq_dev.local_stack import LocalStack
    from briq_operator_client import KubernetesExecutor

    quiet = AgentLogger(level=LogLevel.OFF)
    stack = None
    if args.kubeconfig is None:
        print("starting local-stack …", file=sys.stderr)
        stack = LocalStack().start()
    kubeconfig = args.kubeconfig or str(stack.kubeconfig)
    try:
        with KubernetesExecutor(
            [],
            quiet,
            executor_name=args.executor,
            create_executor=args.executor is None,
            namespace=args.namespace,
            kubeconfig=kubeconfig,
        ) as executor:
            executor_ms = time_executor(executor, args.runs)
    finally:
        if stack is not None and stack.stop() == 0:
            stack.remove_workdir()
    bridge_ms = time_bridge(args.runs)

    print(f"{args.runs} runs of `1 + 1` each, after {WARMUP} warm-up runs")
    for label, values in (
        ("KubernetesExecutor", executor_ms),
        ("bridge CLI direct", bridge_ms),
    ):
        median = statistics.median(values)
        p95 = bench_bridge.percentile(values, 0.95)
        print(f"  {label:18} median {median:7.1f} ms   p95 {p95:7.1f} ms")
    overhead = statistics.median(executor_ms) - statistics.median(bridge_ms)
    print(f"  per-step overhead of KubernetesExecutor over the bridge: {overhead:.1f} ms (median)")


if __name__ == "__main__":
    main()
