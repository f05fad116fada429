use super::*;

fn p(s: &str) -> Path {
    Path::parse(s).expect("path")
}

fn ps(v: &[&str]) -> Vec<Path> {
    v.iter().map(|s| p(s)).collect()
}

fn refs(v: &[Path]) -> Vec<&Path> {
    v.iter().collect()
}

/// Inserts with owned path lists (the graph borrows them).
fn ins(g: &mut CallGraph, id: u64, reads: Vec<Path>, writes: Vec<Path>) -> Result<(), GraphError> {
    g.insert(CallId(id), &refs(&reads), &refs(&writes))
}

#[test]
fn edges_follow_overlaps_and_skip_self() {
    let mut g = CallGraph::new();
    ins(&mut g, 1, vec![], ps(&["state.a"])).expect("a");
    // Reads a prefix of what 1 writes and writes its own input (self-overlap is no edge).
    ins(&mut g, 2, ps(&["state"]), ps(&["state.b"])).expect("b");
    // Reads an extension of what 1 writes.
    ins(&mut g, 3, ps(&["state.a.x"]), ps(&["state.c"])).expect("c");
    assert_eq!(g.producers(CallId(2)), vec![CallId(1), CallId(3)]);
    assert_eq!(g.producers(CallId(3)), vec![CallId(1)]);
    assert_eq!(
        g.live_edge_count(),
        3,
        "1->2, 1->3, 3->2 (state.c is inside state)"
    );
    assert!(g.writable_by_other(&p("state.a.x.y"), CallId(9)));
    assert!(!g.writable_by_other(&p("state.b"), CallId(2)));
    assert!(g.writable_by_other(&p("state.b"), CallId(3)));
}

#[test]
fn a_cycle_is_refused_with_its_members_and_nothing_changes() {
    let mut g = CallGraph::new();
    ins(&mut g, 1, ps(&["state.c"]), ps(&["state.a"])).expect("1");
    ins(&mut g, 2, ps(&["state.a"]), ps(&["state.b"])).expect("2");
    let err = ins(&mut g, 3, ps(&["state.b"]), ps(&["state.c"])).expect_err("cycle");
    assert_eq!(
        err,
        GraphError::Cycle {
            cycle: vec![CallId(3), CallId(1), CallId(2)]
        }
    );
    assert_eq!(err.code(), "graph.cycle");
    assert_eq!(
        err.to_string(),
        "call c3 would close a dependency cycle: c3 -> c1 -> c2 -> c3"
    );
    assert!(!g.contains(CallId(3)));
    assert!(!g.writable_by_other(&p("state.c"), CallId(1)));
    // A two-call cycle through a prefix overlap.
    let err = ins(&mut g, 4, ps(&["state.b.z"]), ps(&["state"])).expect_err("cycle via prefix");
    assert!(
        matches!(err, GraphError::Cycle { ref cycle } if cycle[0] == CallId(4)),
        "{err}"
    );
}

#[test]
fn unblocked_writers_cannot_close_cycles() {
    let mut g = CallGraph::new();
    ins(&mut g, 1, ps(&["state.x"]), ps(&["state.y"])).expect("1");
    g.stop_reading(CallId(1), &ps(&["state.x"]));
    // 2 reads y (written by running 1) and writes x (which 1 no longer reads).
    ins(&mut g, 2, ps(&["state.y"]), ps(&["state.x"])).expect("no cycle");
    assert_eq!(g.producers(CallId(2)), vec![CallId(1)]);
    assert!(!g.is_reading(CallId(1)));
    let mut readers = BTreeSet::new();
    g.readers_of(&p("state.x"), &mut readers);
    assert!(readers.is_empty(), "1's reads were unregistered");
}

#[test]
fn removal_frees_paths_and_compaction_keeps_live_edges() {
    let mut g = CallGraph::new();
    ins(&mut g, 0, vec![], ps(&["state.root"])).expect("root");
    let n = 3000;
    for i in 1..=n {
        ins(
            &mut g,
            i,
            ps(&["state.root"]),
            vec![p(&format!("state.r.k{i}"))],
        )
        .expect("mid");
    }
    ins(&mut g, n + 1, ps(&["state.r"]), ps(&["state.out"])).expect("sink");
    assert_eq!(g.live_edge_count(), 2 * n as usize);
    let root = ps(&["state.root"]);
    let mid = |i: u64| vec![p(&format!("state.r.k{i}"))];
    g.remove(CallId(0), &[], &root);
    for i in 1..n {
        g.stop_reading(CallId(i), &root);
        g.remove(CallId(i), &root, &mid(i));
    }
    assert!(
        g.raw_node_count() < 2 * n as usize,
        "compacted: {}",
        g.raw_node_count()
    );
    assert_eq!(g.producers(CallId(n + 1)), vec![CallId(n)]);
    assert!(g.writable_by_other(&p("state.r"), CallId(n + 1)));
    g.remove(CallId(n), &root, &mid(n));
    assert!(!g.writable_by_other(&p("state.r"), CallId(n + 1)));
    let mut readers = BTreeSet::new();
    g.readers_of(&p("state.r.k1"), &mut readers);
    assert_eq!(readers, BTreeSet::from([CallId(n + 1)]));
    assert_eq!(g.len(), 1);
}

#[test]
fn duplicate_ids_are_refused() {
    let mut g = CallGraph::new();
    ins(&mut g, 1, vec![], vec![]).expect("1");
    assert_eq!(
        ins(&mut g, 1, vec![], vec![]).expect_err("dup").code(),
        "graph.duplicate"
    );
}
