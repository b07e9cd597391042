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
//! Fencing: tokens strictly increase in the order holders were granted the lock
//! (a hold rebuilt for a killed worker, token 0 = unknown, is left out of it).
//!
//! Store: the store's own log (the order the server ran the writes) must agree with
//! what the clients saw, no write with a token lower than an accepted one may be
//! accepted, and each accepted write must be the previous value plus one (otherwise
//! an increment was lost to a concurrent holder).
//!
//! The shared kinds and the queue: a semaphore never has more than its permits
//! held at once and hands no token out twice ([`check_semaphore`]); a read-write
//! lock excludes every pair with a writer in it, readers share, and writers'
//! tokens follow grant order ([`check_read_write`]); the default lock's queue (s12)
//! is judged by the longest time a key went without a grant
//! ([`longest_grant_gaps`]), grants nobody logged ([`unlogged_tokens`]), and wait
//! percentiles and overtakes ([`acquire_waits`]).

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
    /// Consecutive grants (of known token) whose tokens did not increase.
    pub token_order: Vec<(Section, Section)>,
    /// The same across a window where the lock server lost data (a failover
    /// that lost the fencing counter's last increments): allowed, counted
    /// apart; the fenced store must still accept no lower token.
    pub amnesia_token_order: Vec<(Section, Section)>,
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
        // Token 0: a hold rebuilt from a killed worker's log, token unknown.
        let mut last: Option<&Section> = None;
        for &b in list.iter().filter(|s| s.token != 0) {
            if let Some(a) = last.filter(|a| b.token <= a.token) {
                let across_amnesia = faults
                    .amnesia
                    .iter()
                    .any(|&(down, _)| a.acquired < down && down <= b.acquired);
                if across_amnesia {
                    report.amnesia_token_order.push((a.clone(), b.clone()));
                } else {
                    report.token_order.push((a.clone(), b.clone()));
                }
            }
            last = Some(b);
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

/// Sections, outcomes and lost leases: the figures common to every report.
fn tally(sections: &[Section]) -> (BTreeMap<&'static str, usize>, usize) {
    let mut outcomes = BTreeMap::new();
    let mut lost = 0;
    for s in sections {
        *outcomes.entry(s.outcome.word()).or_default() += 1;
        lost += usize::from(s.lost);
    }
    (outcomes, lost)
}

/// The sections of each key, in grant order.
fn by_key_in_grant_order(sections: &[Section]) -> BTreeMap<&str, Vec<&Section>> {
    let mut by_key: BTreeMap<&str, Vec<&Section>> = BTreeMap::new();
    for s in sections {
        by_key.entry(&s.key).or_default().push(s);
    }
    for list in by_key.values_mut() {
        list.sort_by_key(|s| (s.acquired, s.token));
    }
    by_key
}

/// The most sections of one key held at once at some instant in `[from, to)`,
/// and the first instant it was reached. A section is held from its grant until
/// [`Section::held_until`] (its hold end, cut at a reported loss).
pub fn max_concurrent(sections: &[Section], from: u64, to: u64) -> (usize, u64) {
    let mut best = (0usize, from);
    for list in by_key_in_grant_order(sections).values() {
        // The count is a step function that only rises at grants: its maximum
        // over the window is at `from` or at a grant inside the window.
        let held_at = |t: u64| {
            list.iter()
                .filter(|s| s.acquired <= t && s.held_until() > t)
                .count()
        };
        let candidates = std::iter::once(from).chain(
            list.iter()
                .map(|s| s.acquired)
                .filter(|&t| t > from && t < to),
        );
        for t in candidates {
            let n = held_at(t);
            if n > best.0 {
                best = (n, t);
            }
        }
    }
    best
}

/// What [`check_semaphore`] found.
#[derive(Debug, Clone, Default)]
pub struct SemaphoreReport {
    /// Sections checked.
    pub sections: usize,
    /// Sections by outcome.
    pub outcomes: BTreeMap<&'static str, usize>,
    /// Sections whose guard reported a lost lease.
    pub lost: usize,
    /// The semaphore's permit count.
    pub permits: usize,
    /// The most sections of one key held at once.
    pub max_concurrent: usize,
    /// The first grant at which `permits` sections were held at once.
    pub full_at: Option<u64>,
    /// Grants made while `permits` sections were already held: the sections held
    /// right after each such grant (the new one last).
    pub excess: Vec<Vec<Section>>,
    /// Tokens handed to two sections of one key.
    pub duplicate_tokens: Vec<u64>,
}

impl SemaphoreReport {
    /// Count of sections with `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.outcomes.get(outcome.word()).copied().unwrap_or(0)
    }

    /// Panics with the first problems when more than `permits` sections were
    /// held at once or a token was handed out twice.
    pub fn assert_clean(&self, what: &str) {
        let mut msg = String::new();
        for held in self.excess.iter().take(3) {
            let last = held.last().map_or(0, |s| s.acquired);
            msg.push_str(&format!("\n  {} held at once:", held.len()));
            for s in held {
                msg.push_str(&format!(
                    "\n    worker {} task {} token {} granted {:+.1} ms, held until {:+.1} ms (lost {})",
                    s.worker,
                    s.task,
                    s.token,
                    diff_ms(s.acquired, last),
                    diff_ms(s.held_until(), last),
                    s.lost
                ));
            }
        }
        assert!(
            self.excess.is_empty() && self.duplicate_tokens.is_empty(),
            "{what}: {} grants beyond {} permits, tokens handed out twice {:?}, in {} sections:{msg}",
            self.excess.len(),
            self.permits,
            self.duplicate_tokens,
            self.sections
        );
    }
}

/// Checks a semaphore of `permits` permits: on each key, never more than
/// `permits` sections held at once (a section counts from its grant until
/// [`Section::held_until`]: sections that reported their lease lost stop
/// counting from the report, as [`check_sections`] excuses them), and no
/// fencing token handed to two sections (tokens of concurrent holders need not
/// follow grant order: grants are timed by the clients). Token 0 (unknown, in a
/// section rebuilt for a killed worker) is not compared.
pub fn check_semaphore(sections: &[Section], permits: usize) -> SemaphoreReport {
    let (outcomes, lost) = tally(sections);
    let mut report = SemaphoreReport {
        sections: sections.len(),
        outcomes,
        lost,
        permits,
        ..SemaphoreReport::default()
    };
    for list in by_key_in_grant_order(sections).values() {
        let mut open: Vec<&Section> = Vec::new();
        for &b in list {
            open.retain(|a| a.held_until() > b.acquired);
            if b.held_until() > b.acquired {
                open.push(b);
            }
            report.max_concurrent = report.max_concurrent.max(open.len());
            if open.len() >= permits && report.full_at.is_none_or(|t| b.acquired < t) {
                report.full_at = Some(b.acquired);
            }
            if open.len() > permits {
                report
                    .excess
                    .push(open.iter().map(|&s| s.clone()).collect());
            }
        }
        let mut tokens: Vec<u64> = list.iter().map(|s| s.token).filter(|&t| t != 0).collect();
        tokens.sort_unstable();
        for w in tokens.windows(2) {
            if w[0] == w[1] {
                report.duplicate_tokens.push(w[0]);
            }
        }
    }
    report
}

/// What [`check_read_write`] found.
#[derive(Debug, Clone, Default)]
pub struct ReadWriteReport {
    /// Sections checked.
    pub sections: usize,
    /// Sections by outcome.
    pub outcomes: BTreeMap<&'static str, usize>,
    /// Sections whose guard reported a lost lease.
    pub lost: usize,
    /// Read sections.
    pub readers: usize,
    /// Write sections.
    pub writers: usize,
    /// A writer held while another section (reader or writer) did.
    pub overlaps: Vec<Overlap>,
    /// Such overlaps where the earlier holder had reported the loss first (allowed).
    pub overlaps_after_reported_loss: usize,
    /// The most readers of one key held at once.
    pub max_readers: usize,
    /// Pairs `(earlier, later)` in grant order that break the tokens' order: a
    /// writer's token must exceed every token granted before it, and every token
    /// granted after a writer must exceed the writer's.
    pub token_order: Vec<(Section, Section)>,
    /// Write sections whose body ran to its end, by worker.
    pub writes_ok_by_worker: BTreeMap<u32, usize>,
}

impl ReadWriteReport {
    /// Count of sections with `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.outcomes.get(outcome.word()).copied().unwrap_or(0)
    }

    /// Panics with the first problems when a writer shared the lock or the
    /// tokens broke order.
    pub fn assert_clean(&self, what: &str) {
        let mut msg = String::new();
        for o in self.overlaps.iter().take(5) {
            msg.push_str(&format!(
                "\n  overlap ({:?} then {:?}): {o}",
                o.earlier.kind, o.later.kind
            ));
        }
        for (a, b) in self.token_order.iter().take(5) {
            msg.push_str(&format!(
                "\n  token order: key {}: worker {} {:?} token {} granted at {} then worker {} {:?} token {} granted at {}",
                a.key, a.worker, a.kind, a.token, a.acquired, b.worker, b.kind, b.token, b.acquired
            ));
        }
        assert!(
            self.overlaps.is_empty() && self.token_order.is_empty(),
            "{what}: {} writer overlaps, {} token-order violations in {} sections:{msg}",
            self.overlaps.len(),
            self.token_order.len(),
            self.sections
        );
    }
}

/// Checks read-write locks: on each key, no section is granted while a writer
/// holds, and no writer is granted while any section holds (the same rule as
/// [`check_sections`], applied to every pair with a writer in it; readers may
/// share); the most readers held at once; writers' tokens in grant order.
pub fn check_read_write(sections: &[Section]) -> ReadWriteReport {
    use crate::history::Kind;
    let (outcomes, lost) = tally(sections);
    let mut report = ReadWriteReport {
        sections: sections.len(),
        outcomes,
        lost,
        ..ReadWriteReport::default()
    };
    for s in sections {
        match s.kind {
            Kind::Write => {
                report.writers += 1;
                if s.outcome == Outcome::Ok {
                    *report.writes_ok_by_worker.entry(s.worker).or_default() += 1;
                }
            }
            _ => report.readers += 1,
        }
    }
    for list in by_key_in_grant_order(sections).values() {
        let mut open: Vec<&Section> = Vec::new();
        let mut max_token: Option<&Section> = None;
        let mut last_writer: Option<&Section> = None;
        for &b in list {
            open.retain(|a| a.hold_end() > b.acquired);
            for &a in &open {
                if a.kind != Kind::Write && b.kind != Kind::Write {
                    continue;
                }
                if a.lost && a.lost_at <= b.acquired {
                    report.overlaps_after_reported_loss += 1;
                } else {
                    report.overlaps.push(Overlap {
                        earlier: a.clone(),
                        later: b.clone(),
                    });
                }
            }
            if b.kind != Kind::Write {
                let readers = 1 + open
                    .iter()
                    .filter(|a| a.kind != Kind::Write && a.held_until() > b.acquired)
                    .count();
                report.max_readers = report.max_readers.max(readers);
            }
            open.push(b);

            if let Some(w) = last_writer {
                if b.token <= w.token {
                    report.token_order.push((w.clone(), b.clone()));
                }
            }
            if b.kind == Kind::Write {
                if let Some(m) = max_token.filter(|m| m.token >= b.token) {
                    if last_writer.is_none_or(|w| !std::ptr::eq(w, m)) {
                        report.token_order.push((m.clone(), b.clone()));
                    }
                }
                last_writer = Some(b);
            }
            if max_token.is_none_or(|m| b.token > m.token) {
                max_token = Some(b);
            }
        }
    }
    report
}

/// Per key, the longest time in `[from, to]` without a grant (bounded by
/// `from`, the grants inside the window and `to`), and when it began.
pub fn longest_grant_gaps(
    sections: &[Section],
    from: u64,
    to: u64,
) -> BTreeMap<String, (u64, u64)> {
    let mut gaps = BTreeMap::new();
    for (key, list) in by_key_in_grant_order(sections) {
        let times = list
            .iter()
            .map(|s| s.acquired)
            .filter(|&t| t > from && t < to);
        let mut prev = from;
        let mut best = (0, from);
        for t in times.chain([to]) {
            if t - prev > best.0 {
                best = (t - prev, prev);
            }
            prev = t;
        }
        gaps.insert(key.to_owned(), best);
    }
    gaps
}

/// Per key, fencing tokens between the first and the last token of the
/// sections granted in `[from, to)` that no section carries: grants nobody
/// logged (a hand-off to a dead waiter, a lock handed to an acquisition that
/// was being dropped and gave it back, the hold of a killed worker).
pub fn unlogged_tokens(sections: &[Section], from: u64, to: u64) -> u64 {
    let mut missing = 0;
    for list in by_key_in_grant_order(sections).values() {
        let mut tokens: Vec<u64> = list
            .iter()
            .filter(|s| s.token != 0 && s.acquired >= from && s.acquired < to)
            .map(|s| s.token)
            .collect();
        tokens.sort_unstable();
        tokens.dedup();
        missing += tokens.windows(2).map(|w| w[1] - w[0] - 1).sum::<u64>();
    }
    missing
}

/// How long successful acquisitions waited (call start to grant), and how
/// often a later arrival was served first.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Waits {
    /// Successful acquisitions counted.
    pub n: usize,
    /// Mean wait (ns).
    pub mean: u64,
    /// Median wait (ns).
    pub p50: u64,
    /// 99th percentile (ns).
    pub p99: u64,
    /// Longest wait (ns).
    pub max: u64,
    /// Acquisitions overtaken: another acquisition of the same key that was
    /// called more than `slack` later was granted before this one.
    pub overtaken: usize,
}

impl Waits {
    /// The longest wait as a multiple of the mean.
    pub fn max_over_mean(&self) -> f64 {
        self.max as f64 / self.mean.max(1) as f64
    }
}

/// [`Waits`] of the successful acquire calls granted in `[from, to)`; arrival
/// order is the calls' start, with `slack` allowed for the way from the call
/// to the queue (the first attempt, subscribing, scheduling).
pub fn acquire_waits(calls: &[crate::history::Call], from: u64, to: u64, slack: u64) -> Waits {
    use crate::history::{CallKind, CallResult};
    let ok: Vec<&crate::history::Call> = calls
        .iter()
        .filter(|c| c.kind == CallKind::Acquire && c.result == CallResult::Ok)
        .filter(|c| c.end >= from && c.end < to)
        .collect();
    if ok.is_empty() {
        return Waits::default();
    }
    let mut waits: Vec<u64> = ok.iter().map(|c| c.end - c.start).collect();
    waits.sort_unstable();
    let at = |q: usize| waits[(waits.len() - 1) * q / 100];
    let mut overtaken = 0;
    let mut by_key: BTreeMap<&str, Vec<&crate::history::Call>> = BTreeMap::new();
    for c in &ok {
        by_key.entry(&c.key).or_default().push(c);
    }
    for list in by_key.values_mut() {
        list.sort_by_key(|c| c.start);
        // The earliest grant among the calls from index i on.
        let mut first_end = vec![u64::MAX; list.len() + 1];
        for i in (0..list.len()).rev() {
            first_end[i] = first_end[i + 1].min(list[i].end);
        }
        for c in list.iter() {
            let later = list.partition_point(|b| b.start <= c.start + slack);
            overtaken += usize::from(first_end[later] < c.end);
        }
    }
    Waits {
        n: waits.len(),
        mean: waits.iter().sum::<u64>() / waits.len() as u64,
        p50: at(50),
        p99: at(99),
        max: waits[waits.len() - 1],
        overtaken,
    }
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
            kind: crate::history::Kind::Lock,
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
    fn a_token_repeated_across_amnesia_is_counted_apart() {
        // Token 5 issued before the window and again after it; 4 then 4
        // without a window between them is a violation.
        let s = [sec(1, 5, 0, 10), sec(2, 5, 50, 60), sec(3, 4, 70, 80)];
        let faults = Faults {
            amnesia: vec![(40, 45)],
            ..Faults::default()
        };
        let r = check_sections(&s, &faults);
        assert_eq!(r.amnesia_token_order.len(), 1);
        assert_eq!(r.token_order.len(), 1, "5 then 4 after the window");
        let none = check_sections(&s, &Faults::default());
        assert_eq!(none.token_order.len(), 2);
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

    fn of(kind: crate::history::Kind, worker: u32, token: u64, from: u64, to: u64) -> Section {
        Section {
            kind,
            ..sec(worker, token, from, to)
        }
    }

    #[test]
    fn a_semaphore_may_hold_its_permits_at_once() {
        use crate::history::Kind::Permit;
        // Three permits: 3 at once in [20, 30), then holders come and go.
        let s = [
            of(Permit, 1, 1, 0, 30),
            of(Permit, 2, 2, 10, 40),
            of(Permit, 3, 3, 20, 50),
            of(Permit, 1, 4, 30, 60), // granted as the first leaves
            of(Permit, 2, 5, 45, 70),
        ];
        let r = check_semaphore(&s, 3);
        r.assert_clean("three permits");
        assert_eq!((r.max_concurrent, r.full_at), (3, Some(20)));
        assert_eq!(max_concurrent(&s, 0, 100), (3, 20));
        assert_eq!(max_concurrent(&s, 50, 100).0, 2);
        assert_eq!(max_concurrent(&s, 60, 100).0, 1);
        // Two permits would have been exceeded.
        assert!(!check_semaphore(&s, 2).excess.is_empty());
    }

    #[test]
    fn n_plus_one_overlapping_permits_fail() {
        use crate::history::Kind::Permit;
        let s = [
            of(Permit, 1, 1, 0, 100),
            of(Permit, 2, 2, 10, 100),
            of(Permit, 3, 3, 20, 100),
            of(Permit, 4, 4, 30, 40), // the fourth of three
        ];
        let r = check_semaphore(&s, 3);
        assert_eq!(r.max_concurrent, 4);
        assert_eq!(r.excess.len(), 1);
        assert_eq!(r.excess[0].len(), 4);
        assert_eq!(r.excess[0][3].worker, 4);
        let failed = std::panic::catch_unwind(|| r.assert_clean("n+1")).unwrap_err();
        let msg = failed.downcast_ref::<String>().unwrap();
        assert!(msg.contains("1 grants beyond 3 permits"), "{msg}");
        // On different keys they do not add up.
        let mut apart = s.clone();
        apart[3].key = "other".into();
        check_semaphore(&apart, 3).assert_clean("two keys");
    }

    #[test]
    fn a_permit_reported_lost_stops_counting() {
        use crate::history::Kind::Permit;
        let mut a = of(Permit, 1, 1, 0, 100);
        a.lost = true;
        a.lost_at = 25;
        a.release = Release::Lost;
        let s = [
            a.clone(),
            of(Permit, 2, 2, 10, 100),
            of(Permit, 3, 3, 30, 100),
        ];
        check_semaphore(&s, 2).assert_clean("loss reported first");
        // Reported after the third was granted: three at once.
        a.lost_at = 35;
        let s = [a, of(Permit, 2, 2, 10, 100), of(Permit, 3, 3, 30, 100)];
        assert_eq!(check_semaphore(&s, 2).excess.len(), 1);
    }

    #[test]
    fn a_token_handed_out_twice_is_found() {
        use crate::history::Kind::Permit;
        let s = [
            of(Permit, 1, 7, 0, 10),
            of(Permit, 2, 7, 20, 30),
            of(Permit, 3, 0, 40, 50),
            of(Permit, 4, 0, 60, 70),
        ];
        let r = check_semaphore(&s, 3);
        assert_eq!(r.duplicate_tokens, [7], "token 0 (unknown) is not compared");
    }

    #[test]
    fn readers_share_and_writers_do_not() {
        use crate::history::Kind::{Read, Write as W};
        let s = [
            of(Read, 1, 1, 0, 30),
            of(Read, 2, 2, 10, 40),
            of(Read, 3, 3, 20, 35),
            of(W, 4, 4, 40, 50),
            of(Read, 1, 5, 50, 60),
            of(W, 2, 6, 60, 70),
            of(W, 4, 7, 70, 80),
        ];
        let r = check_read_write(&s);
        r.assert_clean("clean");
        assert_eq!((r.readers, r.writers, r.max_readers), (4, 3, 3));
        assert_eq!(r.writes_ok_by_worker.get(&4), Some(&2));
        assert_eq!(r.writes_ok_by_worker.get(&2), Some(&1));
    }

    #[test]
    fn a_writer_sharing_the_lock_is_found() {
        use crate::history::Kind::{Read, Write as W};
        // A writer granted while a reader holds.
        let r = check_read_write(&[of(Read, 1, 1, 0, 30), of(W, 2, 2, 20, 40)]);
        assert_eq!(r.overlaps.len(), 1);
        // A reader granted while a writer holds.
        let r = check_read_write(&[of(W, 1, 1, 0, 30), of(Read, 2, 2, 20, 40)]);
        assert_eq!(r.overlaps.len(), 1);
        // Two writers.
        let r = check_read_write(&[of(W, 1, 1, 0, 30), of(W, 2, 2, 20, 40)]);
        assert_eq!(r.overlaps.len(), 1);
        assert!(std::panic::catch_unwind(|| r.assert_clean("two writers")).is_err());
        // A writer that reported its loss first is excused.
        let mut a = of(W, 1, 1, 0, 30);
        a.lost = true;
        a.lost_at = 15;
        a.release = Release::Lost;
        let r = check_read_write(&[a, of(Read, 2, 2, 20, 40)]);
        assert!(r.overlaps.is_empty());
        assert_eq!(r.overlaps_after_reported_loss, 1);
    }

    #[test]
    fn writer_tokens_must_increase_past_everything_before() {
        use crate::history::Kind::{Read, Write as W};
        // Writers out of order.
        let r = check_read_write(&[of(W, 1, 5, 0, 10), of(W, 2, 4, 20, 30)]);
        assert_eq!(r.token_order.len(), 1);
        // A writer below a reader granted before it.
        let r = check_read_write(&[of(Read, 1, 9, 0, 10), of(W, 2, 8, 20, 30)]);
        assert_eq!(r.token_order.len(), 1);
        // A reader below the writer before it.
        let r = check_read_write(&[of(W, 1, 9, 0, 10), of(Read, 2, 8, 20, 30)]);
        assert_eq!(r.token_order.len(), 1);
        // Readers among themselves may come in any order (granted concurrently).
        let r = check_read_write(&[
            of(Read, 1, 9, 0, 10),
            of(Read, 2, 8, 5, 30),
            of(W, 1, 10, 30, 40),
        ]);
        r.assert_clean("readers in any order");
    }
    #[test]
    fn a_killed_hold_of_unknown_token_is_checked_for_overlap_not_order() {
        // Token 0: rebuilt from a killed worker's log.
        let s = [sec(1, 5, 0, 10), sec(3, 0, 11, 20), sec(2, 6, 21, 30)];
        check_sections(&s, &Faults::default()).assert_clean("unknown token");
        let s = [sec(1, 5, 0, 10), sec(3, 0, 11, 20), sec(2, 4, 21, 30)];
        assert_eq!(check_sections(&s, &Faults::default()).token_order.len(), 1);
        let s = [sec(1, 5, 0, 10), sec(3, 0, 5, 20)];
        assert_eq!(check_sections(&s, &Faults::default()).overlaps.len(), 1);
    }

    #[test]
    fn grant_gaps_and_unlogged_tokens() {
        let s = [sec(1, 1, 10, 11), sec(2, 2, 20, 21), sec(1, 5, 70, 71)];
        let gaps = longest_grant_gaps(&s, 0, 100);
        assert_eq!(gaps["k"], (50, 20));
        assert_eq!(longest_grant_gaps(&s, 15, 60)["k"], (40, 20));
        assert_eq!(longest_grant_gaps(&s, 0, 200)["k"], (130, 70));
        // Tokens 3 and 4 went to nobody who logged a section.
        assert_eq!(unlogged_tokens(&s, 0, 100), 2);
        assert_eq!(unlogged_tokens(&s, 0, 50), 0);
    }

    #[test]
    fn waits_and_overtakes() {
        use crate::history::{Call, CallKind, CallResult};
        let call = |key: &str, start: u64, end: u64| Call {
            worker: 1,
            task: 0,
            kind: CallKind::Acquire,
            key: key.into(),
            start,
            end,
            result: CallResult::Ok,
        };
        // In order: a (0..10), b (1..20), c (2..30); d on another key.
        let fifo = [
            call("k", 0, 10),
            call("k", 1, 20),
            call("k", 2, 30),
            call("j", 3, 5),
        ];
        let w = acquire_waits(&fifo, 0, 100, 0);
        assert_eq!((w.n, w.max, w.p50, w.overtaken), (4, 28, 10, 0));
        assert_eq!(w.mean, (10 + 19 + 28 + 2) / 4);
        // e called at 5, granted at 15: it overtook b and c.
        let mut jumped = fifo.to_vec();
        jumped.push(call("k", 5, 15));
        assert_eq!(acquire_waits(&jumped, 0, 100, 0).overtaken, 2);
        // Within the slack it is no overtake.
        assert_eq!(acquire_waits(&jumped, 0, 100, 4).overtaken, 0);
        // Failed calls and calls granted outside the window do not count.
        jumped[4].result = CallResult::Timeout;
        assert_eq!(acquire_waits(&jumped, 0, 100, 0).overtaken, 0);
        assert_eq!(acquire_waits(&fifo, 0, 25, 0).n, 3);
    }
}
