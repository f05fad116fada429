//! A call's params: one JSON object, held so that it can be read as a `&Value` without a copy.
//!
//! The JSON Schema validators check a `&Value`; a call's params used to be a bare map, so every
//! validation built a `Value::Object` from a copy of them. [`Params`] holds the object as a
//! `Value` from the start and derefs to its map, so code that reads or edits params as a map
//! keeps working and validation reads [`Params::as_value`] in place.
//!
//! It deliberately adds no behaviour of its own: no meta-key handling, no reference parsing, no
//! validation. It serialises and deserialises exactly as the map it replaces.

use std::ops::{Deref, DerefMut};
use std::sync::LazyLock;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// A call's params: a JSON object (always a `Value::Object`; only a map makes one).
///
/// Derefs to the object's `Map`; [`Params::as_value`] is the same object as a `&Value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Params(Value);

impl Params {
    /// No params.
    pub fn new() -> Self {
        Params(Value::Object(Map::new()))
    }

    /// The params as one JSON object, in place (what a validator reads).
    pub fn as_value(&self) -> &Value {
        &self.0
    }

    /// The params' map, taken out.
    pub fn into_map(self) -> Map<String, Value> {
        match self.0 {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    /// The params as a JSON object, taken out.
    pub fn into_value(self) -> Value {
        self.0
    }
}

impl Default for Params {
    fn default() -> Self {
        Params::new()
    }
}

impl From<Map<String, Value>> for Params {
    fn from(m: Map<String, Value>) -> Self {
        Params(Value::Object(m))
    }
}

impl From<Params> for Map<String, Value> {
    fn from(p: Params) -> Self {
        p.into_map()
    }
}

impl FromIterator<(String, Value)> for Params {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Self {
        Params::from(Map::from_iter(iter))
    }
}

/// What a `Params` that somehow held no object would read as (none can: the field is private
/// and every constructor takes a map).
static NO_PARAMS: LazyLock<Map<String, Value>> = LazyLock::new(Map::new);

impl Deref for Params {
    type Target = Map<String, Value>;

    fn deref(&self) -> &Map<String, Value> {
        match &self.0 {
            Value::Object(m) => m,
            _ => &NO_PARAMS,
        }
    }
}

impl DerefMut for Params {
    fn deref_mut(&mut self) -> &mut Map<String, Value> {
        match self.0 {
            Value::Object(ref mut m) => m,
            // Never taken (see `NO_PARAMS`); total rather than a panic.
            _ => {
                self.0 = Value::Object(Map::new());
                self.deref_mut()
            }
        }
    }
}

impl AsRef<Map<String, Value>> for Params {
    fn as_ref(&self) -> &Map<String, Value> {
        self
    }
}

impl<'a> IntoIterator for &'a Params {
    type Item = (&'a String, &'a Value);
    type IntoIter = serde_json::map::Iter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl IntoIterator for Params {
    type Item = (String, Value);
    type IntoIter = serde_json::map::IntoIter;

    fn into_iter(self) -> Self::IntoIter {
        self.into_map().into_iter()
    }
}

impl PartialEq<Map<String, Value>> for Params {
    fn eq(&self, other: &Map<String, Value>) -> bool {
        **self == *other
    }
}

impl PartialEq<Params> for Map<String, Value> {
    fn eq(&self, other: &Params) -> bool {
        *self == **other
    }
}

impl Serialize for Params {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Map::serialize(self, s)
    }
}

impl<'de> Deserialize<'de> for Params {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Map::deserialize(d).map(Params::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        }
    }

    /// Params serialise and deserialise exactly as the map they hold, key order included.
    #[test]
    fn params_round_trip_through_serde_as_the_map_did() {
        let m = map(json!({"z": 1, "a": {"y": [2, null]}, "_note": "x", "m": "†state.q"}));
        let p = Params::from(m.clone());
        let text = serde_json::to_string(&p).expect("serialises");
        assert_eq!(text, serde_json::to_string(&m).expect("serialises"));
        let back: Params = serde_json::from_str(&text).expect("deserialises");
        assert_eq!(back, p);
        assert_eq!(back.into_map(), m);
        assert!(
            serde_json::from_str::<Params>("[1]").is_err(),
            "only an object"
        );
        assert!(
            serde_json::from_str::<Params>("null").is_err(),
            "only an object"
        );
    }

    /// `as_value` is the params' own object, not a copy of it.
    #[test]
    fn as_value_is_the_params_in_place() {
        let mut p = Params::new();
        p.insert("a".into(), json!(1));
        let value = p.as_value();
        assert_eq!(value, &json!({"a": 1}));
        let object = value.as_object().expect("an object");
        assert!(std::ptr::eq(object, &*p));
    }

    /// Reading and editing through the map reaches the one object.
    #[test]
    fn the_map_reads_and_edits_the_object() {
        let mut p: Params = [("b".to_string(), json!(2))].into_iter().collect();
        p.insert("a".into(), json!(1));
        assert_eq!(p.keys().collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(p.as_value(), &json!({"b": 2, "a": 1}));
        assert_eq!(p, map(json!({"b": 2, "a": 1})));
        assert_eq!(Params::default().as_value(), &json!({}));
    }
}
