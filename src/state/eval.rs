//! Expression evaluation against state (rules 1, 5, 6).

use serde_json::{Map, Value};

use super::{State, StateError};
use crate::graph::PathId;
use crate::protocol::{CallId, Combinator, Expression, Path, parse_expression};

/// Whether a path can still be written, asked with the path's id when the caller interned it.
pub(super) type Writable<'a> = &'a dyn Fn(Option<PathId>, &Path) -> bool;

/// The outcome of evaluating one expression.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Eval {
    /// The value is known and no pending call can change it.
    Ready(Value),
    /// Some pending or running call can still write these paths: wait.
    Blocked(Vec<Path>),
    /// Nothing wrote these paths and nothing pending can: the value is absent.
    Missing(Vec<Path>),
}

/// The outcome of resolving all references inside a call's params.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Resolved {
    /// Every reference replaced by its value.
    Ready(Map<String, Value>),
    /// Waiting on writes that pending or running calls can still make.
    Blocked(Vec<Path>),
    /// References to nothing; `blocked` lists what is also still awaited.
    Missing {
        /// Paths nothing has written or can write.
        missing: Vec<Path>,
        /// Paths still awaited from pending calls.
        blocked: Vec<Path>,
    },
}

/// `ids`, when given, are the ids of `expr`'s reference paths, in order.
pub(super) fn eval(
    state: &State,
    expr: &Expression,
    ids: Option<&[PathId]>,
    writable: Writable<'_>,
    mut writers: Option<&mut Vec<CallId>>,
) -> Result<Eval, StateError> {
    let id = |k: usize| ids.and_then(|ids| ids.get(k).copied());
    match expr.op {
        Combinator::Single | Combinator::Or => {
            let mut missing = Vec::new();
            for (k, r) in expr.refs.iter().enumerate() {
                if writable(id(k), &r.path) {
                    return Ok(Eval::Blocked(vec![r.path.clone()]));
                }
                match state.read_noting(r, id(k), writers.as_deref_mut())? {
                    Some(v) => return Ok(Eval::Ready(v)),
                    None => missing.push(r.path.clone()),
                }
            }
            Ok(Eval::Missing(missing))
        }
        Combinator::And => {
            let blocked: Vec<Path> = expr
                .refs
                .iter()
                .enumerate()
                .filter(|(k, r)| writable(id(*k), &r.path))
                .map(|(_, r)| r.path.clone())
                .collect();
            if !blocked.is_empty() {
                return Ok(Eval::Blocked(blocked));
            }
            let mut last = Value::Null;
            let mut missing = Vec::new();
            for (k, r) in expr.refs.iter().enumerate() {
                match state.read_noting(r, id(k), writers.as_deref_mut())? {
                    Some(v) => last = v,
                    None => missing.push(r.path.clone()),
                }
            }
            if missing.is_empty() {
                Ok(Eval::Ready(last))
            } else {
                Ok(Eval::Missing(missing))
            }
        }
    }
}

pub(super) fn resolve_params(
    state: &State,
    params: &Map<String, Value>,
    writable: &dyn Fn(&Path) -> bool,
) -> Result<Resolved, StateError> {
    let mut acc = Acc::default();
    let mut out = Map::new();
    for (k, v) in params {
        out.insert(k.clone(), resolve_value(state, v, writable, &mut acc)?);
    }
    Ok(if !acc.missing.is_empty() {
        Resolved::Missing {
            missing: acc.missing,
            blocked: acc.blocked,
        }
    } else if !acc.blocked.is_empty() {
        Resolved::Blocked(acc.blocked)
    } else {
        Resolved::Ready(out)
    })
}

#[derive(Default)]
struct Acc {
    blocked: Vec<Path>,
    missing: Vec<Path>,
}

fn resolve_value(
    state: &State,
    v: &Value,
    writable: &dyn Fn(&Path) -> bool,
    acc: &mut Acc,
) -> Result<Value, StateError> {
    Ok(match v {
        Value::String(s) => match parse_expression(s)? {
            None => v.clone(),
            Some(e) => match eval(state, &e, None, &|_, p| writable(p), None)? {
                Eval::Ready(x) => x,
                Eval::Blocked(p) => {
                    acc.blocked.extend(p);
                    Value::Null
                }
                Eval::Missing(p) => {
                    acc.missing.extend(p);
                    Value::Null
                }
            },
        },
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|x| resolve_value(state, x, writable, acc))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(m) => {
            let mut o = Map::new();
            for (k, x) in m {
                o.insert(k.clone(), resolve_value(state, x, writable, acc)?);
            }
            Value::Object(o)
        }
        other => other.clone(),
    })
}
