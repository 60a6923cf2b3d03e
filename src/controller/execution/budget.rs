//! The byte budget of an Execution's status, measured as the API server stores it: JSON in
//! which `<`, `>`, `&`, U+2028 and U+2029 become 6-byte `\uXXXX` escapes. A status over
//! [`MAX_STATUS_BYTES`] is cut here (pure functions), so that the final write always fits in
//! etcd: a refused write would be retried forever and hold up the executor's queue.

use serde_json::Value;

use crate::crd::{ExecutionStatus, MAX_STATUS_BYTES};

/// A serialized final answer larger than this, as stored, is refused rather than cut (a cut
/// answer would not decode): half the status budget, so the other texts keep the rest.
pub const MAX_FINAL_ANSWER_BYTES: usize = MAX_STATUS_BYTES / 2;

/// Bytes `c` takes inside a JSON string as the API server encodes it. Control characters other
/// than `\n`, `\r` and `\t` are counted as `\u00XX`, whichever short form an encoder picks.
fn char_bytes(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' => 2,
        '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => 6,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// Bytes of `text` inside a JSON string as stored (without the quotes).
pub fn encoded_len(text: &str) -> usize {
    text.chars().map(char_bytes).sum()
}

/// Bytes of `value` as compact JSON, encoded as the API server does.
pub fn value_len(value: &Value) -> usize {
    match value {
        Value::Null => 4,
        Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(n) => n.to_string().len(),
        Value::String(s) => encoded_len(s) + 2,
        Value::Array(items) => {
            2 + items.iter().map(value_len).sum::<usize>() + items.len().saturating_sub(1)
        }
        Value::Object(fields) => {
            2 + fields
                .iter()
                .map(|(key, item)| encoded_len(key) + 3 + value_len(item))
                .sum::<usize>()
                + fields.len().saturating_sub(1)
        }
    }
}

/// Bytes of `status` as the API server stores it.
pub fn status_len(status: &ExecutionStatus) -> usize {
    value_len(&serde_json::to_value(status).expect("status serializes"))
}

fn marker(cut: usize) -> String {
    format!("\n… [{cut} characters cut] …\n")
}

/// `text` cut to at most `max` bytes as stored, its head and tail kept around a marker that
/// says how many characters went. Unchanged when it fits; empty when not even the marker fits.
pub fn cut(text: &str, max: usize) -> String {
    if encoded_len(text) <= max {
        return text.to_owned();
    }
    let chars: Vec<char> = text.chars().collect();
    // The marker's length depends on the count it reports, which the full count bounds.
    let widest = encoded_len(&marker(chars.len()));
    let Some(room) = max.checked_sub(widest) else {
        return String::new();
    };
    let (mut head, mut used) = (0, 0);
    while head < chars.len() && used + char_bytes(chars[head]) <= room / 2 {
        used += char_bytes(chars[head]);
        head += 1;
    }
    let mut tail = chars.len();
    while tail > head && used + char_bytes(chars[tail - 1]) <= room {
        used += char_bytes(chars[tail - 1]);
        tail -= 1;
    }
    let head: String = chars[..head].iter().collect();
    let kept: String = chars[tail..].iter().collect();
    format!("{head}{}{kept}", marker(tail - head.chars().count()))
}

/// The texts of a status that may be cut, in a fixed order.
fn texts(status: &mut ExecutionStatus) -> Vec<&mut String> {
    let mut texts: Vec<&mut String> = Vec::new();
    if let Some(logs) = &mut status.logs {
        texts.push(logs);
    }
    if let Some(output) = &mut status.output {
        texts.push(output);
    }
    if let Some(error) = &mut status.error {
        texts.push(&mut error.name);
        texts.push(&mut error.message);
        if let Some(traceback) = &mut error.traceback {
            texts.push(traceback);
        }
    }
    for condition in &mut status.conditions {
        texts.push(&mut condition.message);
    }
    texts
}

/// How many bytes each of texts of `sizes` may keep so that they fit in `room` together: the
/// small ones stay whole, the large ones share what remains equally.
pub fn shares(sizes: &[usize], room: usize) -> Vec<usize> {
    if sizes.iter().sum::<usize>() <= room {
        return sizes.to_vec();
    }
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| sizes[i]);
    let mut shares = vec![0; sizes.len()];
    let mut left = room;
    for (n, &i) in order.iter().enumerate() {
        let share = left / (sizes.len() - n);
        shares[i] = sizes[i].min(share);
        left -= shares[i];
    }
    shares
}

/// `status` cut to `budget` bytes as stored: logs, output, the error and the condition messages
/// share what the rest leaves, each keeping its head and tail, and `truncated` is set. A final
/// answer is never cut (it would not decode): one that leaves the other texts no room goes.
pub fn fit(mut status: ExecutionStatus, budget: usize) -> ExecutionStatus {
    if status_len(&status) <= budget {
        return status;
    }
    // Everything but the texts, with `truncated` set (which the cut status carries).
    let fixed = |status: &ExecutionStatus| {
        let mut bare = status.clone();
        bare.truncated = true;
        for text in texts(&mut bare) {
            text.clear();
        }
        status_len(&bare)
    };
    // The cut texts need room for their markers; without it, the final answer goes.
    let markers = 64 * texts(&mut status.clone()).len();
    if fixed(&status) + markers > budget && status.final_answer.is_some() {
        status.final_answer = None;
    }
    let room = budget.saturating_sub(fixed(&status));
    let mut texts = texts(&mut status);
    let sizes: Vec<usize> = texts.iter().map(|t| encoded_len(t)).collect();
    for (text, share) in texts.iter_mut().zip(shares(&sizes, room)) {
        **text = cut(text, share);
    }
    status.truncated = true;
    status
}

#[cfg(test)]
mod tests;
