//! The research example's two Rust tools, shared by `main.rs` and `benches/runs.rs`:
//! `search` (a small fixed index, 30–70 ms of simulated latency) and `rankSources`.

use std::time::Duration;

use dagloop::tools::Registry;
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
struct Search {
    query: String,
}

#[derive(Deserialize)]
struct Rank {
    sources: Vec<Value>,
    keep: Option<usize>,
}

/// A tiny offline index: (title, url, words it matches).
const INDEX: &[(&str, &str, &[&str])] = &[
    (
        "Measuring the energy of LLM inference per token",
        "https://example.org/energy-per-token",
        &["energy", "token", "inference"],
    ),
    (
        "Power draw of AI accelerators in production data centres",
        "https://example.org/dc-power",
        &["power", "centre", "accelerators"],
    ),
    (
        "Batching and quantisation for efficient transformer serving",
        "https://example.org/efficient-serving",
        &["efficient", "transformer", "serving"],
    ),
    (
        "A history of vacuum tubes",
        "https://example.org/tubes",
        &["power"],
    ),
];

/// Registers `search` and `rankSources`.
pub fn register(tools: &mut Registry) {
    tools.register_fn("search", |p: Search| async move {
        // Searches take a while: running them in parallel is what saves time.
        tokio::time::sleep(Duration::from_millis(30 + 10 * p.query.len() as u64 % 40)).await;
        let q = p.query.to_lowercase();
        let hits: Vec<Value> = INDEX
            .iter()
            .map(|(title, url, words)| (title, url, words.iter().filter(|w| q.contains(*w)).count()))
            .filter(|(_, _, score)| *score > 0)
            .map(|(title, url, score)| json!({"title": title, "url": url, "score": score, "query": p.query}))
            .collect();
        Ok::<_, String>(hits)
    });
    tools.register_fn("rankSources", |p: Rank| async move {
        let mut seen = std::collections::BTreeMap::new();
        for s in p.sources {
            let url = s["url"].as_str().unwrap_or_default().to_string();
            let score = s["score"].as_u64().unwrap_or(0);
            let best = seen.entry(url).or_insert((0u64, s.clone()));
            if score >= best.0 {
                *best = (score, s);
            }
        }
        let mut ranked: Vec<(u64, Value)> = seen.into_values().collect();
        ranked.sort_by(|a, b| {
            b.0.cmp(&a.0)
                .then_with(|| a.1["url"].as_str().cmp(&b.1["url"].as_str()))
        });
        let keep = p.keep.unwrap_or(3);
        Ok::<_, String>(
            ranked
                .into_iter()
                .take(keep)
                .map(|(_, s)| json!({"title": s["title"], "url": s["url"]}))
                .collect::<Vec<_>>(),
        )
    });
}
