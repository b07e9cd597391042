//! What `build()` checks before it hands out a manager: that Redis accepts this
//! client (authentication), lets it run everything a lock needs on the key prefix
//! (ACL), and will not evict lock keys (`maxmemory-policy`).
//!
//! Without these checks every one of those problems shows up later, at the first
//! lock, as a `Backend` error (or, for eviction, as two holders of one lock).

use std::collections::HashMap;

use std::future::Future;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use super::scripts::Scripts;
use crate::config::Config;
use crate::error::LockError;
use crate::keys::RedisNames;

/// The user key of the lock the start-up check takes and releases, followed by
/// the probe's owner token: managers built at once probe locks of their own, so
/// that one probe never finds another's lock busy (and skips a path).
const PROBE_KEY: &str = "distlock-startup-check";
/// The probe's lease: long enough that no path of the probe finds its lock
/// expired on a loaded machine; the probe deletes what it wrote, and a probe
/// cut short leaves keys that expire within this.
const PROBE_LEASE_MS: u64 = 2000;

/// What the server's `maxmemory-policy` does to lock keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EvictionRisk {
    /// `noeviction` (or a policy we do not know that does not say it evicts).
    None,
    /// `allkeys-*` evicts any key, `volatile-*` every key with a TTL: every held lock.
    Evicts(String),
    /// `CONFIG GET` is not allowed here (managed Redis, or an ACL without it).
    Unknown,
}

pub(crate) fn classify_policy(policy: &str) -> EvictionRisk {
    if policy.starts_with("allkeys-") || policy.starts_with("volatile-") {
        EvictionRisk::Evicts(policy.to_owned())
    } else {
        EvictionRisk::None
    }
}

/// Runs the checks over `conn` (one pipelined round trip; in a cluster, on the
/// node that owns the probe lock's slot) and over a short-lived pub/sub
/// connection from `subscribe` (SUBSCRIBE needs a connection of its own).
/// `protocol` is the one `conn` speaks (a URL's `?protocol=resp3`): `conn` is
/// the manager's own connection afterwards, and the check must leave it so.
pub(crate) async fn check<F>(
    conn: &mut impl ConnectionLike,
    protocol: redis::ProtocolVersion,
    subscribe: impl FnOnce() -> F,
    scripts: &Scripts,
    config: &Config,
    shown_url: &str,
) -> Result<(), LockError>
where
    F: Future<Output = Result<redis::aio::PubSub, RedisError>>,
{
    let owner = crate::config::owner_token();
    let keys = RedisNames::new(&config.key_prefix, &format!("{PROBE_KEY}:{owner}"));
    let refused = |reason: String| LockError::ServerCheck {
        url: shown_url.to_owned(),
        reason,
    };

    // PING first, alone: a server that wants a password answers NOAUTH to
    // everything, and that is a connection problem, not a permission one.
    // The connection has no response timeout of its own (see `Single::call`), so
    // every call here is bounded by the command timeout.
    let ping: Result<String, RedisError> =
        bounded(config, redis::cmd("PING").query_async(conn)).await;
    if let Err(e) = ping {
        return Err(if is_auth_error(&e) || unreachable(&e) || loading(&e) {
            LockError::connect(shown_url.to_owned(), e)
        } else {
            refused(format!("PING failed: {e}"))
        });
    }

    let (pipe, steps) = scripts.startup_probe(&keys, &owner, PROBE_LEASE_MS);
    let mut pipe = pipe;
    pipe.cmd("CONFIG").arg("GET").arg("maxmemory-policy");
    let replies: Vec<Value> = bounded(config, pipe.query_async(conn)).await.map_err(|e| {
        if loading(&e) {
            LockError::connect(shown_url.to_owned(), e)
        } else {
            refused(format!("the start-up check failed: {e}"))
        }
    })?;
    // The server's name and version, for the debug output: HELLO needs no
    // permission (INFO would, and a refused INFO lands in the ACL LOG), and
    // names Valkey as "valkey" with its own version. Alone, not in the
    // pipeline: a cluster pipeline goes to one node, and HELLO has no key.
    // HELLO switches the connection to the protocol it names, so it names the
    // one the connection speaks: `HELLO 2` on a RESP3 connection would turn
    // the manager's connection to RESP2 under redis-rs. (HELLO without a
    // version would not switch, but needs Redis 6.2; the scripts need 6.0.)
    let hello: Option<Value> = bounded(
        config,
        redis::cmd("HELLO")
            .arg(hello_version(protocol))
            .query_async(conn),
    )
    .await
    .ok();
    let (server, version) = server_of(hello.as_ref());
    tracing::debug!(target: "distlock::connection", url = shown_url, server, version, "server");
    let (probe_replies, config_reply) = replies.split_at(replies.len().saturating_sub(1));
    for (step, reply) in steps.iter().zip(probe_replies) {
        if let Value::ServerError(e) = reply {
            let e = RedisError::from(e.clone());
            if loading(&e) {
                return Err(LockError::connect(shown_url.to_owned(), e));
            }
            let text = e.to_string();
            let what = match step.command_in(&text) {
                Some(command) => format!("{}'s {command} call", step.name),
                None => step.name.to_owned(),
            };
            return Err(refused(format!(
                "{what} on {:?} was refused: {text}{}",
                keys.lock,
                permission_hint(&e, &config.key_prefix)
            )));
        }
    }

    let policy = config_reply.first().and_then(|reply| {
        redis::from_redis_value_ref::<HashMap<String, String>>(reply)
            .ok()?
            .remove("maxmemory-policy")
    });
    let risk = policy.map_or(EvictionRisk::Unknown, |p| classify_policy(&p));
    match risk {
        EvictionRisk::None => {}
        EvictionRisk::Unknown => tracing::debug!(
            target: "distlock::connection",
            url = shown_url,
            "could not read maxmemory-policy (CONFIG GET is not allowed here); \
             make sure the server does not evict keys with a TTL"
        ),
        EvictionRisk::Evicts(policy) => {
            let problem = format!(
                "maxmemory-policy is {policy}: once Redis reaches maxmemory it may evict a held \
                 lock, and then hand it to a second holder; set maxmemory-policy noeviction \
                 (or give locks a Redis of their own)"
            );
            if config.reject_evicting_policy {
                return Err(refused(problem));
            }
            tracing::warn!(target: "distlock::connection", url = shown_url, policy, "{problem}");
        }
    }

    check_subscribe(subscribe, keys.channel(), config)
        .await
        .map_err(|e| {
            if loading(&e) {
                return LockError::connect(shown_url.to_owned(), e);
            }
            refused(format!(
                "SUBSCRIBE to {:?} was refused: {e}{}",
                keys.channel(),
                permission_hint(&e, &config.key_prefix)
            ))
        })
}

/// The `HELLO` protocol version that keeps a connection speaking `protocol`.
fn hello_version(protocol: redis::ProtocolVersion) -> u8 {
    if protocol.supports_resp3() {
        3
    } else {
        2
    }
}

/// The server's name and version from a `HELLO` reply ("unknown" for what it
/// does not say, e.g. a server older than 6.0, which has no HELLO).
fn server_of(reply: Option<&Value>) -> (String, String) {
    let fields = reply
        .and_then(|reply| redis::from_redis_value_ref::<HashMap<String, Value>>(reply).ok())
        .unwrap_or_default();
    let text = |name: &str| {
        fields
            .get(name)
            .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
            .unwrap_or_else(|| "unknown".to_owned())
    };
    (text("server"), text("version"))
}

/// `call` under the command timeout; a timeout is an I/O error, as the
/// connection's own response timeout would have reported it.
async fn bounded<T>(
    config: &Config,
    call: impl std::future::Future<Output = Result<T, RedisError>>,
) -> Result<T, RedisError> {
    match tokio::time::timeout(config.command_timeout, call).await {
        Ok(result) => result,
        Err(_) => Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {:?}", config.command_timeout),
        ))),
    }
}

async fn check_subscribe<F>(
    subscribe: impl FnOnce() -> F,
    channel: &str,
    config: &Config,
) -> Result<(), RedisError>
where
    F: Future<Output = Result<redis::aio::PubSub, RedisError>>,
{
    let probe = async {
        let mut pubsub = subscribe().await?;
        pubsub.subscribe(channel).await?;
        pubsub.unsubscribe(channel).await
    };
    match tokio::time::timeout(config.connect_timeout + config.command_timeout, probe).await {
        Ok(result) => result,
        Err(_) => Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer in time",
        ))),
    }
}

/// The server is still loading its data after a restart (`LOADING`): not
/// ready yet, rather than unable to serve locks. A connection problem
/// (`LockError::Connect`), which a Redlock manager tolerates in a minority
/// of its members, not a `ServerCheck` refusal, which says the server as
/// configured cannot serve.
fn loading(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::BusyLoading) || e.code() == Some("LOADING")
}

/// The first call after connecting found no server: it went away or does
/// not answer (a connection problem, as above). Only for `PING`: a server
/// that answered it and then fails the probe is refused as such.
fn unreachable(e: &RedisError) -> bool {
    e.is_timeout() || e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
}

fn is_auth_error(e: &RedisError) -> bool {
    matches!(e.kind(), ErrorKind::AuthenticationFailed)
        || e.code().is_some_and(|c| c == "NOAUTH" || c == "WRONGPASS")
}

/// The ACL rule that would fix a permission error, for the message.
fn permission_hint(e: &RedisError, prefix: &str) -> String {
    let refused_by_acl = e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || e.code() == Some("NOPERM")
        // An ACL refusal inside a script comes back as a plain script error,
        // worded by Redis ("The user executing the script can't run this
        // command or subcommand") or by Valkey 9 ("ACL failure in script").
        || e.to_string().contains("user executing the script can't")
        || e.to_string().contains("ACL failure in script");
    if !refused_by_acl {
        return String::new();
    }
    format!(
        " (the ACL user needs: ~{prefix}* &{prefix}* {}; see docs/deploying.md, \"Passwords and \
         ACL users\")",
        REQUIRED_COMMANDS
    )
}

/// The commands a least-privilege ACL user needs, as ACL rules (kept in step with
/// docs/deploying.md, "The least-privilege ACL", and `tests/auth.rs`).
pub(crate) const REQUIRED_COMMANDS: &str = "+ping +evalsha +script|load +time +get +set \
     +pexpire +pttl +del +publish +subscribe +unsubscribe +zadd +zrange +zrem +zcard +hset +hget \
     +hdel";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_keeps_the_connections_protocol() {
        assert_eq!(hello_version(redis::ProtocolVersion::RESP2), 2);
        assert_eq!(hello_version(redis::ProtocolVersion::RESP3), 3);
    }

    #[test]
    fn the_server_is_read_from_a_resp2_or_a_resp3_hello() {
        let field = |k: &str, v: &str| {
            (
                Value::BulkString(k.as_bytes().to_vec()),
                Value::BulkString(v.as_bytes().to_vec()),
            )
        };
        let fields = [field("server", "valkey"), field("version", "9.1.2")];
        let resp2 = Value::Array(
            fields
                .iter()
                .flat_map(|(k, v)| [k.clone(), v.clone()])
                .collect(),
        );
        let resp3 = Value::Map(fields.to_vec());
        for reply in [resp2, resp3] {
            assert_eq!(
                server_of(Some(&reply)),
                ("valkey".to_owned(), "9.1.2".to_owned())
            );
        }
        assert_eq!(
            server_of(None),
            ("unknown".to_owned(), "unknown".to_owned())
        );
    }

    #[test]
    fn policies_are_classified() {
        assert_eq!(classify_policy("noeviction"), EvictionRisk::None);
        for evicting in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert_eq!(
                classify_policy(evicting),
                EvictionRisk::Evicts(evicting.to_owned())
            );
        }
    }
}
