// SPDX-License-Identifier: Apache-2.0
//! The per-queue statistics the guest reads after GET_STATS
//! (`UPT1_TxStats` / `UPT1_RxStats`): Linux sums them into the interface
//! counters (`ip -s link`). They live as long as the device, across
//! resets, as the driver's own counters do, and migrate with it.

use serde::{Deserialize, Serialize};

/// Frames by destination class: unicast, multicast, broadcast.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CastCounters {
    pkts: [u64; 3],
    bytes: [u64; 3],
}

impl CastCounters {
    /// Counts `pkts` wire packets of `bytes` bytes going to `frame`'s
    /// destination MAC.
    fn count(&mut self, frame: &[u8], pkts: u64, bytes: u64) {
        let class = match frame.get(..6) {
            Some([0xff, 0xff, 0xff, 0xff, 0xff, 0xff]) => 2,
            Some([first, ..]) if first & 1 != 0 => 1,
            _ => 0,
        };
        if let (Some(p), Some(b)) = (self.pkts.get_mut(class), self.bytes.get_mut(class)) {
            *p = p.wrapping_add(pkts);
            *b = b.wrapping_add(bytes);
        }
    }

    /// [ucast pkts, ucast bytes, mcast pkts, mcast bytes, bcast pkts, bcast bytes]
    fn upt(&self) -> [u64; 6] {
        let [up, mp, bp] = self.pkts;
        let [ub, mb, bb] = self.bytes;
        [up, ub, mp, mb, bp, bb]
    }
}

/// `UPT1_TxStats` of one TX queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TxStats {
    /// TSO packets after segmentation, and their bytes.
    tso_pkts: u64,
    tso_bytes: u64,
    sent: CastCounters,
    /// Frames the backend refused.
    pub(crate) errors: u64,
    /// Frames the device dropped (bad descriptors, offloads or sizes).
    pub(crate) discards: u64,
}

impl TxStats {
    /// Counts a sent frame that goes on the wire as `segments` packets of
    /// `wire_bytes` bytes in total.
    pub(crate) fn sent(&mut self, frame: &[u8], segments: u64, wire_bytes: u64, tso: bool) {
        self.sent.count(frame, segments, wire_bytes);
        if tso {
            self.tso_pkts = self.tso_pkts.wrapping_add(segments);
            self.tso_bytes = self.tso_bytes.wrapping_add(wire_bytes);
        }
    }

    pub(crate) fn upt(&self) -> [u64; 10] {
        let [a, b, c, d, e, f] = self.sent.upt();
        [
            self.tso_pkts,
            self.tso_bytes,
            a,
            b,
            c,
            d,
            e,
            f,
            self.errors,
            self.discards,
        ]
    }
}

/// `UPT1_RxStats` of one RX queue (no LRO: those two stay 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RxStats {
    received: CastCounters,
    /// Frames dropped for want of posted buffers.
    pub(crate) out_of_buf: u64,
}

impl RxStats {
    pub(crate) fn received(&mut self, frame: &[u8]) {
        let len = u64::try_from(frame.len()).unwrap_or(u64::MAX);
        self.received.count(frame, 1, len);
    }

    pub(crate) fn upt(&self) -> [u64; 10] {
        let [a, b, c, d, e, f] = self.received.upt();
        [0, 0, a, b, c, d, e, f, self.out_of_buf, 0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_classed_by_destination() {
        let mut tx = TxStats::default();
        tx.sent(&[0x02, 0, 0, 0, 0, 1], 3, 4000, true);
        tx.sent(&[0x01, 0, 0x5e, 0, 0, 1], 1, 100, false);
        tx.sent(&[0xff; 6], 1, 60, false);
        tx.errors += 1;
        assert_eq!(tx.upt(), [3, 4000, 3, 4000, 1, 100, 1, 60, 1, 0]);
        let mut rx = RxStats::default();
        rx.received(&[0x02; 64]);
        rx.out_of_buf = 2;
        assert_eq!(rx.upt(), [0, 0, 1, 64, 0, 0, 0, 0, 2, 0]);
    }
}
