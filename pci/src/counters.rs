// SPDX-License-Identifier: Apache-2.0
//! What a device counts, for the VMM's `vm.counters` endpoint.
//!
//! A device hands the VMM a [`DeviceCounters`] handle when it is created:
//! its atomics, or its state behind a lock the device only holds briefly.
//! The VMM reads it while the device runs, never through the device's own
//! mutex on the bus (vCPU exits wait on that one).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one device, readable at any time from any thread.
pub trait DeviceCounters: Send + Sync {
    /// Every counter with its name, in a fixed order (zeros included, so
    /// that a reader sees which counters exist).
    fn values(&self) -> Vec<(&'static str, u64)>;

    /// The counters each queue pair keeps, for devices that have queue
    /// pairs (RDMA); `None` for the others.
    fn queue_pairs(&self) -> Option<Vec<QueuePairCounters>> {
        None
    }
}

/// The counters of one queue pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuePairCounters {
    /// The QP number the guest and its peers see.
    pub qpn: u32,
    /// The QP is in the error state.
    pub error: bool,
    /// Every counter with its name, as in [`DeviceCounters::values`].
    pub values: Vec<(&'static str, u64)>,
}

/// A monotonic event counter, shared between a device's threads.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Counts one event; returns the new total.
    pub fn inc(&self) -> u64 {
        self.add(1)
    }

    /// Counts `n` events; returns the new total.
    pub fn add(&self, n: u64) -> u64 {
        self.0.fetch_add(n, Ordering::Relaxed).wrapping_add(n)
    }

    /// The current total.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Declares a device's counters once: a struct of [`Counter`]s and its
/// [`DeviceCounters`] implementation listing them in declaration order.
///
/// ```
/// pci::device_counters! {
///     /// Counters of a toy device.
///     pub struct ToyCounters {
///         /// Requests served.
///         requests,
///     }
/// }
/// use pci::DeviceCounters;
/// let c = ToyCounters::default();
/// c.requests.inc();
/// assert_eq!(c.values(), [("requests", 1)]);
/// ```
#[macro_export]
macro_rules! device_counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$doc:meta])* $field:ident, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $( $(#[$doc])* pub $field: $crate::Counter, )*
        }

        impl $crate::DeviceCounters for $name {
            fn values(&self) -> Vec<(&'static str, u64)> {
                vec![$( (stringify!($field), self.$field.get()) ),*]
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    device_counters! {
        /// Two counters.
        struct Pair {
            /// First.
            a,
            /// Second.
            b,
        }
    }

    #[test]
    fn values_in_declaration_order() {
        let p = Pair::default();
        assert_eq!(p.b.add(3), 3);
        assert_eq!(p.b.inc(), 4);
        assert_eq!(p.values(), [("a", 0), ("b", 4)]);
        assert_eq!(p.queue_pairs(), None);
    }
}
