//! The envelopes a simulated sandbox answers with: the field sets of `setup_envelope`,
//! `kernel_envelope` and `result_envelope` in `bridge/sandbox/briq_sandbox.py`, framed as its
//! `frame` does. (The operator's `Envelope` types only deserialize, so they are built here.)

use serde_json::{Value, json};

pub(crate) fn setup(message: &str) -> Value {
    json!({
        "kind": "setup",
        "ok": true,
        "installed": false,
        "message": message,
        "pip_tail": null,
    })
}

pub(crate) fn kernel(pid: Option<u32>, started: bool, message: &str) -> Value {
    json!({
        "kind": "kernel",
        "alive": pid.is_some(),
        "started": started,
        "pid": pid,
        "message": message,
    })
}

/// A result of `status` (`ok`, `timeout`, `kernel_lost`, `not_accepted`, …).
pub(crate) fn result(
    status: &str,
    output: Option<&str>,
    error: Option<(&str, &str)>,
    duration_ms: u64,
) -> Value {
    json!({
        "kind": "result",
        "status": status,
        "logs": "",
        "output": output,
        "truncated": false,
        "final_answer": null,
        "error": error.map(|(name, message)| json!({
            "name": name,
            "message": message,
            "traceback": "",
        })),
        "display_dropped": 0,
        "duration_ms": duration_ms,
    })
}

/// The envelope as the bridge prints it: markers around one JSON line.
pub(crate) fn frame(nonce: &str, envelope: &Value) -> String {
    format!("\n<<<BRIQ-ENVELOPE {nonce}>>>\n{envelope}\n<<<END-BRIQ-ENVELOPE {nonce}>>>\n")
}
