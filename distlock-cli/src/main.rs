//! `distlock`: the admin CLI of distlock. Lists, inspects, watches and
//! force-unlocks the locks held in Redis or PostgreSQL, checks a server for
//! distlock, and prints the SQL of its PostgreSQL schema.
//! See `distlock --help` and the crate's README.

mod check;
#[cfg(feature = "postgres")]
mod check_pg;
mod cli;
mod commands;
mod output;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

fn main() -> ExitCode {
    let mut cli = cli::Cli::parse();
    cli.urls = cli.resolved_urls();
    if let Some(mistake) = usage_mistake(&cli) {
        cli::Cli::command()
            .error(clap::error::ErrorKind::ArgumentConflict, mistake)
            .exit();
    }
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
        Err(e) if e.is::<commands::ReaderGone>() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("distlock: {e}");
            ExitCode::from(1)
        }
    }
}

/// A combination of options that clap cannot see is wrong (it depends on the
/// URL's scheme, which may come from the environment): exit 2, as clap's own
/// usage errors.
fn usage_mistake(cli: &cli::Cli) -> Option<String> {
    let postgres = cli.urls.iter().any(|url| cli::is_postgres_url(url));
    if postgres && cli.cluster {
        return Some("--cluster is for Redis Cluster nodes, not a PostgreSQL URL".to_owned());
    }
    if postgres && cli.urls.len() > 1 {
        return Some(
            "give one PostgreSQL URL (several URLs are the nodes of a Redis Cluster)".to_owned(),
        );
    }
    // `schema` reads no URL.
    if cli.urls.len() > 1 && !cli.cluster && !matches!(cli.command, cli::Command::Schema) {
        return Some("several URLs are the nodes of a Redis Cluster: add --cluster".to_owned());
    }
    None
}
