//! The watchdog: one task per manager renews every live lease in pipelined batches.
//!
//! A lease is due `lease / 3` after its last renewal (or acquisition); a lease
//! handed over by another's release, a third of the TTL the hand-off gave. The
//! task sleeps until the earliest due time, then renews every lease due within a
//! quarter of that period, so leases that start close together stay in one
//! batch. The backend renews a batch of up to `BATCH` leases in one round trip per server
//! (one pipeline of EVALSHAs on a single server; one per node in a cluster).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::backend::{Backend, ExpectedWaiters, LeaseEnd, Renewal};
use crate::error::KeyPreview;
use crate::lease::{Lease, RenewalTrouble};

/// Renewals per pipeline (one round trip each).
const BATCH: usize = 512;

/// The most batch timings kept between two reads of them (see
/// [`Renewals::take_batches`]), so that a reader that never comes back
/// cannot grow them without bound.
#[cfg(feature = "testing")]
const KEPT_BATCHES: usize = 4096;

pub(crate) struct Renewals {
    leases: Mutex<LeaseMap>,
    /// Woken when a lease is added that is due before the task's next wake-up.
    added: Notify,
    /// When the task will next look, in nanoseconds after the manager's epoch;
    /// `u64::MAX` while it is looking or has nothing to wait for. Acquiring a lock
    /// wakes the task only when the new lease is due sooner, not on every acquire
    /// (a cross-thread wake-up and a scan of every lease cost more than the
    /// acquire's own work).
    wake_at: AtomicU64,
    /// The shortest renewal interval (nanoseconds) of the leases added since the
    /// task last began a nap; `u64::MAX` for none. A task with nothing to renew
    /// naps that long rather than sleeping for ever: a lease added during the nap is then due
    /// no sooner than the task looks again, so a stream of short acquire/release
    /// cycles does not wake it once per acquire (the release removes the lease
    /// before the task ever sees it).
    recent_interval: AtomicU64,
    /// How often the task has woken up (by an added lease or by its timer); for
    /// tests that count wake-ups per lock cycle.
    wakeups: AtomicU64,
    /// Each renewal batch's size and time since the last read: for the bench,
    /// which times distlock's renewal against the same statement by hand.
    #[cfg(feature = "testing")]
    batches: Mutex<Vec<(usize, Duration)>>,
}

#[derive(Default)]
struct LeaseMap {
    by_id: HashMap<u64, Arc<Lease>>,
    /// Set by `close` (manager shutdown): no lease is added any more.
    closed: bool,
}

impl Default for Renewals {
    fn default() -> Self {
        Renewals {
            leases: Mutex::default(),
            added: Notify::new(),
            wake_at: AtomicU64::new(u64::MAX),
            recent_interval: AtomicU64::new(u64::MAX),
            wakeups: AtomicU64::new(0),
            #[cfg(feature = "testing")]
            batches: Mutex::default(),
        }
    }
}

impl Renewals {
    fn leases(&self) -> MutexGuard<'_, LeaseMap> {
        // A panic elsewhere while holding the lock leaves the map consistent
        // (every update is one insert or remove), so poisoning is ignored.
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a lease to renew; false (and nothing added) once the manager is shut down.
    pub(crate) fn insert(&self, lease: Arc<Lease>) -> bool {
        if lease.renew {
            let interval = u64::try_from(lease.renewal_interval().as_nanos()).unwrap_or(u64::MAX);
            self.recent_interval.fetch_min(interval, Ordering::Relaxed);
        }
        let (renew, next_renewal) = (lease.renew, lease.next_renewal_nanos());
        {
            let mut leases = self.leases();
            if leases.closed {
                return false;
            }
            leases.by_id.insert(lease.id, lease);
        }
        // The plan is read after the insert. Read before, it could be the
        // previous plan (sooner than this lease's renewal: no wake-up), then
        // replaced by a look that missed the lease and a plan past its
        // renewal. Read after, it is the plan the task will keep (it wakes
        // then, or sooner if told, and sees the lease) or its "looking now"
        // (u64::MAX, stored before each look), which wakes it again.
        if renew && next_renewal < self.wake_at.load(Ordering::SeqCst) {
            self.added.notify_one();
        }
        true
    }

    /// Wakes the task when `lease`, already in the map, is now due before
    /// the task's next look (its lease was shortened by `extend`).
    pub(crate) fn rescheduled(&self, lease: &Lease) {
        if lease.renew && lease.next_renewal_nanos() < self.wake_at.load(Ordering::SeqCst) {
            self.added.notify_one();
        }
    }

    /// Takes the lease out; false when it was not in (the manager's
    /// shutdown took it, or it was never added).
    pub(crate) fn remove(&self, id: u64) -> bool {
        self.leases().by_id.remove(&id).is_some()
    }

    pub(crate) fn live_count(&self) -> usize {
        self.leases().by_id.len()
    }

    /// How often the renewal task has woken up so far.
    #[cfg(feature = "testing")]
    pub(crate) fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    /// The size and time of every renewal batch since the last call, oldest
    /// first (at most [`KEPT_BATCHES`]).
    #[cfg(feature = "testing")]
    pub(crate) fn take_batches(&self) -> Vec<(usize, Duration)> {
        let mut batches = self.batches.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *batches)
    }

    #[cfg(feature = "testing")]
    fn record_batch(&self, leases: usize, took: Duration) {
        let mut batches = self.batches.lock().unwrap_or_else(|e| e.into_inner());
        if batches.len() < KEPT_BATCHES {
            batches.push((leases, took));
        }
    }

    /// Takes every lease out and refuses new ones (manager shutdown).
    pub(crate) fn close(&self) -> Vec<Arc<Lease>> {
        let mut leases = self.leases();
        leases.closed = true;
        leases.by_id.drain().map(|(_, lease)| lease).collect()
    }

    /// The leases to renew now, and when the next one not among them is due.
    fn due(&self, now: Instant) -> (Vec<Arc<Lease>>, Option<Instant>) {
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for lease in self.leases().by_id.values() {
            if !lease.renew || !lease.is_held() {
                continue;
            }
            let at = lease.next_renewal();
            if at <= now + lease.renewal_window() {
                due.push(lease.clone());
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        (due, next)
    }
}

pub(crate) async fn run(renewals: &Renewals, backend: &Backend, epoch: Instant) {
    // The end of the current nap (see below). A look during it that finds
    // nothing held goes back to it rather than sizing a new one: a wake-up
    // by a lease added and released meanwhile (its notification can also
    // arrive after the look that saw it) would otherwise find no lease seen
    // since the last look and sleep until the next acquire wakes it again.
    let mut nap_until: Option<Instant> = None;
    loop {
        let added = renewals.added.notified();
        // Leases added from here until the store below wake the task (their
        // notification waits in `added`), so none is missed.
        renewals.wake_at.store(u64::MAX, Ordering::SeqCst);
        let (due, next) = renewals.due(Instant::now());
        if due.is_empty() {
            // Nothing held: nap for the shortest interval of the leases seen
            // since the last look (see `recent_interval`), so that acquiring
            // during the nap does not wake the task. When none was seen, the
            // manager is idle: sleep until a lease comes.
            let next = next.or_else(|| {
                let now = Instant::now();
                if nap_until.is_some_and(|until| until > now) {
                    return nap_until;
                }
                let interval = renewals.recent_interval.swap(u64::MAX, Ordering::Relaxed);
                nap_until = (interval != u64::MAX)
                    .then(|| now.checked_add(Duration::from_nanos(interval)))
                    .flatten();
                nap_until
            });
            let wake_at = next.map_or(u64::MAX, |at| {
                u64::try_from(at.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
            });
            renewals.wake_at.store(wake_at, Ordering::SeqCst);
            match next {
                Some(at) => {
                    tokio::select! {
                        _ = added => {}
                        _ = tokio::time::sleep_until(at.into()) => {}
                    }
                }
                None => added.await,
            }
            renewals.wakeups.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        for batch in due.chunks(BATCH) {
            #[cfg(feature = "testing")]
            let started = Instant::now();
            renew_batch(backend, batch).await;
            #[cfg(feature = "testing")]
            renewals.record_batch(batch.len(), started.elapsed());
        }
    }
}

async fn renew_batch(backend: &Backend, batch: &[Arc<Lease>]) {
    let due: Vec<Instant> = batch.iter().map(|lease| lease.next_renewal()).collect();
    // Read before the backend reads them to send: an `extend` meanwhile
    // must not lend this renewal its new length (see `Lease::renewed`).
    let lengths: Vec<u64> = batch.iter().map(|lease| lease.lease_ms()).collect();
    let outcomes = backend.renew(batch, LeaseEnd::AtLeastALease).await;
    let mut rekeep = Vec::new();
    let mut lost = Vec::new();
    for (((lease, outcome), due), sent) in batch.iter().zip(outcomes).zip(due).zip(lengths) {
        match outcome {
            Renewal::Renewed { sent_at } => {
                crate::telemetry::renewal_lag(|| sent_at.saturating_duration_since(due));
                let late_by = sent_at.saturating_duration_since(due);
                if late_by > lease.duration() / 10 {
                    lease.report_trouble(RenewalTrouble::Late {
                        late_by,
                        remaining: lease.valid_until().saturating_duration_since(sent_at),
                    });
                }
                lease.renewed(sent_at, sent);
                // Released while this renewal was in flight: with a `min_hold`
                // the release kept the lock (still ours) for what was left of
                // it, so the renewal may have run after it and lengthened the
                // TTL to a whole lease. Release again (a second keep is
                // harmless if it ran before). Not a
                // lease handed over to a ticket: the hold is the ticket's.
                if lease.is_released_by_itself() && lease.min_hold_until().is_some() {
                    rekeep.push(lease);
                }
            }
            Renewal::NotOurs => {
                if lease.mark_lost("the renewal found the lock gone or held by another owner")
                    && !lease.keys.events.is_empty()
                {
                    lost.push(lease);
                }
            }
            Renewal::Failed(error) => renewal_failed(lease, &error),
            Renewal::Retry => lease.retry_renewal_at(Instant::now()),
        }
    }
    // Told to `events` subscribers after the fact: the lock's own events (a
    // force-unlock, an expiry, the next holder's grant) came first.
    for lease in lost {
        let message = format!("lost {}", lease.fencing_token());
        if let Err(e) = backend
            .publish_lock_event(&lease.key, &lease.keys, &message)
            .await
        {
            tracing::debug!(target: "distlock::renewal",
                key = %KeyPreview(&lease.key), error = %e.error,
                "could not publish the lost event"
            );
        }
    }
    for lease in rekeep {
        let outcome = backend
            .release(
                &lease.key,
                &lease.keys,
                &lease.owner,
                lease.keep_ms(),
                ExpectedWaiters::Unknown,
            )
            .await;
        tracing::debug!(target: "distlock::release",
            key = %KeyPreview(&lease.key),
            ok = outcome.is_ok(),
            "released again after a renewal that crossed a min_hold release"
        );
    }
}

/// Keeps the lease and tries again soon: sooner than a full interval, so that a
/// short outage does not cost the lease, and within half of what is left of
/// it, so that a store back before the lease ends is tried before then (a
/// third of the interval, a ninth of the lease, can be more than is left).
fn renewal_failed(lease: &Lease, error: &str) {
    let retry = (lease.renewal_interval() / 3)
        .min(lease.remaining() / 2)
        .max(Duration::from_millis(5));
    lease.retry_renewal_at(Instant::now() + retry);
    lease.report_trouble(RenewalTrouble::Failed {
        error: error.to_owned(),
        remaining: lease.remaining(),
    });
    tracing::warn!(target: "distlock::renewal",
        key = %KeyPreview(&lease.key),
        error,
        retry_in_ms = retry.as_millis() as u64,
        remaining_ms = lease.remaining().as_millis() as u64,
        "lease renewal failed; retrying"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::NewLease;
    use crate::options::Hold;

    fn lease(id: u64, epoch: Instant, sent_at: Instant) -> Arc<Lease> {
        Arc::new(Lease::new(NewLease {
            id,
            manager_id: 1,
            key: format!("k{id}"),
            keys: crate::keys::RedisNames::new("p:", &format!("k{id}")),
            owner: "o".repeat(32),
            fencing_token: 0,
            hold: Hold {
                lease: Duration::from_secs(30),
                wait: Duration::ZERO,
                renew: true,
                max_hold: None,
                min_hold: None,
                metrics_label: None,
                eager_fencing: false,
                backoff: crate::Backoff::default(),
                reentrant: true,
            },
            epoch,
            sent_at,
            acquired_at: sent_at,
            waited: true,
        }))
    }

    #[test]
    fn a_renewal_is_trusted_for_the_length_it_carried_not_one_set_after_it_was_read() {
        let epoch = Instant::now();
        let sent_at = epoch + Duration::from_secs(1);
        let held = lease(1, epoch, epoch);
        // The renewal task reads the 30 s length; an `extend` to 600 s comes
        // before the renewal goes out, which then sets 30 s in the store.
        let carried = held.lease_ms();
        held.set_lease(Duration::from_secs(600));
        held.renewed(sent_at, carried);
        assert!(
            held.valid_until() <= sent_at + Duration::from_secs(30),
            "trusted past the 30 s the store was given"
        );
        // The extend's own renewal, confirmed, carries the new length.
        held.extended(sent_at, 600_000);
        assert!(held.valid_until() > sent_at + Duration::from_secs(500));
        // A renewal carrying 600 s after the length came down to 30 s is
        // trusted for 30 s: the store may already have run the shorter one.
        let shortened = lease(2, epoch, epoch);
        shortened.set_lease(Duration::from_secs(600));
        let carried = shortened.lease_ms();
        shortened.set_lease(Duration::from_secs(30));
        shortened.extended(sent_at, carried);
        assert!(shortened.valid_until() <= sent_at + Duration::from_secs(30));
    }

    fn due_ids(renewals: &Renewals, at: Instant) -> Vec<u64> {
        let mut ids: Vec<u64> = renewals.due(at).0.iter().map(|l| l.id).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn a_lease_is_renewed_up_to_a_quarter_of_its_period_early_and_a_handed_off_one_not_at_once() {
        let epoch = Instant::now();
        let now = epoch + Duration::from_secs(1);
        let renewals = Renewals::default();
        // Acquired: a 30 s lease is due 10 s on, and may go 2.5 s early.
        renewals.insert(lease(1, epoch, now));
        // Handed over with a TTL of 3 s (the queue lease): due 1 s on, and
        // may go 0.25 s early; measured on the 10 s interval it would be due
        // at once, a statement queued before the new holder's first.
        let handed = lease(2, epoch, now);
        handed.handed_off(now, Duration::from_secs(3));
        renewals.insert(handed);
        let ms = Duration::from_millis;
        assert_eq!(due_ids(&renewals, now), Vec::<u64>::new());
        let (_, next) = renewals.due(now);
        assert_eq!(next, Some(now + ms(1000)));
        assert_eq!(due_ids(&renewals, now + ms(740)), Vec::<u64>::new());
        assert_eq!(due_ids(&renewals, now + ms(760)), vec![2]);
        assert_eq!(due_ids(&renewals, now + ms(7_490)), vec![2]);
        assert_eq!(due_ids(&renewals, now + ms(7_510)), vec![1, 2]);
    }

    /// What tells a guard's release from the shutdown's: under the map's
    /// lock, whichever takes a lease out first has it; the other learns that
    /// it did not (see `release::end_holds`).
    #[test]
    fn a_lease_is_taken_out_once_by_a_release_or_by_the_shutdown() {
        let epoch = Instant::now();
        let renewals = Renewals::default();
        renewals.insert(lease(1, epoch, epoch));
        renewals.insert(lease(2, epoch, epoch));
        // Released first: the shutdown no longer sees it.
        assert!(renewals.remove(1));
        let closed: Vec<u64> = renewals.close().iter().map(|l| l.id).collect();
        assert_eq!(closed, vec![2]);
        // Taken by the shutdown: the release learns it was not in.
        assert!(!renewals.remove(2));
        // Closed: nothing is added any more.
        assert!(!renewals.insert(lease(3, epoch, epoch)));
        assert!(!renewals.remove(3));
    }

    /// `extend` to a shorter lease moves the renewal task's next look
    /// forward: `rescheduled` wakes the task when the lease is now due
    /// before the time it planned to look.
    #[test]
    fn a_shortened_lease_wakes_the_renewal_task_when_due_sooner() {
        let epoch = Instant::now();
        let renewals = Renewals::default();
        // The task planned to look when the 30 s lease is due, 10 s on (so
        // that adding the lease does not wake it either).
        let planned = u64::try_from(Duration::from_secs(10).as_nanos()).unwrap();
        renewals.wake_at.store(planned, Ordering::SeqCst);
        let l = lease(1, epoch, epoch);
        renewals.insert(l.clone());
        let woken = renewals.added.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        // Not shorter: no wake-up.
        renewals.rescheduled(&l);
        assert!(futures_util::FutureExt::now_or_never(woken.as_mut()).is_none());
        l.set_lease(Duration::from_millis(600));
        l.shorten_to_new_length(epoch);
        assert_eq!(l.next_renewal(), epoch + Duration::from_millis(200));
        renewals.rescheduled(&l);
        assert!(futures_util::FutureExt::now_or_never(woken.as_mut()).is_some());
    }
}
