//! The bounded buffer between a pub/sub task and the reader of a stream
//! (`events`, `leader`): a push never waits and never grows the buffer past
//! its capacity, so a reader that stopped reading costs at most `capacity`
//! items and never stalls the task that reads the subscription.
//!
//! On overflow the buffer either keeps the oldest items and counts the ones it
//! dropped ([`Sender::push_or_skip`], which the reader then learns as
//! [`Popped::Skipped`] in their place), or drops everything buffered for the
//! newest item and keeps only the newest until the reader takes it
//! ([`Sender::push_or_replace`], for items that each carry the whole state,
//! so that a slow reader catches up with the current one at once).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

/// A new buffer holding at most `capacity` items (at least one).
pub(crate) fn bounded<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            skipped: 0,
            capacity: capacity.max(1),
            senders: 1,
            coalescing: false,
            receiver_gone: false,
            waker: None,
        }),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

struct Shared<T> {
    state: Mutex<State<T>>,
}

impl<T> Shared<T> {
    fn state(&self) -> MutexGuard<'_, State<T>> {
        // The state stays consistent at every step, so a panic elsewhere
        // while it was locked leaves nothing to repair.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct State<T> {
    /// Each item with the number of items dropped just before it, and
    /// whether it is a marker (`push_keeping`'s), which is no item of the
    /// stream: one dropped for a newer marker is not counted.
    queue: VecDeque<(u64, bool, T)>,
    /// Items dropped since the last one queued.
    skipped: u64,
    capacity: usize,
    senders: usize,
    /// The buffer overflowed under `push_or_replace` and the reader has not
    /// read since: it holds only the newest item.
    coalescing: bool,
    receiver_gone: bool,
    waker: Option<Waker>,
}

impl<T> State<T> {
    fn wake(&mut self) {
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }
}

/// The reader is gone: nothing pushed will be read.
#[derive(Debug)]
pub(crate) struct Closed;

/// The writing side; clone it for each task that writes.
pub(crate) struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    /// Queues `item`, or drops it and counts it when the buffer is full.
    pub(crate) fn push_or_skip(&self, item: T) -> Result<(), Closed> {
        let mut state = self.shared.state();
        if state.receiver_gone {
            return Err(Closed);
        }
        if state.queue.len() < state.capacity {
            let skipped = std::mem::take(&mut state.skipped);
            state.queue.push_back((skipped, false, item));
        } else {
            state.skipped += 1;
        }
        state.wake();
        Ok(())
    }

    /// Queues `item`, which must not be lost: when the buffer is full, the
    /// newest item queued is dropped (and counted) to make room. For a
    /// marker the reader must see where it happened (the events stream's
    /// "messages may have been lost"), which `push_or_skip` would turn into
    /// one more skipped item.
    pub(crate) fn push_keeping(&self, item: T) -> Result<(), Closed> {
        let mut state = self.shared.state();
        if state.receiver_gone {
            return Err(Closed);
        }
        if state.queue.len() >= state.capacity {
            if let Some((before, marker, _dropped)) = state.queue.pop_back() {
                state.skipped += before + u64::from(!marker);
            }
        }
        let skipped = std::mem::take(&mut state.skipped);
        state.queue.push_back((skipped, true, item));
        state.wake();
        Ok(())
    }

    /// Queues `item`; when the buffer is full, drops everything buffered
    /// first, and until the reader reads, each later item replaces this one:
    /// the reader's next item is the newest.
    pub(crate) fn push_or_replace(&self, item: T) -> Result<(), Closed> {
        let mut state = self.shared.state();
        if state.receiver_gone {
            return Err(Closed);
        }
        if state.coalescing || state.queue.len() >= state.capacity {
            state.queue.clear();
            state.skipped = 0;
            state.coalescing = true;
        }
        state.queue.push_back((0, false, item));
        state.wake();
        Ok(())
    }

    /// Whether the reader is gone.
    #[cfg(test)]
    pub(crate) fn is_closed(&self) -> bool {
        self.shared.state().receiver_gone
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.state().senders += 1;
        Sender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        state.senders -= 1;
        if state.senders == 0 {
            state.wake();
        }
    }
}

/// What the reader gets next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Popped<T> {
    Item(T),
    /// This many items were dropped here, the buffer being full.
    Skipped(u64),
}

/// The reading side.
pub(crate) struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Receiver<T> {
    /// The next item in order (a skip count where items were dropped), or
    /// `None` once every sender is gone and the buffer is empty.
    pub(crate) fn poll_pop(&mut self, cx: &mut Context<'_>) -> Poll<Option<Popped<T>>> {
        let mut state = self.shared.state();
        if let Some((skipped, _, _)) = state.queue.front_mut() {
            if *skipped > 0 {
                return Poll::Ready(Some(Popped::Skipped(std::mem::take(skipped))));
            }
        }
        if let Some((_, _, item)) = state.queue.pop_front() {
            state.coalescing = false;
            return Poll::Ready(Some(Popped::Item(item)));
        }
        if state.skipped > 0 {
            return Poll::Ready(Some(Popped::Skipped(std::mem::take(&mut state.skipped))));
        }
        if state.senders == 0 {
            return Poll::Ready(None);
        }
        state.waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// The next item, as [`poll_pop`](Self::poll_pop).
    pub(crate) async fn pop(&mut self) -> Option<Popped<T>> {
        std::future::poll_fn(|cx| self.poll_pop(cx)).await
    }

    /// How many items are buffered now (never more than the capacity).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shared.state().queue.len()
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        state.receiver_gone = true;
        // Nobody reads them: free them now, not when the last sender goes.
        state.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pop<T>(receiver: &mut Receiver<T>) -> Poll<Option<Popped<T>>> {
        receiver.poll_pop(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn a_full_buffer_drops_the_newest_and_the_reader_learns_how_many_in_their_place() {
        let (sender, mut receiver) = bounded(3);
        for item in 0..10 {
            sender.push_or_skip(item).unwrap();
            assert!(receiver.len() <= 3);
        }
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Item(0))));
        // Room for one: the skip count rides on the item queued after it.
        sender.push_or_skip(10).unwrap();
        sender.push_or_skip(11).unwrap();
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Item(1))));
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Item(2))));
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Skipped(7))));
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Item(10))));
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Skipped(1))));
        assert_eq!(pop(&mut receiver), Poll::Pending);
        drop(sender);
        assert_eq!(pop(&mut receiver), Poll::Ready(None));
    }

    #[test]
    fn an_item_that_must_be_kept_takes_the_newest_ones_place_in_a_full_buffer() {
        let (sender, mut receiver) = bounded(2);
        for item in 0..5 {
            sender.push_or_skip(item).unwrap();
        }
        // 0 and 1 queued, 2..4 skipped after 1: the kept item takes 1's place
        // and counts it with them.
        sender.push_keeping(99).unwrap();
        assert_eq!(receiver.len(), 2);
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Item(0))));
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Skipped(4))));
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Item(99))));
        assert_eq!(pop(&mut receiver), Poll::Pending);
        // With room, it queues as any item.
        sender.push_keeping(100).unwrap();
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Item(100))));
    }

    #[test]
    fn a_full_buffer_is_replaced_by_the_newest_item_until_the_reader_reads() {
        let (sender, mut receiver) = bounded(3);
        for item in 0..10 {
            sender.push_or_replace(item).unwrap();
            assert!(receiver.len() <= 3);
        }
        // 0, 1, 2 filled it; 3 replaced them; each later one replaced the last.
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Item(9))));
        assert_eq!(pop(&mut receiver), Poll::Pending);
        // Read: items queue again.
        sender.push_or_replace(10).unwrap();
        sender.push_or_replace(11).unwrap();
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Item(10))));
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Item(11))));
    }

    #[test]
    fn a_sender_learns_that_the_reader_is_gone() {
        let (sender, receiver) = bounded::<u8>(1);
        assert!(!sender.is_closed());
        drop(receiver);
        assert!(sender.is_closed());
        assert!(sender.push_or_skip(1).is_err());
        assert!(sender.push_keeping(1).is_err());
        assert!(sender.push_or_replace(1).is_err());
    }

    /// A marker that takes the place of an earlier marker in a full buffer
    /// counts no item lost for it: only the events dropped are counted.
    #[test]
    fn a_marker_replacing_a_marker_counts_only_the_items_lost() {
        let (sender, mut receiver) = bounded(1);
        sender.push_or_skip(1).unwrap();
        sender.push_keeping(100).unwrap();
        sender.push_keeping(101).unwrap();
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Skipped(1))));
        assert_eq!(pop(&mut receiver), Poll::Ready(Some(Popped::Item(101))));
        assert_eq!(pop(&mut receiver), Poll::Pending);
    }
}
