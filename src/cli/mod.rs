//! The `dagloop` command line: `run`, `validate`, `graph`, `mock-llm`.
//!
//! A front-end over `engine`, `goal` and `llm`: it parses arguments, prints results and errors
//! (always JSON with a stable `code` on failure), shows progress, and turns Ctrl-C into
//! cancellation. It takes no decisions about runs.

mod progress;
mod review;

use std::io::{IsTerminal, Write};
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex};

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::approval::{ChannelApprover, Mode, Policy};
use crate::check;
use crate::engine::AgentBuilder;
use crate::engine::bus::EventBus;
use crate::goal::Goal;
use crate::protocol::{Call, Solution};

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "dagloop",
    version,
    about = "Run LLM agents whose tool calls execute as a dependency graph"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Approval policies selectable on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ApproveArg {
    /// Run every call.
    Auto,
    /// Run the goal's allow-listed tools; ask about the others.
    Allowlist,
    /// Ask about every call.
    Ask,
}

/// Graph output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    /// Mermaid flowchart.
    Mermaid,
    /// Graphviz dot.
    Dot,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a goal file to a validated output.
    Run {
        /// The goal file (JSON).
        goal: PathBuf,
        /// Model: scripted:PATH, openai:MODEL or anthropic:MODEL (default: the goal's `model`).
        #[arg(long)]
        model: Option<String>,
        /// Approval policy (default: the goal's `approval`, else auto).
        #[arg(long, value_enum)]
        approve: Option<ApproveArg>,
        /// Print only the result JSON.
        #[arg(long)]
        json: bool,
        /// Write every event as a JSON line to this file.
        #[arg(long)]
        events: Option<PathBuf>,
        /// Allow tools that use the built-in shell activity.
        #[arg(long)]
        allow_shell: bool,
    },
    /// Check a goal file, or a plan (a Solution or an array of calls), without running anything.
    Validate {
        /// The goal or plan file.
        file: PathBuf,
        /// The goal whose tools and data a plan is checked against.
        #[arg(long)]
        goal: Option<PathBuf>,
    },
    /// Print a plan's dependency graph.
    Graph {
        /// The goal or plan file.
        file: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value = "mermaid")]
        format: GraphFormat,
    },
    /// Serve a scripted-model file as an OpenAI-compatible streaming endpoint.
    MockLlm {
        /// The scripted-model file.
        #[arg(long)]
        script: PathBuf,
        /// Port on 127.0.0.1 (0 picks a free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
}

/// A command failed before or instead of producing a result.
#[derive(Debug)]
pub struct CliError {
    /// Stable error code.
    pub code: String,
    /// What went wrong.
    pub message: String,
    /// Extra structured details.
    pub details: Value,
}

impl CliError {
    fn new(code: impl Into<String>, message: impl ToString) -> Self {
        CliError {
            code: code.into(),
            message: message.to_string(),
            details: Value::Null,
        }
    }

    /// The JSON printed for this error.
    pub fn to_json(&self) -> Value {
        let mut e = json!({"code": self.code, "message": self.message});
        if !self.details.is_null() {
            e["details"] = self.details.clone();
        }
        json!({"status": "error", "error": e})
    }
}

/// Reports an argument error and returns the exit code. With `--json` among the arguments, a
/// usage error is printed on stdout as the documented JSON error (`cli.usage`, exit 2); help and
/// version requests, and usage errors without `--json`, are printed by clap as usual.
pub fn usage_error(err: &clap::Error, args: &[std::ffi::OsString]) -> i32 {
    use clap::error::ErrorKind;
    let informational = matches!(
        err.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if informational || !args.iter().any(|a| a == "--json") {
        let _ = err.print();
        return err.exit_code();
    }
    let text = err.render().to_string();
    let message = text
        .lines()
        .map(|l| l.trim_start_matches("error: ").trim())
        .find(|l| !l.is_empty())
        .unwrap_or("invalid arguments")
        .to_string();
    let mut e = CliError::new("cli.usage", message);
    e.details = json!({"usage": text.trim()});
    println!("{}", pretty(&e.to_json()));
    2
}

/// Runs a parsed command; returns the process exit code (0 success, 1 the run or check did not
/// succeed, 2 bad input).
pub async fn main(cli: Cli) -> i32 {
    let outcome = match cli.command {
        Command::Run {
            goal,
            model,
            approve,
            json,
            events,
            allow_shell,
        } => run(&goal, model, approve, json, events, allow_shell).await,
        Command::Validate { file, goal } => validate(&file, goal.as_deref()),
        Command::Graph { file, format } => graph(&file, format),
        Command::MockLlm { script, port } => mock_llm(&script, port).await,
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            println!("{}", pretty(&e.to_json()));
            2
        }
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

async fn run(
    goal_path: &FsPath,
    model: Option<String>,
    approve: Option<ApproveArg>,
    json_only: bool,
    events: Option<PathBuf>,
    allow_shell: bool,
) -> Result<i32, CliError> {
    let goal = Goal::load(goal_path).map_err(|e| CliError::new(e.code(), &e))?;
    let mut policy: Policy = match &goal.approval {
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| CliError::new("agent.invalid_policy", e))?,
        None => Policy::auto(),
    };
    match approve {
        Some(ApproveArg::Auto) => policy.mode = Mode::Auto,
        Some(ApproveArg::Ask) => policy.mode = Mode::Ask,
        Some(ApproveArg::Allowlist) if !matches!(policy.mode, Mode::Allowlist { .. }) => {
            policy.mode = Mode::Allowlist {
                allow: Default::default(),
            }
        }
        _ => {}
    }
    // The events file is created only once the agent is built, so bad input leaves no file.
    let events_out: Arc<Mutex<Option<std::io::BufWriter<std::fs::File>>>> = Arc::default();
    let mut bus = EventBus::default().with_run_id(crate::engine::bus::new_run_id());
    if events.is_some() {
        let out = events_out.clone();
        bus = bus.with_sink(Box::new(move |ev| {
            if let (Ok(mut slot), Ok(line)) = (out.lock(), serde_json::to_string(ev))
                && let Some(f) = slot.as_mut()
            {
                let _ = writeln!(f, "{line}");
                let _ = f.flush();
            }
        }));
    }
    let bus = Arc::new(bus);
    let cancel = CancellationToken::new();
    let (approver, requests) = ChannelApprover::new(64);
    let mut builder = AgentBuilder::new(goal)
        .policy(policy)
        .approver(Arc::new(approver))
        .bus(bus.clone())
        .cancel_token(cancel.clone());
    builder.registry_mut().enable_shell(allow_shell);
    if let Some(m) = model {
        builder = builder.model_spec(m);
    }
    let agent = builder.build().map_err(|e| CliError::new(e.code(), &e))?;
    if let Some(path) = &events {
        let file = std::fs::File::create(path).map_err(|e| {
            CliError::new(
                "cli.events_file",
                format!("cannot create {}: {e}", path.display()),
            )
        })?;
        if let Ok(mut slot) = events_out.lock() {
            *slot = Some(std::io::BufWriter::new(file));
        }
    }
    let interactive = std::io::stdin().is_terminal();
    let reviewer = tokio::spawn(review::serve(requests, interactive));
    let progress = (!json_only).then(|| {
        tokio::spawn(progress::show(
            bus.subscribe(),
            std::io::stderr().is_terminal(),
        ))
    });
    let ctrl_c = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                cancel.cancel();
            }
        })
    };
    let result = agent.run().await;
    ctrl_c.abort();
    reviewer.abort();
    drop(bus);
    if let Some(mut p) = progress {
        // With the agent gone, dropping our handle closes the bus: the view prints what is left
        // (down to "run finished") and returns. The wait is bounded in case a task still holds it.
        if tokio::time::timeout(std::time::Duration::from_secs(2), &mut p)
            .await
            .is_err()
        {
            p.abort();
        }
    }
    let value = serde_json::to_value(&result).unwrap_or(Value::Null);
    println!("{}", pretty(&value));
    Ok(if result.succeeded() { 0 } else { 1 })
}

/// Reads a plan file: a Solution object, an array of calls, or a goal's `plan`.
fn load_plan(file: &FsPath) -> Result<(Vec<Call>, Option<Goal>), CliError> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            "cli.not_found"
        } else {
            "cli.unreadable"
        };
        CliError::new(code, format!("cannot read {}: {e}", file.display()))
    })?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| CliError::new("plan.invalid_json", format!("{}: {e}", file.display())))?;
    if v.get("output_schema").is_some() {
        let goal = Goal::load(file).map_err(|e| CliError::new(e.code(), &e))?;
        return Ok((goal.plan.clone(), Some(goal)));
    }
    if !(v.is_array() || v.get("calls").is_some()) {
        return Err(CliError::new(
            "plan.not_a_plan",
            format!(
                "{} is not a plan: expected a goal file, a Solution with `calls`, or an array of calls",
                file.display()
            ),
        ));
    }
    let calls = match v {
        Value::Array(items) => Solution::from_value(json!({"calls": items})),
        other => Solution::from_value(other),
    }
    .map_err(|e| CliError::new(e.code(), format!("{}: {e}", file.display())))?
    .calls;
    Ok((calls, None))
}

fn validate(file: &FsPath, goal: Option<&FsPath>) -> Result<i32, CliError> {
    let other_goal = goal
        .map(|p| Goal::load(p).map_err(|e| CliError::new(e.code(), &e)))
        .transpose()?;
    if is_script_file(file) {
        let findings = check::check_script_file(file, other_goal.as_ref().map(|g| &g.tools[..]));
        return Ok(report(json!({"kind": "scripted-model"}), findings));
    }
    let (calls, own_goal) = load_plan(file)?;
    let (kind, findings) = match (own_goal, other_goal) {
        (Some(g), _) => ("goal", check::check_goal(&g)),
        (None, Some(g)) => {
            let mut initial = serde_json::Map::new();
            if let Some(i) = &g.input {
                initial.insert("input".into(), i.clone());
            }
            initial.insert("state".into(), g.state.clone().unwrap_or_else(|| json!({})));
            ("plan", check::check_plan(&calls, Some(&g.tools), &initial))
        }
        (None, None) => (
            "plan",
            check::check_plan(&calls, None, &serde_json::Map::new()),
        ),
    };
    Ok(report(
        json!({"kind": kind, "calls": calls.len()}),
        findings,
    ))
}

/// True when `file` is a JSON object with a `turns` key (a scripted-model file).
fn is_script_file(file: &FsPath) -> bool {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .is_some_and(|v| v.get("turns").is_some())
}

/// Prints a validation report (`head` plus status and findings); exit 0 when there are none.
fn report(mut head: Value, findings: Vec<check::Finding>) -> i32 {
    let ok = findings.is_empty();
    head["status"] = json!(if ok { "valid" } else { "invalid" });
    head["findings"] = json!(findings);
    println!("{}", pretty(&head));
    if ok { 0 } else { 1 }
}

fn graph(file: &FsPath, format: GraphFormat) -> Result<i32, CliError> {
    let (calls, _) = load_plan(file)?;
    let text = match format {
        GraphFormat::Mermaid => check::mermaid(&calls),
        GraphFormat::Dot => check::dot(&calls),
    };
    print!("{text}");
    Ok(0)
}

#[cfg(feature = "server")]
async fn mock_llm(script: &FsPath, port: u16) -> Result<i32, CliError> {
    let script = crate::llm::Script::load(script).map_err(|e| CliError::new(e.code(), &e))?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| {
            CliError::new(
                "cli.bind",
                format!("cannot listen on 127.0.0.1:{port}: {e}"),
            )
        })?;
    let server = crate::llm::serve_mock(script, listener)
        .await
        .map_err(|e| CliError::new("cli.bind", e))?;
    println!(
        "{}",
        json!({"status": "listening", "base_url": server.base_url()})
    );
    tokio::select! {
        r = server.wait() => r.map_err(|e| CliError::new("cli.serve", e))?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(0)
}

#[cfg(not(feature = "server"))]
async fn mock_llm(_script: &FsPath, _port: u16) -> Result<i32, CliError> {
    Err(CliError::new(
        "cli.feature_disabled",
        "mock-llm needs the `server` feature",
    ))
}
