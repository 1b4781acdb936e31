// SPDX-License-Identifier: Apache-2.0
//! Shared receive queues: CREATE_SRQ / MODIFY_SRQ / QUERY_SRQ /
//! DESTROY_SRQ and the SRQ doorbell.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use pvrdma_abi::cmd::{
    CreateSrqReq, CreateSrqResp, DestroySrqReq, ModifySrqReq, QuerySrqReq, QuerySrqResp,
};
use pvrdma_abi::ring::{RingGeometry, RX_OFFSET};
use pvrdma_abi::verbs::{srq_attr_mask, SrqAttr, SRQ_TYPE_BASIC};
use pvrdma_abi::wqe::{event, rq_stride};
use vm_memory::GuestMemory;

use super::ctx::{pd_ctx, release_pd, take_pd};
use super::session::Ctx;
use super::{get, get_mut, Refs};
use crate::config::pages_for;
use crate::env::Env;
use crate::error::{check, CmdError};
use crate::events::EventRings;
use crate::pdir::PageDir;
use crate::ring::{ConsumerRing, Ring};
use crate::uar::{Doorbell, Doorbells};

/// An SRQ's doorbells.
pub(crate) const DOORBELLS: [Doorbell; 1] = [Doorbell::SrqRecv];

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Srq {
    pub(crate) gen: u64,
    pub(crate) ctx: u32,
    pub(crate) pd: u32,
    pub(crate) ring: ConsumerRing,
    pub(crate) max_sge: u32,
    /// SRQ_LIMIT_REACHED fires when fewer WQEs remain (0 = disarmed).
    pub(crate) limit: u32,
    /// Its ring state went bad: SRQ_ERR was posted.
    pub(crate) broken: bool,
    /// QPs using it.
    pub(crate) refs: Refs,
    pub(crate) pages: u64,
    pub(crate) doorbells: Doorbells,
}

pub(crate) fn handle_create_srq<M: GuestMemory>(
    cx: &mut Ctx<'_, M>,
    req: &CreateSrqReq,
) -> Result<CreateSrqResp, CmdError> {
    let limits = &cx.env.config.limits;
    let ctx = pd_ctx(&cx.s.objects, req.pd_handle)?;
    let page = cx.s.objects.uar_page(ctx)?;
    if req.srq_type != SRQ_TYPE_BASIC {
        return Err(CmdError::Unsupported("SRQ type"));
    }
    let attrs = req.attrs;
    check(
        attrs.max_wr.is_power_of_two() && attrs.max_wr <= limits.max_srq_wr,
        "SRQ size",
    )?;
    check(
        (1..=limits.max_srq_sge).contains(&attrs.max_sge),
        "SRQ SGE count",
    )?;
    check(attrs.srq_limit <= attrs.max_wr, "SRQ limit")?;
    let stride = rq_stride(attrs.max_sge).ok_or(CmdError::Invalid("SRQ SGE count"))?;
    let total = pages_for(attrs.max_wr, stride)
        .and_then(|data| data.checked_add(1))
        .ok_or(CmdError::Invalid("SRQ size"))?;
    check(req.nchunks >= total, "SRQ page count")?;
    cx.s.objects.check_pages(limits, total.into())?;
    let pdir = PageDir::new(cx.mem, req.pdir_dma, req.nchunks)?;
    let pages = pdir.pages(cx.mem, 0..total)?;
    let (&header, data) = pages
        .split_first()
        .ok_or(CmdError::Invalid("SRQ page count"))?;
    let ring = RingGeometry::new(attrs.max_wr)
        .and_then(|g| Ring::new(header, RX_OFFSET, data.to_vec(), g, stride))
        .ok_or(CmdError::Invalid("SRQ geometry"))?;

    let handle = cx.s.ns.srq.alloc().ok_or(CmdError::Exhausted("SRQs"))?;
    let gen = cx.s.objects.next_gen();
    let doorbells = match Doorbells::new(&cx.env.hub, page, handle, gen, &DOORBELLS, cx.uar_base) {
        Ok(d) => d,
        Err(e) => {
            cx.s.ns.srq.free(handle);
            return Err(CmdError::Doorbell(e));
        }
    };
    take_pd(&mut cx.s.objects, req.pd_handle);
    cx.s.objects.add_pages(total.into());
    cx.s.objects.srqs.insert(
        handle,
        Srq {
            gen,
            ctx,
            pd: req.pd_handle,
            ring: ConsumerRing::new(ring),
            max_sge: attrs.max_sge,
            limit: attrs.srq_limit,
            broken: false,
            refs: Refs::default(),
            pages: total.into(),
            doorbells,
        },
    );
    Ok(CreateSrqResp {
        srqn: handle,
        ..Default::default()
    })
}

/// Only the limit can change (the driver sends nothing else).
pub(crate) fn handle_modify_srq<M>(
    cx: &mut Ctx<'_, M>,
    req: &ModifySrqReq,
) -> Result<(), CmdError> {
    let srq = get_mut(&mut cx.s.objects.srqs, "SRQ", req.srq_handle)?;
    if req.attr_mask & srq_attr_mask::MAX_WR != 0 {
        return Err(CmdError::Unsupported("SRQ resize"));
    }
    check(
        req.attr_mask & !srq_attr_mask::LIMIT == 0,
        "SRQ attribute mask",
    )?;
    if req.attr_mask & srq_attr_mask::LIMIT != 0 {
        check(
            req.attrs.srq_limit <= srq.ring.ring().geometry().max_elems(),
            "SRQ limit",
        )?;
        srq.limit = req.attrs.srq_limit;
    }
    Ok(())
}

pub(crate) fn handle_query_srq<M>(
    cx: &mut Ctx<'_, M>,
    req: &QuerySrqReq,
) -> Result<QuerySrqResp, CmdError> {
    let srq = get(&cx.s.objects.srqs, "SRQ", req.srq_handle)?;
    Ok(QuerySrqResp {
        attrs: SrqAttr {
            max_wr: srq.ring.ring().geometry().max_elems(),
            max_sge: srq.max_sge,
            srq_limit: srq.limit,
            reserved: 0,
        },
        ..Default::default()
    })
}

pub(crate) fn handle_destroy_srq<M>(
    cx: &mut Ctx<'_, M>,
    req: &DestroySrqReq,
) -> Result<(), CmdError> {
    let handle = req.srq_handle;
    let srq = get(&cx.s.objects.srqs, "SRQ", handle)?;
    srq.refs.check_unused("SRQ", handle)?;
    let (pd, pages) = (srq.pd, srq.pages);
    cx.s.objects.srqs.remove(&handle);
    release_pd(&mut cx.s.objects, pd);
    cx.s.objects.sub_pages(pages);
    cx.s.ns.srq.free(handle);
    Ok(())
}

impl Srq {
    /// The guest posted receive WQEs: validate the ring it claims to have
    /// filled (the transport engine will consume them).
    pub(crate) fn handle_doorbell<M: GuestMemory>(
        &mut self,
        mem: &M,
        env: &Env,
        events: &mut EventRings,
        handle: u32,
    ) {
        env.metrics.doorbell_srq.inc();
        if self.broken {
            return;
        }
        if let Err(e) = self.ring.pending(mem) {
            guest_warn!(env.metrics.ring_invalid, "srq={handle}: {e}");
            self.broken = true;
            events.post_async(mem, &env.irq, &env.metrics, event::SRQ_ERR, handle);
        }
    }
}
