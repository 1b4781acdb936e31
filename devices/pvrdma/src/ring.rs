// SPDX-License-Identifier: Apache-2.0
//! Rings in guest memory, seen from the device (ABI doc 4.1).
//!
//! A [`Ring`] is the guest pages of one ring (its header page with the
//! index pair, and data pages) plus its geometry and entry stride. The
//! device keeps its own copy of the index it owns: the producer index of
//! the rings it fills ([`ProducerRing`]: CQs, async events, CQ
//! notifications) and the consumer index of the rings the guest fills
//! ([`ConsumerRing`]: send, receive and shared receive queues). It only
//! reads the guest's index, validates it before any use, and publishes its
//! own with release ordering after the entries it covers.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use pvrdma_abi::ring::{RingGeometry, CONS_HEAD_OFFSET, PROD_TAIL_OFFSET};
use pvrdma_abi::{PAGE_SHIFT, PAGE_SIZE};
use vm_memory::bitmap::BS;
use vm_memory::{
    ByteValued, Bytes, GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryError,
    GuestMemoryRegion, VolatileSlice,
};

#[derive(Debug, thiserror::Error)]
pub(crate) enum RingError {
    #[error("Ring index {0:#x} is invalid")]
    BadIndex(u32),
    #[error("Ring is full")]
    Full,
    #[error("Failed to access the ring")]
    Memory(#[source] GuestMemoryError),
}

/// Which index of the pair.
#[derive(Clone, Copy, Debug)]
enum Index {
    Prod,
    Cons,
}

/// The guest pages and arithmetic of one ring (restored state is checked
/// like a new ring).
#[derive(Debug, Serialize, Deserialize)]
#[serde(try_from = "RingParts")]
pub(crate) struct Ring {
    /// GPA of the `pvrdma_ring` index pair in the header page.
    indices: u64,
    /// Data pages; entry `slot` is at byte `slot * stride` of them.
    data: Vec<u64>,
    geometry: RingGeometry,
    stride: u32,
}

/// A [`Ring`] as saved, before its checks.
#[derive(Deserialize)]
struct RingParts {
    indices: u64,
    data: Vec<u64>,
    geometry: RingGeometry,
    stride: u32,
}

impl TryFrom<RingParts> for Ring {
    type Error = String;

    fn try_from(p: RingParts) -> Result<Self, String> {
        let (entries, stride) = (p.geometry.max_elems(), p.stride);
        // The index pair lies somewhere in a page: `new` checks the same.
        let header = p.indices & !(PAGE_SIZE - 1);
        Ring::new(
            header,
            p.indices & (PAGE_SIZE - 1),
            p.data,
            p.geometry,
            p.stride,
        )
        .ok_or_else(|| format!("ring of {entries} entries of {stride} bytes"))
    }
}

impl Ring {
    /// `header` is the header page, `indices_offset` where the index pair
    /// sits in it. `None` unless `stride` is a power of two that divides a
    /// page (so no entry straddles pages) and `data` holds every slot.
    pub(crate) fn new(
        header: u64,
        indices_offset: u64,
        data: Vec<u64>,
        geometry: RingGeometry,
        stride: u32,
    ) -> Option<Self> {
        if !stride.is_power_of_two() || u64::from(stride) > PAGE_SIZE {
            return None;
        }
        let needed = u64::from(geometry.max_elems()).checked_mul(u64::from(stride))?;
        let mapped = u64::try_from(data.len()).ok()?.checked_mul(PAGE_SIZE)?;
        if needed > mapped || indices_offset > PAGE_SIZE.checked_sub(8)? {
            return None;
        }
        Some(Self {
            indices: header.checked_add(indices_offset)?,
            data,
            geometry,
            stride,
        })
    }

    pub(crate) fn geometry(&self) -> RingGeometry {
        self.geometry
    }

    /// Data pages it maps.
    pub(crate) fn pages(&self) -> usize {
        self.data.len()
    }

    /// Guest address of the entry at ring index `idx`.
    fn entry(&self, idx: u32) -> Option<GuestAddress> {
        let offset = u64::from(self.geometry.slot(idx)).checked_mul(u64::from(self.stride))?;
        let page = self.data.get(usize::try_from(offset >> PAGE_SHIFT).ok()?)?;
        Some(GuestAddress(page.checked_add(offset & (PAGE_SIZE - 1))?))
    }

    fn index_addr(&self, which: Index) -> GuestAddress {
        let offset = match which {
            Index::Prod => PROD_TAIL_OFFSET,
            Index::Cons => CONS_HEAD_OFFSET,
        };
        // `indices` is at most a page minus 8 past a page address.
        GuestAddress(self.indices.saturating_add(offset))
    }

    fn load<M: GuestMemory>(&self, mem: &M, which: Index) -> Result<u32, RingError> {
        mem.load(self.index_addr(which), Ordering::Acquire)
            .map_err(RingError::Memory)
    }

    fn store<M: GuestMemory>(&self, mem: &M, which: Index, value: u32) -> Result<(), RingError> {
        mem.store(value, self.index_addr(which), Ordering::Release)
            .map_err(RingError::Memory)
    }

    /// Bytes of one entry (a power of two no larger than a page).
    pub(crate) fn stride(&self) -> u32 {
        self.stride
    }

    /// Reads the first `buf.len()` (at most `stride`) bytes of entry `idx`.
    fn read_entry_bytes<M: GuestMemory>(
        &self,
        mem: &M,
        idx: u32,
        buf: &mut [u8],
    ) -> Result<(), RingError> {
        let addr = self.entry(idx).ok_or(RingError::BadIndex(idx))?;
        let len = buf.len().min(self.stride as usize);
        let buf = buf.get_mut(..len).ok_or(RingError::BadIndex(idx))?;
        guest_slice(mem, addr, len)
            .map_err(RingError::Memory)?
            .copy_to(buf);
        Ok(())
    }

    fn read_entry<M: GuestMemory, T: ByteValued>(&self, mem: &M, idx: u32) -> Result<T, RingError> {
        let addr = self.entry(idx).ok_or(RingError::BadIndex(idx))?;
        let mut entry = T::zeroed();
        let buf = entry.as_mut_slice();
        guest_slice(mem, addr, buf.len())
            .map_err(RingError::Memory)?
            .copy_to(buf);
        Ok(entry)
    }
}

/// A slice of guest memory `M` (with its region's dirty bitmap).
type GuestSlice<'a, M> = VolatileSlice<
    'a,
    BS<'a, <<<M as GuestMemory>::PhysicalMemory as GuestMemoryBackend>::R as GuestMemoryRegion>::B>,
>;

/// The `len` bytes of guest memory at `addr`, which lie in one region (a
/// ring entry lies within a page): one region lookup, where vm-memory's
/// `read_slice` / `write_obj` build an iterator of slices for each call,
/// which costs more than the lookup (docs/benchmarks.md, branch
/// `regress`).
fn guest_slice<M: GuestMemory>(
    mem: &M,
    addr: GuestAddress,
    len: usize,
) -> Result<GuestSlice<'_, M>, GuestMemoryError> {
    let phys = mem
        .physical_memory()
        .ok_or(GuestMemoryError::HostAddressNotAvailable)?;
    let region = phys
        .find_region(addr)
        .ok_or(GuestMemoryError::InvalidGuestAddress(addr))?;
    let off = region
        .to_region_addr(addr)
        .ok_or(GuestMemoryError::InvalidGuestAddress(addr))?;
    region.get_slice(off, len)
}

/// A ring the device fills and the guest drains.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ProducerRing {
    ring: Ring,
    prod: u32,
}

impl ProducerRing {
    pub(crate) fn new(ring: Ring) -> Self {
        Self { ring, prod: 0 }
    }

    pub(crate) fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Adds `entry` and publishes the new producer index. Fails without
    /// writing when the guest's consumer index is invalid or the ring
    /// holds `capacity` unconsumed entries (never overwrites).
    pub(crate) fn push<M: GuestMemory, T: ByteValued>(
        &mut self,
        mem: &M,
        entry: &T,
    ) -> Result<(), RingError> {
        let g = self.ring.geometry;
        let cons = self.ring.load(mem, Index::Cons)?;
        if !g.in_cycle(cons) {
            return Err(RingError::BadIndex(cons));
        }
        let used = g.distance(cons, self.prod);
        if used > g.capacity() {
            // The consumer claims to be ahead of the producer.
            return Err(RingError::BadIndex(cons));
        }
        if used == g.capacity() {
            return Err(RingError::Full);
        }
        let addr = self
            .ring
            .entry(self.prod)
            .ok_or(RingError::BadIndex(self.prod))?;
        // Marks the entry's page in the dirty bitmap.
        guest_slice(mem, addr, std::mem::size_of::<T>())
            .map_err(RingError::Memory)?
            .copy_from(entry.as_slice());
        self.prod = g.next(self.prod);
        self.ring.store(mem, Index::Prod, self.prod)
    }

    /// Entries written and not yet consumed by the guest; fails when the
    /// guest's consumer index is unusable.
    pub(crate) fn unconsumed<M: GuestMemory>(&self, mem: &M) -> Result<u32, RingError> {
        let g = self.ring.geometry;
        let cons = self.ring.load(mem, Index::Cons)?;
        let used = g.distance(cons, self.prod);
        if g.in_cycle(cons) && used <= g.capacity() {
            Ok(used)
        } else {
            Err(RingError::BadIndex(cons))
        }
    }
}

/// A ring the guest fills and the device drains.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ConsumerRing {
    ring: Ring,
    cons: u32,
}

impl ConsumerRing {
    pub(crate) fn new(ring: Ring) -> Self {
        Self { ring, cons: 0 }
    }

    /// A ring whose device had consumed up to `cons` (a restore).
    pub(crate) fn resume(ring: Ring, cons: u32) -> Self {
        Self { ring, cons }
    }

    pub(crate) fn ring(&self) -> &Ring {
        &self.ring
    }

    pub(crate) fn into_ring(self) -> Ring {
        self.ring
    }

    /// The device's consumer index.
    pub(crate) fn cons(&self) -> u32 {
        self.cons
    }

    /// Entries the guest has posted and the device not yet consumed; the
    /// guest's producer index is validated first.
    pub(crate) fn pending<M: GuestMemory>(&self, mem: &M) -> Result<u32, RingError> {
        let g = self.ring.geometry;
        let prod = self.ring.load(mem, Index::Prod)?;
        if !g.in_cycle(prod) {
            return Err(RingError::BadIndex(prod));
        }
        let pending = g.distance(self.cons, prod);
        if pending > g.capacity() {
            return Err(RingError::BadIndex(prod));
        }
        Ok(pending)
    }

    /// Reads the entry at the consumer index (its header, for WQEs).
    pub(crate) fn peek<M: GuestMemory, T: ByteValued>(&self, mem: &M) -> Result<T, RingError> {
        self.ring.read_entry(mem, self.cons)
    }

    /// Reads the entry at the consumer index into `buf` (up to a stride).
    pub(crate) fn peek_bytes<M: GuestMemory>(
        &self,
        mem: &M,
        buf: &mut [u8],
    ) -> Result<(), RingError> {
        self.ring.read_entry_bytes(mem, self.cons, buf)
    }

    /// Consumes the entry at the consumer index (not yet published).
    pub(crate) fn advance(&mut self) {
        self.cons = self.ring.geometry.next(self.cons);
    }

    /// Tells the guest how far the device has consumed.
    pub(crate) fn publish<M: GuestMemory>(&self, mem: &M) -> Result<(), RingError> {
        self.ring.store(mem, Index::Cons, self.cons)
    }

    /// The guest zeroed the indices (QP back to RESET).
    pub(crate) fn reset(&mut self) {
        self.cons = 0;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::arithmetic_side_effects)]

    use pvrdma_abi::ring::RX_OFFSET;
    use pvrdma_abi::wqe::{Cqe, Eqe};
    use vm_memory::GuestMemoryMmap;

    use super::*;

    type Mem = GuestMemoryMmap<()>;
    const HEADER: u64 = 0x1000;

    fn mem() -> Mem {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
    }

    /// Data pages at 0x10000, 0x12000, 0x14000... (non-contiguous).
    fn data(pages: u64) -> Vec<u64> {
        (0..pages).map(|i| 0x1_0000 + i * 0x2000).collect()
    }

    fn producer(n: u32, stride: u32, pages: u64) -> ProducerRing {
        let ring = Ring::new(
            HEADER,
            RX_OFFSET,
            data(pages),
            RingGeometry::new(n).unwrap(),
            stride,
        )
        .unwrap();
        ProducerRing::new(ring)
    }

    fn set_cons(mem: &Mem, v: u32) {
        mem.write_obj(v, GuestAddress(HEADER + RX_OFFSET + 4))
            .unwrap();
    }

    fn prod_tail(mem: &Mem) -> u32 {
        mem.read_obj(GuestAddress(HEADER + RX_OFFSET)).unwrap()
    }

    #[test]
    fn geometry_must_fit_mapped_pages() {
        let g = RingGeometry::new(128).unwrap();
        assert!(Ring::new(HEADER, 8, data(2), g, 64).is_some());
        assert!(Ring::new(HEADER, 8, data(1), g, 64).is_none());
        assert!(Ring::new(HEADER, 8, data(2), g, 48).is_none());
        assert!(Ring::new(HEADER, 8, data(64), g, 8192).is_none());
        assert!(Ring::new(HEADER, 4092, data(2), g, 64).is_none());
        assert!(Ring::new(u64::MAX, 8, data(2), g, 64).is_none());
    }

    #[test]
    fn cq_fills_to_capacity_then_refuses() {
        let mem = mem();
        let mut cq = producer(64, 64, 1);
        for i in 0..64u64 {
            let cqe = Cqe {
                wr_id: i,
                ..Default::default()
            };
            cq.push(&mem, &cqe).unwrap();
        }
        assert_eq!(prod_tail(&mem), 64);
        let full = Cqe {
            wr_id: 99,
            ..Default::default()
        };
        assert!(matches!(cq.push(&mem, &full), Err(RingError::Full)));
        // Nothing overwritten: slot 0 still holds the first entry.
        let first: Cqe = mem.read_obj(GuestAddress(0x1_0000)).unwrap();
        assert_eq!(first.wr_id, 0);
        // The guest consumes one; one more fits, in slot 0.
        set_cons(&mem, 1);
        cq.push(&mem, &full).unwrap();
        let slot0: Cqe = mem.read_obj(GuestAddress(0x1_0000)).unwrap();
        assert_eq!(slot0.wr_id, 99);
        assert_eq!(prod_tail(&mem), 65);
    }

    #[test]
    fn entries_follow_non_contiguous_pages() {
        let mem = mem();
        let mut cq = producer(128, 64, 2);
        for i in 0..65u64 {
            set_cons(&mem, i as u32);
            let cqe = Cqe {
                wr_id: i,
                ..Default::default()
            };
            cq.push(&mem, &cqe).unwrap();
        }
        // Entry 64 is the first of the second data page (0x12000).
        let e: Cqe = mem.read_obj(GuestAddress(0x1_2000)).unwrap();
        assert_eq!(e.wr_id, 64);
    }

    #[test]
    fn hostile_consumer_index_is_refused() {
        let mem = mem();
        let mut ring = producer(8, 64, 1);
        let cqe = Cqe::default();
        // Invalid for the guest's own check, or a consumer ahead of the
        // producer: nothing is written.
        for cons in [16, 0xffff_ffff, 3] {
            set_cons(&mem, cons);
            assert!(matches!(ring.push(&mem, &cqe), Err(RingError::BadIndex(_))));
            assert!(ring.unconsumed(&mem).is_err());
        }
        assert_eq!(prod_tail(&mem), 0);
        set_cons(&mem, 0);
        ring.push(&mem, &cqe).unwrap();
        assert_eq!(ring.unconsumed(&mem).unwrap(), 1);
    }

    #[test]
    fn async_ring_quirk_capacity() {
        // The driver's async ring: 3 data pages of 8-byte entries, N = 1536.
        let mem = mem();
        let mut ring = producer(1536, 8, 3);
        for i in 0..512u32 {
            let eqe = Eqe {
                event_type: 9,
                info: i,
            };
            ring.push(&mem, &eqe).unwrap();
        }
        let eqe = Eqe::default();
        assert!(matches!(ring.push(&mem, &eqe), Err(RingError::Full)));
        // Valid for the driver's check but off the cycle: refused.
        set_cons(&mem, 0x800);
        assert!(matches!(
            ring.push(&mem, &eqe),
            Err(RingError::BadIndex(0x800))
        ));
        // Consume everything: the index wraps at 1024, slots restart at 0.
        set_cons(&mem, 512);
        for _ in 0..512 {
            ring.push(&mem, &eqe).unwrap();
        }
        assert_eq!(prod_tail(&mem), 0);
        set_cons(&mem, 0);
        ring.push(
            &mem,
            &Eqe {
                event_type: 1,
                info: 7,
            },
        )
        .unwrap();
        let slot0: Eqe = mem.read_obj(GuestAddress(0x1_0000)).unwrap();
        assert_eq!(slot0.info, 7);
    }

    #[test]
    fn consumer_validates_producer_index() {
        let mem = mem();
        let ring = Ring::new(HEADER, 0, data(1), RingGeometry::new(16).unwrap(), 128).unwrap();
        let mut sq = ConsumerRing::new(ring);
        assert_eq!(sq.pending(&mem).unwrap(), 0);
        mem.write_obj(5u32, GuestAddress(HEADER)).unwrap();
        assert_eq!(sq.pending(&mem).unwrap(), 5);
        mem.write_obj(7u64, GuestAddress(0x1_0000)).unwrap();
        assert_eq!(sq.peek::<_, u64>(&mem).unwrap(), 7);
        sq.advance();
        sq.publish(&mem).unwrap();
        assert_eq!(mem.read_obj::<u32>(GuestAddress(HEADER + 4)).unwrap(), 1);
        assert_eq!(sq.pending(&mem).unwrap(), 4);
        for bad in [32, u32::MAX] {
            mem.write_obj(bad, GuestAddress(HEADER)).unwrap();
            assert!(matches!(sq.pending(&mem), Err(RingError::BadIndex(_))));
        }
        // More than a lap ahead of the consumer (cons = 1, prod = 18).
        mem.write_obj(18u32, GuestAddress(HEADER)).unwrap();
        assert!(matches!(sq.pending(&mem), Err(RingError::BadIndex(18))));
        sq.reset();
        mem.write_obj(16u32, GuestAddress(HEADER)).unwrap();
        assert_eq!(sq.pending(&mem).unwrap(), 16);
    }
}
