//! `HoldTicket`: a hold handed from one process to another (an HTTP handler
//! takes the lock, a worker finishes the job and releases it).
//!
//! A ticket is the hold's owner token, the one secret that Redis checks
//! before it renews or deletes a lock. It leaves a guard only on purpose
//! ([`LockGuard::into_ticket`]), goes out as a string only on purpose
//! ([`HoldTicket::to_secret_string`]), and its `Debug` hides the token.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{ExpectedWaiters, LeaseEnd, Renewal};
use crate::config;
use crate::error::{BackendError, BackendErrorKind, KeyPreview, LockError};
use crate::guard::LockGuard;
use crate::keys::{self, LockKind};
use crate::lease::{Lease, NewLease};
use crate::manager::LockManager;
use crate::options::Hold;

/// What a secret string starts with: the format's version, so that a later
/// format can still read (or plainly refuse) this one.
const MAGIC: &str = "dlh1";

/// A single-key hold taken out of its guard, to be resumed or released by
/// another guard, task or process: the lock stays held in Redis, and
/// whoever has the ticket acts as its owner.
///
/// **Whoever has a ticket (or its secret string) can renew and release the
/// hold, and take over its fencing token:** treat it as a credential. Send
/// it only over channels you would send a password over, do not log it
/// (its `Debug` shows the key and kind, never the owner token), and keep
/// it no longer than the hold. It is not `Serialize`: it leaves the
/// process only through [`to_secret_string`](Self::to_secret_string).
///
/// From [`LockGuard::into_ticket`]; used by [`LockManager::resume`] (a
/// guard again, renewed) and [`LockManager::release_ticket`] (released
/// without a guard). Nobody renews the hold between `into_ticket` and
/// `resume`: it lasts what is left of its lease, so take the lock with a
/// lease that covers the hand-over (a queue's delivery time).
///
/// ```no_run
/// use std::time::Duration;
/// use distlock_runtime::{HoldTicket, LockManager};
///
/// # async fn demo(handler: LockManager, worker: LockManager) -> Result<(), distlock_runtime::LockError> {
/// // In the HTTP handler: take the lock, hand it to the job queue.
/// let guard = handler.lock("export:7").lease(Duration::from_secs(60)).acquire().await?;
/// let ticket = guard.into_ticket().expect("not shared by re-entrant guards");
/// let secret: String = ticket.to_secret_string(); // into the job, like a password
///
/// // In the worker (another process): the same hold, renewed again.
/// let ticket = HoldTicket::from_secret_string(&secret)?;
/// let guard = worker.resume(&ticket).await?;
/// // ... the job, with guard.lost() and guard.fencing_token() as usual ...
/// guard.release().await
/// # }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct HoldTicket {
    key: String,
    kind: LockKind,
    owner: String,
    lease: Duration,
    renew: bool,
    /// 0 when the hold had no token yet.
    fencing_token: u64,
}

impl std::fmt::Debug for HoldTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldTicket")
            .field("key", &self.key)
            .field("kind", &self.kind)
            .field("owner", &"<redacted>")
            .field("lease", &self.lease)
            .field("renew", &self.renew)
            .finish()
    }
}

impl HoldTicket {
    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lease of the hold, which [`LockManager::resume`] sets again.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The ticket as a string, to send to the process that resumes or
    /// releases the hold: it contains the owner token, so whoever reads it
    /// can renew and release the hold. ASCII, without spaces or quotes.
    pub fn to_secret_string(&self) -> String {
        let kind = match self.kind {
            LockKind::Exclusive => "l".to_owned(),
            LockKind::Write => "w".to_owned(),
            LockKind::Read => "r".to_owned(),
            LockKind::Permit { permits } => format!("s{permits}"),
        };
        format!(
            "{MAGIC}.{kind}.{}.{}.{}.{}.{}",
            self.lease.as_millis(),
            u8::from(self.renew),
            self.fencing_token,
            hex(&self.owner),
            hex(&self.key),
        )
    }

    /// Reads a ticket written by [`to_secret_string`](Self::to_secret_string).
    /// No round trip: whether the hold is still there is found by
    /// [`LockManager::resume`] or [`LockManager::release_ticket`].
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] when `secret` is not a ticket (the
    /// message does not repeat it).
    pub fn from_secret_string(secret: &str) -> Result<HoldTicket, LockError> {
        let ticket = parse(secret).ok_or_else(|| {
            LockError::InvalidConfig(format!(
                "not a distlock hold ticket ({} characters; a ticket starts with \"{MAGIC}.\")",
                secret.len()
            ))
        })?;
        // A lease no guard can have (a damaged or forged ticket): resumed,
        // its renewal would set the lock's TTL to it, and a lease of 0 ms
        // deletes the lock.
        crate::config::validate_lease(ticket.lease, "the hold ticket's lease")?;
        Ok(ticket)
    }
}

fn parse(secret: &str) -> Option<HoldTicket> {
    let mut parts = secret.split('.');
    if parts.next()? != MAGIC {
        return None;
    }
    let kind = match parts.next()? {
        "l" => LockKind::Exclusive,
        "w" => LockKind::Write,
        "r" => LockKind::Read,
        s => LockKind::Permit {
            permits: s.strip_prefix('s')?.parse().ok().filter(|&p| p > 0)?,
        },
    };
    let lease = Duration::from_millis(parts.next()?.parse().ok()?);
    let renew = match parts.next()? {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    let fencing_token: u64 = parts.next()?.parse().ok()?;
    let owner = unhex(parts.next()?)?;
    let key = unhex(parts.next()?)?;
    if parts.next().is_some() || !is_owner_token(&owner, kind) {
        return None;
    }
    // A shared hold takes its token with its acquisition: one without could
    // only be forged (and its first `fencing_token()` would run the lock's
    // script on the holders' set).
    if matches!(kind, LockKind::Read | LockKind::Permit { .. }) && fencing_token == 0 {
        return None;
    }
    Some(HoldTicket {
        key,
        kind,
        owner,
        lease,
        renew,
        fencing_token,
    })
}

/// Whether `owner` has the shape of an owner token of a hold of `kind`: 32
/// hex digits, and for a semaphore hold perhaps `:<weight>`. The scripts
/// match owners by prefix (a lock's value starts with its owner token), so a
/// forged short owner such as `0` would match every hold whose token starts
/// with it.
fn is_owner_token(owner: &str, kind: LockKind) -> bool {
    let (token, weight) = match owner.split_once(':') {
        Some((token, weight)) => (token, Some(weight)),
        None => (owner, None),
    };
    let weight_ok = match (weight, kind) {
        (None, _) => true,
        (Some(w), LockKind::Permit { .. }) => {
            w.bytes().all(|b| b.is_ascii_digit())
                && !w.starts_with('0')
                && w.parse::<u32>().is_ok_and(|w| w > 1)
        }
        (Some(_), _) => false,
    };
    token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit()) && weight_ok
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

impl LockGuard {
    /// Takes the hold out of this guard as a [`HoldTicket`], for another
    /// process (or task) to [resume](LockManager::resume) or
    /// [release](LockManager::release_ticket). No round trip: the lock stays
    /// held in Redis, this manager stops renewing it, and the hold lasts
    /// what is left of its lease until someone resumes it. (A hold just
    /// handed over by a queue, whose first renewal has not come yet, has
    /// only the hand-off's few seconds in the store: this manager sends
    /// that renewal in the background, which gives it a whole lease.) This guard's lost signal ends with
    /// it; the resumed guard has its own.
    ///
    /// Whoever has the ticket owns the hold: see [`HoldTicket`].
    ///
    /// # Errors
    /// The guard back, unchanged, when re-entrant guards of the call chain
    /// share its hold (they would lose it under them): release those first;
    /// or when the manager has shut down, which released the hold (the
    /// guard reports it lost).
    pub fn into_ticket(self) -> Result<HoldTicket, LockGuard> {
        // The hold taken from the lease at once, so that no re-entrant
        // acquisition joins it from now on (it would keep a guard on a hold
        // that is the ticket's, and release it under the ticket's owner).
        let handle = self.lease_handle();
        if !handle.take_sole_hold() {
            return Err(self);
        }
        let core = self.core().clone();
        // Out of the renewal map before it is marked handed over: a
        // shutdown that took it first has released it (the guard then
        // reports it lost to the shutdown), and one after cannot.
        if !core.renewals.remove(handle.id) {
            handle.restore_sole_hold();
            return Err(self);
        }
        let lease = self.into_lease();
        // Read while still held (a lease handed over has none left). A hold
        // a queue handed over has only the hand-off's TTL in the store (the
        // queue lease at most) until its first renewal, about a second after
        // the grant; renewed, a lease has at least two thirds of its length
        // left. (Without renewal, the lock ends with its lease whatever is
        // left.)
        let short = lease.renew && lease.remaining() < lease.duration() / 2;
        lease.mark_handed_over();
        if short {
            // The renewal this manager would have sent, so that the ticket's
            // hold lasts what is left of its lease rather than of the
            // hand-off: in the background (no round trip here). It renews
            // only while the ticket's owner holds the lock.
            let (core, lease) = (core.clone(), lease.clone());
            core.runtime.clone().spawn(async move {
                let renew_once = || async {
                    core.backend
                        .renew(std::slice::from_ref(&lease), LeaseEnd::AtLeastALease)
                        .await
                        .pop()
                };
                let mut renewed = renew_once().await;
                if matches!(renewed, Some(Renewal::Retry)) {
                    // The cause is fixed (a script reloaded, a slot map
                    // refreshed, a new master found): once more, as `resume`.
                    renewed = renew_once().await;
                }
                tracing::debug!(target: "distlock::renewal",
                    key = %KeyPreview(&lease.key),
                    renewed = matches!(renewed, Some(Renewal::Renewed { .. })),
                    "renewed a ticket's hold once, as it left the manager"
                );
            });
        }
        // A "waited for" notice for this owner stays with the manager that
        // heard it; the resumed guard's release hands the lock over anyway.
        core.subscriber.take_waited_for(&lease.owner);
        crate::telemetry::released(lease.metrics_label, || lease.granted_at.elapsed());
        Ok(HoldTicket {
            key: lease.key.clone(),
            kind: lease.keys.kind,
            owner: lease.owner.clone(),
            lease: lease.duration(),
            renew: lease.renew,
            fencing_token: lease.fencing_token(),
        })
    }
}

impl LockManager {
    /// Makes `ticket`'s hold a guard of this manager again: one round trip
    /// (the renewal script, which checks that the ticket's owner still holds
    /// the lock and sets its TTL to at least the ticket's lease). The guard then is
    /// like the one that took the lock: renewed while it lives (if that one
    /// was), its lease lost when a renewal finds the lock gone or taken
    /// over, its fencing token the same (issued on demand if the hold had
    /// none), released on every exit.
    ///
    /// It is not the hold of any call chain until [`LockGuard::scope`]. It
    /// keeps no `max_hold`, `min_hold` or metrics label of the original
    /// request. Use a manager with the same key prefix as the one that took
    /// the lock (another prefix names other Redis keys: the hold is not
    /// found). A ticket resumed twice gives two guards of one hold: the
    /// first released frees it, and the other learns it as a loss.
    ///
    /// # Errors
    /// [`LockError::Lost`] when the hold is gone (its lease ran out, it was
    /// released or force-unlocked), [`LockError::ShutDown`] after
    /// [`shutdown`](Self::shutdown) (also when the shutdown began while the
    /// call was out: the hold is then left as it was, for the ticket's next
    /// `resume`), [`LockError::InvalidKey`] for a bad key,
    /// [`LockError::Backend`] when Redis fails.
    pub async fn resume(&self, ticket: &HoldTicket) -> Result<LockGuard, LockError> {
        keys::validate_key(&ticket.key)?;
        let core = &self.inner.core;
        if core.is_shut_down() {
            return Err(LockError::ShutDown {
                key: ticket.key.clone(),
            });
        }
        let started = Instant::now();
        let new_lease = |sent_at: Instant| NewLease {
            id: config::next_id(),
            manager_id: core.id,
            key: ticket.key.clone(),
            keys: core.keys_of(&ticket.key, ticket.kind),
            owner: ticket.owner.clone(),
            fencing_token: ticket.fencing_token,
            // The options a ticket carries; the rest (`max_hold`, `min_hold`,
            // the metrics label) stayed with the guard it came from.
            hold: Hold {
                lease: ticket.lease,
                wait: Duration::ZERO,
                renew: ticket.renew,
                max_hold: None,
                min_hold: None,
                metrics_label: None,
                eager_fencing: false,
                backoff: core.config.backoff,
                reentrant: true,
            },
            epoch: core.epoch,
            sent_at,
            acquired_at: Instant::now(),
            // Someone may have queued behind the hold, and told the manager
            // that took it, not this one: the full release, which hands the
            // lock over in the same round trip.
            waited: true,
        };
        let probe = [Arc::new(Lease::new(new_lease(started)))];
        let mut outcome = core
            .backend
            .renew(&probe, LeaseEnd::AtLeastALease)
            .await
            .pop();
        if matches!(outcome, Some(Renewal::Retry)) {
            // The cause is fixed (a script reloaded, a slot map refreshed).
            outcome = core
                .backend
                .renew(&probe, LeaseEnd::AtLeastALease)
                .await
                .pop();
        }
        let backend_error = |message: String| LockError::Backend {
            key: ticket.key.clone(),
            source: BackendError::new(BackendErrorKind::Other, message),
        };
        match outcome {
            Some(Renewal::Renewed { sent_at }) => {
                let lease = crate::guard::grant(core, new_lease(sent_at), started, None, true)?;
                tracing::debug!(target: "distlock::acquire",
                    key = %KeyPreview(&ticket.key),
                    "resumed a hold from its ticket"
                );
                Ok(LockGuard::new(self.inner.clone(), lease))
            }
            Some(Renewal::NotOurs) => Err(LockError::Lost {
                key: ticket.key.clone(),
            }),
            Some(Renewal::Failed(reason)) => Err(LockError::Backend {
                key: ticket.key.clone(),
                source: BackendError::new(
                    BackendErrorKind::Connection,
                    format!("resume failed: {reason}"),
                ),
            }),
            Some(Renewal::Retry) | None => Err(backend_error(
                "resume failed: Redis asked twice in a row to retry the renewal".to_owned(),
            )),
        }
    }

    /// Releases `ticket`'s hold without making a guard of it: one round
    /// trip, the release script a guard runs (it deletes the lock, or hands
    /// it to the head of its queue, and wakes waiters), by the ticket's
    /// owner token. Returns whether the hold was still there; `false` means
    /// it was gone already (lease run out, released, force-unlocked), which
    /// is no error here.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for a bad key, [`LockError::Backend`] when
    /// Redis fails (the hold then ends with its lease).
    pub async fn release_ticket(&self, ticket: &HoldTicket) -> Result<bool, LockError> {
        keys::validate_key(&ticket.key)?;
        let core = &self.inner.core;
        let names = core.keys_of(&ticket.key, ticket.kind);
        core.backend
            .release(
                &ticket.key,
                &names,
                &ticket.owner,
                0,
                ExpectedWaiters::Unknown,
            )
            .await
            .map_err(|e| e.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(key: &str, kind: LockKind) -> HoldTicket {
        let owner = match kind {
            LockKind::Permit { .. } => "0123456789abcdef0123456789abcdef:3",
            _ => "0123456789abcdef0123456789abcdef",
        };
        HoldTicket {
            key: key.to_owned(),
            kind,
            owner: owner.to_owned(),
            lease: Duration::from_millis(1500),
            renew: true,
            fencing_token: 42,
        }
    }

    #[test]
    fn a_ticket_reads_back_what_it_wrote_for_every_kind_and_key() {
        for kind in [
            LockKind::Exclusive,
            LockKind::Write,
            LockKind::Read,
            LockKind::Permit { permits: 7 },
        ] {
            for key in ["order:42", "", "a.b c\"d", "clé:日本"] {
                let t = ticket(key, kind);
                let secret = t.to_secret_string();
                assert!(
                    secret.is_ascii() && !secret.contains([' ', '"']),
                    "{secret}"
                );
                assert_eq!(HoldTicket::from_secret_string(&secret).unwrap(), t);
            }
        }
    }

    /// The scripts match owners by prefix: a forged ticket whose owner is
    /// short (`0`) would have renewed, released or resumed any hold whose
    /// token starts with it. So would a shared hold without a token.
    #[test]
    fn a_ticket_with_a_forged_owner_or_token_is_refused() {
        let with = |kind: LockKind, owner: &str, token: u64| {
            let mut t = ticket("k", kind);
            t.owner = owner.to_owned();
            t.fencing_token = token;
            HoldTicket::from_secret_string(&t.to_secret_string())
        };
        let lock = LockKind::Exclusive;
        let permits = LockKind::Permit { permits: 4 };
        let good = "0123456789abcdef0123456789ABCDEF";
        assert!(with(lock, good, 0).is_ok());
        assert!(with(permits, &format!("{good}:2"), 9).is_ok());
        for (kind, owner, token) in [
            (lock, "0", 1),
            (lock, "", 1),
            (lock, &good[..31], 1),
            (lock, &format!("{good}0"), 1),
            (lock, &format!("{}g", &good[..31]), 1),
            (lock, &format!("{good}:2"), 1),
            (permits, &format!("{good}:"), 9),
            (permits, &format!("{good}:1"), 9),
            (permits, &format!("{good}:02"), 9),
            (permits, &format!("{good}:x"), 9),
            (permits, &format!("{good}:+5"), 9),
            (permits, good, 0),
            (LockKind::Read, good, 0),
        ] {
            assert!(
                with(kind, owner, token).is_err(),
                "{kind:?} {owner:?} token {token}"
            );
        }
    }

    #[test]
    fn debug_hides_the_owner_token_and_a_bad_secret_is_not_echoed() {
        let t = ticket("order:42", LockKind::Exclusive);
        let shown = format!("{t:?}");
        assert!(
            shown.contains("order:42") && shown.contains("<redacted>"),
            "{shown}"
        );
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        let secret = t.to_secret_string();
        for bad in [
            "",
            "dlh1",
            "dlh2.l.1500.1.42.00.00",
            &secret[..secret.len() - 1],
            &format!("{secret}.00"),
            &secret.replace(".l.", ".s0."),
            &secret.replace(".1.42.", ".2.42."),
            // Leases no guard has: below 10 ms, above 30 days.
            &secret.replace(".1500.", ".0."),
            &secret.replace(".1500.", ".9."),
            &secret.replace(".1500.", ".2592000001."),
        ] {
            let err = HoldTicket::from_secret_string(bad).unwrap_err();
            assert!(
                matches!(&err, LockError::InvalidConfig(_)),
                "{bad}: {err:?}"
            );
            assert!(!err.to_string().contains(&hex(&t.owner)), "{err}");
        }
    }
}
