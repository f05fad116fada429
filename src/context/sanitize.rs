//! Rule 18: what the model sees of a tool result. Long base64/hex blobs are stripped and the size
//! is capped with a visible marker; the full result stays in state.

use serde_json::{Map, Value};

/// Limits applied when showing a value to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SanitizeLimits {
    /// Strings at least this long made only of base64 or hex characters are replaced.
    pub blob_min_chars: usize,
    /// Longer strings are cut.
    pub max_string_chars: usize,
    /// Longer arrays are cut.
    pub max_array_items: usize,
    /// The serialized result may not exceed this many bytes.
    pub max_total_bytes: usize,
}

impl Default for SanitizeLimits {
    fn default() -> Self {
        SanitizeLimits {
            blob_min_chars: 256,
            max_string_chars: 4_000,
            max_array_items: 200,
            max_total_bytes: 16 * 1024,
        }
    }
}

/// Returns the value as the model should see it.
pub fn sanitize(v: &Value, limits: &SanitizeLimits) -> Value {
    let cleaned = walk(v, limits);
    let text = cleaned.to_string();
    if text.len() <= limits.max_total_bytes {
        return cleaned;
    }
    let mut cut = limits.max_total_bytes;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    Value::String(format!(
        "{}…[truncated: {} more bytes; the full result is in state]",
        &text[..cut],
        text.len() - cut
    ))
}

fn walk(v: &Value, limits: &SanitizeLimits) -> Value {
    match v {
        Value::String(s) => Value::String(clean_string(s, limits)),
        Value::Array(items) => {
            let mut out: Vec<Value> = items
                .iter()
                .take(limits.max_array_items)
                .map(|x| walk(x, limits))
                .collect();
            if items.len() > limits.max_array_items {
                out.push(Value::String(format!(
                    "…[{} more items truncated]",
                    items.len() - limits.max_array_items
                )));
            }
            Value::Array(out)
        }
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, x) in m {
                out.insert(k.clone(), walk(x, limits));
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

fn clean_string(s: &str, limits: &SanitizeLimits) -> String {
    let n = s.chars().count();
    if n >= limits.blob_min_chars {
        if s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return format!("[hex data stripped: {n} chars]");
        }
        let payload = s.rsplit_once("base64,").map_or(s, |(_, p)| p);
        if payload.len() >= limits.blob_min_chars && payload.bytes().all(is_base64_byte) {
            return format!("[base64 data stripped: {n} chars]");
        }
    }
    if n > limits.max_string_chars {
        let kept: String = s.chars().take(limits.max_string_chars).collect();
        return format!(
            "{kept}…[truncated: {} more chars]",
            n - limits.max_string_chars
        );
    }
    s.to_string()
}

fn is_base64_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'-' | b'_' | b'\n' | b'\r')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn blobs_are_stripped_and_text_is_kept() {
        let l = SanitizeLimits::default();
        let b64 = "QUJD".repeat(100);
        let hex = "deadbeef".repeat(40);
        let v =
            json!({"img": format!("data:image/png;base64,{b64}"), "hash": hex, "note": "hello"});
        let out = sanitize(&v, &l);
        assert_eq!(out["img"], json!("[base64 data stripped: 422 chars]"));
        assert_eq!(out["hash"], json!("[hex data stripped: 320 chars]"));
        assert_eq!(out["note"], json!("hello"));
    }

    #[test]
    fn prose_of_letters_is_not_mistaken_for_base64() {
        let l = SanitizeLimits::default();
        let prose = "the quick brown fox ".repeat(30);
        assert_eq!(sanitize(&json!(prose), &l), json!(prose));
    }

    #[test]
    fn long_strings_arrays_and_totals_are_cut_visibly() {
        let l = SanitizeLimits {
            blob_min_chars: 1000,
            max_string_chars: 5,
            max_array_items: 2,
            max_total_bytes: 40,
        };
        assert_eq!(
            walk(&json!("abcdefgh"), &l),
            json!("abcde…[truncated: 3 more chars]")
        );
        assert_eq!(
            walk(&json!([1, 2, 3, 4]), &l),
            json!([1, 2, "…[2 more items truncated]"])
        );
        let big = json!({"k": ["aaaa", "bbbb"], "m": ["cccc", "dddd"], "z": "eeee"});
        let out = sanitize(&big, &l);
        let s = out.as_str().unwrap();
        assert!(s.ends_with("; the full result is in state]"), "{s}");
        assert!(s.starts_with("{\"k\":[\"aaaa\""), "{s}");
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        let l = SanitizeLimits {
            max_total_bytes: 7,
            ..SanitizeLimits::default()
        };
        let out = sanitize(&json!("ééééééé"), &l);
        assert!(out.as_str().unwrap().starts_with("\"ééé"));
    }
}
