//! The path index behind [`super::State`]: which writes touch which paths, so a read never
//! rescans the whole log.
//!
//! It is keyed by the ids of the run's [`PathTable`] (the state's own, which the scheduler
//! interns a call's paths into once, when it accepts the call): a write or a read walks parent
//! ids, so it hashes no segment and compares no string. Deliberately not here: the values (the
//! log is the state's) or interning (the table's).

use std::collections::BTreeSet;

use smallvec::SmallVec;

use crate::graph::{PathId, PathTable};
use crate::protocol::OutputMethod;

#[derive(Debug, Clone, Default)]
struct Node {
    /// Writes made exactly at this path, oldest first (inline while there are two or fewer,
    /// which most paths never pass: writing a new path allocates no list).
    seqs: SmallVec<[u64; 2]>,
    /// Newest `set` at this path.
    last_set: Option<u64>,
    /// Newest `push`/`concat` at this path.
    last_array_op: Option<u64>,
    /// Newest write below this path whose next segment is a key.
    through_key: Option<u64>,
    /// Newest write below this path whose next segment is an index.
    through_index: Option<u64>,
    /// The ids one segment further down that were written at or below (a read of this path
    /// collects their subtrees and sorts the writes, so their order does not matter).
    children: Vec<PathId>,
    /// Written at or below: the node is in its parent's `children`.
    linked: bool,
}

/// Where a read is, in the table: the deepest interned prefix of the read path, whether it is
/// the path itself, and (when it is not) whether the path's next segment is an index.
#[derive(Debug, Clone, Copy)]
pub(super) struct Loc {
    pub at: PathId,
    pub exact: bool,
    pub next_is_index: bool,
}

impl Loc {
    /// The path `at` itself.
    pub fn exact(at: PathId) -> Self {
        Loc {
            at,
            exact: true,
            next_is_index: false,
        }
    }
}

/// The write numbers a read replays, inline up to four (most reads replay one `set`), so
/// planning a read allocates nothing.
pub(super) type Seqs = SmallVec<[u64; 4]>;

/// What a read of one path must replay.
pub(super) struct ReadPlan {
    /// The writes to replay, oldest first.
    pub seqs: Seqs,
    /// When set, the read must resolve this shorter prefix and project: a newer write there can
    /// change array lengths or container types along the path.
    pub widen_to: Option<PathId>,
}

/// Per-id write records in a vector indexed by [`PathId`] (ids not written at or below read as
/// empty), with the written children of each, so the writes below a path are its subtree.
#[derive(Debug, Clone, Default)]
pub(super) struct Index {
    nodes: Vec<Node>,
    kinds: BTreeSet<String>,
}

#[cfg(test)]
thread_local! {
    /// How many read plans this thread made (what the scheduler's tests count index walks by).
    pub(crate) static PLANS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn newer(s: Option<u64>, than: Option<u64>) -> bool {
    s.is_some() && s > than
}

impl Index {
    fn node(&self, id: PathId) -> Option<&Node> {
        self.nodes.get(id.index())
    }

    /// Records write `seq` at `id` (of kind `kind`, the path's first segment).
    pub fn insert(
        &mut self,
        table: &PathTable,
        id: PathId,
        kind: &str,
        seq: u64,
        method: OutputMethod,
    ) {
        if self.nodes.len() < table.len() {
            self.nodes.resize_with(table.len(), Node::default);
        }
        let node = &mut self.nodes[id.index()];
        node.seqs.push(seq);
        match method {
            OutputMethod::Set => node.last_set = Some(seq),
            OutputMethod::Push | OutputMethod::Concat => node.last_array_op = Some(seq),
            _ => {}
        }
        // Up the parent chain: each ancestor records the write as one below it, through a key or
        // an index (the segment of the child on the way), and links the child on first use.
        let mut child = id;
        while let Some(parent) = table.parent(child) {
            let newly = !std::mem::replace(&mut self.nodes[child.index()].linked, true);
            if parent == PathId::ROOT {
                if newly {
                    self.kinds.insert(kind.to_string());
                }
                break;
            }
            let through_index = table.index_of(child).is_some();
            let p = &mut self.nodes[parent.index()];
            if newly {
                p.children.push(child);
            }
            if through_index {
                p.through_index = Some(seq);
            } else {
                p.through_key = Some(seq);
            }
            child = parent;
        }
    }

    pub fn kinds(&self) -> Vec<String> {
        self.kinds.iter().cloned().collect()
    }

    /// The prefixes of the read path that are interned, deepest first (the root excluded), each
    /// with whether the read path's segment right below it is an index (None for the path
    /// itself).
    fn prefixes<'a>(
        &'a self,
        table: &'a PathTable,
        loc: Loc,
    ) -> impl Iterator<Item = (PathId, Option<bool>)> + 'a {
        let first = (!loc.exact).then_some(loc.next_is_index);
        let mut next = Some((loc.at, first));
        std::iter::from_fn(move || {
            let (id, below) = next?;
            if id == PathId::ROOT {
                return None;
            }
            next = table
                .parent(id)
                .map(|p| (p, Some(table.index_of(id).is_some())));
            Some((id, below))
        })
    }

    pub fn plan(&self, table: &PathTable, loc: Loc) -> ReadPlan {
        #[cfg(test)]
        PLANS.with(|n| n.set(n.get() + 1));
        let stop = self
            .prefixes(table, loc)
            .filter_map(|(id, _)| self.node(id).and_then(|n| n.last_set))
            .max();
        // The shallowest prefix whose newer writes can change the containers along the path.
        let mut widen = None;
        for (id, below) in self.prefixes(table, loc) {
            let (Some(node), Some(index_below)) = (self.node(id), below) else {
                continue;
            };
            let conflict = newer(node.last_array_op, stop)
                || newer(node.through_index, stop)
                || (index_below && newer(node.through_key, stop));
            if conflict {
                widen = Some(id);
            }
        }
        if widen.is_some() {
            return ReadPlan {
                seqs: Seqs::new(),
                widen_to: widen,
            };
        }
        let from = stop.unwrap_or(0);
        let mut seqs = Seqs::new();
        let take = |node: &Node, seqs: &mut Seqs| {
            let i = node.seqs.partition_point(|&s| s < from);
            seqs.extend_from_slice(&node.seqs[i..]);
        };
        for (id, _) in self.prefixes(table, loc) {
            if let Some(node) = self.node(id) {
                take(node, &mut seqs);
            }
        }
        if loc.exact
            && let Some(node) = self.node(loc.at)
            && newer(node.through_key.max(node.through_index), stop)
        {
            // Every write below the path: the node's subtree, walked depth first with the
            // pending children inline.
            let mut below: SmallVec<[PathId; 8]> = SmallVec::from_slice(&node.children);
            while let Some(child) = below.pop() {
                if let Some(n) = self.node(child) {
                    take(n, &mut seqs);
                    below.extend_from_slice(&n.children);
                }
            }
        }
        if seqs.len() > 1 {
            seqs.sort_unstable();
        }
        ReadPlan {
            seqs,
            widen_to: None,
        }
    }
}
