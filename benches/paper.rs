//! The LLMCompiler paper's latency comparison (Kim et al., "An LLM Compiler for Parallel Function
//! Calling", arXiv 2312.04511), reproduced offline on the `Agent` path users run.
//!
//! Three plan shapes from the paper's benchmarks: HotpotQA (two searches, then the answer),
//! Movie Recommendation (eight searches, one per movie, then a comparison) and ParallelQA (three
//! searches feeding two dependent math calls). Each runs under three drivers, every one of them
//! a real dagloop run (`Agent`, the scripted model, the tools as registered Rust activities with
//! params schemas), so the only thing that differs between them is when the model's text
//! arrives:
//!
//! - `react`: one call per model turn, then an answer turn. A turn starts when the previous
//!   turn's call has finished (the model has to see its result): ReAct.
//! - `plan_then_run`: the whole plan in one turn, but delivered in one piece once the time to
//!   stream it has passed, so no call starts before the answer is complete: LLMCompiler without
//!   streaming. The same dagloop run as `streamed` with a different arrival schedule, rather
//!   than a separate tokio driver, so driver overhead is the same in both columns.
//! - `streamed`: the plan streamed at the token rate; a call starts when its JSON element
//!   closes and its references are ready (dagloop as users run it). Then the answer turn.
//!
//! The simulated model: every turn waits `TTFT_MS` (leading blanks, streamed at the token rate,
//! which the plan parser skips), then streams its text at `TOKENS_PER_S`, one token
//! (`CHARS_PER_TOKEN` characters) per chunk. A chunk's pause is a tokio sleep, which overshoots
//! its nominal length by up to a timer tick; the pause as actually slept is measured first and
//! printed (`effective_tokens_per_s`), and `plan_then_run` waits that many pauses, so both plan
//! drivers see the same model. Tools sleep (`SEARCH_MS`, `MATH_MS`). Not modelled: prompt
//! length growing with each ReAct turn, the model's reasoning text beside its calls, tool
//! latency variance, the paper's math tool being itself an LLM call (a fast calculator here).
//!
//! Latency is wall clock from the run's start to its result, the median of `REPS` runs.
//! `nominal_ms` is what the simulation alone predicts with no driver at all (each call starting
//! when the chunk that closes it has arrived and its parents have finished); `added_ms` is the
//! difference, what dagloop and the machine added. Prints one JSON line per shape and driver,
//! then a readable table. Run with `cargo bench --bench paper` (`-- NAME` runs the shapes whose
//! name holds NAME; `PAPER_TRACE=1` prints each run's events with their times to stderr).

#[path = "support/alloc.rs"]
mod alloc;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dagloop::llm::{Script, ScriptedModel};
use dagloop::{AgentBuilder, Goal, RunStatus};
use serde_json::{Value, json};

/// Characters per token (and per streamed chunk: one token per chunk).
const CHARS_PER_TOKEN: usize = 4;
/// The model's output rate.
const TOKENS_PER_S: u64 = 50;
/// Time to the first token of every model turn.
const TTFT_MS: u64 = 300;
/// One search (the paper's Wikipedia search tool: a web request).
const SEARCH_MS: u64 = 500;
/// One math call.
const MATH_MS: u64 = 10;
/// Runs per shape and driver; the median is reported.
const REPS: usize = 5;

/// The pause between two chunks (one token).
fn token_ms() -> u64 {
    1000 / TOKENS_PER_S
}

/// One plan shape: its calls in a valid topological order, its final answer, and the speedup
/// over ReAct the paper reports for that benchmark (with where it says so), if found.
struct Shape {
    name: &'static str,
    calls: Vec<Value>,
    answer: Value,
    paper: Option<(f64, &'static str)>,
}

fn search(i: usize, query: &str) -> Value {
    json!({"_tool": "search", "query": query, "_outputPath": format!("†state.s{i}")})
}

fn math(i: usize, problem: &str, context: &[&str]) -> Value {
    let context: Vec<String> = context.iter().map(|c| format!("†state.{c}")).collect();
    json!({"_tool": "math", "problem": problem, "context": context,
        "_outputPath": format!("†state.m{i}")})
}

fn shapes() -> Vec<Shape> {
    let movies = [
        "Mission Impossible",
        "The Silence of the Lambs",
        "American Beauty",
        "Star Wars Episode IV - A New Hope",
        "Austin Powers International Man of Mystery",
        "Alesha Popvich and Tugarin the Dragon",
        "In Cold Blood",
        "Rosetta",
    ];
    vec![
        Shape {
            name: "hotpotqa",
            calls: vec![
                search(1, "Ed Wood (film) director nationality"),
                search(2, "Scott Derrickson nationality"),
            ],
            answer: json!({"answer": "yes", "why": "both directors are American"}),
            paper: Some((1.80, "Sec. 5.1, gpt-3.5-turbo")),
        },
        Shape {
            name: "movie_rec",
            calls: movies
                .iter()
                .enumerate()
                .map(|(i, m)| search(i + 1, m))
                .collect(),
            answer: json!({"answer": "Austin Powers International Man of Mystery",
                "why": "closest in era and genre to the four films asked about"}),
            paper: Some((3.74, "Sec. 5.1, gpt-3.5-turbo")),
        },
        Shape {
            name: "parallelqa",
            calls: vec![
                search(1, "Stanford University Nobel laureates"),
                search(2, "UCLA Nobel laureates"),
                search(3, "UC Berkeley Nobel laureates"),
                math(4, "Stanford's laureates plus UCLA's", &["s1", "s2"]),
                math(5, "is the sum larger than Berkeley's?", &["m4", "s3"]),
            ],
            answer: json!({"answer": "no", "why": "Berkeley has more than the two together"}),
            paper: None,
        },
    ]
}

/// The goal: the two tools with params schemas (validation on, as for users); auto approval.
fn goal() -> Goal {
    let text = json!({
        "goal": "paper bench",
        "output_schema": {"type": "object"},
        "tools": [
            {"_tool": "search", "_activity": "rust", "type": "object",
                "properties": {"query": {"type": "string"}}, "required": ["query"]},
            {"_tool": "math", "_activity": "rust", "type": "object",
                "properties": {"problem": {"type": "string"}, "context": {"type": "array"}},
                "required": ["problem"]}
        ],
        "limits": {"max_steps": 20}
    })
    .to_string();
    Goal::from_json(&text, "paper.json".as_ref(), PathBuf::new()).expect("goal")
}

#[derive(Clone, Copy, PartialEq)]
enum Driver {
    React,
    PlanThenRun,
    Streamed,
}

impl Driver {
    fn name(self) -> &'static str {
        match self {
            Driver::React => "react",
            Driver::PlanThenRun => "plan_then_run",
            Driver::Streamed => "streamed",
        }
    }
}

/// One model turn: `TTFT_MS` of blanks, then `body`, one token per chunk at the token rate.
fn streamed_turn(body: &str) -> Value {
    let blanks = " ".repeat((TTFT_MS / token_ms()) as usize * CHARS_PER_TOKEN);
    json!({"text": format!("{blanks}{body}"), "chunk_chars": CHARS_PER_TOKEN,
        "chunk_delay_ms": token_ms()})
}

/// The same turn, whole: a first chunk of blanks, then all of `body` in one chunk once the
/// time [`streamed_turn`] takes to deliver its last chunk has passed. That time is counted in
/// chunks of `chunk_ms`, the measured length of one token's pause (a tokio sleep overshoots its
/// nominal length by up to a timer tick), so both drivers see the same model.
fn whole_turn(body: &str, chunk_ms: f64) -> Value {
    let chunks = (TTFT_MS / token_ms()) as usize + body.chars().count().div_ceil(CHARS_PER_TOKEN);
    let width = body.chars().count();
    json!({"text": format!("{}{body}", " ".repeat(width)), "chunk_chars": width,
        "chunk_delay_ms": ((chunks - 1) as f64 * chunk_ms).round() as u64})
}

/// The mean length of one token's pause as the scripted model sleeps it (ms).
async fn chunk_ms() -> f64 {
    let n = 100;
    let t = Instant::now();
    for _ in 0..n {
        tokio::time::sleep(Duration::from_millis(token_ms())).await;
    }
    t.elapsed().as_secs_f64() * 1000.0 / n as f64
}

fn solution(calls: &[Value], output: &Value) -> String {
    json!({"calls": calls, "output": output}).to_string()
}

/// The script a driver's model follows for a shape.
fn script(shape: &Shape, driver: Driver, chunk_ms: f64) -> Script {
    let answer = streamed_turn(&solution(&[], &shape.answer));
    let mut turns: Vec<Value> = match driver {
        Driver::React => shape
            .calls
            .iter()
            .map(|c| streamed_turn(&solution(std::slice::from_ref(c), &Value::Null)))
            .collect(),
        Driver::PlanThenRun => vec![whole_turn(&solution(&shape.calls, &Value::Null), chunk_ms)],
        Driver::Streamed => vec![streamed_turn(&solution(&shape.calls, &Value::Null))],
    };
    turns.push(answer);
    Script::parse(&json!({ "turns": turns }).to_string(), "paper").expect("script")
}

#[derive(serde::Deserialize)]
struct SearchParams {
    query: String,
}

#[derive(serde::Deserialize)]
struct MathParams {
    problem: String,
}

/// One run of a shape under a driver; wall clock from start to result, in ms.
async fn run_once(shape: &Shape, driver: Driver, chunk_ms: f64) -> f64 {
    let mut builder = AgentBuilder::new(dagloop::RunDef::from_goal(goal()).expect("defined"))
        .model(Arc::new(ScriptedModel::new(script(
            shape, driver, chunk_ms,
        ))));
    builder
        .registry_mut()
        .register_fn("search", |p: SearchParams| async move {
            tokio::time::sleep(Duration::from_millis(SEARCH_MS)).await;
            Ok::<_, String>(format!("passage about {}", p.query))
        });
    builder
        .registry_mut()
        .register_fn("math", |p: MathParams| async move {
            tokio::time::sleep(Duration::from_millis(MATH_MS)).await;
            Ok::<_, String>(json!({"problem": p.problem, "value": 42}))
        });
    let agent = builder.build().expect("agent");
    let t0 = Instant::now();
    let handle = agent.start();
    let mut events = handle.subscribe_from(0);
    let trace = std::env::var("PAPER_TRACE").is_ok();
    let watcher = tokio::spawn(async move {
        while let Some(ev) = events.recv().await {
            if trace {
                eprintln!(
                    "{:8.1} {}",
                    t0.elapsed().as_secs_f64() * 1000.0,
                    ev.kind.name()
                );
            }
        }
    });
    let result = handle.wait().await;
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    let _ = watcher.await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    ms
}

/// What the simulation alone predicts, with no driver at all (ms): each call starts when the
/// chunk holding its closing brace has arrived and its parents have finished, takes its tool's
/// time, and the next turn starts when the turn has ended and its calls have finished. The
/// measured latency minus this is what dagloop (and the machine) added.
fn nominal(shape: &Shape, driver: Driver, chunk_ms: f64) -> f64 {
    let ttft = (TTFT_MS / token_ms()) as usize;
    let tokens = |chars: usize| chars.div_ceil(CHARS_PER_TOKEN);
    let turn_ms = |body: &str| (ttft + tokens(body.chars().count()) - 1) as f64 * chunk_ms;
    // When the chunk holding the end of `call`'s text in `body` arrives.
    let close_ms = |body: &str, call: &Value| {
        let text = call.to_string();
        let end = body.find(&text).map_or(body.len(), |at| at + text.len());
        (ttft + tokens(body[..end].chars().count()) - 1) as f64 * chunk_ms
    };
    let calls = &shape.calls;
    let dur = |c: &Value| match c["_tool"].as_str() {
        Some("math") => MATH_MS as f64,
        _ => SEARCH_MS as f64,
    };
    // Each call's parents: the earlier calls whose output path it references.
    let parents = |i: usize| -> Vec<usize> {
        let refs: Vec<&str> = calls[i]["context"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        (0..i)
            .filter(|&j| refs.contains(&calls[j]["_outputPath"].as_str().unwrap_or("")))
            .collect()
    };
    let answer = turn_ms(&solution(&[], &shape.answer));
    let plan = solution(calls, &Value::Null);
    let mut fin = vec![0f64; calls.len()];
    let end = match driver {
        Driver::React => {
            let mut t = 0f64;
            for c in calls {
                let body = solution(std::slice::from_ref(c), &Value::Null);
                t += turn_ms(&body).max(close_ms(&body, c) + dur(c));
            }
            t
        }
        Driver::PlanThenRun | Driver::Streamed => {
            let whole = turn_ms(&plan);
            for i in 0..calls.len() {
                let arrives = match driver {
                    Driver::Streamed => close_ms(&plan, &calls[i]),
                    _ => whole,
                };
                let ready = parents(i).iter().map(|&j| fin[j]).fold(arrives, f64::max);
                fin[i] = ready + dur(&calls[i]);
            }
            fin.iter().copied().fold(whole, f64::max)
        }
    };
    end + answer
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let chunk_ms = rt.block_on(chunk_ms());
    let effective = 1000.0 / chunk_ms;
    let params = json!({
        "chars_per_token": CHARS_PER_TOKEN, "tokens_per_s": TOKENS_PER_S,
        "effective_tokens_per_s": (effective * 10.0).round() / 10.0, "ttft_ms": TTFT_MS,
        "search_ms": SEARCH_MS, "math_ms": MATH_MS, "reps": REPS,
    });
    let drivers = [Driver::React, Driver::PlanThenRun, Driver::Streamed];
    let mut rows = Vec::new();
    // `cargo bench --bench paper -- NAME` runs the shapes whose name holds NAME.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    for shape in shapes() {
        if !filter.is_empty() && !filter.iter().any(|f| shape.name.contains(f.as_str())) {
            continue;
        }
        let lat: Vec<f64> = drivers
            .iter()
            .map(|&d| {
                let runs = (0..REPS).map(|_| rt.block_on(run_once(&shape, d, chunk_ms)));
                median(runs.collect())
            })
            .collect();
        for (d, &ms) in drivers.iter().zip(&lat) {
            let nominal = nominal(&shape, *d, chunk_ms);
            println!(
                "{}",
                json!({"bench": "paper", "shape": shape.name, "driver": d.name(),
                    "calls": shape.calls.len(), "latency_ms": round1(ms),
                    "nominal_ms": round1(nominal), "added_ms": round1(ms - nominal),
                    "speedup_over_react": (lat[0] / ms * 100.0).round() / 100.0,
                    "paper_speedup": shape.paper.map(|p| p.0),
                    "paper_source": shape.paper.map(|p| p.1), "params": params})
            );
            rows.push(format!(
                "{:<11} {:>5} {:<14} {:>8.0} {:>8.0} {:>6.0} {:>7.2}x {:>7}  {}",
                shape.name,
                shape.calls.len(),
                d.name(),
                ms,
                nominal,
                ms - nominal,
                lat[0] / ms,
                match (shape.paper, d) {
                    (_, Driver::React) => String::new(),
                    (Some(p), _) => format!("{:.2}x", p.0),
                    (None, _) => "n/a".into(),
                },
                match (shape.paper, d) {
                    (_, Driver::React) => "",
                    (Some(p), _) => p.1,
                    (None, _) => "not found in a readable copy of the paper",
                },
            ));
        }
    }
    println!();
    println!(
        "LLMCompiler (arXiv 2312.04511) shapes, simulated: {CHARS_PER_TOKEN} chars/token, \
         {TOKENS_PER_S} tokens/s ({effective:.1} as slept here), TTFT {TTFT_MS} ms per turn, \
         search {SEARCH_MS} ms, math {MATH_MS} ms; median of {REPS}; ms"
    );
    println!(
        "{:<11} {:>5} {:<14} {:>8} {:>8} {:>6} {:>8} {:>7}  paper source",
        "shape", "calls", "driver", "latency", "nominal", "added", "speedup", "paper"
    );
    for row in rows {
        println!("{}", row.trim_end());
    }
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}
