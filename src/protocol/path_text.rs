//! [`PathText`]: a path as its events name it (`state.a.b[0]`), rendered once per run and shared.
//!
//! The run's path table (`graph::PathTable`) renders an interned path's text the first time an
//! event needs it and keeps it; every later `written`, `blocked` or `unresolved` event naming
//! that path holds another count on the same text instead of rendering it again. It reads as
//! `&str` and serialises as the plain string, so the events' JSON is what it was with `String`.
//! Deliberately not here: rendering (`Path::text`) or knowing which path an id stands for.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A path's text, shared: cloning it is a reference count, never a copy of the text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathText(Arc<str>);

impl PathText {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True when both name one shared text (not merely equal strings).
    pub fn shares(&self, other: &PathText) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::ops::Deref for PathText {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for PathText {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for PathText {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for PathText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for PathText {
    fn from(s: &str) -> Self {
        PathText(Arc::from(s))
    }
}

impl From<String> for PathText {
    fn from(s: String) -> Self {
        PathText(Arc::from(s))
    }
}

impl From<&super::Path> for PathText {
    fn from(p: &super::Path) -> Self {
        PathText::from(p.text())
    }
}

impl From<PathText> for String {
    fn from(t: PathText) -> Self {
        t.0.as_ref().to_owned()
    }
}

impl PartialEq<str> for PathText {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for PathText {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for PathText {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<PathText> for str {
    fn eq(&self, other: &PathText) -> bool {
        self == &*other.0
    }
}

impl PartialEq<PathText> for &str {
    fn eq(&self, other: &PathText) -> bool {
        *self == &*other.0
    }
}

impl Serialize for PathText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for PathText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(PathText::from)
    }
}

#[cfg(feature = "server")]
impl utoipa::PartialSchema for PathText {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <String as utoipa::PartialSchema>::schema()
    }
}

#[cfg(feature = "server")]
impl utoipa::ToSchema for PathText {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_serialises_as_its_string() {
        let t = PathText::from("state.a[0]");
        let u = t.clone();
        assert!(t.shares(&u));
        assert_eq!(t, "state.a[0]");
        assert_eq!("state.a[0]", t);
        assert_eq!(t.to_string(), "state.a[0]");
        let json = serde_json::to_value(&t).expect("serialises");
        assert_eq!(json, serde_json::json!("state.a[0]"));
        let back: PathText = serde_json::from_value(json).expect("deserialises");
        assert_eq!(back, t);
        assert!(!back.shares(&t));
    }
}
