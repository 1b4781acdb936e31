// SPDX-License-Identifier: Apache-2.0
//! The engine's view of the device's memory regions ([`MrTable`] over the
//! session's MRs and guest memory).
//!
//! Every byte the data path writes into guest memory (received payloads,
//! READ responses, atomic results) goes through `GuestMrs::write_payload`
//! (`write` is a payload of one piece), and so through a region's
//! `VolatileSlice::copy_from`, which marks the pages in the dirty bitmap
//! migration reads. CQEs go through the rings, which write the same way,
//! and ring indices through vm-memory's `store`, which marks them too.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::BTreeMap;
use std::ops::Range;

use rdma_transport::packet::{Located, Payload};
use rdma_transport::verbs::{FastReg, MemError, MrInfo, MrTable};
use vm_memory::bitmap::BS;
use vm_memory::{
    Address, GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryRegion, VolatileSlice,
};

use super::local::{LocalChannel, SETTLE_WAIT};
use crate::namespace::mr_index;
use crate::objects::mr::Mr;

/// The MRs of one session over guest memory.
pub(crate) struct GuestMrs<'a, M> {
    pub(crate) mem: &'a M,
    pub(crate) mrs: &'a mut BTreeMap<u32, Mr>,
    /// The same-host channel, whose peers may copy from our MRs' pages
    /// (`share_memory`): an MR is unmapped (LOCAL_INV, SEND_WITH_INV) or
    /// remapped (REG_MR) only once they are done, as at DESTROY_MR.
    pub(crate) local: Option<&'a LocalChannel>,
}

/// The regions of guest memory, the last one found remembered: the
/// pieces of one access nearly always lie in the region of the piece
/// before, where a lookup is a search of the region list.
struct Regions<'m, P: GuestMemoryBackend + ?Sized> {
    phys: &'m P,
    last: Option<&'m P::R>,
}

impl<'m, P: GuestMemoryBackend + ?Sized> Regions<'m, P> {
    fn new(phys: &'m P) -> Self {
        Self { phys, last: None }
    }

    /// The region holding `gpa`.
    fn at(&mut self, gpa: GuestAddress) -> Option<&'m P::R> {
        if let Some(r) = self.last.filter(|r| r.to_region_addr(gpa).is_some()) {
            return Some(r);
        }
        let r = self.phys.find_region(gpa)?;
        self.last = Some(r);
        Some(r)
    }
}

/// Calls `f(slice, range of buf)` for the guest memory of
/// `[gpa, gpa + range.len())`, one slice per region it lies in (nearly
/// always one): one region lookup per guest-contiguous piece, where
/// vm-memory's `read_slice` / `write_slice` build an iterator of slices
/// for each call, which cost more than the lookup (callgrind, see
/// docs/benchmarks.md). Fails where the piece leaves guest memory.
fn spans<P: GuestMemoryBackend + ?Sized>(
    regions: &mut Regions<'_, P>,
    gpa: GuestAddress,
    range: Range<usize>,
    mut f: impl FnMut(
        VolatileSlice<'_, BS<'_, <P::R as GuestMemoryRegion>::B>>,
        Range<usize>,
    ) -> Result<(), MemError>,
) -> Result<(), MemError> {
    let mut at = gpa;
    let mut start = range.start;
    while start < range.end {
        let region = regions.at(at).ok_or(MemError)?;
        let off = region.to_region_addr(at).ok_or(MemError)?;
        let room = region.len().checked_sub(off.raw_value()).ok_or(MemError)?;
        let left = range.end.checked_sub(start).ok_or(MemError)?;
        let n = usize::try_from(room).unwrap_or(usize::MAX).min(left);
        let end = start.checked_add(n).ok_or(MemError)?;
        let slice = region.get_slice(off, n).map_err(|_| MemError)?;
        f(slice, start..end)?;
        at = at
            .checked_add(u64::try_from(n).map_err(|_| MemError)?)
            .ok_or(MemError)?;
        start = end;
    }
    Ok(())
}

/// Calls `f(gpa, range of buf)` for each guest-contiguous piece of
/// `[iova, iova + len)` of `mr`: one per run of pages that follow each
/// other in guest-physical memory, not one per page.
fn pieces(
    mr: &Mr,
    iova: u64,
    len: usize,
    mut f: impl FnMut(GuestAddress, Range<usize>) -> Result<(), MemError>,
) -> Result<(), MemError> {
    let mut done = 0usize;
    while done < len {
        let at = iova
            .checked_add(u64::try_from(done).map_err(|_| MemError)?)
            .ok_or(MemError)?;
        let left = len.checked_sub(done).ok_or(MemError)?;
        let want = u64::try_from(left).map_err(|_| MemError)?;
        let (gpa, room) = mr.translate(at, want).ok_or(MemError)?;
        let n = usize::try_from(room).unwrap_or(usize::MAX).min(left);
        if n == 0 {
            return Err(MemError);
        }
        let end = done.checked_add(n).ok_or(MemError)?;
        f(GuestAddress(gpa), done..end)?;
        done = end;
    }
    Ok(())
}

impl<M: GuestMemory> GuestMrs<'_, M> {
    fn mr(&self, key: u32) -> Option<&Mr> {
        self.mrs.get(&mr_index(key)).filter(|mr| mr.key == key)
    }
}

impl<M: GuestMemory> MrTable for GuestMrs<'_, M> {
    fn lookup(&self, key: u32) -> Option<MrInfo> {
        self.mr(key)?.info()
    }

    fn read(&self, key: u32, iova: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let mr = self.mr(key).ok_or(MemError)?;
        let mut regions = Regions::new(self.mem.physical_memory().ok_or(MemError)?);
        let len = buf.len();
        pieces(mr, iova, len, |gpa, range| {
            spans(&mut regions, gpa, range, |slice, range| {
                let dst = buf.get_mut(range).ok_or(MemError)?;
                if slice.copy_to(dst) == dst.len() {
                    Ok(())
                } else {
                    Err(MemError)
                }
            })
        })
    }

    fn write(&mut self, key: u32, iova: u64, data: &[u8]) -> Result<(), MemError> {
        self.write_payload(key, iova, Payload::from(data))
    }

    /// One MR lookup for all of the payload's pieces (a described
    /// record's runs, one per page of the sender's memory where its pages
    /// are scattered), and one region lookup for as long as they stay in
    /// a region.
    fn write_payload(&mut self, key: u32, iova: u64, data: Payload<'_>) -> Result<(), MemError> {
        let mr = self.mr(key).ok_or(MemError)?;
        let mut regions = Regions::new(self.mem.physical_memory().ok_or(MemError)?);
        let mut at = iova;
        for piece in data.pieces() {
            pieces(mr, at, piece.len(), |gpa, range| {
                spans(&mut regions, gpa, range, |slice, range| {
                    let src = piece.get(range).ok_or(MemError)?;
                    if src.len() != slice.len() {
                        return Err(MemError);
                    }
                    // Marks the slice's pages in the region's dirty bitmap.
                    slice.copy_from(src);
                    Ok(())
                })
            })?;
            let n = u64::try_from(piece.len()).map_err(|_| MemError)?;
            at = at.checked_add(n).ok_or(MemError)?;
        }
        Ok(())
    }

    /// Offsets into the memfd behind guest memory (the view peers map):
    /// each guest-contiguous piece must lie in one region with a file.
    fn locate(&self, key: u32, iova: u64, len: usize, out: &mut Located) -> Result<(), MemError> {
        let mr = self.mr(key).ok_or(MemError)?;
        let mut regions = Regions::new(self.mem.physical_memory().ok_or(MemError)?);
        pieces(mr, iova, len, |gpa, range| {
            let region = regions.at(gpa).ok_or(MemError)?;
            let off = gpa.0.checked_sub(region.start_addr().0).ok_or(MemError)?;
            let n = u64::try_from(range.len()).map_err(|_| MemError)?;
            if off.checked_add(n).is_none_or(|end| end > region.len()) {
                return Err(MemError);
            }
            let file = region.file_offset().ok_or(MemError)?;
            let at = file.start().checked_add(off).ok_or(MemError)?;
            out.push(at, u32::try_from(n).map_err(|_| MemError)?)
                .ok_or(MemError)
        })
    }

    fn invalidate(&mut self, key: u32, pd: u32) -> bool {
        if let Some(local) = self.local {
            local.settle(mr_index(key), SETTLE_WAIT);
        }
        self.mrs
            .get_mut(&mr_index(key))
            .is_some_and(|mr| mr.invalidate(key, pd))
    }

    fn fast_reg(&mut self, fr: &FastReg, pd: u32) -> bool {
        if let Some(local) = self.local {
            local.settle(mr_index(fr.key), SETTLE_WAIT);
        }
        let mem = self.mem;
        self.mrs
            .get_mut(&mr_index(fr.key))
            .is_some_and(|mr| mr.fast_reg(mem, fr, pd))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use vm_memory::bitmap::AtomicBitmap;
    use vm_memory::{Bytes, GuestMemoryMmap};

    use super::*;

    /// Two regions that follow each other: [0, 8 KiB) and [8 KiB, 16 KiB).
    fn two_regions() -> GuestMemoryMmap<AtomicBitmap> {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x2000), (GuestAddress(0x2000), 0x2000)])
            .unwrap()
    }

    #[test]
    fn a_piece_across_two_regions_is_two_slices_and_one_beyond_memory_fails() {
        let mem = two_regions();
        let data: Vec<u8> = (0..0x2000u32).map(|i| i as u8).collect();
        let mut seen = Vec::new();
        spans(
            &mut Regions::new(&mem),
            GuestAddress(0x1000),
            0..0x2000,
            |slice, range| {
                seen.push(range.clone());
                slice.copy_from(&data[range]);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(seen, [0..0x1000, 0x1000..0x2000]);
        let mut back = vec![0u8; 0x2000];
        mem.read_slice(&mut back, GuestAddress(0x1000)).unwrap();
        assert_eq!(back, data);

        // Past the end of guest memory, and wholly outside it.
        for (gpa, range) in [(0x3000, 0..0x2000), (0x4000, 0..1), (u64::MAX, 0..2)] {
            let got = spans(&mut Regions::new(&mem), GuestAddress(gpa), range, |_, _| {
                Ok(())
            });
            assert!(got.is_err(), "{gpa:#x}");
        }
    }
}
