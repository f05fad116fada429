//! API keys that never show: a key type whose Debug and Display print a placeholder, and a
//! redactor that scrubs a key out of any text (error bodies, transport messages) before it is
//! stored in an error, a log line or an event.
//!
//! Not a vault: the key is held in plain memory; the point is only that it cannot leak through
//! formatting.

use std::fmt;

/// What a redacted secret is replaced with.
pub(crate) const REDACTED: &str = "[REDACTED]";

/// An API key. Its `Debug` and `Display` never print the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }

    /// The key itself, for building the authentication header only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// A redactor for this key.
    pub(crate) fn redactor(&self) -> Redactor {
        Redactor::new([self.0.as_str()])
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(")?;
        f.write_str(REDACTED)?;
        f.write_str(")")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Replaces every occurrence of the known secrets in a text.
#[derive(Clone, Default)]
pub(crate) struct Redactor {
    secrets: Vec<String>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    /// A redactor for these secrets; empty strings are ignored.
    pub(crate) fn new<'a>(secrets: impl IntoIterator<Item = &'a str>) -> Redactor {
        let mut secrets: Vec<String> = secrets
            .into_iter()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        // Longest first, so a secret containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Redactor { secrets }
    }

    /// The text with every secret replaced by `[REDACTED]`.
    pub(crate) fn apply(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_hide_the_key() {
        let k = ApiKey::new("sk-very-secret-123");
        assert_eq!(format!("{k:?}"), "ApiKey([REDACTED])");
        assert_eq!(format!("{k}"), "[REDACTED]");
        assert_eq!(k.expose(), "sk-very-secret-123");
    }

    #[test]
    fn redactor_replaces_every_occurrence() {
        let r = ApiKey::new("sk-abc").redactor();
        assert_eq!(
            r.apply("key sk-abc is invalid (sk-abc)"),
            "key [REDACTED] is invalid ([REDACTED])"
        );
        assert_eq!(Redactor::new([""]).apply("sk-abc"), "sk-abc");
    }
}
