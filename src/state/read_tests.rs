//! Property tests of the state's read path: `has`/`has_id` (which answer without building the
//! value where they can) and `eval_ids` (which reads each reference path once) against the
//! straightforward reading — build the value with `get` and test it; evaluate with
//! `writable = others_write || (open && !has)` — on generated logs and paths.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::{Eval, State};
use crate::protocol::{CallId, OutputMethod, Path, parse_expression};

/// Paths over two keys and two indexes, one to three segments below `state`.
fn path() -> impl Strategy<Value = String> {
    let seg = prop_oneof![
        Just(".a".to_string()),
        Just(".b".to_string()),
        Just("[0]".to_string()),
        Just("[1]".to_string()),
    ];
    proptest::collection::vec(seg, 0..3).prop_map(|segs| {
        // A first segment is a key: `state[0]` is not a reference.
        let mut p = String::from("state.a");
        for s in segs {
            p.push_str(&s);
        }
        p
    })
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        Just(json!(1)),
        Just(json!({"a": 1})),
        Just(json!({"b": {"a": 2}, "a": [7]})),
        Just(json!([1, 2])),
        Just(json!([{"a": 3}, [4]])),
    ]
}

fn method() -> impl Strategy<Value = OutputMethod> {
    prop_oneof![
        Just(OutputMethod::Set),
        Just(OutputMethod::Merge),
        Just(OutputMethod::Assign),
        Just(OutputMethod::Push),
        Just(OutputMethod::Concat),
    ]
}

fn parse(p: &str) -> Path {
    Path::parse(p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// A state from generated writes (each by call `i`, so writers can be compared).
fn state_of(writes: &[(String, OutputMethod, Value)]) -> State {
    let mut state = State::new();
    for (i, (p, m, v)) in writes.iter().enumerate() {
        state.write(parse(p), v.clone(), *m, Some(CallId(i as u64)), 0);
    }
    state
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn has_answers_as_building_the_value_does(
        writes in proptest::collection::vec((path(), method(), value()), 0..8),
        reads in proptest::collection::vec(path(), 1..6),
    ) {
        let mut state = state_of(&writes);
        for r in &reads {
            let p = parse(r);
            // Before the read path is interned (located through its deepest interned prefix).
            let built = state.get(&p);
            prop_assert_eq!(state.has(&p), built.is_some(), "has {} on {:?}", r, writes);
            let id = state.intern(&p);
            prop_assert_eq!(state.get(&p), built.clone(), "get {} after interning", r);
            prop_assert_eq!(state.has_id(id, &p), built.is_some(), "has_id {}", r);
            prop_assert_eq!(state.has(&p), built.is_some(), "has {} after interning", r);
        }
    }

    #[test]
    fn eval_ids_reads_once_with_the_same_outcome(
        writes in proptest::collection::vec((path(), method(), value()), 0..8),
        refs in proptest::collection::vec((path(), any::<bool>(), any::<bool>()), 1..4),
        op in 0..3usize,
        open in any::<bool>(),
    ) {
        let mut state = state_of(&writes);
        let joint = [" || ", " && ", " || "][op];
        let texts: Vec<String> = refs
            .iter()
            .map(|(p, query, _)| format!("†{p}{}", if *query { "[*]" } else { "" }))
            .collect();
        let text = if op == 2 { texts[0].clone() } else { texts.join(joint) };
        let expr = parse_expression(&text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .unwrap_or_else(|| panic!("{text}: not a reference"));
        let ids: Vec<_> = expr.refs.iter().map(|r| state.intern(&r.path)).collect();
        let others: Vec<Path> = refs
            .iter()
            .filter(|(_, _, w)| *w)
            .map(|(p, _, _)| parse(p))
            .collect();
        let others_write = |_: Option<crate::graph::PathId>, p: &Path| others.contains(p);
        let mut once_writers = Vec::new();
        let once = state.eval_ids(&expr, &ids, &others_write, open, &mut once_writers);
        let writable = |p: &Path| others.contains(p) || (open && state.get(p).is_none());
        let mut ref_writers = Vec::new();
        let reference = state.eval_from(&expr, &writable, &mut ref_writers);
        prop_assert_eq!(&once, &reference, "{} open={} on {:?}", text, open, writes);
        if let Ok(Eval::Ready(_)) = once {
            prop_assert_eq!(once_writers, ref_writers);
        }
    }
}
