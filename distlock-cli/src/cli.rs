//! The command line: global options and subcommands, parsed by clap.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// The Redis URL used when neither `--url` nor the environment gives one.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// The environment variables read, in this order, when `--url` is not given:
/// the order the runtime's default manager reads them in.
pub const URL_VARIABLES: [&str; 3] = ["DISTLOCK_URL", "DISTLOCK_REDIS_URL", "REDIS_URL"];

/// Inspect and administer distlock locks held in Redis or PostgreSQL.
///
/// Works with only a Redis or PostgreSQL URL: it reads and frees the locks
/// that the applications' `LockManager`s hold under a key prefix, checks a
/// server for them, and prints the SQL of distlock's PostgreSQL schema.
/// Exit codes: 0 success, 1 error (or the lock is not held), 2 refused
/// (force-unlock without `--yes`) or a usage error.
#[derive(Debug, Parser)]
#[command(name = "distlock", version, about, long_about)]
pub struct Cli {
    /// Redis or PostgreSQL URL: `redis://[[user]:password@]host:port[/db]`
    /// (`rediss://` for TLS; `valkey://` and `valkeys://` are the same for a
    /// Valkey server), or `postgres://user[:password]@host[:port]/database`
    /// (`postgresql://` too). Repeat it, or separate URLs with commas, to
    /// give several nodes of a Redis Cluster (with `--cluster`); a comma not
    /// followed by a URL scheme stays in its URL (a password, PostgreSQL's
    /// `postgres://host1,host2/db`). Without it:
    /// $DISTLOCK_URL, else $DISTLOCK_REDIS_URL, else $REDIS_URL, else
    /// redis://127.0.0.1:6379.
    #[arg(long = "url", global = true)]
    pub urls: Vec<String>,

    /// The URLs are nodes of a Redis Cluster.
    #[arg(long, global = true)]
    pub cluster: bool,

    /// Key prefix of the locks, as the applications' `LockManager`s set it
    /// (`key_prefix`).
    #[arg(long, global = true, default_value = "distlock:")]
    pub prefix: String,

    /// PostgreSQL schema of distlock's tables and functions, as the
    /// applications' `LockManager`s set it (`postgres_schema`).
    #[arg(long, global = true, value_name = "NAME", default_value = "distlock")]
    pub schema: String,

    /// PEM file of the CA to trust for `rediss://` and PostgreSQL's
    /// `sslmode=require` instead of the system's roots (a managed server
    /// with a private CA, self-signed servers).
    #[arg(long, global = true, value_name = "PEM_FILE")]
    pub tls_ca: Option<PathBuf>,

    /// Print JSON instead of text, for scripts.
    #[arg(long, global = true)]
    pub json: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Lists the holds of every kind (lock, read-write lock's writer and
    /// readers, semaphore permits) whose key matches PATTERN, as a table,
    /// then the counting semaphores (which have no holders) with their
    /// available permits; with `--json`, the holds only.
    List {
        /// Glob on the lock key (Redis SCAN MATCH syntax: `*`, `?`, `[abc]`, `\`).
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// Shows every hold on KEY (the lock, a read-write lock's writer and
    /// readers, a semaphore's holders), the lock's queue of waiters and the
    /// counting semaphore's permits; exits with 1 when nobody holds or waits
    /// and there is no counting semaphore.
    Inspect {
        /// The lock key, as the application names it (without the prefix).
        key: String,
    },
    /// Frees every hold on KEY whoever holds it, or with `--hold` one
    /// holder's (needs `--yes`; without it, names the holders and exits with
    /// 2). Exits with 1 when `--hold` names no hold of KEY.
    Unlock {
        /// The lock key, as the application names it (without the prefix).
        key: String,
        /// Free only this hold: its HOLD id from `inspect` (one reader, one
        /// semaphore holder, the writer or the lock).
        #[arg(long, value_name = "HOLD")]
        hold: Option<String>,
        /// Really force-unlock: the holders lose their leases.
        #[arg(long)]
        yes: bool,
    },
    /// Shows the counting semaphore KEY's available permits and waiters, or
    /// changes them (needs `--yes`): `--add N` gives back N permits (the way
    /// to return permits a crashed process took, since they have no lease;
    /// negative N removes permits), `--set N` sets the count. Exits with 1
    /// when it does not exist (and nothing is changed: a change never
    /// creates one).
    Permits {
        /// The counting semaphore's key, as the application names it.
        key: String,
        /// Add N permits (negative: remove them).
        #[arg(
            long,
            value_name = "N",
            allow_negative_numbers = true,
            conflicts_with = "set"
        )]
        add: Option<i64>,
        /// Set the count to N.
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        set: Option<i64>,
        /// Really change the count.
        #[arg(long)]
        yes: bool,
    },
    /// Shows the held locks matching PATTERN, refreshed every interval, until Ctrl-C.
    Watch {
        /// Glob on the lock key, as for `list`.
        #[arg(default_value = "*")]
        pattern: String,
        /// Time between refreshes (`500ms`, `1s`, `2m`).
        #[arg(long, default_value = "1s", value_parser = parse_interval)]
        interval: Duration,
        /// Show one refresh and exit.
        #[arg(long)]
        once: bool,
    },
    /// Checks the server(s) for running distlock, and exits with 1 on a
    /// failure. Redis: version, eviction policy, persistence, replicas,
    /// cluster mode. PostgreSQL: version, primary or standby, the schema and
    /// its version, the role's privileges on it, synchronous_commit,
    /// synchronous standbys, idle session timeouts, and whether LISTEN works
    /// through the URL (it does not behind a transaction-mode pooler).
    Check,
    /// Prints the SQL that creates distlock's PostgreSQL schema (`--schema`,
    /// default `distlock`), for a DBA to run where the applications' role may
    /// not create it (their managers are then built with
    /// `create_postgres_schema(false)`). Needs no connection.
    Schema,
}

impl Cli {
    /// The URLs: `--url`, else the first of [`URL_VARIABLES`] that is set
    /// (split on commas, as `--url` is), else [`DEFAULT_URL`].
    pub fn resolved_urls(&self) -> Vec<String> {
        self.urls_from(|name| std::env::var(name).ok())
    }

    /// [`resolved_urls`](Self::resolved_urls) with the environment read by `var`.
    fn urls_from(&self, var: impl Fn(&str) -> Option<String>) -> Vec<String> {
        if !self.urls.is_empty() {
            return self
                .urls
                .iter()
                .flat_map(|value| split_urls(value))
                .collect();
        }
        URL_VARIABLES
            .iter()
            .find_map(|name| var(name).filter(|value| !value.trim().is_empty()))
            .map_or_else(|| vec![DEFAULT_URL.to_owned()], |value| split_urls(&value))
    }
}

/// Splits `value` at each comma that a URL scheme (`name://`) follows: a
/// comma inside a URL (in a password, or between the hosts of a PostgreSQL
/// URL) does not start another.
fn split_urls(value: &str) -> Vec<String> {
    let mut urls: Vec<String> = Vec::new();
    for piece in value.split(',') {
        match urls.last_mut() {
            Some(current) if !starts_with_scheme(piece) => {
                current.push(',');
                current.push_str(piece);
            }
            _ => urls.push(piece.to_owned()),
        }
    }
    urls
}

/// Whether `text` begins with a URL scheme and `://` (RFC 3986: a letter,
/// then letters, digits, `+`, `-` or `.`).
fn starts_with_scheme(text: &str) -> bool {
    let Some((scheme, _)) = text.split_once("://") else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Whether `url` names a PostgreSQL server (`postgres://` or `postgresql://`,
/// in any case), as `LockManager::builder` decides.
pub fn is_postgres_url(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    scheme.eq_ignore_ascii_case("postgres") || scheme.eq_ignore_ascii_case("postgresql")
}

/// Parses a human interval (`1s`, `250ms`), at least 10 ms.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if interval < Duration::from_millis(10) {
        return Err("the interval must be at least 10ms".to_owned());
    }
    Ok(interval)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn urls_split_on_commas() {
        let cli = Cli::try_parse_from([
            "distlock",
            "--url",
            "redis://a:1,redis://b:2",
            "--url",
            "redis://c:3",
            "--cluster",
            "list",
        ])
        .unwrap();
        assert_eq!(
            cli.resolved_urls(),
            ["redis://a:1", "redis://b:2", "redis://c:3"]
        );
        assert!(cli.cluster);
    }

    #[test]
    fn a_comma_inside_a_url_stays_in_it() {
        assert_eq!(
            split_urls("postgres://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write"),
            ["postgres://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write"]
        );
        assert_eq!(
            split_urls("redis://:pa,ss@a:1,rediss://b:2"),
            ["redis://:pa,ss@a:1", "rediss://b:2"]
        );
        assert_eq!(split_urls("redis://a:1,"), ["redis://a:1,"]);
        assert_eq!(
            split_urls("valkey://a:1,valkeys://b:2"),
            ["valkey://a:1", "valkeys://b:2"]
        );
        assert!(!starts_with_scheme("h2:5433/db"));
        assert!(!starts_with_scheme("1x://h"));
        assert!(starts_with_scheme("redis+tls://h"));
    }

    #[test]
    fn permit_changes_take_negative_numbers_one_at_a_time() {
        let cli =
            Cli::try_parse_from(["distlock", "permits", "k", "--add", "-3", "--yes"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Permits {
                add: Some(-3),
                set: None,
                yes: true,
                ..
            }
        ));
        assert!(
            Cli::try_parse_from(["distlock", "permits", "k", "--add", "1", "--set", "2"]).is_err()
        );
    }

    #[test]
    fn the_url_comes_from_the_first_variable_set() {
        let cli = Cli::try_parse_from(["distlock", "list"]).unwrap();
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(cli.urls_from(env(&[])), [DEFAULT_URL]);
        assert_eq!(
            cli.urls_from(env(&[
                ("REDIS_URL", "redis://r:1"),
                ("DISTLOCK_URL", "postgres://p/db")
            ])),
            ["postgres://p/db"]
        );
        assert_eq!(
            cli.urls_from(env(&[
                ("REDIS_URL", "redis://r:1"),
                ("DISTLOCK_REDIS_URL", "redis://d:2")
            ])),
            ["redis://d:2"]
        );
        assert_eq!(
            cli.urls_from(env(&[("REDIS_URL", "redis://a:1,redis://b:2")])),
            ["redis://a:1", "redis://b:2"]
        );
        let given = Cli::try_parse_from(["distlock", "--url", "redis://g:3", "list"]).unwrap();
        assert_eq!(
            given.urls_from(env(&[("DISTLOCK_URL", "postgres://p/db")])),
            ["redis://g:3"]
        );
    }

    #[test]
    fn postgres_urls_are_recognised() {
        assert!(is_postgres_url("postgres://u@h/db"));
        assert!(is_postgres_url("PostgreSQL://u@h/db"));
        assert!(!is_postgres_url("redis://h:1"));
        assert!(!is_postgres_url("postgres"));
    }

    #[test]
    fn intervals_are_human() {
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_interval("1ms").is_err());
        assert!(parse_interval("soon").is_err());
    }
}
