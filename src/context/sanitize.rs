//! Rule 18: what the model sees of a tool result. Long base64/hex blobs are stripped and the size
//! is capped with a visible marker; the full result stays in state.

use serde_json::Value;

/// Limits applied when showing a value to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
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
    sanitize_owned(v.clone(), limits)
}

/// [`sanitize`], cleaning `v` in place instead of copying it (the state shown each step can
/// hold every result of the run).
pub fn sanitize_owned(mut v: Value, limits: &SanitizeLimits) -> Value {
    clean(&mut v, limits);
    cap(v, limits.max_total_bytes)
}

/// `v` if it serialises to at most `max` bytes, else its first `max` bytes (cut back to a
/// character boundary) as a string with a marker. Serialises once, keeping only the head.
fn cap(v: Value, max: usize) -> Value {
    struct Head {
        bytes: Vec<u8>,
        keep: usize,
        total: usize,
    }
    impl std::io::Write for Head {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let room = self.keep.saturating_sub(self.bytes.len());
            self.bytes.extend_from_slice(&buf[..room.min(buf.len())]);
            self.total += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut head = Head {
        bytes: Vec::new(),
        keep: max.saturating_add(1),
        total: 0,
    };
    if serde_json::to_writer(&mut head, &v).is_err() || head.total <= max {
        return v;
    }
    // `bytes[max]` exists (the text is longer than `max`): step back to a character's start.
    let mut cut = max;
    while cut > 0 && head.bytes.get(cut).is_some_and(|b| b & 0xc0 == 0x80) {
        cut -= 1;
    }
    let text = String::from_utf8_lossy(&head.bytes[..cut]);
    Value::String(format!(
        "{text}…[truncated: {} more bytes; the full result is in state]",
        head.total - cut
    ))
}

fn clean(v: &mut Value, limits: &SanitizeLimits) {
    match v {
        Value::String(s) => {
            if let Some(c) = cleaned_string(s, limits) {
                *s = c;
            }
        }
        Value::Array(items) => {
            let extra = items.len().saturating_sub(limits.max_array_items);
            items.truncate(limits.max_array_items);
            for x in items.iter_mut() {
                clean(x, limits);
            }
            if extra > 0 {
                items.push(Value::String(format!("…[{extra} more items truncated]")));
            }
        }
        Value::Object(m) => {
            for x in m.values_mut() {
                clean(x, limits);
            }
        }
        _ => {}
    }
}

/// The string as shown, or None when it is shown as it is.
fn cleaned_string(s: &str, limits: &SanitizeLimits) -> Option<String> {
    if s.len() < limits.blob_min_chars && s.len() <= limits.max_string_chars {
        return None;
    }
    let n = s.chars().count();
    if n >= limits.blob_min_chars {
        if s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Some(format!("[hex data stripped: {n} chars]"));
        }
        let payload = s.rsplit_once("base64,").map_or(s, |(_, p)| p);
        if payload.len() >= limits.blob_min_chars && payload.bytes().all(is_base64_byte) {
            return Some(format!("[base64 data stripped: {n} chars]"));
        }
    }
    if n > limits.max_string_chars {
        let kept: String = s.chars().take(limits.max_string_chars).collect();
        return Some(format!(
            "{kept}…[truncated: {} more chars]",
            n - limits.max_string_chars
        ));
    }
    None
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
        let walk = |v: &Value, l: &SanitizeLimits| {
            let mut v = v.clone();
            clean(&mut v, l);
            v
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
        let text = big.to_string();
        let want = format!(
            "{}…[truncated: {} more bytes; the full result is in state]",
            &text[..40],
            text.len() - 40
        );
        assert_eq!(out, json!(want));
        assert_eq!(sanitize_owned(big, &l), out);
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        let l = SanitizeLimits {
            max_total_bytes: 7,
            ..SanitizeLimits::default()
        };
        let out = sanitize(&json!("ééééééé"), &l);
        // `"ééé` is 7 bytes; the 4th `é` would straddle the cut. 16 bytes in all.
        assert_eq!(
            out,
            json!("\"ééé…[truncated: 9 more bytes; the full result is in state]")
        );
    }
}
