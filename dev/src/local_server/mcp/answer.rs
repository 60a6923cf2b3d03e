//! The result of a `tools/call`: a success carries its answer both as structured content and as
//! JSON text, an image read carries an image item (as briq publishes), and a tool error carries
//! `{"error": {"code", "message"}}` as its text with `isError` set.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Serialize;
use serde_json::{Value, json};

use crate::local_server::http::ApiError;
use briq_operator::briq::api::{ErrorCode, ErrorDetail, ToolErrorBody};

/// A success: `answer` as structured content, and the same as the text of its one item.
pub(crate) fn structured(answer: &impl Serialize) -> Result<Value, ApiError> {
    let answer = serde_json::to_value(answer)
        .map_err(|e| ApiError::internal(format!("cannot write the answer: {e}")))?;
    Ok(json!({
        "content": [{"type": "text", "text": answer.to_string()}],
        "structuredContent": answer,
        "isError": false,
    }))
}

/// A file read that is a picture: one image item, no structured content.
pub(crate) fn image(content: &[u8], mime_type: &str) -> Value {
    json!({
        "content": [{"type": "image", "data": BASE64.encode(content), "mimeType": mime_type}],
        "isError": false,
    })
}

pub(crate) fn tool_error(code: ErrorCode, message: &str) -> Value {
    let body = ToolErrorBody {
        error: ErrorDetail {
            code,
            message: message.to_owned(),
        },
    };
    let text = serde_json::to_string(&body).unwrap_or_else(|_| message.to_owned());
    json!({
        "content": [{"type": "text", "text": text}],
        "isError": true,
    })
}

/// The image type of `content` by its magic bytes, for the four formats briq answers as images.
pub(crate) fn image_type(content: &[u8]) -> Option<&'static str> {
    if content.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if content.starts_with(b"\xff\xd8\xff") {
        Some("image/jpeg")
    } else if content.starts_with(b"GIF87a") || content.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if content.len() >= 12 && content.starts_with(b"RIFF") && &content[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_told_by_their_magic_bytes() {
        for (content, mime_type) in [
            (&b"\x89PNG\r\n\x1a\n...."[..], Some("image/png")),
            (b"\xff\xd8\xff\xe0", Some("image/jpeg")),
            (b"GIF89a..", Some("image/gif")),
            (b"RIFF\x10\0\0\0WEBPVP8 ", Some("image/webp")),
            (b"RIFF\x10\0\0\0WAVEfmt ", None),
            (b"\x89PNG", None),
            (b"print('png')", None),
            (b"", None),
        ] {
            assert_eq!(image_type(content), mime_type, "{content:?}");
        }
    }

    #[test]
    fn a_tool_error_carries_the_error_body_as_text() {
        let result = tool_error(ErrorCode::NotFound, "no sandbox bq_x");
        assert_eq!(result["isError"], json!(true));
        let text = result["content"][0]["text"].as_str().unwrap();
        let body: ToolErrorBody = serde_json::from_str(text).unwrap();
        assert_eq!(body.error.code, ErrorCode::NotFound);
        assert_eq!(body.error.message, "no sandbox bq_x");
    }
}
