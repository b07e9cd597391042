//! Support code of the distlock torture suite (Jepsen-style): worker processes that
//! take locks under faults and log every critical section, and a checker that reads
//! those logs afterwards.
//!
//! - [`clock`]: `CLOCK_MONOTONIC` in nanoseconds, comparable across the processes of
//!   one machine (std's `Instant` is not comparable across processes).
//! - [`history`]: the log records workers append (one line per critical section,
//!   call or zombie write) and their parser.
//! - [`checker`]: mutual exclusion, fencing-token order and fenced-store checks.
//! - [`store`]: the fenced store, a Redis hash written by a Lua script that rejects
//!   writes carrying a token lower than the highest it has seen.
//! - [`process`]: starting, signalling and talking to worker processes from tests.
//! - [`results`]: runs as data: a scenario's figures written as a JSON file when
//!   `TORTURE_RESULTS` asks for it, and read back by `torture-history`.
//!
//! The worker itself is `src/bin/torture-worker.rs`; the scenarios are in
//! `tests/`, one file per deployment, sharing `tests/support/`.

pub mod checker;
pub mod clock;
pub mod history;
pub mod process;
pub mod results;
pub mod store;

/// Multiplier of run sizes: 20 when `DISTLOCK_SOAK=1`, else 1.
pub fn soak_factor() -> u64 {
    match std::env::var("DISTLOCK_SOAK") {
        Ok(v) if v == "1" || v.eq_ignore_ascii_case("true") => 20,
        _ => 1,
    }
}
