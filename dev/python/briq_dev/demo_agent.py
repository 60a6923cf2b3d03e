"""The demo's agent: a real smolagents CodeAgent whose code runs through briq-operator.

    KUBECONFIG=... python -m briq_dev.demo_agent --executor demo
    KUBECONFIG=... python -m briq_dev.demo_agent --pool warm

Runs `CodeAgent(tools=[], model=model, executor=KubernetesExecutor(...))` on "Calculate the
first 20 Fibonacci numbers." against an existing, Ready BriqExecutor (`--executor`), or on one
it creates from a BriqExecutorPool (`--pool`: it takes a warm member's kernel, and is deleted at
the end), printing what each step's code prints while it runs (`live |`), one line per step,
and then `answer: <JSON>`. The model is a deterministic
scripted one (no API key needed) unless `BRIQ_DEMO_MODEL` names a real smolagents model:

- `hf:<model id>` — `InferenceClientModel` (token from `HF_TOKEN`)
- `openai:<model id>` — `OpenAIModel` (`OPENAI_API_KEY`, optional `OPENAI_BASE_URL`; needs the
  `openai` package)
- `litellm:<model id>` — `LiteLLMModel` (the provider's usual key variables; needs `litellm`)

With the scripted model the answer is checked: exit status 1 if it is not the 20 numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

TASK = "Calculate the first 20 Fibonacci numbers."
FIRST_20 = [0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584, 4181]


def scripted_model():
    from briq_dev.scripted_model import ScriptedModel, action

    return ScriptedModel(
        [
            action(
                "I will build the sequence iteratively and print it to check it.",
                """
import time
fib = [0, 1]
while len(fib) < 20:
    fib.append(fib[-1] + fib[-2])
for start in range(0, 20, 5):
    print(f"numbers {start + 1} to {start + 5}:", fib[start : start + 5])
    time.sleep(0.5)
print(len(fib), "numbers:", fib)
""",
            ),
            action(
                "The kernel still holds `fib` from the previous step; I return it.",
                "final_answer(fib)",
            ),
        ]
    )


def real_model(spec: str):
    provider, _, model_id = spec.partition(":")
    if not model_id:
        sys.exit(f"BRIQ_DEMO_MODEL={spec!r}: expected <provider>:<model id>")
    if provider == "hf":
        from smolagents import InferenceClientModel

        return InferenceClientModel(model_id=model_id, token=os.environ.get("HF_TOKEN"))
    if provider == "openai":
        from smolagents import OpenAIModel

        return OpenAIModel(
            model_id=model_id,
            api_base=os.environ.get("OPENAI_BASE_URL"),
            api_key=os.environ.get("OPENAI_API_KEY"),
        )
    if provider == "litellm":
        from smolagents import LiteLLMModel

        return LiteLLMModel(model_id=model_id)
    sys.exit(f"BRIQ_DEMO_MODEL={spec!r}: unknown provider {provider!r} (hf, openai, litellm)")


def live_prints_logger():
    """A logger that shows only what the code prints while a step runs (the executor relays it
    as it comes, as rich text), each line marked `live |`; smolagents' own messages stay quiet."""
    from rich.text import Text
    from smolagents.monitoring import AgentLogger, LogLevel

    class LivePrints(AgentLogger):
        def __init__(self) -> None:
            super().__init__(level=LogLevel.INFO)
            self.line_start = True

        def log(self, *args, level=LogLevel.INFO, **kwargs) -> None:
            if not (args and isinstance(args[0], Text)):
                return
            for char in str(args[0]):
                if self.line_start:
                    sys.stdout.write("  live | ")
                sys.stdout.write(char)
                self.line_start = char == "\n"
            sys.stdout.flush()

    return LivePrints()


def one_line(text: str, limit: int = 100) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--executor", help="name of a Ready BriqExecutor")
    target.add_argument("--pool", help="name of a BriqExecutorPool to claim an executor from")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or in-cluster")
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--verbose", action="store_true", help="smolagents' own step log")
    args = parser.parse_args()

    from smolagents import ActionStep, CodeAgent
    from smolagents.monitoring import AgentLogger, LogLevel

    from briq_operator_client import KubernetesExecutor

    spec = os.environ.get("BRIQ_DEMO_MODEL", "").strip()
    model = real_model(spec) if spec else scripted_model()
    print(f"model: {spec or 'scripted (deterministic, no API key)'}", flush=True)
    started = time.monotonic()

    def on_step(step: ActionStep, agent=None) -> None:
        execution = executor.last_execution or "-"
        seconds = step.timing.duration or 0.0
        if step.error is not None:
            outcome = f"error: {one_line(step.error)}"
        elif step.is_final_answer:
            outcome = "final answer"
        else:
            logs = (step.observations or "").removeprefix("Execution logs:\n")
            logs = logs.split("Last output from code snippet:")[0]
            outcome = f"printed: {one_line(logs)}" if logs.strip() else "ran"
        print(f"step {step.step_number}: Execution {execution} ({seconds:.2f} s) {outcome}")
        sys.stdout.flush()

    level = LogLevel.INFO if args.verbose else LogLevel.OFF
    with KubernetesExecutor(
        [],
        AgentLogger(level=level) if args.verbose else live_prints_logger(),
        executor_name=args.executor,
        pool=args.pool,
        namespace=args.namespace,
        kubeconfig=args.kubeconfig,
    ) as executor:
        if args.pool:
            ready = time.monotonic() - started
            print(
                f"executor {executor.executor_name} claimed from pool {args.pool}: Ready in "
                f"{ready:.2f} s",
                flush=True,
            )
        agent = CodeAgent(
            tools=[],
            model=model,
            executor=executor,
            max_steps=args.max_steps,
            verbosity_level=level,
            step_callbacks={ActionStep: on_step},
        )
        answer = agent.run(TASK)
    print(f"agent finished in {time.monotonic() - started:.2f} s")
    if isinstance(answer, tuple):
        answer = list(answer)
    print(f"answer: {json.dumps(answer, default=str)}", flush=True)
    if not spec and answer != FIRST_20:
        print("the scripted agent's answer is not the first 20 Fibonacci numbers", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
