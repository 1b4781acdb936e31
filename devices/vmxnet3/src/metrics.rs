// SPDX-License-Identifier: Apache-2.0
//! Device counters, named `<noun>_<event>`, readable by the VMM at any time
//! through [`Vmxnet3Metrics::counters`]. Every frame the device does not
//! deliver is counted under the reason it was dropped.
//!
//! Events a guest (or a peer) can trigger at will are also logged, but only
//! when their count reaches a power of two ([`count_log!`]), so the log
//! grows with the logarithm of the abuse and still shows it continues.

use std::sync::atomic::{AtomicU64, Ordering};

/// One counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one; returns the new count.
    pub(crate) fn inc(&self) -> u64 {
        self.add(1)
    }

    /// Adds `n`; returns the new count.
    pub(crate) fn add(&self, n: u64) -> u64 {
        self.0.fetch_add(n, Ordering::Relaxed).wrapping_add(n)
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Declares the live counters and their serializable snapshot from one list.
macro_rules! metrics {
    ($($(#[doc = $doc:literal])+ $name:ident,)+) => {
        /// Live counters of one vmxnet3 device, shared with its worker.
        #[derive(Debug, Default)]
        pub struct Vmxnet3Metrics {
            $($(#[doc = $doc])+ pub $name: Counter,)+
        }

        /// A snapshot of [`Vmxnet3Metrics`], for the VMM's counters API.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
        pub struct Vmxnet3Counters {
            $($(#[doc = $doc])+ pub $name: u64,)+
        }

        impl Vmxnet3Metrics {
            pub fn counters(&self) -> Vmxnet3Counters {
                Vmxnet3Counters { $($name: self.$name.get(),)+ }
            }
        }

        /// The VMM's `vm.counters` reads the live counters through this.
        impl pci::DeviceCounters for Vmxnet3Metrics {
            fn values(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.get()),)+]
            }
        }
    };
}

metrics! {
    /// Frames handed to the backend.
    tx_frames,
    /// Bytes of those frames (before segmentation).
    tx_bytes,
    /// Of those, frames with a checksum for the host to fill in.
    tx_csum_frames,
    /// Of those, TSO frames for the host to segment.
    tx_tso_frames,
    /// Frames dropped: a buffer outside guest RAM.
    tx_bad_desc,
    /// Frames dropped: offload fields (`om`, `hlen`, `msscof`) that do not
    /// fit the frame or its headers.
    tx_bad_offload,
    /// Frames dropped: longer than 9022 bytes (64 KiB with TSO).
    tx_too_large,
    /// Frames dropped: the backend refused them.
    tx_backend_error,
    /// TX queues stopped with TQERR: a packet without an end.
    tx_queue_error,
    /// Frames written into the guest's receive buffers.
    rx_frames,
    /// Bytes of those frames.
    rx_bytes,
    /// Frames dropped: the guest had not posted enough receive buffers.
    rx_no_buffer,
    /// Frames dropped: longer than the guest's MTU plus 22 header bytes.
    rx_too_large,
    /// Frames dropped: the device was not active (driver not loaded, link
    /// administratively down in the guest, or the receive queue stopped).
    rx_inactive,
    /// Frames dropped: the backend left checksum or segmentation undone.
    rx_bad_vnet_hdr,
    /// Receive errors of the backend (each stops reception).
    rx_backend_error,
    /// RX queues stopped with RQERR: a buffer descriptor the device
    /// cannot use.
    rx_queue_error,
    /// ACTIVATE_DEV commands that started the device.
    activate_ok,
    /// ACTIVATE_DEV commands refused (CMD reads non-zero).
    activate_rejected,
    /// QUIESCE_DEV or RESET_DEV commands that stopped an active device.
    quiesce_ok,
    /// Commands the device does not know (answered with 0).
    cmd_unknown,
    /// Register accesses that are not a 32-bit access to a register.
    reg_bad_access,
    /// Link-change events posted to the guest (ECR LINK).
    link_events,
    /// MSI-X messages sent to the guest (every vector).
    intr_fired,
    /// Interrupts raised while their vector was masked (`IMR`, or auto-masked
    /// after the last one): held until the driver unmasks it. A driver that
    /// stops unmasking shows as these growing while `intr_fired` does not.
    intr_held,
}

/// Counts a guest-triggerable event on `$counter` and logs it at `$level`
/// (a `log::Level` variant) when the count is a power of two.
macro_rules! count_log {
    ($level:ident, $counter:expr, $($arg:tt)+) => {{
        let seen = $counter.inc();
        if seen.is_power_of_two() {
            log::log!(
                log::Level::$level,
                "vmxnet3: {} (occurrence {seen})",
                format_args!($($arg)+)
            );
        }
    }};
}

/// [`count_log!`] at `warn!`, for what a well-behaved guest never does.
macro_rules! count_warn {
    ($($arg:tt)+) => {
        count_log!(Warn, $($arg)+)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_follows_counters() {
        let m = Vmxnet3Metrics::default();
        assert_eq!(m.tx_frames.inc(), 1);
        assert_eq!(m.rx_bytes.add(100), 100);
        count_warn!(m.cmd_unknown, "test {}", 1);
        let c = m.counters();
        assert_eq!((c.tx_frames, c.rx_bytes, c.cmd_unknown), (1, 100, 1));
        let json = serde_json::to_string(&c).unwrap_or_default();
        assert!(json.contains("\"rx_no_buffer\":0"), "{json}");
        let named = pci::DeviceCounters::values(&m);
        assert_eq!(named.first(), Some(&("tx_frames", 1)));
        assert!(named.contains(&("rx_bytes", 100)));
        assert_eq!(named.len(), json.matches(':').count());
    }
}
