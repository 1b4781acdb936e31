// SPDX-License-Identifier: Apache-2.0
//! Queue pairs: CREATE_QP / QUERY_QP / DESTROY_QP, the QP doorbell, and
//! the error state's flush (every outstanding work request completes with
//! WR_FLUSH_ERR, which the guest's `ib_drain_qp` waits for).
//!
//! A QP owns the mappings of its send and receive rings (the pages the
//! transport engine will walk) and the device's consumer indices of both.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};

use pvrdma_abi::cmd::{
    CreateQpReq, CreateQpResp, CreateQpRespV2, DestroyQpReq, DestroyQpResp, QueryQpReq, QueryQpResp,
};
use pvrdma_abi::regs::version;
use pvrdma_abi::ring::{RingGeometry, RX_OFFSET, TX_OFFSET};
use pvrdma_abi::verbs::{qp_state, qp_type, QpAttr, QpCap};
use pvrdma_abi::wqe::{event, rq_stride, sq_stride, wc_status, Cqe, RqWqeHdr, SqWqeHdr};
use rdma_transport::verbs::WcOpcode;
use vm_memory::GuestMemory;

use super::cq::Cq;
use super::ctx::{pd_ctx, release_pd, take_pd, Numbering};
use super::session::Ctx;
use super::{get, Objects, KERNEL_CTX};
use crate::config::pages_for;
use crate::env::Env;
use crate::error::{check, CmdError};
use crate::events::EventRings;
use crate::namespace::{Namespace, GSI_QP};
use crate::pdir::PageDir;
use crate::ring::{ConsumerRing, Ring, RingError};
use crate::uar::{Doorbell, Doorbells};

type Engine = rdma_transport::qp::Qp;

pub(crate) mod saved;

/// A QP's doorbells: a receive doorbell only with a receive queue of
/// its own.
pub(crate) fn doorbells(has_rq: bool) -> &'static [Doorbell] {
    if has_rq {
        &[Doorbell::QpSend, Doorbell::QpRecv]
    } else {
        &[Doorbell::QpSend]
    }
}

/// Saved by [`saved`]'s serde.
#[derive(Debug)]
pub(crate) struct Qp {
    pub(crate) gen: u64,
    /// The wire QPN (1 for the GSI QP).
    pub(crate) qpn: u32,
    pub(crate) qp_type: u8,
    pub(crate) pd: u32,
    pub(crate) send_cq: u32,
    pub(crate) recv_cq: u32,
    pub(crate) srq: Option<u32>,
    pub(crate) sq: ConsumerRing,
    /// `None` with an SRQ.
    pub(crate) rq: Option<ConsumerRing>,
    pub(crate) cap: QpCap,
    pub(crate) sq_sig_all: bool,
    /// `verbs::qp_state`.
    pub(crate) state: u32,
    /// Attributes as last modified (QUERY_QP).
    pub(crate) attrs: QpAttr,
    /// Async events posted about it (DESTROY_QP reports the count).
    pub(crate) events: u32,
    pub(crate) pages: u64,
    pub(crate) doorbells: Doorbells,
    /// The transport engine, from RTR until RESET or destruction (saved
    /// as its `QpState`, checked on restore).
    pub(crate) engine: Option<Box<Engine>>,
    /// Its [`saved::Fixed`] part went ahead in a migration's restore hint,
    /// so its save leaves that part out (never saved itself).
    pub(crate) presented: bool,
    /// Its short part as a later hint sent it ([`Qp::short_bytes`]): saved
    /// the same, it is left out too (never saved itself).
    pub(crate) sent: Option<Box<[u8]>>,
}

/// A QP as the objects keep it: boxed (a B-tree's insertion and removal
/// shift the values left in a node), and told whether it was taken
/// mutably since a later hint sent its short part. One that was not is
/// saved as its handle and `gen` alone ([`saved::map`]), not encoded
/// again: that encoding was most of the save of 4096 idle QPs
/// (docs/benchmarks.md).
/// Every `&mut Qp` out of the objects comes through [`DerefMut`], and
/// nothing of a QP's short part changes behind a shared reference.
#[derive(Debug)]
pub(crate) struct Watched {
    qp: Box<Qp>,
    touched: bool,
}

impl Watched {
    pub(crate) fn new(qp: Box<Qp>) -> Self {
        Self { qp, touched: true }
    }

    /// Keeps `sent` as the short part a later hint sends: from here on
    /// the QP counts as untouched.
    pub(crate) fn send(&mut self, sent: Option<Box<[u8]>>) {
        self.qp.sent = sent;
        self.touched = false;
    }

    pub(crate) fn into_inner(self) -> Box<Qp> {
        self.qp
    }

    /// Unchanged since [`Watched::send`] kept its short part.
    pub(crate) fn as_sent(&self) -> bool {
        !self.touched && self.qp.presented && self.qp.sent.is_some()
    }
}

impl Deref for Watched {
    type Target = Qp;
    fn deref(&self) -> &Qp {
        &self.qp
    }
}

impl DerefMut for Watched {
    fn deref_mut(&mut self) -> &mut Qp {
        self.touched = true;
        &mut self.qp
    }
}

/// Checks a work queue's size and SGE count; returns its stride.
fn check_queue(
    wr: u32,
    sge: u32,
    max_wr: u32,
    max_sge: u32,
    stride: fn(u32) -> Option<u32>,
) -> Result<u32, CmdError> {
    check(wr.is_power_of_two() && wr <= max_wr, "QP size")?;
    check((1..=max_sge).contains(&sge), "QP SGE count")?;
    stride(sge).ok_or(CmdError::Invalid("QP SGE count"))
}

/// Maps the ring of `wr` entries whose data pages start at logical page
/// `first` of `pdir`.
fn map_ring<M: GuestMemory>(
    mem: &M,
    pdir: &PageDir,
    header: u64,
    indices: u64,
    first: u32,
    (wr, stride, pages): (u32, u32, u32),
) -> Result<ConsumerRing, CmdError> {
    let end = first
        .checked_add(pages)
        .ok_or(CmdError::Invalid("QP page count"))?;
    let data = pdir.pages(mem, first..end)?;
    RingGeometry::new(wr)
        .and_then(|g| Ring::new(header, indices, data, g, stride))
        .map(ConsumerRing::new)
        .ok_or(CmdError::Invalid("QP geometry"))
}

/// Takes the QP handle and QPN: 1 and 1 for the GSI QP; else the next
/// handle and, from version 20, the next QPN (before, QPN = handle).
fn alloc_ids(ns: &mut Namespace, gsi: bool, v2: bool) -> Result<(u32, u32), CmdError> {
    if gsi {
        if ns.gsi_qp {
            return Err(CmdError::Busy {
                kind: "GSI QP",
                handle: GSI_QP,
            });
        }
        ns.gsi_qp = true;
        return Ok((GSI_QP, GSI_QP));
    }
    let handle = ns.qp.alloc().ok_or(CmdError::Exhausted("QPs"))?;
    let qpn = if v2 {
        ns.qpn.alloc()
    } else {
        ns.qpn.reserve(handle).then_some(handle)
    };
    match qpn {
        Some(qpn) => Ok((handle, qpn)),
        None => {
            ns.qp.free(handle);
            Err(CmdError::Exhausted("QPNs"))
        }
    }
}

fn free_ids(ns: &mut Namespace, handle: u32, qpn: u32) {
    if handle == GSI_QP {
        ns.gsi_qp = false;
    } else {
        ns.qp.free(handle);
        ns.qpn.free(qpn);
    }
}

/// The CQ `handle`, which must belong to context `ctx`.
fn owned_cq(objects: &Objects, handle: u32, ctx: u32) -> Result<(), CmdError> {
    let cq = get(&objects.cqs, "CQ", handle)?;
    if cq.ctx != ctx {
        return Err(CmdError::WrongOwner { kind: "CQ", handle });
    }
    Ok(())
}

/// CREATE_QP's response, whose layout depends on the driver's version
/// (the command channel encodes it).
pub(crate) enum CreateQpResponse {
    V1(CreateQpResp),
    V2(CreateQpRespV2),
}

pub(crate) fn handle_create_qp<M: GuestMemory>(
    cx: &mut Ctx<'_, M>,
    req: &CreateQpReq,
) -> Result<CreateQpResponse, CmdError> {
    let limits = &cx.env.config.limits;
    let objects = &cx.s.objects;
    let ctx = pd_ctx(objects, req.pd_handle)?;
    let gsi = match req.qp_type {
        qp_type::GSI => true,
        qp_type::RC | qp_type::UD => false,
        _ => return Err(CmdError::Unsupported("QP type")),
    };
    check(!gsi || ctx == KERNEL_CTX, "GSI QP in a user context")?;
    owned_cq(objects, req.send_cq_handle, ctx)?;
    owned_cq(objects, req.recv_cq_handle, ctx)?;
    let srq = if req.is_srq != 0 {
        let srq = get(&objects.srqs, "SRQ", req.srq_handle)?;
        if srq.ctx != ctx {
            return Err(CmdError::WrongOwner {
                kind: "SRQ",
                handle: req.srq_handle,
            });
        }
        Some(req.srq_handle)
    } else {
        None
    };

    let (max_wr, max_sge) = (limits.max_qp_wr, limits.max_sge);
    let sq_stride = check_queue(
        req.max_send_wr,
        req.max_send_sge,
        max_wr,
        max_sge,
        sq_stride,
    )?;
    let sq_pages = pages_for(req.max_send_wr, sq_stride).ok_or(CmdError::Invalid("QP size"))?;
    let rq = match srq {
        Some(_) => None,
        None => {
            let stride = check_queue(
                req.max_recv_wr,
                req.max_recv_sge,
                max_wr,
                max_sge,
                rq_stride,
            )?;
            let pages = pages_for(req.max_recv_wr, stride).ok_or(CmdError::Invalid("QP size"))?;
            Some((req.max_recv_wr, stride, pages))
        }
    };
    let rq_pages = rq.map_or(0, |(_, _, pages)| pages);
    let (total, send) = (u32::from(req.total_chunks), u32::from(req.send_chunks));
    check(send >= sq_pages, "QP send page count")?;
    let rq_room = total.checked_sub(send).and_then(|r| r.checked_sub(1));
    check(
        rq_room.is_some_and(|room| room >= rq_pages),
        "QP page count",
    )?;
    // Only the pages the rings use are mapped and charged.
    let mapped = u64::from(sq_pages)
        .saturating_add(rq_pages.into())
        .saturating_add(1);
    objects.check_pages(limits, mapped)?;
    let pdir = PageDir::new(cx.mem, req.pdir_dma, total)?;
    let header = pdir
        .pages(cx.mem, 0..1)?
        .first()
        .copied()
        .ok_or(CmdError::Invalid("QP page count"))?;
    let sq = map_ring(
        cx.mem,
        &pdir,
        header,
        TX_OFFSET,
        1,
        (req.max_send_wr, sq_stride, sq_pages),
    )?;
    let rq = match rq {
        Some(geometry) => {
            let first = send.saturating_add(1);
            Some(map_ring(cx.mem, &pdir, header, RX_OFFSET, first, geometry)?)
        }
        None => None,
    };
    let page = objects.uar_page(ctx)?;

    let v2 = cx.s.dsr.driver_version >= version::QP_HANDLE;
    let (handle, qpn) = alloc_ids(&mut cx.s.ns, gsi, v2)?;
    let gen = cx.s.objects.next_gen();
    let kinds = doorbells(rq.is_some());
    let doorbells = match Doorbells::new(&cx.env.hub, page, handle, gen, kinds, cx.uar_base) {
        Ok(d) => d,
        Err(e) => {
            free_ids(&mut cx.s.ns, handle, qpn);
            return Err(CmdError::Doorbell(e));
        }
    };
    let objects = &mut cx.s.objects;
    take_pd(objects, req.pd_handle);
    for cq in [req.send_cq_handle, req.recv_cq_handle] {
        if let Some(cq) = objects.cqs.get_mut(&cq) {
            cq.refs.take();
        }
    }
    if let Some(srq) = srq.and_then(|h| objects.srqs.get_mut(&h)) {
        srq.refs.take();
    }
    objects.add_pages(mapped);
    let cap = QpCap {
        max_send_wr: req.max_send_wr,
        max_recv_wr: if srq.is_some() { 0 } else { req.max_recv_wr },
        max_send_sge: req.max_send_sge,
        max_recv_sge: if srq.is_some() { 0 } else { req.max_recv_sge },
        // Inline data is not supported.
        max_inline_data: 0,
        reserved: 0,
    };
    objects.qps.insert(
        handle,
        Watched::new(Box::new(Qp {
            gen,
            qpn,
            qp_type: req.qp_type,
            pd: req.pd_handle,
            send_cq: req.send_cq_handle,
            recv_cq: req.recv_cq_handle,
            srq,
            sq,
            rq,
            cap,
            sq_sig_all: req.sq_sig_all != 0,
            state: qp_state::RESET,
            attrs: QpAttr::default(),
            events: 0,
            pages: mapped,
            doorbells,
            engine: None,
            presented: false,
            sent: None,
        })),
    );
    cx.s.objects.qpns.insert(qpn, handle);
    Ok(if v2 {
        CreateQpResponse::V2(CreateQpRespV2 {
            qpn,
            qp_handle: handle,
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            ..Default::default()
        })
    } else {
        CreateQpResponse::V1(CreateQpResp {
            qpn,
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            ..Default::default()
        })
    })
}

pub(crate) fn handle_query_qp<M>(
    cx: &mut Ctx<'_, M>,
    req: &QueryQpReq,
) -> Result<QueryQpResp, CmdError> {
    let qp = get(&cx.s.objects.qps, "QP", req.qp_handle)?;
    Ok(QueryQpResp {
        attrs: QpAttr {
            qp_state: qp.state,
            cur_qp_state: qp.state,
            cap: qp.cap,
            ..qp.attrs
        },
        ..Default::default()
    })
}

pub(crate) fn handle_destroy_qp<M>(
    cx: &mut Ctx<'_, M>,
    req: &DestroyQpReq,
) -> Result<DestroyQpResp, CmdError> {
    let handle = req.qp_handle;
    let objects = &mut cx.s.objects;
    let qp = objects
        .qps
        .remove(&handle)
        .ok_or(CmdError::NoObject { kind: "QP", handle })?;
    release_pd(objects, qp.pd);
    for cq in [qp.send_cq, qp.recv_cq] {
        if let Some(cq) = objects.cqs.get_mut(&cq) {
            cq.refs.release();
        }
    }
    if let Some(srq) = qp.srq.and_then(|h| objects.srqs.get_mut(&h)) {
        srq.refs.release();
    }
    objects.sub_pages(qp.pages);
    objects.qpns.remove(&qp.qpn);
    free_ids(&mut cx.s.ns, handle, qp.qpn);
    if let Some(engine) = qp.engine.as_ref() {
        // A QP that failed says where its transport stood.
        let level = if engine.is_error() {
            log::Level::Info
        } else {
            log::Level::Debug
        };
        log::log!(level, "pvrdma: destroyed QP: {engine}");
    }
    Ok(DestroyQpResp {
        events_reported: qp.events,
        ..Default::default()
    })
}

/// Which queue of a QP.
#[derive(Clone, Copy, Debug)]
enum Queue {
    Send,
    Recv,
}

/// Completes every posted WQE of `ring` with WR_FLUSH_ERR on `cq`: at most
/// one ring's worth, the count being validated before the walk.
#[allow(clippy::too_many_arguments)]
fn flush_queue<M: GuestMemory>(
    mem: &M,
    env: &Env,
    events: &mut EventRings,
    ring: &mut ConsumerRing,
    (queue, numbering): (Queue, Numbering),
    qp: u32,
    (cq_handle, cq): (u32, Option<&mut Cq>),
) -> Result<(), RingError> {
    let Some(cq) = cq else { return Ok(()) };
    let pending = ring.pending(mem)?;
    for _ in 0..pending {
        let (wr_id, opcode) = match queue {
            Queue::Send => {
                let hdr: SqWqeHdr = ring.peek(mem)?;
                (hdr.wr_id, numbering.send_wc(hdr.opcode))
            }
            Queue::Recv => (ring.peek::<_, RqWqeHdr>(mem)?.wr_id, WcOpcode::Recv),
        };
        let cqe = Cqe {
            wr_id,
            qp: qp.into(),
            opcode: numbering.wc_opcode(opcode),
            status: wc_status::WR_FLUSH_ERR,
            ..Cqe::default()
        };
        cq.post(mem, env, events, cq_handle, &cqe, true);
        ring.advance();
        env.metrics.wqe_flushed.inc();
    }
    ring.publish(mem)
}

/// Flushes both queues of QP `handle` (in the error state), whose guest
/// uses `numbering`.
fn flush<M: GuestMemory>(
    mem: &M,
    env: &Env,
    events: &mut EventRings,
    (qp, handle, numbering): (&mut Qp, u32, Numbering),
    cqs: &mut BTreeMap<u32, Cq>,
) {
    let send = (qp.send_cq, cqs.get_mut(&qp.send_cq));
    let sq = (Queue::Send, numbering);
    let mut result = flush_queue(mem, env, events, &mut qp.sq, sq, handle, send);
    if let Some(rq) = qp.rq.as_mut() {
        let recv = (qp.recv_cq, cqs.get_mut(&qp.recv_cq));
        let rq_kind = (Queue::Recv, numbering);
        result = result.and(flush_queue(mem, env, events, rq, rq_kind, handle, recv));
    }
    if let Err(e) = result {
        guest_warn!(env.metrics.ring_invalid, "qp={handle}: flush stopped: {e}");
    }
}

impl Qp {
    /// Validates the producer indices of both rings.
    pub(crate) fn check_rings<M: GuestMemory>(&self, mem: &M) -> Result<(), RingError> {
        self.sq.pending(mem)?;
        if let Some(rq) = self.rq.as_ref() {
            rq.pending(mem)?;
        }
        Ok(())
    }

    pub(crate) fn post_event<M: GuestMemory>(
        &mut self,
        mem: &M,
        env: &Env,
        events: &mut EventRings,
        handle: u32,
        event_type: u32,
    ) {
        self.events = self.events.saturating_add(1);
        events.post_async(mem, &env.irq, &env.metrics, event_type, handle);
    }

    /// Moves the QP to the error state and stops its engine; an SRQ user
    /// hears that its last WQE was reached. What the engine holds is
    /// flushed by its next run, which then flushes the rings.
    pub(crate) fn set_error_state<M: GuestMemory>(
        &mut self,
        mem: &M,
        env: &Env,
        events: &mut EventRings,
        handle: u32,
    ) {
        let was = std::mem::replace(&mut self.state, qp_state::ERR);
        if let Some(engine) = self.engine.as_mut() {
            engine.set_error();
        }
        if was != qp_state::ERR && self.srq.is_some() {
            self.post_event(mem, env, events, handle, event::QP_LAST_WQE_REACHED);
        }
    }

    /// Moves the QP to the error state and flushes the work still in its
    /// rings (the engine's, if any, must have been flushed before).
    pub(crate) fn enter_error<M: GuestMemory>(
        &mut self,
        mem: &M,
        env: &Env,
        events: &mut EventRings,
        (handle, numbering): (u32, Numbering),
        cqs: &mut BTreeMap<u32, Cq>,
    ) {
        self.set_error_state(mem, env, events, handle);
        self.flush_rings(mem, env, events, (handle, numbering), cqs);
    }

    /// Completes every WQE left in the rings with WR_FLUSH_ERR.
    pub(crate) fn flush_rings<M: GuestMemory>(
        &mut self,
        mem: &M,
        env: &Env,
        events: &mut EventRings,
        (handle, numbering): (u32, Numbering),
        cqs: &mut BTreeMap<u32, Cq>,
    ) {
        flush(mem, env, events, (self, handle, numbering), cqs);
    }
}

/// A send or receive doorbell: validate what the guest claims to have
/// posted (a bad index is fatal for the QP); in the error state, flush it.
/// Otherwise the work waits for the transport engine.
pub(crate) fn handle_doorbell<M: GuestMemory>(
    mem: &M,
    env: &Env,
    events: &mut EventRings,
    objects: &mut Objects,
    handle: u32,
) {
    let numbering = objects.qp_numbering(handle);
    let Objects { qps, cqs, .. } = objects;
    let Some(qp) = qps.get_mut(&handle) else {
        return;
    };
    env.metrics.doorbell_qp.inc();
    // A QP in RESET has nothing to do; its indices are being zeroed.
    if qp.state == qp_state::RESET {
        return;
    }
    let valid = qp
        .sq
        .pending(mem)
        .and_then(|_| qp.rq.as_ref().map_or(Ok(0), |rq| rq.pending(mem)));
    match valid {
        Err(e) if qp.state != qp_state::ERR => {
            guest_warn!(env.metrics.ring_invalid, "qp={handle}: {e}");
            qp.post_event(mem, env, events, handle, event::QP_FATAL);
            qp.enter_error(mem, env, events, (handle, numbering), cqs);
        }
        _ if qp.state == qp_state::ERR => flush(mem, env, events, (qp, handle, numbering), cqs),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use pvrdma_abi::wqe::wc_opcode;

    use super::*;

    #[test]
    fn flush_opcodes_in_each_numbering() {
        use pvrdma_abi::wqe::{send_opcode as op, uverbs_send_opcode as uop, uverbs_wc_opcode};
        let (k, u) = (Numbering::Kernel, Numbering::User);
        let flushed = |n: Numbering, opcode| n.wc_opcode(n.send_wc(opcode));
        assert_eq!(flushed(k, op::SEND_WITH_IMM), wc_opcode::SEND);
        assert_eq!(flushed(k, op::RDMA_WRITE_WITH_IMM), wc_opcode::RDMA_WRITE);
        assert_eq!(flushed(k, op::FAST_REG_MR), wc_opcode::FAST_REG_MR);
        assert_eq!(flushed(k, op::LOCAL_INV), wc_opcode::LOCAL_INV);
        assert_eq!(flushed(k, op::SEND_WITH_INV), wc_opcode::SEND);
        assert_eq!(flushed(u, uop::LOCAL_INV), uverbs_wc_opcode::LOCAL_INV);
        assert_eq!(flushed(u, op::ATOMIC_FETCH_AND_ADD), wc_opcode::FETCH_ADD);
        assert_eq!(flushed(k, 0xdead), wc_opcode::SEND);
    }
}
