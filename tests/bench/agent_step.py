#!/usr/bin/env python3
"""Agent step overhead for `briq-bench`: the smolagents executor's `run_code_raise_errors("1 + 1")`
on an existing, Ready BriqExecutor, timed per call. Not a test: numbers depend on the machine.

    python tests/bench/agent_step.py --kubeconfig K --namespace NS --executor NAME --steps 50

Prints one JSON line: {"available": true, "steps_ms": [...]} or, when
`briq_operator_client.kubernetes_executor` cannot be imported,
{"available": false, "reason": "..."}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--executor", required=True)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warm-up", type=int, default=3)
    args = parser.parse_args()

    try:
        from briq_operator_client.kubernetes_executor import KubernetesExecutor
    except ImportError as error:
        reason = f"KubernetesExecutor not installed ({error})"
        print(json.dumps({"available": False, "reason": reason}))
        return 0
    from smolagents.monitoring import AgentLogger, LogLevel

    executor = KubernetesExecutor(
        executor_name=args.executor,
        namespace=args.namespace,
        kubeconfig=args.kubeconfig,
        logger=AgentLogger(level=LogLevel.OFF),
    )
    steps_ms = []
    for step in range(args.warm_up + args.steps):
        started = time.perf_counter()
        output = executor.run_code_raise_errors("1 + 1")
        elapsed = (time.perf_counter() - started) * 1000
        if str(output.output) != "2":
            print(json.dumps({"available": False, "reason": f"unexpected output {output!r}"}))
            return 1
        if step >= args.warm_up:
            steps_ms.append(elapsed)
    print(json.dumps({"available": True, "steps_ms": steps_ms}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
