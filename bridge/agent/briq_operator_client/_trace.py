"""The client's span around one Execution, when OpenTelemetry is installed.

Agents are commonly instrumented with OpenTelemetry (OpenInference's smolagents instrumentor,
say). The span of each action is a child of whatever span is current (the agent's step), and its
W3C `traceparent` goes on the Execution, where the operator continues the same trace. Without
`opentelemetry-api` installed, or with no tracer provider configured, nothing is recorded and no
annotation is set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .vocabulary import TRACEPARENT_ANNOTATION

try:
    from opentelemetry import propagate, trace
except ImportError:  # OpenTelemetry is optional: no span, no annotation
    trace = None


@contextlib.contextmanager
def execution_span(namespace: str, executor: str) -> Iterator[tuple[Any, dict[str, str]]]:
    """Opens the action's client span; yields it (None without OpenTelemetry) and the
    annotations that carry its context to the operator."""
    if trace is None:
        yield None, {}
        return
    tracer = trace.get_tracer("briq_operator_client")
    attributes = {"k8s.namespace.name": namespace, "briq.executor": executor}
    with tracer.start_as_current_span(
        "briq execution", kind=trace.SpanKind.CLIENT, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        annotations = {}
        if "traceparent" in carrier:
            annotations[TRACEPARENT_ANNOTATION] = carrier["traceparent"]
        yield span, annotations
