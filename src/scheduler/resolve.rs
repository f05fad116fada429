//! Resolving a waiting call's references (rules 1, 5, 6) from references parsed once, when the
//! call arrived, instead of re-parsing every param string on every check. Same outcome as
//! `State::resolve_params`: every expression is evaluated in param order; any missing path makes
//! the call missing, else any blocked path makes it blocked, else the values are substituted.
//!
//! A ready check hands back an [`Overlay`]: the resolved values, by reference position, beside
//! the written call, which stays shared. The resolved params are built ([`apply`]) only for a
//! call that has references; a call without any launches as written, with no copy of its params.
//! It does not validate or launch anything (that is the gate's part).

use serde_json::{Map, Value};

use crate::graph::PathId;
use crate::protocol::{CallId, Expression, Path};
use crate::state::{EvalAt, State, StateError};

/// A reference expression found in a call's params, with the JSON pointer to where it sits.
pub(super) type Refs = Vec<(String, Expression)>;

/// Where a waited-on path sits in [`Refs`]: (expression index, alternative index).
pub(super) type RefAt = (u32, u32);

/// The resolved values of a call's references, in the order of its [`Refs`]: empty for a call
/// without references (its params are its resolved params).
pub(super) type Overlay = Vec<Value>;

/// The outcome of one full check.
pub(super) enum Check {
    /// The resolved values, and the calls whose writes they were read from (sorted, once each).
    Ready(Overlay, Vec<CallId>),
    Blocked(Vec<RefAt>),
    Missing {
        missing: Vec<RefAt>,
        blocked: Vec<RefAt>,
    },
}

/// The path a [`RefAt`] points to.
pub(super) fn path_at(refs: &Refs, at: RefAt) -> Option<&Path> {
    let (_, e) = refs.get(at.0 as usize)?;
    e.refs.get(at.1 as usize).map(|r| &r.path)
}

/// Where the `k`th reference of expression `i` (`e`) sits, named by the first reference of `e`
/// with the same path (an expression may name one path twice; it is waited on once).
fn at(i: usize, e: &Expression, k: u32) -> RefAt {
    let earlier = match (e.refs.get(..k as usize), e.refs.get(k as usize)) {
        (Some(before), Some(r)) => before.iter().position(|x| x.path == r.path),
        _ => None,
    };
    (i as u32, earlier.map_or(k, |j| j as u32))
}

fn unescape(token: &str) -> String {
    if !token.contains('~') {
        return token.to_string();
    }
    token.replace("~1", "/").replace("~0", "~")
}

fn set_pointer(params: &mut Map<String, Value>, pointer: &str, value: Value) {
    let body = pointer.strip_prefix('/').unwrap_or(pointer);
    let (key, rest) = match body.find('/') {
        Some(i) => (&body[..i], &body[i..]),
        None => (body, ""),
    };
    // The key is unescaped (a copy) only when it holds an escape; a key already in the params
    // (always, for a reference found in them) has its value replaced in place, without
    // hashing and dropping a new owned key.
    let key: std::borrow::Cow<'_, str> = if key.contains('~') {
        unescape(key).into()
    } else {
        key.into()
    };
    if rest.is_empty() {
        match params.get_mut(key.as_ref()) {
            Some(slot) => *slot = value,
            None => {
                params.insert(key.into_owned(), value);
            }
        }
    } else if let Some(slot) = params.get_mut(key.as_ref()).and_then(|v| v.pointer_mut(rest)) {
        *slot = value;
    }
}

/// Evaluates every expression of `refs` against `state`; `ids` the ids of every reference path
/// in the state's table (in the order of `refs`, alternatives in order); `others_write` and
/// `open` as `State::eval_ids` takes them.
pub(super) fn check(
    state: &State,
    refs: &Refs,
    ids: &[PathId],
    others_write: &dyn Fn(Option<PathId>, &Path) -> bool,
    open: bool,
) -> Result<Check, StateError> {
    let mut values = Vec::with_capacity(refs.len());
    let mut blocked = Vec::new();
    let mut missing = Vec::new();
    let mut writers = Vec::new();
    let mut from = 0;
    for (i, (_, e)) in refs.iter().enumerate() {
        let n = e.refs.len();
        let these = ids.get(from..from + n).unwrap_or_default();
        from += n;
        match state.eval_ids_at(e, these, others_write, open, &mut writers)? {
            EvalAt::Ready(v) => values.push(v),
            EvalAt::Blocked(ks) => blocked.extend(ks.into_iter().map(|k| at(i, e, k))),
            EvalAt::Missing(ks) => missing.extend(ks.into_iter().map(|k| at(i, e, k))),
        }
    }
    if !missing.is_empty() {
        return Ok(Check::Missing { missing, blocked });
    }
    if !blocked.is_empty() {
        return Ok(Check::Blocked(blocked));
    }
    writers.sort_unstable();
    writers.dedup();
    Ok(Check::Ready(values, writers))
}

/// The resolved params: the written `params` with each reference's value of `overlay` put in
/// its place (one copy of the params, made once).
pub(super) fn apply(params: &Map<String, Value>, refs: &Refs, overlay: Overlay) -> Map<String, Value> {
    let mut out = params.clone();
    for ((pointer, _), v) in refs.iter().zip(overlay) {
        set_pointer(&mut out, pointer, v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Call, OutputMethod};
    use serde_json::json;

    #[test]
    fn agrees_with_state_resolve_params_on_nested_references() {
        let mut state = State::new();
        state.write(
            Path::parse("state.a").expect("p"),
            json!({"x": [1, 2]}),
            OutputMethod::Set,
            None,
            0,
        );
        let call = Call::try_from(json!({"_tool": "t", "v": "†state.a.x[1]",
            "deep": {"k/1": ["lit", "†state.a || †state.b"], "n": 3}, "q": "†state.a.x[*]"}))
        .expect("call");
        let refs = call.references().expect("refs");
        let ids: Vec<PathId> = refs
            .iter()
            .flat_map(|(_, e)| e.refs.iter())
            .map(|r| state.intern(&r.path))
            .collect();
        let never = |_: &Path| false;
        let never_id = |_: Option<PathId>, _: &Path| false;
        let Ok(Check::Ready(overlay, _)) = check(&state, &refs, &ids, &never_id, false) else {
            panic!("ready expected");
        };
        assert_eq!(overlay.len(), refs.len());
        let mine = apply(&call.params, &refs, overlay);
        let Ok(crate::state::Resolved::Ready(theirs)) = state.resolve_params(&call.params, &never)
        else {
            panic!("ready expected");
        };
        assert_eq!(mine, theirs);
        let blocked = |_: Option<PathId>, p: &Path| p.to_string() == "state.a";
        let Ok(Check::Blocked(at)) = check(&state, &refs, &ids, &blocked, false) else {
            panic!("blocked expected");
        };
        assert_eq!(at.len(), 1);
        assert_eq!(
            path_at(&refs, at[0]).map(|p| p.to_string()),
            Some("state.a".into())
        );
    }
}
