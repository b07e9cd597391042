//! The `#[distributed_lock]` attribute macro of distlock (being written).
