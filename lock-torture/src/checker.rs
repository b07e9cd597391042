//! The history checker.
//!
//! Mutual exclusion: for each key, sections are ordered by the time their guard was
//! granted. A later section `B` overlaps an earlier `A` when `B` was granted before
//! `A` stopped acting as the owner ([`Section::hold_end`]: the release call when the
//! release confirmed the lock was still ours, else the body's last poll). That is a
//! violation unless
//! - `A`'s guard had reported its lease lost before `B` began, or
//! - Redis lost its data (a restart without persistence) between `A`'s grant and
//!   `B`'s: no lease-based lock can hold through that; those overlaps are counted
//!   apart ("amnesia overlaps"), and the fenced store must reject the stale writes.
//!
//! Fencing: tokens strictly increase in the order holders were granted the lock.
//!
//! Store: the store's own log (the order the server ran the writes) must agree with
//! what the clients saw, no write with a token lower than an accepted one may be
//! accepted, and each accepted write must be the previous value plus one (otherwise
//! an increment was lost to a concurrent holder).

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::clock::diff_ms;
use crate::history::{Outcome, Section, Write, Zombie};
use crate::store::{Entry, Stats};

/// Facts about the run the checker cannot see in the logs.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Times `(down, up)` between which the lock server lost its data.
    pub amnesia: Vec<(u64, u64)>,
    /// `(worker, from, to)`: the worker process was frozen (SIGSTOP) in between.
    /// A poll of a body that had begun when the process froze ends after the thaw,
    /// whatever the lock does; the test checks it was only that one poll.
    pub frozen: Vec<(u32, u64, u64)>,
}

/// Two sections on one key that held at once.
#[derive(Debug, Clone)]
pub struct Overlap {
    /// The one granted first.
    pub earlier: Section,
    /// The one granted while the earlier still acted as owner.
    pub later: Section,
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b) = (&self.earlier, &self.later);
        write!(
            f,
            "key {}: worker {} task {} (token {}, {:?}, lost {}) held until {:+.1} ms, but worker {} task {} (token {}) was granted at {:+.1} ms (times relative to the first grant)",
            a.key,
            a.worker,
            a.task,
            a.token,
            a.outcome,
            a.lost,
            diff_ms(a.hold_end(), a.acquired),
            b.worker,
            b.task,
            b.token,
            diff_ms(b.acquired, a.acquired),
        )
    }
}

/// What [`check_sections`] found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Sections checked.
    pub sections: usize,
    /// Sections by outcome.
    pub outcomes: BTreeMap<&'static str, usize>,
    /// Sections whose guard reported a lost lease.
    pub lost: usize,
    /// Overlaps that break mutual exclusion.
    pub overlaps: Vec<Overlap>,
    /// Overlaps across a loss of Redis's data (allowed; fencing must cover them).
    pub amnesia_overlaps: Vec<Overlap>,
    /// Overlaps where the earlier holder had reported the loss first (allowed).
    pub overlaps_after_reported_loss: usize,
    /// Overlaps by a body poll that the freezing of its process cut in two
    /// (allowed; fencing must cover them).
    pub frozen_overlaps: Vec<Overlap>,
    /// Consecutive grants whose tokens did not increase.
    pub token_order: Vec<(Section, Section)>,
}

impl Report {
    /// Count of sections with `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.outcomes.get(outcome.word()).copied().unwrap_or(0)
    }

    /// Panics with the first problems when mutual exclusion or token order broke.
    pub fn assert_clean(&self, what: &str) {
        let mut msg = String::new();
        for o in self.overlaps.iter().take(5) {
            msg.push_str(&format!("\n  overlap: {o}"));
        }
        for (a, b) in self.token_order.iter().take(5) {
            msg.push_str(&format!(
                "\n  token order: key {}: worker {} token {} granted at {} then worker {} token {} granted at {}",
                a.key, a.worker, a.token, a.acquired, b.worker, b.token, b.acquired
            ));
        }
        assert!(
            self.overlaps.is_empty() && self.token_order.is_empty(),
            "{what}: {} overlaps, {} token-order violations in {} sections:{msg}",
            self.overlaps.len(),
            self.token_order.len(),
            self.sections
        );
    }
}

/// Checks mutual exclusion and token order over all sections.
pub fn check_sections(sections: &[Section], faults: &Faults) -> Report {
    let mut report = Report {
        sections: sections.len(),
        ..Report::default()
    };
    for s in sections {
        *report.outcomes.entry(s.outcome.word()).or_default() += 1;
        report.lost += usize::from(s.lost);
    }
    let mut by_key: HashMap<&str, Vec<&Section>> = HashMap::new();
    for s in sections {
        by_key.entry(&s.key).or_default().push(s);
    }
    for list in by_key.values_mut() {
        list.sort_by_key(|s| (s.acquired, s.token));
        for w in list.windows(2) {
            if w[1].token <= w[0].token {
                report.token_order.push((w[0].clone(), w[1].clone()));
            }
        }
        // Sweep: the sections still acting as owner when each next one is granted.
        let mut open: Vec<&Section> = Vec::new();
        for &b in list.iter() {
            open.retain(|a| a.hold_end() > b.acquired);
            for &a in &open {
                let pair = Overlap {
                    earlier: a.clone(),
                    later: b.clone(),
                };
                if a.lost && a.lost_at <= b.acquired {
                    report.overlaps_after_reported_loss += 1;
                } else if a.lost
                    && faults.frozen.iter().any(|&(w, from, to)| {
                        w == a.worker && from <= b.acquired && a.last_active >= to
                    })
                {
                    report.frozen_overlaps.push(pair);
                } else if faults
                    .amnesia
                    .iter()
                    .any(|&(down, _)| a.acquired < down && down <= b.acquired)
                {
                    report.amnesia_overlaps.push(pair);
                } else {
                    report.overlaps.push(pair);
                }
            }
            open.push(b);
        }
    }
    report
}

/// What [`check_store`] found for one key.
#[derive(Debug, Clone, Default)]
pub struct StoreReport {
    /// Writes the store ran.
    pub writes: usize,
    /// Of which accepted.
    pub accepted: usize,
    /// Of which rejected (stale token).
    pub rejected: usize,
    /// Accepted writes whose token was lower than one accepted before: must be 0.
    pub stale_accepted: usize,
    /// Accepted writes that did not add one to the previous accepted value (an
    /// increment lost to a concurrent holder).
    pub lost_updates: usize,
    /// Zombie writes (sent after the holder knew its lease was lost) accepted.
    pub zombies_accepted: usize,
    /// Zombie writes rejected.
    pub zombies_rejected: usize,
    /// The final value.
    pub value: u64,
    /// Writes in the store's log that no client reported sending: only a worker
    /// killed with a write in flight may leave those.
    pub unreported: usize,
    /// Disagreements between the clients' records and the store's log.
    pub mismatches: Vec<String>,
}

impl StoreReport {
    /// Adds another key's report.
    pub fn merge(&mut self, o: &StoreReport) {
        self.writes += o.writes;
        self.accepted += o.accepted;
        self.rejected += o.rejected;
        self.stale_accepted += o.stale_accepted;
        self.lost_updates += o.lost_updates;
        self.zombies_accepted += o.zombies_accepted;
        self.zombies_rejected += o.zombies_rejected;
        self.value += o.value;
        self.unreported += o.unreported;
        self.mismatches.extend(o.mismatches.iter().cloned());
    }
}

/// Checks one key's store log against the sections and zombie writes on that key.
pub fn check_store(
    key: &str,
    sections: &[Section],
    zombies: &[Zombie],
    log: &[Entry],
    stats: Stats,
) -> StoreReport {
    let mut r = StoreReport {
        writes: log.len(),
        value: stats.value,
        ..StoreReport::default()
    };
    let mut max_accepted = 0u64;
    let mut last_value = 0u64;
    for e in log {
        if e.accepted {
            r.accepted += 1;
            if e.token < max_accepted {
                r.stale_accepted += 1;
            }
            max_accepted = max_accepted.max(e.token);
            if e.value != last_value + 1 {
                r.lost_updates += 1;
            }
            last_value = e.value;
        } else {
            r.rejected += 1;
        }
    }
    if stats.accepted != r.accepted as u64 || stats.rejected != r.rejected as u64 {
        r.mismatches.push(format!(
            "{key}: counters {stats:?} disagree with the log ({} accepted, {} rejected)",
            r.accepted, r.rejected
        ));
    }
    if stats.value != last_value {
        r.mismatches.push(format!(
            "{key}: value {} but the last accepted write was {last_value}",
            stats.value
        ));
    }

    // Entries by token, to match them with what the clients saw.
    let mut by_token: HashMap<u64, Vec<bool>> = HashMap::new();
    for e in log {
        by_token.entry(e.token).or_default().push(e.accepted);
    }
    let mut take = |token: u64, accepted: Option<bool>| -> bool {
        let Some(list) = by_token.get_mut(&token) else {
            return false;
        };
        let pos = match accepted {
            Some(a) => list.iter().position(|&x| x == a),
            None => (!list.is_empty()).then_some(0),
        };
        match pos {
            Some(i) => {
                list.remove(i);
                true
            }
            None => false,
        }
    };
    for z in zombies.iter().filter(|z| z.key == key) {
        if z.accepted {
            r.zombies_accepted += 1;
        } else {
            r.zombies_rejected += 1;
        }
        if !take(z.token, Some(z.accepted)) {
            r.mismatches.push(format!(
                "{key}: zombie write of token {} ({}) is not in the store's log",
                z.token,
                if z.accepted { "accepted" } else { "rejected" }
            ));
        }
    }
    for s in sections.iter().filter(|s| s.key == key) {
        let found = match s.write {
            Write::Accepted => take(s.token, Some(true)),
            Write::Rejected => take(s.token, Some(false)),
            Write::Sent => {
                take(s.token, None);
                true
            }
            // The client never sent one: nothing with its token may be left.
            Write::None => !take(s.token, None),
        };
        if !found {
            r.mismatches.push(format!(
                "{key}: worker {} task {} saw its write of token {} {:?}, the store's log disagrees",
                s.worker, s.task, s.token, s.write
            ));
        }
    }
    r.unreported = by_token.values().map(Vec::len).sum();
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Release;

    fn sec(worker: u32, token: u64, acquired: u64, last_active: u64) -> Section {
        Section {
            worker,
            task: 0,
            key: "k".into(),
            token,
            outcome: Outcome::Ok,
            lost: false,
            lost_at: 0,
            acquired,
            last_active,
            deadline: 0,
            write: Write::Accepted,
            release: Release::Ok,
            release_start: last_active,
            release_end: last_active + 1,
        }
    }

    #[test]
    fn disjoint_sections_are_clean() {
        let s = [sec(1, 1, 0, 10), sec(2, 2, 10, 20), sec(1, 3, 25, 30)];
        let r = check_sections(&s, &Faults::default());
        assert!(r.overlaps.is_empty() && r.token_order.is_empty());
        assert_eq!(r.count(Outcome::Ok), 3);
        r.assert_clean("disjoint");
    }

    #[test]
    fn an_overlap_is_found() {
        let s = [sec(1, 1, 0, 10), sec(2, 2, 5, 20)];
        let r = check_sections(&s, &Faults::default());
        assert_eq!(r.overlaps.len(), 1);
        assert_eq!(r.overlaps[0].earlier.worker, 1);
        let text = r.overlaps[0].to_string();
        assert!(text.contains("worker 2"), "{text}");
    }

    #[test]
    fn a_holder_that_reported_its_loss_first_is_excused() {
        let mut a = sec(1, 1, 0, 10);
        a.lost = true;
        a.lost_at = 4;
        a.release = Release::Lost;
        let s = [a.clone(), sec(2, 2, 5, 20)];
        let r = check_sections(&s, &Faults::default());
        assert!(r.overlaps.is_empty());
        assert_eq!(r.overlaps_after_reported_loss, 1);
        // Reported after B began: a violation.
        a.lost_at = 6;
        let r = check_sections(&[a, sec(2, 2, 5, 20)], &Faults::default());
        assert_eq!(r.overlaps.len(), 1);
    }

    #[test]
    fn a_release_that_confirmed_ownership_extends_the_hold() {
        let mut a = sec(1, 1, 0, 10);
        a.release_start = 30;
        let r = check_sections(&[a.clone(), sec(2, 2, 20, 40)], &Faults::default());
        assert_eq!(r.overlaps.len(), 1, "B was granted before A's release ran");
        a.release = Release::Lost;
        let r = check_sections(&[a, sec(2, 2, 20, 40)], &Faults::default());
        assert!(
            r.overlaps.is_empty(),
            "A's lease had run out: its release found it gone"
        );
    }

    #[test]
    fn amnesia_overlaps_are_counted_apart() {
        let s = [sec(1, 1, 0, 100), sec(2, 2, 50, 60)];
        let faults = Faults {
            amnesia: vec![(40, 45)],
            ..Faults::default()
        };
        let r = check_sections(&s, &faults);
        assert!(r.overlaps.is_empty());
        assert_eq!(r.amnesia_overlaps.len(), 1);
    }

    #[test]
    fn a_poll_cut_in_two_by_a_freeze_is_counted_apart() {
        let mut a = sec(1, 1, 0, 100);
        a.lost = true;
        a.lost_at = 101;
        a.release = Release::Lost;
        let b = sec(2, 2, 50, 60);
        let frozen = Faults {
            frozen: vec![(1, 20, 90)],
            ..Faults::default()
        };
        let r = check_sections(&[a.clone(), b.clone()], &frozen);
        assert!(r.overlaps.is_empty());
        assert_eq!(r.frozen_overlaps.len(), 1);
        // Another worker's freeze excuses nothing.
        let other = Faults {
            frozen: vec![(3, 20, 90)],
            ..Faults::default()
        };
        assert_eq!(check_sections(&[a, b], &other).overlaps.len(), 1);
    }

    #[test]
    fn tokens_must_increase_with_grants() {
        let s = [sec(1, 5, 0, 10), sec(2, 4, 11, 20), sec(2, 4, 21, 30)];
        let r = check_sections(&s, &Faults::default());
        assert_eq!(r.token_order.len(), 2);
    }

    fn entry(token: u64, value: u64, accepted: bool) -> Entry {
        Entry {
            token,
            value,
            accepted,
        }
    }

    #[test]
    fn the_store_log_is_matched_with_the_clients() {
        let mut a = sec(1, 10, 0, 10);
        let b = sec(2, 20, 20, 30);
        let mut c = sec(3, 30, 40, 50);
        c.write = Write::Sent;
        let log = [entry(10, 1, true), entry(20, 2, true), entry(30, 3, true)];
        let stats = Stats {
            value: 3,
            token: 30,
            accepted: 3,
            rejected: 0,
        };
        let r = check_store("k", &[a.clone(), b.clone(), c.clone()], &[], &log, stats);
        assert!(r.mismatches.is_empty(), "{:?}", r.mismatches);
        assert_eq!((r.accepted, r.lost_updates, r.stale_accepted), (3, 0, 0));

        // A client that thinks it wrote nothing, but the store has its write.
        a.write = Write::None;
        let r = check_store("k", &[a, b.clone(), c.clone()], &[], &log, stats);
        assert_eq!(r.mismatches.len(), 1, "{:?}", r.mismatches);

        // A write nobody reported (a killed worker's).
        let r = check_store("k", &[b, c], &[], &log, stats);
        assert!(r.mismatches.is_empty(), "{:?}", r.mismatches);
        assert_eq!(r.unreported, 1);
    }

    #[test]
    fn lost_updates_stale_writes_and_zombies_are_counted() {
        let log = [
            entry(10, 1, true),
            entry(20, 1, true), // read 0 before 10 wrote: lost update
            entry(10, 2, false),
            entry(5, 9, true), // impossible with the script: stale accepted
        ];
        let stats = Stats {
            value: 9,
            token: 20,
            accepted: 3,
            rejected: 1,
        };
        let z = Zombie {
            worker: 1,
            key: "k".into(),
            token: 10,
            at: 0,
            accepted: false,
        };
        let mut s5 = sec(3, 5, 0, 1);
        s5.write = Write::Accepted;
        let r = check_store(
            "k",
            &[sec(1, 10, 0, 1), sec(2, 20, 2, 3), s5],
            &[z],
            &log,
            stats,
        );
        assert_eq!(r.lost_updates, 2);
        assert_eq!(r.stale_accepted, 1);
        assert_eq!(r.zombies_rejected, 1);
        assert!(r.mismatches.is_empty(), "{:?}", r.mismatches);
    }
}
