//! A model of the default lock's protocol (issue 21: the fair lock and the
//! cheap lock at once), explored for every interleaving of small
//! configurations with the [`stateright`] model checker.
//!
//! Each script run is one atomic model step, as Redis runs a script or a
//! single command atomically. The map from model step to what it stands for,
//! to keep them in step when a script changes (scripts live in
//! `lock-runtime/src/scripts/`):
//!
//! | model step ([`Action`])          | stands for                                                   |
//! |----------------------------------|--------------------------------------------------------------|
//! | `Take`                           | `SET lock "<owner>-0:<since>:<holder>" NX PX lease GET` (no script) |
//! | `AcquireLua`                     | `acquire.lua` (eager token or not; waiting attempt or not)   |
//! | `ReleaseLua`                     | `release.lua` (with `release_queue.lua`, its queued part, in issue 21's rewrite) by the holder (hand-off on `+`, DEL on `-`, optional min_hold `PEXPIRE keep_ms`), by a told holder's guard, or by the in-flight guard after a lost reply |
//! | `ReleaseLuaGivingUp`             | `release.lua` by a waiter that gave up (not ours: drop our entry, hand a free lock to the head) |
//! | `RenewLua`                       | `renew.lua`                                                  |
//! | `IssueTokenLua`                  | `issue_token.lua` (fencing on demand; the script is new with issue 21) |
//! | `ReceiveHandoff`                 | the `=<owner>:<token>` message on `wake:{tag}:K:<route>`     |
//! | `LoseHandoff`                    | that message lost (the waiter's next `acquire.lua` finds the lock its own) |
//! | `LocalDeadlinePasses`            | the client's local lease deadline passing (it is told of the loss) |
//! | `LockKeyExpires`                 | the lock key's TTL running out (only after its holder was told) |
//! | `QueueEntryExpires`              | a queue entry's queue lease running out (`lockqe` expiry field) |
//! | `QueueKeysExpire`                | `lockq`/`lockqe` TTL (PEXPIRE queue_lease) running out        |
//! | `FenceCounterExpires`            | `fence:{tag}:K` TTL (lease + retention) running out           |
//! | `Pause` / `Resume`               | a holder process stopped and resumed                         |
//! | `Crash`                          | a client process gone for good                               |
//!
//! The queue helpers (`live_head`, `hand_off`, `remove_entry`) stand for the
//! shared queue prelude (`fair_prelude.lua`, `queue_prelude.lua` in issue 21's
//! rewrite): expired entries met at the head are dropped, a hand-off sets the
//! lock in the head's name, issues a token only for an eager entry, removes
//! the entry and keeps `+` while others queue.
//!
//! Time is abstracted as the order of events: a holder's local deadline
//! passes strictly before the server's TTL of its grant (the client counts
//! from before it sent the attempt, minus a drift margin; for a hand-off,
//! from its last attempt, which precedes the hand-off), so the lock key may
//! expire only once its holder was told, or when nobody believes it holds it
//! (a crashed client, a lost reply, a released min_hold key, a hand-off whose
//! message was lost or arrives after the waiter's deadline). The server clock
//! in microseconds only matters for tokens issued when the counter is gone;
//! it advances by at least one for every token and for the counter's expiry.
//!
//! What the checker found in the design: a waiter that counts a hand-off's
//! lease from its last attempt ([`HandoffLeaseFrom::LastAttempt`], issue 21's
//! design and today's `request.rs`) can hold a lock another client holds, when
//! an attempt sent after the hand-off found the handed-off grant expired and
//! the lock taken, and the hand-off message is heard after that attempt. The
//! model checks the fix ([`HandoffLeaseFrom::EchoedAttempt`]);
//! `tests/exhaustive.rs` shows the interleaving.
//!
//! Not modelled: Redlock (it keeps the unqueued protocol), several keys in
//! one acquisition and their wake-up channel, re-entry, the read-write lock
//! and semaphore, failover or replication lag, and renewals that are in
//! flight while the deadline passes (a refused renewal only tells the holder,
//! which the deadline has already done).

use stateright::{Model, Property};

/// Which faults the environment may inject; small configurations turn all
/// on, larger ones leave some off to stay within CI's budget.
#[derive(Clone, Copy, Debug)]
pub struct Faults {
    /// A client process may stop for good at any step.
    pub crash: bool,
    /// A reply to `take` or `acquire.lua` may be lost after the script ran.
    pub lost_reply: bool,
    /// A holder may be paused (it does not act; its local clock runs).
    pub pause: bool,
    /// A holder may release with min_hold left (`PEXPIRE keep_ms`).
    pub min_hold: bool,
    /// A waiter may give up (its `release.lua` drops its queue entry).
    pub give_up: bool,
    /// A waiting client may stall past its queue lease (its entry expires).
    pub stalled_waiter: bool,
}

impl Faults {
    /// Every fault the model knows.
    pub const ALL: Faults = Faults {
        crash: true,
        lost_reply: true,
        pause: true,
        min_hold: true,
        give_up: true,
        stalled_waiter: true,
    };
}

/// A step broken on purpose, to show that the checker catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sabotage {
    /// The real protocol.
    None,
    /// `release.lua` deletes or hands off the lock without checking its owner.
    ReleaseIgnoresOwner,
    /// The hand-off sets the lock in the head's name but leaves its queue entry.
    HandoffKeepsHeadEntry,
    /// `issue_token.lua` issues or returns a token without checking the owner.
    IssueTokenIgnoresOwner,
    /// `acquire.lua` takes a free lock even when a live waiter heads the queue.
    AcquireIgnoresQueueHead,
}

/// The protocol model: `clients` clients on `keys` keys (client `c` uses key
/// `c % keys`), each acquiring once.
#[derive(Clone, Debug)]
pub struct LockModel {
    /// Number of clients (2-3 keeps exhaustive exploration short).
    pub clients: usize,
    /// Number of keys (1-2).
    pub keys: usize,
    /// The faults the environment may inject.
    pub faults: Faults,
    /// A deliberately broken step, or `Sabotage::None`.
    pub sabotage: Sabotage,
    /// From which attempt a waiter counts the lease of a hand-off it hears.
    pub handoff_lease_from: HandoffLeaseFrom,
}

/// From which attempt a waiter counts the lease of a hand-off it hears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandoffLeaseFrom {
    /// Its last attempt, as issue 21's design states and `request.rs` does
    /// today. Unsafe: an attempt sent after the hand-off (which found the
    /// handed-off grant already expired and the lock taken by another) moves
    /// the count later than the hand-off; the message heard after it then
    /// grants a lock that another client holds. The checker finds it.
    LastAttempt,
    /// The attempt that last refreshed its queue entry before the hand-off,
    /// named in the hand-off message (`=<owner>:<token>:<attempt>`, the entry
    /// keeping the attempt's number): always before the hand-off.
    EchoedAttempt,
}

/// A hand-off message on its way to a waiter.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Handoff {
    /// No message on its way.
    None,
    /// A message carrying this token (0 = none) is on its way.
    Pending(u64),
    /// The message is on its way but the waiter's local deadline (counted
    /// from its last attempt) has already passed: on receipt it is told.
    PendingStale(u64),
}

/// What a client is doing.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Client {
    /// Has not attempted yet.
    Idle,
    /// Waiting: its next attempts run `acquire.lua` (eager or not).
    Waiting {
        /// Asks for a fencing token with the grant.
        eager: bool,
        /// A hand-off message on its way.
        handoff: Handoff,
    },
    /// Believes it holds the lock (until `told`).
    Holding {
        /// The fencing token it was given (0 = none yet).
        token: u64,
        /// Its local deadline passed or a script refused it: it knows the lock is lost.
        told: bool,
        /// Stopped: takes no step until resumed.
        paused: bool,
    },
    /// A reply was lost: its in-flight guard will release by owner.
    Releasing,
    /// Finished (released, gave up, or refused).
    Done,
    /// Gone for good.
    Crashed,
}

/// The lock key's value.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct LockValue {
    /// The owning client.
    pub owner: u8,
    /// The `+` mark: someone waits, so release hands off.
    pub plus: bool,
    /// The fencing token in the value (0 = none issued).
    pub token: u64,
    /// Kept by a release with min_hold left (`PEXPIRE keep_ms`).
    pub kept: bool,
}

/// A queue entry (`lockq` member with its `lockqe` fields).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Entry {
    /// The waiting client.
    pub client: u8,
    /// A token is issued with the hand-off.
    pub eager: bool,
    /// Its queue lease has not run out.
    pub alive: bool,
}

/// Redis state of one key, plus the history the properties look at.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct KeyState {
    /// `lock:{tag}:K`.
    pub lock: Option<LockValue>,
    /// `lockq`/`lockqe`, in arrival order.
    pub queue: Vec<Entry>,
    /// `fence:{tag}:K`.
    pub fence: Option<u64>,
    /// Tokens in the order clients were given them: (client, token).
    pub tokens_given: Vec<(u8, u64)>,
    /// An `acquire.lua` granted a free lock to a client while another
    /// client's live entry headed the queue.
    pub head_overtaken: bool,
}

/// The whole model state.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    /// One per client.
    pub clients: Vec<Client>,
    /// One per key.
    pub keys: Vec<KeyState>,
    /// The server clock in µs (abstract: only its order matters).
    pub clock: u64,
}

/// A model step (see the crate documentation for the scripts they stand for).
/// `client` and `key` are indexes; `reply_lost` means the script ran but its
/// reply never reached the client, whose in-flight guard then releases by
/// owner in the background.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `SET NX PX GET`: an uncontended attempt without a token.
    Take { client: u8, reply_lost: bool },
    /// `acquire.lua`: with an eager token or not, queuing (`waiting`) or not.
    AcquireLua {
        client: u8,
        eager: bool,
        waiting: bool,
        reply_lost: bool,
    },
    /// `release.lua` by the holder (or its guard), with min_hold left or not.
    ReleaseLua { client: u8, keep_min_hold: bool },
    /// `release.lua` by a waiter that gave up.
    ReleaseLuaGivingUp { client: u8 },
    /// `renew.lua`.
    RenewLua { client: u8 },
    /// `issue_token.lua` (the holder's first `fencing_token()`).
    IssueTokenLua { client: u8 },
    /// The hand-off message reaches the waiter.
    ReceiveHandoff { client: u8 },
    /// The hand-off message is lost.
    LoseHandoff { client: u8 },
    /// The client's local lease deadline passes.
    LocalDeadlinePasses { client: u8 },
    /// The lock key's TTL runs out.
    LockKeyExpires { key: u8 },
    /// A queue entry's queue lease runs out.
    QueueEntryExpires { key: u8, client: u8 },
    /// The queue keys' TTL runs out (every entry expired).
    QueueKeysExpire { key: u8 },
    /// The fencing counter's TTL runs out.
    FenceCounterExpires { key: u8 },
    /// The holder's process stops.
    Pause { client: u8 },
    /// The holder's process resumes.
    Resume { client: u8 },
    /// The client's process is gone for good.
    Crash { client: u8 },
}

/// What `take` or `acquire.lua` replied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reply {
    Taken(u64),
    Busy,
}

const FIRST_CLOCK_US: u64 = 1_000;

/// Renames every token and clock value to its rank, two apart, keeping their
/// order. Only the order of tokens matters to the scripts (counter + 1, or
/// the clock when the counter is gone) and to the properties, but each
/// hand-off to an eager waiter burns a token, so without this a waiter whose
/// hand-off messages keep getting lost would make the state space infinite.
/// Ranks two apart leave room for `counter + 1` below the next value.
fn normalize_tokens(state: &mut State) {
    let mut values: Vec<u64> = vec![state.clock];
    for k in &state.keys {
        values.extend(k.lock.as_ref().map(|l| l.token));
        values.extend(k.fence);
        values.extend(k.tokens_given.iter().map(|(_, t)| *t));
    }
    for c in &state.clients {
        match c {
            Client::Holding { token, .. }
            | Client::Waiting {
                handoff: Handoff::Pending(token) | Handoff::PendingStale(token),
                ..
            } => values.push(*token),
            _ => {}
        }
    }
    values.retain(|v| *v != 0);
    values.sort_unstable();
    values.dedup();
    let rank = |v: &mut u64| {
        if *v != 0 {
            let i = values.binary_search(v).unwrap_or_default() as u64;
            *v = FIRST_CLOCK_US + 2 * i;
        }
    };
    rank(&mut state.clock);
    for k in &mut state.keys {
        if let Some(l) = &mut k.lock {
            rank(&mut l.token);
        }
        if let Some(f) = &mut k.fence {
            rank(f);
        }
        for (_, t) in &mut k.tokens_given {
            rank(t);
        }
    }
    for c in &mut state.clients {
        match c {
            Client::Holding { token, .. }
            | Client::Waiting {
                handoff: Handoff::Pending(token) | Handoff::PendingStale(token),
                ..
            } => rank(token),
            _ => {}
        }
    }
}

impl LockModel {
    /// A model of the real protocol with every fault.
    pub fn new(clients: usize, keys: usize) -> Self {
        LockModel {
            clients,
            keys,
            faults: Faults::ALL,
            sabotage: Sabotage::None,
            handoff_lease_from: HandoffLeaseFrom::EchoedAttempt,
        }
    }

    fn key_of(&self, client: u8) -> usize {
        client as usize % self.keys
    }

    /// May the lock key's TTL run out now? Only when nobody believes it holds
    /// the lock, or the holder was told (its local deadline comes first).
    fn lock_may_expire(state: &State, owner: u8) -> bool {
        match &state.clients[owner as usize] {
            Client::Holding { told, .. } => *told,
            Client::Waiting {
                handoff: Handoff::Pending(_),
                ..
            } => false,
            Client::Idle => false,
            _ => true,
        }
    }

    fn issue_token(state: &mut State, key: usize) -> u64 {
        // Counter + 1, or server time in µs when the counter is gone; a script
        // takes at least a µs, so the counter never overtakes the clock.
        let token = match state.keys[key].fence {
            Some(counter) => counter + 1,
            None => state.clock,
        };
        state.keys[key].fence = Some(token);
        state.clock += 1;
        token
    }

    /// Drops expired entries met at the head; returns the live head.
    fn live_head(state: &mut State, key: usize) -> Option<Entry> {
        let queue = &mut state.keys[key].queue;
        while queue.first().is_some_and(|e| !e.alive) {
            queue.remove(0);
        }
        queue.first().cloned()
    }

    fn remove_entry(state: &mut State, key: usize, client: u8) {
        state.keys[key].queue.retain(|e| e.client != client);
    }

    /// The hand-off (release.lua, acquire.lua): the lock to the live head, or DEL.
    fn hand_off(&self, state: &mut State, key: usize) {
        match Self::live_head(state, key) {
            Some(head) => {
                let token = if head.eager {
                    Self::issue_token(state, key)
                } else {
                    0
                };
                if self.sabotage != Sabotage::HandoffKeepsHeadEntry {
                    Self::remove_entry(state, key, head.client);
                }
                let plus = !state.keys[key].queue.is_empty();
                state.keys[key].lock = Some(LockValue {
                    owner: head.client,
                    plus,
                    token,
                    kept: false,
                });
                if let Client::Waiting { handoff, .. } = &mut state.clients[head.client as usize] {
                    *handoff = Handoff::Pending(token);
                }
            }
            None => state.keys[key].lock = None,
        }
    }

    fn acquire_lua(&self, state: &mut State, client: u8, eager: bool, waiting: bool) -> Reply {
        let key = self.key_of(client);
        if let Some(lock) = &state.keys[key].lock {
            if lock.owner == client {
                let token = lock.token;
                Self::remove_entry(state, key, client);
                return Reply::Taken(token);
            }
        } else {
            // The observer for property 3: who heads the queue before the script.
            let head_before = state.keys[key]
                .queue
                .iter()
                .find(|e| e.alive)
                .map(|e| e.client);
            let head = Self::live_head(state, key);
            let ours_to_take = match &head {
                None => true,
                Some(h) => h.client == client,
            };
            if ours_to_take || self.sabotage == Sabotage::AcquireIgnoresQueueHead {
                if let Some(h) = head_before {
                    if h != client && matches!(state.clients[h as usize], Client::Waiting { .. }) {
                        state.keys[key].head_overtaken = true;
                    }
                }
                let token = if eager {
                    Self::issue_token(state, key)
                } else {
                    0
                };
                Self::remove_entry(state, key, client);
                let plus = !state.keys[key].queue.is_empty();
                state.keys[key].lock = Some(LockValue {
                    owner: client,
                    plus,
                    token,
                    kept: false,
                });
                return Reply::Taken(token);
            }
            self.hand_off(state, key);
        }
        if waiting {
            let queue = &mut state.keys[key].queue;
            match queue.iter_mut().find(|e| e.client == client) {
                Some(entry) => entry.alive = true,
                None => queue.push(Entry {
                    client,
                    eager,
                    alive: true,
                }),
            }
            if let Some(lock) = &mut state.keys[key].lock {
                lock.plus = true;
            }
        }
        Reply::Busy
    }

    fn take(&self, state: &mut State, client: u8) -> Reply {
        let key = self.key_of(client);
        if state.keys[key].lock.is_some() {
            return Reply::Busy;
        }
        state.keys[key].lock = Some(LockValue {
            owner: client,
            plus: false,
            token: 0,
            kept: false,
        });
        Reply::Taken(0)
    }

    fn release_lua(&self, state: &mut State, client: u8, keep_min_hold: bool) {
        let key = self.key_of(client);
        let ours = match &state.keys[key].lock {
            Some(lock) => lock.owner == client || self.sabotage == Sabotage::ReleaseIgnoresOwner,
            None => false,
        };
        if ours {
            if keep_min_hold {
                if let Some(lock) = &mut state.keys[key].lock {
                    lock.kept = true;
                }
            } else if state.keys[key].lock.as_ref().is_some_and(|l| l.plus) {
                self.hand_off(state, key);
            } else {
                state.keys[key].lock = None;
            }
        } else {
            Self::remove_entry(state, key, client);
            if state.keys[key].lock.is_none() && Self::live_head(state, key).is_some() {
                self.hand_off(state, key);
            }
        }
    }

    fn give_token(state: &mut State, key: usize, client: u8, token: u64) {
        if token != 0 {
            state.keys[key].tokens_given.push((client, token));
        }
    }

    /// Applies a `take`/`acquire.lua` reply to the client.
    fn on_reply(
        state: &mut State,
        key: usize,
        client: u8,
        reply: Reply,
        reply_lost: bool,
        next: Client,
        lease_from: HandoffLeaseFrom,
    ) {
        if reply_lost {
            state.clients[client as usize] = Client::Releasing;
            return;
        }
        match reply {
            Reply::Taken(token) => {
                Self::give_token(state, key, client, token);
                state.clients[client as usize] = Client::Holding {
                    token,
                    told: false,
                    paused: false,
                };
            }
            Reply::Busy => {
                // A pending hand-off stays pending across a busy attempt.
                if let (Client::Waiting { handoff, .. }, Client::Waiting { .. }) =
                    (&mut state.clients[client as usize], &next)
                {
                    // Counting from the last attempt restarts the count of a
                    // hand-off that came before this attempt.
                    if let (HandoffLeaseFrom::LastAttempt, Handoff::PendingStale(token)) =
                        (lease_from, &*handoff)
                    {
                        *handoff = Handoff::Pending(*token);
                    }
                    return;
                }
                state.clients[client as usize] = next;
            }
        }
    }

    /// The live waiter heading `key`'s queue, if any.
    fn waiting_head(state: &State, key: usize) -> Option<(u8, bool)> {
        let head = state.keys[key].queue.iter().find(|e| e.alive)?;
        match &state.clients[head.client as usize] {
            Client::Waiting { eager, .. } => Some((head.client, *eager)),
            _ => None,
        }
    }

    fn environment_steps_left(&self, state: &State) -> bool {
        let mut actions = Vec::new();
        self.environment_actions(state, &mut actions);
        !actions.is_empty()
    }

    fn environment_actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (k, ks) in state.keys.iter().enumerate() {
            let key = k as u8;
            if let Some(lock) = &ks.lock {
                if Self::lock_may_expire(state, lock.owner) {
                    actions.push(Action::LockKeyExpires { key });
                }
            }
            for e in ks.queue.iter().filter(|e| e.alive) {
                let waiting = matches!(state.clients[e.client as usize], Client::Waiting { .. });
                if !waiting || self.faults.stalled_waiter {
                    actions.push(Action::QueueEntryExpires {
                        key,
                        client: e.client,
                    });
                }
            }
            if !ks.queue.is_empty() && ks.queue.iter().all(|e| !e.alive) {
                actions.push(Action::QueueKeysExpire { key });
            }
            if let Some(counter) = ks.fence {
                // Its TTL is lease + retention from its last write: it outlives
                // the grant that wrote it.
                if ks.lock.as_ref().is_none_or(|l| l.token != counter) {
                    actions.push(Action::FenceCounterExpires { key });
                }
            }
        }
    }
}

impl Model for LockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let key = KeyState {
            lock: None,
            queue: Vec::new(),
            fence: None,
            tokens_given: Vec::new(),
            head_overtaken: false,
        };
        vec![State {
            clients: vec![Client::Idle; self.clients],
            keys: vec![key; self.keys],
            clock: FIRST_CLOCK_US,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let lost = if self.faults.lost_reply {
            &[false, true][..]
        } else {
            &[false][..]
        };
        for (i, c) in state.clients.iter().enumerate() {
            let client = i as u8;
            match c {
                Client::Idle => {
                    for &reply_lost in lost {
                        actions.push(Action::Take { client, reply_lost });
                        actions.push(Action::AcquireLua {
                            client,
                            eager: true,
                            waiting: true,
                            reply_lost,
                        });
                        actions.push(Action::AcquireLua {
                            client,
                            eager: true,
                            waiting: false,
                            reply_lost,
                        });
                    }
                }
                Client::Waiting { eager, handoff } => {
                    for &reply_lost in lost {
                        actions.push(Action::AcquireLua {
                            client,
                            eager: *eager,
                            waiting: true,
                            reply_lost,
                        });
                    }
                    if self.faults.give_up {
                        actions.push(Action::ReleaseLuaGivingUp { client });
                    }
                    if *handoff != Handoff::None {
                        actions.push(Action::ReceiveHandoff { client });
                        actions.push(Action::LoseHandoff { client });
                    }
                    if matches!(handoff, Handoff::Pending(_)) {
                        actions.push(Action::LocalDeadlinePasses { client });
                    }
                }
                Client::Holding {
                    told,
                    paused,
                    token,
                } => {
                    if *paused {
                        actions.push(Action::Resume { client });
                    } else if *told {
                        // A fencing_token() sent before the deadline, still in flight.
                        if *token == 0 {
                            actions.push(Action::IssueTokenLua { client });
                        }
                        actions.push(Action::ReleaseLua {
                            client,
                            keep_min_hold: false,
                        });
                    } else {
                        actions.push(Action::RenewLua { client });
                        if *token == 0 {
                            actions.push(Action::IssueTokenLua { client });
                        }
                        actions.push(Action::ReleaseLua {
                            client,
                            keep_min_hold: false,
                        });
                        if self.faults.min_hold {
                            actions.push(Action::ReleaseLua {
                                client,
                                keep_min_hold: true,
                            });
                        }
                        if self.faults.pause {
                            actions.push(Action::Pause { client });
                        }
                    }
                    if !*told {
                        actions.push(Action::LocalDeadlinePasses { client });
                    }
                }
                Client::Releasing => actions.push(Action::ReleaseLua {
                    client,
                    keep_min_hold: false,
                }),
                Client::Done | Client::Crashed => {}
            }
            if self.faults.crash && !matches!(c, Client::Done | Client::Crashed) {
                actions.push(Action::Crash { client });
            }
        }
        self.environment_actions(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut s = state.clone();
        match action {
            Action::Take { client, reply_lost } => {
                let key = self.key_of(client);
                let reply = self.take(&mut s, client);
                let next = Client::Waiting {
                    eager: false,
                    handoff: Handoff::None,
                };
                Self::on_reply(
                    &mut s,
                    key,
                    client,
                    reply,
                    reply_lost,
                    next,
                    self.handoff_lease_from,
                );
            }
            Action::AcquireLua {
                client,
                eager,
                waiting,
                reply_lost,
            } => {
                let key = self.key_of(client);
                let reply = self.acquire_lua(&mut s, client, eager, waiting);
                let next = if waiting {
                    Client::Waiting {
                        eager,
                        handoff: Handoff::None,
                    }
                } else {
                    Client::Done
                };
                Self::on_reply(
                    &mut s,
                    key,
                    client,
                    reply,
                    reply_lost,
                    next,
                    self.handoff_lease_from,
                );
            }
            Action::ReleaseLua {
                client,
                keep_min_hold,
            } => {
                self.release_lua(&mut s, client, keep_min_hold);
                s.clients[client as usize] = Client::Done;
            }
            Action::ReleaseLuaGivingUp { client } => {
                self.release_lua(&mut s, client, false);
                s.clients[client as usize] = Client::Done;
            }
            Action::RenewLua { client } => {
                let key = self.key_of(client);
                let ours = s.keys[key].lock.as_ref().is_some_and(|l| l.owner == client);
                if !ours {
                    if let Client::Holding { told, .. } = &mut s.clients[client as usize] {
                        *told = true;
                    }
                }
            }
            Action::IssueTokenLua { client } => {
                let key = self.key_of(client);
                let ours = match &s.keys[key].lock {
                    Some(l) => {
                        l.owner == client || self.sabotage == Sabotage::IssueTokenIgnoresOwner
                    }
                    None => false,
                };
                if ours {
                    let in_value = s.keys[key].lock.as_ref().map_or(0, |l| l.token);
                    let token = if in_value != 0 {
                        in_value
                    } else {
                        let t = Self::issue_token(&mut s, key);
                        if let Some(l) = &mut s.keys[key].lock {
                            l.token = t;
                        }
                        t
                    };
                    Self::give_token(&mut s, key, client, token);
                    if let Client::Holding { token: held, .. } = &mut s.clients[client as usize] {
                        *held = token;
                    }
                } else if let Client::Holding { told, .. } = &mut s.clients[client as usize] {
                    *told = true;
                }
            }
            Action::ReceiveHandoff { client } => {
                let key = self.key_of(client);
                let (token, told) = match &s.clients[client as usize] {
                    Client::Waiting {
                        handoff: Handoff::Pending(t),
                        ..
                    } => (*t, false),
                    Client::Waiting {
                        handoff: Handoff::PendingStale(t),
                        ..
                    } => (*t, true),
                    _ => return None,
                };
                // A waiter that knows the grant is already lost does not use its token.
                if !told {
                    Self::give_token(&mut s, key, client, token);
                }
                s.clients[client as usize] = Client::Holding {
                    token,
                    told,
                    paused: false,
                };
            }
            Action::LoseHandoff { client } => {
                if let Client::Waiting { handoff, .. } = &mut s.clients[client as usize] {
                    *handoff = Handoff::None;
                }
            }
            Action::LocalDeadlinePasses { client } => match &mut s.clients[client as usize] {
                Client::Holding { told, .. } => *told = true,
                Client::Waiting { handoff, .. } => {
                    if let Handoff::Pending(t) = handoff {
                        *handoff = Handoff::PendingStale(*t);
                    }
                }
                _ => return None,
            },
            Action::LockKeyExpires { key } => s.keys[key as usize].lock = None,
            Action::QueueEntryExpires { key, client } => {
                for e in s.keys[key as usize]
                    .queue
                    .iter_mut()
                    .filter(|e| e.client == client)
                {
                    e.alive = false;
                }
            }
            Action::QueueKeysExpire { key } => s.keys[key as usize].queue.clear(),
            Action::FenceCounterExpires { key } => {
                s.keys[key as usize].fence = None;
                s.clock += 1;
            }
            Action::Pause { client } | Action::Resume { client } => {
                if let Client::Holding { paused, .. } = &mut s.clients[client as usize] {
                    *paused = !*paused;
                }
            }
            Action::Crash { client } => s.clients[client as usize] = Client::Crashed,
        }
        normalize_tokens(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "1. at most one holder not told of a loss",
                |m: &LockModel, s: &State| {
                    (0..m.keys).all(|k| {
                        let holders = s.clients.iter().enumerate().filter(|(c, client)| {
                            m.key_of(*c as u8) == k
                                && matches!(client, Client::Holding { told: false, .. })
                        });
                        holders.count() <= 1
                    })
                },
            ),
            Property::always(
                "2. tokens strictly increase across holders",
                |_: &LockModel, s: &State| {
                    s.keys
                        .iter()
                        .all(|k| k.tokens_given.windows(2).all(|w| w[0].1 < w[1].1))
                },
            ),
            // Liveness as a bounded-steps invariant: once the holder is gone
            // (key absent, or released and not kept by min_hold), the live head's
            // very next `acquire.lua` takes the lock. A live waiter attempts
            // every 0.4-0.8 s (within its 3 s queue lease), so that bound is one
            // refresh interval; a holder that is gone without releasing (crash,
            // told of a loss) adds its key's TTL (the `LockKeyExpires` step).
            Property::always(
                "3. a live head waiter takes a gone holder's lock at its next attempt",
                |m: &LockModel, s: &State| {
                    (0..m.keys).all(|k| {
                        let Some((head, eager)) = LockModel::waiting_head(s, k) else {
                            return true;
                        };
                        let holder_gone = match &s.keys[k].lock {
                            None => true,
                            Some(l) => !l.kept && s.clients[l.owner as usize] == Client::Done,
                        };
                        if !holder_gone {
                            return true;
                        }
                        let mut next = s.clone();
                        m.acquire_lua(&mut next, head, eager, true) != Reply::Busy
                    })
                },
            ),
            Property::always(
                "3b. no attempt overtakes a live head waiter",
                |_: &LockModel, s: &State| s.keys.iter().all(|k| !k.head_overtaken),
            ),
            Property::always(
                "4. nothing remains once every client is gone and every lease ran out",
                |m: &LockModel, s: &State| {
                    let all_gone = s
                        .clients
                        .iter()
                        .all(|c| matches!(c, Client::Done | Client::Crashed));
                    if !all_gone || m.environment_steps_left(s) {
                        return true;
                    }
                    s.keys
                        .iter()
                        .all(|k| k.lock.is_none() && k.queue.is_empty() && k.fence.is_none())
                },
            ),
            Property::sometimes(
                "reachable: two holders given tokens in turn",
                |_: &LockModel, s: &State| {
                    s.clients
                        .iter()
                        .any(|c| matches!(c, Client::Holding { .. }))
                        && s.keys.iter().any(|k| k.tokens_given.len() >= 2)
                },
            ),
        ]
    }
}
