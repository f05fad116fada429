//! The `dagloop` command line: `run`, `resume`, `runs`, `show`, `decide`, `grant`, `revoke`,
//! `validate`, `graph`, `mock-llm`.
//!
//! A front-end over `engine`, `goal` and `llm`: it parses arguments, prints results and errors
//! (always JSON with a stable `code` on failure), shows progress, and turns Ctrl-C into
//! cancellation. It takes no decisions about runs.

#[macro_use]
mod out;
mod cassette;
mod codes_cmd;
mod fork;
mod grant_cmd;
mod policy_cmd;
mod progress;
mod replay;
mod review;
mod run;
mod runs;
mod schema_cmd;
mod temporal_cmd;
mod test_cmd;

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};

use crate::check;
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
    /// The run store (default: `DAGLOOP_STORE`, else `dagloop/runs.db` in the user's data
    /// directory).
    #[arg(long, global = true)]
    pub store: Option<PathBuf>,
    /// Keep no record of runs (they cannot be resumed, shown or decided later).
    #[arg(long, global = true, conflicts_with = "store")]
    pub no_store: bool,
    /// The operator's configuration (TOML, or JSON by its `.json` name;
    /// schemas/config.schema.json): what runs may touch, MCP servers, agents, principals.
    /// Without it the command line grants everything but the shell (`--allow-shell`), and
    /// `serve`/`worker` grant only http and delegate tools, public addresses and files under
    /// the working directory.
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// How logs are written on stderr when `RUST_LOG` asks for them: `text` or `json`.
    #[arg(long, global = true, value_enum, default_value_t = LogFormatArg::Text)]
    pub log_format: LogFormatArg,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormatArg {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

/// The operator's configuration, when `--config` names one.
fn load_config(path: Option<&FsPath>) -> Result<Option<crate::config::Config>, CliError> {
    path.map(|p| crate::config::Config::load(p).map_err(|e| CliError::new(e.code(), e)))
        .transpose()
}

/// What this command's runs may touch: the configuration's grants, else the command line's
/// default (everything but the shell) or, for a server or worker (`closed`), the closed default;
/// `--allow-shell` adds the shell either way.
fn grants_for(
    config: Option<&crate::config::Config>,
    allow_shell: bool,
    closed: bool,
) -> Result<Arc<crate::grants::Grants>, CliError> {
    let cwd = std::env::current_dir().unwrap_or_default();
    let mut grants = match config {
        Some(c) => c.grants(&cwd).map_err(|e| CliError::new(e.code(), e))?,
        None if closed => crate::grants::Grants::closed(&cwd),
        None => crate::grants::Grants::cli(allow_shell),
    };
    if allow_shell && let Some(k) = grants.kinds.as_mut() {
        k.insert("shell".into());
    }
    Ok(Arc::new(grants))
}

/// What to do with stored runs.
#[derive(Debug, Subcommand)]
pub enum RunsAction {
    /// Apply a retention policy once: forget finished runs not updated for `--retain`, compact
    /// those not updated for `--compact-after` (without either: the config's `[store]`). Runs
    /// that are running, waiting or stopped are never touched.
    Prune {
        /// Delete finished runs not updated for this long (`30d`, `12h`, `45m`, `10s`).
        #[arg(long, visible_alias = "older-than", value_name = "AGE")]
        retain: Option<String>,
        /// Compact finished runs not updated for this long to their result, decisions and a
        /// final snapshot (`show` keeps working; replay, fork and cassettes need the journal).
        #[arg(long, value_name = "AGE")]
        compact_after: Option<String>,
    },
    /// Compact these finished runs now (see `prune --compact-after`).
    Compact {
        /// The run ids.
        #[arg(required = true)]
        runs: Vec<String>,
    },
}

/// A decision on the command line (the protocol's `Decision`).
#[derive(Debug, Subcommand)]
pub enum DecideArg {
    /// Run the call as presented.
    Approve,
    /// Do not run it; the model is told why.
    Reject {
        /// Why.
        #[arg(long, default_value = "rejected by the reviewer")]
        reason: String,
    },
    /// Run it with these params (JSON object; the tool stays the same).
    Edit {
        /// The new params.
        #[arg(long)]
        params: String,
    },
    /// Run this call in its place (JSON object with `_tool`).
    Replace {
        /// The call.
        #[arg(long)]
        call: String,
    },
    /// Only for a call interrupted by a restart: it happened; this is its result (JSON).
    Done {
        /// The call's result.
        #[arg(long)]
        result: String,
    },
}

/// `dagloop policy` subcommands.
#[derive(Debug, Subcommand)]
pub enum PolicyArg {
    /// Which rule of the goal's approval policy decides a call (allow, ask or deny) and why,
    /// with the rules passed over before it.
    Explain {
        /// The goal file.
        goal: PathBuf,
        /// The call, as JSON: `{"_tool": NAME, ...params}`.
        #[arg(long)]
        call: String,
        /// Override the policy's mode, as `run --approve` does.
        #[arg(long, value_enum)]
        approve: Option<ApproveArg>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
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

/// How the model returns its Solution (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// JSON text constrained by the composed schema.
    Structured,
    /// Native tool calls; the output through `final_output`.
    Tools,
}

impl From<ModeArg> for crate::llm::Mode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Structured => crate::llm::Mode::StructuredOutput,
            ModeArg::Tools => crate::llm::Mode::ToolCalls,
        }
    }
}

/// What a run without a terminal does when its policy can ask a reviewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NoReviewer {
    /// Refuse to start (`approval.no_reviewer`).
    Fail,
    /// Reject every call that needs a reviewer; the model is told.
    Reject,
}

/// Which engine drives a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EngineArg {
    /// This process (the default).
    Embedded,
    /// A Temporal workflow, run by `dagloop worker` processes (build feature `temporal`).
    Temporal,
}

/// Where Temporal runs live (used with `--engine temporal` and by `dagloop worker`).
#[derive(Debug, Clone, clap::Args)]
pub struct TemporalArgs {
    /// The engine: `embedded` (this process) or `temporal`.
    #[arg(long, value_enum, default_value = "embedded")]
    pub engine: EngineArg,
    /// The Temporal server, HOST:PORT (default: `TEMPORAL_ADDRESS`, else 127.0.0.1:7233).
    #[arg(long, value_name = "HOST:PORT")]
    pub temporal: Option<String>,
    /// The Temporal namespace.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// The task queue workflows and activities go to.
    #[arg(long, default_value = "dagloop")]
    pub task_queue: String,
}

impl TemporalArgs {
    /// The server address: the option, else `TEMPORAL_ADDRESS`, else 127.0.0.1:7233.
    pub fn address(&self) -> String {
        self.temporal
            .clone()
            .or_else(|| {
                std::env::var("TEMPORAL_ADDRESS")
                    .ok()
                    .filter(|a| !a.is_empty())
            })
            .unwrap_or_else(|| "127.0.0.1:7233".into())
    }
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
        /// No progress lines on stderr (the result and errors still print).
        #[arg(long, short)]
        quiet: bool,
        /// Write every event as a JSON line to this file (live `call_progress` events included,
        /// `model_delta` left out).
        #[arg(long)]
        events: Option<PathBuf>,
        /// Allow tools that use the built-in shell activity.
        #[arg(long)]
        allow_shell: bool,
        /// Return as soon as the run only waits for reviewers (decide with `dagloop decide`,
        /// continue with `dagloop resume`).
        #[arg(long)]
        detach: bool,
        /// Decisions given up front: `{"decisions": [{"tool": NAME} or {"call": ID}, plus a
        /// decision]}` (schemas/decisions.schema.json); calls it does not cover are rejected.
        #[arg(long)]
        decisions: Option<PathBuf>,
        /// Without a terminal (and without --decisions): `fail` refuses to start a run whose
        /// policy can ask (`approval.no_reviewer`); `reject` rejects what needs a reviewer.
        #[arg(long, value_enum, default_value = "fail")]
        on_no_reviewer: NoReviewer,
        /// How the model returns its Solution (default: the goal's `mode`, else structured).
        #[arg(long, value_enum)]
        mode: Option<ModeArg>,
        /// Answer every tool call from a recording (`dagloop export --cassette DIR` writes
        /// DIR/tools.json); a call it does not hold fails with `cassette.miss`.
        #[arg(long, value_name = "FILE")]
        tools_from: Option<PathBuf>,
        /// With --tools-from: a call the recording does not hold runs for real.
        #[arg(long, requires = "tools_from")]
        tools_from_passthrough: bool,
        /// The run's input (JSON), in place of the goal's `input` (checked against its
        /// `input_schema`).
        #[arg(long, value_name = "JSON")]
        input: Option<String>,
        /// Where the run is driven.
        #[command(flatten)]
        temporal: TemporalArgs,
    },
    /// Continue a stored run where it stopped (same options, output and exit codes as `run`).
    Resume {
        /// The run id.
        run: String,
        /// Model (default: the one the run was started with).
        #[arg(long)]
        model: Option<String>,
        /// Approval policy (default: the one the run was started with).
        #[arg(long, value_enum)]
        approve: Option<ApproveArg>,
        /// Print only the result JSON.
        #[arg(long)]
        json: bool,
        /// No progress lines on stderr (the result and errors still print).
        #[arg(long, short)]
        quiet: bool,
        /// Write every event (from the run's start) as a JSON line to this file (live
        /// `call_progress` events included, `model_delta` left out).
        #[arg(long)]
        events: Option<PathBuf>,
        /// Allow tools that use the built-in shell activity.
        #[arg(long)]
        allow_shell: bool,
        /// Return as soon as the run only waits for reviewers.
        #[arg(long)]
        detach: bool,
        /// Decisions given up front (see `run --decisions`).
        #[arg(long)]
        decisions: Option<PathBuf>,
        /// Continue even though the run's definition (a delegate goal) changed since it began;
        /// the new definition is recorded.
        #[arg(long)]
        accept_changes: bool,
        /// Without a terminal: `fail` or `reject` (see `run --on-no-reviewer`).
        #[arg(long, value_enum, default_value = "fail")]
        on_no_reviewer: NoReviewer,
        /// How the model returns its Solution (default: the goal's `mode`, else structured).
        #[arg(long, value_enum)]
        mode: Option<ModeArg>,
        /// Answer the run's calls from a recording (see `run --tools-from`).
        #[arg(long, value_name = "FILE")]
        tools_from: Option<PathBuf>,
        /// With --tools-from: a call the recording does not hold runs for real.
        #[arg(long, requires = "tools_from")]
        tools_from_passthrough: bool,
    },
    /// Start a new run from a stored run's state, plan and context after one of its steps
    /// (the moment it asked its model for the next one), recorded as its fork; then continue
    /// it (same output and exit codes as `run`).
    Fork {
        /// The run to fork.
        run: String,
        /// The step to fork after (0: right after the run's start).
        #[arg(long, value_name = "N")]
        at_step: u32,
        /// The model from step N+1 on (default: the original's). A scripted model is read
        /// from its turn N+1, as a resumed run reads it.
        #[arg(long)]
        model: Option<String>,
        /// The input (JSON) in place of the original's: steps 1..N stand as recorded, the
        /// model sees the new input from step N+1 on.
        #[arg(long, value_name = "JSON")]
        input: Option<String>,
        /// Print only the result JSON.
        #[arg(long)]
        json: bool,
        /// No progress lines on stderr.
        #[arg(long, short)]
        quiet: bool,
        /// Allow tools that use the built-in shell activity.
        #[arg(long)]
        allow_shell: bool,
        /// Decisions given up front (see `run --decisions`).
        #[arg(long)]
        decisions: Option<PathBuf>,
        /// Without a terminal: `fail` or `reject` (see `run --on-no-reviewer`).
        #[arg(long, value_enum, default_value = "fail")]
        on_no_reviewer: NoReviewer,
        /// Answer the fork's calls from a recording (see `run --tools-from`).
        #[arg(long, value_name = "FILE")]
        tools_from: Option<PathBuf>,
        /// With --tools-from: a call the recording does not hold runs for real.
        #[arg(long, requires = "tools_from")]
        tools_from_passthrough: bool,
    },
    /// Run test cases (`test.json` files; a folder is searched for them): each runs its goal
    /// offline and checks its expectations; prints a summary, exit 1 when one fails.
    Test {
        /// Test files, or folders to search for `test.json` (default: the current folder).
        paths: Vec<PathBuf>,
        /// Also kill each case once after every journal entry (SIGKILL, in a child process),
        /// resume it, and check it reaches the same output and state, runs no completed call
        /// again, and treats every interrupted call as its tool's policy says.
        #[arg(long)]
        crash_each_point: bool,
        /// Write the results as JUnit XML to this file.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
    },
    /// Explain an error code (`store.busy`, `approval.no_reviewer`...), or list them all.
    Codes {
        /// The code to explain; without it every code is listed, by area.
        code: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print what the model is sent for a goal: the composed Solution schema (structured mode)
    /// or the native function definitions (tool mode), as JSON.
    Schema {
        /// The goal file (JSON).
        goal: PathBuf,
        /// Which mode's schema (default: the goal's `mode`, else structured).
        #[arg(long, value_enum)]
        mode: Option<ModeArg>,
    },
    /// List stored runs: waiting first, then newest.
    Runs {
        /// Prune instead of listing.
        #[command(subcommand)]
        action: Option<RunsAction>,
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
        /// Only runs with this status (comma-separated for several): waiting, running,
        /// stopped, finished, or an ending (succeeded, cancelled, timeout...).
        #[arg(long)]
        status: Option<String>,
        /// Only runs whose id or title contains this text.
        #[arg(long)]
        query: Option<String>,
        /// At most this many runs (1 to 500; default 50).
        #[arg(long)]
        limit: Option<String>,
        /// Print the store's size instead: database and WAL files, runs by status, journal
        /// bytes.
        #[arg(long)]
        stats: bool,
    },
    /// A stored run's timeline, critical path, state and output.
    Show {
        /// The run id.
        run: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// List the run's decisions and grants instead: who, through which channel, when, and
        /// the rule or grant each came from.
        #[arg(long)]
        audit: bool,
        /// Print the run's trace: its OpenTelemetry trace id and critical path, named as the
        /// exported spans are (`docs/observability.md`).
        #[arg(long)]
        trace: bool,
        /// Where the run is driven (`--engine temporal`: ask its workflow).
        #[command(flatten)]
        temporal: TemporalArgs,
    },
    /// Write a stored run as a cassette: DIR/model.json (its model turns, a scripted-model
    /// file) and DIR/tools.json (its tool results), for `run --model scripted:DIR/model.json
    /// --tools-from DIR/tools.json`.
    Export {
        /// The run id.
        run: String,
        /// The folder to write (created if needed).
        #[arg(long, value_name = "DIR")]
        cassette: PathBuf,
    },
    /// Re-run a stored run's journal through fresh machines, offline (no model, no tool):
    /// prints `identical` (exit 0) or the first divergence (exit 1).
    Replay {
        /// The run id.
        run: String,
    },
    /// The approval policy: `policy explain GOAL --call JSON` says which rule decides a call.
    Policy {
        /// What to do.
        #[command(subcommand)]
        what: PolicyArg,
    },
    /// Record a decision about a call of a stored run (checked against the run first).
    Decide {
        /// The run id.
        run: String,
        /// The call id.
        call: u64,
        /// The decision.
        #[command(subcommand)]
        decision: DecideArg,
        /// Where the run is driven (`--engine temporal`: an update to its workflow).
        #[command(flatten)]
        temporal: TemporalArgs,
    },
    /// Give a grant in a stored run (checked against the run first): approve every call of a
    /// tool (`--tool NAME [--when SCHEMA]`), or a call awaiting a decision and the calls
    /// waiting on it, as they stand now (`--call ID --with-dependents`).
    Grant(grant_cmd::GrantArgs),
    /// Revoke a grant of a stored run: calls presented from now on are no longer covered by it.
    Revoke(grant_cmd::RevokeArgs),
    /// Run workflows and activities of runs started with `--engine temporal` (until Ctrl-C or
    /// SIGTERM; build feature `temporal`).
    Worker {
        /// Where to poll.
        #[command(flatten)]
        temporal: TemporalArgs,
    },
    /// Check a goal file, or a plan (a Solution or an array of calls), without running anything.
    Validate {
        /// The goal or plan file.
        file: PathBuf,
        /// The goal whose tools and data a plan is checked against.
        #[arg(long)]
        goal: Option<PathBuf>,
        /// Check the goal as a run with the shell activity allowed would be.
        #[arg(long)]
        allow_shell: bool,
    },
    /// Print a plan's dependency graph.
    Graph {
        /// The goal or plan file.
        file: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value = "mermaid")]
        format: GraphFormat,
    },
    /// Serve the HTTP API and the reviewer page (runs are kept in the store and continued
    /// after a restart). `DAGLOOP_TOKEN` sets the bearer token every API call must carry.
    Serve {
        /// Address to listen on (a non-loopback address needs DAGLOOP_TOKEN).
        #[arg(long, default_value = "127.0.0.1:8080")]
        addr: std::net::SocketAddr,
        /// Accept goals whose tools use the shell activity.
        #[arg(long)]
        allow_shell: bool,
        /// Also answer requests whose `Host` is NAME (any port) or NAME:PORT (repeatable);
        /// localhost, 127.0.0.1, [::1] and the listening address are always allowed, any other
        /// Host gets 421 (a defence against DNS rebinding).
        #[arg(long = "allow-host", value_name = "NAME")]
        allow_host: Vec<String>,
        /// A JSON file listing principals: `[{"name", "token_sha256", "roles": ["submit" |
        /// "review" | "admin"]}]` (token_sha256: lowercase hex SHA-256 of the bearer token).
        #[arg(long, value_name = "FILE")]
        principals: Option<PathBuf>,
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
    pub(crate) fn new(code: impl Into<String>, message: impl ToString) -> Self {
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
    outln!("{}", pretty(&e.to_json()));
    2
}

/// Runs a parsed command; returns the process exit code (0 success, 1 the run or check did not
/// succeed, 2 bad input, 141 stdout was closed before everything was printed).
pub async fn main(cli: Cli) -> i32 {
    let store = || open_store(cli.store.as_deref(), cli.no_store, false);
    // `show`, `runs`, `decide` and `resume` only read or continue runs: a store file that does
    // not exist is refused (`store.not_found`), not created empty at a mistyped path.
    let existing = || open_store(cli.store.as_deref(), cli.no_store, true);
    crate::telemetry::logs::init(match cli.log_format {
        LogFormatArg::Text => crate::telemetry::logs::LogFormat::Text,
        LogFormatArg::Json => crate::telemetry::logs::LogFormat::Json,
    });
    let config = match crate::telemetry::init_from_env()
        .map_err(|e| CliError::new(e.code(), e))
        .and_then(|_| load_config(cli.config.as_deref()))
    {
        Ok(c) => c,
        Err(e) => {
            outln!("{}", pretty(&e.to_json()));
            return if out::stdout_closed() {
                out::BROKEN_PIPE_EXIT
            } else {
                2
            };
        }
    };
    let config = config.as_ref();
    let outcome = match cli.command {
        Command::Run {
            goal,
            model,
            approve,
            json,
            quiet,
            events,
            allow_shell,
            detach,
            decisions,
            on_no_reviewer,
            mode,
            tools_from,
            tools_from_passthrough,
            input,
            temporal,
        } => 'run: {
            let input = match input
                .as_deref()
                .map(serde_json::from_str::<Value>)
                .transpose()
            {
                Ok(i) => i,
                Err(e) => {
                    break 'run Err(CliError::new(
                        "cli.bad_input",
                        format!("--input is not JSON: {e}"),
                    ));
                }
            };
            let tools_from =
                match cassette::load_tools(tools_from.as_deref(), tools_from_passthrough) {
                    Ok(t) => t,
                    Err(e) => break 'run Err(e),
                };
            if tools_from.is_some() && temporal.engine == EngineArg::Temporal {
                break 'run Err(CliError::new(
                    "cli.usage",
                    "--tools-from answers calls in this process: it works with the embedded engine only",
                ));
            }
            let opts = run::RunOptions {
                server: false,
                model,
                approve: run::approve_name(approve),
                allow_shell,
                mode: mode.map(run::mode_name),
                ..Default::default()
            };
            let display = run::Display {
                json_only: json,
                quiet,
                events,
                detach,
                decisions,
                reject_without_reviewer: on_no_reviewer == NoReviewer::Reject,
                tools_from,
                webhook: config.and_then(|c| c.notify.webhook.clone()),
            };
            if temporal.engine == EngineArg::Temporal {
                if input.is_some() {
                    break 'run Err(CliError::new(
                        "cli.usage",
                        "--input works with the embedded engine only",
                    ));
                }
                temporal_cmd::run(&goal, opts, &display, &temporal).await
            } else {
                match (store(), grants_for(config, allow_shell, false)) {
                    (Ok(s), Ok(g)) => {
                        run::run(run::Start::New(goal, input), opts, g, display, s).await
                    }
                    (Err(e), _) | (_, Err(e)) => Err(e),
                }
            }
        }
        Command::Resume {
            run: id,
            model,
            approve,
            json,
            quiet,
            events,
            allow_shell,
            detach,
            decisions,
            accept_changes,
            on_no_reviewer,
            mode,
            tools_from,
            tools_from_passthrough,
        } => 'resume: {
            let tools_from =
                match cassette::load_tools(tools_from.as_deref(), tools_from_passthrough) {
                    Ok(t) => t,
                    Err(e) => break 'resume Err(e),
                };
            let display = run::Display {
                json_only: json,
                quiet,
                events,
                detach,
                decisions,
                reject_without_reviewer: on_no_reviewer == NoReviewer::Reject,
                tools_from,
                webhook: config.and_then(|c| c.notify.webhook.clone()),
            };
            let over = run::RunOptions {
                server: false,
                model,
                approve: run::approve_name(approve),
                allow_shell,
                mode: mode.map(run::mode_name),
                ..Default::default()
            };
            resume(&id, existing(), over, accept_changes, config, display).await
        }
        Command::Fork {
            run: id,
            at_step,
            model,
            input,
            json,
            quiet,
            allow_shell,
            decisions,
            on_no_reviewer,
            tools_from,
            tools_from_passthrough,
        } => 'fork: {
            let tools_from =
                match cassette::load_tools(tools_from.as_deref(), tools_from_passthrough) {
                    Ok(t) => t,
                    Err(e) => break 'fork Err(e),
                };
            let display = run::Display {
                json_only: json,
                quiet,
                events: None,
                detach: false,
                decisions,
                reject_without_reviewer: on_no_reviewer == NoReviewer::Reject,
                tools_from,
                webhook: config.and_then(|c| c.notify.webhook.clone()),
            };
            let over = fork::Over {
                at_step,
                model,
                input,
                allow_shell,
            };
            match required(existing()) {
                Ok(s) => fork::fork(s, &id, over, config, display).await,
                Err(e) => Err(e),
            }
        }
        Command::Test {
            paths,
            crash_each_point,
            junit,
        } => {
            test_cmd::test(
                &paths,
                crash_each_point,
                junit.as_deref(),
                cli.config.as_deref(),
            )
            .await
        }
        Command::Runs {
            action,
            json,
            status,
            query,
            limit,
            stats,
        } => match (required(existing()), action) {
            (Ok(s), None) if stats => s
                .stats()
                .map(|v| {
                    outln!("{}", pretty(&v));
                    0
                })
                .map_err(|e| CliError::new(e.code(), e)),
            (Ok(s), None) => {
                let mut params = Vec::new();
                for (k, v) in [("status", status), ("q", query), ("limit", limit)] {
                    if let Some(v) = v {
                        params.push((k, v));
                    }
                }
                runs::list(&s, &params, json)
            }
            (
                Ok(s),
                Some(RunsAction::Prune {
                    retain,
                    compact_after,
                }),
            ) => runs::prune(&s, retain.as_deref(), compact_after.as_deref(), config),
            (Ok(s), Some(RunsAction::Compact { runs: ids })) => runs::compact(&s, &ids),
            (Err(e), _) => Err(e),
        },
        Command::Show {
            run: id,
            json,
            temporal,
            ..
        } if temporal.engine == EngineArg::Temporal => {
            temporal_cmd::show(&id, json, &temporal).await
        }
        Command::Export { run: id, cassette } => {
            required(existing()).and_then(|s| cassette::export(&*s.shared(), &id, &cassette))
        }
        Command::Replay { run: id } => {
            required(existing()).and_then(|s| replay::replay(&*s.shared(), &id))
        }
        Command::Show {
            run: id,
            json,
            audit: true,
            ..
        } => required(existing()).and_then(|s| runs::audit(&s, &id, json)),
        Command::Show {
            run: id,
            json,
            trace,
            ..
        } => required(existing()).and_then(|s| runs::show(&s, &id, json, trace)),
        Command::Policy {
            what:
                PolicyArg::Explain {
                    goal,
                    call,
                    approve,
                    json,
                },
        } => policy_cmd::explain(&goal, &call, run::approve_name(approve), json),
        Command::Decide {
            run: id,
            call,
            decision,
            temporal,
        } if temporal.engine == EngineArg::Temporal => match decision_of(decision) {
            Ok(d) => {
                let op = crate::protocol::Op::Decide {
                    call: crate::protocol::CallId(call),
                    decision: d,
                    presented: None,
                    by: Some(me(crate::protocol::Actor::CLI)),
                };
                temporal_cmd::decide(&id, op, &temporal).await
            }
            Err(e) => Err(e),
        },
        Command::Worker { temporal } => match grants_for(config, false, true) {
            Ok(g) => temporal_cmd::worker(&temporal, g).await,
            Err(e) => Err(e),
        },
        Command::Decide {
            run: id,
            call,
            decision,
            ..
        } => match (required(existing()), decision_of(decision)) {
            (Ok(s), Ok(d)) => runs::decide(
                &s,
                &id,
                crate::protocol::Op::Decide {
                    call: crate::protocol::CallId(call),
                    decision: d,
                    presented: None,
                    by: Some(me(crate::protocol::Actor::CLI)),
                },
            ),
            (Err(e), _) | (_, Err(e)) => Err(e),
        },
        Command::Grant(a) => grant_cmd::grant(a, existing()).await,
        Command::Revoke(a) => grant_cmd::revoke(a, existing()).await,
        Command::Schema { goal, mode } => schema_cmd::schema(&goal, mode),
        Command::Codes { code, json } => codes_cmd::codes(code.as_deref(), json),
        Command::Validate {
            file,
            goal,
            allow_shell,
        } => {
            grants_for(config, allow_shell, false).and_then(|g| validate(&file, goal.as_deref(), g))
        }
        Command::Graph { file, format } => graph(&file, format),
        Command::MockLlm { script, port } => mock_llm(&script, port).await,
        Command::Serve {
            addr,
            allow_shell,
            allow_host,
            principals,
        } => match grants_for(config, allow_shell, true) {
            Ok(g) => {
                serve(
                    addr,
                    g,
                    config,
                    allow_host,
                    principals.as_deref(),
                    cli.store.as_deref(),
                    cli.no_store,
                )
                .await
            }
            Err(e) => Err(e),
        },
    };
    let code = match outcome {
        Ok(code) => code,
        Err(e) => {
            outln!("{}", pretty(&e.to_json()));
            if e.code.starts_with("op.") { 1 } else { 2 }
        }
    };
    if out::stdout_closed() {
        out::BROKEN_PIPE_EXIT
    } else {
        code
    }
}

/// The run store a command uses, and where it lives (for messages).
#[derive(Clone)]
pub(super) struct Store {
    runs: Arc<dyn crate::store::RunStore>,
    path: std::path::PathBuf,
}

impl Store {
    /// The store's file.
    pub(super) fn path(&self) -> &FsPath {
        &self.path
    }

    /// The store, shared (a run's host, its journal's sink).
    pub(super) fn shared(&self) -> Arc<dyn crate::store::RunStore> {
        self.runs.clone()
    }
}

impl std::ops::Deref for Store {
    type Target = dyn crate::store::RunStore;
    fn deref(&self) -> &Self::Target {
        &*self.runs
    }
}

/// Opens the SQLite store at `path`.
#[cfg(feature = "sqlite")]
fn open_at(path: &FsPath) -> Result<Store, CliError> {
    crate::store::SqliteStore::open(path)
        .map(|s| Store {
            runs: Arc::new(s),
            path: path.to_path_buf(),
        })
        .map_err(|e| CliError::new(e.code(), e))
}

/// Without the `sqlite` feature there is no store to open: a command given one says so.
#[cfg(not(feature = "sqlite"))]
fn open_at(path: &FsPath) -> Result<Store, CliError> {
    Err(CliError::new(
        "cli.no_store",
        format!(
            "this dagloop was built without the `sqlite` feature, so it cannot open the run store {} (run with --no-store)",
            path.display()
        ),
    ))
}

/// The store the command uses: `--store`, else `DAGLOOP_STORE`, else the default file; none
/// with `--no-store`. With `existing`, a file that does not exist is `store.not_found`.
fn open_store(
    path: Option<&FsPath>,
    none: bool,
    existing: bool,
) -> Result<Option<Store>, CliError> {
    if none {
        return Ok(None);
    }
    let Some(path) = path
        .map(FsPath::to_path_buf)
        .or_else(crate::store::default_path)
    else {
        return Ok(None);
    };
    if existing {
        crate::store::must_exist(&path).map_err(|e| CliError::new(e.code(), e))?;
    }
    open_at(&path).map(Some)
}

fn required(s: Result<Option<Store>, CliError>) -> Result<Store, CliError> {
    s?.ok_or_else(|| {
        CliError::new(
            "cli.no_store",
            "this command needs the run store (drop --no-store, or give --store PATH)",
        )
    })
}

fn decision_of(d: DecideArg) -> Result<crate::protocol::Decision, CliError> {
    use crate::protocol::Decision;
    let json = |what: &str, text: &str| -> Result<Value, CliError> {
        serde_json::from_str(text)
            .map_err(|e| CliError::new("cli.bad_decision", format!("--{what} is not JSON: {e}")))
    };
    Ok(match d {
        DecideArg::Approve => Decision::Approve,
        DecideArg::Reject { reason } => Decision::Reject { reason },
        DecideArg::Edit { params } => match json("params", &params)? {
            Value::Object(params) => Decision::Edit { params },
            _ => {
                return Err(CliError::new(
                    "cli.bad_decision",
                    "--params must be a JSON object",
                ));
            }
        },
        DecideArg::Done { result } => Decision::Done {
            result: json("result", &result)?,
        },
        DecideArg::Replace { call } => Decision::Replace {
            call: Box::new(
                Call::parse(json("call", &call)?)
                    .map_err(|e| CliError::new("cli.bad_decision", format!("--call: {e}")))?,
            ),
        },
    })
}

async fn resume(
    id: &str,
    store: Result<Option<Store>, CliError>,
    over: run::RunOptions,
    accept_changes: bool,
    config: Option<&crate::config::Config>,
    display: run::Display,
) -> Result<i32, CliError> {
    let s = required(store)?;
    let finished = |r: &crate::machine::RunResult| {
        let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
        v["run_id"] = json!(id);
        outln!("{}", pretty(&v));
        Ok(if r.succeeded() { 0 } else { 1 })
    };
    let stored = match s.load(id) {
        // A compacted run is finished: its result is kept.
        Err(crate::store::StoreError::Compacted { .. }) => {
            if let Some(c) = s.compacted(id).map_err(|e| CliError::new(e.code(), e))? {
                return finished(&c.result);
            }
            s.load(id)
        }
        other => other,
    }
    .map_err(|e| CliError::new(e.code(), e))?;
    if let Some(r) = &stored.result {
        return finished(r);
    }
    // The lease decides who drives the run (`store.busy` while another process holds it); the
    // journal is read again once it is ours, so that no entry another process appended before
    // it let go is missed.
    s.claim(id).map_err(|e| CliError::new(e.code(), e))?;
    let stored = match s.load(id) {
        Ok(stored) => stored,
        Err(e) => {
            let _ = s.release(id);
            return Err(CliError::new(e.code(), e));
        }
    };
    if let Some(r) = &stored.result {
        let _ = s.release(id);
        return finished(r);
    }
    let mut opts = run::RunOptions::from_stored(&stored.record.options)
        .map_err(|e| CliError::new(e.code(), &e))?;
    if over.model.is_some() {
        opts.model = over.model;
    }
    if over.approve.is_some() {
        opts.approve = over.approve;
    }
    if over.mode.is_some() {
        opts.mode = over.mode;
    }
    opts.allow_shell |= over.allow_shell;
    if accept_changes {
        opts.definition.clear();
    }
    let grants = match grants_for(config, opts.allow_shell, false) {
        Ok(g) => g,
        Err(e) => {
            let _ = s.release(id);
            return Err(e);
        }
    };
    let ran = run::run(
        run::Start::Resume(Box::new(stored)),
        opts,
        grants,
        display,
        Some(s.clone()),
    )
    .await;
    if ran.is_err() {
        // Refused before it was driven (no reviewer, a goal that no longer loads, a definition
        // that changed...): the next process may take the run at once.
        let _ = s.release(id);
    }
    ran
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
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

fn validate(
    file: &FsPath,
    goal: Option<&FsPath>,
    grants: Arc<crate::grants::Grants>,
) -> Result<i32, CliError> {
    let other_goal = goal
        .map(|p| Goal::load(p).map_err(|e| CliError::new(e.code(), &e)))
        .transpose()?;
    if is_script_file(file) {
        let findings = check::check_script_file(file, other_goal.as_ref().map(|g| &g.tools[..]));
        return Ok(report(json!({"kind": "scripted-model"}), findings));
    }
    let (calls, own_goal) = load_plan(file)?;
    let (kind, findings) = match (own_goal, other_goal) {
        (Some(g), _) => {
            // The grants first, as `run` checks them: nothing the goal names outside them is
            // opened.
            if let Err(e) = crate::runs::define(g.clone(), run::RunOptions::default(), grants) {
                let finding = check::Finding {
                    code: e.code(),
                    call: None,
                    tool: None,
                    turn: None,
                    message: e.to_string(),
                };
                return Ok(report(
                    json!({"kind": "goal", "calls": calls.len()}),
                    vec![finding],
                ));
            }
            ("goal", check::check_goal(&g))
        }
        (None, Some(g)) => (
            "plan",
            check::check_plan(&calls, Some(&g.tools), &check::initial_data(&g)),
        ),
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
    outln!("{}", pretty(&head));
    if ok { 0 } else { 1 }
}

fn graph(file: &FsPath, format: GraphFormat) -> Result<i32, CliError> {
    let (calls, goal) = load_plan(file)?;
    let text = match format {
        GraphFormat::Mermaid => check::mermaid(&calls, goal.as_ref()),
        GraphFormat::Dot => check::dot(&calls, goal.as_ref()),
    };
    out!("{text}");
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
    outln!(
        "{}",
        json!({"status": "listening", "base_url": server.base_url()})
    );
    tokio::select! {
        r = server.wait() => r.map_err(|e| CliError::new("cli.serve", e))?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(0)
}

/// The user at this terminal (`$USER`, else `local`) as the author of a decision.
pub(crate) fn me(channel: &str) -> crate::protocol::Actor {
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| "local".into());
    crate::protocol::Actor::new(user, channel)
}

#[cfg(feature = "server")]
async fn serve(
    addr: std::net::SocketAddr,
    grants: Arc<crate::grants::Grants>,
    config: Option<&crate::config::Config>,
    allowed_hosts: Vec<String>,
    principals: Option<&FsPath>,
    store: Option<&FsPath>,
    no_store: bool,
) -> Result<i32, CliError> {
    let store = match (
        no_store,
        store
            .map(FsPath::to_path_buf)
            .or_else(crate::store::default_path),
    ) {
        (false, Some(p)) => p,
        _ => {
            return Err(CliError::new(
                "cli.no_store",
                "the server keeps its runs in the store (drop --no-store, or give --store PATH)",
            ));
        }
    };
    let token = std::env::var("DAGLOOP_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    // Principals and Host names: the operator's config, then the command line's.
    let mut principals = match principals {
        Some(p) => read_principals(p)?,
        None => Vec::new(),
    };
    let mut allowed_hosts = allowed_hosts;
    if let Some(c) = config {
        for (i, v) in c.principals.iter().enumerate() {
            let p = serde_json::from_value(v.clone()).map_err(|e| {
                CliError::new(
                    "cli.bad_principals",
                    format!("the config's principals[{i}]: {e}"),
                )
            })?;
            principals.insert(i, p);
        }
        allowed_hosts.extend(c.allowed_hosts.iter().cloned());
    }
    let base_dir = std::env::current_dir().unwrap_or_default();
    let agents = config
        .map(|c| {
            c.agents
                .keys()
                .filter_map(|name| Some((name.clone(), c.agent_goal(name)?)))
                .collect()
        })
        .unwrap_or_default();
    crate::server::serve(crate::server::ServeOptions {
        addr,
        store,
        token,
        principals,
        allowed_hosts,
        grants,
        agents,
        base_dir,
        webhook: config.and_then(|c| c.notify.webhook.clone()),
        retention: config
            .and_then(|c| c.store.retention().ok())
            .unwrap_or_default(),
    })
    .await
    .map_err(|e| CliError::new(e.code(), e))?;
    Ok(0)
}

/// `--principals FILE`: a JSON array of principals.
#[cfg(feature = "server")]
fn read_principals(path: &FsPath) -> Result<Vec<crate::server::PrincipalConfig>, CliError> {
    let bad = |reason: String| {
        CliError::new(
            "cli.bad_principals",
            format!("{}: {reason}", path.display()),
        )
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| bad(e.to_string()))
}

#[cfg(not(feature = "server"))]
async fn serve(
    _addr: std::net::SocketAddr,
    _grants: Arc<crate::grants::Grants>,
    _config: Option<&crate::config::Config>,
    _allowed_hosts: Vec<String>,
    _principals: Option<&FsPath>,
    _store: Option<&FsPath>,
    _no_store: bool,
) -> Result<i32, CliError> {
    Err(CliError::new(
        "cli.feature_disabled",
        "serve needs the `server` feature",
    ))
}

#[cfg(not(feature = "server"))]
async fn mock_llm(_script: &FsPath, _port: u16) -> Result<i32, CliError> {
    Err(CliError::new(
        "cli.feature_disabled",
        "mock-llm needs the `server` feature",
    ))
}
