//! A run's path table: every concrete path the graph has seen gets an integer id once, with its
//! parent's id, so the path indexes compare and walk integers instead of hashing and comparing
//! segment strings on every lookup, and register a path without copying it.
//!
//! The table only grows (ids stay valid for the table's life) and is a trie: interning a path
//! walks it one segment at a time from the root, and is the only operation that hashes a segment.
//! Each id also keeps its path's rendered text ([`PathText`]) once an event first names it, so
//! every later event naming the path shares that text instead of rendering it again.
//! Deliberately not here: who reads or writes a path (that is `index::PathIndex`), or any value.

use std::collections::HashMap;

use crate::fxhash::FxBuildHasher;
use crate::protocol::{Path, PathText, Segment};

/// A path's id in its [`PathTable`]. Ids are dense from 1 (0 is the empty path above every
/// kind, which is never registered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathId(u32);

impl PathId {
    /// The empty path above every kind (the trie's root).
    pub const ROOT: PathId = PathId(0);

    /// The id as an index into per-path vectors.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Debug, Clone, Default)]
struct Node {
    parent: u32,
    depth: u32,
    /// The array index when this node's segment is one (`[i]`), for the padding rule.
    index: Option<usize>,
    /// The nodes one segment further down. Only interning reads it.
    children: HashMap<Segment, u32, FxBuildHasher>,
    /// The path's text, rendered the first time it was asked for ([`PathTable::text`]).
    text: Option<PathText>,
}

/// Interned paths, as a trie of ids.
#[derive(Debug, Clone)]
pub struct PathTable {
    nodes: Vec<Node>,
}

impl Default for PathTable {
    fn default() -> Self {
        PathTable {
            nodes: vec![Node::default()],
        }
    }
}

impl PathTable {
    /// A table holding only the root.
    pub fn new() -> Self {
        PathTable::default()
    }

    /// Number of ids, the root included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: the root is always there.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The id of `path`, made when it is new (and for each new prefix on the way).
    pub fn intern(&mut self, path: &Path) -> PathId {
        let mut at = 0u32;
        for seg in path.segments() {
            at = match self.nodes[at as usize].children.get(seg) {
                Some(&c) => c,
                None => {
                    // Ids fit u32: a run that interned four billion paths ran out of memory first.
                    let c = u32::try_from(self.nodes.len()).unwrap_or(u32::MAX);
                    let depth = self.nodes[at as usize].depth + 1;
                    let index = match seg {
                        Segment::Index(i) => Some(*i),
                        Segment::Key(_) => None,
                    };
                    self.nodes.push(Node {
                        parent: at,
                        depth,
                        index,
                        children: HashMap::default(),
                        text: None,
                    });
                    self.nodes[at as usize].children.insert(seg.clone(), c);
                    c
                }
            };
        }
        PathId(at)
    }

    /// The deepest interned prefix of `path` (the root when none is) and whether it is `path`
    /// itself. Changes nothing.
    pub fn locate(&self, path: &Path) -> (PathId, bool) {
        let mut at = 0u32;
        for seg in path.segments() {
            match self.nodes[at as usize].children.get(seg) {
                Some(&c) => at = c,
                None => return (PathId(at), false),
            }
        }
        (PathId(at), true)
    }

    /// The text of `path`, whose id is `id` ([`PathTable::intern`]): rendered the first time it
    /// is asked for and kept, so every later call shares it (a reference count, no copy). An id
    /// the table does not hold gives a fresh rendering, kept nowhere.
    pub fn text(&mut self, id: PathId, path: &Path) -> PathText {
        match self.nodes.get_mut(id.index()) {
            Some(node) => node.text.get_or_insert_with(|| PathText::from(path)).clone(),
            None => PathText::from(path),
        }
    }

    /// The parent of `id` (None for the root).
    pub fn parent(&self, id: PathId) -> Option<PathId> {
        (id.0 != 0).then(|| PathId(self.nodes[id.index()].parent))
    }

    /// Number of segments of the path `id` stands for.
    pub fn depth(&self, id: PathId) -> usize {
        self.nodes[id.index()].depth as usize
    }

    /// The array index `id`'s last segment stands for, if it is an index.
    pub fn index_of(&self, id: PathId) -> Option<usize> {
        self.nodes[id.index()].index
    }

    /// True if `a` equals `b` or is an ancestor of it.
    pub fn is_prefix_of(&self, a: PathId, b: PathId) -> bool {
        let (da, mut b, mut db) = (self.depth(a), b, self.depth(b));
        while db > da {
            b = PathId(self.nodes[b.index()].parent);
            db -= 1;
        }
        a == b
    }

    /// Rule 4 on ids: one is a prefix of (or equal to) the other.
    pub fn overlaps(&self, a: PathId, b: PathId) -> bool {
        self.is_prefix_of(a, b) || self.is_prefix_of(b, a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Path {
        Path::parse(s).expect("path")
    }

    #[test]
    fn ids_are_stable_and_follow_prefixes() {
        let mut t = PathTable::new();
        let ab = t.intern(&p("state.a.b"));
        let a = t.intern(&p("state.a"));
        assert_eq!(t.intern(&p("state.a.b")), ab);
        assert_eq!(t.parent(ab), Some(a));
        assert_eq!(t.depth(ab), 3);
        let ax = t.intern(&p("state.a[0]"));
        assert!(t.overlaps(a, ab) && t.overlaps(ab, a));
        assert!(!t.overlaps(ab, ax));
        assert_eq!(t.locate(&p("state.a.b")), (ab, true));
        assert_eq!(t.locate(&p("state.a.c.d")), (a, false));
        assert_eq!(t.locate(&p("input.x")), (PathId::ROOT, false));
        assert_eq!(t.parent(PathId::ROOT), None);
    }

    #[test]
    fn a_path_is_rendered_once_and_shared() {
        let mut t = PathTable::new();
        let (ab, ax) = (p("state.a.b"), p("state.a[0]"));
        let (i, j) = (t.intern(&ab), t.intern(&ax));
        let first = t.text(i, &ab);
        assert_eq!(first, "state.a.b");
        assert!(t.text(i, &ab).shares(&first));
        assert_eq!(t.text(j, &ax), "state.a[0]");
        assert!(!t.text(j, &ax).shares(&first));
    }
}
