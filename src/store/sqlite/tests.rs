//! The SQLite store's own tests: upgrades, leases, batching and damage.

use super::*;
use crate::protocol::{CallId, Decision};
use crate::scheduler::Outcome;
use serde_json::json;

fn entry(seq: u64, at: u64) -> JournalEntry {
    let input = match seq % 3 {
        0 => RunInput::Outcome {
            call: CallId(seq),
            outcome: Outcome::ok(json!({"text": "two\nlines", "n": seq})),
        },
        1 => RunInput::Decided {
            call: CallId(seq),
            decision: Decision::Reject {
                reason: "no\n".into(),
            },
            by: None,
            presentation: None,
        },
        _ => RunInput::Start,
    };
    JournalEntry { seq, at, input }
}

fn record(id: &str) -> RunRecord {
    RunRecord {
        id: id.into(),
        created_at: 1,
        goal: json!({}),
        base_dir: ".".into(),
        options: json!({}),
    }
}

/// A store in `dir` holding a run `r`.
fn with_run(dir: &Path) -> (PathBuf, SqliteStore) {
    let path = dir.join("s.db");
    let store = SqliteStore::open(&path).expect("open");
    store.create(&record("r")).expect("create");
    (path, store)
}

#[tokio::test]
async fn a_request_that_fails_in_a_batch_leaves_nothing_and_undoes_no_other() {
    let dir = tempfile::tempdir().expect("dir");
    let (path, store) = with_run(dir.path());
    store.append("r", &[entry(1, 5)]).await.expect("append");
    let rows = |es: &[JournalEntry]| Rows::of(es).expect("rows");
    let none: fn() -> Reply = || Box::new(|_| {});
    let batch = vec![
        // Its second row repeats sequence number 1: it fails after its first row.
        (
            Write::Append("r".into(), rows(&[entry(2, 6), entry(1, 7)])),
            none(),
        ),
        (Write::Append("r".into(), rows(&[entry(2, 8)])), none()),
    ];
    let mut c = connect(&path, OpenFlags::SQLITE_OPEN_READ_WRITE).expect("connect");
    let me = Me {
        owner: store.owner.clone(),
        lease_ms: 1000,
        process: None,
    };
    let out = commit(&mut c, &batch, &path, &me).expect("commit");
    assert!(
        out[0].is_err() && out[1].is_ok(),
        "{:?}",
        out.iter().map(Result::is_ok).collect::<Vec<_>>()
    );
    let stored = store.load("r").expect("load");
    assert_eq!(stored.journal, vec![entry(1, 5), entry(2, 8)]);
    assert_eq!(store.list().expect("list")[0].entries, 2);
}

#[tokio::test]
async fn one_owner_at_a_time_and_an_owner_that_lost_the_lease_writes_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let (path, a) = with_run(dir.path());
    let b = SqliteStore::open(&path).expect("open");
    assert_ne!(a.owner(), b.owner());
    let code = |r: Result<(), StoreError>| r.map_err(|e| e.code());
    assert_eq!(code(b.claim("r")), Err("store.busy"));
    assert_eq!(code(a.claim("r")), Ok(()), "the owner claims again");
    assert_eq!(code(b.claim("nope")), Err("store.unknown_run"));
    assert_eq!(
        a.load("r").expect("load").lease.map(|l| l.owner),
        Some(a.owner().to_string())
    );
    a.append("r", &[entry(1, 5)]).await.expect("append");
    // The lease runs out (its owner stopped renewing): the next claim takes it.
    let c = Connection::open(&path).expect("sql");
    c.execute("UPDATE runs SET lease_expires_at = 1 WHERE id = 'r'", [])
        .expect("expire");
    assert!(a.load("r").expect("load").lease.is_none());
    assert_eq!(a.list().expect("list")[0].status, "stopped");
    assert_eq!(code(b.claim("r")), Ok(()));
    assert_eq!(b.list().expect("list")[0].owner.as_deref(), Some(b.owner()));
    // The old owner can neither append, renew nor finish; nothing it tried was written.
    let e = a
        .append("r", &[entry(2, 6), entry(3, 6)])
        .await
        .expect_err("refused");
    assert_eq!(e.code(), crate::engine::JournalError::LEASE_LOST);
    let e = a.renew_lease("r").await.expect_err("refused");
    assert_eq!(e.code(), crate::engine::JournalError::LEASE_LOST);
    let done = RunResult {
        status: crate::machine::RunStatus::Cancelled,
        output: json!(null),
        state: json!(null),
        steps: 0,
        usage: Default::default(),
        calls: Vec::new(),
        error: None,
    };
    assert_eq!(code(a.finish("r", &done)), Err("store.lease_lost"));
    assert_eq!(
        code(a.release("r")),
        Ok(()),
        "releasing what it does not hold changes nothing"
    );
    // Decisions queued for the run go to the owner that drives it, not to the old one.
    let op = Op::Cancel {
        reason: "stop".into(),
        by: None,
    };
    assert_eq!(
        a.push_op("r", &op, 1).expect("push"),
        crate::store::Queued::Queued
    );
    assert_eq!(
        a.take_ops("r").map_err(|e| e.code()),
        Err("store.lease_lost")
    );
    assert_eq!(b.take_ops("r").expect("take"), vec![op]);
    let stored = b.load("r").expect("load");
    assert_eq!(stored.journal, vec![entry(1, 5)]);
    assert_eq!(stored.lease.map(|l| l.owner), Some(b.owner().to_string()));
    assert_eq!(b.list().expect("list")[0].entries, 1);
    // The new owner goes on from there, then finishes and lets go.
    b.append("r", &[entry(2, 6)]).await.expect("append");
    // A request that fails part-way leaves nothing behind (its savepoint is rolled back).
    b.append("r", &[entry(3, 7), entry(2, 8)])
        .await
        .expect_err("a duplicate sequence number");
    assert_eq!(b.list().expect("list")[0].entries, 2);
    assert_eq!(b.load("r").expect("load").journal.len(), 2);
    b.renew_lease("r").await.expect("renew");
    b.finish("r", &done).expect("finish");
    let stored = b.load("r").expect("load");
    assert!(stored.lease.is_none() && stored.result.is_some());
    assert_eq!(stored.journal.len(), 2);
}

#[tokio::test]
async fn a_batch_is_one_row_per_run_of_equal_times_and_loads_back_exactly() {
    let dir = tempfile::tempdir().expect("dir");
    let (path, store) = with_run(dir.path());
    // Times 5,5,5,6,6,5 then a second batch at 6: rows [1-3], [4-5], [6], [7-9].
    let first: Vec<_> = [5, 5, 5, 6, 6, 5]
        .iter()
        .enumerate()
        .map(|(i, at)| entry(i as u64 + 1, *at))
        .collect();
    let second: Vec<_> = (7..=9).map(|s| entry(s, 6)).collect();
    store.append("r", &first).await.expect("append");
    store.append("r", &second).await.expect("append");
    let loaded = store.load("r").expect("load");
    let all: Vec<_> = first.into_iter().chain(second).collect();
    assert_eq!(loaded.journal, all);
    let c = Connection::open(&path).expect("sql");
    let rows: Vec<(i64, i64, i64)> = c
        .prepare("SELECT seq, n, at FROM journal WHERE run_id = 'r' ORDER BY seq")
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(rows, vec![(1, 3, 5), (4, 2, 6), (6, 1, 5), (7, 3, 6)]);
    assert_eq!(store.list().expect("list")[0].entries, 9);
}

#[tokio::test]
async fn the_writer_checkpoints_the_wal_into_the_database_file() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("s.db");
    let store = SqliteStore::open_with(&path, 8).expect("open");
    store.create(&record("r")).expect("create");
    // Open beside the store, this connection keeps SQLite from checkpointing when the
    // store's connections close: only the store's own checkpoints can grow the file.
    let c = Connection::open(&path).expect("sql");
    let _: i64 = c
        .query_row("SELECT count(*) FROM runs", [], |r| r.get(0))
        .expect("read");
    let before = std::fs::metadata(&path).expect("size").len();
    let big = "x".repeat(1000);
    for b in 0..60u64 {
        let entries: Vec<_> = (1..=10)
            .map(|i| JournalEntry {
                seq: b * 10 + i,
                at: b,
                input: RunInput::Cancel {
                    reason: big.clone(),
                    by: None,
                },
            })
            .collect();
        store.append("r", &entries).await.expect("append");
    }
    // Waits for the writer and any checkpoint under way.
    store.close();
    let after = std::fs::metadata(&path).expect("size").len();
    // About 600 KB went through the WAL; without checkpoints the file would not have grown.
    assert!(after >= before + 256 * 1024, "{before} -> {after}");
    assert_eq!(
        store.prune(0).map_err(|e| e.code()),
        Err("store.io"),
        "a closed store refuses"
    );
    let n: i64 = c
        .query_row("SELECT sum(n) FROM journal WHERE run_id = 'r'", [], |r| {
            r.get(0)
        })
        .expect("count");
    assert_eq!(n, 600, "no entry lost");
}

#[test]
fn a_row_whose_count_disagrees_with_its_lines_is_damage_not_a_shorter_journal() {
    let dir = tempfile::tempdir().expect("dir");
    let (path, store) = with_run(dir.path());
    let c = Connection::open(&path).expect("sql");
    c.execute(
        "INSERT INTO journal (run_id, seq, n, at, inputs) VALUES ('r', 1, 2, 0, '{\"input\":\"start\"}')",
        [],
    )
    .expect("insert");
    let e = store.load("r").expect_err("refused");
    assert_eq!(e.code(), "store.corrupt", "{e}");
}

#[tokio::test]
async fn the_queue_takes_one_decision_per_presentation_against_the_journal_it_was_checked_against()
{
    use crate::store::Queued;
    let dir = tempfile::tempdir().expect("dir");
    let (path, a) = with_run(dir.path());
    a.append("r", &[entry(1, 5)]).await.expect("append");
    let b = SqliteStore::open(&path).expect("open");
    let decide = |who: &str, presentation: u64| Op::Decide {
        call: CallId(4),
        decision: Decision::Approve,
        presented: None,
        presentation: Some(presentation),
        by: Some(crate::protocol::Actor::new(
            who,
            crate::protocol::Actor::CLI,
        )),
    };
    // Checked against a journal that has grown since: not queued.
    assert_eq!(
        b.push_op("r", &decide("bob", 7), 0).expect("push"),
        Queued::Moved { now: 1 }
    );
    assert_eq!(
        b.push_op("r", &decide("bob", 7), 1).expect("push"),
        Queued::Queued
    );
    // A second decision about the same presentation names the first, whoever records it.
    assert_eq!(
        a.push_op("r", &decide("carol", 7), 1).expect("push"),
        Queued::Decided {
            winner: decide("bob", 7)
        }
    );
    // The driver's own decision for it is refused; the queued one itself holds it.
    assert_eq!(
        a.claim_decision("r", 7, &decide("alice", 7), false)
            .await
            .expect("claim"),
        Some(decide("bob", 7))
    );
    // The same decision, not from the queue, came second all the same.
    assert_eq!(
        a.claim_decision("r", 7, &decide("bob", 7), false)
            .await
            .expect("claim"),
        Some(decide("bob", 7))
    );
    assert_eq!(
        a.take_ops("r").expect("take"),
        vec![decide("bob", 7)],
        "taken, and held until journaled"
    );
    assert_eq!(
        a.claim_decision("r", 7, &decide("bob", 7), true)
            .await
            .expect("claim"),
        None
    );
    assert!(a.take_ops("r").expect("take").is_empty());
    assert_eq!(
        b.push_op("r", &decide("carol", 7), 1).expect("push"),
        Queued::Decided {
            winner: decide("bob", 7)
        }
    );
    // A driver that took it and never journaled it (it died): the next owner takes it again.
    Connection::open(&path)
        .expect("sql")
        .execute("UPDATE runs SET lease_expires_at = 1 WHERE id = 'r'", [])
        .expect("expire");
    b.claim("r").expect("claim");
    assert_eq!(b.take_ops("r").expect("take"), vec![decide("bob", 7)]);
    // Journaled (applied or dropped), it leaves the queue in the same transaction.
    let decided = JournalEntry {
        seq: 2,
        at: 6,
        input: RunInput::Dropped {
            call: CallId(4),
            decision: Decision::Approve,
            by: None,
            presentation: Some(7),
            code: "op.stale_presentation".into(),
        },
    };
    b.append("r", &[decided]).await.expect("append");
    assert!(b.take_ops("r").expect("take").is_empty());
    assert_eq!(
        a.push_op("r", &decide("carol", 7), 2).expect("push"),
        Queued::Queued,
        "from now on the journal answers for that presentation (a recorder's check)"
    );
}
