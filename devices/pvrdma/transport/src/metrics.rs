// SPDX-License-Identifier: Apache-2.0
//! Per-QP transport counters, named after rxe's `rxe_counters` so the
//! numbers read the same as `rdma statistic` on a Soft-RoCE host. Only
//! events the engine actually observes are counted; the device sums them
//! into its port counters.

use serde::{Deserialize, Serialize};

/// Transport event counters of one QP (all saturating).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metrics {
    /// Duplicate requests received (PSN below the expected one).
    pub rx_dup_req: u64,
    /// Out-of-sequence requests (PSN above the expected one).
    pub out_of_seq_req: u64,
    /// RNR NAKs sent (no receive WQE).
    pub rnr_nak_sent: u64,
    /// RNR NAKs received.
    pub rnr_nak_rcvd: u64,
    /// Sends that exhausted the transport retry count.
    pub retry_exceeded: u64,
    /// Sends that exhausted the RNR retry count.
    pub rnr_retry_exceeded: u64,
    /// Retransmissions started by the completer (timeout, NAK, gap).
    pub completer_retry: u64,
    /// Requests not acknowledged at once (ACK coalescing).
    pub ack_deferred: u64,
    /// Fatal NAKs sent (invalid request, remote access/operational).
    pub nak_sent: u64,
    /// Responses dropped by the completer (stale, duplicate, hostile).
    pub comp_dropped: u64,
    /// UD packets dropped for a Q_Key mismatch.
    pub qkey_violation: u64,
    /// UD packets dropped for want of a receive WQE.
    pub ud_no_wqe: u64,
}

/// Adds one to a counter, saturating.
pub fn inc(c: &mut u64) {
    *c = c.saturating_add(1);
}
