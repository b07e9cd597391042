//! Tracing: quiet at info level on the happy path, a warning when a lease is lost,
//! debug events with the acquisition's figures.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
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
        let g = a
            .lock("k")
            .lease(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap();
        let waiter =
            tokio::spawn(async move { b.lock("k").wait(Duration::from_secs(5)).acquire().await });
        tokio::time::sleep(Duration::from_millis(400)).await; // a renewal or two
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

        let g = a
            .lock("k2")
            .lease(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap();
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
