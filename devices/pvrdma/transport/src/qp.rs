// SPDX-License-Identifier: Apache-2.0
//! The engine driver of one QP: it owns the three role states (requester,
//! completer, responder, as rxe keeps `qp->req`, `qp->comp`, `qp->resp`)
//! and the send queue the requester and completer share, and loops the
//! pure steps of [`crate::req`], [`crate::comp`] and [`crate::resp`] over
//! the caller's sinks.
//!
//! The device's worker calls [`Qp::on_packet`] for each frame addressed to
//! the QP, [`Qp::on_timer`] when time passes and [`Qp::flush`] with a work
//! budget to push queued packets out (after every run of packets: it
//! sends the ACK they are owed); no call does more than its budget
//! (or one packet's worth) of work, and nothing grows on a peer's say-so.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use thiserror::Error;

mod saved;

use crate::comp::{comp_packet, comp_timer, CompAttrs, CompState, CompStep, CompWqe};
use crate::hdr::Syndrome;
use crate::metrics::{inc, Metrics};
use crate::opcode::OpClass;
use crate::packet::{
    frame_len, write_unsealed, Addr, BuildError, Headers, Located, Packet, Payload,
};
use crate::psn::{psn_compare, Psn};
use crate::req::{req_step, rewind, ReqAttrs, ReqState, ReqStep, SendWqe};
use crate::req::{DESCRIBED_SGES, MAX_DESCRIBED_SEGMENT, MAX_SEGMENT};
use crate::resp::exec::{next_response, respond};
use crate::resp::{RecvQueue, RecvWqe, RespAttrs, RespCtx, RespOut, RespState};
use crate::sgl::{gather, locate, scatter, sge_total};
use crate::verbs::{Access, CompletionSink, FastReg, MrTable, PacketSink, Sge};
use crate::verbs::{WcOpcode, WcStatus};
use crate::verbs::{WorkCompletion, WrOpcode};

/// Most WQEs queued on the send queue or the QP's own receive queue:
/// bounds the memory a guest's posting can pin in the engine.
pub const MAX_QUEUE: usize = 4096;

/// Why a post was refused.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum QpError {
    /// The queue holds [`MAX_QUEUE`] WQEs.
    #[error("Queue full")]
    QueueFull,
    /// Too many SGEs, or their lengths overflow / disagree with the WQE.
    #[error("Bad scatter/gather list")]
    BadSgl,
}

/// QP attributes, as modify_qp set them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpAttrs {
    /// Our QPN.
    pub qpn: u32,
    /// Peer QPN (RC).
    pub dest_qpn: u32,
    /// Protection domain.
    pub pd: u32,
    /// The remote operations the QP's responder allows (`qp_access_flags`:
    /// REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC); an MR's own rights are
    /// checked besides.
    #[serde(with = "crate::verbs::access_bits")]
    pub access: Access,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// UD service (GSI included).
    pub ud: bool,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Transport retry count.
    pub retry_cnt: u8,
    /// RNR retry count (7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer code our responder sends.
    pub min_rnr_timer: u8,
    /// RDMA READs and atomics we may have outstanding (`max_rd_atomic`;
    /// 0 is taken as 1): the peer keeps that many results, no more.
    pub max_rd_atomic: u8,
    /// UD Q_Key.
    pub qkey: u32,
    /// First PSN we send (`sq_psn`).
    pub sq_psn: Psn,
    /// First PSN we expect (`rq_psn`).
    pub rq_psn: Psn,
    /// Addressing of RC frames to the peer.
    pub addr: Addr,
}

impl QpAttrs {
    fn req(&self) -> ReqAttrs {
        ReqAttrs {
            dest_qpn: self.dest_qpn,
            qpn: self.qpn,
            mtu: self.mtu,
            segment: self.mtu,
            ud: self.ud,
        }
    }
    fn comp(&self) -> CompAttrs {
        CompAttrs {
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            mtu: self.mtu.clamp(256, 4096),
        }
    }
    fn resp(&self) -> RespAttrs {
        RespAttrs {
            qpn: self.qpn,
            dest_qpn: self.dest_qpn,
            pd: self.pd,
            access: self.access,
            mtu: self.mtu.clamp(256, 4096),
            min_rnr_timer: self.min_rnr_timer,
            qkey: self.qkey,
            ud: self.ud,
        }
    }
}

/// A send work request as posted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendEntry {
    /// The decoded WQE.
    pub wqe: SendWqe,
    /// Its gather list (the payload).
    pub sges: Vec<Sge>,
    /// Generate a completion on success.
    pub signaled: bool,
    /// UD destination addressing (the address handle).
    pub ah: Option<Addr>,
    /// The operands of a REG_MR.
    pub fast_reg: Option<FastReg>,
}

/// A send WQE in the engine: sent from `first_psn`, finished with `done`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    /// The WQE.
    pub e: SendEntry,
    /// PSN of its first packet, once sent.
    pub first_psn: Option<Psn>,
    /// Its status, once finished (completed in order).
    pub done: Option<WcStatus>,
}

/// Everything a QP's engine holds, for migration and snapshots: the
/// sequence numbers, the unacknowledged and unsent send WQEs, the
/// responder's open message and READ/atomic replay cache. Untrusted on
/// [`Qp::restore`] (it may come from another host). Its serde is
/// [`saved`]'s: the plain fields packed, the queues beside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QpState {
    /// Attributes.
    pub attrs: QpAttrs,
    /// Requester.
    pub req: ReqState,
    /// Completer.
    pub comp: CompState,
    /// Responder.
    pub resp: RespState,
    /// The send queue, oldest first.
    pub sq: Vec<Slot>,
    /// Index in `sq` of the next WQE to send.
    pub next: usize,
    /// The QP's own receive queue (empty when the device keeps receives
    /// in guest memory).
    pub rq: Vec<RecvWqe>,
    /// In the error state.
    pub error: bool,
    /// Counters.
    pub metrics: Metrics,
}

/// Why a saved state was refused.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum RestoreError {
    /// A queue is longer than [`MAX_QUEUE`] or an index points outside it.
    #[error("Saved queue state is inconsistent")]
    Queue,
    /// A WQE's scatter/gather list is invalid.
    #[error("Saved work request is invalid")]
    Wqe,
}

/// The QP's own receive queue (an SRQ is the device's [`RecvQueue`]).
#[derive(Debug, Default)]
pub struct RecvRing(VecDeque<RecvWqe>);

impl RecvQueue for RecvRing {
    fn take(&mut self) -> Option<RecvWqe> {
        self.0.pop_front()
    }
}

/// The caller's capabilities for one call.
pub struct Io<'a> {
    /// Memory regions of the QP's device.
    pub mr: &'a mut dyn MrTable,
    /// Completions.
    pub cq: &'a mut dyn CompletionSink,
    /// Outgoing frames.
    pub net: &'a mut dyn PacketSink,
    /// The SRQ the QP receives from, if any.
    pub srq: Option<&'a mut dyn RecvQueue>,
}

/// One queue pair's transport engine.
pub struct Qp {
    attrs: QpAttrs,
    req: ReqState,
    comp: CompState,
    resp: RespState,
    sq: VecDeque<Slot>,
    next: usize,
    rq: RecvRing,
    error: bool,
    /// Most payload bytes per packet we send ([`Qp::set_segment`]); not
    /// saved: the device sets it for every call from where the peer is.
    segment: u32,
    /// The ACK of the same-host requests received since the last
    /// [`Qp::flush`], which sends it ([`Qp::owe_ack`]); not saved: the
    /// device flushes after every run of packets, under the lock a save
    /// takes.
    owed_ack: Option<Headers>,
    /// Where the segment being described lies ([`send_frame`]), kept
    /// between segments so that describing one allocates nothing; not
    /// saved: empty between calls.
    located: Located,
    /// Transport counters.
    pub metrics: Metrics,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.attrs.qpn)
            .field("error", &self.error)
            .field("sq", &self.sq.len())
            .finish_non_exhaustive()
    }
}

/// One line for logs: where each role stands and the counters that moved,
/// e.g. why a peer stopped answering.
impl std::fmt::Display for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (req, comp, resp) = (&self.req, &self.comp, &self.resp);
        write!(
            f,
            "qpn={:#x} error={} req_psn={:#x} una={:#x} comp_psn={:#x} retries_left={} \
             deadline={:?} rnr_until={:?} resp_psn={:#x} psn_nak_sent={} unacked={} sq={} \
             next={} rq={}",
            self.attrs.qpn,
            self.error,
            req.psn.get(),
            req.una.get(),
            comp.psn.get(),
            comp.retries_left,
            comp.deadline,
            comp.rnr_until,
            resp.psn.get(),
            resp.sent_psn_nak,
            resp.unacked,
            self.sq.len(),
            self.next,
            self.rq.0.len(),
        )?;
        for (name, v) in self.metrics.moved() {
            write!(f, " {name}={v}")?;
        }
        Ok(())
    }
}

/// The completer's view of the oldest WQE, if it was sent.
fn head(sq: &VecDeque<Slot>) -> Option<(CompWqe, &Slot)> {
    let s = sq.front()?;
    let w = CompWqe {
        opcode: s.e.wqe.opcode,
        first_psn: s.first_psn?,
        len: s.e.wqe.len,
    };
    Some((w, s))
}

/// Builds the frame of `hdrs` with `payload_len` bytes from `fill` where
/// `net` sends it (a same-host ring takes it in place: the payload is
/// copied once, from its MR to the ring). Towards a peer that maps our
/// memory ([`PacketSink::shares_memory`]) it sends the headers and the
/// runs `locate` finds instead, where it finds them all: the peer copies
/// the payload from our memory, its only copy. `located` is scratch space
/// (the QP's), cleared before use.
fn send_frame(
    net: &mut dyn PacketSink,
    addr: &Addr,
    hdrs: &Headers,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]) -> bool,
    (located, locate): (&mut Located, impl FnOnce(&mut Located) -> bool),
) -> Result<(), BuildError> {
    if payload_len > 0 && net.shares_memory() {
        located.clear();
        if locate(located) {
            let len = frame_len(addr, hdrs, 0)?;
            let mut built = Ok(());
            let sent = net.send_described(len, located, payload_len, &mut |frame| {
                built = write_unsealed(frame, addr, hdrs, 0, |_| true);
                built.is_ok()
            });
            if sent {
                return built;
            }
        }
        // A described segment larger than a copied one: its runs fit a
        // record ([`Qp::segment_for`]), so only its MRs' checks refuse
        // it, as they would refuse copying it.
        if payload_len > MAX_SEGMENT as usize {
            return Err(BuildError::Payload);
        }
    }
    let len = frame_len(addr, hdrs, payload_len)?;
    let mut fill = Some(fill);
    let mut built = Ok(());
    net.send_in_place(len, &mut |frame| {
        built = write_unsealed(frame, addr, hdrs, payload_len, |dst| {
            fill.take().is_some_and(|f| f(dst))
        });
        built.is_ok()
    });
    built
}

fn emit(net: &mut dyn PacketSink, addr: &Addr, h: &Headers, payload: &[u8]) {
    // Our own headers and at most one MTU: building cannot fail short of
    // a bug, and a frame that cannot be built is a lost frame to RC.
    let _ = send_frame(
        net,
        addr,
        h,
        payload.len(),
        |dst| {
            dst.copy_from_slice(payload);
            true
        },
        (&mut Located::default(), |_| false),
    );
}

impl Qp {
    /// A QP in RTS with these attributes.
    pub fn new(attrs: QpAttrs) -> Self {
        let comp = CompState::new(attrs.sq_psn, &attrs.comp());
        Qp {
            req: ReqState {
                psn: attrs.sq_psn,
                una: attrs.sq_psn,
                ..ReqState::default()
            },
            resp: RespState {
                psn: attrs.rq_psn,
                ..RespState::default()
            },
            attrs,
            comp,
            sq: VecDeque::new(),
            next: 0,
            rq: RecvRing::default(),
            error: false,
            segment: 0,
            owed_ack: None,
            located: Located::default(),
            metrics: Metrics::default(),
        }
    }

    /// The engine's whole state (see [`QpState`]).
    pub fn save(&self) -> QpState {
        QpState {
            attrs: self.attrs,
            req: self.req.clone(),
            comp: self.comp.clone(),
            resp: self.resp.clone(),
            sq: self.sq.iter().cloned().collect(),
            next: self.next,
            rq: self.rq.0.iter().cloned().collect(),
            error: self.error,
            metrics: self.metrics.clone(),
        }
    }

    /// An engine continuing from `state`, checked first: queue lengths,
    /// indices and every WQE's scatter/gather list. Timers restart: the
    /// caller's clock is not the saver's.
    pub fn restore(state: QpState) -> Result<Self, RestoreError> {
        if state.sq.len() > MAX_QUEUE || state.rq.len() > MAX_QUEUE || state.next > state.sq.len() {
            return Err(RestoreError::Queue);
        }
        let local = |s: &Slot| matches!(s.e.wqe.opcode, WrOpcode::LocalInv | WrOpcode::RegMr);
        if state
            .sq
            .iter()
            .any(|s| !local(s) && sge_total(&s.e.sges) != Some(s.e.wqe.len))
            || state.rq.iter().any(|w| sge_total(&w.sges).is_none())
        {
            return Err(RestoreError::Wqe);
        }
        let mut comp = state.comp;
        comp.deadline = None;
        comp.rnr_until = None;
        let outstanding = state.req.psn != comp.psn;
        let mut qp = Qp {
            attrs: state.attrs,
            req: state.req,
            comp,
            resp: state.resp,
            sq: state.sq.into(),
            next: state.next,
            rq: RecvRing(state.rq.into()),
            error: state.error,
            segment: 0,
            owed_ack: None,
            located: Located::default(),
            metrics: state.metrics,
        };
        if outstanding && !qp.error && !qp.attrs.ud {
            // Due at once (0 is before any `now`): whatever was in flight
            // during the blackout is resent on the first timer call.
            qp.comp.rearm(&qp.attrs.comp(), 0, true);
        }
        Ok(qp)
    }

    /// Send WQEs queued and not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.sq.len()
    }

    /// When [`Qp::on_timer`] has work (retransmission or the end of an RNR
    /// wait), in the caller's clock.
    pub fn deadline(&self) -> Option<u64> {
        if self.error || self.attrs.ud {
            return None;
        }
        match (self.comp.deadline, self.comp.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The attributes in force.
    pub fn attrs(&self) -> &QpAttrs {
        &self.attrs
    }

    /// Applies attributes modify_qp changed (RTR to RTS, RTS to RTS). The
    /// send PSN only takes effect while nothing was sent, the receive PSN
    /// while nothing was received: a running QP keeps its sequence.
    pub fn modify(&mut self, attrs: QpAttrs) {
        if self.req.psn == self.attrs.sq_psn && self.sq.is_empty() {
            self.req.psn = attrs.sq_psn;
            self.req.una = attrs.sq_psn;
            self.comp = CompState::new(attrs.sq_psn, &attrs.comp());
        }
        if self.resp.psn == self.attrs.rq_psn && self.resp.prev.is_none() {
            self.resp.psn = attrs.rq_psn;
        }
        self.attrs = attrs;
    }

    /// Sets the most payload bytes a packet we send may carry: 0 (or the
    /// path MTU) for MTU packets, the default and all a wire takes; up to
    /// [`crate::req::MAX_SEGMENT`] when the peer is on the same-host
    /// channel, which takes segments (and up to
    /// [`MAX_DESCRIBED_SEGMENT`] while it maps our memory, see
    /// [`Qp::segment_for`]). Only the packets built from now on follow it,
    /// and the PSNs are the same either way.
    pub fn set_segment(&mut self, bytes: u32) {
        self.segment = bytes;
    }

    /// The segment limit for a payload of `sges` pieces sent to `net`:
    /// towards a same-host peer that maps our memory, payloads are
    /// described, and a described segment of up to
    /// [`MAX_DESCRIBED_SEGMENT`] from at most [`DESCRIBED_SGES`] pieces
    /// always fits a record's runs; else the limit [`Qp::set_segment`]
    /// set.
    fn segment_for(&self, net: &dyn PacketSink, sges: usize) -> u32 {
        if self.segment > 0 && sges <= DESCRIBED_SGES && net.shares_memory() {
            MAX_DESCRIBED_SEGMENT
        } else {
            self.segment
        }
    }

    /// Whether the QP is in the error state.
    pub fn is_error(&self) -> bool {
        self.error
    }

    /// Moves the QP to the error state: the next [`Qp::flush`] calls
    /// complete every queued WQE with `WrFlushErr`.
    pub fn set_error(&mut self) {
        self.error = true;
        self.comp.deadline = None;
        self.comp.rnr_until = None;
    }

    /// Queues a send WR (completed with `WrFlushErr` if the QP is in error).
    pub fn post_send(&mut self, e: SendEntry) -> Result<(), QpError> {
        if self.sq.len() >= MAX_QUEUE {
            return Err(QpError::QueueFull);
        }
        let local = matches!(e.wqe.opcode, WrOpcode::LocalInv | WrOpcode::RegMr);
        if !local && sge_total(&e.sges) != Some(e.wqe.len) {
            return Err(QpError::BadSgl);
        }
        self.sq.push_back(Slot {
            e,
            first_psn: None,
            done: None,
        });
        Ok(())
    }

    /// Queues a receive WR on the QP's own receive queue.
    pub fn post_recv(&mut self, w: RecvWqe) -> Result<(), QpError> {
        if self.rq.0.len() >= MAX_QUEUE {
            return Err(QpError::QueueFull);
        }
        sge_total(&w.sges).ok_or(QpError::BadSgl)?;
        self.rq.0.push_back(w);
        Ok(())
    }

    /// Handles one received packet addressed to this QP.
    pub fn on_packet(&mut self, pkt: &Packet<'_>, now: u64, io: &mut Io<'_>) {
        if self.error || pkt.hdrs.bth.dqpn != self.attrs.qpn {
            return;
        }
        if pkt.opcode.is(OpClass::ACK) {
            if !self.attrs.ud {
                self.complete(pkt, now, io);
            }
            return;
        }
        let ra = self.attrs.resp();
        let rq: &mut dyn RecvQueue = match io.srq.as_deref_mut() {
            Some(s) => s,
            None => &mut self.rq,
        };
        let mut cx = RespCtx {
            mr: &mut *io.mr,
            rq,
            cq: &mut *io.cq,
            m: &mut self.metrics,
        };
        match respond(&mut self.resp, &ra, &mut cx, pkt) {
            RespOut::Nothing => {}
            RespOut::Reply(h) if pkt.same_host => self.owe_ack(io.net, h),
            RespOut::Reply(h) => emit(io.net, &self.attrs.addr, &h, &[]),
            RespOut::Fatal(h) => {
                self.pay_ack(io.net);
                emit(io.net, &self.attrs.addr, &h, &[]);
                self.set_error();
            }
        }
    }

    /// Holds the plain ACK `h` of a same-host request until the end of
    /// the run of packets ([`Qp::flush`]): a later one replaces it, as
    /// ACKs are cumulative, so a batch of messages from the ring (a
    /// stream of WRITEs asks for an ACK on each) costs one ACK, one frame
    /// for the requester to take and one completer pass. Anything else
    /// (a NAK, an atomic's ACK, an older PSN's re-ACK) goes out in order,
    /// after the ACK held.
    fn owe_ack(&mut self, net: &mut dyn PacketSink, h: Headers) {
        let plain = h.bth.opcode == crate::opcode::Opcode::RcAcknowledge as u8
            && matches!(h.aeth, Some(a) if matches!(a.syndrome, Syndrome::Ack { .. }));
        let newer = |o: &Headers| psn_compare(h.bth.psn, o.bth.psn) != std::cmp::Ordering::Less;
        if plain && self.owed_ack.as_ref().is_none_or(newer) {
            if self.owed_ack.replace(h).is_some() {
                inc(&mut self.metrics.ack_deferred);
            }
            return;
        }
        self.pay_ack(net);
        emit(net, &self.attrs.addr, &h, &[]);
    }

    /// Sends the ACK held by [`Qp::owe_ack`], if any.
    fn pay_ack(&mut self, net: &mut dyn PacketSink) {
        if let Some(h) = self.owed_ack.take() {
            emit(net, &self.attrs.addr, &h, &[]);
        }
    }

    fn finish_head(&mut self, status: WcStatus) {
        if let Some(s) = self.sq.front_mut() {
            s.done = Some(status);
        }
        if status != WcStatus::Success {
            match status {
                WcStatus::RetryExcErr => inc(&mut self.metrics.retry_exceeded),
                WcStatus::RnrRetryExcErr => inc(&mut self.metrics.rnr_retry_exceeded),
                _ => {}
            }
            self.set_error();
        }
    }

    fn complete(&mut self, pkt: &Packet<'_>, now: u64, io: &mut Io<'_>) {
        let ca = self.attrs.comp();
        let pd = self.attrs.pd;
        if matches!(pkt.hdrs.aeth, Some(a) if matches!(a.syndrome, Syndrome::RnrNak { .. })) {
            inc(&mut self.metrics.rnr_nak_rcvd);
        }
        let mut rearm = false;
        for _ in 0..=self.sq.len() {
            self.drain(io);
            let head = head(&self.sq);
            let w = head.as_ref().map(|h| h.0);
            let step = comp_packet(&mut self.comp, &ca, w.as_ref(), self.req.psn, pkt, now);
            rearm = !matches!(step, CompStep::Drop | CompStep::RnrWait);
            let placed = match (step, head) {
                (CompStep::ReadData { offset, .. }, Some((_, s))) => {
                    scatter(io.mr, pd, &s.e.sges, offset, pkt.payload)
                }
                (CompStep::AtomicOrig(v), Some((_, s))) => {
                    scatter(io.mr, pd, &s.e.sges, 0, Payload::from(&v.to_le_bytes()[..]))
                }
                _ => Ok(()),
            };
            if placed.is_err() {
                self.finish_head(WcStatus::LocProtErr);
                break;
            }
            match step {
                CompStep::Drop => inc(&mut self.metrics.comp_dropped),
                CompStep::AckedHead => {
                    self.finish_head(WcStatus::Success);
                    continue;
                }
                CompStep::Completed
                | CompStep::AtomicOrig(_)
                | CompStep::ReadData { last: true, .. } => self.finish_head(WcStatus::Success),
                CompStep::Progress | CompStep::ReadData { .. } | CompStep::RnrWait => {}
                CompStep::Retry => self.retry(),
                CompStep::CqeErr(s) => self.finish_head(s),
            }
            break;
        }
        self.req.una = self.comp.psn;
        if rearm {
            let outstanding = self.req.psn != self.comp.psn;
            self.comp.rearm(&ca, now, outstanding);
        }
        self.drain(io);
    }

    fn retry(&mut self) {
        inc(&mut self.metrics.completer_retry);
        let mtu = self.attrs.mtu;
        if let Some((w, s)) = head(&self.sq) {
            let psn = rewind(&mut self.req, &s.e.wqe, w.first_psn, self.comp.psn, mtu);
            self.comp.psn = psn;
            self.req.una = psn;
            self.next = 0;
        }
    }

    /// Lets time pass: retransmission and RNR timers.
    pub fn on_timer(&mut self, now: u64, io: &mut Io<'_>) {
        if self.error || self.attrs.ud {
            return;
        }
        let outstanding = self.req.psn != self.comp.psn;
        match comp_timer(&mut self.comp, now, outstanding) {
            Some(CompStep::Retry) => {
                self.retry();
                self.comp.rearm(&self.attrs.comp(), now, true);
            }
            Some(CompStep::CqeErr(s)) => self.finish_head(s),
            _ => {}
        }
        self.drain(io);
    }

    /// Pops finished WQEs from the head of the send queue, in order,
    /// completing the signaled ones and every error.
    fn drain(&mut self, io: &mut Io<'_>) {
        while let Some(status) = self.sq.front().and_then(|s| s.done) {
            let Some(s) = self.sq.pop_front() else { break };
            self.next = self.next.saturating_sub(1);
            if s.e.signaled || status != WcStatus::Success {
                let wc = WorkCompletion {
                    wr_id: s.e.wqe.wr_id,
                    status,
                    opcode: s.e.wqe.opcode.wc_opcode(),
                    byte_len: s.e.wqe.len,
                    imm_or_inv: None,
                    qpn: self.attrs.qpn,
                    src_qpn: 0,
                    ud_src: None,
                    solicited: false,
                };
                io.cq.complete(wc, true);
            }
        }
    }

    /// Sends the ACK owed to the same-host requests received since the
    /// last call, whatever the budget; then does up to `budget` units of
    /// queued work: responses owed to the
    /// peer (READ data, atomic ACKs, an ACK held behind them), then new or
    /// retransmitted request packets; in the error
    /// state, flushes WQEs instead. Returns the work done (0 = idle).
    pub fn flush(&mut self, now: u64, io: &mut Io<'_>, budget: usize) -> usize {
        self.pay_ack(io.net);
        let mut work = 0usize;
        while work < budget {
            let did = if self.error {
                self.flush_one(io)
            } else if let Some(r) = {
                // A READ response is one piece, of one MR.
                let segment = self.segment_for(io.net, 1);
                next_response(&mut self.resp, &self.attrs.resp(), io.mr, segment)
            } {
                // READ data straight into the frame; a frame that cannot
                // be built is a lost response, which the READ's retry
                // covers.
                let mr = &*io.mr;
                let fill = |dst: &mut [u8]| dst.is_empty() || mr.read(r.rkey, r.va, dst).is_ok();
                let find = |out: &mut Located| {
                    out.key(r.rkey);
                    mr.locate(r.rkey, r.va, r.len as usize, out).is_ok()
                };
                let (addr, len) = (&self.attrs.addr, r.len as usize);
                let located = &mut self.located;
                let _ = send_frame(io.net, addr, &r.hdrs, len, fill, (located, find));
                true
            } else {
                self.comp.rnr_until.is_none() && self.send_one(now, io)
            };
            if !did {
                break;
            }
            work = work.saturating_add(1);
            self.drain(io);
        }
        work
    }

    fn flush_one(&mut self, io: &mut Io<'_>) -> bool {
        self.drain(io);
        if let Some(s) = self.sq.iter_mut().find(|s| s.done.is_none()) {
            s.done = Some(WcStatus::WrFlushErr);
            return true;
        }
        let w = self.resp.wqe.take().or_else(|| self.rq.take());
        let Some(w) = w else { return false };
        let wc = WorkCompletion {
            wr_id: w.wr_id,
            status: WcStatus::WrFlushErr,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            imm_or_inv: None,
            qpn: self.attrs.qpn,
            src_qpn: 0,
            ud_src: None,
            solicited: false,
        };
        io.cq.complete(wc, false);
        true
    }

    /// READ/atomic WQEs sent and not yet completed.
    fn outstanding_rd_atomic(&self) -> usize {
        self.sq
            .iter()
            .take(self.next)
            .filter(|s| s.done.is_none() && s.e.wqe.opcode.needs_response())
            .count()
    }

    fn send_one(&mut self, now: u64, io: &mut Io<'_>) -> bool {
        let sges = self.sq.get(self.next).map_or(0, |s| s.e.sges.len());
        let ra = ReqAttrs {
            segment: self.segment_for(io.net, sges),
            ..self.attrs.req()
        };
        let starting = self.req.offset == 0 && self.req.prev.is_none();
        let limit = usize::from(self.attrs.max_rd_atomic.max(1));
        let next_needs_response = self
            .sq
            .get(self.next)
            .is_some_and(|s| s.done.is_none() && s.e.wqe.opcode.needs_response());
        if starting && next_needs_response && self.outstanding_rd_atomic() >= limit {
            return false;
        }
        // A WRITE or SEND queued behind this WQE goes out without waiting
        // for a response (a READ or atomic may wait for earlier ones, a
        // local operation sends nothing): [`req_step`]'s `follows`.
        let follows = self.sq.get(self.next.saturating_add(1)).is_some_and(|s| {
            s.done.is_none()
                && !s.e.wqe.opcode.needs_response()
                && !matches!(s.e.wqe.opcode, WrOpcode::LocalInv | WrOpcode::RegMr)
        });
        let Some(slot) = self.sq.get_mut(self.next) else {
            return false;
        };
        if slot.done.is_some() {
            self.next = self.next.saturating_add(1);
            return true;
        }
        if self.req.offset == 0 && self.req.prev.is_none() {
            slot.first_psn = Some(self.req.psn);
        }
        match req_step(&mut self.req, &slot.e.wqe, &ra, follows) {
            ReqStep::Packet {
                hdrs,
                payload_off,
                payload_len,
                done,
            } => {
                // The payload is gathered straight into the frame.
                let (mr, pd, sges) = (&*io.mr, self.attrs.pd, &slot.e.sges);
                let addr = slot.e.ah.as_ref().unwrap_or(&self.attrs.addr);
                let len = payload_len as usize;
                match send_frame(
                    io.net,
                    addr,
                    &hdrs,
                    len,
                    |dst| gather(mr, pd, sges, payload_off, dst).is_ok(),
                    (&mut self.located, |out: &mut Located| {
                        locate(mr, pd, sges, payload_off, len, out).is_ok()
                    }),
                ) {
                    Ok(()) => {}
                    Err(BuildError::Payload) => {
                        slot.done = Some(WcStatus::LocProtErr);
                        self.set_error();
                        return true;
                    }
                    // A frame that cannot be built is a lost frame to RC.
                    Err(_) => {}
                }
                if done {
                    self.next = self.next.saturating_add(1);
                    if ra.ud {
                        slot.done = Some(WcStatus::Success);
                    }
                }
                if !ra.ud {
                    self.comp.arm(&self.attrs.comp(), now);
                }
            }
            ReqStep::Local => {
                let pd = self.attrs.pd;
                let ok = match (slot.e.wqe.opcode, slot.e.fast_reg) {
                    (WrOpcode::LocalInv, _) => io.mr.invalidate(slot.e.wqe.imm_or_inv, pd),
                    (WrOpcode::RegMr, Some(fr)) => io.mr.fast_reg(&fr, pd),
                    _ => false,
                };
                slot.done = Some(if ok {
                    WcStatus::Success
                } else {
                    WcStatus::LocProtErr
                });
                self.next = self.next.saturating_add(1);
                if !ok {
                    self.set_error();
                }
            }
            ReqStep::WindowFull => return false,
            ReqStep::CqeErr(s) => {
                slot.done = Some(s);
                self.set_error();
            }
        }
        true
    }
}
