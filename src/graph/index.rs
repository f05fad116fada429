//! A path index: which calls touch which paths, with overlap lookups (rule 4) that visit only the
//! matching entries — the ancestors of a path by exact lookup and its extensions by one range
//! scan — so finding the writers or readers of a path never scans all calls.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

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

/// Calls by path, answering "who overlaps this path" without scanning.
#[derive(Debug, Clone, Default)]
pub struct PathIndex {
    map: BTreeMap<Path, Ids>,
}

impl PathIndex {
    /// An empty index.
    pub fn new() -> Self {
        PathIndex::default()
    }

    /// Number of distinct paths registered.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Registers `id` at `path`.
    pub fn insert(&mut self, path: &Path, id: CallId) {
        match self.map.get_mut(path.segments()) {
            None => {
                self.map.insert(path.clone(), Ids::One(id));
            }
            Some(Ids::One(old)) if *old == id => {}
            Some(entry @ Ids::One(_)) => {
                let Ids::One(old) = *entry else { return };
                *entry = Ids::Many(BTreeSet::from([old, id]));
            }
            Some(Ids::Many(set)) => {
                set.insert(id);
            }
        }
    }

    /// Unregisters `id` from `path` (no-op when absent).
    pub fn remove(&mut self, path: &Path, id: CallId) {
        let empty = match self.map.get_mut(path.segments()) {
            None => return,
            Some(Ids::One(old)) => *old == id,
            Some(entry @ Ids::Many(_)) => {
                let Ids::Many(set) = entry else { return };
                set.remove(&id);
                match set.len() {
                    0 => true,
                    1 => {
                        if let Some(last) = set.first().copied() {
                            *entry = Ids::One(last);
                        }
                        false
                    }
                    _ => false,
                }
            }
        };
        if empty {
            self.map.remove(path.segments());
        }
    }

    fn extensions<'a>(
        &'a self,
        segs: &'a [Segment],
    ) -> impl Iterator<Item = (&'a Path, &'a Ids)> + 'a {
        self.map
            .range::<[Segment], _>((Bound::Excluded(segs), Bound::Unbounded))
            .take_while(move |(k, _)| k.segments().starts_with(segs))
    }

    /// True if some call other than `except` is registered at a path overlapping `path`.
    /// Stops at the first match.
    pub fn any_overlapping_except(&self, path: &Path, except: CallId) -> bool {
        let segs = path.segments();
        for n in 1..=segs.len() {
            if let Some(ids) = self.map.get(&segs[..n])
                && ids.has_other_than(except)
            {
                return true;
            }
        }
        self.extensions(segs)
            .any(|(_, ids)| ids.has_other_than(except))
    }

    /// Calls every call registered at a path overlapping `path` (a call may be reported more
    /// than once when several of its paths overlap).
    pub fn for_each_overlapping(&self, path: &Path, mut f: impl FnMut(CallId)) {
        let segs = path.segments();
        for n in 1..=segs.len() {
            if let Some(ids) = self.map.get(&segs[..n]) {
                ids.iter().for_each(&mut f);
            }
        }
        for (_, ids) in self.extensions(segs) {
            ids.iter().for_each(&mut f);
        }
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
