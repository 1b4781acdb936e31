// SPDX-License-Identifier: Apache-2.0
//! Per-QP transport counters, named after rxe's `rxe_counters` so the
//! numbers read the same as `rdma statistic` on a Soft-RoCE host. Only
//! events the engine actually observes are counted; the device logs them
//! with each QP's sequence state when it goes away.

use serde::{Deserialize, Serialize};

/// Declares the counters once: the struct and the name table.
macro_rules! metrics {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// Transport event counters of one QP (all saturating).
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct Metrics {
            $( $(#[$doc])* pub $name: u64, )*
        }

        $crate::packed_struct!(Metrics { $($name),* });

        impl Metrics {
            /// Every counter by name, in declaration order.
            pub fn named(&self) -> Vec<(&'static str, u64)> {
                vec![$( (stringify!($name), self.$name) ),*]
            }

            /// The counters that are not zero, by name, in declaration order.
            pub fn moved(&self) -> Vec<(&'static str, u64)> {
                let mut named = self.named();
                named.retain(|(_, v)| *v != 0);
                named
            }
        }
    };
}

metrics! {
    /// Duplicate requests received (PSN below the expected one).
    rx_dup_req,
    /// Out-of-sequence requests (PSN above the expected one).
    out_of_seq_req,
    /// RNR NAKs sent (no receive WQE).
    rnr_nak_sent,
    /// RNR NAKs received.
    rnr_nak_rcvd,
    /// Sends that exhausted the transport retry count.
    retry_exceeded,
    /// Sends that exhausted the RNR retry count.
    rnr_retry_exceeded,
    /// Retransmissions started by the completer (timeout, NAK, gap).
    completer_retry,
    /// Requests not acknowledged at once (ACK coalescing).
    ack_deferred,
    /// Fatal NAKs sent (invalid request, remote access/operational).
    nak_sent,
    /// Responses dropped by the completer (stale, duplicate, hostile).
    comp_dropped,
    /// UD packets dropped for a Q_Key mismatch.
    qkey_violation,
    /// UD packets dropped for want of a receive WQE.
    ud_no_wqe,
}

/// Adds one to a counter, saturating.
pub fn inc(c: &mut u64) {
    *c = c.saturating_add(1);
}
