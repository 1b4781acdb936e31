// SPDX-License-Identifier: Apache-2.0
//! Throttled warnings for events a guest can trigger at will.
//!
//! A hostile or buggy driver can send millions of malformed requests; logging
//! each one at `warn!` would let it fill the host's disk. Each call site of
//! [`guest_warn!`] logs its first [`BURST`] occurrences, then only the
//! occurrences whose count is a power of two, so the log grows with the
//! logarithm of the abuse while still showing that it continues.

use std::sync::atomic::{AtomicU64, Ordering};

/// Occurrences logged unconditionally before throttling starts.
const BURST: u64 = 8;

/// Occurrence counter of one call site.
#[derive(Debug)]
pub(crate) struct WarnLimiter(AtomicU64);

impl WarnLimiter {
    pub(crate) const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Counts one occurrence; returns its 1-based number when it should be
    /// logged.
    pub(crate) fn allow(&self) -> Option<u64> {
        let seen = self.0.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        (seen <= BURST || seen.is_power_of_two()).then_some(seen)
    }
}

/// `warn!` for guest-triggerable conditions, throttled per call site.
macro_rules! guest_warn {
    ($($arg:tt)+) => {{
        static LIMITER: $crate::ratelimit::WarnLimiter = $crate::ratelimit::WarnLimiter::new();
        if let Some(seen) = LIMITER.allow() {
            log::warn!("{} (occurrence {seen})", format_args!($($arg)+));
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_powers_of_two() {
        let limiter = WarnLimiter::new();
        let logged: Vec<u64> = (0..100).filter_map(|_| limiter.allow()).collect();
        assert_eq!(logged, vec![1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64]);
    }
}
