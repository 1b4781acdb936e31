//! Test infrastructure.
