//! The subcommands: each talks to Redis or PostgreSQL through a
//! `LockManager` (or, for `check`, plain redis-rs or tokio-postgres), prints
//! its result, and says how the process ends.

use std::error::Error;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use distlock::LockManager;

use crate::cli::{Cli, Command};
use crate::output;

/// What the CLI's manager stores as the holder of its start-up probe lock.
const HOLDER: &str = "distlock-cli";

/// Connect and command timeout of the CLI's manager: a bad URL fails fast.
const TIMEOUT: Duration = Duration::from_secs(2);

/// An error to print on stderr before exiting with 1.
pub type CliError = Box<dyn Error>;

/// How a command that did not fail ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Exit 0.
    Done,
    /// Exit 1: the lock is not held, or a server check failed.
    Failed,
    /// Exit 2: refused (force-unlock without `--yes`).
    Refused,
}

impl From<Outcome> for ExitCode {
    fn from(outcome: Outcome) -> ExitCode {
        match outcome {
            Outcome::Done => ExitCode::SUCCESS,
            Outcome::Failed => ExitCode::from(1),
            Outcome::Refused => ExitCode::from(2),
        }
    }
}

/// Runs the command the command line names.
pub async fn run(cli: &Cli) -> Result<Outcome, CliError> {
    if let Command::Schema = cli.command {
        return schema(cli);
    }
    match &cli.command {
        Command::List { pattern } => list(cli, pattern).await,
        Command::Inspect { key } => inspect(cli, key).await,
        Command::Unlock { key, hold, yes } => unlock(cli, key, hold.as_deref(), *yes).await,
        Command::Permits { key, add, set, yes } => permits(cli, key, *add, *set, *yes).await,
        Command::Watch {
            pattern,
            interval,
            once,
        } => watch(cli, pattern, *interval, *once).await,
        Command::Check => check(cli).await,
        Command::Schema => schema(cli),
    }
}

/// A manager for the URL(s), prefix and timeouts of the command line.
async fn manager(cli: &Cli) -> Result<LockManager, CliError> {
    let builder = if cli.cluster {
        LockManager::cluster_builder(cli.urls.iter().cloned())
    } else {
        LockManager::builder(&cli.urls[0])
    };
    let builder = match tls_ca(cli)? {
        Some(pem) => builder.tls_ca_pem(pem),
        None => builder,
    };
    // An administrator's tool reads and frees locks; it never creates
    // distlock's schema in a database (a missing one is named by the error).
    #[cfg(feature = "postgres")]
    let builder = builder
        .postgres_schema(cli.schema.clone())
        .create_postgres_schema(false);
    let manager = builder
        .key_prefix(cli.prefix.clone())
        .holder(HOLDER)
        .connect_timeout(TIMEOUT)
        .command_timeout(TIMEOUT)
        .build()
        .await?;
    Ok(manager)
}

/// The CA certificate of `--tls-ca`, read.
fn tls_ca(cli: &Cli) -> Result<Option<Vec<u8>>, CliError> {
    cli.tls_ca
        .as_ref()
        .map(|path| {
            std::fs::read(path)
                .map_err(|e| format!("cannot read --tls-ca {}: {e}", path.display()).into())
        })
        .transpose()
}

/// Prints a JSON value on one line.
fn print_json(value: &serde_json::Value) -> Result<(), CliError> {
    out(format_args!("{value}\n"))
}

/// The reader of standard output went away (`distlock list | head -n1`):
/// the command stops there, and the process ends successfully, as `ls | head`
/// does.
#[derive(Debug)]
pub struct ReaderGone;

impl std::fmt::Display for ReaderGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl Error for ReaderGone {}

/// Writes `text` to standard output and flushes it; a closed pipe is
/// [`ReaderGone`] (`print!` would panic on it).
fn out(text: impl std::fmt::Display) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    match write!(stdout, "{text}").and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Box::new(ReaderGone)),
        Err(e) => Err(e.into()),
    }
}

/// `distlock list [PATTERN]`.
async fn list(cli: &Cli, pattern: &str) -> Result<Outcome, CliError> {
    let manager = manager(cli).await?;
    let locks = manager.list(pattern).await?;
    if cli.json {
        print_json(&output::locks_json(&locks))?;
    } else {
        out(output::lock_table(
            &locks,
            &cli.prefix,
            pattern,
            SystemTime::now(),
        ))?;
        let counters = manager.list_counting_semaphores(pattern).await?;
        out(output::counter_table(&counters))?;
    }
    Ok(Outcome::Done)
}

/// `distlock inspect KEY`.
async fn inspect(cli: &Cli, key: &str) -> Result<Outcome, CliError> {
    let state = manager(cli).await?.inspect_all(key).await?;
    let anything = state.is_held()
        || !state.waiters.is_empty()
        || state.counting_permits.is_some()
        || state.counting_waiters > 0;
    if cli.json {
        print_json(&output::key_json(&state))?;
    } else if anything {
        out(output::key_details(&state, SystemTime::now()))?;
    }
    if anything {
        Ok(Outcome::Done)
    } else {
        eprintln!("{key} is not locked");
        Ok(Outcome::Failed)
    }
}

/// `distlock unlock KEY [--hold HOLD] [--yes]`.
async fn unlock(cli: &Cli, key: &str, hold: Option<&str>, yes: bool) -> Result<Outcome, CliError> {
    let manager = manager(cli).await?;
    let state = manager.inspect_all(key).await?;
    let targets: Vec<&distlock::LockInfo> = match hold {
        Some(id) => state.holds.iter().filter(|h| h.hold_id == id).collect(),
        None => state.holds.iter().collect(),
    };
    let described = targets
        .iter()
        .map(|h| format!("{} by {} (token {})", h.kind, h.holder, h.fencing_token))
        .collect::<Vec<_>>()
        .join(", ");
    // A hold asked for by id that is not there is a mistake (a mistyped id,
    // or a hold gone since it was read), with or without --yes: nothing that
    // was asked for can be freed.
    if let (Some(id), true) = (hold, targets.is_empty()) {
        eprintln!("{key} has no hold {id}; nothing to unlock");
        return Ok(Outcome::Failed);
    }
    if !yes {
        if targets.is_empty() {
            eprintln!("{key} is not locked; nothing to unlock");
            return Ok(Outcome::Failed);
        }
        eprintln!(
            "refusing to force-unlock {key} without --yes: it is held ({described}). \
             The holders would lose their leases."
        );
        return Ok(Outcome::Refused);
    }
    let freed = match hold {
        Some(_) => {
            let mut freed = 0;
            for target in &targets {
                freed += u64::from(manager.force_unlock_hold(target).await?);
            }
            freed
        }
        None => manager.force_unlock_all(key).await?,
    };
    // The hold asked for went between the reading and the unlock (released,
    // expired, or freed by another operator): as when it was not there at
    // the reading, nothing that was asked for was freed.
    if let (Some(id), 0) = (hold, freed) {
        eprintln!("{key} has no hold {id} any more (gone since it was read); nothing to unlock");
        return Ok(Outcome::Failed);
    }
    if cli.json {
        print_json(&serde_json::json!({ "key": key, "was_held": freed > 0, "freed": freed }))?;
    } else if freed > 0 {
        out(format_args!(
            "force-unlocked {key} ({described}); its waiters were woken.\n\
             Each holder learns it at its next renewal (within a third of its lease): its \
             guard reports the lease lost and its release returns Lost. The next holder's \
             fencing token is larger.\n"
        ))?;
    } else {
        out(format_args!("{key} was not locked; nothing done\n"))?;
    }
    Ok(Outcome::Done)
}

/// `distlock permits KEY [--add N | --set N] [--yes]`.
async fn permits(
    cli: &Cli,
    key: &str,
    add: Option<i64>,
    set: Option<i64>,
    yes: bool,
) -> Result<Outcome, CliError> {
    let semaphore = manager(cli).await?.counting_semaphore(key);
    let before = semaphore.counts().await?;
    let change = match (add, set) {
        (Some(n), _) => Some(format!("add {n} permits to")),
        (None, Some(n)) => Some(format!("set to {n} permits")),
        (None, None) => None,
    };
    let Some(change) = change else {
        if cli.json {
            print_json(&output::counter_json(key, &before))?;
        } else if before.exists {
            out(output::counter_line(key, &before))?;
        }
        if before.exists {
            return Ok(Outcome::Done);
        }
        eprintln!("{key} is not a counting semaphore (no counter)");
        return Ok(Outcome::Failed);
    };
    // A change would create the counter: a mistyped key would become a new
    // semaphore nobody uses. Applications create theirs (`try_set_permits`).
    if !before.exists {
        eprintln!("{key} is not a counting semaphore (no counter); nothing changed");
        return Ok(Outcome::Failed);
    }
    if !yes {
        eprintln!(
            "refusing to {change} counting semaphore {key} without --yes: it has {} available \
             and {} waiting.",
            before.available, before.waiters
        );
        return Ok(Outcome::Refused);
    }
    let available = match (add, set) {
        (Some(n), _) => semaphore.add_permits(n).await?,
        (None, Some(n)) => {
            semaphore.set_permits(n).await?;
            n
        }
        (None, None) => before.available,
    };
    if cli.json {
        print_json(&serde_json::json!({
            "key": key,
            "available_before": before.available,
            "available": available,
        }))?;
    } else {
        out(format_args!(
            "counting semaphore {key}: {} -> {available} available; waiters were woken if \
             permits became available\n",
            before.available
        ))?;
    }
    Ok(Outcome::Done)
}

/// `distlock watch [PATTERN] [--interval D] [--once]`: the list, refreshed,
/// until Ctrl-C. On a terminal each refresh clears the screen; otherwise
/// refreshes follow each other (one JSON array per line with `--json`). A
/// failed refresh (Redis restarting, say) is shown and retried at the next one;
/// with `--once` it is the command's error.
async fn watch(
    cli: &Cli,
    pattern: &str,
    interval: Duration,
    once: bool,
) -> Result<Outcome, CliError> {
    let manager = manager(cli).await?;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let terminal = std::io::stdout().is_terminal();
    loop {
        let locks = tokio::select! {
            locks = manager.list(pattern) => locks,
            _ = &mut ctrl_c => break,
        };
        let locks = match locks {
            Err(e) if once => return Err(e.into()),
            other => other,
        };
        if cli.json {
            match &locks {
                Ok(locks) => print_json(&output::locks_json(locks))?,
                Err(e) => eprintln!("distlock: {e} (retrying)"),
            }
        } else {
            out(watch_screen(cli, pattern, interval, &locks, terminal))?;
        }
        if once {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            _ = &mut ctrl_c => break,
        }
    }
    Ok(Outcome::Done)
}

/// One refresh of `watch` as text: a heading, then the table or the error.
fn watch_screen(
    cli: &Cli,
    pattern: &str,
    interval: Duration,
    locks: &Result<Vec<distlock::LockInfo>, distlock::LockError>,
    terminal: bool,
) -> String {
    let now = SystemTime::now();
    let mut screen = String::new();
    if terminal {
        screen.push_str("\x1b[2J\x1b[H");
    }
    screen.push_str(&format!(
        "{} locks matching {pattern:?} under {}, every {} (Ctrl-C to stop)\n\n",
        humantime::format_rfc3339_seconds(now),
        cli.prefix,
        humantime::format_duration(interval),
    ));
    match locks {
        Ok(locks) => screen.push_str(&output::lock_table(locks, &cli.prefix, pattern, now)),
        Err(e) => screen.push_str(&format!("error: {e} (retrying)\n")),
    }
    if !terminal {
        screen.push('\n');
    }
    screen
}

/// `distlock schema [--schema NAME]`: offline.
#[cfg(feature = "postgres")]
fn schema(cli: &Cli) -> Result<Outcome, CliError> {
    out(distlock::postgres_schema_sql(&cli.schema)?)?;
    Ok(Outcome::Done)
}

/// `distlock schema` in a build without PostgreSQL.
#[cfg(not(feature = "postgres"))]
fn schema(_cli: &Cli) -> Result<Outcome, CliError> {
    Err("this distlock was built without its `postgres` feature".into())
}

/// `distlock check`.
async fn check(cli: &Cli) -> Result<Outcome, CliError> {
    #[cfg(feature = "postgres")]
    let results = if crate::cli::is_postgres_url(&cli.urls[0]) {
        crate::check_pg::run(&cli.urls[0], &cli.schema, tls_ca(cli)?).await
    } else {
        crate::check::run(&cli.urls, cli.cluster, tls_ca(cli)?).await
    };
    #[cfg(not(feature = "postgres"))]
    let results = crate::check::run(&cli.urls, cli.cluster, tls_ca(cli)?).await;
    if cli.json {
        print_json(&output::checks_json(&results))?;
    } else {
        out(output::check_lines(&results))?;
    }
    let failed = results.iter().any(|r| r.status == output::Status::Fail);
    Ok(if failed {
        Outcome::Failed
    } else {
        Outcome::Done
    })
}
