//! Redlock: one lock over N independent masters, held while a majority holds it.
//!
//! Each member is a [`Single`] (its own connection, scripts and retirement); the
//! scripts are the single-server ones. Every operation goes to all members at
//! once, each call bounded by a per-member timeout far below the lease, so a
//! dead or cut-off member costs that timeout, not the lease:
//!
//! - **Acquire**: the acquire script on all members. With a majority granted,
//!   the largest token they issued is written back to the granting members'
//!   fencing counters (`raise_fence.lua`), and the lock is ours once a majority
//!   confirmed that and the lease, counted from before the first round, is still
//!   valid (`lease - drift`). Otherwise it is given back on every member, and the
//!   attempt is busy when the members that answered could have made a majority
//!   (other owners hold a share), or fails with [`LockError::QuorumFailed`] when
//!   too many members failed or did not answer for any majority.
//! - **Renew**: one pipeline per member, all at once; a lease is renewed when a
//!   majority renewed it, and lost when a majority no longer holds it. A member
//!   that lost the lock (restarted empty) while a majority still holds it gets it
//!   back by the acquire script under the same owner token.
//! - **Release**: on every member at once; released when any member held it.
//! - **Wake-ups**: every member publishes its releases; the waiting layer keeps
//!   a subscriber per member and wakes one waiter per release (the payload, the
//!   owner token, tells repeats apart).
//!
//! Why the write-back round: two majorities always share a member, but without
//! it the largest token of one majority need not be below the largest of the
//! next. Each member issues `last + 1` from its own counter (its clock in
//! microseconds once the counter is gone), so a member whose counter or clock
//! is ahead can be in the first majority and not the second: of five members,
//! A gets tokens from {1, 2, 3} and takes member 2's, the largest; after A's
//! release B gets tokens from {1, 3, 4}, whose counters are all below it. The
//! same round follows `issue_token` (fencing on demand). With the round, the
//! shared member's counter is at least the earlier token when the later
//! majority asks it, so the later token is larger.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::RedisResult;

use super::calls::{ForceUnlock, Inspect, IsLocked, IssueToken, Publish, RaiseFence, Release};
use super::scripts::{AcquireReply, AcquireSpec, HeldLock};
use super::single::Single;
use super::LeaseEnd;
use super::{CallError, ExpectedWaiters, ManyReleased, Renewal};
use crate::config::{redact, Config, TlsSettings};
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::keys::RedisNames;
use crate::lease::{drift, Lease};

/// Fewest members accepted: a majority of 2 is both, so one failure stops every lock.
pub(crate) const MIN_MEMBERS: usize = 3;

/// How long a member whose start-up check failed on a server that answered
/// (or refused the credentials) is refused before the check runs again.
const RECHECK_AFTER: Duration = Duration::from_secs(5);

/// The start-up check of a member connected on first use (down or not ready
/// at `build()`). Until it passes, every call to the member is refused as if
/// it were down; its first use starts the check in the background, on the
/// manager's runtime. A member still down or loading is checked again at
/// its next use; one that answers and fails the check (it cannot serve
/// locks as configured, as `build()` would have refused it) or refuses the
/// credentials, at its first use [`RECHECK_AFTER`] later.
struct PendingCheck {
    /// The member's URL, as shown (no password).
    url: String,
    config: Config,
    passed: AtomicBool,
    running: AtomicBool,
    /// The last failed check: when, why, and whether it waits
    /// [`RECHECK_AFTER`] before the next.
    failed: Mutex<Option<FailedCheck>>,
    /// Told when a check ends (also when its task is dropped).
    done: tokio::sync::Notify,
    /// This check, for the task that runs it.
    myself: std::sync::Weak<PendingCheck>,
}

struct FailedCheck {
    at: Instant,
    reason: String,
    backs_off: bool,
}

/// Ends a running check however its task ends (done, cancelled with its
/// runtime, panicked): the next use may start another, and the calls
/// waiting for this one stop waiting.
struct CheckEnds(Arc<PendingCheck>);

impl Drop for CheckEnds {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
        self.0.done.notify_waiters();
    }
}

impl PendingCheck {
    /// Whether a check should not start now: it passed, or it failed in a
    /// way that waits [`RECHECK_AFTER`] and did less than that ago.
    fn settled(&self) -> bool {
        self.passed.load(Ordering::Acquire)
            || self
                .failed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|f| f.backs_off && f.at.elapsed() < RECHECK_AFTER)
    }

    /// For a call to the member: `None` when the check passed or is not due
    /// (the call goes ahead or is refused at once, see
    /// [`PendingCheck::refusal`]); otherwise what completes when the check
    /// running now ends, which this call starts (on `runtime`) unless
    /// another did. A call waits for it within its own timeout: a member
    /// back in time for a call takes part in it.
    fn begin(
        &self,
        member: &Single,
        runtime: Option<&tokio::runtime::Handle>,
    ) -> Option<tokio::sync::futures::Notified<'_>> {
        if self.settled() {
            return None;
        }
        let this = self.myself.upgrade()?;
        let runtime = runtime
            .cloned()
            .or_else(|| tokio::runtime::Handle::try_current().ok())?;
        // Made before a check running now can end (it clears `running`, then
        // notifies): `notify_waiters` reaches it then.
        let done = self.done.notified();
        if self.running.swap(true, Ordering::AcqRel) {
            return Some(done);
        }
        // Ours to start, unless one that ended meanwhile settled it.
        if self.settled() {
            self.running.store(false, Ordering::Release);
            return None;
        }
        let check = member.startup_check(&self.config, self.url.clone());
        let ends = CheckEnds(this);
        runtime.spawn(async move {
            let outcome = check.await;
            ends.0.record(outcome);
            drop(ends);
        });
        Some(done)
    }

    /// Whether a call may go to the member: it may once the check passed. A
    /// check that is due starts now (see [`PendingCheck::begin`]); the call
    /// waits up to `wait` for it (a member back in time for a call takes
    /// part in it; a renewal round does not wait). Otherwise the call is
    /// refused as a down member's, not sent.
    async fn admit(
        &self,
        member: &Single,
        runtime: Option<&tokio::runtime::Handle>,
        key: &str,
        wait: Duration,
    ) -> Result<(), CallError> {
        if let Some(done) = self.begin(member, runtime) {
            if !wait.is_zero() {
                let _ = tokio::time::timeout(wait, done).await;
            }
        }
        if self.passed.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(self.refusal(key))
        }
    }

    /// Keeps the outcome of a check.
    fn record(&self, outcome: Result<(), LockError>) {
        let e = match outcome {
            Ok(()) => {
                self.passed.store(true, Ordering::Release);
                *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = None;
                tracing::info!(target: "distlock::connection",
                    url = %self.url,
                    "Redlock member passed its start-up check; used from now on"
                );
                return;
            }
            Err(e) => e,
        };
        let refused_credentials = matches!(&e, LockError::Connect { source, .. }
            if source.kind() == BackendErrorKind::Auth);
        let backs_off = refused_credentials || !matches!(e, LockError::Connect { .. });
        if backs_off {
            tracing::warn!(target: "distlock::connection",
                url = %self.url,
                error = %e,
                recheck_after_s = RECHECK_AFTER.as_secs(),
                "Redlock member failed its start-up check; not used"
            );
        } else {
            // Still down or loading: checked again at its next use.
            tracing::debug!(target: "distlock::connection",
                url = %self.url,
                error = %e,
                "Redlock member not ready for its start-up check"
            );
        }
        *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(FailedCheck {
            at: Instant::now(),
            reason: e.to_string(),
            backs_off,
        });
    }

    /// A call refused because the check has not passed: never sent, and the
    /// member holds nothing of ours (every call to it was refused), so there
    /// is nothing to give back there.
    fn refusal(&self, key: &str) -> CallError {
        let why = match &*self.failed.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(failed) => format!("its start-up check failed: {}", failed.reason),
            None => "its start-up check has not passed yet".to_owned(),
        };
        CallError {
            error: LockError::Backend {
                key: key.to_owned(),
                source: BackendError::new(
                    BackendErrorKind::Connection,
                    format!(
                        "Redlock member {} is not used: it was down or not ready at start-up, \
                         and {why}",
                        self.url
                    ),
                ),
            },
            maybe_executed: false,
        }
    }
}

pub(crate) struct Redlock {
    members: Vec<Single>,
    /// Per member, its start-up check while it has not passed (`None`: it
    /// passed at `build()`).
    checks: Vec<Option<Arc<PendingCheck>>>,
    /// The manager's runtime (the one `build()` ran on), where those checks
    /// run.
    runtime: Option<tokio::runtime::Handle>,
    /// A majority: `members / 2 + 1`.
    quorum: usize,
    command_timeout: Duration,
    fence_retention_ms: u64,
    /// The holder description written when a lock is re-created on a member.
    holder: String,
}

/// What one member answered, or that it did not in time.
type MemberReply<T> = Result<T, CallError>;

/// The first member's error, as one that may have executed (retry later).
fn first_error<T>(key: &str, replies: Vec<MemberReply<T>>, timeout: Duration) -> CallError {
    let error = replies
        .into_iter()
        .find_map(Result::err)
        .map_or_else(|| LockError::command_timeout(key, timeout), |e| e.error);
    CallError {
        error,
        maybe_executed: true,
    }
}

impl Redlock {
    /// Connects to every member; a majority must pass the server check. A
    /// member that cannot be reached or is not ready (a `Connect` error: down,
    /// too slow, still loading its data after a restart) is connected later,
    /// on first use, and used once it passes the check (see
    /// [`PendingCheck`]); one that answers and fails the check fails the
    /// build.
    pub(crate) async fn connect(
        urls: &[String],
        config: &Config,
        tls: &TlsSettings,
    ) -> Result<Redlock, LockError> {
        if urls.len() < MIN_MEMBERS {
            return Err(LockError::InvalidConfig(format!(
                "Redlock needs at least {MIN_MEMBERS} independent masters (an odd number is \
                 best), not {}",
                urls.len()
            )));
        }
        let quorum = urls.len() / 2 + 1;
        // A call to a member may have a tenth of the lease (see
        // `member_timeout`): one that finds its member down is refused
        // within it (a call never sent, which leaves nothing to give back
        // there), rather than spending it on reconnection retries and
        // timing out (a call that may have run).
        let config = &Config {
            reconnect_retries: 0,
            ..config.clone()
        };
        let connected = join_all(urls.iter().map(|url| Single::connect(url, config, tls))).await;
        let mut members = Vec::with_capacity(urls.len());
        let mut checks = Vec::with_capacity(urls.len());
        let mut unreachable = Vec::new();
        for (url, member) in urls.iter().zip(connected) {
            match member {
                Ok(member) => {
                    members.push(member);
                    checks.push(None);
                }
                // Down or not ready now: it may be by the time it is needed.
                Err(e @ LockError::Connect { .. }) => {
                    tracing::warn!(target: "distlock::connection",
                        url = %redact(url),
                        error = %e,
                        "Redlock member unreachable at start-up; connecting on first use, \
                         used once its start-up check passes"
                    );
                    unreachable.push(e);
                    members.push(Single::connect_lazily(url, config, tls)?);
                    checks.push(Some(Arc::new_cyclic(|myself| PendingCheck {
                        url: redact(url),
                        config: config.clone(),
                        passed: AtomicBool::new(false),
                        running: AtomicBool::new(false),
                        failed: Mutex::new(None),
                        done: tokio::sync::Notify::new(),
                        myself: myself.clone(),
                    })));
                }
                Err(e) => return Err(e),
            }
        }
        if members.len() - unreachable.len() < quorum {
            // Fewer than a majority answered: no lock could be granted.
            return Err(unreachable.remove(0));
        }
        Ok(Redlock {
            members,
            checks,
            runtime: tokio::runtime::Handle::try_current().ok(),
            quorum,
            command_timeout: config.command_timeout,
            fence_retention_ms: u64::try_from(config.fence_retention.as_millis())
                .unwrap_or(u64::MAX),
            holder: config.holder.clone(),
        })
    }

    /// The members, for the subscriber (one connection each).
    pub(crate) fn members(&self) -> &[Single] {
        &self.members
    }

    /// How long one member may take to answer during an acquisition: a tenth
    /// of the lease (the Redlock algorithm wants it "small compared to the
    /// TTL"), at most the command timeout and at least 5 ms.
    fn member_timeout(&self, lease_ms: u64) -> Duration {
        Duration::from_millis(lease_ms / 10)
            .max(Duration::from_millis(5))
            .min(self.command_timeout)
    }

    /// Runs `call` on every member at once, each bounded by `timeout`; a
    /// member that takes longer fails with a timeout naming `key`.
    async fn on_all<'a, T, F, Fut>(
        &'a self,
        key: &str,
        timeout: Duration,
        call: F,
    ) -> Vec<MemberReply<T>>
    where
        F: Fn(&'a Single) -> Fut,
        Fut: std::future::Future<Output = Result<T, CallError>>,
    {
        join_all(
            self.members
                .iter()
                .zip(&self.checks)
                .map(|(member, check)| {
                    let fut = call(member);
                    async move {
                        let started = Instant::now();
                        // The check's own time counts against the call's.
                        if let Some(check) = check.as_deref() {
                            check
                                .admit(member, self.runtime.as_ref(), key, timeout)
                                .await?;
                        }
                        let left = timeout.saturating_sub(started.elapsed());
                        match tokio::time::timeout(left, fut).await {
                            Ok(reply) => reply,
                            Err(_) => Err(CallError {
                                error: LockError::command_timeout(key, timeout),
                                maybe_executed: true,
                            }),
                        }
                    }
                }),
        )
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
        let started = Instant::now();
        let lease = Duration::from_millis(lease_ms);
        let timeout = self.member_timeout(lease_ms);
        let replies = self
            .on_all(key, timeout, |m| {
                m.acquire(key, keys, owner, lease_ms, spec)
            })
            .await;
        let mut granted = Vec::new();
        let mut busy = 0;
        let mut foreign = 0;
        let mut remaining: Option<Duration> = None;
        let mut last_error = None;
        // Members whose reply is unknown though the script may have run
        // there: they may hold a grant in our name.
        let mut unknown = Vec::new();
        for (i, reply) in replies.into_iter().enumerate() {
            match reply {
                Ok(AcquireReply::Acquired { fencing_token, .. }) => {
                    granted.push((i, fencing_token))
                }
                Ok(AcquireReply::Foreign) => {
                    busy += 1;
                    foreign += 1;
                }
                Ok(AcquireReply::Busy { remaining: r }) => {
                    busy += 1;
                    if let Some(r) = r {
                        remaining = Some(remaining.map_or(r, |m| m.min(r)));
                    }
                }
                // Redlock managers refuse semaphores before any call; one
                // member's own reply never says it left a grant behind.
                Ok(AcquireReply::PermitsDiffer { .. } | AcquireReply::LeftBehind { .. }) => {}
                Err(e) => {
                    if e.maybe_executed {
                        unknown.push(i);
                    }
                    last_error = Some(e.error);
                }
            }
        }
        if granted.len() >= self.quorum {
            let token = granted.iter().map(|(_, t)| *t).max().unwrap_or(0);
            // The write-back round, for a hold that took its token: without one
            // there is nothing to make known.
            let confirmed = match spec.fence_ttl_ms {
                Some(fence_ttl_ms) => {
                    self.write_back(key, keys, owner, token, fence_ttl_ms, timeout, &granted)
                        .await
                }
                None => granted.len(),
            };
            let valid = Instant::now() < started + lease.saturating_sub(drift(lease));
            if confirmed >= self.quorum && valid {
                // Redlock managers refuse semaphores: no permits to count.
                return Ok(AcquireReply::Acquired {
                    fencing_token: token,
                    permits_left: 0,
                });
            }
            tracing::debug!(target: "distlock::acquire",
                confirmed,
                valid,
                "Redlock majority not confirmed in time; giving it back"
            );
        }
        // A member that answered without a grant, or with an error that says
        // the script did not run (a server error), holds nothing of ours:
        // with no grant and no reply unknown, the round would give nothing
        // back, and would only hold a busy waiter's next attempt back a
        // round trip. Otherwise it goes to every member, and has given back
        // what it must once each member that granted or whose reply is
        // unknown answered. (A member that refused the connection holds
        // nothing of ours: the call was never sent. One that did not answer
        // in time counts as unknown: the acquisition then gives back in the
        // background when it leaves, retried for at most a lease.)
        let given_back = if granted.is_empty() && unknown.is_empty() {
            true
        } else {
            // Not under 50 ms: a grant left behind keeps a member's vote
            // for up to a lease, and a short lease's member timeout (5 ms at
            // least) is little for a server under load.
            let give_back_timeout = timeout
                .max(Duration::from_millis(50))
                .min(self.command_timeout);
            let answered = self.give_back(key, keys, owner, give_back_timeout).await;
            granted
                .iter()
                .map(|(i, _)| *i)
                .chain(unknown.iter().copied())
                .all(|i| answered.get(i).copied().unwrap_or(false))
        };
        // Foreign values on so many members that the others cannot make a
        // majority: no wait will ever grant it. On fewer, those members count
        // as busy: the caller waits, and gets the lock from the others once
        // their holder leaves.
        // A grant that a member may hold in our name, which the clean-up
        // round could not give back: the caller gives it back once it
        // leaves without the lock (a later attempt may still make it part
        // of a majority).
        let not_taken = |reply: AcquireReply| match reply {
            _ if given_back => reply,
            AcquireReply::Busy { remaining } => AcquireReply::LeftBehind {
                foreign: false,
                remaining,
            },
            _ => AcquireReply::LeftBehind {
                foreign: true,
                remaining: None,
            },
        };
        if foreign > self.members.len() - self.quorum {
            return Ok(not_taken(AcquireReply::Foreign));
        }
        let errors = self.members.len() - granted.len() - busy;
        if errors <= self.members.len() - self.quorum {
            // The members that answered could make a majority, so other owners
            // (or a majority not confirmed in time) kept it away: busy, and
            // retried within `wait`, as on one server.
            return Ok(not_taken(AcquireReply::Busy {
                remaining: if busy > 0 {
                    remaining
                } else {
                    Some(Duration::ZERO)
                },
            }));
        }
        if let Some(e) = &last_error {
            tracing::debug!(target: "distlock::acquire", error = %e, "Redlock quorum failed");
        }
        Err(CallError {
            error: LockError::QuorumFailed {
                key: key.to_owned(),
                granted: u32::try_from(granted.len()).unwrap_or(u32::MAX),
                needed: u32::try_from(self.quorum).unwrap_or(u32::MAX),
            },
            // A member that did not answer may hold it in our name: the
            // caller releases it in the background.
            maybe_executed: !given_back,
        })
    }

    /// Makes `token` known to the fencing counter of each member of `granted`
    /// (index, token it issued), so that any later majority, which shares a
    /// member with this one, issues a larger token; how many confirmed the
    /// lock is still ours.
    #[allow(clippy::too_many_arguments)]
    async fn write_back(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        token: u64,
        fence_ttl_ms: u64,
        timeout: Duration,
        granted: &[(usize, u64)],
    ) -> usize {
        let raise = &RaiseFence {
            keys,
            owner,
            token,
            fence_ttl_ms,
        };
        let raised = join_all(granted.iter().map(|(i, _)| async move {
            tokio::time::timeout(timeout, self.members[*i].on_key(key, raise)).await
        }))
        .await;
        raised.iter().filter(|r| matches!(r, Ok(Ok(true)))).count()
    }

    /// Issues the fencing token of a hold that has none: each member issues
    /// one, and the largest, written back to the members that issued one
    /// (as an acquisition's write-back round), is the hold's, when a majority
    /// still holds the lock for `owner`. `None` when a majority does not.
    pub(crate) async fn issue_token(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        fence_ttl_ms: u64,
    ) -> Result<Option<u64>, CallError> {
        let issue = IssueToken {
            keys,
            owner,
            fence_ttl_ms,
        };
        let replies = self
            .on_all(key, self.command_timeout, |m| m.on_key(key, &issue))
            .await;
        let mut issued = Vec::new();
        let mut refused = 0;
        let mut last_error = None;
        for (i, reply) in replies.into_iter().enumerate() {
            match reply {
                Ok(Some(token)) => issued.push((i, token)),
                Ok(None) => refused += 1,
                Err(e) => last_error = Some(e.error),
            }
        }
        if issued.len() >= self.quorum {
            let token = issued.iter().map(|(_, t)| *t).max().unwrap_or(0);
            let confirmed = self
                .write_back(
                    key,
                    keys,
                    owner,
                    token,
                    fence_ttl_ms,
                    self.command_timeout,
                    &issued,
                )
                .await;
            if confirmed >= self.quorum {
                return Ok(Some(token));
            }
        } else if refused > self.members.len() - self.quorum {
            // A majority no longer holds it for us: the hold is lost.
            return Ok(None);
        }
        Err(CallError {
            error: last_error.unwrap_or_else(|| LockError::QuorumFailed {
                key: key.to_owned(),
                granted: u32::try_from(issued.len()).unwrap_or(u32::MAX),
                needed: u32::try_from(self.quorum).unwrap_or(u32::MAX),
            }),
            maybe_executed: true,
        })
    }

    /// Releases on every member, each bounded by `timeout` (about the
    /// attempt's own member timeout); whether each answered. A member that granted
    /// answered within it a moment ago; one that did not answer the attempt
    /// in time will not answer this either, and waiting for it the command
    /// timeout held each busy attempt back that long more: what it may keep
    /// is given back in the background once the acquisition leaves.
    async fn give_back(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        timeout: Duration,
    ) -> Vec<bool> {
        let release = Release {
            keys,
            owner,
            keep_ms: 0,
            waiters: ExpectedWaiters::GivenBack,
            receipt: None,
        };
        self.on_all(key, timeout, |m| m.on_key(key, &release))
            .await
            .iter()
            .map(Result::is_ok)
            .collect()
    }

    /// The release script by `owner` on every member at once; each member's
    /// reply (whether it held the lock).
    async fn release_on_all(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
    ) -> Vec<MemberReply<bool>> {
        let release = Release {
            keys,
            owner,
            keep_ms,
            waiters: ExpectedWaiters::Unknown,
            receipt: None,
        };
        self.on_all(key, self.command_timeout, |m| m.on_key(key, &release))
            .await
    }

    pub(crate) async fn release(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
    ) -> Result<bool, CallError> {
        let replies = self.release_on_all(key, keys, owner, keep_ms).await;
        // Fewer than a majority answered: the caller retries (in the
        // background).
        self.any_of_a_majority(key, replies)
    }

    /// [`release`](Self::release), done only once every member answered or
    /// refused the connection (see `Backend::release_everywhere`). A member
    /// that is down lost what it held with its process, unless it comes
    /// back with it from disk (`appendfsync always`): then a grant left
    /// there for an owner that no longer uses it costs that member's vote
    /// on the key for the rest of its TTL (at most a lease), never
    /// exclusion. Waiting for the member instead would keep a task retrying
    /// for a lease per give-back (one per busy attempt) while it is down.
    pub(crate) async fn release_everywhere(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
    ) -> Result<bool, CallError> {
        let replies = self.release_on_all(key, keys, owner, keep_ms).await;
        if replies
            .iter()
            .all(|r| r.as_ref().map_or_else(CallError::was_refused, |_| true))
        {
            return Ok(replies.iter().any(|r| matches!(r, Ok(true))));
        }
        Err(first_error(key, replies, self.command_timeout))
    }

    /// Deletes the lock on every member; true when any held it, `None` when
    /// none did and a member's name of it holds a value distlock did not
    /// write (left there, as on every member; the operator is told rather
    /// than answered "not held").
    pub(crate) async fn force_unlock(
        &self,
        key: &str,
        keys: &RedisNames,
        token: &str,
        only: &str,
    ) -> Result<Option<bool>, CallError> {
        // Members are single servers, which never send a call twice.
        let force = ForceUnlock {
            keys,
            token,
            only,
            receipt_ms: 0,
        };
        let replies = self
            .on_all(key, self.command_timeout, |m| m.on_key(key, &force))
            .await;
        let foreign = replies.iter().any(|r| matches!(r, Ok(None)));
        let replies = replies
            .into_iter()
            .map(|r| r.map(|freed| freed == Some(true)))
            .collect();
        let freed = self.any_of_a_majority(key, replies)?;
        Ok((freed || !foreign).then_some(freed))
    }

    /// Publishes `payload` on `channel` on every member (subscribers listen
    /// to every member); done once a majority took it.
    pub(crate) async fn publish(
        &self,
        key: &str,
        channel: &str,
        payload: &str,
    ) -> Result<(), CallError> {
        let publish = Publish { channel, payload };
        let replies = self
            .on_all(key, self.command_timeout, |m| m.on_key(key, &publish))
            .await;
        if replies.iter().filter(|r| r.is_ok()).count() >= self.quorum {
            return Ok(());
        }
        Err(first_error(key, replies, self.command_timeout))
    }

    /// Held when a majority of the members holds it.
    pub(crate) async fn is_locked(&self, key: &str, keys: &RedisNames) -> Result<bool, CallError> {
        let is_locked = IsLocked { keys };
        let replies = self
            .on_all(key, self.command_timeout, |m| m.on_key(key, &is_locked))
            .await;
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        let held = replies.iter().filter(|r| matches!(r, Ok(true))).count();
        if held >= self.quorum || answered >= self.quorum {
            return Ok(held >= self.quorum);
        }
        Err(first_error(key, replies, self.command_timeout))
    }

    /// The lock as a majority of the members hold it: the value of the owner
    /// that holds it on a majority (with the largest token among them), with
    /// the shortest lease left among them.
    /// `None` when no owner holds a majority, once a majority answered.
    pub(crate) async fn inspect(
        &self,
        key: &str,
        keys: &RedisNames,
    ) -> Result<Option<HeldLock>, CallError> {
        let inspect = Inspect { keys };
        let replies = self
            .on_all(key, self.command_timeout, |m| m.on_key(key, &inspect))
            .await;
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        let held: Vec<&HeldLock> = replies
            .iter()
            .filter_map(|r| r.as_ref().ok().and_then(Option::as_ref))
            .collect();
        for candidate in &held {
            let owner = crate::info::owner_of(&candidate.value);
            let same: Vec<&&HeldLock> = held
                .iter()
                .filter(|h| crate::info::owner_of(&h.value) == owner)
                .collect();
            if same.len() >= self.quorum {
                // The largest token: members record the token chosen in the
                // write-back round, which a read may overtake on some of them.
                let newest = same
                    .iter()
                    .max_by_key(|h| crate::info::token_of(&h.value))
                    .map_or(*candidate, |h| **h);
                let shortest_pttl = same
                    .iter()
                    .map(|h| if h.pttl < 0 { i64::MAX } else { h.pttl })
                    .min()
                    .unwrap_or(newest.pttl);
                let pttl = if shortest_pttl == i64::MAX {
                    newest.pttl
                } else {
                    shortest_pttl
                };
                return Ok(Some(HeldLock {
                    value: newest.value.clone(),
                    pttl,
                }));
            }
        }
        if answered >= self.quorum {
            return Ok(None);
        }
        Err(first_error(key, replies, self.command_timeout))
    }

    /// The lock names on any member that answered, once a majority answered.
    pub(crate) async fn scan_locks(&self, pattern: &str) -> Result<Vec<String>, CallError> {
        let replies = join_all(self.members.iter().map(|m| m.scan_locks(pattern))).await;
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        if answered < self.quorum {
            return Err(first_error("", replies, self.command_timeout));
        }
        let mut names: Vec<String> = replies.into_iter().flatten().flatten().collect();
        names.sort_unstable();
        names.dedup();
        Ok(names)
    }

    /// Once a majority answered, whether any member said true; with fewer,
    /// the first error, also when one said true: the members a release or
    /// force-unlock did not reach may be a majority still holding the lock,
    /// which nobody renews and everybody else waits for until its lease
    /// ends, so it must be sent again.
    fn any_of_a_majority(
        &self,
        key: &str,
        replies: Vec<MemberReply<bool>>,
    ) -> Result<bool, CallError> {
        let any = replies.iter().any(|r| matches!(r, Ok(true)));
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        if answered >= self.quorum {
            return Ok(any);
        }
        Err(first_error(key, replies, self.command_timeout))
    }

    /// Known once a majority answered (each member answers for all the
    /// locks at once), as a release of one lock is.
    pub(crate) async fn release_many(&self, locks: &[(&RedisNames, &str, u64)]) -> ManyReleased {
        // Several keys: the release of the guard that holds them names each.
        let replies = self
            .on_all("", self.command_timeout, |m| m.release_many(locks, None))
            .await;
        let mut released = vec![false; locks.len()];
        let mut first_error = None;
        let mut answered = 0;
        for reply in replies {
            match reply {
                Ok(each) => {
                    answered += 1;
                    for (r, e) in released.iter_mut().zip(each) {
                        *r |= e;
                    }
                }
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        match first_error {
            Some(e) if answered < self.quorum => ManyReleased::failed(locks.len(), e),
            _ => ManyReleased::known(released),
        }
    }

    pub(crate) fn release_blocking(
        &self,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
    ) -> RedisResult<bool> {
        let mut released = false;
        let mut answered = 0;
        let mut last_error = None;
        for member in &self.members {
            match member.release_blocking(keys, owner, keep_ms) {
                Ok(r) => {
                    answered += 1;
                    released |= r;
                }
                Err(e) => last_error = Some(e),
            }
        }
        // As `any_of_a_majority`: released once a majority answered.
        match last_error {
            Some(e) if answered < self.quorum => Err(e),
            _ => Ok(released),
        }
    }

    /// One pipeline per member, all at once.
    pub(crate) async fn renew(&self, batch: &[Arc<Lease>], end: LeaseEnd) -> Vec<Renewal> {
        let sent_at = Instant::now();
        // A member that is down or cut off must not hold the round up: the
        // next renewals are due a third of a lease later.
        let shortest = batch.iter().map(|l| l.lease_ms()).min().unwrap_or(0);
        let timeout = self.member_timeout(shortest);
        let per_member = join_all(self.members.iter().zip(&self.checks).map(
            |(m, check)| async move {
                // A member whose check has not passed holds nothing of ours:
                // not asked (its "not ours" would set off a reclaim of every
                // lease at every tick); its check starts if due, unawaited.
                if let Some(check) = check.as_deref() {
                    let admitted = check
                        .admit(m, self.runtime.as_ref(), "", Duration::ZERO)
                        .await;
                    if let Err(refused) = admitted {
                        return super::single::failed_all(batch, &refused.error.to_string());
                    }
                }
                match tokio::time::timeout(timeout, m.renew(batch, end)).await {
                    Ok(outcomes) => outcomes,
                    Err(_) => super::single::failed_all(batch, "the member did not answer in time"),
                }
            },
        ))
        .await;
        let n = self.members.len();
        let mut out = Vec::with_capacity(batch.len());
        let mut reclaims = Vec::new();
        for (i, lease) in batch.iter().enumerate() {
            let (mut renewed, mut not_ours, mut retry) = (0, 0, 0);
            let mut error = None;
            for outcome in &per_member {
                match outcome.get(i) {
                    Some(Renewal::Renewed { .. }) => renewed += 1,
                    Some(Renewal::NotOurs) => not_ours += 1,
                    Some(Renewal::Retry) => retry += 1,
                    Some(Renewal::Failed(e)) => error = Some(e.clone()),
                    None => error = Some("no reply".to_owned()),
                }
            }
            out.push(if renewed >= self.quorum {
                if not_ours > 0 {
                    reclaims.push(lease.clone());
                }
                Renewal::Renewed { sent_at }
            } else if not_ours > n - self.quorum {
                Renewal::NotOurs
            } else if retry > 0 && renewed + retry >= self.quorum {
                Renewal::Retry
            } else {
                Renewal::Failed(format!(
                    "renewed on {renewed} of {n} Redlock members, {} needed{}",
                    self.quorum,
                    error
                        .map(|e| format!(" (last error: {e})"))
                        .unwrap_or_default()
                ))
            });
        }
        if !reclaims.is_empty() {
            self.reclaim(&reclaims).await;
        }
        out
    }

    /// Takes a held lock back on the members that lost it (restarted empty)
    /// while a majority still holds it: the acquire script under the same owner
    /// token re-creates it where it is missing and leaves other owners' alone.
    /// All at once: the renewal task waits for this round, and one lease
    /// after another, each waiting for a member that does not answer, would
    /// hold the next renewals up past the leases' ends.
    async fn reclaim(&self, leases: &[Arc<Lease>]) {
        join_all(
            leases
                .iter()
                .filter(|lease| lease.is_held())
                .map(|lease| async move {
                    let lease_ms = lease.lease_ms();
                    // The member's record says the hold began now: the original time is
                    // on the other members.
                    // A hold with a token gets one on the member again (tokens only
                    // need to grow); one without stays without.
                    let spec = AcquireSpec::without_waiting(
                        &self.holder,
                        (lease.fencing_token() != 0)
                            .then(|| lease_ms.saturating_add(self.fence_retention_ms)),
                    );
                    let timeout = self.member_timeout(lease_ms);
                    let reclaimed = self
                        .on_all(&lease.key, timeout, |m| {
                            m.acquire(&lease.key, &lease.keys, &lease.owner, lease_ms, &spec)
                        })
                        .await;
                    let granted: Vec<(usize, u64)> = reclaimed
                        .iter()
                        .enumerate()
                        .filter_map(|(i, reply)| match reply {
                            Ok(AcquireReply::Acquired { fencing_token, .. }) => {
                                Some((i, *fencing_token))
                            }
                            _ => None,
                        })
                        .collect();
                    tracing::debug!(target: "distlock::renewal",
                        members = granted.len(),
                        "re-created a Redlock lock on members that had lost it"
                    );
                    // A member that re-created it issued a token of its own
                    // (its counter was gone too): the lock's value there gets
                    // the hold's token back, which `inspect`, a leader's epoch
                    // and `watch` read, while the member's counter stays at the
                    // larger of the two. The members that still held it
                    // answered with the hold's token: nothing to write there.
                    let token = lease.fencing_token();
                    let granted: Vec<(usize, u64)> = granted
                        .into_iter()
                        .filter(|(_, issued)| *issued != token)
                        .collect();
                    if token != 0 && !granted.is_empty() {
                        self.write_back(
                            &lease.key,
                            &lease.keys,
                            &lease.owner,
                            token,
                            lease_ms.saturating_add(self.fence_retention_ms),
                            timeout,
                            &granted,
                        )
                        .await;
                    }
                }),
        )
        .await;
    }

    #[cfg(feature = "testing")]
    pub(crate) fn renewal_round_trips(&self) -> u64 {
        self.members
            .iter()
            .map(|m| {
                m.renewal_round_trips
                    .load(std::sync::atomic::Ordering::Relaxed)
            })
            .sum()
    }
}
