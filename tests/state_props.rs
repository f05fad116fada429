//! Property test: the indexed resolver agrees with a straightforward replay of the whole log.

use dagloop::protocol::{OutputMethod, Path, Segment};
use dagloop::state::{State, apply};
use proptest::prelude::*;
use serde_json::{Value, json};

fn seg() -> impl Strategy<Value = Segment> {
    prop_oneof![
        Just(Segment::Key("a".into())),
        Just(Segment::Key("b".into())),
        Just(Segment::Index(0)),
        Just(Segment::Index(1)),
        Just(Segment::Index(2)),
    ]
}

fn path() -> impl Strategy<Value = Path> {
    (
        prop_oneof![Just("state"), Just("input")],
        prop::collection::vec(seg(), 0..4),
    )
        .prop_map(|(k, rest)| Path::new(k, rest))
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<i8>().prop_map(|n| json!(n)),
        "[a-c]{0,2}".prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![Just("a".to_string()), Just("b".to_string())],
                inner,
                0..3
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn method() -> impl Strategy<Value = OutputMethod> {
    prop::sample::select(OutputMethod::ALL.to_vec())
}

/// Reference implementation: replay every write, in order, into one document per kind.
fn replay(writes: &[(Path, OutputMethod, Value)], read: &Path) -> Option<Value> {
    let mut doc: Option<Value> = None;
    for (p, m, v) in writes.iter().filter(|(p, _, _)| p.kind() == read.kind()) {
        apply::apply_at(&mut doc, p.rest(), *m, v);
    }
    doc.and_then(|d| apply::get(&d, read.rest()).cloned())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn indexed_resolution_equals_replay(
        writes in prop::collection::vec((path(), method(), value()), 0..24),
        reads in prop::collection::vec(path(), 1..12),
    ) {
        let mut state = State::new();
        for (i, (p, m, v)) in writes.iter().enumerate() {
            state.write(p.clone(), v.clone(), *m, None, i as u64);
        }
        for r in &reads {
            let expected = replay(&writes, r);
            prop_assert_eq!(state.has(r), expected.is_some(), "has {}", r);
            prop_assert_eq!(state.get(r), expected, "reading {}", r);
        }
    }

    #[test]
    fn views_kept_up_to_date_equal_replay(
        writes in prop::collection::vec((path(), method(), value(), any::<bool>()), 0..32),
    ) {
        // `view` keeps each kind's merged value and applies only newer writes: viewed after
        // any write, and cloned midway, it equals a replay of the log so far.
        let mut state = State::new();
        let mut so_far = Vec::new();
        for (i, (p, m, v, look)) in writes.iter().enumerate() {
            state.write(p.clone(), v.clone(), *m, None, i as u64);
            so_far.push((p.clone(), *m, v.clone()));
            if *look {
                for kind in ["state", "input"] {
                    let root = Path::root(kind);
                    prop_assert_eq!(state.view(kind), replay(&so_far, &root), "after write {}", i);
                }
                let copy = state.clone();
                prop_assert_eq!(copy.view("state"), replay(&so_far, &Path::root("state")));
            }
        }
        prop_assert_eq!(state.view("state"), state.get(&Path::root("state")));
    }
}
