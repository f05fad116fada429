//! Bad input to `dagloop run` (exit 2, a JSON error with a stable code, nothing half-written),
//! and the static commands `dagloop validate` and `dagloop graph` (insta snapshots).
//!
//! Goal and plan fixtures are read with relative paths from their own folder, so the messages
//! in the snapshots do not depend on where the repository lives.

#[path = "common/e2e.rs"]
mod harness;

use harness::{Run, command, finish, fixture};
use serde_json::{Map, Value, json};

/// Runs `dagloop ARGS` from `tests/fixtures/e2e/<dir>`.
async fn dagloop_in(dir: &str, args: &[&str]) -> Run {
    let mut cmd = command(args);
    cmd.current_dir(fixture(dir));
    finish(cmd.spawn().expect("start dagloop")).await
}

/// `dagloop run GOAL --json --events <tmp>` from `bad/`: exit 2, `{"status": "error", "error":
/// {"code", "message"}}`, and no events file left behind. Returns the error object.
async fn bad_run(goal: &str, extra: &[&str], code: &str) -> Value {
    let tmp = tempfile::tempdir().unwrap();
    let events = tmp.path().join("events.jsonl");
    let mut args = vec!["run", goal, "--json", "--events", events.to_str().unwrap()];
    args.extend_from_slice(extra);
    let run = dagloop_in("bad", &args).await;
    let r = run.json();
    assert_eq!(run.code, 2, "bad input exits 2: {r:#}");
    assert_eq!(r["status"], "error", "{r:#}");
    assert_eq!(r["error"]["code"], code, "{r:#}");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{r:#}"
    );
    assert!(!run.stdout.contains("succeeded"), "{}", run.stdout);
    assert!(
        !events.exists(),
        "a run that never started leaves no events file"
    );
    r["error"].clone()
}

#[tokio::test]
async fn broken_output_schema() {
    let e = bad_run("broken_output_schema.goal.json", &[], "goal.invalid_schema").await;
    assert!(
        e["message"].as_str().unwrap().contains("output_schema"),
        "{e}"
    );
}

#[tokio::test]
async fn broken_tool_params_schema() {
    let e = bad_run("broken_tool_schema.goal.json", &[], "goal.invalid_schema").await;
    assert!(
        e["message"].as_str().unwrap().contains("tools[0] (search)"),
        "{e}"
    );
}

#[tokio::test]
async fn missing_goal_file() {
    bad_run("no-such.goal.json", &[], "goal.not_found").await;
}

#[tokio::test]
async fn unknown_model_spec() {
    let e = bad_run(
        "answer.goal.json",
        &["--model", "gpt4:turbo"],
        "llm.unknown_spec",
    )
    .await;
    assert!(e["message"].as_str().unwrap().contains("gpt4:turbo"), "{e}");
}

#[tokio::test]
async fn incomplete_model_spec() {
    bad_run(
        "answer.goal.json",
        &["--model", "openai:"],
        "llm.invalid_spec",
    )
    .await;
}

#[tokio::test]
async fn tool_name_clash() {
    let e = bad_run("tool_clash.goal.json", &[], "goal.tool_clash").await;
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("tools[0] and tools[2]"),
        "{e}"
    );
}

#[tokio::test]
async fn malformed_goal_json() {
    let e = bad_run("malformed.goal.json", &[], "goal.invalid").await;
    assert!(
        e["message"].as_str().unwrap().contains("line 5"),
        "the position is given: {e}"
    );
}

#[tokio::test]
async fn misspelt_goal_key() {
    let e = bad_run("unknown_key.goal.json", &[], "goal.invalid").await;
    assert!(e["message"].as_str().unwrap().contains("limit"), "{e}");
}

/// A typo in a meta key fails closed: `run` and `validate` both refuse the goal before anything
/// runs, naming the tool and the closest known key (issue 23; a tool with `"_aproval": "always"`
/// used to run with no approval at all).
#[tokio::test]
async fn misspelt_meta_key() {
    let e = bad_run("meta_key_typo.goal.json", &[], "goal.unknown_meta_key").await;
    let validated = dagloop_in("bad", &["validate", "meta_key_typo.goal.json"]).await;
    assert_eq!(validated.code, 2, "{}", validated.stdout);
    assert_eq!(validated.json()["error"], e, "validate says what run says");
    insta::assert_json_snapshot!(e);
}

#[tokio::test]
async fn input_that_breaks_its_schema() {
    let e = bad_run("input_mismatch.goal.json", &[], "goal.invalid").await;
    assert!(
        e["message"].as_str().unwrap().contains("input_schema"),
        "{e}"
    );
}

#[tokio::test]
async fn scripted_file_that_does_not_exist() {
    let e = bad_run("missing_script.goal.json", &[], "llm.script_io").await;
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("no-such.script.json"),
        "{e}"
    );
}

#[tokio::test]
async fn scripted_file_that_is_invalid() {
    bad_run("malformed_script.goal.json", &[], "llm.script_invalid").await;
}

#[tokio::test]
async fn invalid_approval_policy() {
    bad_run("bad_policy.goal.json", &[], "goal.invalid").await;
}

#[tokio::test]
async fn no_model_anywhere() {
    bad_run("no_model.goal.json", &[], "agent.no_model").await;
}

#[tokio::test]
async fn events_file_that_cannot_be_created() {
    let run = dagloop_in(
        "bad",
        &[
            "run",
            "answer.goal.json",
            "--json",
            "--events",
            "no-such-dir/events.jsonl",
        ],
    )
    .await;
    assert_eq!(run.code, 2);
    assert_eq!(run.json()["error"]["code"], "cli.events_file");
}

#[tokio::test]
async fn mock_llm_with_a_missing_script() {
    let run = dagloop_in("bad", &["mock-llm", "--script", "no-such.script.json"]).await;
    assert_eq!(run.code, 2);
    assert_eq!(run.json()["error"]["code"], "llm.script_io");
}

#[tokio::test]
async fn goal_keys_the_published_schema_allows_are_accepted() {
    let run = dagloop_in("bad", &["run", "described.goal.json", "--json"]).await;
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert_eq!(run.json()["output"], json!({"answer": 42}));
}

#[tokio::test]
async fn bad_input_errors_are_stable() {
    let cases: &[(&str, &[&str])] = &[
        ("broken_output_schema.goal.json", &[]),
        ("broken_tool_schema.goal.json", &[]),
        ("no-such.goal.json", &[]),
        ("answer.goal.json", &["--model", "gpt4:turbo"]),
        ("tool_clash.goal.json", &[]),
        ("malformed.goal.json", &[]),
        ("unknown_key.goal.json", &[]),
        ("input_mismatch.goal.json", &[]),
        ("missing_script.goal.json", &[]),
        ("malformed_script.goal.json", &[]),
        ("bad_policy.goal.json", &[]),
        ("no_model.goal.json", &[]),
    ];
    let mut all = Map::new();
    for (goal, extra) in cases {
        let mut args = vec!["run", goal, "--json"];
        args.extend_from_slice(extra);
        let run = dagloop_in("bad", &args).await;
        let mut key = goal.to_string();
        if !extra.is_empty() {
            key = format!("{key} {}", extra.join(" "));
        }
        all.insert(key, run.json());
    }
    insta::assert_json_snapshot!(all);
}

// ----- dagloop validate -----

/// `dagloop validate PLAN --goal research.goal.json` from `plans/`: (exit code, output).
async fn validate(plan: &str) -> (i32, Value) {
    let run = dagloop_in("plans", &["validate", plan, "--goal", "research.goal.json"]).await;
    (run.code, run.json())
}

fn codes(v: &Value) -> Vec<&str> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn validate_a_valid_plan() {
    let (code, v) = validate("valid.plan.json").await;
    assert_eq!(code, 0, "{v:#}");
    insta::assert_json_snapshot!(v);
}

#[tokio::test]
async fn validate_a_goal_with_its_own_plan() {
    let run = dagloop_in("plans", &["validate", "research.goal.json"]).await;
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert_eq!(
        run.json(),
        json!({"kind": "goal", "calls": 3, "status": "valid", "findings": []})
    );
}

/// Issue 23: call 1 is ready on arrival (it reads the initial state), so when call 2 arrives and
/// writes what call 1 read, call 1 reads nothing any more: no cycle. `validate` hands the plan
/// to the run's own scheduler, so it agrees with `run`, which runs both calls.
#[tokio::test]
async fn validate_agrees_with_run_on_a_call_ready_on_arrival() {
    let run = dagloop_in("plans", &["validate", "ready_first.goal.json"]).await;
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert_eq!(
        run.json(),
        json!({"kind": "goal", "calls": 2, "status": "valid", "findings": []})
    );
    let ran = dagloop_in(
        "plans",
        &["run", "ready_first.goal.json", "--json", "--no-store"],
    )
    .await;
    let r = ran.json();
    assert_eq!(ran.code, 0, "{r:#}");
    assert_eq!(r["status"], "succeeded", "{r:#}");
    let statuses: Vec<&str> = r["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["status"].as_str())
        .collect();
    assert_eq!(statuses, ["done", "done"], "{r:#}");
    // The graph is the run's too: one edge, from the writer of `state.y` to its reader... none
    // here, since call 1 is done before call 2 arrives.
    let drawn = dagloop_in(
        "plans",
        &["graph", "ready_first.goal.json", "--format", "dot"],
    )
    .await;
    assert!(!drawn.stdout.contains("->"), "{}", drawn.stdout);
}

#[tokio::test]
async fn validate_an_unknown_tool() {
    let (code, v) = validate("unknown_tool.plan.json").await;
    assert_eq!(code, 1);
    assert_eq!(codes(&v), ["plan.unknown_tool"]);
    insta::assert_json_snapshot!(v);
}

#[tokio::test]
async fn validate_invalid_params() {
    let (code, v) = validate("invalid_params.plan.json").await;
    assert_eq!(code, 1);
    assert_eq!(codes(&v), ["plan.invalid_params", "plan.invalid_params"]);
    insta::assert_json_snapshot!(v);
}

#[tokio::test]
async fn validate_a_cycle() {
    let (code, v) = validate("cycle.plan.json").await;
    assert_eq!(code, 1);
    assert_eq!(codes(&v), ["plan.cycle"]);
    insta::assert_json_snapshot!(v);
}

#[tokio::test]
async fn validate_dangling_references() {
    let (code, v) = validate("dangling.plan.json").await;
    assert_eq!(code, 1);
    assert_eq!(
        codes(&v),
        ["plan.dangling_reference", "plan.dangling_reference"]
    );
    insta::assert_json_snapshot!(v);
}

#[tokio::test]
async fn validate_bad_references() {
    let (code, v) = validate("bad_reference.plan.json").await;
    insta::assert_json_snapshot!(json!({"exit": code, "output": v}));
}

#[tokio::test]
async fn validate_without_a_goal_checks_only_the_graph() {
    // No tools to check against; the cycle is still found.
    let run = dagloop_in("plans", &["validate", "cycle.plan.json"]).await;
    assert_eq!(run.code, 1);
    assert!(codes(&run.json()).contains(&"plan.cycle"));
}

#[tokio::test]
async fn validate_unreadable_plans() {
    let run = dagloop_in("plans", &["validate", "truncated.plan.json"]).await;
    assert_eq!(run.code, 2);
    assert_eq!(run.json()["error"]["code"], "plan.invalid_json");
    let run = dagloop_in("plans", &["validate", "no-such.plan.json"]).await;
    assert_eq!(run.code, 2);
    assert_eq!(run.json()["error"]["code"], "cli.not_found");
}

// ----- dagloop graph -----

async fn graph(plan: &str, format: &str) -> String {
    let run = dagloop_in("plans", &["graph", plan, "--format", format]).await;
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert_eq!(run.stderr, "");
    run.stdout
}

#[tokio::test]
async fn graph_mermaid() {
    insta::assert_snapshot!(graph("valid.plan.json", "mermaid").await);
}

#[tokio::test]
async fn graph_dot() {
    insta::assert_snapshot!(graph("valid.plan.json", "dot").await);
}

#[tokio::test]
async fn graph_of_a_cycle_and_of_a_goal_plan() {
    insta::assert_snapshot!("graph_cycle_dot", graph("cycle.plan.json", "dot").await);
    insta::assert_snapshot!(
        "graph_goal_mermaid",
        graph("research.goal.json", "mermaid").await
    );
}

#[tokio::test]
async fn graph_defaults_to_mermaid() {
    let run = dagloop_in("plans", &["graph", "valid.plan.json"]).await;
    assert_eq!(run.stdout, graph("valid.plan.json", "mermaid").await);
}

// ----- what authors get wrong (issue 49) -----

/// Each mistake a first goal's author makes, as `validate` reports it, with a did-you-mean
/// wherever something close exists: a reference to a path nothing writes (in a goal's plan and
/// in a script), a param of the wrong type in a script, rule patterns that match no tool, a plan
/// that reads `input` validated without `--goal`, and typos in keys that are not meta keys.
#[tokio::test]
async fn validate_catches_what_authors_get_wrong() {
    let mut all = Map::new();
    for (name, args, exit) in [
        (
            "dangling_in_a_goal",
            &["validate", "dangling.goal.json"][..],
            1,
        ),
        (
            "script_against_its_goal",
            &[
                "validate",
                "typo.script.json",
                "--goal",
                "weather.goal.json",
            ][..],
            1,
        ),
        ("rule_patterns", &["validate", "rules.goal.json"][..], 1),
        ("plan_without_goal", &["validate", "input.plan.json"][..], 1),
        (
            "typo_in_a_field",
            &["validate", "bad/typo_field.goal.json"][..],
            2,
        ),
        (
            "typo_in_http",
            &["validate", "bad/typo_http.goal.json"][..],
            2,
        ),
    ] {
        let run = dagloop_in("authoring", args).await;
        assert_eq!(run.code, exit, "{name}: {}", run.stdout);
        all.insert(name.into(), run.json());
    }
    let text = |k: &str| all[k].to_string();
    assert!(
        text("dangling_in_a_goal").contains("did you mean `state.weather`"),
        "{}",
        text("dangling_in_a_goal")
    );
    let script = &all["script_against_its_goal"];
    assert_eq!(
        codes(script),
        ["plan.invalid_params", "plan.dangling_reference"],
        "{script:#}"
    );
    assert!(text("script_against_its_goal").contains("did you mean `state.weather`"));
    assert_eq!(
        codes(&all["rule_patterns"]),
        [
            "approval.rule_matches_nothing",
            "approval.rule_matches_nothing"
        ]
    );
    assert!(text("rule_patterns").contains("only `*` (any run of characters) and `?`"));
    assert!(text("rule_patterns").contains("did you mean `getWeather`"));
    assert!(text("plan_without_goal").contains("--goal GOAL"));
    assert!(text("typo_in_a_field").contains("did you mean `tools`"));
    assert!(text("typo_in_http").contains("did you mean `timeout_s`"));
    insta::assert_json_snapshot!(Value::Object(all));
}

/// Issue 49: `dagloop graph RUN` draws what a stored run did. The research example's fan-in
/// (three searches `concat` into one path, ranked, then drafted): every call with its status
/// and an edge for each path that flowed, in mermaid and dot. A goal with no plan has nothing
/// to draw before a run, and says so.
#[tokio::test]
async fn graph_of_a_run_draws_its_calls_status_and_edges() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("runs.db");
    let db = db.to_str().unwrap();
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/research");
    let goal = examples.join("goal.json");
    let tools = examples.join("tools.json");
    let ran = finish(
        command([
            "--store",
            db,
            "run",
            goal.to_str().unwrap(),
            "--json",
            "--tools-from",
            tools.to_str().unwrap(),
        ])
        .spawn()
        .unwrap(),
    )
    .await;
    let r = ran.json();
    assert_eq!(ran.code, 0, "{r:#}");
    let id = r["run_id"].as_str().unwrap();
    let draw = |format: &'static str| {
        let id = id.to_string();
        let db = db.to_string();
        async move {
            let run = finish(
                command(["--store", &db, "graph", &id, "--format", format])
                    .spawn()
                    .unwrap(),
            )
            .await;
            assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
            run.stdout
        }
    };
    let mermaid = draw("mermaid").await;
    for line in [
        "c1[\"#1 search · done\"]",
        "c4[\"#4 rankSources · done\"]",
        "c5[\"#5 writeBrief · done\"]",
        "c1 -- \"state.results\" --> c4",
        "c2 -- \"state.results\" --> c4",
        "c3 -- \"state.results\" --> c4",
        "c4 -- \"state.ranked\" --> c5",
    ] {
        assert!(mermaid.contains(line), "{line}:\n{mermaid}");
    }
    let dot = draw("dot").await;
    assert!(dot.starts_with("digraph run {"), "{dot}");
    assert!(dot.contains("c4 -> c5 [label=\"state.ranked\"];"), "{dot}");
    assert_eq!(dot.matches(" -> ").count(), 4, "{dot}");

    // A goal with no plan: nothing to draw before a run.
    let none = dagloop_in("authoring", &["graph", "weather.goal.json"]).await;
    assert_eq!(none.code, 2, "{}", none.stdout);
    assert_eq!(none.json()["error"]["code"], "graph.no_plan");
    assert!(none.stdout.contains("dagloop graph RUN"), "{}", none.stdout);
}
