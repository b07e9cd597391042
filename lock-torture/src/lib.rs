//! Torture suite support (being written).
