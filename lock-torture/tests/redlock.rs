//! The torture scenarios on a Redlock of five independent servers: the
//! baseline, a frozen member, a minority or a majority cut off, and a member
//! restarted empty.
//!
//! Each test prints a `TORTURE ...` line with its figures (run with `--nocapture`),
//! kept as a results file when `TORTURE_RESULTS` is set (`support::torture_line`);
//! `DISTLOCK_SOAK=1` multiplies the sizes by 20. The tests take a process-wide lock
//! so they run one at a time: they measure time, and the machine has 2 cores.

use std::time::{Duration, Instant};

use distlock_testing::RedisServer;
use distlock_testing::{FaultMode, FaultProxy};
use lock_torture::checker::Faults;
use lock_torture::clock::{diff_ms, mono_ns, ns};
use lock_torture::history::{CallKind, CallResult, History, Outcome};
use lock_torture::process::Worker;

mod support;

use support::*;

/// Scenario 1 on a Redlock of five independent redis-servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1r_baseline_torture_on_a_redlock() {
    baseline(On::Redlock).await;
}

/// Scenario 9 on a Redlock: the baseline workload runs while one of the five
/// members is frozen (SIGSTOP) for 3 s, twice (a different member each time).
/// Four members still make a majority: work goes on while a member is frozen (each
/// call waits at most its per-member bound for the frozen one), no two holders
/// overlap, the counter stays exact, and no lock is left on any member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s9r_a_paused_redlock_member_costs_latency_not_safety() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let setup = setup_on("s9r", On::Redlock);
    let LockTarget::Redlock(members) = &setup.target else {
        unreachable!("set up on a Redlock")
    };
    let processes = 4u32;
    let lease = Duration::from_millis(2000);
    let pause = Duration::from_secs(3);
    let keys = setup.keys(3).await;
    let load_of = |id| mixed_load(id, &keys.join(","), lease.as_millis(), &[("progress", &10)]);
    let mut workers = ready_all(
        (0..processes)
            .map(|id| setup.target_worker(id, "run", &load_of(id)))
            .collect(),
    )
    .await;
    let t = Duration::from_secs(30);
    progress_all(&mut workers, 1, t).await;
    // (member, paused at, resumed at)
    let mut windows: Vec<(usize, u64, u64)> = Vec::new();
    for member in [1usize, 3] {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let from = mono_ns();
        members[member].pause().expect("SIGSTOP a member");
        tokio::time::sleep(pause).await;
        let to = mono_ns();
        members[member].resume().expect("SIGCONT the member");
        windows.push((member, from, to));
    }
    // Run on for more than a lease after the last resume: a call the frozen
    // member queued runs when it resumes, and an acquisition it runs that late
    // (given up by then) must be gone by its lease when the leak check looks.
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    let drains = stop_all(&mut workers, t).await;
    let h = history_of(&workers);
    let (report, stored, leaked) = judge(&setup, &h, &keys, &Faults::default()).await;
    let seen = WhilePaused::of(&h, &windows);
    figures(
        "s9r_pause_one_of_five",
        &report,
        &stored,
        &format!(
            "{}xSIGSTOP({}s)+{}cancel+{}panic",
            windows.len(),
            pause.as_secs(),
            report.count(Outcome::Cancelled),
            report.count(Outcome::Panicked)
        ),
        leaked.len(),
        &format!(
            "{} drain_ms_max={} secs={:.1}",
            seen.figures(),
            longest_drain(&drains),
            started.elapsed().as_secs_f64()
        ),
    );

    report.assert_clean("a paused Redlock member");
    assert_eq!(report.lost, 0, "four of five members renew every lease");
    // Progress while a member is frozen, over both pauses: with 128 tasks queued
    // on 3 keys an acquisition takes about as long as one 3 s pause (p50 2.5 s
    // with all members up), so one pause may pass without a completion (it did
    // once in CI, with 7 in the other); that is latency, which this run measures
    // and prints, not a loss of liveness.
    assert!(
        seen.during.iter().sum::<usize>() > 0,
        "no section completed while a member was frozen (pauses: {windows:?})"
    );
    assert_exact_counter(&report, &stored);
    assert!(leaked.is_empty(), "locks left on the members: {leaked:?}");
    assert_drained(&workers, &drains);
}

/// What s9r saw while a member was frozen, and while none was.
struct WhilePaused {
    /// Per pause: sections granted while the member was frozen that
    /// completed (body written, outcome ok).
    during: Vec<usize>,
    /// Those of them whose release also returned before the resume (a
    /// release waits up to the command timeout for the frozen member).
    released_during: Vec<usize>,
    /// Durations of the acquisitions that succeeded, sorted, begun while a
    /// member was frozen and begun while none was.
    acquires_paused: Vec<u64>,
    acquires_up: Vec<u64>,
    /// Acquisitions that failed with `QuorumFailed` (the only error the worker
    /// retries that it logs as `other`).
    quorum_failed: usize,
}

impl WhilePaused {
    fn of(h: &History, windows: &[(usize, u64, u64)]) -> Self {
        let paused = |at: u64| windows.iter().any(|(_, from, to)| *from <= at && at <= *to);
        let in_pause = |released_too: bool| -> Vec<usize> {
            windows
                .iter()
                .map(|(_, from, to)| {
                    h.sections
                        .iter()
                        .filter(|x| {
                            x.outcome == Outcome::Ok && *from <= x.acquired && x.acquired <= *to
                        })
                        .filter(|x| !released_too || x.release_end <= *to)
                        .count()
                })
                .collect()
        };
        let acquires = |frozen: bool| {
            let mut d: Vec<u64> = h
                .calls
                .iter()
                .filter(|c| c.kind == CallKind::Acquire && c.result == CallResult::Ok)
                .filter(|c| paused(c.start) == frozen)
                .map(|c| c.end - c.start)
                .collect();
            d.sort_unstable();
            d
        };
        WhilePaused {
            during: in_pause(false),
            released_during: in_pause(true),
            acquires_paused: acquires(true),
            acquires_up: acquires(false),
            quorum_failed: h
                .calls
                .iter()
                .filter(|c| c.kind == CallKind::Acquire && c.result == CallResult::Other)
                .count(),
        }
    }

    fn figures(&self) -> String {
        let p50 = |d: &[u64]| d.get(d.len() / 2).map_or(0.0, |v| *v as f64 / 1e6);
        format!(
            "completed_while_paused={:?} released_while_paused={:?} acquire_p50_ms_up={:.1} acquire_p50_ms_paused={:.1} \
             acquire_max_ms_paused={:.1} quorum_failed={}",
            self.during,
            self.released_during,
            p50(&self.acquires_up),
            p50(&self.acquires_paused),
            self.acquires_paused.last().map_or(0.0, |v| *v as f64 / 1e6),
            self.quorum_failed,
        )
    }
}

/// What scenarios 17r-19r do to a Redlock of five members, mid-run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RedlockFault {
    /// Two members (a minority) black-holed by their proxies for 3 s.
    MinorityCut,
    /// One member restarted empty at once (`SHUTDOWN NOSAVE` and start).
    RestartAtOnce,
    /// One member stopped, and started empty only after a lease has passed
    /// (the delayed restart the Redlock description recommends).
    RestartDelayed,
    /// Three members (a majority) black-holed for two leases.
    MajorityCut,
}

/// Scenario 17r: a minority of the members (2 of 5) is cut off (the proxies in
/// front of them black-hole every byte) for 3 s. A majority remains: work
/// goes on (each call waits at most its per-member bound for the cut-off
/// members), no two holders overlap, the counter stays exact, nothing leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s17r_a_cut_off_redlock_minority_costs_latency_not_safety() {
    redlock_fault(RedlockFault::MinorityCut).await;
}

/// Scenario 18r: a member restarts empty, at once. A lock held on exactly a
/// majority that includes it is then held on a minority, and another client
/// may take it on a majority formed with the restarted member: the outcome
/// the Redlock description warns of. The checker counts such overlaps as
/// excused by the restart (its amnesia window); this scenario asserts only
/// that the fenced store accepts no stale write and that nothing leaks, and
/// prints how many overlaps the restart caused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s18r_a_redlock_member_restarted_empty_at_once() {
    redlock_fault(RedlockFault::RestartAtOnce).await;
}

/// Scenario 18r with the delayed restart: the member stays down for a lease
/// (plus the drift), so every lock it held has expired everywhere before it
/// answers again: no overlap at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s18rd_a_redlock_member_restarted_after_a_lease() {
    redlock_fault(RedlockFault::RestartDelayed).await;
}

/// Scenario 19r: a majority (3 of 5) is cut off for two leases. No grant
/// without a quorum: no section is granted while the majority is away; every
/// holder that held across it reports the loss (its renewals reach only a
/// minority); no overlap; work resumes once the members are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s19r_a_lost_redlock_majority_stops_every_holder() {
    redlock_fault(RedlockFault::MajorityCut).await;
}

async fn redlock_fault(fault: RedlockFault) {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let name = match fault {
        RedlockFault::MinorityCut => "s17r_redlock_minority_cut",
        RedlockFault::RestartAtOnce => "s18r_redlock_member_restarted",
        RedlockFault::RestartDelayed => "s18rd_redlock_member_restarted_late",
        RedlockFault::MajorityCut => "s19r_redlock_majority_cut",
    };
    let mut setup = setup_on(&name[..4], On::Redlock);
    let lease = Duration::from_millis(2000);
    let LockTarget::Redlock(members) = &setup.target else {
        unreachable!("set up on a Redlock")
    };
    // Proxies in front of the first three members (the cut-off ones).
    let mut proxies = Vec::new();
    for member in &members[..3] {
        proxies.push(FaultProxy::start(member.addr()).await.expect("a proxy"));
    }
    let mut urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    urls.extend(members[3..].iter().map(RedisServer::url));
    let keys = setup.keys(3).await;
    // With the majority away, the bodies outlast the lease, so that holders
    // are caught in them and must learn the loss.
    let (body, every, after): (&dyn ToString, &dyn ToString, usize) = match fault {
        RedlockFault::MajorityCut => (&"3000000-4000000", &1, 1),
        _ => (&"0-5000", &10, 2),
    };
    let mut workers = start_behind(&setup, &urls, &keys, lease, (body, every)).await;
    // How long one worker may wait for its next grant. On a Redlock waiters do
    // not queue: each grant goes to whichever task retries first, so a worker
    // holding 4 of the 16 tasks wins one with odds of about 1 in 4. With
    // bodies of at most 5 ms, 30 s is thousands of grants. With the majority
    // cut, bodies of 3-4 s on 3 keys give 3 grants per 4 s: 80 s is 60 grants,
    // which leave one worker without any with odds of (3/4)^60, about 3e-8
    // (30 s is 22 grants: odds of about 2e-3 per worker, and it did fail once
    // on a slow machine), and one lease more lets the holds the fault caught
    // lapse first.
    let t = match fault {
        RedlockFault::MajorityCut => Duration::from_secs(80) + lease,
        _ => Duration::from_secs(30),
    };
    progress_all(&mut workers, 1, t).await;
    let (down, up) = strike(&mut setup, &proxies, fault, lease).await;
    // Work resumes: more progress within `t` of the end of the fault.
    progress_all(&mut workers, after, t).await;
    stop_all(&mut workers, t).await;
    let h = history_of(&workers);
    let faults = Faults {
        amnesia: if fault == RedlockFault::RestartAtOnce {
            vec![(down, up + ns(lease))]
        } else {
            Vec::new()
        },
        ..Faults::default()
    };
    // The proxies go first, so that the leak check sees the members directly.
    drop(proxies);
    let (report, stored, leaked) = judge(&setup, &h, &keys, &faults).await;
    let mut extra = format!(
        "fault_ms={:.0} restart_overlaps={} secs={:.1}",
        diff_ms(up, down),
        report.amnesia_overlaps.len(),
        started.elapsed().as_secs_f64()
    );
    match fault {
        RedlockFault::MinorityCut => extra.push_str(&granted_during_a_minority_cut(&h, down, up)),
        RedlockFault::MajorityCut => {
            extra.push_str(&none_granted_without_a_majority(&h, down, up, lease))
        }
        RedlockFault::RestartAtOnce | RedlockFault::RestartDelayed => {}
    }
    figures(name, &report, &stored, name, leaked.len(), &extra);
    report.assert_clean(name);
    assert!(leaked.is_empty(), "locks left in Redis: {leaked:?}");
}

/// Four workers of the s17r load (4 tasks each, `body` µs, a progress mark
/// every `every` sections) on the Redlock of `urls`, ready.
async fn start_behind(
    setup: &Setup,
    urls: &[String],
    keys: &[String],
    lease: Duration,
    (body, every): (&dyn ToString, &dyn ToString),
) -> Vec<Worker> {
    let load = [("progress", every), ("tasks", &4)];
    let load_of = |id| {
        let mut all = mixed_load(id, &keys.join(","), lease.as_millis(), &load);
        // The body range replaces mixed_load's.
        for arg in all.iter_mut().filter(|(k, _)| *k == "body-us") {
            arg.1 = body.to_string();
        }
        all
    };
    let target = ("redlock-urls", urls.join(","));
    ready_all(
        (0..4u32)
            .map(|id| setup.worker_with(id, target.clone(), "run", &load_of(id)))
            .collect(),
    )
    .await
}

/// Does `fault` to the members (the first three behind `proxies`); returns
/// when it began and when it ended.
async fn strike(
    setup: &mut Setup,
    proxies: &[FaultProxy],
    fault: RedlockFault,
    lease: Duration,
) -> (u64, u64) {
    let down = mono_ns();
    match fault {
        RedlockFault::MinorityCut => {
            for proxy in &proxies[..2] {
                proxy.set_mode(FaultMode::BlackHole);
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            for proxy in &proxies[..2] {
                proxy.set_mode(FaultMode::Pass);
            }
        }
        RedlockFault::MajorityCut => {
            for proxy in proxies {
                proxy.set_mode(FaultMode::BlackHole);
            }
            tokio::time::sleep(lease * 2).await;
            for proxy in proxies {
                proxy.set_mode(FaultMode::Pass);
            }
        }
        RedlockFault::RestartAtOnce | RedlockFault::RestartDelayed => {
            let LockTarget::Redlock(members) = &mut setup.target else {
                unreachable!("set up on a Redlock")
            };
            // A member without a proxy, so that its clients reconnect to it.
            members[3].stop().expect("stop a member");
            if fault == RedlockFault::RestartDelayed {
                tokio::time::sleep(lease + drift(lease) + Duration::from_millis(100)).await;
            }
            members[3].start().expect("start the member empty");
        }
    }
    (down, mono_ns())
}

/// A majority is left: locks are still granted while the two are cut off
/// (each call waits at most its per-member bound for them). The figure.
fn granted_during_a_minority_cut(h: &History, down: u64, up: u64) -> String {
    let during = h
        .sections
        .iter()
        // Past the command timeout: not an acquisition that began before.
        .filter(|s| s.acquired > down + ns(Duration::from_millis(600)) && s.acquired < up)
        .filter(|s| s.outcome == Outcome::Ok)
        .count();
    assert!(
        during > 0,
        "no section completed while a minority was cut off"
    );
    format!(" sections_during_cut={during}")
}

/// A quorum is needed for every grant: none while 3 of 5 were away (a grant
/// whose acquisition began before the cut, and whose last member answered
/// just before it, may land up to the command timeout later). No holder went
/// on past a lease into the cut without learning the loss (its renewals
/// reached only a minority); those caught in their body were told. The figure.
fn none_granted_without_a_majority(h: &History, down: u64, up: u64, lease: Duration) -> String {
    let during: Vec<_> = h
        .sections
        .iter()
        .filter(|s| s.acquired > down + ns(Duration::from_millis(600)) && s.acquired < up)
        .collect();
    assert!(
        during.is_empty(),
        "{} sections granted without a majority, the first: {:?}",
        during.len(),
        during.first()
    );
    let unaware: Vec<_> = h
        .sections
        .iter()
        .filter(|s| s.acquired < down && !s.lost && s.last_active > down + ns(lease))
        .collect();
    assert!(
        unaware.is_empty(),
        "held into the cut past the lease without a loss: {:?}",
        unaware.first()
    );
    let told = h
        .sections
        .iter()
        .filter(|s| s.acquired < down && s.lost)
        .count();
    format!(" holders_told_of_the_loss={told}")
}
