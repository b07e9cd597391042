//! No code: this package holds the compile tests of `#[distributed_lock]`
//! (`tests/ui.rs`, trybuild) apart from the facade's other tests, so that
//! trybuild builds its cases against the few crates they use. Not published.
