//! The command line's arguments, as clap parses them: the global flags and every subcommand
//! with its options.
//!
//! Deliberately not here: what a command does (`cli::main` and the command modules).

use super::*;

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

/// `run --carry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CarryArg {
    /// The run's final state.
    State,
    /// A summary of the session's history.
    History,
    /// Both.
    Both,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormatArg {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
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
    /// Do not run it; tell the model to do it differently (not a veto).
    SendBack {
        /// What the model should do differently.
        #[arg(long)]
        feedback: String,
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
    /// Which rule decides a call (allow, ask or deny), which layer it belongs to (the
    /// operator's floor from `--config`: server-wide, agent, MCP tool, tool kind; or the goal,
    /// or the client's `--approve`) and why, with the rules passed over before it.
    Explain {
        /// The goal file (default with `--agent`: the agent's goal file from the config).
        #[arg(required_unless_present = "agent")]
        goal: Option<PathBuf>,
        /// The call, as JSON: `{"_tool": NAME, ...params}`.
        #[arg(long)]
        call: String,
        /// Override the policy's mode, as `run --approve` (a client's `approve`) does.
        #[arg(long, value_enum)]
        approve: Option<ApproveArg>,
        /// Explain the call in a run of this agent the config publishes (its floor applies).
        #[arg(long)]
        agent: Option<String>,
        /// The MCP server (by the operator's name) whose tool the call names, when the goal does
        /// not define the tool (default: the goal's only MCP server).
        #[arg(long)]
        server: Option<String>,
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
    /// Reach Temporal over TLS (implied by the other --temporal-tls-* options and by an API key in
    /// `TEMPORAL_API_KEY`, which Temporal Cloud takes).
    #[arg(long = "temporal-tls")]
    pub tls: bool,
    /// A PEM file with the CA of the Temporal server's certificate (else the system's roots).
    #[arg(long = "temporal-tls-ca", value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// The client certificate (PEM) for mutual TLS (with --temporal-tls-key).
    #[arg(long = "temporal-tls-cert", value_name = "FILE")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The client's private key (PEM) for mutual TLS (with --temporal-tls-cert).
    #[arg(long = "temporal-tls-key", value_name = "FILE")]
    pub tls_key: Option<std::path::PathBuf>,
    /// The name the server's certificate is checked against (else the address's host).
    #[arg(long = "temporal-tls-domain", value_name = "NAME")]
    pub tls_domain: Option<String>,
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

    /// How to reach the cluster: the --temporal-tls* options, and the API key in `TEMPORAL_API_KEY`.
    #[cfg(feature = "temporal")]
    pub fn access(&self) -> crate::temporal::Access {
        crate::temporal::Access {
            tls: self.tls,
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            domain: self.tls_domain.clone(),
            api_key: std::env::var(crate::temporal::API_KEY_ENV)
                .ok()
                .filter(|k| !k.trim().is_empty()),
        }
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
        /// The goal file (JSON). With --continue: a goal file, or the follow-up's instruction
        /// in words (the run's goal with this as its goal text).
        #[arg(value_name = "GOAL_OR_TEXT")]
        goal: PathBuf,
        /// Continue this finished run in its session (docs/sessions.md): the follow-up starts
        /// from its final state with a summary of its history in context.
        #[arg(long = "continue", value_name = "RUN", conflicts_with = "input")]
        continue_from: Option<String>,
        /// With --continue: what carries over from the run (state, history or both).
        #[arg(long, value_enum, requires = "continue_from", default_value = "both")]
        carry: CarryArg,
        /// With --continue: refuse at once (`session.busy`) instead of waiting while a run of
        /// the session has not finished.
        #[arg(long, requires = "continue_from")]
        no_wait: bool,
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
        /// When another live process drives the run, refuse at once (`store.busy`) instead of
        /// waiting for it to let go.
        #[arg(long)]
        no_wait: bool,
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
        /// Where the original runs (`--engine temporal`: the fork is a new workflow).
        #[command(flatten)]
        temporal: TemporalArgs,
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
        /// Only the runs of this session (its first run and its follow-ups).
        #[arg(long, value_name = "RUN")]
        session: Option<String>,
    },
    /// A stored run's timeline, critical path, state and output.
    Show {
        /// The run id.
        run: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// List the run's decisions and standing approvals instead: who, through which
        /// channel, when, and the rule or standing approval each came from.
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
        /// The call id, as printed (`c2`) or as a number (`2`).
        #[arg(value_parser = call_id)]
        call: u64,
        /// The presentation the decision answers: the `seq` of the call's `approval_requested`
        /// event (`presentation` in `dagloop show --json`'s awaiting calls). Without it, the
        /// decision answers the presentation awaiting a decision when it is checked.
        #[arg(long, global = true)]
        presentation: Option<u64>,
        /// The decision.
        #[command(subcommand)]
        decision: DecideArg,
        /// Where the run is driven (`--engine temporal`: an update to its workflow).
        #[command(flatten)]
        temporal: TemporalArgs,
    },
    /// Give a standing approval in a stored run (checked against the run first): approve every
    /// call of a tool (`--tool NAME [--when SCHEMA]`), or a call awaiting a decision and the
    /// calls waiting on it, as they stand now (`--call ID --with-dependents`).
    #[command(alias = "grant")]
    Allow(allow_cmd::AllowArgs),
    /// Revoke a standing approval of a stored run: calls presented from now on are no longer
    /// covered by it.
    Revoke(allow_cmd::RevokeArgs),
    /// Run workflows and activities of runs started with `--engine temporal` (until Ctrl-C or
    /// SIGTERM; build feature `temporal`).
    Worker {
        /// Where to poll.
        #[command(flatten)]
        temporal: TemporalArgs,
    },
    /// Write a first goal into DIR (default: the current folder): goal.json, its scripted model
    /// (script.json), the services' recorded answers (tools.json) and a test case (test.json).
    /// Refuses to overwrite any file (the walk-through: docs/tutorial.md).
    Init {
        /// The folder to write (created if needed).
        dir: Option<PathBuf>,
    },
    /// Workspace memory: the chunks a goal's `memory` folder is cut into (`index`), and those a
    /// run of the goal would put into its context (`search`).
    Memory {
        /// What to show.
        #[command(subcommand)]
        action: memory_cmd::MemoryArg,
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
    /// Print a plan's dependency graph, or what a stored run did (its calls, their status and
    /// the data that flowed between them).
    Graph {
        /// The goal or plan file, or a stored run's id.
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
        /// Where runs are driven (`--engine temporal`: every run a Temporal workflow run by
        /// `dagloop worker`s; nothing of a run kept in this process, so several servers serve
        /// the same runs).
        #[command(flatten)]
        temporal: TemporalArgs,
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

/// A call id as dagloop prints it (`c2`) or as a number (`2`).
fn call_id(given: &str) -> Result<u64, String> {
    given
        .strip_prefix('c')
        .unwrap_or(given)
        .parse::<u64>()
        .map_err(|_| {
            format!("`{given}` is not a call id (write it as dagloop prints it, `c2`, or as `2`)")
        })
}

impl Command {
    /// The run a command names in the embedded store (`show`, `decide`, `resume`, `fork`,
    /// `export`, `replay`), to be completed from a unique prefix of its id; None for other
    /// commands and for runs on Temporal.
    pub fn run_mut(&mut self) -> Option<&mut String> {
        match self {
            Command::Show { temporal, .. } | Command::Decide { temporal, .. }
                if temporal.engine == EngineArg::Temporal =>
            {
                None
            }
            Command::Run {
                continue_from: Some(run),
                ..
            }
            | Command::Resume { run, .. }
            | Command::Fork { run, .. }
            | Command::Show { run, .. }
            | Command::Export { run, .. }
            | Command::Replay { run }
            | Command::Decide { run, .. } => Some(run),
            _ => None,
        }
    }
}

#[cfg(test)]
mod call_id_tests {
    use super::call_id;

    #[test]
    fn call_ids_read_as_printed_or_as_numbers() {
        assert_eq!(call_id("c2"), Ok(2));
        assert_eq!(call_id("17"), Ok(17));
        for bad in ["", "c", "cc2", "two", "c-1", "2c"] {
            assert!(call_id(bad).is_err(), "{bad}");
        }
    }
}
