//! `dagloop test [PATH...] [--crash-each-point] [--junit FILE]`: runs test cases
//! (`testcase`), each in a child `dagloop run` with a store of its own in a fresh folder (its
//! working directory, so a shell tool's files stay there), checks the expectations, prints a
//! cargo-like summary and exits 0 (every case passed) or 1.
//!
//! With `--crash-each-point`, each case then runs once more per journal entry k of its
//! uninterrupted run, in a child that SIGKILLs itself once k entries are committed
//! (`DAGLOOP_CRASH_AFTER_ENTRIES`); `dagloop resume` continues it (the harness approves the
//! calls the resume presents because they were cut off), and `testcase::crash::judge` checks
//! the result and the journal.
//!
//! Deliberately not here: what a case means or what counts as a failure (`testcase`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::CliError;
use crate::testcase::{Case, junit};

/// How long one child process may take.
const CHILD_LIMIT: Duration = Duration::from_secs(300);
/// The lease of a child that will be killed: it runs out soon, so the resume may take the run.
const KILLED_LEASE_MS: &str = "250";

/// A fresh folder, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch, String> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "dagloop-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(Scratch(dir))
    }
    fn db(&self) -> PathBuf {
        self.0.join("runs.db")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a child process did.
struct Ran {
    /// Killed by SIGKILL (the crash hook).
    killed: bool,
    /// Its stdout as JSON (Null when it printed none).
    json: Value,
}

/// Runs `dagloop ARGS` in `dir`; `crash_after` makes it kill itself after that many entries.
async fn child(
    dir: &Path,
    config: Option<&Path>,
    args: &[String],
    crash_after: Option<usize>,
) -> Result<Ran, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find dagloop itself: {e}"))?;
    let mut cmd = tokio::process::Command::new(exe);
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    cmd.args(args)
        .current_dir(dir)
        .env_remove("DAGLOOP_CRASH_AFTER_ENTRIES")
        .env_remove("DAGLOOP_LEASE_MS")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(k) = crash_after {
        cmd.env("DAGLOOP_CRASH_AFTER_ENTRIES", k.to_string())
            .env("DAGLOOP_LEASE_MS", KILLED_LEASE_MS);
    }
    let out = tokio::time::timeout(CHILD_LIMIT, cmd.output())
        .await
        .map_err(|_| {
            format!(
                "`dagloop {}` took longer than {CHILD_LIMIT:?}",
                args.join(" ")
            )
        })?
        .map_err(|e| format!("cannot start dagloop: {e}"))?;
    #[cfg(unix)]
    let killed = {
        use std::os::unix::process::ExitStatusExt;
        out.status.signal() == Some(9)
    };
    // No signals elsewhere: a killed child is one that left no exit code of its own.
    #[cfg(not(unix))]
    let killed = out.status.code().is_none();
    Ok(Ran {
        killed,
        json: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
    })
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// `--store DB run GOAL ...` for `case`.
fn run_args(case: &Case, db: &Path) -> Vec<String> {
    let mut a = vec![
        "--store".into(),
        s(db),
        "run".into(),
        s(&case.goal),
        "--json".into(),
        "--on-no-reviewer".into(),
        "reject".into(),
    ];
    if let Some(m) = &case.model {
        a.extend(["--model".into(), m.clone()]);
    }
    if let Some(t) = &case.tools_from {
        a.extend(["--tools-from".into(), s(t)]);
    }
    if let Some(i) = &case.input {
        a.extend(["--input".into(), i.to_string()]);
    }
    if let Some(d) = &case.decisions {
        a.extend(["--decisions".into(), s(d)]);
    }
    if case.allow_shell {
        a.push("--allow-shell".into());
    }
    a
}

/// The only run of the store at `db`, with its journal (the crash harness reads the store the
/// child runs wrote: it needs the `sqlite` feature).
#[cfg(not(feature = "sqlite"))]
fn stored(_db: &Path) -> Result<crate::store::StoredRun, String> {
    Err("`dagloop test` reads its runs' store: this build has no `sqlite` feature".into())
}

/// The only run of the store at `db`, with its journal.
#[cfg(feature = "sqlite")]
fn stored(db: &Path) -> Result<crate::store::StoredRun, String> {
    use crate::store::RunStore;
    let store = crate::store::SqliteStore::open(db).map_err(|e| e.to_string())?;
    let rows = store.list().map_err(|e| e.to_string())?;
    let id = rows
        .first()
        .map(|r| r.id.clone())
        .ok_or("no run was recorded")?;
    store.load(&id).map_err(|e| e.to_string())
}

/// Runs `case` once; with `crash`, once more per kill point. Returns the failures and the
/// kill points covered.
async fn run_case(
    case: &Case,
    config: Option<&Path>,
    crash: bool,
) -> Result<(Vec<String>, usize), String> {
    let scratch = Scratch::new()?;
    let base = child(&scratch.0, config, &run_args(case, &scratch.db()), None).await?;
    if base.json.is_null() {
        return Err("the run printed no result".into());
    }
    if base.json["status"] == "error" {
        return Err(format!("the run did not start: {}", base.json["error"]));
    }
    let mut failures = crate::testcase::check(&case.expect, &base.json);
    if !crash || !failures.is_empty() {
        return Ok((failures, 0));
    }
    let entries = stored(&scratch.db())?.journal.len();
    let mut covered = std::collections::BTreeSet::new();
    for k in 1..=entries {
        match crash_at(case, config, &base.json, k).await {
            Ok(Some((at, f))) => {
                covered.insert(at);
                // Two values of k can kill at the same point (one commit, several entries).
                for f in f
                    .into_iter()
                    .map(|f| format!("killed after entry {at}: {f}"))
                {
                    if !failures.contains(&f) {
                        failures.push(f);
                    }
                }
            }
            Ok(None) => {}
            Err(e) => failures.push(format!("kill point {k}: {e}")),
        }
    }
    Ok((failures, covered.len()))
}

/// One kill point: the run killed once `k` entries are committed, then resumed and judged.
/// None when the run ended before it reached `k` entries.
async fn crash_at(
    case: &Case,
    config: Option<&Path>,
    baseline: &Value,
    k: usize,
) -> Result<Option<(u64, Vec<String>)>, String> {
    let scratch = Scratch::new()?;
    let db = scratch.db();
    let ran = child(&scratch.0, config, &run_args(case, &db), Some(k)).await?;
    if !ran.killed {
        return Ok(None);
    }
    let before = stored(&db)?;
    let id = before.record.id.clone();
    // The reviewer: the case's decisions, and an approval of each call the resume presents
    // because the kill cut it off (what is checked is that it was presented).
    let mut decisions: Vec<Value> = match &case.decisions {
        Some(p) => std::fs::read_to_string(p)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v["decisions"].as_array().cloned())
            .unwrap_or_default(),
        None => Vec::new(),
    };
    if let Ok(mut m) = crate::runs::rebuild_machine(&before.record, &before.journal) {
        m.handle(crate::machine::RunInput::Resumed, crate::runs::now_ms());
        for (call, _) in m.awaiting() {
            decisions.insert(0, json!({"call": call.0, "decision": "approve"}));
        }
    }
    let file = scratch.0.join("resume-decisions.json");
    std::fs::write(&file, json!({ "decisions": decisions }).to_string())
        .map_err(|e| e.to_string())?;
    let mut args = vec![
        "--store".into(),
        s(&db),
        "resume".into(),
        id,
        "--json".into(),
        "--decisions".into(),
        s(&file),
    ];
    if let Some(t) = &case.tools_from {
        args.extend(["--tools-from".into(), s(t)]);
    }
    if case.allow_shell {
        args.push("--allow-shell".into());
    }
    let started = Instant::now();
    let resumed = loop {
        let r = child(&scratch.0, config, &args, None).await?;
        // The killed process's lease runs out shortly.
        if r.json["error"]["code"] == "store.busy" && started.elapsed() < CHILD_LIMIT {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        break r.json;
    };
    if resumed["status"] == "error" {
        return Err(format!("the resume failed: {}", resumed["error"]));
    }
    let after = stored(&db)?;
    let judged = crate::testcase::crash::judge(&after.record, &after.journal, &resumed, baseline)
        .map_err(|e| e.to_string())?;
    let at = judged.killed_after.unwrap_or(after.journal.len() as u64);
    Ok(Some((at, judged.failures)))
}

pub(super) async fn test(
    paths: &[PathBuf],
    crash: bool,
    junit_file: Option<&Path>,
    config: Option<&Path>,
) -> Result<i32, CliError> {
    let here = [PathBuf::from(".")];
    let paths = if paths.is_empty() { &here[..] } else { paths };
    let files = crate::testcase::find(paths).map_err(|e| CliError::new(e.code(), &e))?;
    let started = Instant::now();
    outln!(
        "\nrunning {} test{}{}",
        files.len(),
        if files.len() == 1 { "" } else { "s" },
        if crash {
            " (each killed after every journal entry and resumed)"
        } else {
            ""
        }
    );
    let mut outcomes = Vec::new();
    let mut kill_points = 0;
    for (file, shown) in &files {
        let t = Instant::now();
        let (name, failures) = match Case::load(file, shown) {
            Ok(case) => {
                let f = match run_case(&case, config, crash).await {
                    Ok((f, k)) => {
                        kill_points += k;
                        f
                    }
                    Err(e) => vec![e],
                };
                (case.name, f)
            }
            Err(e) => (shown.clone(), vec![format!("{e} [{}]", e.code())]),
        };
        outln!(
            "test {name} ... {}",
            if failures.is_empty() { "ok" } else { "FAILED" }
        );
        outcomes.push(junit::Outcome {
            name,
            seconds: t.elapsed().as_secs_f64(),
            failures,
        });
    }
    let failed: Vec<&junit::Outcome> = outcomes.iter().filter(|o| !o.failures.is_empty()).collect();
    if !failed.is_empty() {
        outln!("\nfailures:");
        for o in &failed {
            outln!("\n---- {} ----", o.name);
            for f in &o.failures {
                outln!("  {f}");
            }
        }
    }
    outln!(
        "\ntest result: {}. {} passed; {} failed;{} finished in {:.2}s",
        if failed.is_empty() { "ok" } else { "FAILED" },
        outcomes.len() - failed.len(),
        failed.len(),
        if crash {
            format!(" {kill_points} kill points;")
        } else {
            String::new()
        },
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = junit_file {
        std::fs::write(path, junit::report(&outcomes)).map_err(|e| {
            CliError::new(
                "cli.junit_file",
                format!("cannot write {}: {e}", path.display()),
            )
        })?;
    }
    Ok(if failed.is_empty() { 0 } else { 1 })
}
