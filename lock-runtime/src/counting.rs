//! The counting semaphore: permits as a counter in Redis that any caller may
//! raise or lower, with no holders and no lease (Redisson's `RSemaphore`).
//!
//! Every operation is one script on the server that holds the counter
//! (`counter_acquire.lua`, `counter_change.lua`): atomic, one round trip. An
//! acquisition that finds too few permits and may wait records itself in
//! the counter's waiters (a sorted set scored by the end of its
//! registration), listens on the counter's channel through the manager's
//! subscriber, and tries again when a change that makes permits available
//! publishes a wake-up (published only while someone is registered), or on
//! its backoff timer when a wake-up is lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{CallError, CounterOp, CounterOutcome, CounterReply};
use crate::core::{Core, ManagerInner};
use crate::error::LockError;
use crate::keys::CounterNames;
use crate::waiting::BackoffTimer;

/// How long a waiting acquisition's registration lasts at most (each attempt
/// renews it; a waiter naps at most half of it between attempts). A waiter
/// that leaves without a word (cancelled, crashed) is forgotten this long
/// after its last attempt: until then, a change may publish a wake-up nobody
/// needs, and no more.
const MAX_REGISTRATION: Duration = Duration::from_secs(10);

/// How long the receipt of a change is kept on Redis (see
/// `counter_prelude.lua` and `Config::receipt_ms`).
fn receipt_ms(core: &Core) -> u64 {
    core.config.receipt_ms()
}

/// What a registration lasts beyond the waiter's deadline: its last attempt
/// may arrive a round trip after the deadline it computed from.
const REGISTRATION_MARGIN: Duration = Duration::from_secs(1);

/// A counting semaphore, from
/// [`LockManager::counting_semaphore`](crate::LockManager::counting_semaphore):
/// a number of available permits kept in Redis, which any caller may take
/// ([`acquire`](Self::acquire)), give ([`release`](Self::release),
/// [`add_permits`](Self::add_permits)) or set
/// ([`try_set_permits`](Self::try_set_permits),
/// [`set_permits`](Self::set_permits)), as Redisson's `RSemaphore` does.
///
/// **Not a lock, and no lease.** Taking permits records no holder: a
/// release needs no hold (any caller may release permits it never took), and
/// a process that crashes (or forgets) after taking permits never gives them
/// back; the counter keeps them taken for good, until someone adds them back
/// ([`add_permits`](Self::add_permits), or `distlock permits KEY --add N`).
/// For permits that come back when their holder dies, use the leased
/// [`LockManager::semaphore`](crate::LockManager::semaphore), whose every
/// permit is a hold with a lease.
///
/// The count is a signed 64-bit integer: it may go below zero when permits
/// are removed while taken ([`add_permits`](Self::add_permits) with a
/// negative number), and then nobody takes one until releases bring it back
/// above. A counter that does not exist has 0 permits (and
/// [`try_set_permits`](Self::try_set_permits) may create it). It has no TTL.
///
/// Cost: every operation is one script, one round trip, atomic on the
/// server; a waiting [`acquire`](Self::acquire) makes one more per wake-up
/// or backoff tick. A change that makes permits available publishes one
/// wake-up when some acquisition waits (none otherwise), and every waiter
/// of the counter tries again: waiters are not served in order, and a
/// request for many permits may wait while smaller ones are served. Not
/// available on a Redlock manager (one counter on each member would not add
/// up to one count).
///
/// A cheap handle (the key and its Redis names): clone it, or make another
/// with the same key; they act on the same counter.
///
/// ```no_run
/// # async fn demo(manager: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
/// let uploads = manager.counting_semaphore("uploads");
/// uploads.try_set_permits(8).await?; // only the first caller's count stands
/// uploads.acquire(1).await?;
/// // ... upload; a crash here keeps the permit taken ...
/// uploads.release(1).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct CountingSemaphore {
    manager: Arc<ManagerInner>,
    key: String,
    names: CounterNames,
}

impl std::fmt::Debug for CountingSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingSemaphore")
            .field("key", &self.key)
            .field("counter", &self.names.counter)
            .finish_non_exhaustive()
    }
}

/// Permits an acquisition's or a drain's task took, on their way to the
/// caller (see `CountingSemaphore::taking_in_a_task`): given back from a task of the manager's
/// runtime when dropped unclaimed. Never blocks: a runtime that is gone
/// refuses the task, and the permits then stay taken.
struct Unclaimed {
    /// `None` once claimed.
    semaphore: Option<CountingSemaphore>,
    permits: i64,
}

impl Unclaimed {
    fn claim(mut self) {
        self.semaphore = None;
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if let Some(semaphore) = self.semaphore.take() {
            let permits = self.permits;
            let runtime = semaphore.core().runtime.clone();
            let counted = semaphore.core().background_work();
            drop(runtime.spawn(async move {
                let _counted = counted;
                semaphore.give_back_unclaimed(permits).await
            }));
        }
    }
}

/// A counting semaphore's counter as one script read it, from
/// [`CountingSemaphore::counts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CountingPermits {
    /// The permits available now (below zero after a shrink below what is
    /// taken; 0 when the counter does not exist).
    pub available: i64,
    /// Whether the counter exists (set, added to or taken from since it was
    /// last deleted).
    pub exists: bool,
    /// Acquisitions registered as waiting for permits (of every process).
    pub waiters: u64,
}

impl CountingSemaphore {
    pub(crate) fn new(manager: Arc<ManagerInner>, key: String) -> Self {
        let names = CounterNames::of(&manager.core.config.key_prefix, &key);
        CountingSemaphore {
            manager,
            key,
            names,
        }
    }

    /// The counting semaphore's key, as the program named it.
    pub fn key(&self) -> &str {
        &self.key
    }

    fn core(&self) -> &Arc<Core> {
        &self.manager.core
    }

    /// Takes `permits` if that many are available now; never waits. Returns
    /// whether they were taken. One round trip.
    ///
    /// # Errors
    /// [`LockError::InvalidPermits`] for 0 or more than `i64::MAX` permits,
    /// [`LockError::InvalidKey`] for a bad key, [`LockError::ForeignValue`]
    /// when the counter's names hold values distlock did not write,
    /// [`LockError::ShutDown`] after the manager's shutdown,
    /// [`LockError::InvalidConfig`] on a Redlock manager,
    /// [`LockError::Backend`] when Redis fails or does not answer in time.
    pub async fn try_acquire(&self, permits: u64) -> Result<bool, LockError> {
        self.try_acquire_within(permits, Duration::ZERO).await
    }

    /// Takes `permits`, waiting up to the manager's
    /// [default wait](crate::LockManager::default_wait) for that many to be
    /// available. One round trip when they are; then one per wake-up (a
    /// change that made permits available) or backoff tick.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when too few permits were available for the
    /// whole wait; otherwise as [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, permits: u64) -> Result<(), LockError> {
        let wait = self.core().config.default_wait;
        if self.try_acquire_within(permits, wait).await? {
            Ok(())
        } else {
            Err(LockError::Timeout {
                key: self.key.clone(),
                waited: wait,
            })
        }
    }

    /// Takes `permits`, waiting up to `wait` for that many to be available;
    /// returns whether they were taken. With a zero `wait`, one attempt, as
    /// [`try_acquire`](Self::try_acquire). Cancel-safe: dropped while it
    /// waits, it has taken nothing (its registration as a waiter ends on its
    /// own within seconds); dropped while an attempt is in flight, the
    /// manager reads the attempt's reply and gives back the permits it took
    /// (also after its shutdown; not once its runtime is gone).
    /// An attempt that gets no reply within the command timeout
    /// ([`LockError::Backend`]) may have taken them, unknown to anyone: they
    /// stay taken (fewer callers than the permits allow, never more) until
    /// someone adds them back.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a wait above
    /// [`MAX_DURATION`](crate::MAX_DURATION); otherwise as
    /// [`try_acquire`](Self::try_acquire).
    pub async fn try_acquire_within(
        &self,
        permits: u64,
        wait: Duration,
    ) -> Result<bool, LockError> {
        let wanted = self.wanted(permits, "acquire")?;
        crate::config::validate_wait(
            wait,
            &format!(
                "the wait for counting semaphore {}",
                crate::error::KeyPreview(&self.key)
            ),
        )?;
        let core = self.core().clone();
        if core.is_shut_down() {
            return Err(self.shut_down());
        }
        let start = Instant::now();
        // At most 30 days ahead (checked above): no overflow.
        let deadline = start + wait;
        let channel = self.names.channel.as_str();
        // One owner token for the whole acquisition: its entry among the
        // waiters, refreshed by each attempt and removed by the one that
        // takes the permits.
        let owner = crate::config::owner_token();
        // With other waiters of this manager on the counter, the channel is
        // subscribed: register first and attempt right after, so that a
        // change published after the attempt wakes this waiter too.
        let mut attempt_now = !wait.is_zero() && core.subscriber.has_waiters(channel);
        if !attempt_now {
            // A first waiter registers in Redis with its first attempt, then
            // subscribes; a change published before the subscription is
            // confirmed is made up for by the attempt every waiter makes once
            // it is (see waiting.rs).
            if self.attempt(&owner, wanted, deadline).await? {
                return Ok(true);
            }
            if wait.is_zero() {
                return Ok(false);
            }
        }
        let registration = core.subscriber.register(channel, 1);
        let mut backoff = BackoffTimer::new(core.config.backoff);
        loop {
            if !attempt_now {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    // The registration in Redis ends on its own a moment after
                    // the deadline: no round trip to withdraw it.
                    return Ok(false);
                }
                let nap = backoff.next(None).min(left).min(MAX_REGISTRATION / 2);
                tokio::select! {
                    _ = registration.woken() => {}
                    () = tokio::time::sleep(nap) => {}
                }
                if core.is_shut_down() {
                    return Err(self.shut_down());
                }
            }
            attempt_now = false;
            if self.attempt(&owner, wanted, deadline).await? {
                return Ok(true);
            }
        }
    }

    /// One acquisition script: takes `wanted` permits, or registers `owner`
    /// as a waiter until a moment after `deadline` (not at all once it
    /// passed).
    async fn attempt(
        &self,
        owner: &str,
        wanted: i64,
        deadline: Instant,
    ) -> Result<bool, LockError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let register_ms = if left.is_zero() {
            0
        } else {
            let registration = left.min(MAX_REGISTRATION) + REGISTRATION_MARGIN;
            u64::try_from(registration.as_millis()).unwrap_or(u64::MAX)
        };
        let semaphore = self.clone();
        let owner = owner.to_owned();
        let reply = self
            .taking_in_a_task(
                move |reply| {
                    if reply.outcome == CounterOutcome::Done {
                        wanted
                    } else {
                        0
                    }
                },
                async move {
                    semaphore
                        .core()
                        .backend
                        .counter_acquire(
                            &semaphore.key,
                            &semaphore.names,
                            &owner,
                            wanted,
                            register_ms,
                            receipt_ms(semaphore.core()),
                        )
                        .await
                },
            )
            .await?;
        Ok(self.outcome(reply)?.outcome == CounterOutcome::Done)
    }

    /// Runs `call`, a script that may take permits (`taken` reads how many
    /// from its reply), in a task of the manager's runtime rather than in
    /// this future: dropped while the script is in flight (the caller's
    /// timeout, a `select!`, an aborted task), this future would never
    /// learn what it took, and nothing holds those permits but the count.
    /// The task reads the reply and hands the permits taken over as an
    /// `Unclaimed`, which gives them back unless this future claims it: also
    /// when this future is gone before it reads the reply.
    async fn taking_in_a_task(
        &self,
        taken: impl FnOnce(&CounterReply) -> i64 + Send + 'static,
        call: impl std::future::Future<Output = Result<CounterReply, CallError>> + Send + 'static,
    ) -> Result<Result<CounterReply, CallError>, LockError> {
        let (reply_to, reply) = tokio::sync::oneshot::channel();
        let semaphore = self.clone();
        // Counted for the shutdown: the permits the call takes are given
        // back by this task when its caller is gone.
        let counted = self.core().background_work();
        drop(self.core().runtime.spawn(async move {
            let _counted = counted;
            let reply = call.await;
            let permits = reply.as_ref().map_or(0, taken);
            let unclaimed = (permits > 0).then(|| Unclaimed {
                semaphore: Some(semaphore),
                permits,
            });
            // Refused (the caller is gone), the pair drops here and the
            // permits go back.
            let _ = reply_to.send((reply, unclaimed));
        }));
        let (reply, unclaimed) = reply.await.map_err(|_| self.shut_down())?;
        if let Some(unclaimed) = unclaimed {
            unclaimed.claim();
        }
        Ok(reply)
    }

    /// Gives back `permits` that an acquisition or a drain took after its caller had
    /// gone (see `attempt`), waking the waiters if some wait. Straight to
    /// the store, also after the manager's shutdown: nothing else would
    /// give them back.
    async fn give_back_unclaimed(&self, permits: i64) {
        let owner = crate::config::owner_token();
        let reply = self
            .core()
            .backend
            .counter_change(
                &self.key,
                &self.names,
                &owner,
                CounterOp::Add(permits),
                receipt_ms(self.core()),
            )
            .await;
        match reply {
            Ok(reply) if reply.outcome == CounterOutcome::Done => {
                tracing::debug!(target: "distlock::release",
                key = %crate::error::KeyPreview(&self.key), permits, available = reply.count,
                "gave back the permits of a call dropped in flight")
            }
            // The count would pass i64::MAX (it was raised meanwhile), or
            // the names hold another program's values: nothing was added.
            Ok(reply) => tracing::warn!(target: "distlock::release",
                key = %crate::error::KeyPreview(&self.key), permits, count = reply.count,
                outcome = ?reply.outcome,
                "could not give back the permits of a call dropped in flight; \
                 they stay taken until someone adds them back"),
            Err(e) => tracing::warn!(target: "distlock::release",
                key = %crate::error::KeyPreview(&self.key), permits, error = %e.error,
                "could not give back the permits of a call dropped in flight; \
                 they stay taken until someone adds them back"),
        }
    }

    /// Gives back `permits` (or gives them for the first time: no hold is
    /// needed, and the count has no ceiling) and wakes the waiters if some
    /// wait; returns the permits available after. The same as
    /// [`add_permits`](Self::add_permits) with a positive number. One round
    /// trip.
    ///
    /// # Errors
    /// [`LockError::InvalidPermits`] for 0 or more than `i64::MAX` permits,
    /// or when the count would pass `i64::MAX` (nothing is changed);
    /// otherwise as [`try_acquire`](Self::try_acquire). A
    /// [`LockError::Backend`] from a call that may have run (its reply lost)
    /// leaves unknown whether the permits went back: each call is a change
    /// of its own, so calling again may give them back twice (distlock
    /// resends a call only where it can tell that it ran); read
    /// [`counts`](Self::counts) first.
    pub async fn release(&self, permits: u64) -> Result<i64, LockError> {
        let permits = self.wanted(permits, "release")?;
        self.change(CounterOp::Add(permits)).await.map(|r| r.count)
    }

    /// Adds `permits` to the count (negative: removes them, and the count
    /// may go below zero, when more are taken than the new size allows),
    /// creating the counter at 0 first if it does not exist; wakes the
    /// waiters when permits became available and some wait. Returns the
    /// permits available after. One round trip.
    ///
    /// # Errors
    /// [`LockError::InvalidPermits`] when the count would leave the 64-bit
    /// range (nothing is changed); otherwise as
    /// [`try_acquire`](Self::try_acquire). After a [`LockError::Backend`],
    /// as for [`release`](Self::release): the change may have been made.
    pub async fn add_permits(&self, permits: i64) -> Result<i64, LockError> {
        self.change(CounterOp::Add(permits)).await.map(|r| r.count)
    }

    /// Sets the count to `permits` if the counter does not exist yet (the
    /// first caller's count stands; later calls change nothing), waking the
    /// waiters when permits became available. Returns whether it was set. One
    /// round trip.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn try_set_permits(&self, permits: i64) -> Result<bool, LockError> {
        self.change(CounterOp::TrySet(permits))
            .await
            .map(|r| r.outcome == CounterOutcome::Done)
    }

    /// Sets the count to `permits` whatever it was (for an operator restoring
    /// permits lost by crashed processes: the permits taken now are
    /// forgotten, and their later releases count on top), waking the waiters
    /// when permits became available. One round trip.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn set_permits(&self, permits: i64) -> Result<(), LockError> {
        self.change(CounterOp::Set(permits)).await.map(drop)
    }

    /// Takes every available permit at once and returns how many (0 when
    /// none are available; a count below zero stays as it is). One round
    /// trip. Cancel-safe as [`acquire`](Self::acquire): dropped while its
    /// script is in flight, the permits it took are given back.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire). A [`LockError::Backend`] from a
    /// call that may have run (its reply lost) leaves unknown whether it
    /// drained the permits; [`counts`](Self::counts) tells what is left.
    pub async fn drain_permits(&self) -> Result<i64, LockError> {
        self.ready()?;
        let drained = |reply: &CounterReply| match reply.outcome {
            CounterOutcome::Done => reply.count,
            _ => 0,
        };
        let semaphore = self.clone();
        let reply = self
            .taking_in_a_task(drained, async move {
                let owner = crate::config::owner_token();
                semaphore
                    .core()
                    .backend
                    .counter_change(
                        &semaphore.key,
                        &semaphore.names,
                        &owner,
                        CounterOp::Drain,
                        receipt_ms(semaphore.core()),
                    )
                    .await
            })
            .await?;
        Ok(drained(&self.outcome(reply)?))
    }

    /// The permits available now (below zero after a shrink below what is
    /// taken; 0 when the counter does not exist). One round trip; a snapshot
    /// that may be stale by the time it arrives.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn available_permits(&self) -> Result<i64, LockError> {
        self.counts().await.map(|c| c.available)
    }

    /// The permits available, whether the counter exists, and how many
    /// acquisitions wait: one script, one round trip, a snapshot.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn counts(&self) -> Result<CountingPermits, LockError> {
        let reply = self.change(CounterOp::Read).await?;
        Ok(CountingPermits {
            available: reply.count,
            exists: reply.outcome == CounterOutcome::Done,
            waiters: reply.waiters,
        })
    }

    /// Deletes the counter (its count is then 0, and
    /// [`try_set_permits`](Self::try_set_permits) may set it again); returns
    /// whether it existed. Waiting acquisitions wait on. One round trip.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn delete(&self) -> Result<bool, LockError> {
        self.change(CounterOp::Delete)
            .await
            .map(|r| r.outcome == CounterOutcome::Done)
    }

    /// One change script, its refusals as errors.
    async fn change(&self, op: CounterOp) -> Result<CounterReply, LockError> {
        self.ready()?;
        let owner = crate::config::owner_token();
        let reply = self
            .core()
            .backend
            .counter_change(&self.key, &self.names, &owner, op, receipt_ms(self.core()))
            .await;
        let reply = self.outcome(reply)?;
        if reply.outcome == CounterOutcome::Overflow {
            return Err(LockError::InvalidPermits {
                key: self.key.clone(),
                reason: format!(
                    "{op:?} would take the count ({}) out of the 64-bit range; nothing was changed",
                    reply.count
                ),
            });
        }
        Ok(reply)
    }

    /// A reply, with a foreign value as its error.
    fn outcome(&self, reply: Result<CounterReply, CallError>) -> Result<CounterReply, LockError> {
        let reply = reply.map_err(|e| e.error)?;
        if reply.outcome == CounterOutcome::Foreign {
            return Err(LockError::ForeignValue {
                key: self.key.clone(),
            });
        }
        Ok(reply)
    }

    /// Whether a call may go to the store: its key is valid and the manager
    /// is not shut down.
    fn ready(&self) -> Result<(), LockError> {
        crate::keys::validate_key(&self.key)?;
        if self.core().is_shut_down() {
            return Err(self.shut_down());
        }
        Ok(())
    }

    /// `permits` as the positive count a script takes.
    fn wanted(&self, permits: u64, what: &str) -> Result<i64, LockError> {
        crate::keys::validate_key(&self.key)?;
        match i64::try_from(permits) {
            Ok(0) => Err(LockError::InvalidPermits {
                key: self.key.clone(),
                reason: format!("cannot {what} 0 permits"),
            }),
            Ok(n) => Ok(n),
            Err(_) => Err(LockError::InvalidPermits {
                key: self.key.clone(),
                reason: format!(
                    "cannot {what} {permits} permits: the count is a signed 64-bit integer (at most {})",
                    i64::MAX
                ),
            }),
        }
    }

    fn shut_down(&self) -> LockError {
        LockError::ShutDown {
            key: self.key.clone(),
        }
    }
}
