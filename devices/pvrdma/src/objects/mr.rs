// SPDX-License-Identifier: Apache-2.0
//! Memory regions: CREATE_MR (user, DMA and fast-register) / DESTROY_MR.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use pvrdma_abi::cmd::{CreateMrReq, CreateMrResp, DestroyMrReq};
use pvrdma_abi::verbs::{access, mr_flags};
use pvrdma_abi::{PAGE_SIZE, PDIR_MAX_PAGES};
use vm_memory::GuestMemory;

use super::ctx::{pd_ctx, release_pd, take_pd};
use super::{get, KERNEL_CTX};
use crate::caps::MAX_FAST_REG_PAGES;
use crate::cmd::{check, CmdError};
use crate::pdir::PageDir;
use crate::state::Ctx;

/// Access bits an MR may carry (besides ignorable optional hints).
const MR_ACCESS: u32 = access::LOCAL_WRITE
    | access::REMOTE_WRITE
    | access::REMOTE_READ
    | access::REMOTE_ATOMIC
    | access::MW_BIND;

/// What an MR maps.
#[derive(Debug)]
#[expect(dead_code, reason = "read by the transport engine (next issue)")]
pub(crate) enum Region {
    /// All of guest memory, addressed by GPA; kernel PDs, local access only.
    Dma,
    /// Up to `max_pages` pages, mapped later by a fast-register WR.
    Fast { max_pages: u32 },
    /// `length` bytes at IOVA `start`, backed by `pages` (the first holds
    /// `start`), as snapshotted at registration.
    User {
        start: u64,
        length: u64,
        pages: Vec<u64>,
    },
}

#[derive(Debug)]
pub(crate) struct Mr {
    pub(crate) pd: u32,
    /// Pages charged to the mapping budget.
    pub(crate) pages: u64,
    #[expect(dead_code, reason = "read by the transport engine (next issue)")]
    pub(crate) region: Region,
    #[expect(dead_code, reason = "read by the transport engine (next issue)")]
    pub(crate) access: u32,
    /// lkey and rkey (the same value).
    #[expect(dead_code, reason = "read by the transport engine (next issue)")]
    pub(crate) key: u32,
}

/// `ib_check_mr_access`: known bits only, and remote write or atomic
/// access needs local write. Returns the bits the device keeps.
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
            Ok((Region::Fast { max_pages }, pages))
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
            let (start, length) = (req.start, req.length);
            Ok((
                Region::User {
                    start,
                    length,
                    pages,
                },
                spanned,
            ))
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
    fn spanned_page_counts() {
        assert_eq!(spanned_pages(0x1000, 0x1000), Some(1));
        assert_eq!(spanned_pages(0x1800, 0x1000), Some(2));
        assert_eq!(spanned_pages(0x1fff, 2), Some(2));
        assert_eq!(spanned_pages(0x1234, 1), Some(1));
        assert_eq!(spanned_pages(u64::MAX - 10, 100), None);
        assert_eq!(spanned_pages(!0xfff, 0x1000), None);
    }
}
