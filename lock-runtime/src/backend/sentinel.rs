//! A master found through Redis Sentinel, followed across failovers.
//!
//! The sentinels name the master (`SENTINEL GET-MASTER-ADDR-BY-NAME`); the
//! backend then works exactly as [`Single`] on it. When a call fails in a way
//! a failover explains (the connection broke or timed out, or the server
//! answered `READONLY`: it was demoted to a replica), the backend asks the
//! sentinels again and, if they name another master, moves every later call
//! to it: acquisitions and releases retry once there, renewals at once. Until
//! a call succeeds on a master the sentinels still name, every call asks them
//! first, and an answer from a master they no longer name is discarded and the
//! call made again on the one they name: a master that comes back at its old
//! address after the failover (restarted empty, still calling itself master
//! until the sentinels demote it) would otherwise take the calls its
//! reconnecting connection had queued. The subscriber asks the sentinels
//! before each (re)connection, so it follows too. The data nodes take the
//! user, password and TLS settings of the sentinel URLs.
//!
//! A planned failover (`SENTINEL FAILOVER`) fails no call: the sentinels
//! promote a replica within a second but demote the old master only 8 to
//! 18 s later, and until then it takes writes. So calls also ask the
//! sentinels in the background, at most every [`MASTER_CHECK_INTERVAL`]
//! (see [`Sentinel::master_check`]), and follow the master they name;
//! a renewal round waits briefly for that answer, and renews on the new
//! master at once when it names one: leases renewed only on the old master
//! would expire on the new one, where another manager then takes the lock.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{RedisError, RedisResult};

use super::calls::KeyCall;
use super::scripts::{AcquireAllReply, AcquireReply, AcquireSpec};
use super::single::Single;
use super::LeaseEnd;
use super::{CallError, Renewal};
use crate::config::{redact_all, Config, TlsSettings};
use crate::error::{BackendErrorKind, LockError};
use crate::keys::RedisNames;
use crate::lease::Lease;

/// How often, at most, calls ask the sentinels whom they name as master
/// when no call failed (the sentinels' own view changes within a second of
/// a planned failover's start).
const MASTER_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// How long a renewal round waits, at most, for the answer to a question
/// it asked alongside its renewals (and never longer than its renewals may
/// take, see `renewal_timeout`): a sentinel slow to answer holds that round
/// up this long at most, and no other; a later call takes the answer.
const MASTER_CHECK_WAIT: Duration = Duration::from_millis(100);

/// The background questions to the sentinels (see [`Sentinel::master_check`]),
/// shared with the task that asks.
struct MasterChecks {
    state: Mutex<MasterCheckState>,
    /// What every call reads before it takes `state`'s lock, so a call with
    /// nothing to do takes no lock: whether an answer waits in `state`...
    answer_waiting: std::sync::atomic::AtomicBool,
    /// ... and until when no question is due (nanoseconds from `since`).
    quiet_until: std::sync::atomic::AtomicU64,
    since: Instant,
    /// Told when a question was answered.
    answered: tokio::sync::Notify,
    /// The connection to the sentinel that answered last (see
    /// [`ask_sentinels_keeping`]).
    kept: Mutex<Option<(usize, MultiplexedConnection)>>,
}

struct MasterCheckState {
    /// A question is out: its task runs (bounded by the sentinels' timeouts).
    asking: bool,
    /// When the last question was asked.
    asked_at: Instant,
    /// The last answer, until a call takes it.
    answer: Option<MasterAnswer>,
}

/// A sentinel's answer to a background question.
struct MasterAnswer {
    /// When the question was asked (to order it against a failed call's).
    asked_at: Instant,
    /// When the answer came (to tell whether it is still fresh).
    answered_at: Instant,
    address: (String, u16),
}

/// Ends a background question however its task ends (answered, or dropped
/// unrun by a runtime shutting down): the next may be asked, and callers
/// waiting for it stop waiting.
struct QuestionOut(Arc<MasterChecks>);

impl MasterChecks {
    /// Whether a call that waits for nothing has nothing to do: no answer to
    /// take, no question due. Read without the lock, so a call may miss an
    /// answer stored that instant; the next call takes it.
    fn nothing_to_do(&self) -> bool {
        !self.answer_waiting.load(Ordering::Acquire)
            && nanos_between(self.since, Instant::now()) < self.quiet_until.load(Ordering::Acquire)
    }

    /// Stores `answer` in `state` (whose lock the caller holds), flagged for
    /// [`MasterChecks::nothing_to_do`].
    fn store_answer(&self, state: &mut MasterCheckState, answer: MasterAnswer) {
        state.answer = Some(answer);
        self.answer_waiting.store(true, Ordering::Release);
    }

    /// Takes the answer out of `state` (whose lock the caller holds).
    fn take_answer(&self, state: &mut MasterCheckState) -> Option<MasterAnswer> {
        self.answer_waiting.store(false, Ordering::Release);
        state.answer.take()
    }
}

/// Nanoseconds from `since` to `at` (0 if `at` is earlier), saturating.
fn nanos_between(since: Instant, at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(since).as_nanos()).unwrap_or(u64::MAX)
}

impl Drop for QuestionOut {
    fn drop(&mut self) {
        self.0
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .asking = false;
        self.0.answered.notify_waiters();
    }
}

pub(crate) struct Sentinel {
    sentinels: Vec<redis::Client>,
    master_name: String,
    /// The master every call goes to, replaced when the sentinels name another.
    current: RwLock<Arc<Single>>,
    /// Its address, to tell whether the sentinels name a new one.
    address: Mutex<(String, u16)>,
    /// One rediscovery at a time; the others wait for its outcome.
    rediscovering: tokio::sync::Mutex<()>,
    /// When the last query a sentinel answered was sent: a caller that
    /// needed one before then takes its answer rather than asking again
    /// (see [`Sentinel::ask_and_follow`]).
    last_asked: Mutex<Option<std::time::Instant>>,
    /// Set when a call failed in a way a failover explains; until cleared,
    /// every call first asks the sentinels whom they name (see
    /// [`Sentinel::master`]).
    suspect: std::sync::atomic::AtomicBool,
    /// The background questions to the sentinels (see
    /// [`Sentinel::master_check`]).
    master_checks: Arc<MasterChecks>,
    /// Whether a call succeeded on the current master since it became
    /// suspect: with the sentinels still naming it, it is trusted again.
    answered_while_suspect: std::sync::atomic::AtomicBool,
    pub(super) config: Config,
    /// The manager's runtime, on which a new master's direct lane runs.
    runtime: Option<tokio::runtime::Handle>,
    /// The certificates of every master's connections (its direct lane's).
    tls: TlsSettings,
    shown: String,
}

impl Sentinel {
    pub(crate) async fn connect(
        sentinel_urls: &[String],
        master_name: &str,
        config: &Config,
        tls: &TlsSettings,
    ) -> Result<Sentinel, LockError> {
        if sentinel_urls.is_empty() {
            return Err(LockError::InvalidConfig(
                "sentinel_builder needs at least one sentinel URL".to_owned(),
            ));
        }
        if master_name.is_empty() {
            return Err(LockError::InvalidConfig(
                "sentinel_builder needs the master's name".to_owned(),
            ));
        }
        let shown = redact_all(sentinel_urls);
        let sentinels = sentinel_urls
            .iter()
            .map(|url| super::open_client(url, tls))
            .collect::<RedisResult<Vec<_>>>()
            .map_err(|e| LockError::InvalidConfig(format!("invalid sentinel URLs {shown}: {e}")))?;
        let (host, port) = ask_sentinels(&sentinels, master_name, config)
            .await
            .map_err(|e| e.into_build_error(shown.clone(), master_name))?;
        let client = super::client_at(&sentinels[0], &host, port)
            .map_err(|e| LockError::InvalidConfig(format!("master address {host}:{port}: {e}")))?;
        let master = Single::connect_client(
            client,
            format!("{host}:{port} (master {master_name:?})"),
            config,
            tls,
        )
        .await?;
        Ok(Sentinel {
            sentinels,
            master_name: master_name.to_owned(),
            current: RwLock::new(Arc::new(master)),
            address: Mutex::new((host, port)),
            rediscovering: tokio::sync::Mutex::new(()),
            last_asked: Mutex::new(None),
            suspect: std::sync::atomic::AtomicBool::new(false),
            master_checks: Arc::new(MasterChecks {
                state: Mutex::new(MasterCheckState {
                    asking: false,
                    asked_at: Instant::now(),
                    answer: None,
                }),
                answer_waiting: std::sync::atomic::AtomicBool::new(false),
                // As `asked_at`: the first question is due an interval
                // after the start.
                quiet_until: std::sync::atomic::AtomicU64::new(
                    u64::try_from(MASTER_CHECK_INTERVAL.as_nanos()).unwrap_or(u64::MAX),
                ),
                since: Instant::now(),
                answered: tokio::sync::Notify::new(),
                kept: Mutex::new(None),
            }),
            answered_while_suspect: std::sync::atomic::AtomicBool::new(false),
            config: config.clone(),
            tls: tls.clone(),
            runtime: tokio::runtime::Handle::try_current().ok(),
            shown,
        })
    }

    pub(crate) fn current(&self) -> Arc<Single> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Asks the sentinels for the master after `failed` failed a call; true
    /// when calls now go to another master than `failed`.
    async fn rediscover(&self, failed: &Arc<Single>) -> bool {
        // Boxed: asking the sentinels is a future several times the size of
        // a call, and rare; every call on this backend would carry it inline.
        Box::pin(self.ask_and_follow(failed)).await
    }

    /// [`rediscover`](Self::rediscover)'s work. Callers that need the
    /// sentinels' answer at once (every call that found its master gone, or
    /// every call while it is suspect) share one query: one that waited
    /// for another's takes its answer when that query was sent after it
    /// needed one (the answer is as fresh as a query of its own would have
    /// been), rather than asking again, one after another.
    async fn ask_and_follow(&self, failed: &Arc<Single>) -> bool {
        let needed_at = std::time::Instant::now();
        let _one_at_a_time = self.rediscovering.lock().await;
        if !Arc::ptr_eq(&self.current(), failed) {
            return true;
        }
        let answered_since = self
            .last_asked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at >= needed_at);
        if answered_since {
            // It named this master.
            return false;
        }
        let asked_at = std::time::Instant::now();
        let asked = ask_sentinels(&self.sentinels, &self.master_name, &self.config).await;
        // Only an answer is shared: after a query no sentinel answered, each
        // waiting caller asks for itself (one that stops here would take
        // "no answer" for "the same master", and trust it again).
        if asked.is_ok() {
            *self.last_asked.lock().unwrap_or_else(|e| e.into_inner()) = Some(asked_at);
        }
        match asked {
            Ok((host, port)) => self.follow(host, port),
            Err(e) => {
                tracing::warn!(target: "distlock::connection",
                    sentinels = %self.shown,
                    error = %e,
                    "could not ask the sentinels for the master"
                );
                false
            }
        }
    }

    /// Moves every later call to the master at `host:port` when it is not
    /// the current one; true when it moved them.
    fn follow(&self, host: String, port: u16) -> bool {
        if *self.address.lock().unwrap_or_else(|e| e.into_inner()) == (host.clone(), port) {
            return false;
        }
        let shown = format!("{host}:{port} (master {:?})", self.master_name);
        let master = super::client_at(&self.sentinels[0], &host, port)
            .map_err(|e| LockError::InvalidConfig(e.to_string()))
            .and_then(|client| {
                Single::connect_client_lazily(client, shown, &self.config, &self.tls)
            })
            .map(|master| master.on_runtime(self.runtime.clone()));
        match master {
            Ok(master) => {
                tracing::info!(target: "distlock::connection",
                    master = %format!("{host}:{port}"),
                    name = %self.master_name,
                    "following a failover to the master the sentinels name"
                );
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(master);
                *self.address.lock().unwrap_or_else(|e| e.into_inner()) = (host, port);
                true
            }
            Err(e) => {
                tracing::warn!(target: "distlock::connection", error = %e, "could not open the new master");
                false
            }
        }
    }

    /// The master to call: the current one, after asking the sentinels first
    /// while it is suspect. A master that failed (killed, cut off) may come
    /// back at its old address after the sentinels promoted a replica, empty
    /// and still calling itself master until they demote it; the connection
    /// would reconnect to it and take locks the new master does not know.
    /// Asking the sentinels before each call while suspect moves the calls to
    /// the master they name as soon as they name it.
    async fn master(&self) -> Arc<Single> {
        // A background answer naming another master moves this call at once.
        let _ = self.master_check(Duration::ZERO).await;
        let master = self.current();
        if !self.suspect.load(Ordering::Acquire) {
            return master;
        }
        if self.rediscover(&master).await {
            return self.current();
        }
        // The sentinels still name it: trusted again once it answered.
        if self.answered_while_suspect.load(Ordering::Acquire) {
            self.suspect.store(false, Ordering::Release);
        }
        master
    }

    /// Asks the sentinels in the background whom they name as master (at
    /// most every [`MASTER_CHECK_INTERVAL`]), and follows the master an
    /// answer names; true when calls moved to another master. A call waits
    /// up to `wait` for a question out (a renewal round: the question its
    /// own `master()` sent, or one already out); any call takes an answer
    /// that came.
    ///
    /// No call fails on the old master during a planned failover: it takes
    /// writes until the sentinels demote it, 8 to 18 s after they promoted a
    /// replica, while other managers already lock on the new master. The
    /// question runs as a task of its own, so a sentinel slow to answer
    /// holds no call up beyond `wait`.
    async fn master_check(&self, wait: Duration) -> bool {
        let checks = &self.master_checks;
        // Every acquire and release of a sentinel manager comes here: with
        // no answer to take and no question due, it takes no lock.
        if wait.is_zero() && checks.nothing_to_do() {
            return false;
        }
        // Made before the question is out, so its answer is not missed.
        let answered = (!wait.is_zero()).then(|| checks.answered.notified());
        self.ask_in_background();
        let take = || {
            let mut state = checks.state.lock().unwrap_or_else(|e| e.into_inner());
            (checks.take_answer(&mut state), state.asking)
        };
        let (mut answer, asking) = take();
        if let Some(answered) = answered.filter(|_| answer.is_none() && asking) {
            let _ = tokio::time::timeout(wait, answered).await;
            answer = take().0;
        }
        let Some(answer) = answer else {
            return false;
        };
        // An answer nobody took for a while (an idle manager's) may be out
        // of date: the next question is due anyway.
        if answer.answered_at.elapsed() > 2 * MASTER_CHECK_INTERVAL {
            return false;
        }
        // A failed call's query runs: the answer waits for the next call.
        let Ok(_one_at_a_time) = self.rediscovering.try_lock() else {
            let mut state = checks.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.answer.is_none() {
                checks.store_answer(&mut state, answer);
            }
            return false;
        };
        {
            let mut last = self.last_asked.lock().unwrap_or_else(|e| e.into_inner());
            // A failed call's query asked since, and was followed: this
            // older answer may name the master it left.
            if last.is_some_and(|at| at > answer.asked_at) {
                return false;
            }
            *last = Some(answer.asked_at);
        }
        let (host, port) = answer.address;
        self.follow(host, port)
    }

    /// Sends a question to the sentinels in a task of its own when none is
    /// out and the last was asked [`MASTER_CHECK_INTERVAL`] ago or more;
    /// true when it did.
    fn ask_in_background(&self) -> bool {
        let checks = &self.master_checks;
        let runtime = match &self.runtime {
            Some(runtime) => runtime.clone(),
            None => match tokio::runtime::Handle::try_current() {
                Ok(runtime) => runtime,
                Err(_) => return false,
            },
        };
        let asked_at = Instant::now();
        {
            let mut state = checks.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.asking || state.asked_at.elapsed() < MASTER_CHECK_INTERVAL {
                return false;
            }
            state.asking = true;
            state.asked_at = asked_at;
            checks.quiet_until.store(
                nanos_between(checks.since, asked_at + MASTER_CHECK_INTERVAL),
                Ordering::Release,
            );
        }
        // Out from here: dropped unrun (a runtime shutting down), it ends
        // the question as an answer would (the lock above is released, as
        // that drop takes it).
        let out = QuestionOut(checks.clone());
        let (sentinels, master_name, config) = (
            self.sentinels.clone(),
            self.master_name.clone(),
            self.config.clone(),
        );
        runtime.spawn(async move {
            let asked = ask_sentinels_keeping(&sentinels, &out.0.kept, &master_name, &config).await;
            // No sentinel answered: the calls' own failures ask them.
            if let Ok(address) = asked {
                let mut state = out.0.state.lock().unwrap_or_else(|e| e.into_inner());
                let answer = MasterAnswer {
                    asked_at,
                    answered_at: Instant::now(),
                    address,
                };
                out.0.store_answer(&mut state, answer);
            }
            drop(out);
        });
        true
    }

    /// Records how a call on `master` went, for [`Sentinel::master`].
    fn outcome<T>(&self, master: &Arc<Single>, result: &Result<T, CallError>) {
        match result {
            Err(e) if failover_suspected(e) => {
                self.answered_while_suspect.store(false, Ordering::Release);
                self.suspect.store(true, Ordering::Release);
            }
            _ if Arc::ptr_eq(master, &self.current()) => {
                self.answered_while_suspect.store(true, Ordering::Release);
            }
            _ => {}
        }
    }

    /// Runs `call` on the master; when it fails in a way a failover explains
    /// and the sentinels name another master, runs it once more there. An
    /// acquisition retried so keeps its owner token, so a retry finds the lock
    /// ours if the first attempt took it after all.
    async fn call<T, F, Fut>(&self, call: F) -> Result<T, CallError>
    where
        F: Fn(Arc<Single>) -> Fut,
        Fut: std::future::Future<Output = Result<T, CallError>>,
    {
        let master = self.master().await;
        let suspect = self.suspect.load(Ordering::Acquire);
        let result = call(master.clone()).await;
        self.outcome(&master, &result);
        let retry = match &result {
            Err(e) => failover_suspected(e) && self.rediscover(&master).await,
            // An answer from a suspect master counts only if the sentinels
            // still name it: a call queued while the connection reconnected
            // may have run on the old master restarted empty at its address
            // after the sentinels promoted a replica (what it did there is
            // wiped when they demote it).
            Ok(_) => suspect && self.rediscover(&master).await,
        };
        if !retry {
            return result;
        }
        let first_may_have_run = first_may_have_run(&result);
        let master = self.current();
        let result = call(master.clone()).await;
        self.outcome(&master, &result);
        after_retry(result, first_may_have_run)
    }

    /// Makes `call` on the current master (see `calls.rs`), once more on the
    /// next one after a failover.
    pub(crate) async fn on_key<K: KeyCall>(
        &self,
        key: &str,
        call: &K,
    ) -> Result<K::Output, CallError> {
        self.call(|master| async move { master.on_key(key, call).await })
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
        self.call(|master| async move { master.acquire(key, keys, owner, lease_ms, spec).await })
            .await
    }

    /// The master's acquire-all (see `Single::acquire_all`), retried once on
    /// the new master after a failover, with the same owner token.
    pub(crate) async fn acquire_all(
        &self,
        key: &str,
        locks: &[&RedisNames],
        owner: &str,
        lease_ms: u64,
        spec: &AcquireSpec<'_>,
    ) -> Option<Result<AcquireAllReply, CallError>> {
        let master = self.master().await;
        let suspect = self.suspect.load(Ordering::Acquire);
        let result = master
            .acquire_all(key, locks, owner, lease_ms, spec)
            .await?;
        self.outcome(&master, &result);
        // As in `call`: retried on the master the sentinels name now.
        let retry = match &result {
            Err(e) => failover_suspected(e) && self.rediscover(&master).await,
            Ok(_) => suspect && self.rediscover(&master).await,
        };
        if !retry {
            return Some(result);
        }
        let first_may_have_run = first_may_have_run(&result);
        let master = self.current();
        let result = master
            .acquire_all(key, locks, owner, lease_ms, spec)
            .await?;
        self.outcome(&master, &result);
        Some(after_retry(result, first_may_have_run))
    }

    pub(crate) async fn config_get(&self, name: &str) -> Result<Option<String>, CallError> {
        self.call(|master| async move { master.config_get(name).await })
            .await
    }

    pub(crate) async fn scan_locks(&self, pattern: &str) -> Result<Vec<String>, CallError> {
        self.call(|master| async move { master.scan_locks(pattern).await })
            .await
    }

    pub(crate) async fn release_many(
        &self,
        locks: &[(&RedisNames, &str, u64)],
    ) -> Result<Vec<bool>, CallError> {
        // Sent again on the next master after a failover: with receipts,
        // drawn once for both sends.
        let receipt = super::scripts::ReceiptTerms::drawn(self.config.receipt_ms());
        self.call(|master| async move { master.release_many(locks, receipt).await })
            .await
    }

    pub(crate) fn release_blocking(
        &self,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
    ) -> RedisResult<bool> {
        self.current().release_blocking(keys, owner, keep_ms)
    }

    pub(crate) async fn renew(&self, batch: &[Arc<Lease>], end: LeaseEnd) -> Vec<Renewal> {
        let master = self.master().await;
        // The sentinels are asked alongside the renewals: a planned failover
        // fails none of them on the old master (see `master_check`).
        let wait = MASTER_CHECK_WAIT.min(super::renewal_timeout(
            batch,
            end,
            self.config.command_timeout,
        ));
        let (mut outcomes, moved) = tokio::join!(master.renew(batch, end), self.master_check(wait));
        // Moved by this round's answer, or by another call's meanwhile.
        if moved || !Arc::ptr_eq(&master, &self.current()) {
            // What the old master answered counts for nothing: it is to be
            // demoted, and its writes with it. Renew on the new one at once.
            for outcome in &mut outcomes {
                *outcome = Renewal::Retry;
            }
            return outcomes;
        }
        let failed = outcomes.iter().any(|o| matches!(o, Renewal::Failed(_)));
        if failed {
            self.answered_while_suspect.store(false, Ordering::Release);
            self.suspect.store(true, Ordering::Release);
        } else if !outcomes.is_empty() && Arc::ptr_eq(&master, &self.current()) {
            self.answered_while_suspect.store(true, Ordering::Release);
        }
        if failed && self.rediscover(&master).await {
            // Renew on the new master at once rather than a third of a lease later.
            for outcome in &mut outcomes {
                if matches!(outcome, Renewal::Failed(_)) {
                    *outcome = Renewal::Retry;
                }
            }
        }
        outcomes
    }

    /// A pub/sub connection to the master the sentinels name now.
    pub(crate) async fn pubsub(&self) -> RedisResult<redis::aio::PubSub> {
        let master = self.current();
        self.rediscover(&master).await;
        self.current().pubsub().await
    }

    #[cfg(feature = "testing")]
    pub(crate) fn renewal_round_trips(&self) -> u64 {
        self.current()
            .renewal_round_trips
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Whether a call that is retried on the next master may have run on the
/// first (its reply lost, or an answer from a master the sentinels no
/// longer name).
fn first_may_have_run<T>(result: &Result<T, CallError>) -> bool {
    result.as_ref().map_or_else(|e| e.maybe_executed, |_| true)
}

/// The retry's outcome; a failure says the call may have run when the first
/// attempt may have (its caller then cleans up what the first may have
/// taken, whatever the retry found).
fn after_retry<T>(result: Result<T, CallError>, first_may_have_run: bool) -> Result<T, CallError> {
    result.map_err(|e| CallError {
        maybe_executed: e.maybe_executed || first_may_have_run,
        ..e
    })
}

/// Whether a failed call may be explained by a failover: the master is gone or
/// unreachable (the reply may have been lost, or the connection was refused:
/// nothing was sent, but the master is down all the same), or it was demoted
/// (`READONLY`).
fn failover_suspected(e: &CallError) -> bool {
    if e.maybe_executed {
        return true;
    }
    match &e.error {
        LockError::Backend { source, .. } => {
            matches!(
                source.kind(),
                BackendErrorKind::Connection | BackendErrorKind::Timeout
            ) || matches!(source.code(), Some("READONLY" | "MASTERDOWN"))
        }
        _ => false,
    }
}

/// The master's address from the first sentinel to name it (see
/// [`ask_sentinels_through`]).
async fn ask_sentinels(
    sentinels: &[redis::Client],
    master_name: &str,
    config: &Config,
) -> Result<(String, u16), NoMasterNamed> {
    ask_sentinels_through(sentinels, master_name, config, None)
        .await
        .map(|(address, _, _)| address)
}

/// [`ask_sentinels`] for the background check (see [`Sentinel::master_check`]):
/// through `kept`, the connection to the sentinel that answered it last, while
/// that one answers; it asks every 500 ms while calls run, and a connection
/// opened for each question would have the sentinels accept two a second
/// from every manager.
async fn ask_sentinels_keeping(
    sentinels: &[redis::Client],
    kept: &Mutex<Option<(usize, MultiplexedConnection)>>,
    master_name: &str,
    config: &Config,
) -> Result<(String, u16), NoMasterNamed> {
    let held = kept.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some((kept_index, conn)) = held else {
        let (address, conn, index) =
            ask_sentinels_through(sentinels, master_name, config, None).await?;
        *kept.lock().unwrap_or_else(|e| e.into_inner()) = Some((index, conn));
        return Ok(address);
    };
    let on_kept = async move {
        let mut conn = conn;
        let asked = tokio::time::timeout(
            config.command_timeout,
            master_address(&mut conn, master_name),
        )
        .await;
        match asked {
            Ok(Ok(Some(address))) => Some((address, conn, kept_index)),
            _ => None,
        }
    };
    tokio::pin!(on_kept);
    // The kept sentinel alone for as long as the next one would be waited
    // for; then the others too (the kept one may have gone silent), and the
    // first answer is taken, the kept one's while both are out. Anything but
    // the address from the kept one (it forgot the master, failed, or did
    // not answer in time) leaves the others to answer.
    let (address, conn, index) = match tokio::time::timeout(NEXT_SENTINEL_AFTER, &mut on_kept).await
    {
        Ok(Some(answer)) => answer,
        // The kept one failed: the others, it too on a new connection.
        Ok(None) => ask_sentinels_through(sentinels, master_name, config, None).await?,
        // Still out: the others beside it (not it again).
        Err(_) => {
            let others = ask_sentinels_through(sentinels, master_name, config, Some(kept_index));
            tokio::pin!(others);
            tokio::select! {
                biased;
                answer = &mut on_kept => match answer {
                    Some(answer) => answer,
                    None => others.await?,
                },
                answer = &mut others => match answer {
                    Ok(answer) => answer,
                    // No other named it: the kept one may yet, within
                    // its own bound.
                    Err(failed) => on_kept.await.ok_or(failed)?,
                },
            }
        }
    };
    *kept.lock().unwrap_or_else(|e| e.into_inner()) = Some((index, conn));
    Ok(address)
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME` on `conn`.
async fn master_address(
    conn: &mut MultiplexedConnection,
    master_name: &str,
) -> RedisResult<Option<(String, u16)>> {
    redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(master_name)
        .query_async::<Option<(String, u16)>>(conn)
        .await
}

/// Why no sentinel named the master: what each one did, in order.
#[derive(Debug)]
pub(crate) struct NoMasterNamed {
    /// `<address>: <what it did>` for each sentinel asked.
    each: Vec<String>,
    /// Some sentinel answered without naming it: it does not know the
    /// master's name, or refused the question (other than for want of
    /// authentication).
    answered: bool,
    /// The last failure to reach, or authenticate with, a sentinel.
    unreachable: Option<RedisError>,
}

impl std::fmt::Display for NoMasterNamed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.each.is_empty() {
            return f.write_str("no sentinel to ask");
        }
        f.write_str(&self.each.join("; "))
    }
}

impl NoMasterNamed {
    /// The build's error: `ServerCheck` when a sentinel answered (the name
    /// is wrong, or the sentinels do not monitor it), else `Connect` with
    /// the last failure's kind (a connection, a timeout, a password); either
    /// way naming every sentinel's failure.
    fn into_build_error(self, shown: String, master_name: &str) -> LockError {
        match self.unreachable {
            Some(last) if !self.answered => {
                let each = NoMasterNamed {
                    unreachable: None,
                    ..self
                };
                LockError::Connect {
                    url: shown,
                    source: crate::error::BackendError::from_redis(last)
                        .described(each.to_string()),
                }
            }
            _ => LockError::ServerCheck {
                url: shown,
                reason: format!("the sentinels do not name master {master_name:?}: {self}"),
            },
        }
    }
}

/// How long a query waits for a sentinel before it asks the next one too
/// (the first to name the master is followed). Asked one after the other, a
/// sentinel cut off from the manager (its packets dropped, no reset) held
/// every query until its connection attempt timed out (1 s, redis-rs's
/// default, measured) before the next was asked: at the build, and after a
/// failed call, when the manager looks for the master a failover promoted.
const NEXT_SENTINEL_AFTER: Duration = Duration::from_millis(250);

/// What asking one sentinel came to: the address and the connection, none
/// (it does not know the name), a failure, or no answer in time.
type SentinelOutcome = Result<
    RedisResult<Option<((String, u16), MultiplexedConnection)>>,
    tokio::time::error::Elapsed,
>;

/// [`ask_sentinels`], with the connection to the sentinel that answered and
/// its index. Sentinels are asked in order (all but `skip`), each
/// [`NEXT_SENTINEL_AFTER`] after the last question sent, or at once when a
/// question fails; the first to name the master wins.
async fn ask_sentinels_through(
    sentinels: &[redis::Client],
    master_name: &str,
    config: &Config,
    skip: Option<usize>,
) -> Result<((String, u16), MultiplexedConnection, usize), NoMasterNamed> {
    use futures_util::stream::{FuturesUnordered, StreamExt};

    let waited = config.connect_timeout + config.command_timeout;
    // The manager's timeouts, not redis-rs's defaults (1 s to connect, 0.5 s
    // for a reply), which failed a sentinel slower than those within the
    // bound the manager gives it; `waited` bounds each sentinel's question
    // (connecting included), and the query ends when the last one does.
    let conn_config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(None);
    let conn_config = &conn_config;
    let ask = |i: usize| async move {
        let asked = async {
            let mut conn = sentinels[i]
                .get_multiplexed_async_connection_with_config(conn_config)
                .await?;
            let address = master_address(&mut conn, master_name).await?;
            Ok::<_, RedisError>(address.map(|address| (address, conn)))
        };
        (i, tokio::time::timeout(waited, asked).await)
    };
    let order: Vec<usize> = (0..sentinels.len()).filter(|i| Some(*i) != skip).collect();
    let mut outcomes: Vec<Option<SentinelOutcome>> = sentinels.iter().map(|_| None).collect();
    let mut asking = FuturesUnordered::new();
    let mut next = 0;
    // Runs from the last question sent, so that an answer that is not the
    // address (another sentinel's failure) does not put the next one off.
    let stagger = tokio::time::sleep(NEXT_SENTINEL_AFTER);
    tokio::pin!(stagger);
    // A failure asks the next sentinel at once, without waiting the stagger.
    let mut failed_last = false;
    loop {
        let due = asking.is_empty() || failed_last || stagger.is_elapsed();
        if due && next < order.len() {
            asking.push(ask(order[next]));
            next += 1;
            stagger
                .as_mut()
                .reset(tokio::time::Instant::now() + NEXT_SENTINEL_AFTER);
        } else if asking.is_empty() {
            break;
        }
        failed_last = false;
        tokio::select! {
            // An answer first, when both are ready: no question sent in vain.
            biased;
            Some((i, outcome)) = asking.next() => match outcome {
                Ok(Ok(Some((address, conn)))) => return Ok((address, conn, i)),
                outcome => {
                    outcomes[i] = Some(outcome);
                    failed_last = true;
                }
            },
            () = &mut stagger, if next < order.len() => {}
            // Not reached: a question is out at every turn, so the first
            // branch is never disabled.
            else => {}
        }
    }
    let mut failed = NoMasterNamed {
        each: Vec::with_capacity(sentinels.len()),
        answered: false,
        unreachable: None,
    };
    for (sentinel, outcome) in sentinels.iter().zip(outcomes) {
        let addr = sentinel.get_connection_info().addr();
        match outcome {
            None | Some(Ok(Ok(Some(_)))) => {}
            Some(Ok(Ok(None))) => {
                failed.answered = true;
                failed
                    .each
                    .push(format!("{addr}: does not know this master name"));
            }
            Some(Ok(Err(e))) => {
                failed.each.push(format!("{addr}: {e}"));
                if super::redis_errors::server_answered(&e)
                    && !super::redis_errors::refused_authentication(&e)
                {
                    failed.answered = true;
                } else {
                    failed.unreachable = Some(e);
                }
            }
            Some(Err(_)) => {
                failed
                    .each
                    .push(format!("{addr}: no answer within {waited:?}"));
                failed.unreachable = Some(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {waited:?}"),
                )));
            }
        }
    }
    Err(failed)
}
