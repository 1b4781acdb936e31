// SPDX-License-Identifier: Apache-2.0
//! Ring state and index arithmetic, exactly as `pvrdma_ring.h` (identical
//! in the kernel and rdma-core) computes it (ABI doc 4.1).
//!
//! With `N = max_elems`, an index is valid iff `idx & !(2N - 1) == 0`, its
//! slot is `idx & (N - 1)` and it advances as `(idx + 1) & (2N - 1)`. For a
//! power-of-two `N` that is a ring of `N` slots with a wrap bit. The two
//! DSR rings have `N = 1536` and `3072`, where the same formulas cycle the
//! index over only `2^t` values (`t` = trailing ones of `2N - 1`) and use
//! half of them as slots; the driver's "full" test can then never fire.
//! [`RingGeometry::period`] and [`RingGeometry::capacity`] describe that
//! real behaviour so a producer can do its own overflow accounting.

wire_struct! {
    /// `pvrdma_ring`: one producer/consumer index pair.
    pub struct RingIndices = 8 {
        pub prod_tail: u32,
        pub cons_head: u32,
    }
}

wire_struct! {
    /// `pvrdma_ring_state`, at the start of a ring's header page.
    pub struct RingState = 16 {
        /// QP send queue.
        pub tx: RingIndices,
        /// QP receive queue, CQ, SRQ, async and CQ-notify rings.
        pub rx: RingIndices,
    }
}

/// Byte offset of `tx` in the header page.
pub const TX_OFFSET: u64 = 0;
/// Byte offset of `rx` in the header page.
pub const RX_OFFSET: u64 = 8;
/// Byte offset of `prod_tail` within a [`RingIndices`].
pub const PROD_TAIL_OFFSET: u64 = 0;
/// Byte offset of `cons_head` within a [`RingIndices`].
pub const CONS_HEAD_OFFSET: u64 = 4;

/// Largest `max_elems` for which `2N - 1` and the index period fit a `u32`.
pub const MAX_ELEMS: u32 = 1 << 30;

/// The index arithmetic of one ring of `max_elems` entries. Saved as
/// `max_elems`, checked again on restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct RingGeometry {
    max_elems: u32,
}

impl TryFrom<u32> for RingGeometry {
    type Error = String;

    fn try_from(max_elems: u32) -> Result<Self, String> {
        Self::new(max_elems).ok_or_else(|| format!("ring of {max_elems} entries"))
    }
}

impl From<RingGeometry> for u32 {
    fn from(g: RingGeometry) -> u32 {
        g.max_elems
    }
}

impl RingGeometry {
    /// `None` unless `1 <= max_elems <= MAX_ELEMS`.
    pub const fn new(max_elems: u32) -> Option<Self> {
        if max_elems == 0 || max_elems > MAX_ELEMS {
            return None;
        }
        Some(Self { max_elems })
    }

    pub const fn max_elems(self) -> u32 {
        self.max_elems
    }

    /// `(max_elems << 1) - 1`; cannot overflow for `max_elems <= 2^30`.
    const fn index_mask(self) -> u32 {
        (self.max_elems << 1).wrapping_sub(1)
    }

    /// `pvrdma_idx_valid`.
    pub const fn is_valid(self, idx: u32) -> bool {
        idx & !self.index_mask() == 0
    }

    /// `pvrdma_idx` for a valid index: the slot it names.
    pub const fn slot(self, idx: u32) -> u32 {
        idx & self.max_elems.wrapping_sub(1)
    }

    /// `pvrdma_idx_ring_inc`.
    pub const fn next(self, idx: u32) -> u32 {
        idx.wrapping_add(1) & self.index_mask()
    }

    /// `pvrdma_idx_ring_has_data` without the slot: `None` if an index is
    /// invalid, else whether the ring holds entries.
    pub const fn has_data(self, ring: RingIndices) -> Option<bool> {
        if self.is_valid(ring.prod_tail) && self.is_valid(ring.cons_head) {
            Some(ring.prod_tail != ring.cons_head)
        } else {
            None
        }
    }

    /// `pvrdma_idx_ring_has_space` without the slot: `None` if an index is
    /// invalid, else whether the producer may add an entry.
    pub const fn has_space(self, ring: RingIndices) -> Option<bool> {
        if self.is_valid(ring.prod_tail) && self.is_valid(ring.cons_head) {
            Some(ring.prod_tail != ring.cons_head ^ self.max_elems)
        } else {
            None
        }
    }

    /// How many values an index starting at 0 cycles through under
    /// [`Self::next`]: `2N` for a power-of-two `N`, less otherwise.
    pub const fn period(self) -> u32 {
        1 << self.index_mask().trailing_ones()
    }

    /// Slots a producer can fill without overwriting unconsumed entries:
    /// `N` for a power-of-two `N` (half the period in general).
    pub const fn capacity(self) -> u32 {
        self.period() >> 1
    }

    /// Whether `idx` is valid and on the cycle the indices actually take
    /// (the guest's check alone accepts some values that are not).
    pub const fn in_cycle(self, idx: u32) -> bool {
        self.is_valid(idx) && idx < self.period()
    }

    /// Entries between two in-cycle indices: `(to - from) mod period`.
    pub const fn distance(self, from: u32, to: u32) -> u32 {
        to.wrapping_sub(from) & self.period().wrapping_sub(1)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::arithmetic_side_effects)]

    use std::collections::BTreeSet;

    use super::*;

    fn geometry(n: u32) -> RingGeometry {
        RingGeometry::new(n).unwrap_or_else(|| panic!("geometry {n}"))
    }

    #[test]
    fn power_of_two_ring() {
        let g = geometry(8);
        assert_eq!((g.period(), g.capacity()), (16, 8));
        assert!(g.is_valid(15) && !g.is_valid(16));
        assert_eq!(g.slot(9), 1);
        assert_eq!(g.next(15), 0);
        let ring = |prod_tail, cons_head| RingIndices {
            prod_tail,
            cons_head,
        };
        assert_eq!(g.has_data(ring(0, 0)), Some(false));
        assert_eq!(g.has_data(ring(3, 0)), Some(true));
        // Full: producer one lap ahead.
        assert_eq!(g.has_space(ring(8, 0)), Some(false));
        assert_eq!(g.has_space(ring(7, 0)), Some(true));
        assert_eq!(g.has_space(ring(2, 10)), Some(false));
        assert_eq!(g.has_data(ring(16, 0)), None);
        assert_eq!(g.has_space(ring(0, 0x8000_0000)), None);
        assert_eq!(g.distance(14, 2), 4);
        assert_eq!(g.distance(3, 3), 0);
    }

    /// Walks the index from 0 as the driver does and returns the values it
    /// takes and the slots it names.
    fn simulate(g: RingGeometry) -> (BTreeSet<u32>, BTreeSet<u32>) {
        let (mut seen, mut slots) = (BTreeSet::new(), BTreeSet::new());
        let mut idx = 0;
        while seen.insert(idx) {
            assert!(g.is_valid(idx));
            slots.insert(g.slot(idx));
            idx = g.next(idx);
        }
        assert_eq!(idx, 0, "the walk returns to 0");
        (seen, slots)
    }

    #[test]
    fn non_power_of_two_quirk() {
        // The DSR rings: 3 data pages of 8-byte and 4-byte entries.
        for (n, period, used) in [(1536, 1024, 512), (3072, 2048, 1024)] {
            let g = geometry(n);
            let (seen, slots) = simulate(g);
            assert_eq!(seen.len() as u32, period);
            assert_eq!(*seen.last().unwrap_or(&0), period - 1);
            assert_eq!(slots.len() as u32, used);
            assert_eq!(
                *slots.last().unwrap_or(&0),
                used - 1,
                "first data page only"
            );
            assert_eq!((g.period(), g.capacity()), (period, used));
            // The driver's full test never fires on the cycle.
            for head in &seen {
                for tail in &seen {
                    let r = RingIndices {
                        prod_tail: *tail,
                        cons_head: *head,
                    };
                    assert_eq!(g.has_space(r), Some(true));
                }
            }
            // Valid for the driver, but never reached by the walk.
            assert!(g.is_valid(2 * n - 1) && !g.in_cycle(2 * n - 1));
            assert!(g.in_cycle(period - 1) && !g.in_cycle(period));
        }
    }

    #[test]
    fn period_and_capacity_match_simulation() {
        for n in (1..=300).chain([512, 1000, 1536, 3072, 4096, 6000]) {
            let g = geometry(n);
            let (seen, slots) = simulate(g);
            assert_eq!(g.period(), seen.len() as u32, "n={n}");
            assert_eq!(g.capacity(), slots.len() as u32, "n={n}");
            // `capacity` consecutive indices name distinct slots.
            let distinct: BTreeSet<u32> =
                (0..g.capacity()).map(|i| g.slot(i % g.period())).collect();
            assert_eq!(distinct.len() as u32, g.capacity(), "n={n}");
        }
    }

    #[test]
    fn geometry_bounds() {
        assert!(RingGeometry::new(0).is_none());
        assert!(RingGeometry::new(MAX_ELEMS + 1).is_none());
        let g = geometry(MAX_ELEMS);
        assert_eq!(g.period(), 1 << 31);
        assert_eq!(g.next(u32::MAX >> 1), 0);
        assert!(g.is_valid(u32::MAX >> 1) && !g.is_valid(1 << 31));
        assert_eq!(geometry(1).period(), 2);
    }
}
