//! A path index: which calls touch which paths, with overlap lookups (rule 4) that visit only the
//! matching entries. Paths are ids of the run's [`PathTable`] (a trie): the ancestors of a path
//! are its parent chain, its extensions the subtree below it, and each id counts the
//! registrations in its subtree and lists its children that have any, so finding the writers or
//! readers of a path never scans all calls, hashes nothing and allocates nothing per lookup.

use std::collections::BTreeSet;

use smallvec::SmallVec;

use super::paths::{PathId, PathTable};
use crate::protocol::CallId;
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

/// What one index keeps for one path id.
#[derive(Debug, Clone, Default)]
struct Slot {
    ids: Option<Ids>,
    /// Registrations at this path and below.
    count: u32,
    /// The children (path ids one segment further down) with registrations below them, in no
    /// particular order (callers collect into sorted sets or only ask whether one exists).
    live: Vec<PathId>,
    /// Where this path sits in its parent's `live`, while it is there.
    pos: u32,
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

/// Calls by path id, answering "who overlaps this path" without scanning: the ancestors of a
/// path are its parent chain in the [`PathTable`], its extensions the live subtree below it.
/// Every method takes the table the ids came from.
#[derive(Debug, Clone, Default)]
pub struct PathIndex {
    slots: Vec<Slot>,
}

impl PathIndex {
    /// An empty index.
    pub fn new() -> Self {
        PathIndex::default()
    }

    /// Number of registrations (call, path).
    pub fn len(&self) -> usize {
        self.slots.first().map_or(0, |s| s.count as usize)
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn slot(&self, p: PathId) -> Option<&Slot> {
        self.slots.get(p.index())
    }

    /// Registers `id` at `path`.
    pub fn insert(&mut self, table: &PathTable, path: PathId, id: CallId) {
        if self.slots.len() < table.len() {
            self.slots.resize_with(table.len(), Slot::default);
        }
        if !add(&mut self.slots[path.index()].ids, id) {
            return;
        }
        let mut at = path;
        loop {
            let slot = &mut self.slots[at.index()];
            slot.count += 1;
            let first = slot.count == 1;
            let Some(parent) = table.parent(at) else {
                break;
            };
            if first {
                let live = &mut self.slots[parent.index()].live;
                let pos = live.len() as u32;
                live.push(at);
                self.slots[at.index()].pos = pos;
            }
            at = parent;
        }
    }

    /// Unregisters `id` from `path` (no-op when absent).
    pub fn remove(&mut self, table: &PathTable, path: PathId, id: CallId) {
        let Some(slot) = self.slots.get_mut(path.index()) else {
            return;
        };
        if !take(&mut slot.ids, id) {
            return;
        }
        let mut at = path;
        loop {
            let slot = &mut self.slots[at.index()];
            slot.count -= 1;
            let (gone, pos) = (slot.count == 0, slot.pos as usize);
            let Some(parent) = table.parent(at) else {
                break;
            };
            if gone {
                let live = &mut self.slots[parent.index()].live;
                live.swap_remove(pos);
                if let Some(&moved) = live.get(pos) {
                    self.slots[moved.index()].pos = pos as u32;
                }
            }
            at = parent;
        }
    }

    /// Calls `f` with the ids registered at `path` and at each of its ancestors; stops when `f`
    /// returns true (and then returns true).
    fn up(&self, table: &PathTable, path: PathId, mut f: impl FnMut(&Ids) -> bool) -> bool {
        let mut at = Some(path);
        while let Some(p) = at {
            if let Some(ids) = self.slot(p).and_then(|s| s.ids.as_ref())
                && f(ids)
            {
                return true;
            }
            at = table.parent(p);
        }
        false
    }

    /// Visits the ids strictly below `path`, depth first, through live children only; stops
    /// when `f` returns true.
    fn below(&self, path: PathId, mut f: impl FnMut(&Ids) -> bool) {
        let Some(slot) = self.slot(path).filter(|s| !s.live.is_empty()) else {
            return;
        };
        // The pending siblings of each level, inline for the depths paths have.
        let mut stack: SmallVec<[&[PathId]; 8]> = SmallVec::new();
        stack.push(&slot.live);
        while let Some(top) = stack.last_mut() {
            let Some((&next, rest)) = top.split_first() else {
                stack.pop();
                continue;
            };
            *top = rest;
            let s = &self.slots[next.index()];
            if let Some(ids) = &s.ids
                && f(ids)
            {
                return;
            }
            if !s.live.is_empty() {
                stack.push(&s.live);
            }
        }
    }

    /// True if some call other than `except` is registered at a path overlapping `path`
    /// (`exact`: `path` is the path asked about; otherwise it is the deepest interned prefix of
    /// a path the table does not hold, which nothing below can extend). Stops at the first match.
    pub fn any_overlapping_except(
        &self,
        table: &PathTable,
        path: PathId,
        exact: bool,
        except: CallId,
    ) -> bool {
        if self.up(table, path, |ids| ids.has_other_than(except)) {
            return true;
        }
        let Some(slot) = self.slot(path).filter(|_| exact) else {
            return false;
        };
        let own = slot.ids.as_ref().map_or(0, Ids::len);
        if slot.count as usize == own {
            return false;
        }
        // Below `path`: any registration that is not `except`. Subtrees holding only `except`
        // are small (one call registers few paths), so this stops early.
        let mut found = false;
        self.below(path, |ids| {
            found = ids.has_other_than(except);
            found
        });
        found
    }

    /// Calls every call registered at a path overlapping `path` (see
    /// [`PathIndex::any_overlapping_except`] for `exact`; a call may be reported more than once
    /// when several of its paths overlap).
    pub fn for_each_overlapping(
        &self,
        table: &PathTable,
        path: PathId,
        exact: bool,
        mut f: impl FnMut(CallId),
    ) {
        self.up(table, path, |ids| {
            ids.iter().for_each(&mut f);
            false
        });
        if exact {
            self.below(path, |ids| {
                ids.iter().for_each(&mut f);
                false
            });
        }
    }

    /// Calls every call registered at a path a write to `path` pads: a write at index `i` of
    /// an array too short for it fills indexes below `i` with `null` (spec/state.md S6), so for
    /// every index segment `[i]` on `path` (or `next`, the index segment right below `path`
    /// when `path` is only the deepest interned prefix of the written path), the registrations
    /// at a sibling `[j]` with `j < i` and below it.
    pub fn for_each_padded(
        &self,
        table: &PathTable,
        path: PathId,
        next: Option<usize>,
        mut f: impl FnMut(CallId),
    ) {
        let mut visit = |parent: PathId, i: usize| {
            let Some(slot) = self.slot(parent) else {
                return;
            };
            for &c in &slot.live {
                if table.index_of(c).is_some_and(|j| j < i) {
                    if let Some(ids) = &self.slots[c.index()].ids {
                        ids.iter().for_each(&mut f);
                    }
                    self.below(c, |ids| {
                        ids.iter().for_each(&mut f);
                        false
                    });
                }
            }
        };
        if let Some(i) = next {
            visit(path, i);
        }
        let mut at = path;
        while let Some(parent) = table.parent(at) {
            if let Some(i) = table.index_of(at) {
                visit(parent, i);
            }
            at = parent;
        }
    }

    /// The calls registered at paths overlapping `path`, sorted and without duplicates.
    pub fn overlapping(&self, table: &PathTable, path: PathId) -> BTreeSet<CallId> {
        let mut out = BTreeSet::new();
        self.for_each_overlapping(table, path, true, |id| {
            out.insert(id);
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::protocol::Path;

    fn p(t: &mut PathTable, s: &str) -> PathId {
        t.intern(&Path::parse(s).expect("path"))
    }

    #[test]
    fn overlap_finds_prefixes_equals_and_extensions_only() {
        let mut t = PathTable::new();
        let mut ix = PathIndex::new();
        for (s, id) in [
            ("state", 1),
            ("state.a", 2),
            ("state.a.b", 3),
            ("state.a.b.c", 4),
            ("state.ab", 5),
            ("state.a.x", 6),
            ("input.a.b", 7),
        ] {
            let at = p(&mut t, s);
            ix.insert(&t, at, CallId(id));
        }
        let ab = p(&mut t, "state.a.b");
        let got: Vec<u64> = ix.overlapping(&t, ab).iter().map(|c| c.0).collect();
        assert_eq!(got, vec![1, 2, 3, 4]);
        assert!(ix.any_overlapping_except(&t, ab, true, CallId(3)));
        let mut solo = PathIndex::new();
        solo.insert(&t, ab, CallId(3));
        let a = p(&mut t, "state.a");
        let ac = p(&mut t, "state.a.c");
        assert!(!solo.any_overlapping_except(&t, a, true, CallId(3)));
        assert!(solo.any_overlapping_except(&t, a, true, CallId(9)));
        assert!(!solo.any_overlapping_except(&t, ac, true, CallId(9)));
        // A path the table does not hold: only its interned prefixes can overlap it.
        assert!(!solo.any_overlapping_except(&t, a, false, CallId(9)));
    }

    #[test]
    fn many_ids_per_path_shrink_back_and_disappear() {
        let mut t = PathTable::new();
        let x = p(&mut t, "state.x");
        let mut ix = PathIndex::new();
        for i in 0..4 {
            ix.insert(&t, x, CallId(i));
        }
        ix.insert(&t, x, CallId(2));
        assert_eq!(ix.overlapping(&t, x).len(), 4);
        for i in [0, 1, 3] {
            ix.remove(&t, x, CallId(i));
        }
        assert!(!ix.any_overlapping_except(&t, x, true, CallId(2)));
        assert!(ix.any_overlapping_except(&t, x, true, CallId(0)));
        ix.remove(&t, x, CallId(2));
        assert!(ix.is_empty());
        ix.remove(&t, x, CallId(2));
        assert!(ix.is_empty());
    }

    #[test]
    fn live_children_follow_removals_in_any_order() {
        let mut t = PathTable::new();
        let ks: Vec<PathId> = (0..50).map(|i| p(&mut t, &format!("state.r.k{i}"))).collect();
        let r = p(&mut t, "state.r");
        let mut ix = PathIndex::new();
        for (i, &k) in ks.iter().enumerate() {
            ix.insert(&t, k, CallId(i as u64));
        }
        for i in (0..50).filter(|i| i % 3 != 1) {
            ix.remove(&t, ks[i], CallId(i as u64));
        }
        let left: Vec<u64> = ix.overlapping(&t, r).iter().map(|c| c.0).collect();
        let want: Vec<u64> = (0..50).filter(|i| i % 3 == 1).collect();
        assert_eq!(left, want);
        assert_eq!(ix.len(), want.len());
    }
}
