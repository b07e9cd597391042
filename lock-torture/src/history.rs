//! The records workers append to their logs, one per line, tab-separated, and the
//! parser the checker uses. All times are [`mono_ns`](crate::clock::mono_ns).
//!
//! ```text
//! S worker task key token outcome lost lost_at acquired last_active deadline write release release_start release_end [kind]
//! C worker task kind key start end result
//! Z worker key token at verdict
//! ```
//!
//! The section's `kind` (`read`, `write`, `permit`, `term`) is written only
//! for the kinds other than the exclusive lock: an exclusive lock's line has 15 fields, as before the kinds
//! existed, and a line without the field parses as [`Kind::Lock`].
//!
//! A worker killed with SIGKILL logs nothing for the sections it held:
//! [`History::in_flight`] rebuilds them from its log (held until the kill, or
//! until the section's `ending` mark, token unknown), so the checker still sees
//! who owned each key.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// How a critical section ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The body ran to its end.
    Ok,
    /// The body was stopped by a lost lease (`scope_until_lost` returned `Lost`).
    Lost,
    /// The caller dropped the section's future mid-body.
    Cancelled,
    /// The body panicked (inside a spawned task).
    Panicked,
    /// The body failed for another reason (the store did not answer).
    Failed,
}

/// What became of the body's write to the fenced store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Write {
    /// Never sent.
    None,
    /// Sent, but the section ended before the answer came: the store's log decides.
    Sent,
    /// The store took it.
    Accepted,
    /// The store rejected it: a newer token had written first.
    Rejected,
}

/// What `guard.release()` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Release {
    /// `Ok(())`: the lock was still ours and is gone.
    Ok,
    /// `Err(Lost)`.
    Lost,
    /// Another error (Redis failed or timed out).
    Failed,
    /// Not called: the guard was dropped (cancellation, panic).
    Dropped,
}

/// Which kind of hold a section had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Kind {
    /// `manager.lock(key)`: one holder.
    #[default]
    Lock,
    /// `manager.read_lock(key)`: shared with other readers, never with a writer.
    Read,
    /// `manager.write_lock(key)`: no other holder, reader or writer.
    Write,
    /// `manager.semaphore(key, n)`: one of `n` permits.
    Permit,
    /// `manager.leader(key).campaign()`: one term of a leader election; the
    /// section's token is the term's epoch.
    Term,
}

/// One critical section as its worker saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Worker (process) number.
    pub worker: u32,
    /// Task number within the worker.
    pub task: u32,
    /// The lock key.
    pub key: String,
    /// The fencing token of the acquisition.
    pub token: u64,
    /// How the body ended.
    pub outcome: Outcome,
    /// The guard reported a lost lease (body aborted, `is_lost()` at the end, or
    /// release answered `Lost`).
    pub lost: bool,
    /// When the loss was first observed (0 if never).
    pub lost_at: u64,
    /// When `acquire()` returned the guard.
    pub acquired: u64,
    /// When the body last ran: the end of its last poll (`acquired` if never polled).
    pub last_active: u64,
    /// The latest local validity deadline seen (`now + remaining_lease()`), 0 if none.
    pub deadline: u64,
    /// The body's write to the fenced store.
    pub write: Write,
    /// The answer of release.
    pub release: Release,
    /// When release was called (or the guard dropped).
    pub release_start: u64,
    /// When release returned (or the guard was dropped).
    pub release_end: u64,
    /// The kind of hold.
    pub kind: Kind,
}

impl Section {
    /// Until when this holder acted as the lock's owner: the release call when the
    /// release confirmed the lock was still ours, else the body's last activity
    /// (nothing after it was protected by the lock).
    pub fn hold_end(&self) -> u64 {
        match self.release {
            Release::Ok => self.release_start.max(self.last_active),
            _ => self.last_active,
        }
    }

    /// Until when this section counts as a holder for the shared kinds' checks:
    /// [`hold_end`](Self::hold_end), cut at the time the guard reported its lease
    /// lost (a holder told it lost the lease is excused from then on, as
    /// [`check_sections`](crate::checker::check_sections) excuses it).
    pub fn held_until(&self) -> u64 {
        if self.lost && self.lost_at > 0 {
            self.hold_end().min(self.lost_at)
        } else {
            self.hold_end()
        }
    }
}

/// The kind of a logged call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// `acquire()`.
    Acquire,
    /// `release()`.
    Release,
    /// Not a call: the section stopped acting as the owner (its body ended,
    /// panicked or was cancelled), logged before anything could free the lock
    /// (its release, the drop of its guard). Its `start` and `end` are that
    /// instant. A worker killed after freeing a lock but before logging the
    /// section's line still tells the checker when that hold ended.
    Ending,
}

/// The result class of a logged call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallResult {
    /// Success.
    Ok,
    /// `LockError::Timeout`.
    Timeout,
    /// `LockError::Backend` or `Connect`.
    Backend,
    /// `LockError::Lost`.
    Lost,
    /// Any other error.
    Other,
}

/// One call into the lock API and how long it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// Worker number.
    pub worker: u32,
    /// Task number.
    pub task: u32,
    /// Which call.
    pub kind: CallKind,
    /// The lock key.
    pub key: String,
    /// When it was called.
    pub start: u64,
    /// When it returned.
    pub end: u64,
    /// What it returned.
    pub result: CallResult,
}

/// A write sent by a holder *after* it knew its lease was lost, on purpose, as a
/// buggy or paused client would: the fenced store must reject it once a newer
/// holder has written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zombie {
    /// Worker number.
    pub worker: u32,
    /// The lock key.
    pub key: String,
    /// The (stale) fencing token it carried.
    pub token: u64,
    /// When it was answered.
    pub at: u64,
    /// Whether the store took it.
    pub accepted: bool,
}

/// One log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A critical section.
    Section(Section),
    /// A call.
    Call(Call),
    /// A zombie write.
    Zombie(Zombie),
}

macro_rules! word_enum {
    ($ty:ident { $($variant:ident = $word:literal),* $(,)? }) => {
        impl $ty {
            /// The word used in logs.
            pub fn word(self) -> &'static str {
                match self { $($ty::$variant => $word),* }
            }
        }
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($word => Ok($ty::$variant),)*
                    other => Err(format!("unknown {} {other:?}", stringify!($ty))),
                }
            }
        }
    };
}

word_enum!(Outcome { Ok = "ok", Lost = "lost", Cancelled = "cancelled", Panicked = "panicked", Failed = "failed" });
word_enum!(Write { None = "none", Sent = "sent", Accepted = "accepted", Rejected = "rejected" });
word_enum!(Release { Ok = "ok", Lost = "lost", Failed = "failed", Dropped = "dropped" });
word_enum!(Kind { Lock = "lock", Read = "read", Write = "write", Permit = "permit", Term = "term" });
word_enum!(CallKind { Acquire = "acquire", Release = "release", Ending = "ending" });
word_enum!(CallResult { Ok = "ok", Timeout = "timeout", Backend = "backend", Lost = "lost", Other = "other" });

impl CallResult {
    /// Classifies a lock call's result.
    pub fn of<T>(r: &Result<T, distlock::LockError>) -> CallResult {
        match r {
            Ok(_) => CallResult::Ok,
            Err(distlock::LockError::Timeout { .. }) => CallResult::Timeout,
            Err(distlock::LockError::Backend { .. } | distlock::LockError::Connect { .. }) => {
                CallResult::Backend
            }
            Err(distlock::LockError::Lost { .. }) => CallResult::Lost,
            Err(_) => CallResult::Other,
        }
    }
}

fn check_key(key: &str) {
    assert!(
        !key.is_empty() && !key.contains(['\t', '\n', '\r']),
        "torture keys must be non-empty and free of tabs and newlines: {key:?}"
    );
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Record::Section(s) => {
                check_key(&s.key);
                write!(
                    f,
                    "S\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    s.worker,
                    s.task,
                    s.key,
                    s.token,
                    s.outcome.word(),
                    u8::from(s.lost),
                    s.lost_at,
                    s.acquired,
                    s.last_active,
                    s.deadline,
                    s.write.word(),
                    s.release.word(),
                    s.release_start,
                    s.release_end
                )?;
                if s.kind != Kind::Lock {
                    write!(f, "\t{}", s.kind.word())?;
                }
                Ok(())
            }
            Record::Call(c) => {
                check_key(&c.key);
                write!(
                    f,
                    "C\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    c.worker,
                    c.task,
                    c.kind.word(),
                    c.key,
                    c.start,
                    c.end,
                    c.result.word()
                )
            }
            Record::Zombie(z) => {
                check_key(&z.key);
                write!(
                    f,
                    "Z\t{}\t{}\t{}\t{}\t{}",
                    z.worker,
                    z.key,
                    z.token,
                    z.at,
                    if z.accepted { "accepted" } else { "rejected" }
                )
            }
        }
    }
}

fn field<T: FromStr>(fields: &[&str], i: usize, line: &str) -> Result<T, String>
where
    T::Err: fmt::Display,
{
    let raw = fields
        .get(i)
        .ok_or_else(|| format!("missing field {i} in {line:?}"))?;
    raw.parse()
        .map_err(|e| format!("field {i} ({raw:?}) of {line:?}: {e}"))
}

impl FromStr for Record {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, String> {
        let f: Vec<&str> = line.split('\t').collect();
        let expect = |n: usize| {
            if f.len() == n {
                Ok(())
            } else {
                Err(format!("expected {n} fields, got {}: {line:?}", f.len()))
            }
        };
        match f[0] {
            "S" => {
                if f.len() != 16 {
                    expect(15)?;
                }
                Ok(Record::Section(Section {
                    worker: field(&f, 1, line)?,
                    task: field(&f, 2, line)?,
                    key: f[3].to_owned(),
                    token: field(&f, 4, line)?,
                    outcome: field(&f, 5, line)?,
                    lost: field::<u8>(&f, 6, line)? == 1,
                    lost_at: field(&f, 7, line)?,
                    acquired: field(&f, 8, line)?,
                    last_active: field(&f, 9, line)?,
                    deadline: field(&f, 10, line)?,
                    write: field(&f, 11, line)?,
                    release: field(&f, 12, line)?,
                    release_start: field(&f, 13, line)?,
                    release_end: field(&f, 14, line)?,
                    kind: if f.len() == 16 {
                        field(&f, 15, line)?
                    } else {
                        Kind::Lock
                    },
                }))
            }
            "C" => {
                expect(8)?;
                Ok(Record::Call(Call {
                    worker: field(&f, 1, line)?,
                    task: field(&f, 2, line)?,
                    kind: field(&f, 3, line)?,
                    key: f[4].to_owned(),
                    start: field(&f, 5, line)?,
                    end: field(&f, 6, line)?,
                    result: field(&f, 7, line)?,
                }))
            }
            "Z" => {
                expect(6)?;
                Ok(Record::Zombie(Zombie {
                    worker: field(&f, 1, line)?,
                    key: f[2].to_owned(),
                    token: field(&f, 3, line)?,
                    at: field(&f, 4, line)?,
                    accepted: match f[5] {
                        "accepted" => true,
                        "rejected" => false,
                        other => return Err(format!("bad zombie verdict {other:?}")),
                    },
                }))
            }
            other => Err(format!("unknown record type {other:?} in {line:?}")),
        }
    }
}

/// Everything the workers of one run logged.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Critical sections.
    pub sections: Vec<Section>,
    /// Calls.
    pub calls: Vec<Call>,
    /// Zombie writes.
    pub zombies: Vec<Zombie>,
}

impl History {
    /// Adds the records of one log file. A last line without its newline (a worker
    /// killed mid-write) is ignored; any other bad line is an error.
    pub fn read(&mut self, path: &Path) -> Result<(), String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read log {}: {e}", path.display()))?;
        let complete = match text.rfind('\n') {
            Some(i) => &text[..i],
            None => "",
        };
        for line in complete.lines().filter(|l| !l.is_empty()) {
            match line.parse::<Record>()? {
                Record::Section(s) => self.sections.push(s),
                Record::Call(c) => self.calls.push(c),
                Record::Zombie(z) => self.zombies.push(z),
            }
        }
        Ok(())
    }

    /// Reads several log files (missing files are an error).
    pub fn read_all<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Result<History, String> {
        let mut h = History::default();
        for p in paths {
            h.read(p)?;
        }
        Ok(h)
    }

    /// The holds a worker killed at `killed_at` had then, rebuilt from its log:
    /// each task's last acquisition that returned Ok with no section logged after
    /// it. The worker acted as their owner until the kill, or until the
    /// section's [`CallKind::Ending`] mark where it wrote one; their tokens are
    /// unknown (0), their write none (a worker killed with a write in flight
    /// leaves it in the store's log only: the store check counts it as
    /// unreported).
    pub fn in_flight(&self, worker: u32, killed_at: u64, kind: Kind) -> Vec<Section> {
        let mut last: std::collections::BTreeMap<u32, &Call> = std::collections::BTreeMap::new();
        for c in self.calls.iter().filter(|c| {
            c.worker == worker && c.kind == CallKind::Acquire && c.result == CallResult::Ok
        }) {
            if last.get(&c.task).is_none_or(|l| l.end < c.end) {
                last.insert(c.task, c);
            }
        }
        last.into_values()
            .filter(|c| {
                !self
                    .of_worker(worker)
                    .any(|s| s.task == c.task && s.acquired >= c.end)
            })
            .map(|c| {
                // The section's own line may be missing although its lock was
                // freed before the kill: its `Ending` mark, written before the
                // release, says when the hold ended.
                let ended = self
                    .calls
                    .iter()
                    .filter(|e| {
                        e.worker == worker
                            && e.task == c.task
                            && e.key == c.key
                            && e.kind == CallKind::Ending
                            && e.start >= c.end
                    })
                    .map(|e| e.start)
                    .min();
                (c, ended.unwrap_or(killed_at).min(killed_at))
            })
            .map(|(c, held_until)| Section {
                worker,
                task: c.task,
                key: c.key.clone(),
                token: 0,
                outcome: Outcome::Cancelled,
                lost: false,
                lost_at: 0,
                acquired: c.end,
                last_active: held_until,
                deadline: 0,
                write: Write::None,
                release: Release::Dropped,
                release_start: killed_at,
                release_end: killed_at,
                kind,
            })
            .collect()
    }

    /// Sections of one worker.
    pub fn of_worker(&self, worker: u32) -> impl Iterator<Item = &Section> {
        self.sections.iter().filter(move |s| s.worker == worker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn section() -> Section {
        Section {
            worker: 1,
            task: 2,
            key: "k:1".into(),
            token: 1_700_000_000_000_123,
            outcome: Outcome::Lost,
            lost: true,
            lost_at: 50,
            acquired: 10,
            last_active: 40,
            deadline: 45,
            write: Write::Sent,
            release: Release::Lost,
            release_start: 60,
            release_end: 70,
            kind: Kind::Lock,
        }
    }

    #[test]
    fn records_round_trip() {
        let records = vec![
            Record::Section(section()),
            Record::Call(Call {
                worker: 3,
                task: 0,
                kind: CallKind::Acquire,
                key: "a b".into(),
                start: 1,
                end: 2,
                result: CallResult::Backend,
            }),
            Record::Zombie(Zombie {
                worker: 4,
                key: "k".into(),
                token: 9,
                at: 5,
                accepted: false,
            }),
        ];
        for r in records {
            let line = r.to_string();
            assert_eq!(line.parse::<Record>().unwrap(), r, "{line}");
        }
        for kind in [Kind::Read, Kind::Write, Kind::Permit, Kind::Term] {
            let r = Record::Section(Section { kind, ..section() });
            let line = r.to_string();
            assert_eq!(line.split('\t').count(), 16, "{line}");
            assert_eq!(line.parse::<Record>().unwrap(), r, "{line}");
        }
        // An exclusive lock's line keeps the 15 fields of the logs before kinds.
        let line = Record::Section(section()).to_string();
        assert_eq!(line.split('\t').count(), 15, "{line}");
        assert!(format!("{line}\tbogus").parse::<Record>().is_err());
        assert!("S\t1".parse::<Record>().is_err());
        assert!("X\t1".parse::<Record>().is_err());
    }

    #[test]
    fn a_torn_last_line_is_ignored() {
        let dir = std::env::temp_dir().join(format!("torture-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.log");
        let line = Record::Section(section()).to_string();
        std::fs::write(&path, format!("{line}\n{}", &line[..20])).unwrap();
        let h = History::read_all([path.as_path()]).unwrap();
        assert_eq!(h.sections.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn in_flight_holds_of_a_killed_worker_are_rebuilt() {
        let call = |task, end| Call {
            worker: 7,
            task,
            kind: CallKind::Acquire,
            key: "s".into(),
            start: end - 1,
            end,
            result: CallResult::Ok,
        };
        let done = |task, acquired| Section {
            worker: 7,
            task,
            acquired,
            kind: Kind::Permit,
            ..section()
        };
        // Task 0: two sections, both logged. Task 1: its second grant was not.
        // Task 2: a failed acquire only. Another worker's grant does not count.
        let mut h = History {
            calls: vec![call(0, 10), call(0, 30), call(1, 10), call(1, 40)],
            ..History::default()
        };
        h.calls.push(Call {
            result: CallResult::Timeout,
            ..call(2, 50)
        });
        h.calls.push(Call {
            worker: 8,
            ..call(3, 50)
        });
        h.sections = vec![done(0, 11), done(0, 31), done(1, 12)];
        let held = h.in_flight(7, 100, Kind::Permit);
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!((held[0].task, held[0].acquired), (1, 40));
        assert_eq!((held[0].hold_end(), held[0].token), (100, 0));
        assert_eq!(held[0].kind, Kind::Permit);

        // Task 1 marked its hold's end at 60 but was killed before its section's
        // line: the hold ends at the mark, not at the kill. A mark of an earlier
        // section (before the grant) or another task's does not count.
        let ending = |task, at| Call {
            kind: CallKind::Ending,
            start: at,
            end: at,
            ..call(task, at)
        };
        h.calls
            .extend([ending(1, 20), ending(0, 70), ending(1, 60)]);
        let held = h.in_flight(7, 100, Kind::Permit);
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!((held[0].acquired, held[0].hold_end()), (40, 60));
        // A task that holds several keys (a scripted worker's task 0): the
        // mark of another key's hold does not end this one.
        h.calls.retain(|c| c.kind != CallKind::Ending);
        h.calls.push(Call {
            key: "other".into(),
            ..ending(1, 60)
        });
        let held = h.in_flight(7, 100, Kind::Permit);
        assert_eq!(held[0].hold_end(), 100);
    }

    #[test]
    fn held_until_stops_at_a_reported_loss() {
        let mut s = section();
        s.release = Release::Ok;
        s.lost = false;
        assert_eq!(s.held_until(), 60);
        s.lost = true;
        s.lost_at = 50;
        assert_eq!(s.held_until(), 50);
    }

    #[test]
    fn hold_end_counts_a_confirmed_release() {
        let mut s = section();
        assert_eq!(s.hold_end(), 40);
        s.release = Release::Ok;
        assert_eq!(s.hold_end(), 60);
    }
}
