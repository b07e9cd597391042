//! `distlock check`: what a Redis server must offer for distlock, read with
//! plain redis-rs commands (`INFO`, `CONFIG GET`, `CLUSTER NODES`), without a
//! `LockManager`, so that it also runs against a server that a manager would
//! refuse.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

use crate::output::{human_duration, redact, CheckResult, Status};

/// Connect and command timeout of the checks.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Checks every node: the given URL, or, with `cluster`, every master of the
/// cluster that the first reachable URL belongs to (the given URLs when the
/// cluster cannot be read). `tls_ca` is a CA (PEM) to trust for `rediss://`.
pub async fn run(urls: &[String], cluster: bool, tls_ca: Option<Vec<u8>>) -> Vec<CheckResult> {
    let tls_ca = tls_ca.as_deref();
    let mut nodes = urls.to_vec();
    let mut results = Vec::new();
    if cluster {
        match cluster_masters(urls, tls_ca).await {
            Ok(view) => {
                let (status, detail) = view.judged();
                results.push(CheckResult {
                    check: "cluster".to_owned(),
                    status,
                    detail,
                });
                if !view.masters.is_empty() {
                    nodes = view
                        .masters
                        .iter()
                        .map(|addr| with_address(&urls[0], addr))
                        .collect();
                }
            }
            Err(detail) => results.push(CheckResult {
                check: "cluster".to_owned(),
                status: Status::Warn,
                detail: format!("cannot list the masters ({detail}); checking the given URLs"),
            }),
        }
    }
    let several = nodes.len() > 1;
    for url in &nodes {
        let label = |check: &str| {
            if several {
                format!("{check} [{}]", address_of(url))
            } else {
                check.to_owned()
            }
        };
        for (check, status, detail) in check_node(url, cluster, tls_ca).await {
            results.push(CheckResult {
                check: label(check),
                status,
                detail,
            });
        }
    }
    results
}

/// The checks of one node, as (check, status, detail).
async fn check_node(
    url: &str,
    cluster: bool,
    tls_ca: Option<&[u8]>,
) -> Vec<(&'static str, Status, String)> {
    let mut conn = match connect(url, tls_ca).await {
        Ok(conn) => conn,
        Err(e) => {
            return vec![(
                "connect",
                Status::Fail,
                format!("cannot connect to redis at {}: {e}", redact(url)),
            )]
        }
    };
    let mut results = vec![];
    let info = match info(&mut conn).await {
        Ok(info) => info,
        // Refused by the server (NOPERM: an ACL without `INFO`, as
        // `-@dangerous` leaves an application's user; ERR: a renamed or
        // unsupported command, as some proxies answer; not NOAUTH or
        // LOADING, which fail): what INFO tells is unknown, but
        // none of it fails the check; the rest is still checked.
        Err(e) if matches!(e.code(), Some("NOPERM" | "ERR")) => {
            return vec![
                (
                    "info",
                    Status::Warn,
                    format!(
                        "INFO refused ({e}): version, persistence, replication and cluster \
                         mode unknown; check them with a user allowed INFO"
                    ),
                ),
                eviction(&mut conn).await,
            ];
        }
        Err(e) => return vec![("info", Status::Fail, format!("INFO failed: {e}"))],
    };
    results.push(version(&info));
    results.push(eviction(&mut conn).await);
    results.push(persistence(&info, SystemTime::now()));
    results.push(replication(&info));
    results.push(cluster_mode(&info, cluster));
    results
}

/// A multiplexed connection with the checks' timeouts, trusting `tls_ca`
/// when given.
async fn connect(url: &str, tls_ca: Option<&[u8]>) -> redis::RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(TIMEOUT))
        .set_response_timeout(Some(TIMEOUT));
    let client = match tls_ca {
        Some(ca) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.to_vec()),
            },
        )?,
        None => redis::Client::open(url)?,
    };
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// `INFO` (server, persistence, replication, cluster) as a field map.
async fn info(conn: &mut MultiplexedConnection) -> redis::RedisResult<HashMap<String, String>> {
    let mut fields = HashMap::new();
    for section in ["server", "persistence", "replication", "cluster"] {
        let text: String = redis::cmd("INFO").arg(section).query_async(conn).await?;
        fields.extend(parse_info(&text));
    }
    Ok(fields)
}

/// The `field:value` lines of an `INFO` reply.
fn parse_info(text: &str) -> impl Iterator<Item = (String, String)> + '_ {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.trim_end().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
}

/// The server and its version: the scripts need 6.0 (`SET ... KEEPTTL`, `SCAN
/// ... TYPE`). Valkey reports the Redis version it is compatible with as
/// `redis_version` (7.2.4 for every Valkey so far) and its own as
/// `valkey_version`, and names itself in `server_name`.
fn version(info: &HashMap<String, String>) -> (&'static str, Status, String) {
    let Some(version) = info.get("redis_version") else {
        return (
            "version",
            Status::Warn,
            "unknown (no redis_version in INFO)".to_owned(),
        );
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let major_minor = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    let (status, detail) = if major_minor < (6, 0) {
        (
            Status::Fail,
            format!("{version}: distlock needs 6.0 or newer (SET KEEPTTL, SCAN TYPE)"),
        )
    } else if major_minor < (6, 2) {
        (
            Status::Warn,
            format!("{version}: works, but 6.2 or newer is recommended"),
        )
    } else {
        (Status::Ok, version.clone())
    };
    let detail = match (info.get("server_name"), info.get("valkey_version")) {
        (_, Some(valkey)) => format!("valkey {valkey} (Redis-compatible {detail})"),
        (Some(name), None) if name != "redis" => format!("{name} {detail}"),
        _ => format!("redis {detail}"),
    };
    ("version", status, detail)
}

/// `maxmemory-policy`: a policy that evicts keys with a TTL can evict a held
/// lock and hand it to a second holder.
async fn eviction(conn: &mut MultiplexedConnection) -> (&'static str, Status, String) {
    const CHECK: &str = "maxmemory-policy";
    let config: redis::RedisResult<HashMap<String, String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory*")
        .query_async(conn)
        .await;
    let config = match config {
        Ok(config) => config,
        Err(e) => {
            return (
                CHECK,
                Status::Warn,
                format!("unknown (CONFIG GET refused: {e}); make sure it is noeviction"),
            )
        }
    };
    let Some(policy) = config.get("maxmemory-policy") else {
        return (
            CHECK,
            Status::Warn,
            "unknown (not in CONFIG GET)".to_owned(),
        );
    };
    let limit = config.get("maxmemory").map_or("0", String::as_str);
    if policy == "noeviction" {
        return (CHECK, Status::Ok, policy.clone());
    }
    let evicts = policy.starts_with("allkeys-") || policy.starts_with("volatile-");
    if !evicts {
        return (CHECK, Status::Warn, format!("{policy}: unknown policy"));
    }
    let now = if limit == "0" {
        " (maxmemory is 0, no limit: nothing is evicted until one is set)"
    } else {
        ""
    };
    (
        CHECK,
        Status::Warn,
        format!(
            "{policy} may evict held locks (they have TTLs) and hand them to a second \
             holder{now}; use noeviction, or a Redis of its own for locks"
        ),
    )
}

/// Persistence: without AOF, a restart loses the locks written since the last
/// RDB snapshot, and their holders learn it only at their next renewal.
fn persistence(info: &HashMap<String, String>, now: SystemTime) -> (&'static str, Status, String) {
    let aof = info.get("aof_enabled").map(String::as_str) == Some("1");
    let last_save = info
        .get("rdb_last_save_time")
        .and_then(|t| t.parse::<u64>().ok())
        .map(|secs| UNIX_EPOCH + Duration::from_secs(secs));
    let ago = last_save
        .and_then(|t| now.duration_since(t).ok())
        .map_or_else(
            || "unknown".to_owned(),
            |d| format!("{} ago", human_duration(d)),
        );
    let bgsave_ok = info.get("rdb_last_bgsave_status").map(String::as_str) != Some("err");
    // A failed AOF write makes Redis refuse every write (MISCONF) until one
    // succeeds: no lock can be taken or released.
    if aof && info.get("aof_last_write_status").map(String::as_str) == Some("err") {
        return (
            "persistence",
            Status::Fail,
            "AOF on, and its last write failed: Redis refuses every write (MISCONF) until \
             one succeeds, so no lock can be taken; see the server's log (a full disk, \
             permissions)"
                .to_owned(),
        );
    }
    let (status, detail) = if aof {
        (Status::Ok, format!("AOF on; last RDB save {ago}"))
    } else {
        (
            Status::Warn,
            format!(
                "AOF off: a restart loses the locks taken since the last RDB save or start-up ({ago}), \
                 and a second holder can take them before the first notices"
            ),
        )
    };
    let status = if bgsave_ok { status } else { Status::Warn };
    let detail = if bgsave_ok {
        detail
    } else {
        format!(
            "{detail}; the last RDB save failed (with stop-writes-on-bgsave-error yes, the \
             default, Redis then refuses every write, MISCONF, until a save succeeds)"
        )
    };
    ("persistence", status, detail)
}

/// Replication: distlock must write to a master; replicas copy locks
/// asynchronously, so a failover can lose a fresh one.
fn replication(info: &HashMap<String, String>) -> (&'static str, Status, String) {
    if info.get("redis_mode").map(String::as_str) == Some("sentinel") {
        return (
            "replication",
            Status::Fail,
            "this is a Sentinel, which holds no keys: give distlock the master (applications: \
             LockManager::sentinel_builder with the sentinels' addresses)"
                .to_owned(),
        );
    }
    let role = info.get("role").map_or("unknown", String::as_str);
    let replicas: u32 = info
        .get("connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let (status, detail) = match role {
        "master" if replicas == 0 => (Status::Ok, "master, no replicas".to_owned()),
        "master" => (
            Status::Ok,
            format!(
                "master with {replicas} replica(s); a failover can lose locks taken just \
                 before it (see the builder's replica_ack)"
            ),
        ),
        "slave" | "replica" => (
            Status::Fail,
            "this is a replica (read-only): give distlock the master".to_owned(),
        ),
        other => (Status::Warn, format!("role {other}")),
    };
    ("replication", status, detail)
}

/// Cluster mode must match `--cluster` (a cluster needs `cluster_builder`).
fn cluster_mode(info: &HashMap<String, String>, cluster: bool) -> (&'static str, Status, String) {
    let enabled = info.get("cluster_enabled").map(String::as_str) == Some("1");
    let (status, detail) = match (enabled, cluster) {
        (true, true) => (Status::Ok, "enabled".to_owned()),
        (false, false) => (Status::Ok, "disabled".to_owned()),
        (true, false) => (
            Status::Fail,
            "enabled: pass --cluster (applications: LockManager::cluster_builder)".to_owned(),
        ),
        (false, true) => (
            Status::Fail,
            "disabled, but --cluster was given: drop --cluster".to_owned(),
        ),
    };
    ("cluster mode", status, detail)
}

/// What one node says of its cluster: the healthy masters and the state.
#[derive(Debug, Default, PartialEq)]
struct ClusterView {
    /// The healthy masters' `host:port`, sorted (see [`parse_cluster_masters`]).
    masters: Vec<String>,
    /// Masters flagged failed (or without an address) that still serve
    /// slots: no replica took them over.
    failed_with_slots: Vec<String>,
    /// `cluster_state` and `cluster_slots_ok` of `CLUSTER INFO`.
    state: String,
    slots_ok: Option<u64>,
}

impl ClusterView {
    /// The `cluster` check: ok only when the cluster serves every slot.
    fn judged(&self) -> (Status, String) {
        let masters = format!(
            "{} master(s): {}",
            self.masters.len(),
            self.masters.join(", ")
        );
        if self.state == "ok" && self.failed_with_slots.is_empty() && !self.masters.is_empty() {
            return (Status::Ok, masters);
        }
        let mut detail = format!(
            "cluster_state:{}, {} of 16384 slots served",
            if self.state.is_empty() {
                "unknown"
            } else {
                &self.state
            },
            self.slots_ok
                .map_or("an unknown number".to_owned(), |n| n.to_string())
        );
        if !self.failed_with_slots.is_empty() {
            detail.push_str(&format!(
                "; failed master(s) still owning slots: {}",
                self.failed_with_slots.join(", ")
            ));
        }
        detail.push_str(&format!(
            "; locks on the slots not served fail (CLUSTERDOWN); {masters}"
        ));
        (Status::Fail, detail)
    }
}

/// The cluster as the first URL that answers sees it: `CLUSTER NODES` and
/// `CLUSTER INFO`.
async fn cluster_masters(urls: &[String], tls_ca: Option<&[u8]>) -> Result<ClusterView, String> {
    let mut last_error = "no URL given".to_owned();
    for url in urls {
        let reply: redis::RedisResult<(String, String)> = async {
            let mut conn = connect(url, tls_ca).await?;
            let nodes = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut conn)
                .await?;
            let info = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut conn)
                .await?;
            Ok((nodes, info))
        }
        .await;
        match reply {
            Ok((nodes, info)) => {
                let fields: HashMap<String, String> = parse_info(&info).collect();
                let (masters, failed_with_slots) = parse_cluster_masters(&nodes);
                return Ok(ClusterView {
                    masters,
                    failed_with_slots,
                    state: fields.get("cluster_state").cloned().unwrap_or_default(),
                    slots_ok: fields.get("cluster_slots_ok").and_then(|n| n.parse().ok()),
                });
            }
            Err(e) => last_error = format!("{}: {e}", redact(url)),
        }
    }
    Err(last_error)
}

/// In a `CLUSTER NODES` reply: the healthy masters' addresses, sorted, and
/// the failed masters that still own slots. A master announcing a hostname
/// is named by it (the endpoint clients use, which TLS certificates name);
/// an IPv6 address is bracketed, as URLs take it.
fn parse_cluster_masters(text: &str) -> (Vec<String>, Vec<String>) {
    let mut masters = Vec::new();
    let mut failed = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(address), Some(flags)) = (fields.get(1), fields.get(2)) else {
            continue;
        };
        if !flags.split(',').any(|f| f == "master") {
            continue;
        }
        // `ip:port@cport[,hostname]`
        let (ip_port, hostname) = match address.split_once(',') {
            Some((ip_port, hostname)) => (ip_port, hostname),
            None => (*address, ""),
        };
        let ip_port = ip_port.split('@').next().unwrap_or(ip_port);
        let Some((ip, port)) = ip_port.rsplit_once(':') else {
            continue;
        };
        let host = if !hostname.is_empty() {
            hostname.to_owned()
        } else if ip.contains(':') && !ip.starts_with('[') {
            format!("[{ip}]")
        } else {
            ip.to_owned()
        };
        let named = format!("{host}:{port}");
        let broken = flags
            .split(',')
            .any(|f| matches!(f, "fail" | "noaddr" | "handshake"));
        // Slot ranges follow the 8 fixed fields.
        if broken {
            if fields.len() > 8 {
                failed.push(named);
            }
        } else {
            masters.push(named);
        }
    }
    masters.sort();
    failed.sort();
    (masters, failed)
}

/// `host:port` of a URL (after any credentials), for labels.
fn address_of(url: &str) -> &str {
    &url[address_range(url)]
}

/// Where the `host:port` of a URL is: after the scheme and any credentials,
/// up to the path, query or fragment.
fn address_range(url: &str) -> std::ops::Range<usize> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let start = url[start..].rfind('@').map_or(start, |i| start + i + 1);
    let len = url[start..]
        .find(['/', '?', '#'])
        .unwrap_or(url.len() - start);
    start..start + len
}

/// `url` with its `host:port` replaced by `addr`, keeping scheme, credentials
/// and the rest.
fn with_address(url: &str, addr: &str) -> String {
    let range = address_range(url);
    format!("{}{addr}{}", &url[..range.start], &url[range.end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn versions_are_graded() {
        let status = |v: &str| version(&fields(&[("redis_version", v)])).1;
        assert_eq!(status("5.0.14"), Status::Fail);
        assert_eq!(status("6.0.20"), Status::Warn);
        assert_eq!(status("6.2.0"), Status::Ok);
        assert_eq!(status("7.2.4"), Status::Ok);
        let detail = |pairs: &[(&str, &str)]| version(&fields(pairs)).2;
        assert_eq!(detail(&[("redis_version", "7.0.15")]), "redis 7.0.15");
        assert_eq!(
            detail(&[
                ("redis_version", "7.2.4"),
                ("server_name", "valkey"),
                ("valkey_version", "8.0.1")
            ]),
            "valkey 8.0.1 (Redis-compatible 7.2.4)"
        );
    }

    #[test]
    fn info_is_parsed() {
        let parsed: HashMap<_, _> =
            parse_info("# Server\r\nredis_version:7.0.15\r\nrole:master\r\n").collect();
        assert_eq!(parsed["redis_version"], "7.0.15");
        assert_eq!(parsed["role"], "master");
    }

    #[test]
    fn replicas_fail_and_cluster_mode_must_match() {
        assert_eq!(replication(&fields(&[("role", "slave")])).1, Status::Fail);
        // A Sentinel answers INFO, with no role of a data server.
        assert_eq!(
            replication(&fields(&[("redis_mode", "sentinel")])).1,
            Status::Fail
        );
        assert_eq!(
            cluster_mode(&fields(&[("cluster_enabled", "1")]), false).1,
            Status::Fail
        );
        assert_eq!(
            cluster_mode(&fields(&[("cluster_enabled", "0")]), false).1,
            Status::Ok
        );
    }

    #[test]
    fn persistence_without_aof_warns() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        let off = fields(&[("aof_enabled", "0"), ("rdb_last_save_time", "990")]);
        let (_, status, detail) = persistence(&off, now);
        assert_eq!(status, Status::Warn);
        assert!(detail.contains("10s ago"), "{detail}");
        assert_eq!(
            persistence(&fields(&[("aof_enabled", "1")]), now).1,
            Status::Ok
        );
        // A failed AOF write refuses every write until one succeeds.
        let failing = fields(&[("aof_enabled", "1"), ("aof_last_write_status", "err")]);
        assert_eq!(persistence(&failing, now).1, Status::Fail);
    }

    #[test]
    fn cluster_masters_are_read_from_cluster_nodes() {
        let text = "a 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460\n\
                    b 127.0.0.1:7002@17002,host2 master - 0 0 2 connected 5461-10922\n\
                    c 127.0.0.1:7003@17003 slave a 0 0 1 connected\n\
                    d 127.0.0.1:7004@17004 master,fail - 0 0 3 connected\n";
        let (masters, failed) = parse_cluster_masters(text);
        assert_eq!(masters, ["127.0.0.1:7001", "host2:7002"]);
        assert!(failed.is_empty(), "{failed:?}");
        // A failed master that still owns slots (no replica took over), and
        // IPv6 addresses, bracketed as URLs take them.
        let text = "a ::1:7001@17001 myself,master - 0 0 1 connected 0-5460\n\
                    d 10.0.0.4:7004@17004 master,fail - 0 0 3 connected 5461-16383\n";
        let (masters, failed) = parse_cluster_masters(text);
        assert_eq!(masters, ["[::1]:7001"]);
        assert_eq!(failed, ["10.0.0.4:7004"]);
    }

    #[test]
    fn a_cluster_that_does_not_serve_every_slot_fails_the_check() {
        let healthy = ClusterView {
            masters: vec!["h:1".to_owned()],
            failed_with_slots: vec![],
            state: "ok".to_owned(),
            slots_ok: Some(16384),
        };
        assert_eq!(healthy.judged().0, Status::Ok);
        let down = ClusterView {
            state: "fail".to_owned(),
            slots_ok: Some(10923),
            failed_with_slots: vec!["h:2".to_owned()],
            ..healthy
        };
        let (status, detail) = down.judged();
        assert_eq!(status, Status::Fail);
        assert!(
            detail.contains("cluster_state:fail") && detail.contains("h:2"),
            "{detail}"
        );
    }

    #[test]
    fn addresses_are_swapped_keeping_credentials() {
        assert_eq!(address_of("redis://:pw@h:1/0"), "h:1");
        assert_eq!(
            with_address("rediss://u:pw@h:1/0", "10.0.0.2:7000"),
            "rediss://u:pw@10.0.0.2:7000/0"
        );
    }
}
