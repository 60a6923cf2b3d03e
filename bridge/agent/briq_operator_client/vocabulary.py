# Generated from src/crd/vocabulary.rs by `cargo run -p briq-dev -- vocabulary`; do not edit.
# A test fails when this file is stale.
"""Reasons and limits shared by briq-operator and its Python client."""

MAX_CODE_CHARS = 65536
MAX_TIMEOUT_SECONDS = 40
DEFAULT_TIMEOUT_SECONDS = 30
# Succeeded=False reasons after which the executor never runs code again.
UNUSABLE_REASONS = frozenset(
    {
        "ExecutorDeleted",
        "ExecutorUnusable",
        "Interrupted",
        "KernelLost",
        "MalformedResponse",
        "Timeout",
        "TransportError",
    }
)
# The annotation carrying the W3C traceparent of the client's span on an Execution.
TRACEPARENT_ANNOTATION = "briq.cloud/traceparent"
