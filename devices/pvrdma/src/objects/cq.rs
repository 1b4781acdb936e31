// SPDX-License-Identifier: Apache-2.0
//! Completion queues: CREATE_CQ / RESIZE_CQ / DESTROY_CQ, the arm
//! doorbells, and writing completions.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::mem::size_of;

use pvrdma_abi::cmd::{CreateCqReq, CreateCqResp, DestroyCqReq, ResizeCqReq, ResizeCqResp};
use pvrdma_abi::ring::{RingGeometry, RX_OFFSET};
use pvrdma_abi::wqe::{event, Cqe};
use vm_memory::GuestMemory;

use super::ctx::{release_ctx, take_ctx};
use super::session::Ctx;
use super::{get, Refs};
use crate::config::pages_for;
use crate::env::Env;
use crate::error::{check, CmdError};
use crate::events::EventRings;
use crate::pdir::PageDir;
use crate::ring::{ProducerRing, Ring, RingError};
use crate::uar::{Doorbell, Doorbells};

/// Bytes of one CQE.
const CQE_SIZE: u32 = size_of::<Cqe>() as u32;

/// What the guest asked to be notified about (`ib_req_notify_cq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Arm {
    None,
    /// ARM_SOL: solicited completions and errors.
    Solicited,
    /// ARM: any completion.
    Any,
}

/// A CQ's doorbells.
pub(crate) const DOORBELLS: [Doorbell; 3] = [Doorbell::CqArm, Doorbell::CqArmSol, Doorbell::CqPoll];

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Cq {
    pub(crate) gen: u64,
    pub(crate) ctx: u32,
    pub(crate) ring: ProducerRing,
    pub(crate) arm: Arm,
    /// The guest has armed it at least once: it waits on it for
    /// notifications (a CQ it only polls, such as the kernel's
    /// `IB_POLL_DIRECT` ones, must not get any: Linux warns of them).
    pub(crate) ever_armed: bool,
    /// Overflowed or its ring state went bad: CQ_ERR was posted and no
    /// more CQEs are written, as rather than overwrite.
    pub(crate) broken: bool,
    /// QPs using it.
    pub(crate) refs: Refs,
    pub(crate) pages: u64,
    pub(crate) doorbells: Doorbells,
}

pub(crate) fn handle_create_cq<M: GuestMemory>(
    cx: &mut Ctx<'_, M>,
    req: &CreateCqReq,
) -> Result<CreateCqResp, CmdError> {
    let limits = &cx.env.config.limits;
    let page = cx.s.objects.uar_page(req.ctx_handle)?;
    check(
        req.cqe.is_power_of_two() && req.cqe <= limits.max_cqe,
        "CQ size",
    )?;
    let data_pages = pages_for(req.cqe, CQE_SIZE).ok_or(CmdError::Invalid("CQ size"))?;
    let total = data_pages
        .checked_add(1)
        .ok_or(CmdError::Invalid("CQ size"))?;
    check(req.nchunks >= total, "CQ page count")?;
    cx.s.objects.check_pages(limits, total.into())?;
    let pdir = PageDir::new(cx.mem, req.pdir_dma, req.nchunks)?;
    let pages = pdir.pages(cx.mem, 0..total)?;
    let (&header, data) = pages
        .split_first()
        .ok_or(CmdError::Invalid("CQ page count"))?;
    let ring = RingGeometry::new(req.cqe)
        .and_then(|g| Ring::new(header, RX_OFFSET, data.to_vec(), g, CQE_SIZE))
        .ok_or(CmdError::Invalid("CQ geometry"))?;

    let handle = cx.s.ns.cq.alloc().ok_or(CmdError::Exhausted("CQs"))?;
    let gen = cx.s.objects.next_gen();
    let doorbells = match Doorbells::new(&cx.env.hub, page, handle, gen, &DOORBELLS, cx.uar_base) {
        Ok(d) => d,
        Err(e) => {
            cx.s.ns.cq.free(handle);
            return Err(CmdError::Doorbell(e));
        }
    };
    take_ctx(&mut cx.s.objects, req.ctx_handle);
    cx.s.objects.add_pages(total.into());
    cx.s.objects.cqs.insert(
        handle,
        Cq {
            gen,
            ctx: req.ctx_handle,
            ring: ProducerRing::new(ring),
            arm: Arm::None,
            ever_armed: false,
            broken: false,
            refs: Refs::default(),
            pages: total.into(),
            doorbells,
        },
    );
    Ok(CreateCqResp {
        cq_handle: handle,
        cqe: req.cqe,
        ..Default::default()
    })
}

/// The driver never resizes (its verb is unimplemented); a resize to the
/// current size succeeds, anything else would need a new buffer the
/// command cannot describe.
pub(crate) fn handle_resize_cq<M>(
    cx: &mut Ctx<'_, M>,
    req: &ResizeCqReq,
) -> Result<ResizeCqResp, CmdError> {
    let cq = get(&cx.s.objects.cqs, "CQ", req.cq_handle)?;
    let size = cq.ring.ring().geometry().max_elems();
    if req.cqe != size {
        return Err(CmdError::Unsupported("CQ resize"));
    }
    Ok(ResizeCqResp {
        cqe: size,
        ..Default::default()
    })
}

pub(crate) fn handle_destroy_cq<M>(
    cx: &mut Ctx<'_, M>,
    req: &DestroyCqReq,
) -> Result<(), CmdError> {
    let handle = req.cq_handle;
    let cq = get(&cx.s.objects.cqs, "CQ", handle)?;
    cq.refs.check_unused("CQ", handle)?;
    let (ctx, pages) = (cq.ctx, cq.pages);
    cx.s.objects.cqs.remove(&handle);
    release_ctx(&mut cx.s.objects, ctx);
    cx.s.objects.sub_pages(pages);
    cx.s.ns.cq.free(handle);
    Ok(())
}

impl Cq {
    /// After a restore, before the guest's next arm: arms the CQ for any
    /// completion if the guest has armed it before and it is unarmed now.
    /// The source pauses its device once the vCPUs stopped, and an ARM
    /// doorbell rung just before may not have reached its worker yet: the
    /// saved CQ then looks unarmed while the guest sleeps until notified.
    /// If the guest was polling instead, the notification is one more
    /// wake-up than it asked for, which every CQ consumer handles.
    pub(crate) fn rearm_restored<M: GuestMemory>(
        &mut self,
        mem: &M,
        env: &Env,
        events: &mut EventRings,
        handle: u32,
    ) {
        if self.ever_armed && self.arm == Arm::None && !self.broken {
            env.metrics.cq_rearmed.inc();
            self.arm(mem, env, events, handle, false);
        }
    }

    /// ARM / ARM_SOL doorbell: the guest just found the CQ empty (or
    /// wants the next completion) and asks for a notification.
    pub(crate) fn arm<M: GuestMemory>(
        &mut self,
        mem: &M,
        env: &Env,
        events: &mut EventRings,
        handle: u32,
        solicited: bool,
    ) {
        if self.broken {
            return;
        }
        self.ever_armed = true;
        let unconsumed = match self.ring.unconsumed(mem) {
            Ok(n) => n,
            Err(e) => {
                self.fail(mem, env, events, handle, &e);
                return;
            }
        };
        // The doorbell reaches the worker after the guest re-polled the CQ
        // empty; CQEs the worker wrote in between would otherwise never be
        // announced and the guest would sleep on them. Notify at once (at
        // worst a spurious wake-up, which every CQ consumer handles).
        if unconsumed > 0 {
            self.arm = Arm::None;
            events.post_cq_notify(mem, &env.irq, &env.metrics, handle);
            return;
        }
        self.arm = match (self.arm, solicited) {
            (Arm::Any, _) | (_, false) => Arm::Any,
            _ => Arm::Solicited,
        };
    }

    /// Writes a completion and notifies the guest if it armed the CQ for
    /// it. Errors count as solicited.
    pub(crate) fn post<M: GuestMemory>(
        &mut self,
        mem: &M,
        env: &Env,
        events: &mut EventRings,
        handle: u32,
        cqe: &Cqe,
        solicited: bool,
    ) {
        if self.broken {
            return;
        }
        if let Err(e) = self.ring.push(mem, cqe) {
            self.fail(mem, env, events, handle, &e);
            return;
        }
        env.metrics.cqe_posted.inc();
        let notify = match self.arm {
            Arm::Any => true,
            Arm::Solicited => solicited,
            Arm::None => false,
        };
        if notify {
            self.arm = Arm::None;
            events.post_cq_notify(mem, &env.irq, &env.metrics, handle);
        }
    }

    /// Its notification state and the CQEs the guest has not polled, for
    /// the VMM's exit log (a guest that sleeps on a CQ shows there).
    pub(crate) fn describe<M: GuestMemory>(&self, mem: &M) -> String {
        let unpolled = self
            .ring
            .unconsumed(mem)
            .map_or_else(|e| e.to_string(), |n| n.to_string());
        format!(
            "arm={:?} ever_armed={} broken={} unpolled={unpolled}",
            self.arm, self.ever_armed, self.broken
        )
    }

    /// The CQ cannot take completions any more: post CQ_ERR once.
    fn fail<M: GuestMemory>(
        &mut self,
        mem: &M,
        env: &Env,
        events: &mut EventRings,
        handle: u32,
        e: &RingError,
    ) {
        let counter = match e {
            RingError::Full => &env.metrics.cq_overflow,
            _ => &env.metrics.ring_invalid,
        };
        guest_warn!(counter, "cq={handle} broken: {e}");
        self.broken = true;
        self.arm = Arm::None;
        events.post_async(mem, &env.irq, &env.metrics, event::CQ_ERR, handle);
    }
}
