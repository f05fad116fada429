//! The path index behind [`super::State`]: which writes touch which paths, so a read never
//! rescans the whole log.

use std::collections::{BTreeSet, HashMap};

use crate::fxhash::FxBuildHasher;
use crate::protocol::{OutputMethod, Path, Segment};

#[derive(Debug, Clone, Default)]
struct Node {
    /// Writes made exactly at this path, oldest first.
    seqs: Vec<u64>,
    /// Newest `set` at this path.
    last_set: Option<u64>,
    /// Newest `push`/`concat` at this path.
    last_array_op: Option<u64>,
    /// Newest write below this path whose next segment is a key.
    through_key: Option<u64>,
    /// Newest write below this path whose next segment is an index.
    through_index: Option<u64>,
    /// The nodes one segment further down, by that segment. A hash map: a lookup hashes one
    /// segment instead of comparing it with ~log2(n) siblings; nothing depends on its iteration
    /// order (a read collects the subtree's writes and sorts them).
    children: HashMap<Segment, usize, FxBuildHasher>,
}

/// What a read of one path must replay.
pub(super) struct ReadPlan {
    /// The writes to replay, oldest first.
    pub seqs: Vec<u64>,
    /// When set, the read must resolve this shorter prefix (number of segments) and project:
    /// a newer write there can change array lengths or container types along the path.
    pub widen_to: Option<usize>,
}

/// A trie of the written paths: nodes live in a vector (the first is the empty path), each with
/// its children by segment, so a write or a read walks one segment per level (no hashing or
/// copying of whole paths; the call graph's `graph::index` is the same shape, with per-call
/// registrations instead of write numbers) and the writes below a path are that node's subtree.
#[derive(Debug, Clone)]
pub(super) struct Index {
    nodes: Vec<Node>,
    kinds: BTreeSet<String>,
}

impl Default for Index {
    fn default() -> Self {
        Index {
            nodes: vec![Node::default()],
            kinds: BTreeSet::new(),
        }
    }
}

fn newer(s: Option<u64>, than: Option<u64>) -> bool {
    s.is_some() && s > than
}

impl Index {
    /// The child of node `at` by `seg`, created when missing.
    fn child_mut(&mut self, at: usize, seg: &Segment) -> usize {
        if let Some(&i) = self.nodes[at].children.get(seg) {
            return i;
        }
        let i = self.nodes.len();
        self.nodes.push(Node::default());
        self.nodes[at].children.insert(seg.clone(), i);
        i
    }

    pub fn insert(&mut self, path: &Path, seq: u64, method: OutputMethod) {
        if !self.kinds.contains(path.kind()) {
            self.kinds.insert(path.kind().to_string());
        }
        let segs = path.segments();
        let mut at = 0;
        for (n, seg) in segs.iter().enumerate() {
            at = self.child_mut(at, seg);
            match segs.get(n + 1) {
                Some(Segment::Key(_)) => self.nodes[at].through_key = Some(seq),
                Some(Segment::Index(_)) => self.nodes[at].through_index = Some(seq),
                None => {}
            }
        }
        let node = &mut self.nodes[at];
        node.seqs.push(seq);
        match method {
            OutputMethod::Set => node.last_set = Some(seq),
            OutputMethod::Push | OutputMethod::Concat => node.last_array_op = Some(seq),
            _ => {}
        }
    }

    pub fn kinds(&self) -> Vec<String> {
        self.kinds.iter().cloned().collect()
    }

    pub fn plan(&self, path: &Path) -> ReadPlan {
        let segs = path.segments();
        // The node of each prefix (the path itself last), as far as the trie goes.
        let mut prefixes: Vec<Option<&Node>> = Vec::with_capacity(segs.len());
        let mut at = Some(0);
        for seg in segs {
            at = at.and_then(|i| self.nodes[i].children.get(seg).copied());
            prefixes.push(at.map(|i| &self.nodes[i]));
        }
        let stop = prefixes
            .iter()
            .flatten()
            .map(|n| n.last_set)
            .max()
            .flatten();
        for (i, node) in prefixes.iter().enumerate().take(segs.len() - 1) {
            let Some(node) = node else { continue };
            let n = i + 1;
            let conflict = newer(node.last_array_op, stop)
                || newer(node.through_index, stop)
                || (matches!(segs[n], Segment::Index(_)) && newer(node.through_key, stop));
            if conflict {
                return ReadPlan {
                    seqs: Vec::new(),
                    widen_to: Some(n),
                };
            }
        }
        let from = stop.unwrap_or(0);
        let mut seqs = Vec::new();
        let take = |node: &Node, seqs: &mut Vec<u64>| {
            let i = node.seqs.partition_point(|&s| s < from);
            seqs.extend_from_slice(&node.seqs[i..]);
        };
        for node in prefixes.iter().flatten() {
            take(node, &mut seqs);
        }
        if let Some(Some(node)) = prefixes.last()
            && newer(node.through_key.max(node.through_index), stop)
        {
            // Every write below the path: the node's subtree.
            let mut below: Vec<usize> = node.children.values().copied().collect();
            while let Some(child) = below.pop() {
                let n = &self.nodes[child];
                take(n, &mut seqs);
                below.extend(n.children.values().copied());
            }
        }
        seqs.sort_unstable();
        ReadPlan {
            seqs,
            widen_to: None,
        }
    }
}
