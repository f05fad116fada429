//! The graph of pending calls (rule 7): a petgraph with an edge from writer to reader for every
//! overlap (rule 4) between one call's output paths and another's reference paths, plus the two
//! path indexes that answer "who may still write this path" and "who waits on this path".
//!
//! A call is a node from the moment it is accepted until it finishes. While it waits (blocked),
//! its reference paths are registered as *reads*; once it is unblocked it reads nothing more, so
//! edges into it no longer count. Its output paths stay registered as *writes* until it
//! finishes. A call's overlap with itself is not an edge.
//!
//! Cycles are checked incrementally: the graph without a new node is acyclic, so the new node
//! closes a cycle exactly when one of its waiting readers reaches one of its waiting writers.
//! Edges are never removed one by one (petgraph unlinks an edge in time proportional to its
//! endpoints' degree, which would make a wide fan-in quadratic); finished nodes become
//! tombstones that traversals skip, and the graph is rebuilt from its live part once tombstones
//! outnumber live nodes, which keeps removal amortised O(degree).
//!
//! Paths are interned once into a [`PathTable`] (an integer id per distinct path, with its
//! parent's): the scheduler interns a call's read and write paths into the run's table (the
//! state's, `State::intern`) when it accepts the call, keeps the ids and passes that table to
//! every `_ids` method, and the indexes walk parent ids and per-id lists of live children, so
//! no lookup hashes a segment or allocates. The methods taking `&Path` intern or locate the path
//! in the graph's own table first; they are for callers that keep no ids (tests). One graph is
//! used one way or the other, never both (the ids of two tables do not mix).
//!
//! Deliberately not here: whether a reference is *satisfied* (that needs state; the scheduler
//! asks [`CallGraph::writable_by_other`] through `State::resolve_params`), approvals, or IO.

pub mod index;
pub mod paths;

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::fxhash::FxBuildHasher;

use petgraph::Direction;
use smallvec::SmallVec;
use petgraph::stable_graph::{NodeIndex, StableGraph};
use petgraph::visit::{EdgeRef, IntoEdgeReferences};

use crate::protocol::{CallId, Path, Segment};
pub use index::PathIndex;
pub use paths::{PathId, PathTable};

/// Rebuild the petgraph once at least this many tombstones exist and they outnumber live nodes.
const COMPACT_MIN_TOMBSTONES: usize = 1024;

/// A graph operation that cannot be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// Accepting the call would close a dependency cycle.
    #[error("call {} would close a dependency cycle: {}", .cycle[0], cycle_text(.cycle))]
    Cycle {
        /// The calls around the cycle, starting (and implicitly ending) with the new call.
        cycle: Vec<CallId>,
    },
    /// The call id is already in the graph.
    #[error("call {id} is already in the graph")]
    Duplicate {
        /// The id.
        id: CallId,
    },
}

fn cycle_text(cycle: &[CallId]) -> String {
    let mut s: Vec<String> = cycle.iter().map(|c| c.to_string()).collect();
    if let Some(first) = cycle.first() {
        s.push(first.to_string());
    }
    s.join(" -> ")
}

crate::codes::has_code!(GraphError);

impl GraphError {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        match self {
            GraphError::Cycle { .. } => "graph.cycle",
            GraphError::Duplicate { .. } => "graph.duplicate",
        }
    }
}

#[derive(Debug, Clone)]
struct Node {
    id: CallId,
    alive: bool,
    reading: bool,
}

/// Pending and running calls, their overlap edges and path indexes.
#[derive(Debug, Default)]
pub struct CallGraph {
    g: StableGraph<Node, ()>,
    nodes: HashMap<CallId, NodeIndex, FxBuildHasher>,
    /// The table of the `&Path` methods (the `_ids` methods are given the caller's).
    paths: PathTable,
    writers: PathIndex,
    readers: PathIndex,
    tombstones: usize,
}

impl CallGraph {
    /// An empty graph.
    pub fn new() -> Self {
        CallGraph::default()
    }

    /// Number of calls in the graph (pending or running).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when no call is pending or running.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// True if the call is in the graph.
    pub fn contains(&self, id: CallId) -> bool {
        self.nodes.contains_key(&id)
    }

    /// True if the call is in the graph and still waits on its reads.
    pub fn is_reading(&self, id: CallId) -> bool {
        self.node(id).is_some_and(|n| n.reading)
    }

    /// Number of live edges: writer → waiting reader, both in the graph.
    pub fn live_edge_count(&self) -> usize {
        self.g
            .edge_references()
            .filter(|e| self.g[e.source()].alive && self.g[e.target()].reading)
            .count()
    }

    /// The ids of the live calls that write paths `id` waits on, sorted.
    pub fn producers(&self, id: CallId) -> Vec<CallId> {
        let Some(&ix) = self.nodes.get(&id) else {
            return Vec::new();
        };
        if !self.g[ix].reading {
            return Vec::new();
        }
        let set: BTreeSet<CallId> = self
            .g
            .edges_directed(ix, Direction::Incoming)
            .map(|e| &self.g[e.source()])
            .filter(|n| n.alive)
            .map(|n| n.id)
            .collect();
        set.into_iter().collect()
    }

    fn node(&self, id: CallId) -> Option<&Node> {
        self.nodes.get(&id).map(|&ix| &self.g[ix])
    }

    /// The id of `path` in the graph's own path table (for the `&Path` methods), made when it
    /// is new.
    pub fn intern(&mut self, path: &Path) -> PathId {
        self.paths.intern(path)
    }

    /// The graph's own path table (for the `&Path` methods).
    pub fn paths(&self) -> &PathTable {
        &self.paths
    }

    /// Runs `f` with the graph's own table taken out (the `&Path` methods call the `_ids`
    /// methods with it).
    fn with_own_table<R>(&mut self, f: impl FnOnce(&mut Self, &PathTable) -> R) -> R {
        let t = std::mem::take(&mut self.paths);
        let r = f(self, &t);
        self.paths = t;
        r
    }

    /// Adds a call that reads `reads` and may write `writes` (every alternative of its output
    /// target). Fails, changing nothing, if it would close a cycle. The paths are interned
    /// here; a caller that keeps ids uses [`CallGraph::insert_ids`].
    pub fn insert(
        &mut self,
        id: CallId,
        reads: &[&Path],
        writes: &[&Path],
    ) -> Result<(), GraphError> {
        let reads: Vec<PathId> = reads.iter().map(|p| self.paths.intern(p)).collect();
        let writes: Vec<PathId> = writes.iter().map(|p| self.paths.intern(p)).collect();
        self.with_own_table(|g, t| g.insert_ids(t, id, &reads, &writes))
    }

    /// [`CallGraph::insert`] with paths interned in `t` (the caller's table, given to every
    /// `_ids` method of this graph).
    ///
    /// The graph does not keep the paths: the caller owns them and passes the same ones to
    /// [`CallGraph::stop_reading_ids`] and [`CallGraph::remove_ids`] (duplicates are harmless).
    pub fn insert_ids(
        &mut self,
        t: &PathTable,
        id: CallId,
        reads: &[PathId],
        writes: &[PathId],
    ) -> Result<(), GraphError> {
        if self.nodes.contains_key(&id) {
            return Err(GraphError::Duplicate { id });
        }
        // A call's producers and consumers, inline for the few most calls have.
        let mut producers: SmallVec<[CallId; 4]> = SmallVec::new();
        for &p in reads {
            self.writers.for_each_overlapping(t, p, true, |w| {
                if w != id {
                    producers.push(w);
                }
            });
        }
        producers.sort_unstable();
        producers.dedup();
        let mut consumers: SmallVec<[CallId; 4]> = SmallVec::new();
        for &p in writes {
            self.readers.for_each_overlapping(t, p, true, |r| {
                if r != id {
                    consumers.push(r);
                }
            });
        }
        consumers.sort_unstable();
        consumers.dedup();
        if let Some(mut cycle) = self.find_path(&consumers, &producers) {
            cycle.insert(0, id);
            return Err(GraphError::Cycle { cycle });
        }
        for &p in reads {
            self.readers.insert(t, p, id);
        }
        for &p in writes {
            self.writers.insert(t, p, id);
        }
        let reading = !reads.is_empty();
        let ix = self.g.add_node(Node {
            id,
            alive: true,
            reading,
        });
        self.nodes.insert(id, ix);
        for w in &producers {
            if let Some(&wx) = self.nodes.get(w) {
                self.g.add_edge(wx, ix, ());
            }
        }
        for r in &consumers {
            if let Some(&rx) = self.nodes.get(r) {
                self.g.add_edge(ix, rx, ());
            }
        }
        Ok(())
    }

    /// A path of live edges from one of `from` (waiting calls) to one of `to` that is still
    /// waiting, as call ids from start to end; None when there is none.
    fn find_path(&self, from: &[CallId], to: &[CallId]) -> Option<Vec<CallId>> {
        if from.is_empty() || to.is_empty() {
            return None;
        }
        let targets: HashSet<NodeIndex> = to
            .iter()
            .filter_map(|id| self.nodes.get(id).copied())
            .filter(|&ix| self.g[ix].reading)
            .collect();
        if targets.is_empty() {
            return None;
        }
        let mut parent: HashMap<NodeIndex, Option<NodeIndex>> = HashMap::new();
        let mut stack = Vec::new();
        for id in from {
            let Some(&start) = self.nodes.get(id) else {
                continue;
            };
            if parent.contains_key(&start) {
                continue;
            }
            parent.insert(start, None);
            stack.push(start);
            while let Some(cur) = stack.pop() {
                if targets.contains(&cur) {
                    let mut out = vec![self.g[cur].id];
                    let mut at = cur;
                    while let Some(Some(prev)) = parent.get(&at) {
                        out.push(self.g[*prev].id);
                        at = *prev;
                    }
                    out.reverse();
                    return Some(out);
                }
                for e in self.g.edges_directed(cur, Direction::Outgoing) {
                    let next = e.target();
                    let n = &self.g[next];
                    if n.alive && n.reading && !parent.contains_key(&next) {
                        parent.insert(next, Some(cur));
                        stack.push(next);
                    }
                }
            }
        }
        None
    }

    /// The ids of the paths the table holds, of those given (paths never interned were never
    /// registered).
    fn known<'a>(&self, paths: impl IntoIterator<Item = &'a Path>) -> Vec<PathId> {
        paths
            .into_iter()
            .filter_map(|p| match self.paths.locate(p) {
                (at, true) => Some(at),
                _ => None,
            })
            .collect()
    }

    /// The call no longer waits on anything (it was unblocked): its reads (the paths given to
    /// `insert`) are unregistered and edges into it stop counting.
    pub fn stop_reading<'a>(&mut self, id: CallId, reads: impl IntoIterator<Item = &'a Path>) {
        let reads = self.known(reads);
        self.with_own_table(|g, t| g.stop_reading_ids(t, id, &reads));
    }

    /// [`CallGraph::stop_reading`] with the ids given to [`CallGraph::insert_ids`].
    pub fn stop_reading_ids(&mut self, t: &PathTable, id: CallId, reads: &[PathId]) {
        let Some(&ix) = self.nodes.get(&id) else {
            return;
        };
        let node = &mut self.g[ix];
        if !node.reading {
            return;
        }
        node.reading = false;
        for &p in reads {
            self.readers.remove(t, p, id);
        }
    }

    /// Takes a call out of the graph (finished, failed, unresolved, cancelled), given the paths it
    /// was inserted with. Readers of `writes` may now be ready.
    pub fn remove<'a>(
        &mut self,
        id: CallId,
        reads: impl IntoIterator<Item = &'a Path>,
        writes: impl IntoIterator<Item = &'a Path>,
    ) {
        let (reads, writes) = (self.known(reads), self.known(writes));
        self.with_own_table(|g, t| g.remove_ids(t, id, &reads, &writes));
    }

    /// [`CallGraph::remove`] with the ids given to [`CallGraph::insert_ids`].
    pub fn remove_ids(&mut self, t: &PathTable, id: CallId, reads: &[PathId], writes: &[PathId]) {
        let Some(ix) = self.nodes.remove(&id) else {
            return;
        };
        let node = &mut self.g[ix];
        node.alive = false;
        if node.reading {
            node.reading = false;
            for &p in reads {
                self.readers.remove(t, p, id);
            }
        }
        for &p in writes {
            self.writers.remove(t, p, id);
        }
        self.tombstones += 1;
        if self.tombstones >= COMPACT_MIN_TOMBSTONES && self.tombstones > self.nodes.len() {
            self.compact();
        }
    }

    fn compact(&mut self) {
        let mut g = StableGraph::with_capacity(self.nodes.len(), 0);
        let mut map = HashMap::with_capacity(self.nodes.len());
        for ix in self.g.node_indices() {
            let n = &self.g[ix];
            if n.alive {
                map.insert(ix, g.add_node(n.clone()));
            }
        }
        for e in (&self.g).edge_references() {
            if let (Some(&a), Some(&b)) = (map.get(&e.source()), map.get(&e.target()))
                && g[b].reading
            {
                g.add_edge(a, b, ());
            }
        }
        for (_, ix) in self.nodes.iter_mut() {
            if let Some(&new) = map.get(ix) {
                *ix = new;
            }
        }
        self.g = g;
        self.tombstones = 0;
    }

    /// True if a call other than `except` may still write a path overlapping `path` (rule 5).
    pub fn writable_by_other(&self, path: &Path, except: CallId) -> bool {
        let (at, exact) = self.paths.locate(path);
        self.writers
            .any_overlapping_except(&self.paths, at, exact, except)
    }

    /// [`CallGraph::writable_by_other`] for an interned path.
    pub fn writable_by_other_id(&self, t: &PathTable, path: PathId, except: CallId) -> bool {
        self.writers.any_overlapping_except(t, path, true, except)
    }

    /// Waiting calls whose reads a write to `path` can change, added to `out`: the reads that
    /// overlap it (rule 4) and the reads of array elements the write pads with `null` (an index
    /// below one on `path`, spec/state.md S6), which become present at that write.
    pub fn readers_of(&self, path: &Path, out: &mut BTreeSet<CallId>) {
        let (at, exact) = self.paths.locate(path);
        let next = match path.segments().get(self.paths.depth(at)) {
            Some(Segment::Index(i)) if !exact => Some(*i),
            _ => None,
        };
        let mut add = |id| {
            out.insert(id);
        };
        self.readers
            .for_each_overlapping(&self.paths, at, exact, &mut add);
        self.readers.for_each_padded(&self.paths, at, next, add);
    }

    /// [`CallGraph::readers_of`] for an interned path.
    pub fn readers_of_id(&self, t: &PathTable, path: PathId, out: &mut BTreeSet<CallId>) {
        let mut add = |id| {
            out.insert(id);
        };
        self.readers.for_each_overlapping(t, path, true, &mut add);
        self.readers.for_each_padded(t, path, None, add);
    }

    /// Calls that may write a path overlapping `path`, added to `out`.
    pub fn writers_of(&self, path: &Path, out: &mut BTreeSet<CallId>) {
        let (at, exact) = self.paths.locate(path);
        self.writers.for_each_overlapping(&self.paths, at, exact, |id| {
            out.insert(id);
        });
    }

    /// Number of petgraph nodes including tombstones (for tests of compaction).
    pub fn raw_node_count(&self) -> usize {
        self.g.node_count()
    }
}

#[cfg(test)]
mod tests;
