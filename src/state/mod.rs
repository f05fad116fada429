//! The run's shared data: an append-only write log, indexed by path, resolved at read time.
//!
//! Writes are never merged in place (protocol chapter 008). A read of `kind.path` considers the
//! writes to that path, to any prefix and to any extension (rule 4), newest to oldest, stopping at
//! the newest `set` that covers it (rule 2). "Newest" is the order in which writes are appended,
//! which the engine makes the order in which calls complete (rule 3).
//!
//! Deliberately not here: knowing which calls are pending (the caller passes a predicate), reading
//! a clock (timestamps are supplied), or any IO.

pub mod apply;
mod eval;
mod index;
#[cfg(test)]
pub(crate) use index::PLANS;
#[cfg(test)]
mod read_tests;

/// The run's path ids ([`State::intern`]), shared with the scheduler's call graph.
pub use crate::graph::{PathId, PathTable};
pub(crate) use eval::EvalAt;
pub use eval::{Eval, Resolved};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::{CallId, Expression, Millis, OutputMethod, Path, Reference, Segment};
use index::{Index, Loc};

/// One entry of the write log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Write {
    /// Position in the log (0-based, strictly increasing).
    pub seq: u64,
    /// Where the value was written.
    pub path: Path,
    /// The written value (shared with the call's result and its events).
    pub value: Arc<Value>,
    /// How it combines with earlier writes.
    pub method: OutputMethod,
    /// The call that made it (None for the goal's initial data).
    pub call: Option<CallId>,
    /// When it was written (milliseconds since the Unix epoch, from the caller).
    pub at: Millis,
}

/// Reading state failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// A JSONPath tail (`[*]`, `[?...]`) could not be evaluated.
    #[error("cannot evaluate `{reference}`: {reason}")]
    Query {
        /// The reference as written.
        reference: String,
        /// What the JSONPath engine said.
        reason: String,
    },
    /// A reference inside params is malformed.
    #[error(transparent)]
    Reference(#[from] crate::protocol::ReferenceError),
}

crate::codes::has_code!(StateError);

impl StateError {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        match self {
            StateError::Query { .. } => "state.query",
            StateError::Reference(_) => "reference.invalid",
        }
    }
}

/// The append-only log with its path index.
///
/// The state holds the run's [`PathTable`]: every path written or read through an id is
/// interned there once, and its index is keyed by those ids. A caller that keeps ids (the
/// scheduler, for a call's references and output target) interns with [`State::intern`] and
/// reads and writes with the `_id` methods; the `&Path` methods locate the path first.
#[derive(Debug, Default)]
pub struct State {
    log: Vec<Write>,
    paths: PathTable,
    index: Index,
    /// Each viewed kind's merged value, as of some length of the log; brought up to date by the
    /// next `view`, so a run reads its state once per step without replaying its whole log.
    views: Mutex<BTreeMap<String, KindView>>,
}

/// A kind's merged value after the first `upto` writes of the log.
#[derive(Debug, Clone, Default)]
struct KindView {
    upto: usize,
    doc: Option<Value>,
}

impl Clone for State {
    fn clone(&self) -> Self {
        State {
            log: self.log.clone(),
            paths: self.paths.clone(),
            index: self.index.clone(),
            views: Mutex::new(self.views.lock().map(|v| v.clone()).unwrap_or_default()),
        }
    }
}

impl State {
    /// An empty state.
    pub fn new() -> Self {
        State::default()
    }

    /// Appends a write; returns its sequence number.
    pub fn write(
        &mut self,
        path: Path,
        value: impl Into<Arc<Value>>,
        method: OutputMethod,
        call: Option<CallId>,
        at: Millis,
    ) -> u64 {
        let id = self.paths.intern(&path);
        self.write_id(id, path, value, method, call, at)
    }

    /// [`State::write`] at a path already interned ([`State::intern`]): `id` must be `path`'s.
    pub fn write_id(
        &mut self,
        id: PathId,
        path: Path,
        value: impl Into<Arc<Value>>,
        method: OutputMethod,
        call: Option<CallId>,
        at: Millis,
    ) -> u64 {
        let seq = self.log.len() as u64;
        self.index.insert(&self.paths, id, path.kind(), seq, method);
        self.log.push(Write {
            seq,
            path,
            value: value.into(),
            method,
            call,
            at,
        });
        seq
    }

    /// The id of `path` in the run's path table, made when it is new (with its prefixes').
    pub fn intern(&mut self, path: &Path) -> PathId {
        self.paths.intern(path)
    }

    /// The text of `path`, whose id is `id` ([`State::intern`]), as events name it: rendered
    /// once per run and shared ([`PathTable::text`]).
    pub fn text(&mut self, id: PathId, path: &Path) -> crate::protocol::PathText {
        self.paths.text(id, path)
    }

    /// The run's path table (the ids [`State::intern`] gives).
    pub fn paths(&self) -> &PathTable {
        &self.paths
    }

    fn locate(&self, path: &Path) -> Loc {
        let (at, exact) = self.paths.locate(path);
        let next_is_index = !exact
            && matches!(
                path.segments().get(self.paths.depth(at)),
                Some(Segment::Index(_))
            );
        Loc {
            at,
            exact,
            next_is_index,
        }
    }

    /// Every write, oldest first.
    pub fn log(&self) -> &[Write] {
        &self.log
    }

    /// Number of writes.
    pub fn len(&self) -> usize {
        self.log.len()
    }

    /// True when nothing was written.
    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }

    /// The current value at a concrete path, or None when absent.
    pub fn get(&self, path: &Path) -> Option<Value> {
        self.get_noting(self.locate(path), path.segments(), None)
    }

    /// Whether [`State::get`] would find a value, without copying it out.
    pub fn has(&self, path: &Path) -> bool {
        self.has_at(self.locate(path), path.segments())
    }

    /// [`State::has`] for an interned path: `id` must be `path`'s ([`State::intern`]).
    pub fn has_id(&self, id: PathId, path: &Path) -> bool {
        self.has_at(Loc::exact(id), path.segments())
    }

    /// Whether the read at `loc` finds a value, without building it: from the one `set` it
    /// replays, or from its newest write when that write is at the path or below it (a write
    /// creates the containers on its way, so the path then holds a value whatever came before).
    /// Only a read whose newest write is above the path, or which widens to a prefix, builds the
    /// value to test it.
    fn has_at(&self, loc: Loc, segs: &[Segment]) -> bool {
        let plan = self.index.plan(&self.paths, loc);
        if plan.widen_to.is_none() {
            let Some(&newest) = plan.seqs.last() else {
                return false;
            };
            if let Some(w) = self.only_set(&plan, segs.len()) {
                return apply::get(&w.value, &segs[w.path.len()..]).is_some();
            }
            if self
                .log
                .get(usize::try_from(newest).unwrap_or(usize::MAX))
                .is_some_and(|w| w.path.len() >= segs.len())
            {
                return true;
            }
        }
        self.get_planned(plan, segs, None).is_some()
    }

    /// The write a read of a path of `len` segments replays when it is all the read replays and
    /// a `set` at the path or above it: the value is then read straight from it (what the replay
    /// would give, without building a document first).
    fn only_set(&self, plan: &index::ReadPlan, len: usize) -> Option<&Write> {
        let [s] = plan.seqs[..] else { return None };
        let w = self.log.get(usize::try_from(s).ok()?)?;
        (plan.widen_to.is_none() && w.method == OutputMethod::Set && w.path.len() <= len)
            .then_some(w)
    }

    /// [`State::get`], adding to `writers` the calls that made the writes the value came from
    /// (unsorted, possibly repeated; the goal's initial data has no call). What a call read its
    /// params from, which its `started` event names.
    pub fn get_from(&self, path: &Path, writers: &mut Vec<CallId>) -> Option<Value> {
        self.get_noting(self.locate(path), path.segments(), Some(writers))
    }

    /// The read at `loc`, whose path has the segments `segs`.
    fn get_noting(
        &self,
        loc: Loc,
        segs: &[Segment],
        writers: Option<&mut Vec<CallId>>,
    ) -> Option<Value> {
        self.get_planned(self.index.plan(&self.paths, loc), segs, writers)
    }

    /// [`State::get_noting`] with the read's plan made.
    fn get_planned(
        &self,
        plan: index::ReadPlan,
        segs: &[Segment],
        mut writers: Option<&mut Vec<CallId>>,
    ) -> Option<Value> {
        if let Some(root) = plan.widen_to {
            let n = self.paths.depth(root);
            let v = self.get_noting(Loc::exact(root), segs.get(..n)?, writers)?;
            return apply::get(&v, &segs[n..]).cloned();
        }
        if plan.seqs.is_empty() {
            return None;
        }
        if let Some(w) = self.only_set(&plan, segs.len()) {
            if let Some(ws) = writers {
                ws.extend(w.call);
            }
            return apply::get(&w.value, &segs[w.path.len()..]).cloned();
        }
        let base_len = plan
            .seqs
            .iter()
            .map(|&s| self.log[s as usize].path.len())
            .min()
            .unwrap_or(segs.len())
            .min(segs.len());
        let mut doc: Option<Value> = None;
        for &s in &plan.seqs {
            let w = &self.log[s as usize];
            apply::apply_at(&mut doc, &w.path.segments()[base_len..], w.method, &w.value);
            if let Some(ws) = writers.as_deref_mut() {
                ws.extend(w.call);
            }
        }
        let doc = doc?;
        apply::get(&doc, &segs[base_len..]).cloned()
    }

    /// Reads a reference: the concrete path, then its JSONPath tail (which yields an array of
    /// matches; an empty array when nothing matches).
    pub fn read(&self, r: &Reference) -> Result<Option<Value>, StateError> {
        self.read_noting(r, None, None)
    }

    /// [`State::read`], adding to `writers` (when given) the calls whose writes it read
    /// ([`State::get_from`]).
    /// `id` is the reference path's id when the caller interned it.
    fn read_noting(
        &self,
        r: &Reference,
        id: Option<PathId>,
        writers: Option<&mut Vec<CallId>>,
    ) -> Result<Option<Value>, StateError> {
        match self.read_path(r, id, writers) {
            Some(v) => Self::query(r, v).map(Some),
            None => Ok(None),
        }
    }

    /// The value at a reference's concrete path, before its JSONPath tail.
    fn read_path(
        &self,
        r: &Reference,
        id: Option<PathId>,
        writers: Option<&mut Vec<CallId>>,
    ) -> Option<Value> {
        let loc = match id {
            Some(id) => Loc::exact(id),
            None => self.locate(&r.path),
        };
        self.get_noting(loc, r.path.segments(), writers)
    }

    /// A reference's JSONPath tail applied to the value at its path (an array of matches; an
    /// empty array when nothing matches), or the value itself when it has no tail.
    fn query(r: &Reference, v: Value) -> Result<Value, StateError> {
        let Some(q) = &r.query else {
            return Ok(v);
        };
        let found = jsonpath_rust::query::js_path_vals(q, &v).map_err(|e| StateError::Query {
            reference: r.to_string(),
            reason: e.to_string(),
        })?;
        Ok(Value::Array(found.into_iter().cloned().collect()))
    }

    /// The merged current value of a whole kind (`state`, `input`...), for showing to the model.
    /// Equal to `get(&Path::root(kind))`, but applies only the writes made since the kind was
    /// last viewed (to a copy kept for the purpose): reading the state at every step stays as
    /// cheap at step 200 as at step 1.
    pub fn view(&self, kind: &str) -> Option<Value> {
        let Ok(mut views) = self.views.lock() else {
            return self.get(&Path::root(kind));
        };
        let view = views.entry(kind.to_string()).or_default();
        for w in self.log.get(view.upto..).unwrap_or_default() {
            if w.path.kind() == kind {
                apply::apply_at(&mut view.doc, w.path.rest(), w.method, &w.value);
            }
        }
        view.upto = self.log.len();
        view.doc.clone()
    }

    /// The kinds that have been written, sorted.
    pub fn kinds(&self) -> Vec<String> {
        self.index.kinds()
    }

    /// Evaluates an expression (rules 5 and 6). `writable(path)` tells whether some pending or
    /// running call can still write a path overlapping `path`.
    pub fn eval(
        &self,
        expr: &Expression,
        writable: &dyn Fn(&Path) -> bool,
    ) -> Result<Eval, StateError> {
        eval::eval(self, expr, writable, None)
    }

    /// [`State::eval`], adding to `writers` the calls whose writes a ready value came from
    /// ([`State::get_from`]).
    pub fn eval_from(
        &self,
        expr: &Expression,
        writable: &dyn Fn(&Path) -> bool,
        writers: &mut Vec<CallId>,
    ) -> Result<Eval, StateError> {
        eval::eval(self, expr, writable, Some(writers))
    }

    /// [`State::eval_from`] for an expression whose reference paths were interned: `ids` are
    /// their ids, in order ([`State::intern`]). `others_write` tells whether some other pending
    /// or running call can still write a path overlapping the reference's (asked with its id;
    /// None only past the end of `ids`), and `open` whether more calls may still arrive: then a
    /// path that holds no value is waited on rather than missing.
    ///
    /// Same outcome as [`State::eval_from`] with `writable` = `others_write || (open &&
    /// !has)`, but each reference path is read once: the read that finds the value also tells
    /// whether there is one, so a chain hop walks the index once, not twice.
    pub fn eval_ids(
        &self,
        expr: &Expression,
        ids: &[PathId],
        others_write: &dyn Fn(Option<PathId>, &Path) -> bool,
        open: bool,
        writers: &mut Vec<CallId>,
    ) -> Result<Eval, StateError> {
        eval::eval_once(self, expr, ids, others_write, open, writers).map(|e| e.paths(expr))
    }

    /// [`State::eval_ids`] naming the awaited or missing references by their position in
    /// `expr.refs` instead of copying their paths (what the scheduler keeps).
    pub(crate) fn eval_ids_at(
        &self,
        expr: &Expression,
        ids: &[PathId],
        others_write: &dyn Fn(Option<PathId>, &Path) -> bool,
        open: bool,
        writers: &mut Vec<CallId>,
    ) -> Result<EvalAt, StateError> {
        eval::eval_once(self, expr, ids, others_write, open, writers)
    }

    /// Replaces every reference inside `params` by its value (rule 1), or says what it waits on.
    pub fn resolve_params(
        &self,
        params: &serde_json::Map<String, Value>,
        writable: &dyn Fn(&Path) -> bool,
    ) -> Result<Resolved, StateError> {
        eval::resolve_params(self, params, writable)
    }
}

/// The paths a call's result goes to (rule 10). `branch` is the alternative an activity chose
/// for an `||` target; by default success takes the first and failure the last. A plain or `&&`
/// target receives nothing on failure.
pub fn output_paths(target: &Expression, success: bool, branch: Option<usize>) -> Vec<Path> {
    target.refs[output_choice(target, success, branch)]
        .iter()
        .map(|r| r.path.clone())
        .collect()
}

/// [`output_paths`] as the positions of the chosen paths in `target.refs`.
pub fn output_choice(
    target: &Expression,
    success: bool,
    branch: Option<usize>,
) -> std::ops::Range<usize> {
    use crate::protocol::Combinator;
    let n = target.refs.len();
    match target.op {
        Combinator::Or => {
            let i = match branch {
                Some(i) if i < n => i,
                _ if success => 0,
                _ => n.saturating_sub(1),
            };
            if (!success && branch.is_none() && n < 2) || i >= n {
                return 0..0;
            }
            i..i + 1
        }
        _ if success => 0..n,
        _ => 0..0,
    }
}
