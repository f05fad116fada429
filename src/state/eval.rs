//! Expression evaluation against state (rules 1, 5, 6).

use serde_json::{Map, Value};

use super::{State, StateError};
use crate::graph::PathId;
use crate::protocol::{CallId, Combinator, Expression, Path, parse_expression};

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

/// Evaluates `expr`, asking `writable` of each reference path before reading it.
pub(super) fn eval(
    state: &State,
    expr: &Expression,
    writable: &dyn Fn(&Path) -> bool,
    mut writers: Option<&mut Vec<CallId>>,
) -> Result<Eval, StateError> {
    match expr.op {
        Combinator::Single | Combinator::Or => {
            let mut missing = Vec::new();
            for r in &expr.refs {
                if writable(&r.path) {
                    return Ok(Eval::Blocked(vec![r.path.clone()]));
                }
                match state.read_noting(r, None, writers.as_deref_mut())? {
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
                .filter(|r| writable(&r.path))
                .map(|r| r.path.clone())
                .collect();
            if !blocked.is_empty() {
                return Ok(Eval::Blocked(blocked));
            }
            let mut last = Value::Null;
            let mut missing = Vec::new();
            for r in &expr.refs {
                match state.read_noting(r, None, writers.as_deref_mut())? {
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

/// [`Eval`] with the waited-on or missing references named by their position in the
/// expression's `refs` (no copy of a path).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum EvalAt {
    /// The value is known and no pending call can change it.
    Ready(Value),
    /// The positions of the references still awaited.
    Blocked(Vec<u32>),
    /// The positions of the references that hold nothing and never will.
    Missing(Vec<u32>),
}

impl EvalAt {
    /// The [`Eval`] it stands for in `expr` (the paths copied out).
    pub(crate) fn paths(self, expr: &Expression) -> Eval {
        let at = |ks: Vec<u32>| {
            ks.into_iter()
                .filter_map(|k| expr.refs.get(k as usize).map(|r| r.path.clone()))
                .collect()
        };
        match self {
            EvalAt::Ready(v) => Eval::Ready(v),
            EvalAt::Blocked(ks) => Eval::Blocked(at(ks)),
            EvalAt::Missing(ks) => Eval::Missing(at(ks)),
        }
    }
}

/// [`eval`] for interned references read once each: `others_write` is the other calls' side
/// of "writable", and with `open` an absent path waits (see `State::eval_ids`). The same
/// outcome as [`eval`] with `writable` = `others_write || (open && !has)`: a path is read
/// (without its JSONPath tail) where [`eval`] would ask `has`, its tail applied only where
/// [`eval`] would read it, and the writers of a read that ends up waiting are not kept.
pub(super) fn eval_once(
    state: &State,
    expr: &Expression,
    ids: &[PathId],
    others_write: &dyn Fn(Option<PathId>, &Path) -> bool,
    open: bool,
    writers: &mut Vec<CallId>,
) -> Result<EvalAt, StateError> {
    let id = |k: usize| ids.get(k).copied();
    let mark = writers.len();
    // Positions fit u32: an expression's references come from one params string.
    let pos = |k: usize| u32::try_from(k).unwrap_or(u32::MAX);
    match expr.op {
        Combinator::Single | Combinator::Or => {
            let mut missing = Vec::new();
            for (k, r) in expr.refs.iter().enumerate() {
                if others_write(id(k), &r.path) {
                    writers.truncate(mark);
                    return Ok(EvalAt::Blocked(vec![pos(k)]));
                }
                match state.read_path(r, id(k), Some(writers)) {
                    Some(v) => return Ok(EvalAt::Ready(State::query(r, v)?)),
                    None if open => {
                        writers.truncate(mark);
                        return Ok(EvalAt::Blocked(vec![pos(k)]));
                    }
                    None => missing.push(pos(k)),
                }
            }
            Ok(EvalAt::Missing(missing))
        }
        Combinator::And => {
            let mut blocked = Vec::new();
            let mut values = Vec::with_capacity(expr.refs.len());
            for (k, r) in expr.refs.iter().enumerate() {
                if others_write(id(k), &r.path) {
                    blocked.push(pos(k));
                    continue;
                }
                let v = state.read_path(r, id(k), Some(writers));
                if open && v.is_none() {
                    blocked.push(pos(k));
                }
                values.push((k, r, v));
            }
            if !blocked.is_empty() {
                writers.truncate(mark);
                return Ok(EvalAt::Blocked(blocked));
            }
            let mut last = Value::Null;
            let mut missing = Vec::new();
            for (k, r, v) in values {
                match v {
                    Some(v) => last = State::query(r, v)?,
                    None => missing.push(pos(k)),
                }
            }
            if missing.is_empty() {
                Ok(EvalAt::Ready(last))
            } else {
                Ok(EvalAt::Missing(missing))
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
            Some(e) => match eval(state, &e, writable, None)? {
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
