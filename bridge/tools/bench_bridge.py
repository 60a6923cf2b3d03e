#!/usr/bin/env python3
"""Measure the bridge's per-action overhead the way the operator pays it.

Starts a kernel in a temporary `/work` stand-in, runs a trivial action (`1 + 1`) N times through
the bridge CLI and prints the median and p95 of the whole subprocess call and of the
`duration_ms` the bridge reports (execution only). Not a test: numbers depend on the machine.

    python bridge/tools/bench_bridge.py [--runs 50]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SANDBOX_SCRIPT = Path(__file__).resolve().parents[1] / "sandbox" / "briq_sandbox.py"


def bridge(work: Path, *args: str) -> dict:
    nonce = secrets.token_hex(16)
    process = subprocess.run(
        [sys.executable, ".briq/bridge.py", *args],
        cwd=work,
        env={**os.environ, "BRIQ_NONCE": nonce},
        capture_output=True,
        text=True,
        check=False,
    )
    lines = process.stdout.split("\n")
    start = lines.index(f"<<<BRIQ-ENVELOPE {nonce}>>>")
    return json.loads(lines[start + 1])


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="briq-bench-"))
    (work / ".briq" / "actions").mkdir(parents=True)
    shutil.copy(SANDBOX_SCRIPT, work / ".briq" / "bridge.py")
    (work / ".briq" / "actions" / "trivial.py").write_text("1 + 1\n")
    kernel = bridge(work, "start-kernel")
    if not kernel["alive"]:
        sys.exit(f"kernel did not start: {kernel['message']}")
    try:
        wall_ms, reported_ms = [], []
        for _ in range(args.runs):
            started = time.perf_counter()
            result = bridge(work, "run", "--code", ".briq/actions/trivial.py", "--timeout", "30")
            wall_ms.append((time.perf_counter() - started) * 1000)
            if result["status"] != "ok" or result["output"] != "2":
                sys.exit(f"unexpected result: {result}")
            reported_ms.append(result["duration_ms"])
    finally:
        os.killpg(kernel["pid"], signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)

    print(f"{args.runs} runs of `1 + 1` through the bridge CLI")
    for label, values in (("subprocess call", wall_ms), ("duration_ms", reported_ms)):
        median = statistics.median(values)
        print(f"  {label:16} median {median:7.1f} ms   p95 {percentile(values, 0.95):7.1f} ms")


if __name__ == "__main__":
    main()
