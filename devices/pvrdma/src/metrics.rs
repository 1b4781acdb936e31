// SPDX-License-Identifier: Apache-2.0
//! Per-device counters, named `<noun>_<event>`, and the throttled warning
//! for guest-triggerable conditions.
//!
//! The VMM reads them through [`crate::Pvrdma::counters`] for its
//! `vm.counters` endpoint, with each QP's transport counters; tests and
//! the exit log through [`crate::Pvrdma::metrics`]:
//!
//! ```text
//! [("cmd_executed", 42), ("cmd_failed", 1), ("doorbell_unmatched", 0), ...]
//! ```
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonic event counter.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Counts one event; returns the new total.
    pub(crate) fn inc(&self) -> u64 {
        self.add(1)
    }

    /// Counts `n` events; returns the new total.
    pub(crate) fn add(&self, n: u64) -> u64 {
        self.0.fetch_add(n, Ordering::Relaxed).wrapping_add(n)
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Occurrences of one condition logged before throttling starts.
const LOG_BURST: u64 = 8;

/// Whether the `n`-th occurrence of a guest-triggerable condition should be
/// logged: the first few, then powers of two, so a guest that repeats it
/// millions of times grows the log only logarithmically.
pub(crate) fn should_log(n: u64) -> bool {
    n <= LOG_BURST || n.is_power_of_two()
}

/// Counts an event on `$counter` and logs it at `warn!`, throttled by the
/// counter's own total.
macro_rules! guest_warn {
    ($counter:expr, $($arg:tt)+) => {{
        let n = $counter.inc();
        if $crate::metrics::should_log(n) {
            log::warn!("pvrdma: {} (occurrence {n})", format_args!($($arg)+));
        }
    }};
}

/// Declares the counters once: the struct and the name table.
macro_rules! metrics {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// Counters of one PVRDMA device.
        #[derive(Debug, Default)]
        pub(crate) struct Metrics {
            $( $(#[$doc])* pub(crate) $name: Counter, )*
        }

        impl Metrics {
            /// Every counter with its name, in declaration order.
            pub(crate) fn snapshot(&self) -> Vec<(&'static str, u64)> {
                vec![$( (stringify!($name), self.$name.get()) ),*]
            }
        }
    };
}

metrics! {
    /// Commands executed successfully.
    cmd_executed,
    /// Commands that failed validation or ran out of resources.
    cmd_failed,
    /// Command codes outside the ABI.
    cmd_unknown,
    /// REQUEST writes before ACTIVATE or after RESET.
    cmd_inactive,
    /// DSRHIGH writes whose DSR was rejected.
    dsr_invalid,
    /// CTL writes that were invalid or out of order.
    ctl_invalid,
    /// Register accesses of the wrong size, offset or direction.
    reg_invalid,
    /// Reads of the write-only UAR BAR.
    uar_read,
    /// UAR writes that named no doorbell of that page.
    doorbell_unmatched,
    /// QP send/receive doorbells processed.
    doorbell_qp,
    /// SRQ doorbells processed.
    doorbell_srq,
    /// CQ arm doorbells processed.
    doorbell_cq_arm,
    /// CQ poll doorbells (drained in bulk).
    doorbell_cq_poll,
    /// Doorbells that reached the device while paused, taken on resume.
    doorbell_held,
    /// CQs armed again after a restore (the source may have paused before
    /// taking an arm doorbell).
    cq_rearmed,
    /// ioeventfd registrations KVM refused (the doorbell then exits).
    ioevent_failed,
    /// Guest ring indices that failed validation.
    ring_invalid,
    /// Async events written.
    event_posted,
    /// Async events lost to a full or broken ring.
    event_dropped,
    /// CQ notifications written.
    cq_notify_posted,
    /// CQ notifications lost to a full or broken ring.
    cq_notify_dropped,
    /// CQEs the device wrote.
    cqe_posted,
    /// CQs that overflowed (the device stops writing to them).
    cq_overflow,
    /// Work requests completed with WR_FLUSH_ERR.
    wqe_flushed,
    /// Port link changes reported to the guest.
    link_change,
    /// Work requests the device could not decode or execute as posted.
    wqe_invalid,
    /// Completions with an error status.
    wqe_error,
    /// RoCE frames received for the device.
    roce_rx,
    /// Received frames dropped: the inbox was full.
    roce_rx_dropped,
    /// Received frames that failed to parse (bad headers, ICRC).
    roce_rx_bad,
    /// Received frames for no GID of ours (of the frame's RoCE version, on
    /// its VLAN) or no QP in a receiving state.
    roce_rx_no_qp,
    /// Frames sent on the port's backend.
    roce_tx,
    /// Frames the backend refused.
    roce_tx_error,
    /// Frames for one of the device's own GIDs, looped back.
    roce_loopback,
    /// Frames sent to a VMM of this host over the same-host channel.
    roce_local_tx,
    /// Of `roce_local_tx`: frames of a same-host QP not built in the ring
    /// (no room, or frames waited before them), but in a buffer, then
    /// copied, most into the backlog: a copy more of every byte.
    roce_local_copied,
    /// Of `roce_local_tx`: described records, whose payload the peer
    /// copies from our memory itself (`share_memory=on`).
    roce_local_described,
    /// Frames for a VMM of this host that had no room for them.
    roce_local_dropped,
    /// Frames received over the same-host channel.
    roce_local_rx,
    /// Of `roce_local_rx`: described records, placed from the sender's
    /// view (a peer's view we took: `share_memory=on` on both ends).
    roce_local_rx_described,
    /// Same-host peers woken (kicked) because they had announced a sleep
    /// in their ring: a busy-polling peer needs none.
    roce_local_kicks,
    /// Received frames (wire or same-host channel) that were RoCE v1.
    roce_rx_v1,
    /// Received frames (wire or same-host channel) with an 802.1Q tag.
    roce_rx_vlan,
    /// Of `roce_rx_no_qp`: frames for a GID of ours that is not on the
    /// frame's VLAN (or tagged frames for a GID without one).
    roce_rx_vlan_mismatch,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_burst_then_powers_of_two() {
        let logged: Vec<u64> = (1..=100).filter(|&n| should_log(n)).collect();
        assert_eq!(logged, vec![1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64]);
    }

    #[test]
    fn counters_and_snapshot() {
        let m = Metrics::default();
        assert_eq!(m.cmd_failed.inc(), 1);
        assert_eq!(m.cmd_failed.add(2), 3);
        let snap = m.snapshot();
        assert_eq!(snap.first(), Some(&("cmd_executed", 0)));
        assert!(snap.contains(&("cmd_failed", 3)));
    }

    /// Every counter is incremented somewhere in the crate (a counter
    /// nothing feeds is a lie in the VMM's counters).
    #[test]
    fn every_metric_is_used() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut text = String::new();
        let mut dirs = vec![src];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if !path.ends_with("metrics.rs") {
                    text.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
                }
            }
        }
        for (name, _) in Metrics::default().snapshot() {
            // Incremented directly, or handed to `guest_warn!` or a helper.
            let used = [".inc()", ".add(", ","]
                .iter()
                .any(|op| text.contains(&format!(".{name}{op}")));
            assert!(used, "metric {name} is never incremented");
        }
    }
}
