//! A path index: which calls touch which paths, with overlap lookups (rule 4) that visit only the
//! matching entries. It is a trie over path segments: the ancestors of a path are the nodes on
//! the way down to it, its extensions are the subtree below it, and each node counts the
//! registrations in its subtree, so finding the writers or readers of a path never scans all
//! calls, and each level costs one hash of a single segment rather than comparisons of whole
//! paths.

use std::collections::{BTreeSet, HashMap};

use crate::fxhash::FxBuildHasher;

use crate::protocol::{CallId, Path, Segment};
/// The calls registered at one path. Most paths have one, so that case does not allocate a set.
#[derive(Debug, Clone)]
enum Ids {
    One(CallId),
    Many(BTreeSet<CallId>),
}

impl Ids {
    fn iter(&self) -> impl Iterator<Item = CallId> + '_ {
        let (one, many) = match self {
            Ids::One(id) => (Some(*id), None),
            Ids::Many(set) => (None, Some(set.iter().copied())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    fn has_other_than(&self, except: CallId) -> bool {
        match self {
            Ids::One(id) => *id != except,
            Ids::Many(set) => set.len() > 1 || set.first().is_some_and(|id| *id != except),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Node {
    ids: Option<Ids>,
    /// Registrations at this node and below.
    count: usize,
    /// Children by segment. A hash map: lookups hash one segment instead of comparing it with
    /// ~log2(n) siblings; nothing depends on its iteration order (callers collect into sorted
    /// sets or only ask whether something exists).
    children: HashMap<Segment, Node, FxBuildHasher>,
}

impl Ids {
    fn len(&self) -> usize {
        match self {
            Ids::One(_) => 1,
            Ids::Many(set) => set.len(),
        }
    }
}

fn add(slot: &mut Option<Ids>, id: CallId) -> bool {
    match slot {
        None => {
            *slot = Some(Ids::One(id));
            true
        }
        Some(Ids::One(old)) if *old == id => false,
        Some(Ids::One(old)) => {
            let old = *old;
            *slot = Some(Ids::Many(BTreeSet::from([old, id])));
            true
        }
        Some(Ids::Many(set)) => set.insert(id),
    }
}

fn take(slot: &mut Option<Ids>, id: CallId) -> bool {
    match slot {
        Some(Ids::One(old)) if *old == id => {
            *slot = None;
            true
        }
        Some(Ids::Many(set)) => {
            let removed = set.remove(&id);
            if set.len() == 1
                && let Some(last) = set.first().copied()
            {
                *slot = Some(Ids::One(last));
            }
            removed
        }
        _ => false,
    }
}

fn insert_at(node: &mut Node, segs: &[Segment], id: CallId) -> bool {
    let added = match segs.split_first() {
        None => add(&mut node.ids, id),
        Some((first, rest)) => match node.children.get_mut(first) {
            Some(child) => insert_at(child, rest, id),
            None => {
                let mut child = Node::default();
                let added = insert_at(&mut child, rest, id);
                node.children.insert(first.clone(), child);
                added
            }
        },
    };
    if added {
        node.count += 1;
    }
    added
}

fn remove_at(node: &mut Node, segs: &[Segment], id: CallId) -> bool {
    let removed = match segs.split_first() {
        None => take(&mut node.ids, id),
        Some((first, rest)) => {
            let Some(child) = node.children.get_mut(first) else {
                return false;
            };
            let removed = remove_at(child, rest, id);
            if child.count == 0 {
                node.children.remove(first);
            }
            removed
        }
    };
    if removed {
        node.count -= 1;
    }
    removed
}

/// Visits the ids strictly below `node`, depth first, lazily (a wide node's
/// children are never collected up front); stops when `f` returns true.
fn visit_below(node: &Node, mut f: impl FnMut(&Ids) -> bool) {
    let mut stack = vec![node.children.values()];
    while let Some(top) = stack.last_mut() {
        match top.next() {
            None => {
                stack.pop();
            }
            Some(n) => {
                if let Some(ids) = &n.ids
                    && f(ids)
                {
                    return;
                }
                if !n.children.is_empty() {
                    stack.push(n.children.values());
                }
            }
        }
    }
}

/// Calls by path, answering "who overlaps this path" without scanning.
#[derive(Debug, Clone, Default)]
pub struct PathIndex {
    root: Node,
}

impl PathIndex {
    /// An empty index.
    pub fn new() -> Self {
        PathIndex::default()
    }

    /// Number of registrations (call, path).
    pub fn len(&self) -> usize {
        self.root.count
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.root.count == 0
    }

    /// Registers `id` at `path`.
    pub fn insert(&mut self, path: &Path, id: CallId) {
        insert_at(&mut self.root, path.segments(), id);
    }

    /// Unregisters `id` from `path` (no-op when absent).
    pub fn remove(&mut self, path: &Path, id: CallId) {
        remove_at(&mut self.root, path.segments(), id);
    }

    /// The node at `path`, calling `on_ancestor` with the ids of every node on the way (the
    /// node itself included).
    fn walk(&self, path: &Path, mut on_ancestor: impl FnMut(&Ids) -> bool) -> Option<&Node> {
        let mut node = &self.root;
        for seg in path.segments() {
            node = node.children.get(seg)?;
            if let Some(ids) = &node.ids
                && on_ancestor(ids)
            {
                return None;
            }
        }
        Some(node)
    }

    /// True if some call other than `except` is registered at a path overlapping `path`.
    /// Stops at the first match.
    pub fn any_overlapping_except(&self, path: &Path, except: CallId) -> bool {
        let mut found = false;
        let Some(node) = self.walk(path, |ids| {
            found = ids.has_other_than(except);
            found
        }) else {
            return found;
        };
        let own = node.ids.as_ref().map_or(0, Ids::len);
        if node.count == own {
            return false;
        }
        // Below `path`: any registration that is not `except`. Subtrees holding only `except`
        // are small (one call registers few paths), so this stops early.
        let mut found = false;
        visit_below(node, |ids| {
            found = ids.has_other_than(except);
            found
        });
        found
    }

    /// Calls every call registered at a path overlapping `path` (a call may be reported more
    /// than once when several of its paths overlap).
    pub fn for_each_overlapping(&self, path: &Path, mut f: impl FnMut(CallId)) {
        let Some(node) = self.walk(path, |ids| {
            ids.iter().for_each(&mut f);
            false
        }) else {
            return;
        };
        visit_below(node, |ids| {
            ids.iter().for_each(&mut f);
            false
        });
    }

    /// The calls registered at paths overlapping `path`, sorted and without duplicates.
    pub fn overlapping(&self, path: &Path) -> BTreeSet<CallId> {
        let mut out = BTreeSet::new();
        self.for_each_overlapping(path, |id| {
            out.insert(id);
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Path {
        Path::parse(s).expect("path")
    }

    #[test]
    fn overlap_finds_prefixes_equals_and_extensions_only() {
        let mut ix = PathIndex::new();
        ix.insert(&p("state"), CallId(1));
        ix.insert(&p("state.a"), CallId(2));
        ix.insert(&p("state.a.b"), CallId(3));
        ix.insert(&p("state.a.b.c"), CallId(4));
        ix.insert(&p("state.ab"), CallId(5));
        ix.insert(&p("state.a.x"), CallId(6));
        ix.insert(&p("input.a.b"), CallId(7));
        let got: Vec<u64> = ix
            .overlapping(&p("state.a.b"))
            .iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(got, vec![1, 2, 3, 4]);
        assert!(ix.any_overlapping_except(&p("state.a.b"), CallId(3)));
        let mut solo = PathIndex::new();
        solo.insert(&p("state.a.b"), CallId(3));
        assert!(!solo.any_overlapping_except(&p("state.a"), CallId(3)));
        assert!(solo.any_overlapping_except(&p("state.a"), CallId(9)));
        assert!(!solo.any_overlapping_except(&p("state.a.c"), CallId(9)));
    }

    #[test]
    fn many_ids_per_path_shrink_back_and_disappear() {
        let mut ix = PathIndex::new();
        for i in 0..4 {
            ix.insert(&p("state.x"), CallId(i));
        }
        ix.insert(&p("state.x"), CallId(2));
        assert_eq!(ix.overlapping(&p("state.x")).len(), 4);
        for i in [0, 1, 3] {
            ix.remove(&p("state.x"), CallId(i));
        }
        assert!(!ix.any_overlapping_except(&p("state.x"), CallId(2)));
        assert!(ix.any_overlapping_except(&p("state.x"), CallId(0)));
        ix.remove(&p("state.x"), CallId(2));
        assert!(ix.is_empty());
        ix.remove(&p("state.x"), CallId(2));
        assert!(ix.is_empty());
    }
}
