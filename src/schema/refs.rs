//! Keeping local `$ref`s working when schemas are nested inside the composed schema.
//!
//! A `$ref` such as `#/$defs/Address` means "from the root of *this* document". Once the user's
//! output schema sits at `#/properties/output/anyOf/0` of the composed schema, that root is no
//! longer its root. So every local reference of an embedded document is rewritten to point at a
//! copy of its target hoisted into the composed schema's top-level `$defs`, under a name derived
//! from the document and the pointer (`output.Address`, `tool.search.Filter`). Targets are
//! copied with their own references rewritten the same way, so recursive schemas stay recursive.
//!
//! Not handled on purpose: documents carrying their own `$id` (they are resources of their own
//! and resolve their references without help, so they are embedded untouched), anchors
//! (`#name`: anchors are document-wide and keep working), `$dynamicRef`, and remote references
//! (validators are offline, so those are rejected when the part is compiled).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::{SchemaError, Subject};

/// Keywords whose values are data, not schemas: never rewritten.
const DATA_KEYWORDS: [&str; 4] = ["const", "enum", "default", "examples"];

/// Collects the hoisted `$defs` of every embedded document.
#[derive(Debug, Default)]
pub(crate) struct Hoister {
    /// Hoisted name by (document number, pointer).
    names: BTreeMap<(usize, String), String>,
    used: BTreeSet<String>,
    defs: BTreeMap<String, Value>,
    docs: usize,
}

/// One document being embedded.
struct Doc<'a> {
    id: usize,
    label: String,
    root: &'a Value,
    subject: &'a Subject,
}

impl Hoister {
    /// Returns `doc` ready to be nested anywhere: `$schema`, `$defs` and `definitions` dropped
    /// from its root, local references rewritten to hoisted copies.
    ///
    /// `label` prefixes the hoisted names (`output`, `tool.search`).
    pub(crate) fn embed(
        &mut self,
        doc: &Value,
        label: &str,
        subject: &Subject,
    ) -> Result<Value, SchemaError> {
        if doc.get("$id").is_some_and(Value::is_string) {
            return Ok(doc.clone());
        }
        let d = Doc {
            id: self.docs,
            label: sanitize(label),
            root: doc,
            subject,
        };
        self.docs += 1;
        let mut out = self.rewrite(&d, doc, true)?;
        strip_root(&mut out);
        Ok(out)
    }

    /// [`Hoister::embed`] for an object document, which always yields an object.
    pub(crate) fn embed_object(
        &mut self,
        doc: Map<String, Value>,
        label: &str,
        subject: &Subject,
    ) -> Result<Map<String, Value>, SchemaError> {
        match self.embed(&Value::Object(doc), label, subject)? {
            Value::Object(m) => Ok(m),
            // Not reachable: rewriting an object yields an object.
            _ => Ok(Map::new()),
        }
    }

    /// The hoisted definitions, sorted by name (empty when nothing was hoisted).
    pub(crate) fn into_defs(self) -> Map<String, Value> {
        self.defs.into_iter().collect()
    }

    fn rewrite(&mut self, d: &Doc<'_>, v: &Value, is_root: bool) -> Result<Value, SchemaError> {
        match v {
            Value::Object(m) => {
                if !is_root && m.get("$id").is_some_and(Value::is_string) {
                    // A nested resource of its own: its references are relative to it.
                    return Ok(v.clone());
                }
                let mut out = Map::new();
                for (k, x) in m {
                    let x = if k == "$ref" {
                        match x.as_str() {
                            Some(r) => match local_pointer(r, d)? {
                                Some(ptr) => {
                                    Value::String(format!("#/$defs/{}", self.hoist(d, &ptr)?))
                                }
                                None => x.clone(),
                            },
                            None => x.clone(),
                        }
                    } else if DATA_KEYWORDS.contains(&k.as_str()) {
                        x.clone()
                    } else {
                        self.rewrite(d, x, false)?
                    };
                    out.insert(k.clone(), x);
                }
                Ok(Value::Object(out))
            }
            Value::Array(a) => Ok(Value::Array(
                a.iter()
                    .map(|x| self.rewrite(d, x, false))
                    .collect::<Result<_, _>>()?,
            )),
            other => Ok(other.clone()),
        }
    }

    /// The hoisted name for `ptr` in document `d`, hoisting its target on first use.
    fn hoist(&mut self, d: &Doc<'_>, ptr: &str) -> Result<String, SchemaError> {
        if let Some(name) = self.names.get(&(d.id, ptr.to_string())) {
            return Ok(name.clone());
        }
        let target = d
            .root
            .pointer(ptr)
            .ok_or_else(|| SchemaError::InvalidSchema {
                subject: d.subject.clone(),
                pointer: ptr.to_string(),
                message: format!("a `$ref` points at `#{ptr}`, which does not exist"),
            })?;
        let name = self.fresh_name(&d.label, ptr);
        // Reserve the name before rewriting the target so that cycles terminate.
        self.names.insert((d.id, ptr.to_string()), name.clone());
        let mut copy = self.rewrite(d, target, ptr.is_empty())?;
        if ptr.is_empty() {
            strip_root(&mut copy);
        }
        self.defs.insert(name.clone(), copy);
        Ok(name)
    }

    fn fresh_name(&mut self, label: &str, ptr: &str) -> String {
        let segments: Vec<&str> = ptr.split('/').skip(1).collect();
        let base = match segments.as_slice() {
            [] => label.to_string(),
            ["$defs" | "definitions", name] => format!("{label}.{}", sanitize(name)),
            _ => format!("{label}.{}", sanitize(&segments.join("."))),
        };
        let mut name = base.clone();
        let mut n = 2;
        while self.used.contains(&name) {
            name = format!("{base}_{n}");
            n += 1;
        }
        self.used.insert(name.clone());
        name
    }
}

/// Removes the keys that only make sense at the root of a document.
fn strip_root(v: &mut Value) {
    if let Value::Object(m) = v {
        m.shift_remove("$schema");
        m.shift_remove("$defs");
        m.shift_remove("definitions");
    }
}

/// The JSON pointer of a local reference (`#` or `#/...`), decoded; None for anything else.
fn local_pointer(r: &str, d: &Doc<'_>) -> Result<Option<String>, SchemaError> {
    let Some(frag) = r.strip_prefix('#') else {
        return Ok(None);
    };
    if !(frag.is_empty() || frag.starts_with('/')) {
        return Ok(None);
    }
    percent_decode(frag)
        .map(Some)
        .ok_or_else(|| SchemaError::InvalidSchema {
            subject: d.subject.clone(),
            pointer: String::new(),
            message: format!("the `$ref` {r:?} is not a valid URI fragment"),
        })
}

/// Decodes `%XX` escapes; None when the escapes are malformed or not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Keeps `[A-Za-z0-9_.-]`, maps everything else to `_` (hoisted names need no escaping).
fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() { "_".to_string() } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn percent_decoding() {
        assert_eq!(
            percent_decode("/$defs/My%20Type").as_deref(),
            Some("/$defs/My Type")
        );
        assert_eq!(percent_decode("/a%2"), None);
        assert_eq!(percent_decode("/a%zz"), None);
        assert_eq!(percent_decode("/%FF"), None);
    }

    #[test]
    fn names_are_sanitized_and_unique() {
        let mut h = Hoister::default();
        assert_eq!(h.fresh_name("tool.a_b", "/$defs/X"), "tool.a_b.X");
        assert_eq!(h.fresh_name("t", "/$defs/X"), "t.X");
        assert_eq!(h.fresh_name("t", "/definitions/X"), "t.X_2");
        assert_eq!(h.fresh_name("t", ""), "t");
        assert_eq!(h.fresh_name("t", "/properties/a~1b"), "t.properties.a_1b");
        assert_eq!(sanitize("a b/†"), "a_b__");
    }

    #[test]
    fn recursive_root_reference_is_hoisted_once() {
        let doc = json!({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}});
        let mut h = Hoister::default();
        let out = h.embed(&doc, "output", &Subject::OutputSchema).unwrap();
        assert_eq!(out["properties"]["kids"]["items"]["$ref"], "#/$defs/output");
        let defs = h.into_defs();
        assert_eq!(
            defs["output"]["properties"]["kids"]["items"]["$ref"],
            "#/$defs/output"
        );
    }

    #[test]
    fn data_keywords_are_not_rewritten() {
        let doc = json!({"const": {"$ref": "#/nowhere"}, "default": {"$ref": "#"}});
        let mut h = Hoister::default();
        let out = h.embed(&doc, "output", &Subject::OutputSchema).unwrap();
        assert_eq!(out, doc);
        assert!(h.into_defs().is_empty());
    }

    #[test]
    fn dangling_reference_is_a_typed_error() {
        let doc = json!({"$ref": "#/$defs/missing"});
        let err = Hoister::default()
            .embed(&doc, "output", &Subject::OutputSchema)
            .unwrap_err();
        assert_eq!(err.code(), "schema.invalid_schema");
    }
}
