//! The scenarios. Each one measures the floor(s) (hand-written redis-rs),
//! distlock and, where it fits, the rslock peer, in the same process against the
//! same private Redis, interleaving them where the machine's load could drift.

pub mod common;
pub mod fresh_handoff;
pub mod handoff;
pub mod macro_cycle;
pub mod many_keys;
pub mod memory;
pub mod parked_handoff;
pub mod parked_procs;
pub mod processes;
pub mod renewal;
pub mod uncontended;

/// Names accepted by `--scenario`, in running order.
pub const ALL: &[&str] = &[
    "uncontended",
    "many-keys",
    "handoff",
    "fresh-handoff",
    "parked-handoff",
    "renewal",
    "memory",
    "macro",
    // The PostgreSQL pass only (`--backend postgres`).
    "lock-all",
    "shared",
    "leader",
];
