//! Tracing: quiet at info level on the happy path, a warning when a lease is lost,
//! debug events with the acquisition's figures, and the `distlock.acquire` and
//! `distlock.hold` spans side by side in the caller's span.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use distlock::{distributed_lock, LockError, LockManager};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Instrument;
use tracing::{Event, Level, Metadata, Subscriber};

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(Level, String)>>>);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), fields.0));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Capture {
    fn at_least(&self, level: Level) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, _)| *l <= level)
            .map(|(_, s)| s.clone())
            .collect()
    }
}

#[test]
fn happy_path_is_quiet_and_loss_warns() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.clone());
    // current_thread: every task runs on this thread, under the capture.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let redis = server();
        let a = manager(&redis).await;
        let b = manager(&redis).await;
        // 900 ms, renewed every 300 ms: a renewal 200 ms late loses a 300 ms
        // lease on a loaded machine (a warning, and a failed release); 900
        // ms takes one 600 ms late.
        let g = a.lock("k").lease(RENEWED_LEASE).acquire().await.unwrap();
        let waiter =
            tokio::spawn(async move { b.lock("k").wait(Duration::from_secs(5)).acquire().await });
        tokio::time::sleep(Duration::from_millis(700)).await; // a renewal or two
        g.release().await.unwrap();
        waiter.await.unwrap().unwrap().release().await.unwrap();
        assert_eq!(capture.at_least(Level::INFO), Vec::<String>::new());
        let debug = capture.at_least(Level::DEBUG);
        assert!(
            debug.iter().any(|e| e.contains("acquired")
                && e.contains("attempts=")
                && e.contains("fencing_token=")
                && e.contains("waited_ms=")),
            "{debug:#?}"
        );

        // 900 ms too: the grant's reply must come within the lease.
        let g = a.lock("k2").lease(RENEWED_LEASE).acquire().await.unwrap();
        let mut raw = raw(&redis).await;
        del(&mut raw, &a.redis_names("k2").lock).await;
        g.lost().await;
        let warnings = capture.at_least(Level::WARN);
        assert_eq!(warnings.len(), 1, "{warnings:#?}");
        assert!(
            warnings[0].contains("lease lost") && warnings[0].contains("k2"),
            "{warnings:#?}"
        );
    });
}

#[test]
fn an_env_filter_of_distlock_debug_sees_the_acquired_event() {
    let text = logged(|| async {
        let redis = server();
        let m = manager(&redis).await;
        m.lock("seen")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    });
    let acquired = text
        .lines()
        .find(|l| l.contains("acquired"))
        .unwrap_or_else(|| panic!("no acquired event under distlock=debug:\n{text}"));
    assert!(acquired.contains("distlock::acquire"), "{acquired}");
    assert!(acquired.contains("fencing_token="), "{acquired}");
    assert!(
        !text.contains("distlock: "),
        "messages carry no \"distlock: \" prefix any more:\n{text}"
    );
}

/// What happened to spans, in order: a subscriber that gives each span its own
/// id, tracks the entered spans (one thread: a current-thread runtime) for the
/// contextual parent, and counts handles to see when a span closes.
#[derive(Clone, Default)]
struct SpanLog(Arc<Mutex<SpanLogInner>>);

#[derive(Default)]
struct SpanLogInner {
    next: u64,
    entered: Vec<u64>,
    handles: HashMap<u64, usize>,
    log: Vec<Entry>,
}

#[derive(Debug, Clone)]
enum Entry {
    Open {
        id: u64,
        name: &'static str,
        target: String,
        parent: Option<u64>,
    },
    Event {
        message: String,
        span: Option<u64>,
    },
    Close {
        id: u64,
    },
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for SpanLog {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut inner = self.0.lock().unwrap();
        inner.next += 1;
        let id = inner.next;
        let parent = match attrs.parent() {
            Some(p) => Some(p.into_u64()),
            None if attrs.is_contextual() => inner.entered.last().copied(),
            None => None,
        };
        inner.handles.insert(id, 1);
        inner.log.push(Entry::Open {
            id,
            name: attrs.metadata().name(),
            target: attrs.metadata().target().to_owned(),
            parent,
        });
        Id::from_u64(id)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        let mut inner = self.0.lock().unwrap();
        let span = inner.entered.last().copied();
        inner.log.push(Entry::Event {
            message: message.0,
            span,
        });
    }
    fn enter(&self, id: &Id) {
        self.0.lock().unwrap().entered.push(id.into_u64());
    }
    fn exit(&self, id: &Id) {
        let mut inner = self.0.lock().unwrap();
        if let Some(i) = inner.entered.iter().rposition(|e| *e == id.into_u64()) {
            inner.entered.remove(i);
        }
    }
    fn clone_span(&self, id: &Id) -> Id {
        *self
            .0
            .lock()
            .unwrap()
            .handles
            .entry(id.into_u64())
            .or_default() += 1;
        id.clone()
    }
    fn try_close(&self, id: Id) -> bool {
        let mut inner = self.0.lock().unwrap();
        let id = id.into_u64();
        let handles = inner.handles.entry(id).or_default();
        *handles = handles.saturating_sub(1);
        let closed = *handles == 0;
        if closed {
            inner.log.push(Entry::Close { id });
        }
        closed
    }
}

impl SpanLog {
    fn entries(&self) -> Vec<Entry> {
        self.0.lock().unwrap().log.clone()
    }

    /// Index and entry of the last span opened with this name.
    fn opened(&self, name: &str) -> (usize, u64, String, Option<u64>) {
        self.entries()
            .into_iter()
            .enumerate()
            .filter_map(|(i, e)| match e {
                Entry::Open {
                    id,
                    name: n,
                    target,
                    parent,
                } if n == name => Some((i, id, target, parent)),
                _ => None,
            })
            .next_back()
            .unwrap_or_else(|| panic!("no {name} span in {:#?}", self.entries()))
    }

    fn closed_at(&self, span: u64) -> Option<usize> {
        self.entries()
            .iter()
            .position(|e| matches!(e, Entry::Close { id } if *id == span))
    }

    /// Index of the last event with this message, and the span it was in.
    fn event(&self, message: &str) -> (usize, Option<u64>) {
        self.entries()
            .into_iter()
            .enumerate()
            .filter_map(|(i, e)| match e {
                Entry::Event { message: m, span } if m == message => Some((i, span)),
                _ => None,
            })
            .next_back()
            .unwrap_or_else(|| panic!("no {message:?} event in {:#?}", self.entries()))
    }
}

#[distributed_lock(key = "job:{id}", manager = m)]
async fn locked_job(m: &LockManager, id: u32, log: &SpanLog) -> Result<bool, LockError> {
    // The hold span is open while the body runs.
    let (_, hold, _, _) = log.opened("distlock.hold");
    Ok(log.closed_at(hold).is_none())
}

#[test]
fn the_hold_span_runs_from_grant_to_release_beside_the_acquire_span() {
    let log = SpanLog::default();
    let _default = tracing::subscriber::set_default(log.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let redis = server();
        let m = manager(&redis).await;

        // A manual request inside the caller's span.
        let request = tracing::info_span!("request");
        let request_id = request.id().unwrap().into_u64();
        async {
            let g = m.lock("held").acquire().await.unwrap();
            let (acquire_at, acquire, _, acquire_parent) = log.opened("distlock.acquire");
            let (hold_at, hold, target, hold_parent) = log.opened("distlock.hold");
            let (acquired_at, acquired_in) = log.event("acquired");
            assert_eq!(target, "distlock::lease");
            // Both children of the caller's span: the hold beside the wait, not in it.
            assert_eq!(acquire_parent, Some(request_id));
            assert_eq!(hold_parent, Some(request_id));
            // The wait ends with the grant, and the hold opens at it.
            assert_eq!(acquired_in, Some(acquire));
            assert!(acquire_at < acquired_at && acquired_at < hold_at);
            let acquire_closed = log.closed_at(acquire).expect("the acquire span closed");
            assert!(acquire_closed < hold_at, "{:#?}", log.entries());
            // Open while the lock is held...
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(log.closed_at(hold), None, "{:#?}", log.entries());
            // ...and closed by the release, after its "released" event.
            g.release().await.unwrap();
            let hold_closed = log
                .closed_at(hold)
                .expect("the hold span closed at release");
            let (released_at, _) = log.event("released");
            assert!(released_at < hold_closed, "{:#?}", log.entries());
            assert_eq!(log.closed_at(request_id), None);
        }
        .instrument(request)
        .await;
        let (_, hold, _, _) = log.opened("distlock.hold");
        assert!(log.closed_at(hold) < log.closed_at(request_id));

        // A dropped guard closes its hold span too.
        let g = m.lock("dropped").acquire().await.unwrap();
        let (_, hold, _, parent) = log.opened("distlock.hold");
        assert_eq!(parent, None, "no caller span here");
        assert_eq!(log.closed_at(hold), None);
        drop(g);
        assert!(log.closed_at(hold).is_some());

        // A locked function: the hold span is a child of the caller's span,
        // open while the body runs, closed when the function returns.
        let handler = tracing::info_span!("handler");
        let handler_id = handler.id().unwrap().into_u64();
        let open_in_body = locked_job(&m, 7, &log).instrument(handler).await.unwrap();
        assert!(open_in_body);
        let (_, hold, _, parent) = log.opened("distlock.hold");
        assert_eq!(parent, Some(handler_id));
        let (_, _, _, acquire_parent) = log.opened("distlock.acquire");
        assert_eq!(acquire_parent, Some(handler_id));
        assert!(log.closed_at(hold).is_some());
        assert!(log.closed_at(hold) < log.closed_at(handler_id));
    });
}
