//! The `dagloop` binary: parses arguments and hands over to `dagloop::cli`.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let cli = dagloop::cli::Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let code = runtime.block_on(dagloop::cli::main(cli));
    drop(runtime);
    std::process::exit(code);
}
