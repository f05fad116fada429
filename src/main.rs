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
        // Blocking threads idle this long go (tokio's default is 10 s). A server's watcher asks
        // for one every 200 ms, and each request wakes another idle thread in turn: with the
        // default, every thread a burst had started (40 and more) was woken within its 10 s
        // and none ever went, holding its stack and its allocator's pages.
        .thread_keep_alive(std::time::Duration::from_secs(1))
        // At most this many blocking threads (tokio's default is 512). Each thread a burst
        // starts leaves some memory behind when it goes (its allocator pages that still hold
        // live blocks, its glibc arena, its shard of the tracing registry), so a burst that
        // started one per run being submitted (346 at 5,000 runs) kept memory in proportion
        // to its size; bounded, it keeps a constant (docs/performance.md, "What a burst's
        // threads leave").
        .max_blocking_threads(dagloop::cli::max_blocking_threads())
        // A worker with nothing to do hands back what it freed (a server that drove a burst of
        // runs to their wait returns to about a fresh server's memory: src/cli/alloc.rs).
        .on_thread_park(dagloop::cli::release_idle)
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
