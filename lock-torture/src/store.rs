//! The fenced store: protected data kept in a Redis hash, written only through a
//! Lua script that rejects a write whose fencing token is lower than the highest
//! token it has seen, and counts the rejections.
//!
//! Every write, accepted or not, is also appended to a log list in the order the
//! server ran them, so the checker can tell afterwards exactly which writes took
//! effect, whatever the clients saw (a client may give up before the answer).
//!
//! The store lives on its own `redis-server` in the scenarios, apart from the lock
//! server, so that faults of the lock server (restart, stall) do not touch it.
//!
//! With the `postgres` feature, `PgStore` is the same store as a PostgreSQL
//! table (`store.sql`), for the scenarios whose locks live on PostgreSQL, and
//! [`StoreConn`] is what a worker writes through, whichever store its
//! `--store-url` names.

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult, Script};

/// The write script.
///
/// `KEYS[1]` the data hash (`token`, `value`, `accepted`, `rejected`),
/// `KEYS[2]` the log list; `ARGV[1]` fencing token, `ARGV[2]` new value.
/// Returns 1 when the write took effect, 0 when it was rejected.
pub const FENCED_WRITE: &str = r#"
local seen = redis.call('HGET', KEYS[1], 'token')
local token = tonumber(ARGV[1])
if seen and token < tonumber(seen) then
  redis.call('HINCRBY', KEYS[1], 'rejected', 1)
  redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2] .. ' R')
  return 0
end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'value', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'accepted', 1)
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2] .. ' A')
return 1
"#;

/// One write as the store ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The fencing token the write carried.
    pub token: u64,
    /// The value it wanted to write.
    pub value: u64,
    /// Whether it took effect.
    pub accepted: bool,
}

/// The store's counters for one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// The current value (0 before any write).
    pub value: u64,
    /// The highest token accepted.
    pub token: u64,
    /// Writes that took effect.
    pub accepted: u64,
    /// Writes rejected for a stale token.
    pub rejected: u64,
}

/// Client side of the fenced store.
#[derive(Debug, Clone)]
pub struct FencedStore {
    script: Script,
}

impl Default for FencedStore {
    fn default() -> Self {
        FencedStore {
            script: Script::new(FENCED_WRITE),
        }
    }
}

/// The data hash of `key`.
pub fn data_key(key: &str) -> String {
    format!("store:{key}")
}

/// The write log of `key`.
pub fn log_key(key: &str) -> String {
    format!("store-log:{key}")
}

/// A connection to the store with patient timeouts: the store is never faulted,
/// but the machine may be busy.
pub async fn connect(url: &str) -> RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(std::time::Duration::from_secs(10)))
        .set_response_timeout(Some(std::time::Duration::from_secs(10)));
    redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

impl FencedStore {
    /// The current value of `key` (0 before any write).
    pub async fn read(&self, conn: &mut MultiplexedConnection, key: &str) -> RedisResult<u64> {
        let v: Option<u64> = redis::cmd("HGET")
            .arg(data_key(key))
            .arg("value")
            .query_async(conn)
            .await?;
        Ok(v.unwrap_or(0))
    }

    /// Writes `value` with fencing token `token`; true when it took effect.
    pub async fn write(
        &self,
        conn: &mut MultiplexedConnection,
        key: &str,
        token: u64,
        value: u64,
    ) -> RedisResult<bool> {
        let r: i64 = self
            .script
            .key(data_key(key))
            .key(log_key(key))
            .arg(token.to_string())
            .arg(value)
            .invoke_async(conn)
            .await?;
        Ok(r == 1)
    }

    /// The counters of `key`.
    pub async fn stats(&self, conn: &mut MultiplexedConnection, key: &str) -> RedisResult<Stats> {
        let (value, token, accepted, rejected): (
            Option<u64>,
            Option<u64>,
            Option<u64>,
            Option<u64>,
        ) = redis::cmd("HMGET")
            .arg(data_key(key))
            .arg("value")
            .arg("token")
            .arg("accepted")
            .arg("rejected")
            .query_async(conn)
            .await?;
        Ok(Stats {
            value: value.unwrap_or(0),
            token: token.unwrap_or(0),
            accepted: accepted.unwrap_or(0),
            rejected: rejected.unwrap_or(0),
        })
    }

    /// Every write to `key`, in the order the server ran them.
    pub async fn log(
        &self,
        conn: &mut MultiplexedConnection,
        key: &str,
    ) -> RedisResult<Vec<Entry>> {
        let lines: Vec<String> = redis::cmd("LRANGE")
            .arg(log_key(key))
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await?;
        lines
            .iter()
            .map(|l| parse_entry(l))
            .collect::<Result<_, _>>()
            .map_err(|e| {
                redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "bad log entry",
                    e,
                ))
            })
    }
}

/// A worker's connection to the fenced store, Redis or (with the `postgres`
/// feature) PostgreSQL, chosen by the URL's scheme. Cheap to clone: both
/// clients are pipelined and shared by the worker's tasks.
#[derive(Clone)]
pub enum StoreConn {
    /// The Redis store ([`FencedStore`]).
    Redis(FencedStore, MultiplexedConnection),
    /// The PostgreSQL store ([`PgStore`]).
    #[cfg(feature = "postgres")]
    Postgres(PgStore),
}

impl StoreConn {
    /// Connects to the store at `url`: PostgreSQL for `postgres://` and
    /// `postgresql://`, else Redis.
    pub async fn connect(url: &str) -> Result<StoreConn, String> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            #[cfg(feature = "postgres")]
            return PgStore::connect(url).await.map(StoreConn::Postgres);
            #[cfg(not(feature = "postgres"))]
            return Err("a PostgreSQL store needs the `postgres` feature".to_owned());
        }
        let conn = connect(url).await.map_err(|e| e.to_string())?;
        Ok(StoreConn::Redis(FencedStore::default(), conn))
    }

    /// The current value of `key` (0 before any write).
    pub async fn read(&mut self, key: &str) -> Result<u64, String> {
        match self {
            StoreConn::Redis(store, conn) => store.read(conn, key).await.map_err(|e| e.to_string()),
            #[cfg(feature = "postgres")]
            StoreConn::Postgres(store) => store.read(key).await,
        }
    }

    /// Writes `value` with fencing token `token`; true when it took effect.
    pub async fn write(&mut self, key: &str, token: u64, value: u64) -> Result<bool, String> {
        match self {
            StoreConn::Redis(store, conn) => store
                .write(conn, key, token, value)
                .await
                .map_err(|e| e.to_string()),
            #[cfg(feature = "postgres")]
            StoreConn::Postgres(store) => store.write(key, token, value).await,
        }
    }
}

#[cfg(feature = "postgres")]
pub use pg::PgStore;

#[cfg(feature = "postgres")]
mod pg {
    use std::sync::Arc;

    use super::{Entry, Stats};

    /// The SQL of the PostgreSQL store: tables and the write function.
    pub const STORE_SQL: &str = include_str!("store.sql");

    /// The fenced store in a PostgreSQL database (`store.sql`): the same
    /// rule, counters and log as the Redis one.
    #[derive(Clone)]
    pub struct PgStore {
        client: Arc<tokio_postgres::Client>,
        /// False: the token check is off (the sabotage the checker must catch).
        check: bool,
    }

    fn err(e: tokio_postgres::Error) -> String {
        match e.as_db_error() {
            Some(db) => format!("{}: {}", db.code().code(), db.message()),
            None => e.to_string(),
        }
    }

    /// Tokens are u64 in the history and bigint in the table; the lock's
    /// come from a bigint sequence, so they fit.
    fn signed(token: u64) -> Result<i64, String> {
        i64::try_from(token).map_err(|_| format!("token {token} does not fit a bigint"))
    }

    impl PgStore {
        /// Creates the store's tables and function (once, before any worker
        /// connects).
        pub async fn create(url: &str) -> Result<(), String> {
            let store = PgStore::connect(url).await?;
            store.client.batch_execute(STORE_SQL).await.map_err(err)
        }

        /// Connects to the store at `url`; its connection runs in a task of
        /// the current runtime.
        pub async fn connect(url: &str) -> Result<PgStore, String> {
            let mut config: tokio_postgres::Config = url.parse().map_err(err)?;
            config.application_name("torture-store");
            let (client, connection) = config.connect(tokio_postgres::NoTls).await.map_err(err)?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok(PgStore {
                client: Arc::new(client),
                check: true,
            })
        }

        /// This store with its token check off: every write is accepted.
        pub fn unchecked(mut self) -> PgStore {
            self.check = false;
            self
        }

        /// The current value of `key` (0 before any write).
        pub async fn read(&self, key: &str) -> Result<u64, String> {
            let row = self
                .client
                .query_opt("SELECT value FROM torture_store WHERE key = $1", &[&key])
                .await
                .map_err(err)?;
            Ok(row.map_or(0, |r| r.get::<_, i64>(0) as u64))
        }

        /// Writes `value` with fencing token `token`; true when it took effect.
        pub async fn write(&self, key: &str, token: u64, value: u64) -> Result<bool, String> {
            let row = self
                .client
                .query_one(
                    "SELECT torture_fenced_write($1, $2, $3, $4)",
                    &[&key, &signed(token)?, &signed(value)?, &self.check],
                )
                .await
                .map_err(err)?;
            Ok(row.get(0))
        }

        /// The counters of `key`.
        pub async fn stats(&self, key: &str) -> Result<Stats, String> {
            let row = self
                .client
                .query_opt(
                    "SELECT value, token, accepted, rejected FROM torture_store WHERE key = $1",
                    &[&key],
                )
                .await
                .map_err(err)?;
            Ok(row.map_or(Stats::default(), |r| Stats {
                value: r.get::<_, i64>(0) as u64,
                token: r.get::<_, i64>(1) as u64,
                accepted: r.get::<_, i64>(2) as u64,
                rejected: r.get::<_, i64>(3) as u64,
            }))
        }

        /// Every write to `key`, in the order the server ran them.
        pub async fn log(&self, key: &str) -> Result<Vec<Entry>, String> {
            let rows = self
                .client
                .query(
                    "SELECT token, value, accepted FROM torture_store_log WHERE key = $1 ORDER BY seq",
                    &[&key],
                )
                .await
                .map_err(err)?;
            Ok(rows
                .iter()
                .map(|r| Entry {
                    token: r.get::<_, i64>(0) as u64,
                    value: r.get::<_, i64>(1) as u64,
                    accepted: r.get(2),
                })
                .collect())
        }
    }
}

fn parse_entry(line: &str) -> Result<Entry, String> {
    let mut it = line.split(' ');
    let (Some(t), Some(v), Some(verdict), None) = (it.next(), it.next(), it.next(), it.next())
    else {
        return Err(format!("bad store log entry {line:?}"));
    };
    Ok(Entry {
        token: t.parse().map_err(|e| format!("{line:?}: {e}"))?,
        value: v.parse().map_err(|e| format!("{line:?}: {e}"))?,
        accepted: match verdict {
            "A" => true,
            "R" => false,
            _ => return Err(format!("bad verdict in {line:?}")),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_entries_parse() {
        assert_eq!(
            parse_entry("1700000000000001 7 A").unwrap(),
            Entry {
                token: 1_700_000_000_000_001,
                value: 7,
                accepted: true
            }
        );
        assert!(!parse_entry("1 2 R").unwrap().accepted);
        assert!(parse_entry("1 2").is_err());
        assert!(parse_entry("1 2 X").is_err());
    }

    #[tokio::test]
    async fn the_script_rejects_lower_tokens_and_counts() {
        let server = distlock_testing::RedisServer::spawn().unwrap();
        let mut conn = connect(&server.url()).await.unwrap();
        let store = FencedStore::default();
        // Tokens near 2^52, as the lock issues them (microseconds since 1970), stay exact.
        let base = 1_763_000_000_000_000u64;
        assert!(store.write(&mut conn, "k", base + 10, 1).await.unwrap());
        assert!(
            store.write(&mut conn, "k", base + 10, 2).await.unwrap(),
            "equal token: same holder"
        );
        assert!(!store.write(&mut conn, "k", base + 9, 3).await.unwrap());
        assert!(store.write(&mut conn, "k", base + 11, 4).await.unwrap());
        assert!(!store.write(&mut conn, "k", base + 10, 5).await.unwrap());
        assert_eq!(store.read(&mut conn, "k").await.unwrap(), 4);
        let stats = store.stats(&mut conn, "k").await.unwrap();
        assert_eq!(
            stats,
            Stats {
                value: 4,
                token: base + 11,
                accepted: 3,
                rejected: 2
            }
        );
        let log = store.log(&mut conn, "k").await.unwrap();
        let verdicts: Vec<bool> = log.iter().map(|e| e.accepted).collect();
        assert_eq!(verdicts, [true, true, false, true, false]);
        assert_eq!(log[2].token, base + 9);
        assert_eq!(store.read(&mut conn, "other").await.unwrap(), 0);
    }

    /// The PostgreSQL store keeps the Redis store's rule, counters and log,
    /// and with its check off accepts the stale write the checker must catch.
    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn the_pg_function_rejects_lower_tokens_and_counts() {
        let server = distlock_testing::PostgresServer::start().unwrap();
        PgStore::create(&server.url()).await.unwrap();
        // Twice: creating it again changes nothing.
        PgStore::create(&server.url()).await.unwrap();
        let store = PgStore::connect(&server.url()).await.unwrap();
        let base = 1_763_000_000_000_000u64;
        assert!(store.write("k", base + 10, 1).await.unwrap());
        assert!(
            store.write("k", base + 10, 2).await.unwrap(),
            "equal token: same holder"
        );
        assert!(!store.write("k", base + 9, 3).await.unwrap());
        assert!(store.write("k", base + 11, 4).await.unwrap());
        assert!(!store.write("k", base + 10, 5).await.unwrap());
        assert_eq!(store.read("k").await.unwrap(), 4);
        assert_eq!(
            store.stats("k").await.unwrap(),
            Stats {
                value: 4,
                token: base + 11,
                accepted: 3,
                rejected: 2
            }
        );
        let log = store.log("k").await.unwrap();
        let verdicts: Vec<bool> = log.iter().map(|e| e.accepted).collect();
        assert_eq!(verdicts, [true, true, false, true, false]);
        assert_eq!((log[2].token, log[2].value), (base + 9, 3));
        assert_eq!(store.read("other").await.unwrap(), 0);
        // A first write is accepted whatever its token, as on Redis.
        assert!(store.write("fresh", 0, 1).await.unwrap());
        let sabotaged = store.unchecked();
        assert!(sabotaged.write("k", base + 1, 6).await.unwrap());
        let last = *sabotaged.log("k").await.unwrap().last().unwrap();
        assert_eq!(
            last,
            Entry {
                token: base + 1,
                value: 6,
                accepted: true
            }
        );
    }
}
