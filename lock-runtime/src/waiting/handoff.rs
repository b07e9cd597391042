//! Hand-off routing: a release that hands the default lock to the head of its
//! queue publishes `=<owner>:<fencing token>:<attempt>` on the head's manager's
//! hand-off channel; here the message goes to the one waiter with that owner
//! token, which then holds the lock without another round trip.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// Queued waiters of this manager expecting a hand-off, by owner token.
#[derive(Default)]
pub(crate) struct Handoffs {
    handoffs: Mutex<HashMap<String, Arc<HandoffSlot>>>,
}

/// Where a hand-off addressed to one queued waiter is left for it.
#[derive(Default)]
struct HandoffSlot {
    /// The hand-off, until the waiter takes it.
    heard: Mutex<Option<HandedOff>>,
    /// The last hand-off heard, taken or not: on a cluster each master's
    /// listening connection hears every message, so one hand-off arrives
    /// once per master and is delivered (and counted) once.
    last: Mutex<Option<HandedOff>>,
    notify: Notify,
}

/// A hand-off as its message told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandedOff {
    /// The fencing token it issued (0: none).
    pub(crate) fencing_token: u64,
    /// The waiter's attempt whose queue entry it consumed: the lock's TTL
    /// runs from after that attempt was sent.
    pub(crate) attempt: u32,
}

impl Handoffs {
    fn handoffs(&self) -> MutexGuard<'_, HashMap<String, Arc<HandoffSlot>>> {
        self.handoffs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes hand-offs to `owner` (a fair waiter's owner token) reach the
    /// returned [`Handoff`] until it is dropped. The waiter must also be
    /// registered on the lock's channel, which subscribes.
    pub(super) fn expect_handoff(&self, owner: &str) -> Handoff<'_> {
        let slot = Arc::new(HandoffSlot::default());
        self.handoffs().insert(owner.to_owned(), slot.clone());
        Handoff {
            handoffs: self,
            owner: owner.to_owned(),
            slot,
        }
    }

    /// Routes a hand-off message (`<owner>:<token>:<attempt>`, after its `=`)
    /// to the waiter with that owner token, if it is one of ours, counting
    /// it in `delivered`.
    pub(super) fn hand_off(&self, message: &[u8], delivered: &AtomicU64) {
        let Some(handed) = std::str::from_utf8(message).ok().and_then(parse_handoff) else {
            return;
        };
        let (owner, handed) = handed;
        let slot = self.handoffs().get(owner).cloned();
        if let Some(slot) = slot {
            let mut last = slot.last.lock().unwrap_or_else(|e| e.into_inner());
            if *last == Some(handed) {
                return;
            }
            *last = Some(handed);
            *slot.heard.lock().unwrap_or_else(|e| e.into_inner()) = Some(handed);
            delivered.fetch_add(1, Ordering::Relaxed);
            slot.notify.notify_one();
        }
    }
}

/// A queued waiter's expectation of a hand-off; ends when dropped.
pub(crate) struct Handoff<'a> {
    handoffs: &'a Handoffs,
    owner: String,
    slot: Arc<HandoffSlot>,
}

impl Handoff<'_> {
    /// The hand-off to this waiter, once one is heard. Cancel-safe: a
    /// hand-off heard while nobody polls is kept for the next call.
    pub(crate) async fn handed_off(&self) -> HandedOff {
        loop {
            let notified = self.slot.notify.notified();
            if let Some(handed) = self
                .slot
                .heard
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
            {
                return handed;
            }
            notified.await;
        }
    }
}

impl Drop for Handoff<'_> {
    fn drop(&mut self) {
        let mut handoffs = self.handoffs.handoffs();
        if handoffs
            .get(&self.owner)
            .is_some_and(|slot| Arc::ptr_eq(slot, &self.slot))
        {
            handoffs.remove(&self.owner);
        }
    }
}

/// `<owner>:<token>:<attempt>` (a hand-off message after its `=`).
fn parse_handoff(message: &str) -> Option<(&str, HandedOff)> {
    let mut parts = message.rsplitn(3, ':');
    let attempt = parts.next()?.parse().ok()?;
    let fencing_token = parts.next()?.parse().ok()?;
    let owner = parts.next()?;
    Some((
        owner,
        HandedOff {
            fencing_token,
            attempt,
        },
    ))
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    #[test]
    fn hand_off_messages_are_read_whole_or_not_at_all() {
        assert_eq!(
            parse_handoff("0a1b:17:3"),
            Some((
                "0a1b",
                HandedOff {
                    fencing_token: 17,
                    attempt: 3
                }
            ))
        );
        assert_eq!(parse_handoff("0a1b:17"), None);
        assert_eq!(parse_handoff("0a1b:x:3"), None);
    }

    #[test]
    fn one_hand_off_heard_on_every_master_is_delivered_once() {
        let handoffs = Handoffs::default();
        let delivered = AtomicU64::new(0);
        let waiter = handoffs.expect_handoff("0a1b");
        for _ in 0..3 {
            handoffs.hand_off(b"0a1b:17:3", &delivered);
        }
        assert_eq!(delivered.load(Ordering::Relaxed), 1);
        let handed = waiter.handed_off().now_or_never();
        assert_eq!(handed.map(|h| h.fencing_token), Some(17));
        // Taken: a late copy of the same message is not a second hand-off.
        handoffs.hand_off(b"0a1b:17:3", &delivered);
        assert!(waiter.handed_off().now_or_never().is_none());
        // A later hand-off (another attempt) is.
        handoffs.hand_off(b"0a1b:18:4", &delivered);
        assert_eq!(delivered.load(Ordering::Relaxed), 2);
        assert_eq!(
            waiter.handed_off().now_or_never().map(|h| h.attempt),
            Some(4)
        );
    }
}
