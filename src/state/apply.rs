//! How one write changes a JSON document. Shared by the indexed resolver and by tests' replay.
//!
//! Semantics (documented in `spec/state.md`):
//! - a write at a path creates missing containers on the way: a key segment needs an object,
//!   an index segment needs an array; a value of the wrong type on the way is replaced, and an
//!   array too short for an index is padded with `null`;
//! - `set` replaces; `merge` deep-merges objects (anything else replaces); `assign` merges the top
//!   level of objects (anything else replaces); `push` appends the value as one element;
//!   `concat` appends the elements of an array value (a non-array value counts as one element).
//!   `push`/`concat` onto a value that is not an array start a new array.

use serde_json::{Map, Value};

use crate::protocol::{OutputMethod, Segment};

/// Applies `method(value)` at `rel` below `slot` (`None` = absent).
pub fn apply_at(slot: &mut Option<Value>, rel: &[Segment], method: OutputMethod, value: &Value) {
    let Some((first, rest)) = rel.split_first() else {
        *slot = Some(combine(slot.take(), method, value));
        return;
    };
    match first {
        Segment::Key(k) => {
            let mut obj = match slot.take() {
                Some(Value::Object(m)) => m,
                _ => Map::new(),
            };
            match obj.get_mut(k) {
                Some(child) => {
                    let mut tmp = Some(std::mem::take(child));
                    apply_at(&mut tmp, rest, method, value);
                    *child = tmp.unwrap_or(Value::Null);
                }
                None => {
                    let mut tmp = None;
                    apply_at(&mut tmp, rest, method, value);
                    if let Some(v) = tmp {
                        obj.insert(k.clone(), v);
                    }
                }
            }
            *slot = Some(Value::Object(obj));
        }
        Segment::Index(i) => {
            let i = *i;
            let mut arr = match slot.take() {
                Some(Value::Array(a)) => a,
                _ => Vec::new(),
            };
            if i < arr.len() {
                let mut tmp = Some(std::mem::take(&mut arr[i]));
                apply_at(&mut tmp, rest, method, value);
                arr[i] = tmp.unwrap_or(Value::Null);
            } else {
                arr.resize(i, Value::Null);
                let mut tmp = None;
                apply_at(&mut tmp, rest, method, value);
                arr.push(tmp.unwrap_or(Value::Null));
            }
            *slot = Some(Value::Array(arr));
        }
    }
}

/// Combines the current value (if any) with a written value.
pub fn combine(old: Option<Value>, method: OutputMethod, new: &Value) -> Value {
    match method {
        OutputMethod::Set => new.clone(),
        OutputMethod::Merge => match old {
            Some(mut o) => {
                deep_merge(&mut o, new);
                o
            }
            None => new.clone(),
        },
        OutputMethod::Assign => match (old, new) {
            (Some(Value::Object(mut o)), Value::Object(n)) => {
                for (k, v) in n {
                    o.insert(k.clone(), v.clone());
                }
                Value::Object(o)
            }
            _ => new.clone(),
        },
        OutputMethod::Push => {
            let mut arr = match old {
                Some(Value::Array(a)) => a,
                _ => Vec::new(),
            };
            arr.push(new.clone());
            Value::Array(arr)
        }
        OutputMethod::Concat => {
            let mut arr = match old {
                Some(Value::Array(a)) => a,
                _ => Vec::new(),
            };
            match new {
                Value::Array(items) => arr.extend(items.iter().cloned()),
                other => arr.push(other.clone()),
            }
            Value::Array(arr)
        }
    }
}

fn deep_merge(target: &mut Value, new: &Value) {
    match (target, new) {
        (Value::Object(t), Value::Object(n)) => {
            for (k, v) in n {
                match t.get_mut(k) {
                    Some(existing) => deep_merge(existing, v),
                    None => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, n) => *t = n.clone(),
    }
}

/// The value at `rel` below `v`, if present.
pub fn get<'a>(v: &'a Value, rel: &[Segment]) -> Option<&'a Value> {
    rel.iter().try_fold(v, |cur, seg| match (seg, cur) {
        (Segment::Key(k), Value::Object(m)) => m.get(k),
        (Segment::Index(i), Value::Array(a)) => a.get(*i),
        _ => None,
    })
}
