//! The vocabulary the Python client shares with the operator (limits and reasons), generated as a
//! Python module so that neither side spells a reason of its own.

use super::{
    execution::MAX_CODE_CHARS,
    executor::{DEFAULT_EXECUTION_TIMEOUT_SECONDS, MAX_EXECUTION_TIMEOUT_SECONDS},
    reasons::ExecutionReason,
};

/// The Python module `bridge/agent/briq_operator_client/vocabulary.py`: the limits and reasons the
/// Python client shares with the operator, formatted as `ruff format` leaves it.
pub fn python_module() -> String {
    let mut unusable: Vec<&str> = ExecutionReason::ALL
        .iter()
        .filter(|reason| reason.ends_the_executor())
        .map(|reason| reason.as_str())
        .collect();
    unusable.sort_unstable();
    let unusable: String = unusable
        .iter()
        .map(|reason| format!("        \"{reason}\",\n"))
        .collect();
    format!(
        "# Generated from src/crd/vocabulary.rs by `cargo run -p briq-dev -- vocabulary`; do not edit.\n\
         # A test fails when this file is stale.\n\
         \"\"\"Reasons and limits shared by briq-operator and its Python client.\"\"\"\n\
         \n\
         MAX_CODE_CHARS = {MAX_CODE_CHARS}\n\
         MAX_TIMEOUT_SECONDS = {MAX_EXECUTION_TIMEOUT_SECONDS}\n\
         DEFAULT_TIMEOUT_SECONDS = {DEFAULT_EXECUTION_TIMEOUT_SECONDS}\n\
         # Succeeded=False reasons after which the executor never runs code again.\n\
         UNUSABLE_REASONS = frozenset(\n    {{\n{unusable}    }}\n)\n\
         # The annotation carrying the W3C traceparent of the client's span on an Execution.\n\
         TRACEPARENT_ANNOTATION = \"{traceparent}\"\n",
        traceparent = crate::traces::TRACEPARENT_ANNOTATION,
    )
}
