//! Counts that do not drift: one round trip to acquire, one to release.

mod common;

use std::time::Duration;

use common::*;
use futures_util::StreamExt;

/// Collects the client commands (not those a script runs) MONITOR shows until
/// the marker `end` arrives, without the `CLIENT SETINFO` that redis-rs sends
/// when it opens a connection to a server that knows the command (Redis 7.2
/// and later, every Valkey): here, the test's own connection that sends the
/// marker.
async fn client_commands_until(
    lines: &mut (impl futures_util::Stream<Item = String> + Unpin),
    end: &str,
) -> Vec<String> {
    let mut commands = lines_until(lines, end).await;
    commands.retain(|line| !line.contains(" lua]") && !line.contains("\"CLIENT\" \"SETINFO\""));
    commands
}

/// Every line MONITOR shows until the marker `end` arrives.
async fn lines_until(
    lines: &mut (impl futures_util::Stream<Item = String> + Unpin),
    end: &str,
) -> Vec<String> {
    let mut seen = Vec::new();
    while let Some(line) = tokio::time::timeout(Duration::from_secs(5), lines.next())
        .await
        .expect("monitor output")
    {
        if line.contains(end) {
            break;
        }
        seen.push(line);
    }
    seen
}

/// MONITOR shows every command a client sends, and the commands a script runs
/// tagged `lua`; only the former are round trips.
#[tokio::test]
async fn an_uncontended_cycle_is_two_round_trips() {
    let redis = server();
    let m = manager(&redis).await;
    // Warm-up: the first use loads the scripts (NOSCRIPT, SCRIPT LOAD), and
    // the first acquisition has the subscriber listen on the manager's
    // hand-off channel, on its own connection, in the background.
    let warm_up = m.lock("warm-up").acquire().await.unwrap();
    await_holder_listening(&mut raw(&redis).await, &m, "warm-up").await;
    warm_up.release().await.unwrap();

    let mut lines = monitor(&redis).await;
    for i in 0..100 {
        let g = m
            .lock(format!("fresh:{i}"))
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        g.release().await.unwrap();
    }
    mark(&redis, "end-of-cycles").await;

    // Per cycle: the plain `SET NX PX GET` that takes the lock, then the
    // release script.
    let round_trips = client_commands_until(&mut lines, "end-of-cycles").await;
    assert_eq!(round_trips.len(), 200, "{round_trips:#?}");
    for cycle in round_trips.chunks(2) {
        assert!(cycle[0].contains("\"SET\""), "{cycle:#?}");
        // The release of a lock nobody waited for declares the lock's key
        // alone (release_free.lua), not the queue's too.
        assert_eq!(release_keys(&cycle[1]), Some(1), "{cycle:#?}");
    }
}

/// The number of keys a release script's `EVALSHA` line of MONITOR declares:
/// a release sends the owner token as its one argument (no `min_hold`, no
/// events), which tells it from a renewal (owner and lease).
fn release_keys(line: &str) -> Option<usize> {
    let mut words = line.split(" \"").skip_while(|w| !w.starts_with("EVALSHA"));
    words.next()?;
    words.next()?;
    let keys: usize = words.next()?.trim_end_matches('"').parse().ok()?;
    (words.count() == keys + 1).then_some(keys)
}

/// Sends the marker `end`, and returns the client commands MONITOR shows
/// until it, with the number of keys each release script among them declared.
async fn release_scripts_until(
    redis: &distlock::testing::RedisServer,
    lines: &mut (impl futures_util::Stream<Item = String> + Unpin),
    end: &str,
) -> (Vec<usize>, Vec<String>) {
    mark(redis, end).await;
    let commands = client_commands_until(lines, end).await;
    let keys = commands.iter().filter_map(|l| release_keys(l)).collect();
    (keys, commands)
}

/// Sends `marker` on a connection of its own, for `client_commands_until`.
async fn mark(redis: &distlock::testing::RedisServer, marker: &str) {
    let mut raw = raw(redis).await;
    let _: String = redis::cmd("ECHO")
        .arg(marker)
        .query_async(&mut raw)
        .await
        .unwrap();
}

/// A hold whose manager never waited (most holders of a service: a request
/// handler, a scheduler replica) hands the lock to a waiter of another
/// manager in one round trip: its first acquisition had the manager listen on
/// its hand-off channel (in the background), so it hears the `!<owner>`
/// notice of the first waiter that queues, and its release is the full
/// release at once (four keys), which hands the lock over. The waiter then
/// holds without sending anything: the hand-off's message is its answer.
#[tokio::test]
async fn a_holder_that_never_waited_hands_over_in_one_round_trip() {
    let redis = server();
    let QueuedForHold {
        holder,
        guard: g,
        waiting,
        notices_before,
        ..
    } = held_with_a_queued_waiter(&redis).await;
    eventually(Duration::from_secs(5), async || {
        holder.waited_for_notices_heard() == notices_before + 1
    })
    .await
    .expect("the holder's manager hears that a waiter queued");

    let mut lines = monitor(&redis).await;
    g.release().await.unwrap();
    let handed = waiting.await.unwrap().unwrap();
    let (keys, commands) = release_scripts_until(&redis, &mut lines, "end-of-release").await;
    assert_eq!(keys, [4], "{commands:#?}");
    // The new holder's first renewal may come right after (a hand-off's
    // TTL is the queue lease, 3 s, which it brings up to its lease at once),
    // and nothing else: no attempt of the waiter's. The release goes behind
    // a `PING` in the same write (one round trip), so that the server writes
    // the waiter's message before the holder's reply. The waiter's queue
    // refresh (every 0.4-0.8 s) may come in the window before that write, so
    // the count starts at the PING (which `assert_release_behind_a_ping`
    // checks is the release's).
    let others: Vec<_> = commands
        .iter()
        .skip_while(|l| !l.ends_with("\"PING\""))
        .filter(|l| !is_renewal(l))
        .collect();
    assert_eq!(others.len(), 2, "the release and its PING: {commands:#?}");
    assert_release_behind_a_ping(&commands);
    handed.release().await.unwrap();
    assert!(!holder.lock("h").is_locked().await.unwrap());
}

/// Asserts that the one full release (four keys) among `commands` (a MONITOR
/// window's client commands) comes right after a `PING` of the same client:
/// the pipeline of a release that most likely hands the lock over (see
/// `Scripts::release`), whose `PING` has the server write the hand-off's
/// message before the release's reply.
fn assert_release_behind_a_ping(commands: &[String]) {
    let client = |line: &str| {
        line.split_once('[')
            .and_then(|(_, l)| l.split_once(']'))
            .map(|(c, _)| c.to_owned())
    };
    let release = commands
        .iter()
        .position(|l| release_keys(l) == Some(4))
        .unwrap_or_else(|| panic!("the full release: {commands:#?}"));
    assert!(release > 0, "nothing before the release: {commands:#?}");
    let before = &commands[release - 1];
    assert!(before.ends_with("\"PING\""), "{commands:#?}");
    assert_eq!(client(before), client(&commands[release]), "{commands:#?}");
}

/// The commands the script of `lines[evalsha]` ran, as MONITOR shows them
/// (each as its command name): a script's commands are its only neighbours,
/// on one side of its `EVALSHA` line, since a script runs alone. The side is
/// the server's: Redis 7.0 shows the script's line before its commands, a
/// server that shows a command once it has run would show them before it.
/// The first line of `lines` (a monitor started before any script ran) tells
/// which.
fn script_commands(lines: &[String], evalsha: usize) -> Vec<String> {
    let is_lua = |l: &&String| l.contains(" lua]");
    let lua_first = lines.first().is_some_and(|l| l.contains(" lua]"));
    let mut ran: Vec<&String> = if lua_first {
        lines[..evalsha].iter().rev().take_while(is_lua).collect()
    } else {
        lines[evalsha + 1..].iter().take_while(is_lua).collect()
    };
    if lua_first {
        ran.reverse();
    }
    ran.iter()
        .filter_map(|l| l.split(" \"").nth(1))
        .map(|w| w.trim_end_matches('"').to_ascii_uppercase())
        .collect()
}

/// What a hand-off costs the server, a count that does not drift: the
/// release script reads the lock, the queue's first two members (the head,
/// and whether anyone follows it, which is the new lock's mark), the clock,
/// the head's entry; takes the entry out; writes the lock in the waiter's
/// name and publishes the hand-off. Eight commands, no `ZCARD`.
#[tokio::test]
async fn a_hand_off_runs_eight_commands_in_its_release_script() {
    let redis = server();
    let QueuedForHold {
        guard: g, waiting, ..
    } = held_with_a_queued_waiter(&redis).await;

    let mut lines = monitor(&redis).await;
    g.release().await.unwrap();
    let handed = waiting.await.unwrap().unwrap();
    mark(&redis, "end-of-hand-off").await;
    let seen = lines_until(&mut lines, "end-of-hand-off").await;
    // The waiter's queue refresh (every 0.4-0.8 s) may come in the window
    // too: its script line has more arguments than a release's.
    let release = seen
        .iter()
        .position(|l| !l.contains(" lua]") && release_keys(l) == Some(4))
        .unwrap_or_else(|| panic!("the release script: {seen:#?}"));
    assert_eq!(
        script_commands(&seen, release),
        ["GET", "ZRANGE", "TIME", "HGET", "ZREM", "HDEL", "SET", "PUBLISH"],
        "{seen:#?}"
    );
    handed.release().await.unwrap();
}

/// A lock taken by `lock_all` (here one key, the one-script path) carries
/// its manager's route as a single lock's hold does: the first waiter that
/// queues tells the holder's manager, so that its release is the full
/// release at once. Its owner token ended in random digits: the notice went
/// to a channel nobody listened on.
#[tokio::test]
async fn a_waiter_queued_for_a_lock_all_hold_tells_the_holders_manager() {
    let redis = server();
    let holder = manager(&redis).await;
    let waiter = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let guard = holder.lock_all(["la"]).acquire().await.unwrap();
    await_holder_listening(&mut raw, &holder, "la").await;
    let notices_before = holder.waited_for_notices_heard();
    let waiting = spawn_waiter(&waiter, "la");
    await_queued(&holder, "la").await;
    eventually(Duration::from_secs(5), async || {
        holder.waited_for_notices_heard() == notices_before + 1
    })
    .await
    .expect("the holder's manager hears that a waiter queued");
    guard.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();
}

/// A manager holding the default lock "h" (listening on its hand-off
/// channel, and never waiting), and another manager's acquisition queued for
/// it. The waiter's manager has waited once before, so its hand-off channel is
/// subscribed and confirmed: a confirmation arriving later would make the
/// waiter attempt once more, in the window a test counts.
struct QueuedForHold {
    holder: distlock::LockManager,
    _waiter: distlock::LockManager,
    guard: distlock::LockGuard,
    waiting: tokio::task::JoinHandle<Result<distlock::LockGuard, distlock::LockError>>,
    /// The holder's `waited_for_notices_heard` before the waiter queued.
    notices_before: u64,
}

async fn held_with_a_queued_waiter(redis: &distlock::testing::RedisServer) -> QueuedForHold {
    let holder = manager(redis).await;
    let waiter = manager(redis).await;
    await_listening(&waiter, &holder, "warm-up").await;
    let mut raw = raw(redis).await;
    let guard = holder.lock("h").acquire().await.unwrap();
    await_holder_listening(&mut raw, &holder, "h").await;
    let notices_before = holder.waited_for_notices_heard();
    let waiting = spawn_waiter(&waiter, "h");
    await_queued(&holder, "h").await;
    QueuedForHold {
        holder,
        _waiter: waiter,
        guard,
        waiting,
        notices_before,
    }
}

/// Whether a MONITOR line is a renewal script: one key, then the owner token
/// and the lease in milliseconds.
fn is_renewal(line: &str) -> bool {
    let words: Vec<&str> = line
        .split(" \"")
        .skip_while(|w| !w.starts_with("EVALSHA"))
        .map(|w| w.trim_end_matches('"'))
        .collect();
    words.len() == 6 && words[2] == "1" && words[5].parse::<u64>().is_ok()
}

/// Waits (up to 5 s) until a waiter is queued for the default lock `key`, as
/// `m` reads its queue.
async fn await_queued(m: &distlock::LockManager, key: &str) {
    eventually(Duration::from_secs(5), async || {
        m.inspect_all(key).await.unwrap().waiters.len() == 1
    })
    .await
    .expect("the waiter queued");
}

/// A notice the holder's manager did not hear (it was published before the
/// manager listened, or while its pub/sub connection was down) costs the
/// release one round trip, never the hand-off: the one-key release declines
/// (someone queued) and the full release (four keys) hands the lock over.
/// Here the holder's user loses the right to subscribe, which closes its
/// manager's pub/sub connection, so that it cannot hear the notice.
#[tokio::test]
async fn an_unheard_notice_costs_the_release_one_round_trip_and_the_lock_is_still_handed_over() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let waiter = manager(&redis).await;
    // The waiter's route: the last 8 digits of its manager's owner tokens.
    let probe = waiter.lock("probe").acquire().await.unwrap();
    let waiter_id = waiter.inspect("probe").await.unwrap().unwrap().hold_id;
    let waiter_route = waiter_id[waiter_id.len() - 8..].to_owned();
    probe.release().await.unwrap();

    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "holder", "on", ">pw", "~*", "&*", "+@all"])
        .query_async(&mut raw)
        .await
        .unwrap();
    let url = redis.url().replacen("redis://", "redis://holder:pw@", 1);
    let holder = manager_at(&url).await;
    let g = holder.lock("h").acquire().await.unwrap();
    let holder_id = holder.inspect("h").await.unwrap().unwrap().hold_id;
    let holder_channel = format!("distlock:handoff:{}", &holder_id[holder_id.len() - 8..]);
    await_handoff_listener(&mut raw, &holder_id).await;
    // May publish on the waiter's hand-off channel (the release hands over
    // there), no longer subscribe: the server closes the holder's pub/sub
    // connection, and its reconnections cannot subscribe.
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("holder")
        .arg("resetchannels")
        .arg(format!("&distlock:handoff:{waiter_route}"))
        .query_async(&mut raw)
        .await
        .unwrap();
    eventually(Duration::from_secs(5), async || {
        subscribers(&mut raw, &holder_channel).await == 0
    })
    .await
    .expect("the holder's manager no longer listens");

    let waiting = spawn_waiter(&waiter, "h");
    await_queued(&holder, "h").await;
    let mut lines = monitor(&redis).await;
    g.release().await.unwrap();
    let handed = waiting.await.unwrap().unwrap();
    let (keys, first) = release_scripts_until(&redis, &mut lines, "end-of-first-release").await;
    assert_eq!(keys, [1, 4], "{first:#?}");
    // Declined, so someone queued: the full release goes behind a PING.
    assert_release_behind_a_ping(&first);
    assert_eq!(holder.waited_for_notices_heard(), 0);

    // A hold that waited goes straight to the full release.
    handed.release().await.unwrap();
    let (keys, second) = release_scripts_until(&redis, &mut lines, "end-of-second-release").await;
    assert_eq!(keys, [4], "{second:#?}");
    // Nobody said they queued for it: no PING.
    assert!(
        !second.iter().any(|l| l.ends_with("\"PING\"")),
        "{second:#?}"
    );
    assert!(!waiter.lock("h").is_locked().await.unwrap());
}

/// A manager whose hand-off channel is subscribed (it has waited before, as
/// every replica of a service that ran a while has) hears the first waiter
/// that queues for its free hold (`!<owner>` on that channel), so the hold's
/// release goes straight to the full release: one round trip, the lock handed
/// over. A hold nobody queued for still takes the one-key release.
#[tokio::test]
async fn a_hold_told_of_its_first_waiter_releases_by_the_full_script_at_once() {
    let redis = server();
    let holder = manager(&redis).await;
    let waiter = manager(&redis).await;
    wait_once(&holder, &waiter, "w").await;
    let heard_before = holder.waited_for_notices_heard();

    let g = holder.lock("h").acquire().await.unwrap();
    let waiting = spawn_waiter(&waiter, "h");
    await_waiter(&holder, "h").await;
    eventually(Duration::from_secs(5), async || {
        holder.waited_for_notices_heard() == heard_before + 1
    })
    .await
    .expect("the holder's manager hears that a waiter queued");

    let mut lines = monitor(&redis).await;
    g.release().await.unwrap();
    let handed = waiting.await.unwrap().unwrap();
    let (keys, commands) = release_scripts_until(&redis, &mut lines, "end-of-told-release").await;
    assert_eq!(keys, [4], "{commands:#?}");
    assert_release_behind_a_ping(&commands);

    // Nobody queues for this one: the one-key release, and no notice.
    let free = holder.lock("free").acquire().await.unwrap();
    free.release().await.unwrap();
    handed.release().await.unwrap();
    let (keys, commands) = release_scripts_until(&redis, &mut lines, "end-of-free-release").await;
    assert_eq!(
        keys,
        [1, 4],
        "the free hold's, then the handed one's: {commands:#?}"
    );
    assert_eq!(holder.waited_for_notices_heard(), heard_before + 1);
}

/// The one-key release compares the value's prefix (owner token and mark),
/// which a token issued later does not change: a hold that took its token
/// later, or inside its acquisition, still releases by that script in one
/// round trip.
#[tokio::test]
async fn a_hold_with_a_token_releases_by_the_one_key_script() {
    let redis = server();
    let m = manager(&redis).await;
    let warm_up = m.lock("warm-up").acquire().await.unwrap();
    warm_up.fencing_token().await.unwrap();
    await_holder_listening(&mut raw(&redis).await, &m, "warm-up").await;
    warm_up.release().await.unwrap();

    let mut lines = monitor(&redis).await;
    let lazy = m.lock("lazy").acquire().await.unwrap();
    assert!(lazy.fencing_token().await.unwrap() > 0);
    lazy.release().await.unwrap();
    let eager = m.lock("eager").eager_fencing(true).acquire().await.unwrap();
    assert!(eager.issued_fencing_token().is_some());
    eager.release().await.unwrap();
    let (keys, commands) = release_scripts_until(&redis, &mut lines, "end-of-token-holds").await;
    // SET NX, the token script, the release; the acquire script, the release.
    assert_eq!(commands.len(), 5, "{commands:#?}");
    assert_eq!(keys, [1, 1], "{commands:#?}");
    assert!(!m.lock("lazy").is_locked().await.unwrap());
    assert!(!m.lock("eager").is_locked().await.unwrap());
}

/// Re-entry is decided from the call chain's context: no round trip at all.
#[tokio::test]
async fn reentry_costs_no_round_trip() {
    let redis = server();
    let m = manager(&redis).await;
    let outer = m.lock("k").acquire().await.unwrap();
    await_holder_listening(&mut raw(&redis).await, &m, "k").await;

    let mut lines = monitor(&redis).await;
    outer
        .scope(async {
            for _ in 0..10 {
                let inner = m.lock("k").acquire().await.unwrap();
                inner.release().await.unwrap();
            }
        })
        .await;
    mark(&redis, "end-of-reentry").await;
    let commands = client_commands_until(&mut lines, "end-of-reentry").await;
    assert!(commands.is_empty(), "{commands:#?}");
    outer.release().await.unwrap();
}

/// Redis commands per uncontended cycle of one key, scripts' own included:
/// `SET NX PX GET` to take it, and the release script (EVALSHA, GET, DEL): 4,
/// rslock's count. Nobody waited, so the release publishes nothing and reads
/// no queue; no token was asked for, so no fencing counter is read or written.
#[tokio::test]
async fn an_uncontended_cycle_is_four_redis_commands() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let warm_up = m.lock("k").acquire().await.unwrap();
    await_holder_listening(&mut raw, &m, "k").await;
    warm_up.release().await.unwrap();
    reset_stats(&mut raw).await;
    for _ in 0..100 {
        let g = m
            .lock("k")
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        g.release().await.unwrap();
    }
    let calls = command_calls(&mut raw).await;
    assert_eq!(calls.values().sum::<u64>(), 400, "{calls:#?}");
    assert_eq!(calls.get("set"), Some(&100), "{calls:#?}");
    assert_eq!(calls.get("evalsha"), Some(&100), "{calls:#?}");
    assert_eq!(calls.get("publish"), None, "{calls:#?}");
    assert_eq!(calls.get("time"), None, "{calls:#?}");
}

/// Nothing on the acquire path waits for the hand-off channel's
/// subscription: with a user that may not subscribe there (the subscription
/// never comes), a fresh manager's first cycle and the next ones take their
/// two round trips as ever.
#[tokio::test]
async fn a_cycle_never_waits_for_the_handoff_subscription() {
    let redis = server();
    let mut raw = raw(&redis).await;
    // Every channel to publish on; SUBSCRIBE only to locks' wake-up
    // channels (a selector), which the build checks.
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nosub",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-subscribe",
            "(+subscribe ~* &distlock:wake:*)",
        ])
        .query_async(&mut raw)
        .await
        .unwrap();
    let url = redis.url().replacen("redis://", "redis://nosub:pw@", 1);
    let m = manager_at(&url).await;
    for i in 0..10 {
        // Each bounded by the command timeout (500 ms), far below the 5 s
        // allowed here: a cycle that waited for a subscription that never
        // comes would not finish at all.
        tokio::time::timeout(Duration::from_secs(5), async {
            let g = m.lock(format!("k{i}")).acquire().await.unwrap();
            g.release().await.unwrap();
        })
        .await
        .expect("the cycle finishes");
    }
    let listened: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("distlock:handoff:*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(listened.is_empty(), "{listened:?}");
}
