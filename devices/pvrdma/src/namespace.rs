// SPDX-License-Identifier: Apache-2.0
//! The per-VM namespace: every identifier the device hands to the guest
//! (context, PD, CQ, QP and SRQ handles, QPNs, MR handles and keys).
//!
//! Identifiers are allocated deterministically, from the state alone, so a
//! migration destination that restores the [`NamespaceState`] hands out
//! the same numbers the source would have:
//!
//! - Handles (context, PD, CQ, QP, SRQ) take the lowest free value in
//!   `1..max`. The guest indexes its tables with them and clears
//!   `tbl[handle]` on destroy without a modulo, so they stay below the
//!   advertised `max_*` (and below 2^24, the UAR handle mask); 0 is never
//!   used (rdma-core reads `qp_handle == 0` as "absent", `ctx_handle 0` is
//!   the kernel). QP handle 1 and QPN 1 belong to the one GSI QP (QP1).
//! - QPNs and MR indices are next-fit with wrap-around: a freed value is
//!   reused only after the cursor went once around the space, so a peer or
//!   a stale work request naming an old QPN or key is unlikely to hit its
//!   successor. QPNs are 24-bit, `2..2^24`.
//! - lkey = rkey = `index << 8 | key`, where `key` is a per-index byte
//!   bumped on every allocation: a stale key matches a reused index only
//!   after the index was reallocated 256 times, i.e. after the next-fit
//!   cursor went 256 times around `max_mr`. The low byte is also the one
//!   the guest's FRWR updates.
//!
//! A value is freed only when its object is destroyed, and objects that
//! others reference refuse destruction, so nothing is reused while
//! referenced.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::BTreeSet;

use pvrdma_abi::QPN_MASK;
use serde::{Deserialize, Serialize};

use crate::config::Limits;

/// QP handle and QPN of the GSI QP (QP1).
pub(crate) const GSI_QP: u32 = 1;
/// First QPN for non-GSI QPs (0 is the SMI QP, 1 the GSI QP).
const FIRST_QPN: u32 = 2;
/// First handle of every kind (0 is reserved).
const FIRST_HANDLE: u32 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NamespaceError {
    #[error(
        "Allocator state for {what} has range {first}..{end}, expected {want_first}..{want_end}"
    )]
    Range {
        what: &'static str,
        first: u32,
        end: u32,
        want_first: u32,
        want_end: u32,
    },
    #[error("Allocator state for {what} holds {id} outside its range or out of ascending order")]
    OutOfRange { what: &'static str, id: u32 },
    #[error("Allocator state for {what} has cursor {cursor} outside its range")]
    Cursor { what: &'static str, cursor: u32 },
    #[error("MR key state has {0} entries, expected {1}")]
    KeyCount(usize, usize),
}

/// How an allocator picks the next value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
    LowestFree,
    NextFit,
}

/// Saved state of one allocator. Untrusted on restore.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdAllocatorState {
    pub first: u32,
    pub end: u32,
    /// Where next-fit continues (unused by lowest-free allocators).
    pub cursor: u32,
    /// Values in use, ascending.
    #[serde(with = "ascending_ids")]
    pub used: Vec<u32>,
}

/// Ascending values as one byte string: the first, then each one's
/// distance from the one before, as LEB128 varints. Saved as a sequence,
/// the QP handles and QPNs of thousands of QPs were a serde call each
/// through the bounded decoder, inside a migration's blackout.
mod ascending_ids {
    use rdma_transport::packed::{Reader, Writer};
    use serde::de::Error;
    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(ids: &[u32], s: S) -> Result<S::Ok, S::Error> {
        let mut w = Writer::default();
        let mut last = 0u32;
        for &id in ids {
            w.varint(u64::from(id.wrapping_sub(last)));
            last = id;
        }
        s.serialize_bytes(&w.into_inner())
    }

    /// Refuses values that do not ascend (a distance of 0) or overflow.
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
        let bytes = vm_migration::bytes::deserialize(d)?;
        let mut r = Reader::new(&bytes);
        // A varint is at least a byte: no more values than bytes.
        let mut ids = Vec::with_capacity(bytes.len());
        let mut last: Option<u32> = None;
        while !r.is_empty() {
            let step = r.varint().and_then(|v| u32::try_from(v).ok());
            let id = match (last, step) {
                (None, Some(id)) => Some(id),
                (Some(last), Some(step)) if step > 0 => last.checked_add(step),
                _ => None,
            }
            .ok_or_else(|| D::Error::custom("IDs not ascending"))?;
            ids.push(id);
            last = Some(id);
        }
        Ok(ids)
    }
}

/// Values of `first..end`, allocated by `policy`.
#[derive(Clone, Debug)]
pub(crate) struct IdAllocator {
    first: u32,
    end: u32,
    policy: Policy,
    cursor: u32,
    used: BTreeSet<u32>,
}

impl IdAllocator {
    fn new(first: u32, end: u32, policy: Policy) -> Self {
        Self {
            first,
            end,
            policy,
            cursor: first,
            used: BTreeSet::new(),
        }
    }

    /// The next free value, or `None` when all are in use. Costs at most
    /// one step per value in use.
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        let start = match self.policy {
            Policy::LowestFree => self.first,
            Policy::NextFit => self.cursor,
        };
        let id = self
            .free_from(start)
            .or_else(|| self.free_from(self.first))?;
        self.used.insert(id);
        if self.policy == Policy::NextFit {
            self.cursor = id
                .checked_add(1)
                .filter(|&c| c < self.end)
                .unwrap_or(self.first);
        }
        Some(id)
    }

    /// The first free value in `start..end`.
    fn free_from(&self, start: u32) -> Option<u32> {
        let mut candidate = start;
        for &id in self.used.range(start..) {
            if id != candidate {
                break;
            }
            candidate = candidate.checked_add(1)?;
        }
        (candidate < self.end).then_some(candidate)
    }

    /// Takes `id` if it is in range and free.
    pub(crate) fn reserve(&mut self, id: u32) -> bool {
        (self.first..self.end).contains(&id) && self.used.insert(id)
    }

    pub(crate) fn free(&mut self, id: u32) -> bool {
        self.used.remove(&id)
    }

    fn state(&self) -> IdAllocatorState {
        IdAllocatorState {
            first: self.first,
            end: self.end,
            cursor: self.cursor,
            used: self.used.iter().copied().collect(),
        }
    }

    /// Validates `state` against this allocator's range and adopts it.
    fn restore(
        &mut self,
        what: &'static str,
        state: &IdAllocatorState,
    ) -> Result<(), NamespaceError> {
        if (state.first, state.end) != (self.first, self.end) {
            return Err(NamespaceError::Range {
                what,
                first: state.first,
                end: state.end,
                want_first: self.first,
                want_end: self.end,
            });
        }
        if !(self.first..self.end).contains(&state.cursor) {
            return Err(NamespaceError::Cursor {
                what,
                cursor: state.cursor,
            });
        }
        // Ascending as saved: the set is then built at once, not an insert
        // per value.
        let mut last = None;
        for &id in &state.used {
            if !(self.first..self.end).contains(&id) || last.is_some_and(|l| l >= id) {
                return Err(NamespaceError::OutOfRange { what, id });
            }
            last = Some(id);
        }
        self.cursor = state.cursor;
        self.used = state.used.iter().copied().collect();
        Ok(())
    }
}

/// MR indices and the key byte of each.
#[derive(Clone, Debug)]
pub(crate) struct MrKeys {
    ids: IdAllocator,
    /// Last key byte handed out per index (index 0 unused).
    keys: Vec<u8>,
}

impl MrKeys {
    fn new(max_mr: u32) -> Self {
        Self {
            ids: IdAllocator::new(FIRST_HANDLE, max_mr, Policy::NextFit),
            keys: vec![0; usize::try_from(max_mr).unwrap_or(0)],
        }
    }

    /// A new MR: `(index, key)` with key = `index << 8 | key byte` (see
    /// [`mr_index`]).
    pub(crate) fn alloc(&mut self) -> Option<(u32, u32)> {
        let index = self.ids.alloc()?;
        let slot = self.keys.get_mut(usize::try_from(index).ok()?)?;
        *slot = slot.wrapping_add(1);
        Some((index, index << 8 | u32::from(*slot)))
    }

    pub(crate) fn free(&mut self, index: u32) -> bool {
        self.ids.free(index)
    }
}

/// The MR index (its handle) of an lkey or rkey.
pub(crate) const fn mr_index(key: u32) -> u32 {
    key >> 8
}

/// Saved state of the whole namespace. Untrusted on restore.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceState {
    pub ctx: IdAllocatorState,
    pub pd: IdAllocatorState,
    pub cq: IdAllocatorState,
    pub qp: IdAllocatorState,
    pub srq: IdAllocatorState,
    pub qpn: IdAllocatorState,
    pub mr: IdAllocatorState,
    #[serde(with = "vm_migration::bytes")]
    pub mr_keys: Vec<u8>,
    pub gsi_qp: bool,
}

/// Every allocator of one device (see the module docs for the policies).
#[derive(Clone, Debug)]
pub struct Namespace {
    pub(crate) ctx: IdAllocator,
    pub(crate) pd: IdAllocator,
    pub(crate) cq: IdAllocator,
    /// Non-GSI QP handles, `2..max_qp`.
    pub(crate) qp: IdAllocator,
    pub(crate) srq: IdAllocator,
    pub(crate) qpn: IdAllocator,
    pub(crate) mr: MrKeys,
    /// Whether QP handle / QPN 1 is taken by the GSI QP.
    pub(crate) gsi_qp: bool,
}

impl Namespace {
    pub fn new(limits: &Limits) -> Self {
        let lowest = |end| IdAllocator::new(FIRST_HANDLE, end, Policy::LowestFree);
        Self {
            // One context per UAR page; page 0 is the kernel's.
            ctx: lowest(limits.max_uar),
            pd: lowest(limits.max_pd),
            cq: lowest(limits.max_cq),
            qp: IdAllocator::new(GSI_QP.saturating_add(1), limits.max_qp, Policy::LowestFree),
            srq: lowest(limits.max_srq),
            qpn: IdAllocator::new(FIRST_QPN, QPN_MASK.saturating_add(1), Policy::NextFit),
            mr: MrKeys::new(limits.max_mr),
            gsi_qp: false,
        }
    }

    pub fn save(&self) -> NamespaceState {
        NamespaceState {
            ctx: self.ctx.state(),
            pd: self.pd.state(),
            cq: self.cq.state(),
            qp: self.qp.state(),
            srq: self.srq.state(),
            qpn: self.qpn.state(),
            mr: self.mr.ids.state(),
            mr_keys: self.mr.keys.clone(),
            gsi_qp: self.gsi_qp,
        }
    }

    /// A namespace for `limits` holding exactly `state`, which is validated
    /// first (ranges must match `limits`, values must be in range and
    /// unique).
    pub fn restore(limits: &Limits, state: &NamespaceState) -> Result<Self, NamespaceError> {
        let mut ns = Self::new(limits);
        ns.ctx.restore("contexts", &state.ctx)?;
        ns.pd.restore("PDs", &state.pd)?;
        ns.cq.restore("CQs", &state.cq)?;
        ns.qp.restore("QPs", &state.qp)?;
        ns.srq.restore("SRQs", &state.srq)?;
        ns.qpn.restore("QPNs", &state.qpn)?;
        ns.mr.ids.restore("MRs", &state.mr)?;
        if state.mr_keys.len() != ns.mr.keys.len() {
            return Err(NamespaceError::KeyCount(
                state.mr_keys.len(),
                ns.mr.keys.len(),
            ));
        }
        ns.mr.keys.clone_from(&state.mr_keys);
        ns.gsi_qp = state.gsi_qp;
        Ok(ns)
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use super::*;

    fn limits() -> Limits {
        Limits {
            max_qp: 8,
            max_cq: 4,
            max_mr: 4,
            ..Limits::default()
        }
    }

    #[test]
    fn lowest_free_handles() {
        let mut ns = Namespace::new(&limits());
        assert_eq!(ns.cq.alloc(), Some(1));
        assert_eq!(ns.cq.alloc(), Some(2));
        assert_eq!(ns.cq.alloc(), Some(3));
        assert_eq!(ns.cq.alloc(), None, "handles stay below max_cq");
        assert!(ns.cq.free(2));
        assert!(!ns.cq.free(2));
        assert_eq!(ns.cq.alloc(), Some(2));
        // Non-GSI QPs start at 2; 1 is the GSI QP's.
        assert_eq!(ns.qp.alloc(), Some(2));
        assert!(!ns.qp.reserve(GSI_QP));
    }

    #[test]
    fn qpns_are_next_fit_and_24_bit() {
        let mut ns = Namespace::new(&limits());
        assert_eq!(ns.qpn.alloc(), Some(2));
        assert_eq!(ns.qpn.alloc(), Some(3));
        assert!(ns.qpn.free(2));
        // Not reused until the cursor wraps.
        assert_eq!(ns.qpn.alloc(), Some(4));
        ns.qpn.cursor = QPN_MASK;
        assert_eq!(ns.qpn.alloc(), Some(QPN_MASK));
        assert_eq!(ns.qpn.alloc(), Some(2), "wraps to the lowest free");
        assert_eq!(ns.qpn.alloc(), Some(5));
        assert!(!ns.qpn.reserve(QPN_MASK + 1));
        assert!(!ns.qpn.reserve(1));
    }

    #[test]
    fn mr_keys_change_on_reuse() {
        let mut ns = Namespace::new(&limits());
        let (i1, k1) = ns.mr.alloc().unwrap();
        assert_eq!((i1, k1), (1, 0x101));
        let (i2, k2) = ns.mr.alloc().unwrap();
        assert_eq!((i2, k2), (2, 0x201));
        assert!(ns.mr.free(1));
        let (i3, _) = ns.mr.alloc().unwrap();
        assert_eq!(i3, 3, "next-fit does not reuse 1 yet");
        assert_eq!(ns.mr.alloc(), Some((1, 0x102)), "reused index, new key");
        assert_eq!(ns.mr.alloc(), None);
        // 256 reuses of one index cycle its key byte.
        let mut keys = BTreeSet::new();
        for _ in 0..256 {
            ns.mr.free(1);
            let (i, k) = ns.mr.alloc().unwrap();
            assert_eq!(i, 1);
            keys.insert(k);
        }
        assert_eq!(keys.len(), 256);
    }

    #[test]
    fn deterministic_replay() {
        let run = || {
            let mut ns = Namespace::new(&limits());
            let mut out = Vec::new();
            for i in 0..20 {
                out.push(ns.qpn.alloc());
                out.push(ns.mr.alloc().map(|(_, k)| k));
                if i % 3 == 0 {
                    ns.mr.free(1 + i % 3);
                    ns.qpn.free(2 + i);
                }
            }
            out
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn save_restore_round_trip() {
        let l = limits();
        let mut ns = Namespace::new(&l);
        ns.ctx.alloc();
        ns.cq.alloc();
        ns.cq.alloc();
        ns.cq.free(1);
        ns.qpn.alloc();
        ns.mr.alloc();
        ns.gsi_qp = true;
        let state = ns.save();
        // Through the encoding a migration uses.
        let snapshot = vm_migration::Snapshot::new("ns", 1, &state).unwrap();
        let back: NamespaceState = snapshot.state("ns", 1).unwrap();
        let mut restored = Namespace::restore(&l, &back).unwrap();
        assert_eq!(restored.save(), state);
        assert_eq!(back.cq.used, [2]);
        // Both continue identically.
        assert_eq!(restored.cq.alloc(), ns.cq.alloc());
        assert_eq!(restored.qpn.alloc(), ns.qpn.alloc());
        assert_eq!(restored.mr.alloc(), ns.mr.alloc());
    }

    /// The IDs in use are decoded ascending or not at all: a repeated
    /// value (a distance of 0), one past `u32::MAX` or a cut varint is
    /// refused by the decode.
    #[test]
    fn ids_in_use_decode_only_ascending() {
        let ids = |bytes: &[u8]| {
            let state = (0u32, 8u32, 0u32, vm_migration::nested::Bytes(bytes));
            let snapshot = vm_migration::Snapshot::new("ids", 1, &state).unwrap();
            snapshot.state::<IdAllocatorState>("ids", 1).map(|s| s.used)
        };
        assert_eq!(ids(&[2, 1, 3]).unwrap(), [2, 3, 6]);
        assert_eq!(ids(&[]).unwrap(), Vec::<u32>::new());
        for bad in [&[2, 0][..], &[0xff, 0xff, 0xff, 0xff, 0x0f, 1], &[0x80]] {
            assert!(ids(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn restore_rejects_hostile_state() {
        let l = limits();
        let good = Namespace::new(&l).save();
        let mut bad = good.clone();
        bad.cq.end = 1 << 30;
        assert!(matches!(
            Namespace::restore(&l, &bad),
            Err(NamespaceError::Range { .. })
        ));
        let mut bad = good.clone();
        bad.cq.used = vec![1, 1];
        assert!(Namespace::restore(&l, &bad).is_err());
        // Out of the ascending order the saver writes.
        let mut bad = good.clone();
        bad.cq.used = vec![2, 1];
        assert!(Namespace::restore(&l, &bad).is_err());
        let mut bad = good.clone();
        bad.cq.used = vec![0];
        assert!(Namespace::restore(&l, &bad).is_err());
        let mut bad = good.clone();
        bad.qpn.used = vec![QPN_MASK + 1];
        assert!(Namespace::restore(&l, &bad).is_err());
        let mut bad = good.clone();
        bad.qpn.cursor = 0;
        assert!(matches!(
            Namespace::restore(&l, &bad),
            Err(NamespaceError::Cursor { .. })
        ));
        let mut bad = good;
        bad.mr_keys.push(0);
        assert!(matches!(
            Namespace::restore(&l, &bad),
            Err(NamespaceError::KeyCount(5, 4))
        ));
    }
}
