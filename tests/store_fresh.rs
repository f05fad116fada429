//! A fresh store opened by many at once (spec: a user never sees "database is locked"), and a
//! `dagloop run` whose goal is refused never touches the store.
//!
//! CI once saw `store.io` "database is locked" from `dagloop run` of an invalid goal while
//! other tests of the same binary created the same new store: the first open's journal-mode
//! switch and migration met another process's, and SQLite's busy handler does not cover every
//! path of those.

#[path = "common/bin.rs"]
mod bin;

use std::sync::{Arc, Barrier};

use dagloop::store::SqliteStore;

/// Many threads, each with connections of its own, open one store file that does not exist
/// yet, all at the same instant; round after round on a new file. Every open succeeds.
#[test]
fn many_opens_of_one_new_store_at_once_never_find_it_locked() {
    const OPENERS: usize = 16;
    let rounds: usize = std::env::var("DAGLOOP_FRESH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    let dir = tempfile::tempdir().expect("tempdir");
    for round in 0..rounds {
        let path = dir.path().join(format!("runs-{round}.db"));
        let barrier = Arc::new(Barrier::new(OPENERS));
        let openers: Vec<_> = (0..OPENERS)
            .map(|_| {
                let (path, barrier) = (path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    SqliteStore::open(&path)
                        .map(drop)
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        for o in openers {
            let opened = o.join().expect("the opener does not panic");
            assert_eq!(opened, Ok(()), "round {round}");
        }
    }
}

/// A goal `dagloop run` refuses is refused before the store is opened: the store's file (and
/// its folder) are never created.
#[test]
fn a_refused_goal_never_touches_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("never").join("runs.db");
    let out = bin::dagloop()
        .args(["run", "negative_timeout.goal.json", "--json", "--store"])
        .arg(&store)
        .current_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/e2e/hostile"
        ))
        .output()
        .expect("start dagloop");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(out.status.code(), Some(2), "{v:#}");
    assert_eq!(v["error"]["code"], "goal.invalid", "{v:#}");
    assert!(
        !store.parent().expect("folder").exists(),
        "the store was touched"
    );
}
