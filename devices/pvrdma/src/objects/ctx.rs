// SPDX-License-Identifier: Apache-2.0
//! User contexts (CREATE_UC / DESTROY_UC), protection domains
//! (CREATE_PD / DESTROY_PD), and the opcode numbering each kind of
//! context's guest code writes and reads.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use pvrdma_abi::cmd::{
    CreatePdReq, CreatePdResp, CreateUcReq, CreateUcResp, DestroyPdReq, DestroyUcReq,
};
use pvrdma_abi::regs::version;
use pvrdma_abi::wqe::{send_opcode, uverbs_send_opcode, uverbs_wc_opcode, wc_opcode};
use pvrdma_abi::PAGE_SHIFT;
use rdma_transport::verbs::{WcOpcode, WrOpcode};

use super::session::Ctx;
use super::{get, Refs, KERNEL_CTX};
use crate::error::CmdError;

/// A user context: one process's verbs context and its UAR page.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Context {
    /// Index of its page in BAR2 (never 0, the kernel's).
    pub(crate) uar_index: u32,
    /// Its PDs and CQs.
    pub(crate) refs: Refs,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Pd {
    pub(crate) ctx: u32,
    /// Its MRs, QPs and SRQs.
    pub(crate) refs: Refs,
}

/// The UAR index of absolute page number `pfn`: it must lie in BAR2
/// (computed against BAR2's current base, remembered from then on).
fn uar_index(pfn: u64, bar2: Option<u64>, max_uar: u32) -> Result<u32, CmdError> {
    let base = bar2.ok_or(CmdError::Invalid("UAR PFN (BAR2 not placed)"))? >> PAGE_SHIFT;
    let index = pfn
        .checked_sub(base)
        .and_then(|i| u32::try_from(i).ok())
        .filter(|&i| i < max_uar)
        .ok_or(CmdError::Invalid("UAR PFN outside BAR2"))?;
    if index == 0 {
        return Err(CmdError::Invalid("UAR PFN of the kernel's page"));
    }
    Ok(index)
}

pub(crate) fn handle_create_uc<M>(
    cx: &mut Ctx<'_, M>,
    req: &CreateUcReq,
) -> Result<CreateUcResp, CmdError> {
    // Older drivers write a 32-bit PFN and may leave garbage above it.
    let pfn = if cx.s.dsr.driver_version >= version::PPN64 {
        req.pfn64
    } else {
        req.pfn64 & u64::from(u32::MAX)
    };
    let index = uar_index(pfn, cx.bar2, cx.env.config.limits.max_uar)?;
    let objects = &mut cx.s.objects;
    if objects.ctxs.values().any(|c| c.uar_index == index) {
        return Err(CmdError::Busy {
            kind: "UAR page",
            handle: index,
        });
    }
    let handle = cx.s.ns.ctx.alloc().ok_or(CmdError::Exhausted("contexts"))?;
    objects.ctxs.insert(
        handle,
        Context {
            uar_index: index,
            refs: Refs::default(),
        },
    );
    Ok(CreateUcResp {
        ctx_handle: handle,
        ..Default::default()
    })
}

pub(crate) fn handle_destroy_uc<M>(
    cx: &mut Ctx<'_, M>,
    req: &DestroyUcReq,
) -> Result<(), CmdError> {
    let handle = req.ctx_handle;
    let ctx = get(&cx.s.objects.ctxs, "context", handle)?;
    ctx.refs.check_unused("context", handle)?;
    cx.s.objects.ctxs.remove(&handle);
    cx.s.ns.ctx.free(handle);
    Ok(())
}

/// Takes a reference on context `ctx`, which the caller checked exists
/// (the kernel's needs none).
pub(crate) fn take_ctx(objects: &mut super::Objects, ctx: u32) {
    if let Some(c) = objects.ctxs.get_mut(&ctx) {
        c.refs.take();
    }
}

pub(crate) fn release_ctx(objects: &mut super::Objects, ctx: u32) {
    if let Some(c) = objects.ctxs.get_mut(&ctx) {
        c.refs.release();
    }
}

pub(crate) fn handle_create_pd<M>(
    cx: &mut Ctx<'_, M>,
    req: &CreatePdReq,
) -> Result<CreatePdResp, CmdError> {
    let ctx = req.ctx_handle;
    cx.s.objects.uar_page(ctx)?;
    let handle = cx.s.ns.pd.alloc().ok_or(CmdError::Exhausted("PDs"))?;
    take_ctx(&mut cx.s.objects, ctx);
    cx.s.objects.pds.insert(
        handle,
        Pd {
            ctx,
            refs: Refs::default(),
        },
    );
    Ok(CreatePdResp {
        pd_handle: handle,
        ..Default::default()
    })
}

pub(crate) fn handle_destroy_pd<M>(
    cx: &mut Ctx<'_, M>,
    req: &DestroyPdReq,
) -> Result<(), CmdError> {
    let handle = req.pd_handle;
    let pd = get(&cx.s.objects.pds, "PD", handle)?;
    pd.refs.check_unused("PD", handle)?;
    let ctx = pd.ctx;
    cx.s.objects.pds.remove(&handle);
    release_ctx(&mut cx.s.objects, ctx);
    cx.s.ns.pd.free(handle);
    Ok(())
}

/// The context of PD `pd`.
pub(crate) fn pd_ctx(objects: &super::Objects, pd: u32) -> Result<u32, CmdError> {
    get(&objects.pds, "PD", pd).map(|p| p.ctx)
}

/// Takes a reference on PD `pd`, which the caller checked exists.
pub(crate) fn take_pd(objects: &mut super::Objects, pd: u32) {
    if let Some(p) = objects.pds.get_mut(&pd) {
        p.refs.take();
    }
}

pub(crate) fn release_pd(objects: &mut super::Objects, pd: u32) {
    if let Some(p) = objects.pds.get_mut(&pd) {
        p.refs.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uar_index_from_pfn() {
        let bar2 = Some(0x1_0000_0000);
        let base = 0x1_0000_0000 >> 12;
        assert_eq!(uar_index(base + 5, bar2, 512).ok(), Some(5));
        assert_eq!(uar_index(base + 511, bar2, 512).ok(), Some(511));
        for pfn in [base, base + 512, base - 1, 0, u64::MAX] {
            assert!(uar_index(pfn, bar2, 512).is_err(), "pfn {pfn:#x}");
        }
        assert!(uar_index(base + 1, None, 512).is_err());
    }
}

/// Whose opcode numbering a QP's WQEs and CQEs use (ABI doc 4.4, 4.5): the
/// kernel driver translates into the ABI's enums, rdma-core casts its
/// ibverbs numbers through (the same for 0-6 and 128/129 only). A QP
/// belongs to the context of its PD; the kernel's is context 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Numbering {
    Kernel,
    User,
}

impl Numbering {
    /// The numbering of a QP whose PD belongs to context `ctx`.
    pub(crate) fn of_ctx(ctx: Option<u32>) -> Self {
        if ctx == Some(KERNEL_CTX) {
            Numbering::Kernel
        } else {
            Numbering::User
        }
    }

    /// The engine's opcode of a send WQE's `opcode`; `None` for what the
    /// device does not do (LSO, masked atomics, memory windows, signature
    /// MRs, the driver's ERROR) or what no guest writes. Fast registration
    /// is the kernel's alone.
    pub(crate) fn wr_opcode(self, op: u32) -> Option<WrOpcode> {
        Some(match (self, op) {
            (_, send_opcode::RDMA_WRITE) => WrOpcode::RdmaWrite,
            (_, send_opcode::RDMA_WRITE_WITH_IMM) => WrOpcode::RdmaWriteWithImm,
            (_, send_opcode::SEND) => WrOpcode::Send,
            (_, send_opcode::SEND_WITH_IMM) => WrOpcode::SendWithImm,
            (_, send_opcode::RDMA_READ) => WrOpcode::RdmaRead,
            (_, send_opcode::ATOMIC_CMP_AND_SWP) => WrOpcode::AtomicCmpAndSwp,
            (_, send_opcode::ATOMIC_FETCH_AND_ADD) => WrOpcode::AtomicFetchAndAdd,
            (Numbering::Kernel, send_opcode::SEND_WITH_INV) => WrOpcode::SendWithInv,
            (Numbering::Kernel, send_opcode::LOCAL_INV) => WrOpcode::LocalInv,
            (Numbering::Kernel, send_opcode::FAST_REG_MR) => WrOpcode::RegMr,
            (Numbering::User, uverbs_send_opcode::SEND_WITH_INV) => WrOpcode::SendWithInv,
            (Numbering::User, uverbs_send_opcode::LOCAL_INV) => WrOpcode::LocalInv,
            _ => return None,
        })
    }

    /// The CQE `opcode` of an engine completion opcode.
    pub(crate) fn wc_opcode(self, op: WcOpcode) -> u32 {
        match (self, op) {
            (_, WcOpcode::Send) => wc_opcode::SEND,
            (_, WcOpcode::RdmaWrite) => wc_opcode::RDMA_WRITE,
            (_, WcOpcode::RdmaRead) => wc_opcode::RDMA_READ,
            (_, WcOpcode::CompSwap) => wc_opcode::COMP_SWAP,
            (_, WcOpcode::FetchAdd) => wc_opcode::FETCH_ADD,
            (Numbering::Kernel, WcOpcode::LocalInv) => wc_opcode::LOCAL_INV,
            (Numbering::User, WcOpcode::LocalInv) => uverbs_wc_opcode::LOCAL_INV,
            (_, WcOpcode::RegMr) => wc_opcode::FAST_REG_MR,
            (_, WcOpcode::Recv) => wc_opcode::RECV,
            (_, WcOpcode::RecvRdmaWithImm) => wc_opcode::RECV_RDMA_WITH_IMM,
        }
    }

    /// The completion opcode of a send WQE's `opcode`, for its error or
    /// flush completion (SEND for an opcode that is no opcode).
    pub(crate) fn send_wc(self, op: u32) -> WcOpcode {
        self.wr_opcode(op)
            .map_or(WcOpcode::Send, WrOpcode::wc_opcode)
    }
}
