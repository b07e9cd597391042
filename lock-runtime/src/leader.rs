//! Leader election: one holder per name of an ordinary lock (key
//! `leader:<name>`), whose fencing token is the term's epoch, and a stream of
//! leader changes fed by the messages each new term and each resignation
//! publish.
//!
//! A term is a hold of the lock taken with an eager fencing token, so the epoch
//! costs no round trip of its own and strictly increases across terms (the
//! token's guarantee). Candidates wait in the lock's queue: a resignation
//! hands the lock to the first of them with one message, as any release does
//! (under Redlock, which queues nobody, it wakes them and the first to try
//! again wins).
//! Once it holds the lock, the new leader reads its hold back (one `inspect`)
//! and publishes it on `<prefix>leader:<name>`; a resignation publishes there
//! after its release. Watchers listen there, and read the lock itself after
//! every (re)subscription. A term that ends without a successor or a
//! resignation sends no message of ours: with Redis's keyspace notifications
//! of expired keys on, the lock's expiry is one (and the watch reads it then).
//! With or without them (PostgreSQL tells of no expiry), the watch reads the
//! lock when the lease it last saw runs out, and every few seconds while the
//! lead is vacant, which makes up for a message that never came. On PostgreSQL the messages are
//! notifications (NOTIFY on the channel's identifier, heard by the manager's
//! listening connection), and the lock is the default lock's lease row.
//!
//! Both buffers of a watch are bounded: the messages its subscriptions hear
//! (past the bound, the watch reads the lock instead of the messages it
//! dropped) and the changes waiting for its reader (past
//! [`LEADER_WATCH_CAPACITY`], the newest replaces them all).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::backend::{KeyNotice, Message};
use crate::buffer::{self, Popped};
use crate::config::{self, Backoff};
use crate::error::{KeyPreview, LockError};
use crate::lease::Lease;
use crate::waiting::{Sink, Topic};
use crate::{LockGuard, LockManager, LockRequest};
use futures_util::FutureExt;

/// The prefix of a leader election's lock key: `manager.leader("scheduler")`
/// holds lock `leader:scheduler`, which `inspect`, `list` and the CLI show.
pub const LEADER_KEY_PREFIX: &str = "leader:";

/// How many changes a [`LeaderWatch`] holds for a reader that is behind. One
/// more, and they are all dropped for the newest: a watcher that fell that
/// far behind gets the current state next, not a backlog of old terms.
pub const LEADER_WATCH_CAPACITY: usize = 64;

/// How often a watch whose listening connection hears nothing (PostgreSQL
/// behind a transaction-mode pooler, without `postgres_listen_url`) reads the
/// lock while the lead is vacant: no announcement of the next term reaches
/// it. One read a second per such watch; while a term holds, it reads at the
/// end of each lease it saw, as every watch does.
const DEAF_VACANCY_READ: Duration = Duration::from_secs(1);

/// How often a watch that hears messages reads the lock while the lead is
/// vacant: the announcement of the next term may be lost (its publish failed
/// or timed out), and nothing else would end the vacancy it reports.
const VACANCY_READ: Duration = Duration::from_secs(5);

/// How many messages a watch's subscriptions hold for its task while it reads
/// the lock. Past it they are dropped and the task reads the lock again, which
/// tells the current state that the dropped messages led to.
const HEARD_CAPACITY: usize = 64;

impl LockManager {
    /// A leader election named `name`: among every process that campaigns for
    /// the same name on the same Redis (and key prefix), one leads at a time.
    ///
    /// ```no_run
    /// # async fn demo(manager: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// use std::time::Duration;
    /// let election = manager.leader("scheduler").lease(Duration::from_secs(10));
    /// let term = election.campaign().await?; // waits until this process leads
    /// println!("leading, epoch {}", term.epoch());
    /// tokio::select! {
    ///     _ = term.lost() => println!("term ended: stop leading at once"),
    ///     _ = tokio::time::sleep(Duration::from_secs(60)) => term.resign().await?,
    /// }
    /// # Ok(()) }
    /// ```
    pub fn leader(&self, name: impl Into<String>) -> LeaderElection {
        LeaderElection {
            manager: self.clone(),
            name: name.into(),
            lease: None,
            backoff: None,
        }
    }
}

/// A leader election, from [`LockManager::leader`]: campaign for it, run a
/// task while leading, or ask and watch who leads.
///
/// The leader holds lock `leader:<name>` (see [`LEADER_KEY_PREFIX`]) with a
/// lease renewed in the background; a leader that crashes is replaced within
/// one lease, one that resigns (or drops its [`Leadership`]) at once.
#[derive(Debug, Clone)]
pub struct LeaderElection {
    manager: LockManager,
    name: String,
    lease: Option<Duration>,
    backoff: Option<Backoff>,
}

impl LeaderElection {
    /// The lease of each term (default: the manager's): a leader that stops
    /// renewing (crashed, partitioned, paused) is replaced within it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The retry policy while campaigning for a busy lock, and between terms
    /// and after failures in [`run`](Self::run) (default: the manager's).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lock key the leader holds: `leader:<name>`.
    pub fn lock_key(&self) -> String {
        format!("{LEADER_KEY_PREFIX}{}", self.name)
    }

    fn channel(&self) -> String {
        format!(
            "{}{LEADER_KEY_PREFIX}{}",
            self.manager.inner.core.config.key_prefix, self.name
        )
    }

    fn request(&self) -> LockRequest {
        let mut request = self
            .manager
            .lock(self.lock_key())
            .eager_fencing(true)
            .reentrant(false)
            .wait(config::MAX_DURATION);
        if let Some(lease) = self.lease {
            request = request.lease(lease);
        }
        if let Some(backoff) = self.backoff {
            request = request.backoff(backoff);
        }
        request
    }

    /// Waits until this process leads, for as long as it takes, and returns
    /// the term. Cancel it (drop the future, or race it with a timeout) to stop
    /// campaigning; a candidate waits in the lock's queue, so a resigning
    /// leader hands over to the candidate that waited longest.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] / [`LockError::InvalidConfig`] for a bad name
    /// or lease, [`LockError::AlreadyHeld`] when this call chain leads already
    /// (inside the term's scope), [`LockError::ShutDown`] once the manager shut
    /// down, [`LockError::Backend`] when Redis fails or does not answer in time,
    /// [`LockError::TokenNotReplicated`] when `replica_ack` is on and too few
    /// replicas confirmed the term's epoch (the term is given up),
    /// [`LockError::Lost`] when the term's grant came after its lease's
    /// deadline (a round trip longer than the lease: never held; [`run`](Self::run)
    /// campaigns again after its backoff).
    pub async fn campaign(&self) -> Result<Leadership, LockError> {
        let guard = loop {
            match self.request().acquire().await {
                Ok(guard) => break guard,
                // Thirty days went by without a term; go on campaigning.
                Err(LockError::Timeout { .. }) => continue,
                Err(e) => return Err(e),
            }
        };
        let epoch = match guard.issued_fencing_token() {
            Some(token) => token,
            None => guard.fencing_token().await?,
        };
        let key = self.lock_key();
        // The hold as Redis stores it, so that `current()`, `watch()` and this
        // term agree on holder and start.
        let info = match self.manager.inspect(&key).await {
            Ok(Some(info)) if info.fencing_token == epoch => LeaderInfo::from_lock(&info),
            // Gone or taken over already: the term is lost, or about to be
            // reported so by the renewal.
            Ok(_) | Err(_) => LeaderInfo {
                holder: self.manager.inner.core.config.holder.clone(),
                epoch,
                since: SystemTime::now(),
            },
        };
        let lease_ms = u64::try_from(guard.lease().as_millis()).unwrap_or(u64::MAX);
        let message = Announcement::Term {
            info: info.clone(),
            lease_ms,
        }
        .encode();
        // Armed before the announcement: a campaign dropped while it is sent
        // (a timeout around `campaign`) gives the term up, and watchers that
        // heard it must hear it ended, or they report a leader that never
        // led until its lease's end.
        let end_told_on_drop = EndToldOnDrop {
            election: Some(Box::new(self.clone())),
            epoch: info.epoch,
        };
        if let Err(e) = self.publish(&key, &message).await {
            // Watchers catch up when they next read the lock (at the end of
            // the lease they last saw, or after a reconnect).
            tracing::warn!(target: "distlock::leader",
                election = %KeyPreview(&self.name), error = %e,
                "could not announce the new term to watchers"
            );
        }
        tracing::info!(target: "distlock::leader",
            election = %KeyPreview(&self.name), epoch, "leading"
        );
        Ok(Leadership {
            election: self.clone(),
            lease: guard.lease_handle(),
            guard,
            end_told_on_drop,
            info,
        })
    }

    async fn publish(&self, key: &str, message: &str) -> Result<(), LockError> {
        let core = &self.manager.inner.core;
        core.backend
            .publish(key, &self.channel(), message)
            .await
            .map_err(|e| e.error)
    }

    /// Leads whenever it can, until the returned future is dropped: campaigns,
    /// calls `term` with the term's [`Leadership`] and runs the future it
    /// returns while leading, then campaigns again, after the term was lost or
    /// the future returned (the [`Leadership`] it owns then drops, which
    /// hands the lead over).
    ///
    /// The future is stopped at its next `.await` when the term is lost, as a
    /// locked function's body is. Between terms, and after a failed campaign,
    /// it waits by the election's [`backoff`](Self::backoff): the first delay
    /// after a term, doubling up to the cap while campaigns fail.
    ///
    /// # Errors
    /// Only those no retry can cure: [`LockError::InvalidKey`],
    /// [`LockError::InvalidConfig`], [`LockError::AlreadyHeld`] and
    /// [`LockError::ShutDown`]. Failures of Redis are logged and retried.
    pub async fn run<F, Fut>(&self, mut term: F) -> Result<Infallible, LockError>
    where
        F: FnMut(Leadership) -> Fut,
        Fut: Future<Output = ()>,
    {
        let backoff = self
            .backoff
            .unwrap_or(self.manager.inner.core.config.backoff);
        let mut delay = backoff.first();
        loop {
            match self.campaign().await {
                Ok(leadership) => {
                    delay = backoff.first();
                    let lease = leadership.lease.clone();
                    // In the term's lock scope, as a locked function's body
                    // is: a campaign for the same election inside it is
                    // refused (`AlreadyHeld`) rather than queued behind the
                    // term that runs it, for ever.
                    let body = crate::context::scope_with(&lease, term(leadership));
                    tokio::select! {
                        biased;
                        () = lease.lost() => {}
                        () = body => {}
                    }
                }
                Err(
                    e @ (LockError::InvalidKey { .. }
                    | LockError::InvalidConfig(_)
                    | LockError::AlreadyHeld { .. }
                    | LockError::Unsupported { .. }
                    | LockError::ShutDown { .. }),
                ) => return Err(e),
                Err(e) => {
                    tracing::warn!(target: "distlock::leader",
                        election = %KeyPreview(&self.name), error = %e, retry_in = ?delay,
                        "campaign failed"
                    );
                    tokio::time::sleep(delay).await;
                    delay = backoff.grow(delay);
                    continue;
                }
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// Who leads now, for any process: `None` when nobody does. One round trip
    /// (one per member under Redlock); a snapshot that may be stale on arrival.
    ///
    /// # Errors
    /// [`LockError::Backend`] when Redis fails or does not answer in time,
    /// [`LockError::ForeignValue`] when something else wrote the lock key.
    pub async fn current(&self) -> Result<Option<LeaderInfo>, LockError> {
        Ok(self
            .manager
            .inspect(&self.lock_key())
            .await?
            .map(|info| LeaderInfo::from_lock(&info)))
    }

    /// A stream of leader changes: first who leads when the watch starts, then
    /// `Some` for each new term (in epoch order, each once) and `None` when a
    /// term ends without a successor yet (a resignation, or a lease that ran
    /// out). A resignation that hands the lead straight to a waiting
    /// candidate is usually reported as `None` and then the successor's term:
    /// the resignation's message comes before the new term's announcement, so
    /// a `None` followed at once by `Some` is a hand-over, not an outage.
    ///
    /// It is fed by the messages each new term and each resignation publish,
    /// and reads the lock after every (re)connect of its subscription. A term
    /// that ends unannounced (its leader died, nobody waits) is seen by the
    /// lock's expiry: a keyspace notification where the servers send them
    /// (`notify-keyspace-events` with `K` and `x`), heard at once. Whatever
    /// it hears, the watch reads the lock when the lease of the term it last
    /// reported runs out (one read per lease period while a leader holds),
    /// and every 5 s while it reports the lead vacant, which makes up for a
    /// message that never came; a watch whose listening connection hears
    /// nothing (PostgreSQL behind a transaction-mode pooler, without
    /// `postgres_listen_url`) reads it every second while the lead is vacant. A term
    /// that began and ended entirely while the subscription was down is
    /// missed; the epochs it reports show the gap. Dropping the stream ends it.
    ///
    /// A reader that keeps up sees every change. Changes wait for a reader
    /// that is behind up to [`LEADER_WATCH_CAPACITY`]; one more, and the
    /// waiting ones are dropped for the newest, so a watcher that stopped
    /// reading while the lead changed many times gets the current state when
    /// it reads again (its epoch shows how many terms it missed), not the
    /// backlog.
    pub fn watch(&self) -> LeaderWatch {
        let (changes, receiver) = buffer::bounded(LEADER_WATCH_CAPACITY);
        // On the manager's runtime, as its other background work: a watch
        // made outside a runtime (or on one that ends sooner) still runs.
        let runtime = &self.manager.inner.core.runtime;
        let task = runtime.spawn(watch(self.clone(), changes));
        LeaderWatch {
            changes: receiver,
            task: task.abort_handle(),
        }
    }
}

/// One term of a [`LeaderElection`]: this process leads until the term is lost
/// ([`lost`](Self::lost)) or it resigns ([`resign`](Self::resign)). Dropping
/// it resigns in the background and tells watchers, as `resign` does.
#[must_use = "dropping the term at once resigns at once"]
#[derive(Debug)]
pub struct Leadership {
    election: LeaderElection,
    lease: Arc<Lease>,
    /// Dropped before `end_told_on_drop` (fields drop in order): the lock's
    /// release is under way before watchers hear the term ended.
    guard: LockGuard,
    end_told_on_drop: EndToldOnDrop,
    info: LeaderInfo,
}

/// Tells watchers that a term ended when its [`Leadership`] is dropped
/// rather than resigned: publishes the resignation from a task of the
/// manager's runtime (never blocks; refused by a runtime that is gone, it
/// tells nobody, and watchers learn it at the lease's end). Without it, a
/// watch whose store sends expiry notices (a released lock sends none) would
/// report the leader until the next term began.
#[derive(Debug)]
struct EndToldOnDrop {
    /// `None` once told (or disarmed by `resign`, which tells it itself).
    /// Boxed: a `Leadership` stays the size it was.
    election: Option<Box<LeaderElection>>,
    epoch: u64,
}

impl Drop for EndToldOnDrop {
    fn drop(&mut self) {
        let Some(election) = self.election.take() else {
            return;
        };
        let epoch = self.epoch;
        let runtime = election.manager.inner.core.runtime.clone();
        drop(runtime.spawn(async move {
            election.announce_resignation(epoch).await;
        }));
    }
}

impl Leadership {
    /// The term's epoch: greater than every earlier term's of this election,
    /// so it works as a fencing token for writes made while leading.
    pub fn epoch(&self) -> u64 {
        self.info.epoch
    }

    /// The term as watchers see it.
    pub fn info(&self) -> &LeaderInfo {
        &self.info
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.election.name
    }

    /// The lock the term holds, for its options ([`LockGuard::scope`],
    /// [`LockGuard::remaining_lease`], ...).
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// True once the term is lost (the lease could not be renewed in time, the
    /// lock was taken over or freed by `force_unlock`, or the manager shut
    /// down).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Completes when the term is lost (at once if it already is); never
    /// while it holds. Work done as leader should stop when it completes.
    pub async fn lost(&self) {
        self.guard.lost().await
    }

    /// Steps down: releases the lock, which hands it to the candidate that
    /// waited longest with one message, then tells watchers.
    ///
    /// # Errors
    /// [`LockError::Lost`] when the term had been lost already;
    /// [`LockError::Backend`] when Redis fails (the lock then ends with its
    /// lease).
    pub async fn resign(self) -> Result<(), LockError> {
        let Leadership {
            election,
            guard,
            info,
            mut end_told_on_drop,
            ..
        } = self;
        // Failed (or dropped half way), the term's end is still told, from
        // the background: watchers ignore the end of a term they no longer
        // report.
        guard.release().await?;
        election.announce_resignation(info.epoch).await;
        end_told_on_drop.election = None;
        Ok(())
    }
}

impl LeaderElection {
    /// Tells watchers that the term of `epoch` ended (they report a vacancy
    /// if that term is the one they report). A failure is logged: watchers
    /// then learn it at the lease's end or from the next term.
    async fn announce_resignation(&self, epoch: u64) {
        let message = Announcement::Resigned { epoch }.encode();
        if let Err(e) = self.publish(&self.lock_key(), &message).await {
            tracing::debug!(target: "distlock::leader",
                election = %KeyPreview(&self.name), error = %e,
                "could not announce the resignation to watchers"
            );
        }
    }
}

/// Who leads an election, from [`LeaderElection::current`] and
/// [`LeaderElection::watch`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The leader's holder description (the manager's
    /// [`holder`](crate::LockManagerBuilder::holder)).
    pub holder: String,
    /// The term's epoch (its fencing token).
    pub epoch: u64,
    /// When the term began, by the leader's clock.
    pub since: SystemTime,
}

impl LeaderInfo {
    fn from_lock(info: &crate::LockInfo) -> LeaderInfo {
        LeaderInfo {
            holder: info.holder.clone(),
            epoch: info.fencing_token,
            since: info.held_since,
        }
    }
}

/// What an election publishes on its channel.
#[derive(Debug, PartialEq)]
enum Announcement {
    /// `T <epoch> <since ms> <lease ms> <holder>`: a new term.
    Term { info: LeaderInfo, lease_ms: u64 },
    /// `R <epoch>`: the term of that epoch resigned.
    Resigned { epoch: u64 },
}

impl Announcement {
    fn encode(&self) -> String {
        match self {
            Announcement::Term { info, lease_ms } => {
                let since = info
                    .since
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis());
                format!("T {} {since} {lease_ms} {}", info.epoch, info.holder)
            }
            Announcement::Resigned { epoch } => format!("R {epoch}"),
        }
    }

    fn decode(message: &str) -> Option<Announcement> {
        let mut parts = message.splitn(5, ' ');
        match parts.next()? {
            "T" => {
                let epoch = parts.next()?.parse().ok()?;
                let since: u64 = parts.next()?.parse().ok()?;
                let since = UNIX_EPOCH.checked_add(Duration::from_millis(since))?;
                let lease_ms = parts.next()?.parse().ok()?;
                let holder = parts.next().unwrap_or("").to_owned();
                Some(Announcement::Term {
                    info: LeaderInfo {
                        holder,
                        epoch,
                        since,
                    },
                    lease_ms,
                })
            }
            "R" => Some(Announcement::Resigned {
                epoch: parts.next()?.parse().ok()?,
            }),
            _ => None,
        }
    }
}

/// The stream from [`LeaderElection::watch`]: `Option<LeaderInfo>` for each
/// change (after a reader fell [`LEADER_WATCH_CAPACITY`] changes behind, the
/// newest for all those it missed). Ends when the manager shuts down
/// ([`LockManager::shutdown`](crate::LockManager::shutdown)) or its runtime
/// does.
pub struct LeaderWatch {
    changes: buffer::Receiver<Option<LeaderInfo>>,
    task: tokio::task::AbortHandle,
}

impl std::fmt::Debug for LeaderWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderWatch")
            .field("task", &self.task)
            .finish_non_exhaustive()
    }
}

impl futures_util::Stream for LeaderWatch {
    type Item = Option<LeaderInfo>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            return match self.changes.poll_pop(cx) {
                Poll::Ready(Some(Popped::Item(change))) => Poll::Ready(Some(change)),
                // The watch replaces on overflow and counts nothing, so this
                // is not reached; were it, the next change is the newer state.
                Poll::Ready(Some(Popped::Skipped(_))) => continue,
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            };
        }
    }
}

impl Drop for LeaderWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the watch task hears from one subscription.
enum Heard {
    /// Subscribed (again): anything may have happened meanwhile.
    Subscribed,
    /// The lock expired (a keyspace notification).
    Expired,
    Message(String),
}

/// What the watch has reported, to report each change once and in order.
struct Reported {
    /// The highest epoch reported.
    epoch: Option<u64>,
    /// Whether the last report was a leader (not `None`).
    leading: bool,
    /// Whether anything was reported yet.
    started: bool,
}

impl Reported {
    /// What to report, given that `now` is the election's state.
    fn change(&mut self, now: Option<LeaderInfo>) -> Option<Option<LeaderInfo>> {
        match now {
            Some(info) if self.epoch.is_none_or(|last| info.epoch > last) => {
                self.epoch = Some(info.epoch);
                self.leading = true;
                self.started = true;
                Some(Some(info))
            }
            // An older or the same term: already reported.
            Some(_) => None,
            None if self.leading || !self.started => {
                self.leading = false;
                self.started = true;
                Some(None)
            }
            None => None,
        }
    }

    /// A resignation of `epoch`: the lead is vacant if that was the last term
    /// reported (a later one may have been reported already).
    fn resigned(&mut self, epoch: u64) -> Option<Option<LeaderInfo>> {
        if self.leading && self.epoch == Some(epoch) {
            self.leading = false;
            return Some(None);
        }
        None
    }
}

async fn watch(election: LeaderElection, changes: buffer::Sender<Option<LeaderInfo>>) {
    let core = election.manager.inner.core.clone();
    let channel = election.channel();
    // With keyspace notifications of expired keys on, the end of a term
    // nobody announced is a message too, heard at once; with or without,
    // the watch reads the lock when the lease it last saw ends.
    let expiry = if core.backend.notifies_expiry().await {
        core.backend.expiry_pattern(&crate::keys::escape_glob(
            &core.keys(&election.lock_key()).lock,
        ))
    } else {
        None
    };
    let (heard_tx, mut heard) = buffer::bounded(HEARD_CAPACITY);
    let sink: Arc<dyn Sink> = Arc::new(WatchSink { heard: heard_tx });
    let sources = core.backend.message_sources();
    // Every source: a term's announcement reaches each (a Redlock publishes
    // on every member), so the watch hears it while any one is up.
    let mut interests =
        vec![core
            .subscriber
            .listen(Topic::Channel(channel), sources, false, sink.clone())];
    if let Some(expiry) = &expiry {
        interests.push(core.subscriber.listen(
            Topic::Pattern(expiry.clone()),
            sources,
            false,
            sink,
        ));
    } else {
        // Only the interests keep the sink: when the manager shuts down and
        // drops them, `heard` ends, and with it this task.
        drop(sink);
    }
    // The first read waits until every subscription is in place (or the
    // connect timeout passes, or one is refused): a read after that misses
    // nothing announced later. What was heard before that read, the read
    // covers, so it is dropped; otherwise each early confirmation would read
    // the lock once more, each a term behind or ahead of the last report.
    let all_subscribed = async {
        for interest in &interests {
            if interest.subscribed().await.is_err() {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(core.config.connect_timeout, all_subscribed).await;
    while let Some(Some(_)) = heard.pop().now_or_never() {}
    // Unregistered when the watch's task ends (its stream was dropped).
    let _interests = interests;

    let mut reported = Reported {
        epoch: None,
        leading: false,
        started: false,
    };
    // When to read the lock again: the end of the lease last seen.
    let mut read_at = None;
    let mut read_now = true;
    loop {
        if read_now {
            read_now = false;
            match election.manager.inspect(&election.lock_key()).await {
                Ok(held) => {
                    let now = tokio::time::Instant::now();
                    // Expiry notices and announcements end a term sooner;
                    // these reads are what ends it when neither comes: a
                    // lock released or force-unlocked whose resignation was
                    // not announced (a released lock sends no expiry
                    // notice), a subscription to the notices refused, a
                    // replica promoted without the notices' setting, an
                    // announcement of a new term lost.
                    read_at = match &held {
                        // A millisecond past the TTL Redis reported, so the
                        // key has expired by the next read.
                        Some(info) => Some(
                            now + info.ttl.unwrap_or(Duration::from_secs(1))
                                + Duration::from_millis(1),
                        ),
                        None if !core.backend.hears_messages() => Some(now + DEAF_VACANCY_READ),
                        None => Some(now + VACANCY_READ),
                    };
                    let now = held.map(|info| LeaderInfo::from_lock(&info));
                    if let Some(change) = reported.change(now) {
                        if changes.push_or_replace(change).is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(target: "distlock::leader",
                        election = %KeyPreview(&election.name), error = %e,
                        "watch could not read the leader; retrying"
                    );
                    read_at = Some(tokio::time::Instant::now() + Duration::from_millis(200));
                }
            }
        }
        let expiry = async {
            match read_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        // A reader that drops the stream aborts this task.
        tokio::select! {
            () = expiry => read_now = true,
            event = heard.pop() => match event {
                None => return,
                // Messages were dropped while this task was reading the
                // lock: reading it again tells where they led.
                Some(Popped::Skipped(_)) => read_now = true,
                Some(Popped::Item(Heard::Subscribed | Heard::Expired)) => read_now = true,
                Some(Popped::Item(Heard::Message(message))) => {
                    let change = match Announcement::decode(&message) {
                        Some(Announcement::Term { info, lease_ms }) => {
                            let change = reported.change(Some(info));
                            if change.is_some() {
                                read_at = Some(
                                    tokio::time::Instant::now()
                                        + Duration::from_millis(lease_ms)
                                        + Duration::from_millis(1),
                                );
                            }
                            change
                        }
                        Some(Announcement::Resigned { epoch }) => {
                            let change = reported.resigned(epoch);
                            if change.is_some() {
                                read_at = Some(tokio::time::Instant::now() + VACANCY_READ);
                            }
                            change
                        }
                        None => None,
                    };
                    if let Some(change) = change {
                        if changes.push_or_replace(change).is_err() {
                            return;
                        }
                    }
                }
            },
        }
    }
}

/// Hands a watch's task what the subscriber hears for it.
struct WatchSink {
    heard: buffer::Sender<Heard>,
}

impl Sink for WatchSink {
    fn heard(&self, message: &Message) {
        let heard = match message.key_notice() {
            Some(KeyNotice::Expired(_)) => Heard::Expired,
            Some(KeyNotice::Other) => return,
            None => match std::str::from_utf8(&message.payload) {
                Ok(text) => Heard::Message(text.to_owned()),
                Err(_) => return,
            },
        };
        // Never waits: past the bound, the task reads the lock instead.
        let _ = self.heard.push_or_skip(heard);
    }

    fn subscribed(&self, _after_loss: bool) {
        // Subscribed, or subscribed again after a reconnect: either way the
        // task reads the lock, which tells what it may have missed.
        let _ = self.heard.push_or_skip(Heard::Subscribed);
    }

    fn refused_again(&self) {
        // One of its topics is refused after a reconnect, and the others'
        // notice waits for it: the task reads the lock now, rather than at
        // its next timed read.
        let _ = self.heard.push_or_skip(Heard::Subscribed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_round_trip() {
        let term = Announcement::Term {
            info: LeaderInfo {
                holder: "web-1 pid 7 api: v2".into(),
                epoch: 1_700_000_000_000_001,
                since: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            },
            lease_ms: 10_000,
        };
        assert_eq!(Announcement::decode(&term.encode()), Some(term));
        let resigned = Announcement::Resigned { epoch: 9 };
        assert_eq!(Announcement::decode(&resigned.encode()), Some(resigned));
        assert_eq!(Announcement::decode("X 1"), None);
        assert_eq!(Announcement::decode("T x 1 1 h"), None);
    }

    fn leader(epoch: u64) -> Option<LeaderInfo> {
        Some(LeaderInfo {
            holder: "h".into(),
            epoch,
            since: UNIX_EPOCH,
        })
    }

    #[test]
    fn each_change_is_reported_once_in_epoch_order() {
        let mut reported = Reported {
            epoch: None,
            leading: false,
            started: false,
        };
        assert_eq!(reported.change(None), Some(None), "the start is reported");
        assert_eq!(reported.change(None), None);
        assert_eq!(reported.change(leader(5)), Some(leader(5)));
        assert_eq!(reported.change(leader(5)), None, "heard twice");
        assert_eq!(reported.change(leader(7)), Some(leader(7)));
        assert_eq!(reported.change(leader(6)), None, "late and older");
        assert_eq!(reported.resigned(6), None, "not the last term reported");
        assert_eq!(reported.resigned(7), Some(None));
        assert_eq!(reported.resigned(7), None);
        assert_eq!(reported.change(None), None);
        assert_eq!(reported.change(leader(8)), Some(leader(8)));
        assert_eq!(reported.change(None), Some(None), "ran out");
    }
}
