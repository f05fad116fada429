//! Usage per model where a person reads a run (issue 51, item 4): a run whose turn fell back
//! from `openai:a` to `openai:b` (the OpenAI-compatible loopback server answers 503 to every
//! attempt of the first) lists each model's tokens in `dagloop show` ("usage by model") and on
//! the page's run view, in headless Chromium against `dagloop serve` on 127.0.0.1.
//!
//! Needs `chromium` and `chromedriver` (`scripts/setup-browser.sh`); DAGLOOP_SKIP_BROWSER=1
//! skips the page part when they are missing. Screenshots go to `<target>/dagloop-artifacts/`.
#![cfg(feature = "server")]

#[path = "common/bin.rs"]
mod bin;
#[path = "common/browser.rs"]
mod browser;
mod common;
#[path = "common/model_runs.rs"]
mod model_runs;
#[path = "common/serve.rs"]
mod serve;

use model_runs::*;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_per_model_is_in_show_and_on_the_page() {
    let server = common::serve(vec![
        answer(greet_call()),
        unavailable(),
        unavailable(),
        unavailable(),
        unavailable(),
        answer(final_output()),
    ])
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("runs.db");
    let store_arg = store.display().to_string();
    let events = dir.path().join("events.jsonl");
    let (code, r, stderr) = run(
        &server,
        "openai:a, openai:b",
        &["--store", &store_arg],
        &events,
    )
    .await;
    assert_eq!(code, Some(0), "{r:#}\n{stderr}");
    let id = r["run_id"].as_str().expect("run_id").to_string();

    // `show`, as text: one line per model, with its tokens.
    let out = bin::dagloop()
        .args(["show", &id, "--store", &store_arg])
        .output()
        .expect("show");
    let text = String::from_utf8_lossy(&out.stdout);
    let by_model = text
        .split("usage by model:")
        .nth(1)
        .unwrap_or_else(|| panic!("no usage by model in:\n{text}"));
    for model in ["openai:a", "openai:b"] {
        let line = by_model
            .lines()
            .find(|l| l.trim_start().starts_with(model))
            .unwrap_or_else(|| panic!("no line for {model} in:\n{text}"));
        assert!(line.contains("10 in") && line.contains("3 out"), "{line}");
    }

    // The page's run view: the run's total and one line per model.
    let Some(session) = browser::session().await else {
        return;
    };
    let c = &session.c;
    let page = serve::Server::start(&store, None);
    browser::open_page_at_run(c, &page.base, None, &id).await;
    let shown = browser::until(
        c,
        "the usage of both models",
        "const lines = [...document.querySelectorAll('#run-usage .usage-model')]
             .map(e => e.textContent);
         return lines.length === 2 && !document.querySelector('#run-usage').hidden
             ? {total: document.querySelector('#run-usage').firstChild.textContent, lines}
             : null;",
    )
    .await;
    browser::save_screenshot(c, "usage-per-model").await;
    let lines: Vec<&str> = shown["lines"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        lines,
        [
            "openai:a 10 in · 3 out tokens",
            "openai:b 10 in · 3 out tokens"
        ],
        "{shown}"
    );
    assert_eq!(shown["total"], "usage: 20 in · 6 out tokens", "{shown}");
    browser::no_errors(c).await;
}
