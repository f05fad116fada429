//! The `dagloop` binary: parses arguments and hands over to `dagloop::cli`.

use clap::Parser;

/// mimalloc rather than glibc's malloc: a run allocates many small short-lived objects (calls,
/// events, JSON values) from several threads, where glibc's allocator cost about 40% of the
/// scheduler benchmark's CPU (`cargo bench --bench scheduler`).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    dagloop::cli::tune_allocator();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match dagloop::cli::Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => std::process::exit(dagloop::cli::usage_error(&e, &args)),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let code = runtime.block_on(dagloop::cli::main(cli));
    // Every task's destructors run here (a run's shell tools and MCP servers are killed);
    // whatever process group is left goes before the process does.
    drop(runtime);
    // Spans still buffered are sent before the process goes (Ctrl-C ends the command first).
    dagloop::telemetry::flush();
    dagloop::tools::kill_process_groups();
    std::process::exit(code);
}
