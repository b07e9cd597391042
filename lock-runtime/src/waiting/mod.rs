//! Waiting for a busy lock: one shared subscriber per manager, and the
//! jittered backoff that covers for a lost wake-up. The subscriber also
//! serves the manager's lock events streams and leader watches, so that a
//! manager holds one listening connection per source whatever listens. One
//! job a file:
//!
//! - `subscriber`: the listener, which hands each message to the part it is
//!   for, and the face the rest of the runtime calls;
//! - `interests`: what events streams and leader watches listen to (a
//!   channel or a pattern) and the bounded sinks their messages go to;
//! - `queues`: the waiter queues, one a channel, and the wake-ups addressed to
//!   each waiter;
//! - `handoff`: hand-offs routed to the one queued waiter each is for;
//! - `waited_for`: the `!` notices that a waiter queued for one of this
//!   manager's holds;
//! - `queued`: how many acquisitions of this manager are queued for each lock;
//! - `backoff`: the timer a waiter sleeps on when no wake-up comes.
//!
//! Waiters register on the lock's channel; the first registration subscribes, the
//! last one leaving unsubscribes. Each wake-up message wakes one waiter of this
//! manager, the one waiting longest, which retries; the others sleep on, since
//! only one of them can win. A waiter keeps its place until it gets the lock or
//! leaves: one whose attempt loses to another manager's waiter is still the one
//! the next wake-up goes to. When the subscription is confirmed, or re-made
//! after a reconnect, every waiter of the channel retries once, because a release
//! may have been published while nobody listened. A wake-up whose payload starts
//! with `*` (a read-write lock's) wakes every waiter of the channel: several
//! readers may enter at once, and a writer must not be passed over. One whose
//! payload is `#<n>:...` (a semaphore's release of n permits) gives the
//! longest waiter n wake-ups, which it passes on as a semaphore waiter passes
//! on the ones it did not need: one message, however many permits came free.
//! A semaphore's release publishes only when a waiter may now fit (the
//! semaphore was full, or a weighted waiter or hold is about), so a waiter
//! that gets a permit also wakes the next when its grant says permits are
//! left free, or when it got in on its timer (leases that ran out
//! unreleased: the next one then learns when the next hold ends); a reader
//! that gets in wakes the next too, since readers share. Only the first in
//! line retries on a timer capped by the holder's lease, so one that leaves
//! the front without the lock wakes the next to take that watch over.
//!
//! The default lock's release hands the lock to the head of its queue in Redis
//! and publishes `=<owner>:<fencing token>` on the one channel of the head's
//! manager (`<prefix>handoff:<route>`, see `Core::handoff_channel`): there the
//! message goes only to the waiter with that owner token (see
//! [`Subscriber::expect_handoff`]), which then holds the lock without another
//! round trip. Other waiters are not woken. The first waiter that queues for
//! a hold of the manager's also sends `!<owner>` there, so that the hold's
//! release hands the lock over at once (see `release::expected_waiters`). That
//! channel is subscribed from the manager's first acquisition of a default
//! lock on (`Core::listen_for_waiters`, [`Subscriber::keep`]), in the
//! background, so that a manager that only holds hears its waiters too, and
//! a wait on a key the manager never waited for subscribes to nothing.

mod backoff;
mod handoff;
mod interests;
mod queued;
mod queues;
mod subscriber;
mod waited_for;

pub(crate) use backoff::BackoffTimer;
pub(crate) use interests::{Interest, Sink, Topic};
pub(crate) use queues::Wake;
pub(crate) use subscriber::{run_subscriber, Subscriber};
