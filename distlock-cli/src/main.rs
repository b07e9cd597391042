//! `distlock`: the admin CLI of distlock. Lists, inspects, watches and
//! force-unlocks the locks held in Redis, and checks a server for distlock.
//! See `distlock --help` and the crate's README.

mod check;
mod cli;
mod commands;
mod output;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("distlock: cannot start the tokio runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(commands::run(&cli)) {
        Ok(outcome) => outcome.into(),
        Err(e) => {
            eprintln!("distlock: {e}");
            ExitCode::from(1)
        }
    }
}
