//! The bounded-store rows of `cargo bench --bench server` (issue 25): what a server costs
//! while 10,000 parked runs wait (RSS, threads, CPU over 30 idle seconds), the time to its
//! first answer over a store of 10,000 runs (half waiting), decision-to-finish latency among
//! 10,000 parked runs, and the WAL and database sizes after 20,000 runs submitted over HTTP.
//!
//! How the stored runs are made: 20,000 runs are submitted with `POST /runs`, the path users
//! run. The 10,000 parked (and 5,000 finished) runs are row-for-row copies of one run the
//! server itself parked (and one it finished), journal included, inserted with SQL into a
//! stopped server's store: each copy is a real run (a decision wakes it, replays its journal
//! and finishes it), but it was not driven up to its wait 10,000 times.
//!
//! Deliberately not here: the throughput rows (server.rs).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Server, rss_kib, start_at};

/// `(threads, utime + stime in clock ticks)` of a process, from /proc.
fn threads_and_ticks(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let threads = status
        .lines()
        .find(|l| l.starts_with("Threads:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let tick = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (threads, tick(11) + tick(12))
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

/// RSS, threads and CPU of the server over `secs` idle seconds (after a settling pause).
fn idle(server: &Server, secs: u64) -> (u64, u64, f64) {
    std::thread::sleep(Duration::from_secs(3));
    let pid = server.child.id();
    let (_, t0) = threads_and_ticks(pid);
    std::thread::sleep(Duration::from_secs(secs));
    let (threads, t1) = threads_and_ticks(pid);
    let cpu_ms = (t1.saturating_sub(t0)) as f64 / clk_tck() * 1000.0;
    (rss_kib(pid), threads, cpu_ms)
}

/// Copies run `id` of the store `n` times (new ids, same rows and journal).
fn clone_run(store: &Path, id: &str, n: usize, tag: &str) {
    let c = rusqlite::Connection::open(store).expect("sql");
    let cols: Vec<String> = c
        .prepare("SELECT name FROM pragma_table_info('runs')")
        .expect("cols")
        .query_map([], |r| r.get(0))
        .expect("cols")
        .collect::<Result<_, _>>()
        .expect("cols");
    let new_id = format!("?1 || '-{tag}' || k.n");
    let select: Vec<String> = cols
        .iter()
        .map(|c| match c.as_str() {
            "id" => new_id.clone(),
            "record" => format!("json_set(record, '$.id', {new_id})"),
            "created_at" => "created_at + k.n".into(),
            other => other.to_string(),
        })
        .collect();
    let k = "WITH RECURSIVE k(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM k WHERE n < ?2)";
    let tx = c.unchecked_transaction().expect("tx");
    tx.execute(
        &format!(
            "{k} INSERT INTO runs ({}) SELECT {} FROM runs, k WHERE id = ?1",
            cols.join(", "),
            select.join(", ")
        ),
        rusqlite::params![id, n as i64],
    )
    .expect("runs");
    tx.execute(
        &format!(
            "{k} INSERT INTO journal (run_id, seq, n, at, inputs)
             SELECT {new_id}, seq, journal.n, at, inputs FROM journal, k WHERE run_id = ?1"
        ),
        rusqlite::params![id, n as i64],
    )
    .expect("journal");
    tx.commit().expect("commit");
}

async fn status_of(c: &reqwest::Client, base: &str, id: &str) -> Value {
    c.get(format!("{base}/runs/{id}"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json")
}

/// Submits `goal` and waits until the run is parked (its row says so); its id.
async fn one_parked(c: &reqwest::Client, base: &str, store: &Path, goal: &Value) -> String {
    let r: Value = c
        .post(format!("{base}/runs"))
        .json(goal)
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    let id = r["id"].as_str().expect("id").to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let parked: i64 = rusqlite::Connection::open(store)
            .and_then(|c| c.query_row("SELECT parked FROM runs WHERE id = ?1", [&id], |r| r.get(0)))
            .unwrap_or(0);
        if parked == 1 {
            return id;
        }
        assert!(Instant::now() < deadline, "never parked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Submits `goal` and waits for its end; its id.
async fn one_finished(c: &reqwest::Client, base: &str, goal: &Value) -> String {
    let mut g = goal.clone();
    g["wait"] = json!(60);
    let r: Value = c
        .post(format!("{base}/runs"))
        .json(&g)
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    let id = r["id"].as_str().expect("id").to_string();
    let _ = c
        .get(format!("{base}/runs/{id}/result?wait=60"))
        .send()
        .await
        .expect("result");
    id
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

fn wal(store: &Path) -> std::path::PathBuf {
    let mut w = store.as_os_str().to_owned();
    w.push("-wal");
    w.into()
}

/// Time from spawning `dagloop serve` over `store` to its first answered `GET /runs`.
async fn first_answer(c: &reqwest::Client, dir: &Path, store: &Path) -> (Duration, Server) {
    let t = Instant::now();
    let server = start_at(dir, store);
    loop {
        if let Ok(r) = c.get(format!("{}/runs?limit=1", server.base)).send().await
            && r.status().is_success()
        {
            return (t.elapsed(), server);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The rows. `auto` finishes on its own; `ask` waits for a decision on its one call (call 1),
/// then finishes.
pub async fn rows(c: &reqwest::Client, dir: &Path, auto: &Value, ask: &Value) {
    let parked_n: usize = std::env::var("DAGLOOP_BENCH_PARKED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let stored_n: usize = std::env::var("DAGLOOP_BENCH_STORED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);

    // Baselines: a server over an empty store.
    let empty = dir.join("empty.db");
    let (t_empty, base_server) = first_answer(c, dir, &empty).await;
    let (rss0, threads0, cpu0) = idle(&base_server, 30);
    drop(base_server);

    // One parked and one finished run made by a server, then copied.
    let seeded = dir.join("parked.db");
    let (parked_id, finished_id) = {
        let s = start_at(dir, &seeded);
        let p = one_parked(c, &s.base, &seeded, ask).await;
        let f = one_finished(c, &s.base, auto).await;
        (p, f)
    };
    let mixed = dir.join("mixed.db");
    std::fs::copy(&seeded, &mixed).expect("copy");
    let t = Instant::now();
    clone_run(&seeded, &parked_id, parked_n - 1, "p");
    clone_run(&mixed, &parked_id, parked_n / 2 - 1, "p");
    clone_run(&mixed, &finished_id, parked_n / 2 - 1, "f");
    eprintln!(
        "(seeded {parked_n} parked runs, and a store of half parked, half finished, in {:.1} s)",
        t.elapsed().as_secs_f64()
    );

    // First answer over 10,000 stored runs, half waiting.
    let (t_mixed, mixed_server) = first_answer(c, dir, &mixed).await;
    drop(mixed_server);
    println!(
        "stored_runs={parked_n} waiting={} first_answer_ms={:.1} (empty store: {:.1})",
        parked_n / 2,
        t_mixed.as_secs_f64() * 1000.0,
        t_empty.as_secs_f64() * 1000.0
    );

    // Idle with 10,000 parked runs.
    let (_, server) = first_answer(c, dir, &seeded).await;
    let (rss, threads, cpu) = idle(&server, 30);
    println!(
        "parked_runs={parked_n} idle_30s: rss_kib={rss} threads={threads} cpu_ms={cpu:.0} (0 runs: rss_kib={rss0} threads={threads0} cpu_ms={cpu0:.0}); kib_per_parked_run={:.3}",
        rss.saturating_sub(rss0) as f64 / parked_n as f64
    );
    let db = size(&seeded) + size(&wal(&seeded));
    println!(
        "parked_runs={parked_n} store_bytes={db} bytes_per_parked_run={:.0}",
        db as f64 / parked_n as f64
    );

    // Decision to end among 10,000 parked runs: approve call 1 of one parked run, wait for its
    // result; one run at a time.
    let mut lat = Vec::new();
    for k in 1..=20 {
        let id = format!("{parked_id}-p{}", k * (parked_n / 21).max(1));
        let t = Instant::now();
        let r = c
            .post(format!("{}/runs/{id}/approvals/1", server.base))
            .json(&json!({"decision": "approve"}))
            .send()
            .await
            .expect("decide");
        assert!(r.status().is_success(), "{}", r.status());
        let v: Value = c
            .get(format!("{}/runs/{id}/result?wait=60", server.base))
            .send()
            .await
            .expect("result")
            .json()
            .await
            .expect("json");
        lat.push(t.elapsed());
        assert_eq!(v["status"], "succeeded", "{v}");
    }
    lat.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "parked_runs={parked_n} decision_to_finished: p50_ms={:.1} max_ms={:.1} (20 runs, one at a time)",
        ms(lat[lat.len() / 2]),
        ms(lat[lat.len() - 1])
    );
    let status = status_of(c, &server.base, &parked_id).await;
    assert_eq!(status["status"], "waiting", "the original still waits");
    drop(server);

    // WAL and database after `stored_n` runs submitted over HTTP (16 clients).
    let bulk = dir.join("bulk.db");
    let server = start_at(dir, &bulk);
    let max_wal = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (max_wal, sampling, w) = (max_wal.clone(), sampling.clone(), wal(&bulk));
        std::thread::spawn(move || {
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                max_wal.fetch_max(size(&w), std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let t = Instant::now();
    let clients = 16;
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (c, base, mut g) = (c.clone(), server.base.clone(), auto.clone());
        // Each client waits for its run's end before the next: sustained load, not a burst.
        g["wait"] = json!(60);
        let each = stored_n / clients + usize::from(i < stored_n % clients);
        tasks.push(tokio::spawn(async move {
            for _ in 0..each {
                let _ = c
                    .post(format!("{base}/runs"))
                    .json(&g)
                    .send()
                    .await
                    .expect("post");
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    let secs = t.elapsed().as_secs_f64();
    let (db_busy, wal_busy) = (size(&bulk), size(&wal(&bulk)));
    tokio::time::sleep(Duration::from_secs(5)).await;
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = sampler.join();
    println!(
        "stored_runs={stored_n} in {secs:.0} s ({:.0} runs/s): db_bytes={db_busy} wal_bytes={wal_busy} at the end, wal_max_bytes={}, after 5 idle s: db_bytes={} wal_bytes={}",
        stored_n as f64 / secs,
        max_wal.load(std::sync::atomic::Ordering::Relaxed),
        size(&bulk),
        size(&wal(&bulk))
    );
    drop(server);
}
