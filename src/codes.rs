//! Every stable error code dagloop gives, in one registry, and the trait its errors share.
//!
//! A code is `area.snake_case`: the area says which part of dagloop refused (the goal, the
//! model, the store...), the rest says why. Programs match on codes, never on messages, so a
//! code is a promise: it keeps its meaning across releases. This module lists each with one
//! line on what it means and what to do; `dagloop codes [CODE]` prints them and
//! `docs/codes.md` is generated from here (a test keeps the two equal, and another fails when
//! the source gives a code this list does not hold, or holds one nothing gives).
//!
//! It deliberately knows nothing of the modules above it: each error type implements
//! [`HasCode`] where it is defined (the [`has_code!`](crate::codes::has_code) macro), so
//! dependencies keep pointing down.

/// An error that carries a stable code (one of [`CODES`]).
pub trait HasCode {
    /// The code, `area.snake_case`.
    fn code(&self) -> &str;
}

/// Implements [`HasCode`] for error types that already have an inherent `code()`.
macro_rules! has_code {
    ($($t:ty),* $(,)?) => {
        $(impl $crate::codes::HasCode for $t {
            fn code(&self) -> &str {
                <$t>::code(self)
            }
        })*
    };
}
pub(crate) use has_code;

/// One registered code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code {
    /// `area.snake_case`.
    pub code: &'static str,
    /// What it means and, where there is something to do, what to do.
    pub meaning: &'static str,
}

/// The code's entry, if it is registered.
pub fn lookup(code: &str) -> Option<&'static Code> {
    CODES.iter().find(|c| c.code == code)
}

/// The areas, in the order [`CODES`] lists them, each with a line on what it covers.
pub const AREAS: &[(&str, &str)] = &[
    (
        "activity",
        "a tool's activity (http, shell, file, MCP, delegate) failed or was misconfigured",
    ),
    (
        "agent",
        "an agent could not be built from its parts (library callers)",
    ),
    (
        "approval",
        "the approval policy, its rules, or a reviewer's verdict",
    ),
    ("auth", "a server request's credentials"),
    ("cassette", "a recorded cassette (`--tools-from`)"),
    (
        "cli",
        "the command line itself: arguments and files it reads or writes",
    ),
    ("config", "the operator's configuration file"),
    ("duration", "a duration given in seconds"),
    ("fork", "`dagloop fork`"),
    ("goal", "a goal file"),
    ("grant", "what the operator's grants allow a goal to touch"),
    ("graph", "the dependency graph of a step's calls"),
    ("hook", "a library caller's hook"),
    (
        "http",
        "HTTP: the server's request checks, and the http tool's transport",
    ),
    ("llm", "the model: providers, streams, scripted models"),
    ("mcp", "MCP servers and their tools"),
    ("memory", "a goal's workspace memory folder (`memory`)"),
    ("model", "`dagloop validate` on a scripted-model file"),
    (
        "notify",
        "the webhook that announces calls waiting for a reviewer",
    ),
    (
        "op",
        "a decision, standing approval or other op sent to a run",
    ),
    ("plan", "the model's plan: parsing it and checking it"),
    ("protocol", "a call's or output's protocol fields"),
    ("reference", "a `†` reference in a call's params"),
    ("replay", "`dagloop replay`: where a replayed run diverged"),
    ("run", "how a run ended, or why it could not go on"),
    ("runs", "listing and rebuilding stored runs"),
    (
        "scheduler",
        "a call the scheduler refused or could not finish",
    ),
    (
        "schema",
        "JSON Schemas: the output schema and tools' params schemas",
    ),
    (
        "script",
        "`dagloop validate` on a scripted-model file's plans",
    ),
    ("server", "`dagloop serve`: start-up and internal failures"),
    (
        "session",
        "sessions: follow-up runs on a finished run (`run --continue`)",
    ),
    ("store", "the SQLite store of runs"),
    ("telemetry", "OpenTelemetry export settings"),
    ("temporal", "the Temporal engine"),
    ("test", "`dagloop test` cases"),
];

macro_rules! codes {
    ($($code:literal => $meaning:literal,)*) => {
        /// Every stable code, sorted by area then name.
        pub const CODES: &[Code] = &[$(Code { code: $code, meaning: $meaning },)*];
    };
}

codes! {
    "activity.bad_params" => "The tool's activity cannot use the call's params (a URL that does not parse, a command that is not a list of strings).",
    "activity.cancelled" => "The call was cancelled while it ran (the run ended or was stopped).",
    "activity.config" => "The tool is configured in a way its activity cannot run (for example delegates nested too deep).",
    "activity.failed" => "The tool's activity failed; `details` says how (exit code, HTTP status, the MCP server's error).",
    "activity.shell_disabled" => "A shell tool was called but shell tools are not allowed here (`--allow-shell` or the config's grants).",
    "activity.timeout" => "The call ran longer than its timeout (`_timeout_s`, `limits.call_timeout_s`); its process group was killed.",
    "activity.unknown" => "No activity is registered under the tool's name (library callers: register one).",
    "activity.unknown_kind" => "The tool's `_activity` kind is not one dagloop knows (http, shell, file, mcp, delegate).",
    "agent.delegate" => "A delegate tool's goal could not be loaded or built.",
    "agent.missing_activity" => "A tool has no activity to run it (library callers: register one or give the tool a kind).",
    "agent.no_approver" => "The policy asks a reviewer but the builder was given none.",
    "agent.no_model" => "The builder was given no model.",
    "approval.allow_without_allowlist" => "An `allow` policy was given without the list of tools it allows.",
    "approval.bad_edit" => "A reviewer's edit does not fit the tool (its params fail the tool's schema).",
    "approval.bad_mode" => "The approval policy names a mode dagloop does not know (auto, allowlist or ask, or rules).",
    "approval.bad_rule" => "An approval rule is malformed (bad glob, `when` is not a JSON Schema, unknown decision).",
    "approval.bad_timeout" => "The approval timeout is not a positive number of seconds.",
    "approval.malformed" => "The approval policy is not an object or string dagloop understands.",
    "approval.no_reviewer" => "A call needs a reviewer and none can be asked (no terminal, no `--decisions`, not the server); start it where a reviewer can decide.",
    "approval.own_run" => "Separation of duties (`[approval] separate_duties`): a principal may not decide calls of a run it submitted nor approve them ahead; another reviewer must.",
    "approval.rejected" => "A reviewer (or a `deny` rule) rejected the call.",
    "approval.rule_example" => "A rule's `examples` disagree with the rule: an example that must match does not, or one that must not does.",
    "approval.rule_matches_nothing" => "`dagloop validate`: an approval rule's `tool` pattern matches none of the goal's tools, or uses `[`/`{` (only `*` and `?` are wildcards), so it decides nothing.",
    "approval.sent_back" => "A reviewer sent the call back with feedback: it did not run, and the model is told to do it differently (not a veto).",
    "auth.forbidden" => "The server knows who you are, and your roles do not allow this request.",
    "auth.invalid" => "The bearer token is not one the server knows.",
    "auth.missing" => "The request carries no credentials and the server requires them.",
    "auth.ticket" => "The page's stream ticket is missing, expired or for another run.",
    "cassette.invalid" => "A `--tools-from` file is not a cassette recording.",
    "cassette.miss" => "The recording holds no outcome for this tool and these resolved params (add `--tools-from-passthrough` to run such calls for real).",
    "cli.ambiguous_run" => "The run named is the start of several run ids; give more of the id (`dagloop runs` lists them).",
    "cli.bad_call" => "`--call` is not a JSON call object.",
    "cli.bad_decision" => "A decision given on the command line is not valid JSON or not a decision.",
    "cli.bad_decisions" => "The `--decisions` file cannot be read or is not a decisions file.",
    "cli.bad_duration" => "A duration argument (like `--older-than`) is not a number with a unit (s, m, h, d).",
    "cli.bad_input" => "`--input` is not JSON.",
    "cli.bad_principals" => "The server's principals file cannot be read or is malformed.",
    "cli.bad_standing_approval" => "`dagloop allow`'s arguments do not make a standing approval (`--tool` or `--call ID --with-dependents`; `--when` must be a JSON Schema).",
    "cli.bind" => "The server cannot listen on the address given.",
    "cli.events_file" => "The `--events` file cannot be written.",
    "cli.exists" => "`dagloop init` would overwrite a file that exists; it wrote nothing (choose another folder).",
    "cli.feature_disabled" => "The command needs a feature this binary was built without (for example `temporal`).",
    "cli.junit_file" => "The `--junit` file cannot be written.",
    "cli.no_store" => "The command needs a store and none is given (`--store` or `DAGLOOP_STORE`).",
    "cli.not_found" => "A file or folder named on the command line does not exist.",
    "cli.serve" => "The server stopped with an error.",
    "cli.unknown_code" => "`dagloop codes` was asked about a code dagloop does not give.",
    "cli.unreadable" => "A file named on the command line cannot be read.",
    "cli.unsupported" => "The options given cannot be used together (for example an option the Temporal engine does not support).",
    "cli.unwritable" => "A file or folder named on the command line cannot be written.",
    "cli.usage" => "The command line does not parse; the message says what to change.",
    "config.invalid" => "The operator's configuration file is not valid (the message names the field).",
    "config.not_found" => "The configuration file given does not exist.",
    "config.unreadable" => "The configuration file cannot be read.",
    "duration.out_of_range" => "A number of seconds is negative, not finite, or too large to wait for.",
    "fork.no_such_step" => "`--at-step` names a step the run did not reach.",
    "goal.invalid" => "The goal is not valid (the message names the field).",
    "goal.invalid_schema" => "The goal's output schema or a tool's params schema is not a valid JSON Schema.",
    "goal.not_found" => "The goal file does not exist.",
    "goal.tool_clash" => "Two tools of the goal (its own, its MCP servers', its delegates') have the same name.",
    "goal.unknown_meta_key" => "The goal uses a `_` key dagloop does not define; the message suggests the closest known one.",
    "goal.unreadable" => "The goal file cannot be read or is not JSON.",
    "grant.egress" => "The grants do not allow this address (private, loopback or not on the allow-list).",
    "grant.egress_url" => "An http tool's URL cannot be checked against the grants.",
    "grant.env" => "The goal reads an environment variable the grants do not give it.",
    "grant.env_host" => "A request would carry a granted variable's value to an address the operator did not grant it to (the env grant's `hosts`), or from a run that is not one of the published agents it is granted to (its `agents`); it was not sent.",
    "grant.file" => "The goal names a file outside the folders the grants allow.",
    "grant.mcp_server" => "The goal starts an MCP server the grants do not allow.",
    "grant.tool_kind" => "The goal uses a kind of tool (shell, file...) the grants do not allow.",
    "grant.unknown_mcp_server" => "The goal names an operator-defined MCP server the configuration does not define.",
    "graph.cycle" => "The calls' dependencies form a cycle.",
    "graph.duplicate" => "Two calls have the same id in one graph.",
    "graph.no_plan" => "`dagloop graph GOAL`: the goal has no `plan`, so there is nothing to draw before a run; draw a run instead (`dagloop graph RUN`).",
    "hook.before_tool" => "A library caller's `before_tool` hook refused the call.",
    "http.bad_body" => "The request body is not the JSON this endpoint takes.",
    "http.bad_host" => "The request's Host header is not one the server answers (DNS rebinding protection).",
    "http.bad_idempotency_key" => "The `Idempotency-Key` header is empty, too long, or not printable ASCII.",
    "http.bad_wait" => "The `wait` parameter is not a number of seconds the server accepts.",
    "http.idempotency_key_reused" => "An `Idempotency-Key` was used before with another body: use a new key for a new run.",
    "http.resolve" => "An http tool's host name did not resolve.",
    "http.too_large" => "An http tool's response is larger than its `max_bytes` (or the hard cap).",
    "http.transport" => "An http tool's request failed before a response (connection refused, TLS, reset).",
    "http.unsupported_media_type" => "A request with a body does not say `Content-Type: application/json`.",
    "llm.bad_sse" => "The provider's event stream is not valid server-sent events.",
    "llm.bad_tool_call" => "The provider returned a tool call whose arguments are not a JSON object.",
    "llm.context_overflow" => "The request is longer than the model's context window (the run compacts and asks again).",
    "llm.http_status" => "The provider answered with an HTTP error status (retried when it is transient).",
    "llm.idle_timeout" => "The provider's stream sent nothing for too long.",
    "llm.incomplete_stream" => "The provider's stream ended before its final event.",
    "llm.invalid_config" => "A provider could not be configured (a bad base URL, unusable characters in a key).",
    "llm.invalid_spec" => "A model spec (`provider:model`) is malformed.",
    "llm.line_too_long" => "A line of the provider's stream is longer than dagloop reads.",
    "llm.missing_api_key" => "The provider needs an API key and its variable is not set.",
    "llm.provider_error" => "The provider reported an error inside its stream.",
    "llm.script_exhausted" => "A scripted model was asked for more turns than its script holds.",
    "llm.script_invalid" => "A scripted-model file is not valid against its schema.",
    "llm.script_io" => "A scripted-model file cannot be read.",
    "llm.timeout" => "The model turn took longer than its timeout.",
    "llm.transport" => "The request to the provider failed before a response (connection refused, TLS, reset).",
    "llm.unknown_spec" => "A model spec names a provider dagloop does not know.",
    "mcp.call_failed" => "An MCP server failed a tool call.",
    "mcp.config" => "An MCP server's configuration is invalid.",
    "mcp.duplicate_server" => "Two MCP servers have the same name.",
    "mcp.env_missing" => "An MCP server needs an environment variable that is not set.",
    "mcp.env_not_listed" => "An MCP server's environment names a variable its `env` list does not pass.",
    "mcp.handshake" => "An MCP server did not complete its initialize handshake.",
    "mcp.list_tools" => "An MCP server failed to list its tools.",
    "mcp.protocol_error" => "An MCP server answered a call with a JSON-RPC error.",
    "mcp.server_died" => "An MCP server exited while a call waited on it.",
    "mcp.spawn_failed" => "An MCP server's command could not be started.",
    "mcp.timeout" => "An MCP server did not answer in time.",
    "mcp.tool_clash" => "Two MCP servers offer a tool with the same name.",
    "mcp.tool_error" => "An MCP tool reported an error result (`isError`).",
    "mcp.unexpected_response" => "An MCP server's answer is not the shape the protocol gives.",
    "memory.too_large" => "The goal's memory folder holds more files or bytes than dagloop indexes (10,000 files, 64 MiB); point `memory.path` at a smaller folder.",
    "memory.unreadable" => "The goal's memory folder (or a file in it) cannot be read, or is not a folder.",
    "model.script" => "A scripted-model file given to `dagloop validate` cannot be read or is not valid.",
    "notify.bad_timeout" => "The webhook's timeout is not a positive number of seconds.",
    "notify.bad_url" => "The webhook's URL is not an http(s) URL.",
    "op.already_decided" => "The call was already decided (by another reviewer, a rule or a standing approval); the message names the decision and who made it.",
    "op.already_shown" => "The call was already shown to a reviewer (its deadline runs since then), or its policy sets no deadline: nothing to start.",
    "op.bad_decision" => "The decision is not one the endpoint takes.",
    "op.bad_standing_approval" => "The standing-approval request is not one the endpoint takes.",
    "op.edit_changes_tool" => "An edit may change a call's params, not its tool (use replace).",
    "op.invalid_decision" => "The decision does not fit the call (for example mark-done on a call that was not interrupted).",
    "op.invalid_standing_approval" => "The standing approval does not fit the run (its calls are not the ones presented, its schema is invalid).",
    "op.not_awaiting" => "The call is not waiting for a decision.",
    "op.refused" => "The run refused the op (the Temporal engine's answer; the message says why).",
    "op.run_finished" => "The run has ended; it takes no more ops.",
    "op.stale" => "The decision was made on params that have changed since, or the run moved on while it was checked (decide again on what is shown now).",
    "op.stale_presentation" => "The decision answers a presentation of the call that is no longer the current one (the call was presented again, e.g. after a restart): decide again on the new presentation.",
    "op.unavailable" => "The run cannot take ops now (its process is stopping, or its journal failed); try again when it is driven.",
    "op.unknown_call" => "The run has no call with that id.",
    "op.unknown_standing_approval" => "The run has no standing approval in force with that id.",
    "plan.bad_reference" => "A call's reference does not parse.",
    "plan.calls_not_array" => "The plan's `calls` is not an array.",
    "plan.control_character" => "The plan holds a raw control character inside a string.",
    "plan.cycle" => "The plan's calls wait on each other in a cycle; the run refuses the call that closes it.",
    "plan.dangling_reference" => "A call reads a path that nothing in the data or the plan writes.",
    "plan.duplicate_field" => "An object in the plan repeats a field.",
    "plan.empty" => "The model's answer held neither calls nor an output.",
    "plan.invalid_escape" => "A string in the plan has an invalid escape.",
    "plan.invalid_json" => "A plan file given to `dagloop validate` is not JSON.",
    "plan.invalid_params" => "A call's literal params fail its tool's schema.",
    "plan.invalid_utf8" => "The plan is not valid UTF-8.",
    "plan.invalid_value" => "A value in the plan is not valid JSON.",
    "plan.no_solution" => "The model's answer holds no plan object.",
    "plan.no_tool_call" => "The model answered in text where a tool call was required.",
    "plan.not_a_plan" => "A file given to `dagloop validate` is not a plan.",
    "plan.not_an_object" => "The plan is not a JSON object.",
    "plan.problem" => "The model reported a problem instead of a plan.",
    "plan.too_deep" => "The plan nests deeper than dagloop reads.",
    "plan.too_large" => "The plan is larger than dagloop reads.",
    "plan.truncated" => "The plan ends before it is complete.",
    "plan.unexpected" => "The plan holds a character where JSON does not allow it.",
    "plan.unknown_fields" => "The plan has fields the protocol does not define (the model is told which).",
    "plan.unknown_tool" => "A call names a tool the goal does not have.",
    "plan.unpaired_surrogate" => "A string in the plan holds an unpaired UTF-16 surrogate escape.",
    "protocol.invalid_field" => "A protocol field has the wrong type or value.",
    "protocol.malformed" => "A call or output is not the shape the protocol gives.",
    "protocol.missing_field" => "A required protocol field is missing (for example `_tool`).",
    "protocol.not_an_object" => "A call or output is not a JSON object.",
    "protocol.unknown_meta_key" => "A call uses a `_` key the protocol does not define; the message suggests the closest known one.",
    "protocol.unknown_output_method" => "`_outputMethod` is not one the protocol defines.",
    "reference.invalid" => "A reference cannot be resolved against the state (bad path, wrong type).",
    "replay.result" => "The replayed run reached another status, output or state than the stored one.",
    "replay.unexpected_input" => "A journal entry is not one the fresh machine waited for at that point.",
    "run.cancelled" => "The run was cancelled.",
    "run.context_overflow" => "The run's context no longer fits the model's window, even compacted.",
    "run.definition_changed" => "The goal (or a tool schema, a delegate goal) changed since the run started; resume with `--accept-changes` to go on anyway.",
    "run.doom_loop" => "The model repeated the same plan without progress.",
    "run.driver_lost" => "The task driving the run stopped unexpectedly; the run is left resumable (status `stopped`).",
    "run.empty_turns" => "The model gave too many empty answers in a row.",
    "run.invalid_output" => "The model's output failed the output schema too many times.",
    "run.max_steps" => "The run reached its step limit without an output.",
    "run.model_error" => "The model failed and retries (and fallbacks) ran out.",
    "run.result_bound" => "A call's result would take the run over its bound of kept tool-result bytes (`kept_result_bytes` in the operator's `[grants]`, default 64 MiB): the call failed, and its record keeps the result's size, SHA-256 and first 1,024 characters instead (an `http` response is read no further than the run can keep: then of what was read, `complete: false`).",
    "run.setup_failed" => "The run could not be set up from its definition (a goal that does not load, a record this version cannot read); nothing ran. `cause` says what failed.",
    "run.stalled" => "The run stopped, resumable (status `stopped`): nothing was running and nobody could decide the calls that wait.",
    "run.stopped" => "The run stopped without a result (killed, lease lost, journal failed); `dagloop resume` continues it.",
    "run.timeout" => "The run reached `limits.timeout_s`.",
    "run.token_budget" => "The run used its token budget.",
    "runs.bad_cursor" => "The run list's `cursor` is not one the server gave.",
    "runs.bad_limit" => "The run list's `limit` is out of range.",
    "runs.bad_options" => "A stored run's options cannot be read back.",
    "runs.bad_param" => "A query parameter of the run list is malformed.",
    "runs.bad_status" => "The run list's `status` filter names no status.",
    "runs.no_retention" => "`dagloop runs prune` was given no retention (`--retain`, `--compact-after`) and the config has no `[store]` policy.",
    "runs.rebuild" => "A stored run cannot be rebuilt from its journal.",
    "scheduler.cancelled" => "The call was cancelled before it finished (the run ended).",
    "scheduler.invalid_latent_output" => "A latent call's output fails the tool's output schema.",
    "scheduler.invalid_params" => "The call's resolved params fail its tool's schema.",
    "scheduler.missing_latent_output" => "A latent call ended without its output.",
    "scheduler.panic" => "The tool's activity panicked; the call failed and the run goes on.",
    "scheduler.refused" => "The scheduler refused the call (the message says why).",
    "scheduler.timeout" => "The call timed out in the scheduler (waiting for a reviewer or running).",
    "scheduler.unknown_tool" => "The call names a tool the run does not have.",
    "scheduler.unreadable_call" => "The call could not be read as a call.",
    "scheduler.unresolved" => "The call's references could not be resolved when it became ready.",
    "schema.invalid_schema" => "A JSON Schema is invalid.",
    "schema.invalid_tool_meta" => "A tool's `_` settings are invalid.",
    "schema.invalid_tool_name" => "A tool's name is not a valid identifier.",
    "schema.tool_not_found" => "No tool of that name.",
    "schema.tool_not_object" => "A tool's params schema does not describe an object.",
    "script.invalid_solution" => "A plan in a scripted-model file does not parse.",
    "script.unknown_tool" => "A plan in a scripted-model file calls a tool the goal does not have.",
    "server.agent_model" => "The client asked a published agent for a model its operator does not list for it (`[agents.NAME] models`); leave `model` out or pick a listed one.",
    "server.agent_unreadable" => "An agent the server was started with cannot be read.",
    "server.bind" => "The server cannot listen on its address.",
    "server.internal" => "The server failed on its side; the message says what (please report it).",
    "server.principal_duplicate" => "Two principals have the same name.",
    "server.principal_duplicate_token" => "Two principals have the same token.",
    "server.principal_hash" => "A principal's token hash is not a sha256 hex digest.",
    "server.principal_name" => "A principal's name is empty or not printable.",
    "server.principal_roles" => "A principal has no role.",
    "server.serve" => "The server stopped with an error.",
    "server.token_required" => "The server listens beyond loopback and no token or principals are configured.",
    "server.too_many_open" => "The caller already holds as many open waits (`GET /runs/{id}/result?wait=`), or event streams, as one principal may (64 of each): one must end first (429).",
    "server.too_many_runs" => "The caller already has as many active runs (running, waiting or stopped: not ended) as one principal may (the server's `[limits] active_runs`, default 32; `admin` excepted): `POST /runs`, a fork or a follow-up is refused until one of them ends (429).",
    "server.unknown_agent" => "The request names an agent the server was not started with.",
    "session.busy" => "A run of the session has not finished: follow-ups of one session run one at a time. Without `--no-wait` (`\"wait\": true` on the API) the follow-up waits for it; a stopped run of the session must be resumed or cancelled first.",
    "session.no_goal" => "`run --continue RUN` was given neither a goal file nor an instruction (the text after the run id is empty).",
    "store.busy" => "Another process holds a live lease on the run (it drives it); `dagloop resume` waits for it unless `--no-wait`, and takes the run over at once from a process of the same host that is gone.",
    "store.compacted" => "The run was compacted to its result, decisions and a final snapshot; what needs its journal (replay, fork, cassettes, the event stream) is no longer possible.",
    "store.corrupt" => "The store holds a record dagloop cannot read.",
    "store.exists" => "A run with that id is already stored.",
    "store.foreign" => "The file is a SQLite database that is not a dagloop store.",
    "store.io" => "Reading or writing the store failed (disk full, permissions).",
    "store.journal_write" => "A journal entry could not be written; the run stops resumable.",
    "store.lease_lost" => "Another process holds the run's lease now; this one stops without recording a result.",
    "store.locked" => "Another connection kept the store locked past the busy timeout and its retries; the write was refused.",
    "store.not_finished" => "Only a finished run can be compacted.",
    "store.not_found" => "The store file does not exist (commands that only read or continue runs never create one).",
    "store.open" => "The store file cannot be opened.",
    "store.too_new" => "The store was written by a newer dagloop.",
    "store.unknown_run" => "The store holds no run with that id.",
    "telemetry.bad_variable" => "An `OTEL_*` variable has a value dagloop does not accept.",
    "telemetry.exporter" => "The OpenTelemetry exporter could not be built.",
    "temporal.carried" => "A run's journal could not be carried to its workflow's next execution (continue-as-new).",
    "temporal.connect" => "The Temporal server cannot be reached.",
    "temporal.model_activity" => "The model activity failed on the Temporal worker.",
    "temporal.no_result" => "The workflow ended without a result.",
    "temporal.request" => "A request to the Temporal server failed.",
    "temporal.unknown_run" => "Temporal holds no workflow for that run.",
    "temporal.worker" => "The Temporal worker failed.",
    "test.invalid" => "A test case file is not valid against its schema.",
    "test.not_found" => "A test case path does not exist.",
    "test.unreadable" => "A test case file cannot be read.",
}

/// `docs/codes.md` as the registry writes it.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Error codes\n\n\
         Every failure dagloop reports carries a stable code, `area.name`: in a result's \
         `error.code`, a call's `error.code`, the server's `{\"error\": {\"code\", ...}}` \
         bodies and the command line's error line. Match on codes, never on messages. \
         `dagloop codes CODE` prints one entry.\n\n\
         This page is generated from `src/codes.rs` (regenerate with \
         `DAGLOOP_UPDATE_CODES=1 cargo test --test codes`).\n",
    );
    for (area, about) in AREAS {
        out.push_str(&format!(
            "\n## `{area}`: {about}\n\n| code | meaning |\n| --- | --- |\n"
        ));
        let prefix = format!("{area}.");
        for c in CODES.iter().filter(|c| c.code.starts_with(&prefix)) {
            out.push_str(&format!("| `{}` | {} |\n", c.code, c.meaning));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_sorted_unique_and_each_in_a_listed_area() {
        for w in CODES.windows(2) {
            assert!(w[0].code < w[1].code, "{} then {}", w[0].code, w[1].code);
        }
        let areas: Vec<&str> = AREAS.iter().map(|(a, _)| *a).collect();
        for w in areas.windows(2) {
            assert!(w[0] < w[1], "areas out of order: {} then {}", w[0], w[1]);
        }
        for c in CODES {
            let (area, name) = c.code.split_once('.').expect("area.name");
            assert!(areas.contains(&area), "{}: area not listed", c.code);
            assert!(
                !name.is_empty()
                    && name
                        .chars()
                        .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_'),
                "{}: not snake_case",
                c.code
            );
            assert!(c.meaning.ends_with('.'), "{}: say it as a sentence", c.code);
        }
        for (area, _) in AREAS {
            let prefix = format!("{area}.");
            assert!(
                CODES.iter().any(|c| c.code.starts_with(&prefix)),
                "area {area} has no code"
            );
        }
    }

    #[test]
    fn lookup_finds_registered_codes_only() {
        assert_eq!(lookup("store.busy").map(|c| c.code), Some("store.busy"));
        assert!(lookup("no-such-area.code").is_none());
    }
}
