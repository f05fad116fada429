//! The path index behind [`super::State`]: which writes touch which paths, so a read never
//! rescans the whole log.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

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
}

/// What a read of one path must replay.
pub(super) struct ReadPlan {
    /// The writes to replay, oldest first.
    pub seqs: Vec<u64>,
    /// When set, the read must resolve this shorter prefix (number of segments) and project:
    /// a newer write there can change array lengths or container types along the path.
    pub widen_to: Option<usize>,
}

/// Nodes live in a vector; exact lookups go through a hash map (one probe, no long chains of
/// key comparisons), and an ordered map of the same paths serves extension range scans. The hash
/// map is never iterated, so its order cannot leak into any decision.
#[derive(Debug, Clone, Default)]
pub(super) struct Index {
    nodes: Vec<Node>,
    by_path: HashMap<Path, usize, FxBuildHasher>,
    ordered: BTreeMap<Path, usize>,
    kinds: BTreeSet<String>,
}

fn newer(s: Option<u64>, than: Option<u64>) -> bool {
    s.is_some() && s > than
}

impl Index {
    fn node_mut(&mut self, segs: &[Segment]) -> &mut Node {
        let i = match self.by_path.get(segs) {
            Some(&i) => i,
            None => {
                let i = self.nodes.len();
                let p = Path::from_segments(segs.to_vec());
                self.nodes.push(Node::default());
                self.by_path.insert(p.clone(), i);
                self.ordered.insert(p, i);
                i
            }
        };
        &mut self.nodes[i]
    }

    fn node(&self, segs: &[Segment]) -> Option<&Node> {
        self.by_path.get(segs).map(|&i| &self.nodes[i])
    }

    pub fn insert(&mut self, path: &Path, seq: u64, method: OutputMethod) {
        if !self.kinds.contains(path.kind()) {
            self.kinds.insert(path.kind().to_string());
        }
        let segs = path.segments();
        for n in 1..segs.len() {
            let node = self.node_mut(&segs[..n]);
            match segs[n] {
                Segment::Key(_) => node.through_key = Some(seq),
                Segment::Index(_) => node.through_index = Some(seq),
            }
        }
        let node = self.node_mut(segs);
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
        // One lookup per prefix (the path itself last).
        let prefixes: Vec<Option<&Node>> =
            (1..=segs.len()).map(|n| self.node(&segs[..n])).collect();
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
            let range = self
                .ordered
                .range::<[Segment], _>((Bound::Excluded(segs), Bound::Unbounded))
                .take_while(|(k, _)| k.segments().starts_with(segs));
            for (_, &child) in range {
                take(&self.nodes[child], &mut seqs);
            }
        }
        seqs.sort_unstable();
        ReadPlan {
            seqs,
            widen_to: None,
        }
    }
}
