// SPDX-License-Identifier: Apache-2.0
//! Memory regions: CREATE_MR (user, DMA and fast-register) / DESTROY_MR,
//! fast registration and invalidation (REG_MR / LOCAL_INV work requests),
//! and the translation of an MR's IOVAs into guest-physical pages that the
//! data path's memory accesses go through.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use pvrdma_abi::cmd::{CreateMrReq, CreateMrResp, DestroyMrReq};
use pvrdma_abi::verbs::{access, mr_flags};
use pvrdma_abi::{PAGE_SIZE, PDIR_MAX_PAGES};
use rdma_transport::verbs::{Access, FastReg, MrInfo};
use vm_memory::GuestMemory;

use super::ctx::{pd_ctx, release_pd, take_pd};
use super::session::Ctx;
use super::{get, KERNEL_CTX};
use crate::caps::MAX_FAST_REG_PAGES;
use crate::error::{check, CmdError};
use crate::pdir::PageDir;

/// Access bits an MR may carry (besides ignorable optional hints).
const MR_ACCESS: u32 = access::LOCAL_WRITE
    | access::REMOTE_WRITE
    | access::REMOTE_READ
    | access::REMOTE_ATOMIC
    | access::MW_BIND;

/// IOVAs `[iova, iova + len)` backed by guest pages: page `i` holds the
/// IOVAs from `(iova & !0xfff) + i * 4096`, as snapshotted at registration.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Mapping {
    iova: u64,
    len: u64,
    pages: Vec<u64>,
}

impl Mapping {
    /// The guest address of `iova` and how many bytes from there are
    /// guest-physically contiguous: to the end of its page, and on over
    /// the pages after it while each starts where the one before ends,
    /// until `want` bytes are covered (more may be reported). `None` if
    /// `iova` is not mapped.
    ///
    /// One run is one copy and one dirty-bitmap update instead of one per
    /// page; the page list is the guest's, so nothing is assumed of it:
    /// the walk stops at the first page that does not follow, and at
    /// most `want` bytes' worth of pages are looked at.
    fn translate(&self, iova: u64, want: u64) -> Option<(u64, u64)> {
        let rel = iova.checked_sub(self.iova & !(PAGE_SIZE - 1))?;
        let first = usize::try_from(rel / PAGE_SIZE).ok()?;
        let page = *self.pages.get(first)?;
        let in_page = rel % PAGE_SIZE;
        let mut run = PAGE_SIZE.checked_sub(in_page)?;
        let mut end = page.checked_add(PAGE_SIZE);
        for &next in self.pages.get(first.checked_add(1)?..)? {
            if run >= want || end != Some(next) {
                break;
            }
            run = run.checked_add(PAGE_SIZE)?;
            end = next.checked_add(PAGE_SIZE);
        }
        Some((page.checked_add(in_page)?, run))
    }
}

/// What an MR maps.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) enum Region {
    /// All of guest memory, addressed by GPA; kernel PDs, local access only.
    Dma,
    /// Up to `max_pages` pages, mapped by a REG_MR work request, unmapped
    /// by LOCAL_INV (or SEND_WITH_INV).
    Fast {
        max_pages: u32,
        map: Option<Mapping>,
    },
    /// A user registration.
    User(Mapping),
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Mr {
    pub(crate) pd: u32,
    /// Pages charged to the mapping budget.
    pub(crate) pages: u64,
    pub(crate) region: Region,
    pub(crate) access: u32,
    /// lkey and rkey (the same value); REG_MR may change its key byte.
    pub(crate) key: u32,
}

impl Mr {
    /// What the data path may do with the MR, `None` while a fast-register
    /// MR is invalid.
    pub(crate) fn info(&self) -> Option<MrInfo> {
        let (iova, len) = match &self.region {
            Region::Dma => (0, u64::MAX),
            Region::Fast { map: None, .. } => return None,
            Region::Fast { map: Some(m), .. } | Region::User(m) => (m.iova, m.len),
        };
        Some(MrInfo {
            pd: self.pd,
            access: Access::from_bits_truncate(self.access),
            iova,
            len,
        })
    }

    /// Guest address of `iova` and how many bytes are contiguous from
    /// there (a run of pages, at least to the end of its page, looked at
    /// up to `want` bytes; for the DMA MR, unbounded).
    pub(crate) fn translate(&self, iova: u64, want: u64) -> Option<(u64, u64)> {
        match &self.region {
            Region::Dma => Some((iova, u64::MAX.saturating_sub(iova))),
            Region::Fast { map: None, .. } => None,
            Region::Fast { map: Some(m), .. } | Region::User(m) => m.translate(iova, want),
        }
    }

    /// LOCAL_INV / SEND_WITH_INV of `key` from PD `pd`: only a valid
    /// fast-register MR of that PD with that exact key.
    pub(crate) fn invalidate(&mut self, key: u32, pd: u32) -> bool {
        match &mut self.region {
            Region::Fast { map, .. } if self.key == key && self.pd == pd && map.is_some() => {
                *map = None;
                true
            }
            _ => false,
        }
    }

    /// REG_MR: maps an invalid fast-register MR of PD `pd` over the page
    /// list at `fr.page_list` (a page directory, read and checked here).
    pub(crate) fn fast_reg<M: GuestMemory>(&mut self, mem: &M, fr: &FastReg, pd: u32) -> bool {
        let Region::Fast { max_pages, map } = &mut self.region else {
            return false;
        };
        let same_index = fr.key >> 8 == self.key >> 8;
        let fits = fr.len > 0
            && fr.pages <= *max_pages
            && spanned_pages(fr.iova, fr.len).is_some_and(|p| p <= u64::from(fr.pages));
        let Ok(access) = check_access(fr.access) else {
            return false;
        };
        if !same_index || !fits || self.pd != pd || map.is_some() {
            return false;
        }
        let pages =
            PageDir::new(mem, fr.page_list, fr.pages).and_then(|dir| dir.pages(mem, 0..fr.pages));
        let Ok(pages) = pages else { return false };
        *map = Some(Mapping {
            iova: fr.iova,
            len: fr.len,
            pages,
        });
        self.key = fr.key;
        self.access = access;
        true
    }
}

fn check_access(flags: u32) -> Result<u32, CmdError> {
    let kept = flags & !access::OPTIONAL;
    check(kept & !MR_ACCESS == 0, "MR access flags")?;
    let remote_write = access::REMOTE_WRITE | access::REMOTE_ATOMIC;
    check(
        kept & remote_write == 0 || kept & access::LOCAL_WRITE != 0,
        "MR access flags (remote write without local write)",
    )?;
    Ok(kept)
}

/// Pages spanned by `[start, start + length)`.
fn spanned_pages(start: u64, length: u64) -> Option<u64> {
    start.checked_add(length)?;
    (start & (PAGE_SIZE - 1))
        .checked_add(length)
        .map(|bytes| bytes.div_ceil(PAGE_SIZE))
}

/// Validates and snapshots the region of a create request; returns it with
/// the pages it charges.
fn region<M: GuestMemory>(
    cx: &Ctx<'_, M>,
    req: &CreateMrReq,
    pd_ctx: u32,
    access: u32,
) -> Result<(Region, u64), CmdError> {
    let limits = &cx.env.config.limits;
    match req.flags {
        mr_flags::DMA => {
            check(pd_ctx == KERNEL_CTX, "DMA MR on a user PD")?;
            check(access & !access::LOCAL_WRITE == 0, "DMA MR access flags")?;
            Ok((Region::Dma, 0))
        }
        mr_flags::FRMR => {
            check(
                (1..=MAX_FAST_REG_PAGES).contains(&req.nchunks),
                "FRMR page count",
            )?;
            let pages = u64::from(req.nchunks);
            cx.s.objects.check_pages(limits, pages)?;
            let max_pages = req.nchunks;
            Ok((
                Region::Fast {
                    max_pages,
                    map: None,
                },
                pages,
            ))
        }
        0 => {
            check((1..=limits.max_mr_size).contains(&req.length), "MR length")?;
            let spanned = spanned_pages(req.start, req.length)
                .filter(|&p| p <= u64::from(PDIR_MAX_PAGES))
                .ok_or(CmdError::Invalid("MR range"))?;
            check(spanned == u64::from(req.nchunks), "MR page count")?;
            cx.s.objects.check_pages(limits, spanned)?;
            let pdir = PageDir::new(cx.mem, req.pdir_dma, req.nchunks)?;
            let pages = pdir.pages(cx.mem, 0..req.nchunks)?;
            let map = Mapping {
                iova: req.start,
                len: req.length,
                pages,
            };
            Ok((Region::User(map), spanned))
        }
        _ => Err(CmdError::Invalid("MR flags")),
    }
}

pub(crate) fn handle_create_mr<M: GuestMemory>(
    cx: &mut Ctx<'_, M>,
    req: &CreateMrReq,
) -> Result<CreateMrResp, CmdError> {
    let ctx = pd_ctx(&cx.s.objects, req.pd_handle)?;
    let access = check_access(req.access_flags)?;
    let (region, pages) = region(cx, req, ctx, access)?;
    let (handle, key) = cx.s.ns.mr.alloc().ok_or(CmdError::Exhausted("MRs"))?;
    take_pd(&mut cx.s.objects, req.pd_handle);
    cx.s.objects.add_pages(pages);
    cx.s.objects.mrs.insert(
        handle,
        Mr {
            pd: req.pd_handle,
            pages,
            region,
            access,
            key,
        },
    );
    Ok(CreateMrResp {
        mr_handle: handle,
        lkey: key,
        rkey: key,
        ..Default::default()
    })
}

pub(crate) fn handle_destroy_mr<M>(
    cx: &mut Ctx<'_, M>,
    req: &DestroyMrReq,
) -> Result<(), CmdError> {
    let handle = req.mr_handle;
    let mr = get(&cx.s.objects.mrs, "MR", handle)?;
    let (pd, pages) = (mr.pd, mr.pages);
    cx.s.objects.mrs.remove(&handle);
    release_pd(&mut cx.s.objects, pd);
    cx.s.objects.sub_pages(pages);
    cx.s.ns.mr.free(handle);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_rules() {
        assert_eq!(check_access(0).ok(), Some(0));
        assert_eq!(check_access(0x7).ok(), Some(0x7));
        assert_eq!(check_access(0x1 | 1 << 20).ok(), Some(0x1), "optional hint");
        assert!(check_access(access::REMOTE_WRITE).is_err());
        assert!(check_access(access::REMOTE_ATOMIC | access::REMOTE_READ).is_err());
        assert!(check_access(access::ON_DEMAND | access::LOCAL_WRITE).is_err());
        assert!(check_access(access::ZERO_BASED).is_err());
    }

    #[test]
    fn translation_runs_over_pages_that_follow_each_other() {
        let map = |pages: &[u64]| Mapping {
            iova: 0x5000_0800,
            len: 0x1_0000,
            pages: pages.to_vec(),
        };
        let m = map(&[0x10000, 0x11000, 0x12000, 0x30000, 0x31000]);
        // From mid-page: the rest of it, then whole pages up to `want`.
        assert_eq!(m.translate(0x5000_0800, 100), Some((0x10800, 0x800)));
        assert_eq!(m.translate(0x5000_0800, 0x801), Some((0x10800, 0x1800)));
        assert_eq!(m.translate(0x5000_0800, 1 << 20), Some((0x10800, 0x2800)));
        // A page that does not follow ends the run; the next one starts.
        assert_eq!(m.translate(0x5000_2000, 1 << 20), Some((0x12000, 0x1000)));
        assert_eq!(m.translate(0x5000_3010, 1 << 20), Some((0x30010, 0x1ff0)));
        assert_eq!(m.translate(0x5000_5000, 1), None, "beyond the pages");
        assert_eq!(m.translate(0x4fff_f000, 1), None, "below the MR");
        // Hostile lists: a page at the top of the address space, a list
        // that goes backwards, the same page twice.
        let top = !0xfff_u64;
        let m = map(&[top, 0, 0x1000, 0x1000]);
        assert_eq!(m.translate(0x5000_0000, 1 << 20), Some((top, 0x1000)));
        assert_eq!(m.translate(0x5000_1000, 1 << 20), Some((0, 0x2000)));
        assert_eq!(m.translate(0x5000_3000, 1 << 20), Some((0x1000, 0x1000)));
    }

    #[test]
    fn spanned_page_counts() {
        assert_eq!(spanned_pages(0x1000, 0x1000), Some(1));
        assert_eq!(spanned_pages(0x1800, 0x1000), Some(2));
        assert_eq!(spanned_pages(0x1fff, 2), Some(2));
        assert_eq!(spanned_pages(0x1234, 1), Some(1));
        assert_eq!(spanned_pages(u64::MAX - 10, 100), None);
        assert_eq!(spanned_pages(!0xfff, 0x1000), None);
    }
}
