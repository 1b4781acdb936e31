// SPDX-License-Identifier: Apache-2.0
//! The engine's view of the device's memory regions ([`MrTable`] over the
//! session's MRs and guest memory).
//!
//! Every byte the data path writes into guest memory (received payloads,
//! READ responses, atomic results) goes through [`GuestMrs::write`], and
//! so through vm-memory's `write_slice`, which marks the pages in the
//! dirty bitmap migration reads. CQEs and ring indices go through the
//! rings, which write the same way.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::BTreeMap;

use rdma_transport::verbs::{FastReg, MemError, MrInfo, MrTable};
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryRegion};

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

impl<M: GuestMemory> GuestMrs<'_, M> {
    fn mr(&self, key: u32) -> Option<&Mr> {
        self.mrs.get(&mr_index(key)).filter(|mr| mr.key == key)
    }

    /// Calls `f(gpa, range of buf)` for each guest-contiguous piece of
    /// `[iova, iova + len)` of MR `key`: one per run of pages that follow
    /// each other in guest-physical memory, not one per page.
    fn pieces(
        &self,
        key: u32,
        iova: u64,
        len: usize,
        mut f: impl FnMut(GuestAddress, std::ops::Range<usize>) -> Result<(), MemError>,
    ) -> Result<(), MemError> {
        let mr = self.mr(key).ok_or(MemError)?;
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
}

impl<M: GuestMemory> MrTable for GuestMrs<'_, M> {
    fn lookup(&self, key: u32) -> Option<MrInfo> {
        self.mr(key)?.info()
    }

    fn read(&self, key: u32, iova: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let mem = self.mem;
        let len = buf.len();
        self.pieces(key, iova, len, |gpa, range| {
            let dst = buf.get_mut(range).ok_or(MemError)?;
            mem.read_slice(dst, gpa).map_err(|_| MemError)
        })
    }

    fn write(&mut self, key: u32, iova: u64, data: &[u8]) -> Result<(), MemError> {
        let mem = self.mem;
        self.pieces(key, iova, data.len(), |gpa, range| {
            let src = data.get(range).ok_or(MemError)?;
            mem.write_slice(src, gpa).map_err(|_| MemError)
        })
    }

    /// Offsets into the memfd behind guest memory (the view peers map):
    /// each guest-contiguous piece must lie in one region with a file.
    fn locate(
        &self,
        key: u32,
        iova: u64,
        len: usize,
        f: &mut dyn FnMut(u64, u32) -> Result<(), MemError>,
    ) -> Result<(), MemError> {
        let phys = self.mem.physical_memory().ok_or(MemError)?;
        self.pieces(key, iova, len, |gpa, range| {
            let region = phys.find_region(gpa).ok_or(MemError)?;
            let off = gpa.0.checked_sub(region.start_addr().0).ok_or(MemError)?;
            let n = u64::try_from(range.len()).map_err(|_| MemError)?;
            if off.checked_add(n).is_none_or(|end| end > region.len()) {
                return Err(MemError);
            }
            let file = region.file_offset().ok_or(MemError)?;
            let at = file.start().checked_add(off).ok_or(MemError)?;
            f(at, u32::try_from(n).map_err(|_| MemError)?)
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
