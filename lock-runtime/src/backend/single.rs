//! One Redis server: a multiplexed connection, and beside it the direct lane
//! (see `direct.rs`) for whichever call finds it idle.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::calls::{KeyCall, Release};
use super::direct::{DirectCall, DirectLane, LaneTls};
use super::scripts::{self, AcquireAllReply, AcquireReply, AcquireSpec, Scripts};
use super::LeaseEnd;
use super::{read_renewals, CallError, ExpectedWaiters, Renewal};
use crate::config::{redact, Config, ReplicaAck, TlsSettings};
use crate::error::LockError;
use crate::keys::RedisNames;
use crate::lease::Lease;

pub(crate) struct Single {
    /// The multiplexed connection every call goes through, replaced after a
    /// call fails in a way that may leave it out of sync, or is refused (see
    /// [`Single::call_within`]).
    conn: Mutex<Conn>,
    /// A second connection, on which a call reads its own reply.
    direct: Arc<DirectLane>,
    /// How [`Single::direct`] opens its TLS session, for a `rediss://`
    /// server (kept for [`Single::on_runtime`]).
    lane_tls: LaneTls,
    /// Calls may take [`Single::direct`] (`Config::direct_lane`); when not,
    /// it is never opened.
    direct_enabled: bool,
    /// The calls on the multiplexed connection (see [`SharedCalls`]).
    shared: SharedCalls,
    conn_config: ConnectionManagerConfig,
    /// For pub/sub connections and the blocking release at runtime shutdown.
    client: redis::Client,
    scripts: Scripts,
    /// Replicas that must confirm an acquisition, if asked for.
    replica_ack: Option<ReplicaAck>,
    command_timeout: Duration,
    connect_timeout: Duration,
    /// Round trips spent on renewals (see `Backend::renewal_round_trips`).
    pub(crate) renewal_round_trips: AtomicU64,
    /// A blocking release failed here (see [`Single::release_blocking`]).
    blocking_release_failed: AtomicBool,
}

/// The current connection, and which one it is.
#[derive(Clone)]
struct Conn {
    generation: u64,
    redis: ConnectionManager,
}

/// The calls on the multiplexed connection, for [`Single::call_within`]'s
/// choice of lane.
#[derive(Default)]
struct SharedCalls {
    /// In flight now. While there are any, calls join them there rather than
    /// take the direct lane: concurrent commands share the connection's
    /// writes and the server's reads, which a round trip of its own would not
    /// (many tasks on distinct keys lost about a tenth of their throughput
    /// when each took the direct lane whenever it was free).
    in_flight: AtomicUsize,
    /// Calls given up before their reply came (cancelled, timed out): their
    /// request may still be on its way, in redis-rs's buffers or the
    /// network.
    given_up: AtomicU64,
    /// How many of those are known to have reached Redis: a call started
    /// after them was answered on the same connection, which answers in
    /// order. Until all have, calls stay on the multiplexed connection, so
    /// that none overtakes them (a cancelled acquisition's clean-up must
    /// reach Redis after the acquisition).
    settled: AtomicU64,
}

impl SharedCalls {
    fn may_go_direct(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0
            && self.settled.load(Ordering::Acquire) >= self.given_up.load(Ordering::Acquire)
    }

    fn start(&self) -> SharedCall<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        SharedCall {
            calls: self,
            given_up_before: self.given_up.load(Ordering::Acquire),
            answered: false,
        }
    }
}

/// One call in flight on the multiplexed connection, until dropped.
struct SharedCall<'a> {
    calls: &'a SharedCalls,
    given_up_before: u64,
    answered: bool,
}

impl SharedCall<'_> {
    /// The call's reply came: every call given up before it started has
    /// reached Redis.
    fn answered(mut self) {
        self.answered = true;
        self.calls
            .settled
            .fetch_max(self.given_up_before, Ordering::AcqRel);
    }
}

impl Drop for SharedCall<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.calls.given_up.fetch_add(1, Ordering::AcqRel);
        }
        self.calls.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The connection one call goes through (see [`Single::call`]).
enum Lane<'a> {
    Direct(DirectCall<'a>),
    Shared {
        generation: u64,
        redis: ConnectionManager,
    },
}

impl ConnectionLike for Lane<'_> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Lane::Direct(direct) => direct.req_packed_command(cmd),
            Lane::Shared { redis, .. } => redis.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Lane::Direct(direct) => direct.req_packed_commands(pipeline, offset, count),
            Lane::Shared { redis, .. } => redis.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Lane::Direct(direct) => direct.get_db(),
            Lane::Shared { redis, .. } => redis.get_db(),
        }
    }
}

impl Lane<'_> {
    /// The call's replies were not what it expected, so they may not be its
    /// own: the connection is not used again.
    fn out_of_step(&mut self, single: &Single) {
        match self {
            Lane::Direct(direct) => direct.out_of_step(),
            Lane::Shared { generation, .. } => single.retire_connection(*generation),
        }
    }
}

impl Single {
    /// Connects to `url` and runs the server check.
    pub(crate) async fn connect(
        url: &str,
        config: &Config,
        tls: &TlsSettings,
    ) -> Result<Single, LockError> {
        let shown_url = redact(url);
        let client = open_url(url, &shown_url, tls)?;
        Single::connect_client(client, shown_url, config, tls).await
    }

    /// Connects with `client` (made with `tls`) and runs the server check.
    pub(crate) async fn connect_client(
        client: redis::Client,
        shown_url: String,
        config: &Config,
        tls: &TlsSettings,
    ) -> Result<Single, LockError> {
        let conn_config = connection_config(config);
        let connecting = ConnectionManager::new_with_config(client.clone(), conn_config.clone());
        let mut conn = match tokio::time::timeout(config.connect_timeout, connecting).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(source)) => return Err(LockError::connect(shown_url, source)),
            Err(_) => return Err(super::connect_timed_out(shown_url, config.connect_timeout)),
        };
        let scripts = Scripts::new(&config.key_prefix);
        let subscribe_client = client.clone();
        super::check::check(
            &mut conn,
            client.get_connection_info().redis_settings().protocol(),
            || async move { subscribe_client.get_async_pubsub().await },
            &scripts,
            config,
            &shown_url,
        )
        .await?;
        Ok(Single::with_connection(
            client,
            conn,
            conn_config,
            scripts,
            config,
            tls,
        ))
    }

    /// A server that could not be reached at start-up (a Redlock member that is
    /// down): connected on first use, unchecked (a Redlock member runs
    /// [`Single::startup_check`] before it is used; a Sentinel's new master
    /// is a replica of the checked one).
    pub(crate) fn connect_lazily(
        url: &str,
        config: &Config,
        tls: &TlsSettings,
    ) -> Result<Single, LockError> {
        let shown_url = redact(url);
        let client = open_url(url, &shown_url, tls)?;
        Single::connect_client_lazily(client, shown_url, config, tls)
    }

    /// Like [`connect_lazily`](Self::connect_lazily), with a client (made
    /// with `tls`).
    pub(crate) fn connect_client_lazily(
        client: redis::Client,
        shown_url: String,
        config: &Config,
        tls: &TlsSettings,
    ) -> Result<Single, LockError> {
        let conn_config = connection_config(config);
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), conn_config.clone())
            .map_err(|source| LockError::connect(shown_url, source))?;
        Ok(Single::with_connection(
            client,
            conn,
            conn_config,
            Scripts::new(&config.key_prefix),
            config,
            tls,
        ))
    }

    /// The start-up check [`connect`](Self::connect) runs, for a server
    /// connected lazily (a Redlock member down or not ready at `build()`):
    /// a future of its own, to run in the background, on a fresh connection
    /// (made on first use) that becomes this server's. (redis-rs keeps a
    /// failed reconnection and hands its error to the next call even once
    /// the server is back, so the connection calls to a server that was
    /// down used would fail the check.)
    pub(crate) fn startup_check(
        &self,
        config: &Config,
        shown_url: String,
    ) -> impl std::future::Future<Output = Result<(), LockError>> + Send + 'static {
        self.retire_connection(self.connection().generation);
        let mut conn = self.connection().redis;
        let client = self.client.clone();
        let scripts = Scripts::new(&config.key_prefix);
        let config = config.clone();
        async move {
            let protocol = client.get_connection_info().redis_settings().protocol();
            super::check::check(
                &mut conn,
                protocol,
                || async move { client.get_async_pubsub().await },
                &scripts,
                &config,
                &shown_url,
            )
            .await
        }
    }

    fn with_connection(
        client: redis::Client,
        conn: ConnectionManager,
        conn_config: ConnectionManagerConfig,
        scripts: Scripts,
        config: &Config,
        tls: &TlsSettings,
    ) -> Single {
        let lane_tls = if config.direct_lane {
            lane_tls(&client, tls)
        } else {
            None
        };
        Single {
            conn: Mutex::new(Conn {
                generation: 0,
                redis: conn,
            }),
            shared: SharedCalls::default(),
            direct_enabled: config.direct_lane,
            direct: DirectLane::new(
                client.get_connection_info(),
                lane_tls.clone(),
                config.connect_timeout,
                tokio::runtime::Handle::try_current().ok(),
            ),
            lane_tls,
            conn_config,
            client,
            scripts,
            replica_ack: config.replica_ack,
            command_timeout: config.command_timeout,
            connect_timeout: config.connect_timeout,
            renewal_round_trips: AtomicU64::new(0),
            blocking_release_failed: AtomicBool::new(false),
        }
    }

    /// The same server, its direct lane opened and drained on `runtime`
    /// (the manager's), for a `Single` made inside a call (Sentinel following
    /// a failover), which would otherwise take the caller's runtime.
    pub(crate) fn on_runtime(mut self, runtime: Option<tokio::runtime::Handle>) -> Single {
        self.direct = DirectLane::new(
            self.client.get_connection_info(),
            self.lane_tls.clone(),
            self.connect_timeout,
            runtime,
        );
        self
    }

    fn connection(&self) -> Conn {
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Runs `op` on a connection under the command timeout, naming `key` in
    /// the error: on the direct lane's when it is idle, else on the
    /// multiplexed one. That timeout is the only one on the call (neither
    /// connection has a response timeout of its own): it bounds whatever the
    /// call does, waiting for the direct lane, a reconnect and a NOSCRIPT
    /// reload and retry included.
    async fn call<T>(
        &self,
        key: &str,
        op: impl AsyncFnOnce(&mut Lane<'_>) -> RedisResult<T>,
    ) -> Result<T, CallError> {
        self.call_within(key, self.command_timeout, op).await
    }

    /// [`Single::call`] under `timeout`.
    ///
    /// A call that may have lost its reply on a connection that stays open
    /// (Redis replies carry no request id, so every later reply on it would go
    /// to the wrong caller) retires the multiplexed connection: the next call
    /// opens a fresh one. So does a call whose reconnection was refused:
    /// redis-rs keeps the failed reconnection and gives its error to the
    /// next call, even once the server is back. The direct lane's connection
    /// sees to itself (see [`DirectCall`]).
    async fn call_within<T>(
        &self,
        key: &str,
        timeout: Duration,
        op: impl AsyncFnOnce(&mut Lane<'_>) -> RedisResult<T>,
    ) -> Result<T, CallError> {
        let mut shared = None;
        // Set when the timeout ends the call: then a direct connection still
        // owed a reply is closed rather than drained (the server may be
        // stalled, and later calls would wait for it).
        let gave_up = AtomicBool::new(false);
        let outcome = {
            let call = std::pin::pin!(tokio::time::timeout(timeout, async {
                let direct = if self.direct_enabled
                    && (self.direct.is_draining() || self.shared.may_go_direct())
                {
                    self.direct.take(timeout, &gave_up).await
                } else {
                    None
                };
                let mut in_flight = None;
                let mut lane = match direct {
                    Some(direct) => Lane::Direct(direct),
                    None => {
                        in_flight = Some(self.shared.start());
                        let conn = self.connection();
                        shared = Some(conn.generation);
                        Lane::Shared {
                            generation: conn.generation,
                            redis: conn.redis,
                        }
                    }
                };
                let reply = op(&mut lane).await;
                match (&reply, &mut lane) {
                    // A reply of another shape than the call expects (a type
                    // conversion, an owner token that is not ours) may not be
                    // its own: the multiplexed connection is retired for it
                    // (see `call_outcome`), the direct one closed.
                    (Err(e), Lane::Direct(direct)) if !super::server_answered(e) => {
                        direct.out_of_step()
                    }
                    _ => {}
                }
                let answered = match &reply {
                    Ok(_) => true,
                    Err(e) => super::server_answered(e),
                };
                if let (Some(in_flight), true) = (in_flight, answered) {
                    in_flight.answered();
                }
                reply
            }));
            let outcome = call.await;
            if outcome.is_err() {
                gave_up.store(true, Ordering::Relaxed);
            }
            outcome
            // The call, and with it its connection, is dropped here, after
            // the flag is set.
        };
        let result = super::call_outcome(key, timeout, outcome);
        if let (Err(e), Some(generation)) = (&result, shared) {
            // Refused: redis-rs keeps the failed reconnection, and the next
            // call would get its error even once the server is back; a
            // fresh connection (made on first use) tries again then.
            if e.maybe_executed || e.was_refused() {
                self.retire_connection(generation);
            }
        }
        result
    }

    /// Replaces connection `generation` with a fresh one (connected on first
    /// use), unless another caller already did.
    fn retire_connection(&self, generation: u64) {
        let mut current = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if current.generation != generation {
            return;
        }
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.conn_config.clone())
        {
            Ok(fresh) => {
                *current = Conn {
                    generation: generation + 1,
                    redis: fresh,
                };
                tracing::debug!(target: "distlock::connection",
                    generation,
                    "connection retired after a failed call"
                );
            }
            Err(e) => {
                tracing::warn!(target: "distlock::connection", error = %e, "could not open a fresh connection")
            }
        }
    }

    /// Makes `call` on this server (see `calls.rs`).
    pub(crate) async fn on_key<K: KeyCall>(
        &self,
        key: &str,
        call: &K,
    ) -> Result<K::Output, CallError> {
        let timeout = self.command_timeout + call.time_beyond_command_timeout();
        self.call_within(key, timeout, async |lane| {
            call.call(&self.scripts, lane).await
        })
        .await
    }

    pub(crate) async fn acquire(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        lease_ms: u64,
        spec: &AcquireSpec<'_>,
    ) -> Result<AcquireReply, CallError> {
        let Some(ack) = self.replica_ack else {
            return self
                .call(key, async |lane| {
                    self.scripts
                        .acquire(lane, keys, owner, lease_ms, spec)
                        .await
                })
                .await;
        };
        // Boxed: this path's future is twice the size of the plain call's,
        // which every acquisition without `replica_ack` would move otherwise.
        Box::pin(async {
            // The call may take the replicas' timeout on top of the command
            // timeout. The script and `WAIT` go on one connection: `WAIT`
            // counts the replicas that have every earlier write of its own.
            let (reply, acked) = self
                .call_within(key, self.command_timeout + ack.timeout, async |lane| {
                    self.scripts
                        .acquire_acked(lane, keys, owner, lease_ms, spec, &ack)
                        .await
                })
                .await?;
            // Give it back now rather than hold a lock a failover may forget.
            let release = Release {
                keys,
                owner,
                keep_ms: 0,
                waiters: ExpectedWaiters::GivenBack,
                receipt: None,
            };
            super::require_replicas(key, reply, acked, &ack, self.on_key(key, &release)).await
        })
        .await
    }

    /// The acquire-all script: one round trip. `None` when acquisitions need
    /// replicas to confirm them (the caller takes the locks one by one).
    pub(crate) async fn acquire_all(
        &self,
        key: &str,
        locks: &[&RedisNames],
        owner: &str,
        lease_ms: u64,
        spec: &AcquireSpec<'_>,
    ) -> Option<Result<AcquireAllReply, CallError>> {
        if self.replica_ack.is_some() {
            return None;
        }
        Some(
            self.call(key, async |lane| {
                self.scripts
                    .acquire_all(lane, locks, owner, lease_ms, spec)
                    .await
            })
            .await,
        )
    }

    /// The value of server setting `name` (`CONFIG GET`); `None` when the
    /// server has no such setting.
    pub(crate) async fn config_get(&self, name: &str) -> Result<Option<String>, CallError> {
        let mut get = redis::cmd("CONFIG");
        get.arg("GET").arg(name);
        let reply: std::collections::HashMap<String, String> = self
            .call("", async |lane| get.query_async(lane).await)
            .await?;
        Ok(reply.get(name).cloned())
    }

    /// Names of the lock keys matching `pattern` (a `SCAN MATCH` pattern).
    pub(crate) async fn scan_locks(&self, pattern: &str) -> Result<Vec<String>, CallError> {
        let mut names = Vec::new();
        let mut cursor = 0;
        loop {
            let scan = scripts::scan_cmd(cursor, pattern);
            let (next, page): (u64, Vec<String>) = self
                .call("", async |lane| scan.query_async(lane).await)
                .await?;
            names.extend(page);
            if next == 0 {
                return Ok(names);
            }
            cursor = next;
        }
    }

    /// `receipt`: see `Scripts::release_many_pipeline` (Sentinel's).
    pub(crate) async fn release_many(
        &self,
        locks: &[(&RedisNames, &str, u64)],
        receipt: Option<super::scripts::ReceiptTerms>,
    ) -> Result<Vec<bool>, CallError> {
        self.call("", async |lane| {
            self.scripts.release_many(lane, locks, receipt).await
        })
        .await
    }

    pub(crate) fn release_blocking(
        &self,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
    ) -> RedisResult<bool> {
        // Each waits up to the connect and command timeouts: once one failed
        // here (the server unreachable as the runtime shuts down), the later
        // ones are left to their leases, so that a shutdown with many guards
        // does not wait out each in turn (a Redlock member cut off, say, while
        // the others release).
        if self.blocking_release_failed.load(Ordering::Relaxed) {
            return Err(RedisError::from((
                ErrorKind::Client,
                "not sent: an earlier release at runtime shutdown failed on this server",
            )));
        }
        let released = (|| {
            let mut conn = self
                .client
                .get_connection_with_timeout(self.connect_timeout)?;
            conn.set_read_timeout(Some(self.command_timeout))?;
            conn.set_write_timeout(Some(self.command_timeout))?;
            self.scripts
                .release_blocking(&mut conn, keys, owner, keep_ms)
        })();
        if released.is_err() {
            self.blocking_release_failed.store(true, Ordering::Relaxed);
        }
        released
    }

    /// One pipeline of renew scripts: one round trip.
    pub(crate) async fn renew(&self, batch: &[Arc<Lease>], end: LeaseEnd) -> Vec<Renewal> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for lease in batch {
            pipe.add_command(self.scripts.renew_cmd(
                &lease.keys,
                &lease.owner,
                lease.lease_ms(),
                end,
            ));
        }
        let sent_at = Instant::now();
        self.renewal_round_trips.fetch_add(1, Ordering::Relaxed);
        let mut missing_script = false;
        let timeout = super::renewal_timeout(batch, end, self.command_timeout);
        let renewed = self
            .call_within("", timeout, async |lane| {
                let replies: Vec<RedisResult<(i64, String)>> = pipe.query_async(&mut *lane).await?;
                let mut out_of_sync = false;
                let outcomes = read_renewals(
                    batch,
                    replies,
                    sent_at,
                    &mut missing_script,
                    &mut out_of_sync,
                );
                if out_of_sync || outcomes.is_none() {
                    lane.out_of_step(self);
                }
                if out_of_sync {
                    // Loading the script on a connection out of step would
                    // read someone else's reply.
                    missing_script = false;
                }
                Ok(outcomes)
            })
            .await;
        let mut outcomes = match renewed {
            Ok(Some(outcomes)) => outcomes,
            Ok(None) => {
                let error =
                    scripts::out_of_sync("a renewal pipeline got the wrong number of replies");
                return failed_all(batch, &error.to_string());
            }
            Err(e) => return failed_all(batch, &e.error.to_string()),
        };
        if missing_script {
            // Redis restarted or flushed its scripts: load it and retry at once;
            // if even that fails, retry like any failed renewal.
            let loaded = self
                .call("", async |lane| self.scripts.load_renew(lane).await)
                .await;
            if let Err(e) = loaded {
                let error = e.error.to_string();
                for outcome in &mut outcomes {
                    if matches!(outcome, Renewal::Retry) {
                        *outcome = Renewal::Failed(error.clone());
                    }
                }
            }
        }
        outcomes
    }

    pub(crate) async fn pubsub(&self) -> RedisResult<redis::aio::PubSub> {
        self.client.get_async_pubsub().await
    }
}

/// The direct lane's TLS configuration for `client`'s server, when it is
/// reached by verified TLS (`rediss://` without `#insecure`): the
/// certificates `tls` gives redis for the multiplexed connection. A
/// configuration that cannot be made leaves the server without a lane (redis
/// reports what is wrong with the certificates).
#[cfg(feature = "tls")]
fn lane_tls(client: &redis::Client, tls: &TlsSettings) -> LaneTls {
    use redis::ConnectionAddr;
    if !matches!(
        client.get_connection_info().addr(),
        ConnectionAddr::TcpTls {
            insecure: false,
            ..
        }
    ) {
        return None;
    }
    match super::rustls_config::client_config(tls, "Redis TLS") {
        Ok(config) => Some(Arc::new(config)),
        Err(e) => {
            tracing::debug!(target: "distlock::connection", error = %e,
                "no direct lane: its TLS configuration could not be made");
            None
        }
    }
}

/// Without the `tls` feature there is no TLS server to reach.
#[cfg(not(feature = "tls"))]
fn lane_tls(_: &redis::Client, _: &TlsSettings) -> LaneTls {
    None
}

fn open_url(url: &str, shown_url: &str, tls: &TlsSettings) -> Result<redis::Client, LockError> {
    super::open_client(url, tls)
        .map_err(|e| LockError::InvalidConfig(format!("invalid redis URL {shown_url}: {e}")))
}

/// The settings of a server's connection (also the cluster's release
/// connections to each master).
pub(crate) fn connection_config(config: &Config) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        // No response timeout here: `Single::call`'s timeout is the one bound
        // on a call, covering a reconnect, a script reload and the retry
        // together; a second timer per call only cost time (two timers
        // armed and cancelled per round trip).
        .set_response_timeout(None)
        // Reconnection is retried by every later call; a few quick tries here
        // keep a call that meets a restart from waiting long. Quick enough
        // (25-50 ms, then 50-100 ms with the jitter) that a server that is
        // down refuses the call within its timeout: a refused call was never
        // sent, where a call cut by its timeout may have run. (Redlock's
        // members try once: each call there may have only a tenth of the
        // lease.)
        .set_number_of_retries(config.reconnect_retries)
        .set_min_delay(Duration::from_millis(25))
        .set_max_delay(Duration::from_millis(50))
}

pub(crate) fn failed_all(batch: &[Arc<Lease>], error: &str) -> Vec<Renewal> {
    batch
        .iter()
        .map(|_| Renewal::Failed(error.to_owned()))
        .collect()
}
