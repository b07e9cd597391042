//! No code: this package holds the compile tests of `#[distributed_lock]`
//! apart from the facade's other tests: the mistakes that must fail
//! (`tests/ui.rs`, trybuild, which checks its cases against the few crates
//! they use) and the expansions that must compile (`tests/ui/pass/`, test
//! targets of their own). Not published.
