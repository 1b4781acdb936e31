// SPDX-License-Identifier: Apache-2.0
//! Responder execution (rxe_resp.c `execute`, `send_data_in`,
//! `write_data_in`, `read_reply`, `atomic_reply`, `send_ack`): what happens
//! once a request passed the checks of the parent module.
//!
//! Every placement is bounded by the packet (at most one MTU) and by keys
//! checked in the responder's own tables; READ responses and atomic ACKs
//! are produced one packet per call of [`next_response`], so the driver
//! bounds the work per turn, and an ACK or NAK for a later request waits
//! behind them ([`RespState::held`]): the requester sees every response
//! in PSN order. READ/atomic results are kept in a small replay cache
//! ([`MAX_RES`]) so a duplicate request is answered, never re-executed.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use super::{
    check_length, check_op_seq, check_psn, check_qp_access, check_rkey, RespState, RespStep,
};
use crate::hdr::{Aeth, AtomicAckEth, Bth, NakCode, Syndrome, ACK_UNLIMITED, DEFAULT_PKEY};
use crate::hdr::{GSI_QKEY, QPN_MASK};
use crate::metrics::{inc, Metrics};
use crate::net::{grh, RoceVersion, GRH_LEN};
use crate::opcode::{OpClass, Opcode};
use crate::packet::{Headers, Packet, Payload};
use crate::psn::{psn_compare, Psn};
use crate::req::{read_psns, segment_len};
use crate::sgl::{scatter, SglError};
use crate::verbs::{check_mr, Access, CompletionSink, ImmOrInv, MrTable, Sge};
use crate::verbs::{UdSource, WcOpcode, WcStatus, WorkCompletion};

/// READ/atomic results kept for duplicates (rxe's `max_dest_rd_atomic`
/// resources): bounds the replay cache whatever the peer sends.
pub const MAX_RES: usize = 32;
/// Acknowledge at least every this many requests without AckReq.
pub const ACK_COALESCE: u32 = 16;

/// A receive WQE, as the device decoded it from the RQ or SRQ ring.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecvWqe {
    /// WR id.
    pub wr_id: u64,
    /// Scatter list (at most [`crate::sgl::MAX_SGE`] are used).
    pub sges: Vec<Sge>,
}

/// A receive queue: the QP's own RQ or a shared SRQ, implemented by the
/// device (and by [`crate::qp::RecvRing`]).
pub trait RecvQueue {
    /// Takes the next posted receive WQE.
    fn take(&mut self) -> Option<RecvWqe>;
}

/// Per-QP attributes the responder uses (from modify_qp).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RespAttrs {
    /// Our QPN (1 = GSI).
    pub qpn: u32,
    /// Peer QPN (RC).
    pub dest_qpn: u32,
    /// Protection domain of the QP.
    pub pd: u32,
    /// The remote operations the QP allows (`qp_access_flags`).
    #[serde(with = "crate::verbs::access_bits")]
    pub access: Access,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// RNR timer code sent in RNR NAKs.
    pub min_rnr_timer: u8,
    /// Q_Key of a UD QP.
    pub qkey: u32,
    /// UD service.
    pub ud: bool,
}

/// A READ or atomic result kept for replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResKind {
    /// RDMA READ of `len` bytes at `va` of `rkey`.
    Read {
        /// Remote address.
        va: u64,
        /// Remote key.
        rkey: u32,
        /// DMA length.
        len: u32,
    },
    /// Atomic that returned `orig`.
    Atomic {
        /// Value before the operation.
        orig: u64,
    },
}

/// One replay-cache entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Res {
    /// First PSN of the request.
    pub psn: Psn,
    /// What was done.
    pub kind: ResKind,
    /// Next READ response PSN still to send.
    pub next: Option<Psn>,
}

/// The devices the responder reaches.
pub struct RespCtx<'a> {
    /// Memory regions.
    pub mr: &'a mut dyn MrTable,
    /// Receive WQEs (RQ or SRQ).
    pub rq: &'a mut dyn RecvQueue,
    /// Receive completions.
    pub cq: &'a mut dyn CompletionSink,
    /// Counters.
    pub m: &'a mut Metrics,
}

/// What to send back for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RespOut {
    /// Nothing now (coalesced ACK, READ responses come later, drop).
    Nothing,
    /// An ACK, RNR NAK or atomic ACK.
    Reply(Headers),
    /// A fatal NAK: the QP goes to the error state.
    Fatal(Headers),
}

fn ack_hdrs(a: &RespAttrs, psn: Psn, syndrome: Syndrome, msn: u32) -> Headers {
    Headers {
        bth: Bth {
            opcode: Opcode::RcAcknowledge as u8,
            pkey: DEFAULT_PKEY,
            dqpn: a.dest_qpn,
            psn,
            ..Bth::default()
        },
        aeth: Some(Aeth { syndrome, msn }),
        ..Headers::default()
    }
}

const ACK: Syndrome = Syndrome::Ack {
    credits: ACK_UNLIMITED,
};

/// Ends the open message with an error: its receive WQE (if any) completes
/// with `status`, the peer gets NAK `code` for `psn`.
fn fatal(
    st: &mut RespState,
    a: &RespAttrs,
    cx: &mut RespCtx<'_>,
    code: NakCode,
    status: WcStatus,
    psn: Psn,
) -> RespOut {
    if let Some(w) = st.wqe.take() {
        cx.cq
            .complete(recv_wc(a, w.wr_id, status, WcOpcode::Recv, 0), false);
    }
    inc(&mut cx.m.nak_sent);
    st.end_message();
    RespOut::Fatal(ack_hdrs(a, psn, Syndrome::Nak(code), st.msn))
}

fn recv_wc(
    a: &RespAttrs,
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    len: u32,
) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        byte_len: len,
        imm_or_inv: None,
        qpn: a.qpn,
        src_qpn: 0,
        ud_src: None,
        solicited: false,
    }
}

impl RespState {
    fn end_message(&mut self) {
        self.prev = None;
        self.offset = 0;
        self.write = None;
    }

    /// Queues the response to a new READ or atomic. A held ACK or NAK is
    /// dropped: this request's response acknowledges every earlier PSN.
    fn push_res(&mut self, r: Res) {
        if self.res.len() >= MAX_RES {
            let done = self.res.iter().position(|x| x.next.is_none());
            let _ = self.res.remove(done.unwrap_or(0));
        }
        self.res.push_back(r);
        self.held = None;
    }

    /// Whether READ responses or atomic ACKs are still to be sent.
    fn owes_responses(&self) -> bool {
        self.res.iter().any(|r| r.next.is_some())
    }

    /// ACKs `pkt` (whose last PSN is `last`) now, or later with others.
    fn ack_or_defer(
        &mut self,
        a: &RespAttrs,
        m: &mut Metrics,
        pkt: &Packet<'_>,
        last: Psn,
    ) -> RespOut {
        self.unacked = self.unacked.saturating_add(1);
        if pkt.hdrs.bth.ack_req || self.unacked >= ACK_COALESCE {
            self.unacked = 0;
            RespOut::Reply(ack_hdrs(a, last, ACK, self.msn))
        } else {
            inc(&mut m.ack_deferred);
            RespOut::Nothing
        }
    }
}

/// Handles one RC request packet (or, for UD, one datagram). An ACK or
/// NAK that would overtake responses still owed is held back for
/// [`next_response`]: the one of the highest PSN, the later on a tie, says
/// all the others said (a duplicate's re-ACK of the PSN before a held
/// sequence NAK must not replace the NAK, or the requester would wait
/// for its timer).
pub fn respond(
    st: &mut RespState,
    a: &RespAttrs,
    cx: &mut RespCtx<'_>,
    pkt: &Packet<'_>,
) -> RespOut {
    match handle_request(st, a, cx, pkt) {
        RespOut::Reply(h) if st.owes_responses() => {
            let newer = |(held, _): (Psn, Aeth)| psn_compare(h.bth.psn, held) != Ordering::Less;
            if st.held.is_none_or(newer) {
                st.held = h.aeth.map(|aeth| (h.bth.psn, aeth));
            }
            RespOut::Nothing
        }
        out => out,
    }
}

fn handle_request(
    st: &mut RespState,
    a: &RespAttrs,
    cx: &mut RespCtx<'_>,
    pkt: &Packet<'_>,
) -> RespOut {
    if a.ud {
        ud_receive(a, cx, pkt);
        return RespOut::Nothing;
    }
    let psn = pkt.hdrs.bth.psn;
    match check_psn(st, psn) {
        RespStep::Execute => {}
        RespStep::Duplicate => {
            inc(&mut cx.m.rx_dup_req);
            return duplicate(st, a, pkt);
        }
        RespStep::Drop => {
            inc(&mut cx.m.out_of_seq_req);
            return RespOut::Nothing;
        }
        RespStep::Nak(s) => {
            inc(&mut cx.m.out_of_seq_req);
            return RespOut::Reply(ack_hdrs(a, st.psn, s, st.msn));
        }
    }
    let op = pkt.opcode;
    let checked = check_op_seq(st.prev, op)
        .and_then(|()| check_length(pkt, a.mtu))
        .and_then(|()| check_qp_access(pkt, a.access))
        .and_then(|()| check_rkey(pkt, a.pd, cx.mr));
    if let Err(s) = checked {
        let code = match s {
            Syndrome::Nak(c) => c,
            _ => NakCode::InvalidRequest,
        };
        let status = match code {
            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
            _ => WcStatus::RemInvReqErr,
        };
        return fatal(st, a, cx, code, status, psn);
    }
    if op.is(OpClass::RECV) && st.wqe.is_none() {
        match cx.rq.take() {
            Some(w) => st.wqe = Some(w),
            None => {
                // IBA 9.7.5.2.8: no receive WQE, ask the requester to retry.
                inc(&mut cx.m.rnr_nak_sent);
                st.sent_psn_nak = true;
                let rnr = Syndrome::RnrNak {
                    timer: a.min_rnr_timer,
                };
                return RespOut::Reply(ack_hdrs(a, psn, rnr, st.msn));
            }
        }
    }
    if op.is(OpClass::READ) {
        return read_request(st, a, pkt);
    }
    if op.is(OpClass::ATOMIC) {
        return atomic(st, a, cx, pkt);
    }
    let placed = if op.is(OpClass::WRITE) {
        write_data(st, a, cx, pkt)
    } else {
        send_data(st, a, cx, pkt)
    };
    if let Err((code, status)) = placed {
        return fatal(st, a, cx, code, status, psn);
    }
    // A segment (checked by `check_length`) takes the PSNs of the packets
    // it stands for.
    let span = read_psns(
        u32::try_from(pkt.payload.len()).unwrap_or(u32::MAX),
        a.mtu.max(1),
    );
    let last = psn.add(span.saturating_sub(1));
    st.psn = last.add(1);
    if !op.is(OpClass::LAST) {
        st.prev = Some(op);
        return st.ack_or_defer(a, cx.m, pkt, last);
    }
    if let Some(e) = complete_recv(st, a, cx, pkt) {
        return fatal(st, a, cx, e.0, e.1, psn);
    }
    st.msn = st.msn.wrapping_add(1) & QPN_MASK;
    st.end_message();
    st.ack_or_defer(a, cx.m, pkt, last)
}

type Fail = (NakCode, WcStatus);

fn send_data(
    st: &mut RespState,
    a: &RespAttrs,
    cx: &mut RespCtx<'_>,
    pkt: &Packet<'_>,
) -> Result<(), Fail> {
    let sges = st
        .wqe
        .as_ref()
        .map(|w| w.sges.as_slice())
        .unwrap_or_default();
    scatter(cx.mr, a.pd, sges, st.offset, pkt.payload).map_err(|e| match e {
        SglError::TooShort => (NakCode::InvalidRequest, WcStatus::LocLenErr),
        SglError::Mr(_) | SglError::Mem(_) => {
            (NakCode::RemoteOperationalError, WcStatus::LocProtErr)
        }
    })?;
    st.offset = st.offset.saturating_add(pkt.payload.len() as u32);
    Ok(())
}

fn write_data(
    st: &mut RespState,
    a: &RespAttrs,
    cx: &mut RespCtx<'_>,
    pkt: &Packet<'_>,
) -> Result<(), Fail> {
    let inv = (NakCode::InvalidRequest, WcStatus::RemInvReqErr);
    if let Some(r) = pkt.hdrs.reth {
        st.write = Some((r.va, r.rkey, r.len));
    }
    let (va, rkey, left) = st.write.ok_or(inv)?;
    let n = u32::try_from(pkt.payload.len()).map_err(|_| inv)?;
    let left = left.checked_sub(n).ok_or(inv)?;
    if pkt.opcode.is(OpClass::LAST) && left != 0 {
        return Err(inv);
    }
    if n > 0 {
        check_mr(cx.mr, rkey, a.pd, va, u64::from(n), Access::REMOTE_WRITE)
            .map_err(|_| (NakCode::RemoteAccessError, WcStatus::RemAccessErr))?;
        cx.mr
            .write_payload(rkey, va, pkt.payload)
            .map_err(|_| (NakCode::RemoteOperationalError, WcStatus::RemOpErr))?;
    }
    st.write = Some((va.saturating_add(u64::from(n)), rkey, left));
    st.offset = st.offset.saturating_add(n);
    Ok(())
}

/// Completes the receive WQE of a finished SEND or WRITE_WITH_IMM.
fn complete_recv(
    st: &mut RespState,
    a: &RespAttrs,
    cx: &mut RespCtx<'_>,
    pkt: &Packet<'_>,
) -> Option<Fail> {
    let w = st.wqe.take()?;
    let mut imm_or_inv = pkt.hdrs.imm.map(|i| ImmOrInv::Imm(i.imm));
    if let Some(ieth) = pkt.hdrs.ieth {
        if !cx.mr.invalidate(ieth.rkey, a.pd) {
            st.wqe = Some(w);
            return Some((NakCode::InvalidRequest, WcStatus::RemInvReqErr));
        }
        imm_or_inv = Some(ImmOrInv::Inv(ieth.rkey));
    }
    let opcode = if pkt.opcode.is(OpClass::WRITE) {
        WcOpcode::RecvRdmaWithImm
    } else {
        WcOpcode::Recv
    };
    let mut wc = recv_wc(a, w.wr_id, WcStatus::Success, opcode, st.offset);
    wc.imm_or_inv = imm_or_inv;
    wc.solicited = pkt.hdrs.bth.se;
    cx.cq.complete(wc, false);
    None
}

fn read_request(st: &mut RespState, a: &RespAttrs, pkt: &Packet<'_>) -> RespOut {
    let psn = pkt.hdrs.bth.psn;
    let r = pkt.hdrs.reth.unwrap_or_default();
    st.push_res(Res {
        psn,
        kind: ResKind::Read {
            va: r.va,
            rkey: r.rkey,
            len: r.len,
        },
        next: Some(psn),
    });
    st.psn = psn.add(read_psns(r.len, a.mtu.max(1)));
    st.msn = st.msn.wrapping_add(1) & QPN_MASK;
    st.unacked = 0;
    st.end_message();
    RespOut::Nothing
}

fn atomic(st: &mut RespState, a: &RespAttrs, cx: &mut RespCtx<'_>, pkt: &Packet<'_>) -> RespOut {
    let psn = pkt.hdrs.bth.psn;
    let at = pkt.hdrs.atomic.unwrap_or_default();
    let mut buf = [0u8; 8];
    if cx.mr.read(at.rkey, at.va, &mut buf).is_err() {
        return fatal(
            st,
            a,
            cx,
            NakCode::RemoteOperationalError,
            WcStatus::RemOpErr,
            psn,
        );
    }
    // Guest memory holds the value in the host's (little-endian) order.
    let orig = u64::from_le_bytes(buf);
    let new = if pkt.opcode == Opcode::RcCompareSwap {
        if orig == at.compare {
            at.swap_add
        } else {
            orig
        }
    } else {
        orig.wrapping_add(at.swap_add)
    };
    if cx.mr.write(at.rkey, at.va, &new.to_le_bytes()).is_err() {
        return fatal(
            st,
            a,
            cx,
            NakCode::RemoteOperationalError,
            WcStatus::RemOpErr,
            psn,
        );
    }
    st.push_res(Res {
        psn,
        kind: ResKind::Atomic { orig },
        next: Some(psn),
    });
    st.psn = psn.add(1);
    st.msn = st.msn.wrapping_add(1) & QPN_MASK;
    st.unacked = 0;
    st.end_message();
    RespOut::Nothing
}

fn atomic_ack(a: &RespAttrs, psn: Psn, msn: u32, orig: u64) -> Headers {
    let mut h = ack_hdrs(a, psn, ACK, msn);
    h.bth.opcode = Opcode::RcAtomicAcknowledge as u8;
    h.atomic_ack = Some(AtomicAckEth { orig });
    h
}

/// IBA 9.7.5.1.2 / rxe `duplicate_request`: re-ACK, replay the atomic
/// result or re-serve the READ from the duplicate PSN; never re-execute.
fn duplicate(st: &mut RespState, a: &RespAttrs, pkt: &Packet<'_>) -> RespOut {
    let psn = pkt.hdrs.bth.psn;
    let mtu = a.mtu.max(1);
    let hit = st.res.iter_mut().find(|r| match r.kind {
        ResKind::Read { len, .. } => psn.distance_from(r.psn) < read_psns(len, mtu),
        ResKind::Atomic { .. } => r.psn == psn,
    });
    let (read, atomic) = (pkt.opcode.is(OpClass::READ), pkt.opcode.is(OpClass::ATOMIC));
    match hit {
        Some(r) if read && matches!(r.kind, ResKind::Read { .. }) => r.next = Some(psn),
        Some(r) if atomic && matches!(r.kind, ResKind::Atomic { .. }) => r.next = Some(psn),
        _ if !read && !atomic => return RespOut::Reply(ack_hdrs(a, st.psn.sub(1), ACK, st.msn)),
        _ => {}
    }
    RespOut::Nothing
}

/// The next response packet owed to the peer: its headers, and for READ
/// data where its payload is (read it with [`MrTable::read`]; checked here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Response {
    /// Headers (READ response, atomic ACK, a held ACK/NAK, or a remote
    /// access NAK when the MR went away meanwhile).
    pub hdrs: Headers,
    /// Key of the payload's MR.
    pub rkey: u32,
    /// Address of the payload.
    pub va: u64,
    /// Payload bytes (0 but for READ data).
    pub len: u32,
}

impl Response {
    /// A response of headers only.
    fn bare(hdrs: Headers) -> Self {
        Response {
            hdrs,
            rkey: 0,
            va: 0,
            len: 0,
        }
    }
}

/// rxe `read_reply` / `atomic_reply`: the next response owed to the peer,
/// in PSN order: a READ response (one MTU of data at most, or up to
/// `segment` bytes, whole MTUs but the last, see
/// [`crate::req::segment_len`], towards a same-host peer), or a remote
/// access NAK when the MR went away meanwhile; an atomic ACK; then the
/// ACK or NAK held behind them. `None` when nothing is owed.
pub fn next_response(
    st: &mut RespState,
    a: &RespAttrs,
    mr: &dyn MrTable,
    segment: u32,
) -> Option<Response> {
    let msn = st.msn;
    let mtu = a.mtu.max(1);
    let seg = segment_len(segment, a.mtu.clamp(256, 4096));
    let Some(r) = st.res.iter_mut().find(|r| r.next.is_some()) else {
        let (psn, aeth) = st.held.take()?;
        return Some(Response::bare(ack_hdrs(a, psn, aeth.syndrome, aeth.msn)));
    };
    let psn = r.next?;
    let (va, rkey, len) = match r.kind {
        ResKind::Read { va, rkey, len } => (va, rkey, len),
        ResKind::Atomic { orig } => {
            r.next = None;
            return Some(Response::bare(atomic_ack(a, psn, msn, orig)));
        }
    };
    let npsn = read_psns(len, mtu);
    let idx = psn.distance_from(r.psn);
    let off = idx.saturating_mul(mtu);
    let n = len.saturating_sub(off).min(seg);
    let span = read_psns(n, mtu);
    let last = idx.saturating_add(span) >= npsn;
    r.next = (!last).then(|| psn.add(span));
    let at = va.saturating_add(u64::from(off));
    if n > 0 && check_mr(mr, rkey, a.pd, at, u64::from(n), Access::REMOTE_READ).is_err() {
        r.next = None;
        let nak = Syndrome::Nak(NakCode::RemoteAccessError);
        return Some(Response::bare(ack_hdrs(a, psn, nak, msn)));
    }
    let opcode = match (idx == 0, last) {
        (true, true) => Opcode::RcRdmaReadResponseOnly,
        (true, false) => Opcode::RcRdmaReadResponseFirst,
        (false, true) => Opcode::RcRdmaReadResponseLast,
        (false, false) => Opcode::RcRdmaReadResponseMiddle,
    };
    let mut hdrs = ack_hdrs(a, psn, ACK, msn);
    hdrs.bth.opcode = opcode as u8;
    Some(Response {
        hdrs,
        rkey,
        va: at,
        len: n,
    })
}

/// UD/GSI receive (IBA 10.2.4 / 11.4.1.2): Q_Key check, the GRH area in
/// the first 40 bytes of the buffer, then the payload. Nothing is ever
/// sent back.
fn ud_receive(a: &RespAttrs, cx: &mut RespCtx<'_>, pkt: &Packet<'_>) {
    let Some(deth) = pkt.hdrs.deth else {
        return;
    };
    let want = if a.qpn == 1 { GSI_QKEY } else { a.qkey };
    if deth.qkey != want {
        inc(&mut cx.m.qkey_violation);
        return;
    }
    let Some(w) = cx.rq.take() else {
        inc(&mut cx.m.ud_no_wqe);
        return;
    };
    let plen = u16::try_from(pkt.payload.len()).unwrap_or(u16::MAX);
    let g = grh(&pkt.layers, plen);
    let placed = scatter(cx.mr, a.pd, &w.sges, 0, Payload::from(&g[..]))
        .and_then(|()| scatter(cx.mr, a.pd, &w.sges, GRH_LEN as u32, pkt.payload));
    let status = match placed {
        Ok(()) => WcStatus::Success,
        Err(SglError::TooShort) => WcStatus::LocLenErr,
        Err(_) => WcStatus::LocProtErr,
    };
    let len = u32::from(plen).saturating_add(GRH_LEN as u32);
    let mut wc = recv_wc(a, w.wr_id, status, WcOpcode::Recv, len);
    wc.src_qpn = deth.src_qpn;
    wc.ud_src = Some(UdSource {
        ipv6: pkt.layers.ip.src.is_ipv6(),
        smac: pkt.layers.src_mac,
        roce_v1: pkt.layers.encap.version == RoceVersion::V1,
    });
    wc.imm_or_inv = pkt.hdrs.imm.map(|i| ImmOrInv::Imm(i.imm));
    wc.solicited = pkt.hdrs.bth.se;
    cx.cq.complete(wc, false);
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
mod tests {
    use super::*;
    use crate::hdr::{AtomicEth, Reth};
    use crate::packet::test_packet;
    use crate::verbs::TestMr;

    const A: RespAttrs = RespAttrs {
        qpn: 2,
        dest_qpn: 1,
        pd: 0,
        access: Access::all(),
        mtu: 256,
        min_rnr_timer: 1,
        qkey: 0,
        ud: false,
    };

    struct Rq;
    impl RecvQueue for Rq {
        fn take(&mut self) -> Option<RecvWqe> {
            None
        }
    }
    struct Cq;
    impl CompletionSink for Cq {
        fn complete(&mut self, _: WorkCompletion, _: bool) {}
    }

    fn request(op: Opcode, psn: u32, payload: &[u8]) -> Packet<'_> {
        let mut hdrs = Headers {
            bth: Bth {
                opcode: op as u8,
                psn: Psn::new(psn),
                ack_req: true,
                ..Bth::default()
            },
            ..Headers::default()
        };
        if op.has(crate::opcode::Hdrs::RETH) {
            let len = if op == Opcode::RcRdmaReadRequest {
                600
            } else {
                8
            };
            hdrs.reth = Some(Reth {
                va: 0,
                rkey: 1,
                len,
            });
        }
        hdrs.atomic = Some(AtomicEth {
            va: 64,
            rkey: 1,
            swap_add: 1,
            compare: 0,
        });
        test_packet(op, hdrs, payload)
    }

    /// IBA 9.7.5.1: the responder answers in PSN order. The ACK of a
    /// WRITE executed while a READ's responses are still owed waits
    /// behind them (it would otherwise tell the requester that they were
    /// lost), and so does an atomic's ACK; a later ACK or NAK replaces a
    /// held one, and a new READ drops it (its responses acknowledge it).
    #[test]
    fn responses_go_out_in_psn_order() {
        let mut st = RespState {
            psn: Psn::new(10),
            ..RespState::default()
        };
        let mut mem = TestMr(vec![0; 4096]);
        let (mut rq, mut cq, mut m) = (Rq, Cq, Metrics::default());
        let mut cx = RespCtx {
            mr: &mut mem,
            rq: &mut rq,
            cq: &mut cq,
            m: &mut m,
        };
        let sent = |st: &mut RespState, pkt: &Packet<'_>, cx: &mut RespCtx<'_>| {
            let out = respond(st, &A, cx, pkt);
            assert!(matches!(out, RespOut::Nothing), "{out:?}");
        };
        // READ of 600 bytes: PSNs 10-12; WRITE 13; atomic 14; WRITE 15.
        sent(
            &mut st,
            &request(Opcode::RcRdmaReadRequest, 10, &[]),
            &mut cx,
        );
        let data = [1u8; 8];
        sent(
            &mut st,
            &request(Opcode::RcRdmaWriteOnly, 13, &data),
            &mut cx,
        );
        assert_eq!(st.held.map(|h| h.0.get()), Some(13));
        sent(&mut st, &request(Opcode::RcFetchAdd, 14, &[]), &mut cx);
        assert_eq!(st.held, None, "the atomic's ACK acknowledges 13");
        sent(
            &mut st,
            &request(Opcode::RcRdmaWriteOnly, 15, &data),
            &mut cx,
        );
        // A duplicate WRITE is re-acknowledged, behind the rest as well.
        sent(
            &mut st,
            &request(Opcode::RcRdmaWriteOnly, 13, &data),
            &mut cx,
        );
        let mut order = vec![];
        while let Some(Response { hdrs: h, .. }) = next_response(&mut st, &A, cx.mr, 0) {
            let op = Opcode::try_from(h.bth.opcode).unwrap();
            order.push((op, h.bth.psn.get()));
        }
        use Opcode::*;
        assert_eq!(
            order,
            [
                (RcRdmaReadResponseFirst, 10),
                (RcRdmaReadResponseMiddle, 11),
                (RcRdmaReadResponseLast, 12),
                (RcAtomicAcknowledge, 14),
                (RcAcknowledge, 15),
            ]
        );
        // Nothing owed: the next ACK goes out at once.
        let out = respond(&mut st, &A, &mut cx, &request(RcRdmaWriteOnly, 16, &data));
        assert!(matches!(out, RespOut::Reply(h) if h.bth.psn.get() == 16));
        // A duplicate atomic replays its result, in order too.
        sent(&mut st, &request(RcFetchAdd, 14, &[]), &mut cx);
        let h = next_response(&mut st, &A, cx.mr, 0).unwrap().hdrs;
        assert_eq!(h.atomic_ack.map(|a| a.orig), Some(0));
        assert!(next_response(&mut st, &A, cx.mr, 0).is_none());
        // READ 17-19 owed; 21 comes before 20 (the NAK of 20 is held), then
        // a duplicate of 16, whose re-ACK of 19 must not replace the NAK.
        sent(&mut st, &request(RcRdmaReadRequest, 17, &[]), &mut cx);
        sent(&mut st, &request(RcRdmaWriteOnly, 21, &data), &mut cx);
        sent(&mut st, &request(RcRdmaWriteOnly, 16, &data), &mut cx);
        let mut last = None;
        while let Some(Response { hdrs: h, .. }) = next_response(&mut st, &A, cx.mr, 0) {
            last = Some((h.bth.psn.get(), h.aeth.unwrap().syndrome));
        }
        assert_eq!(last, Some((20, Syndrome::Nak(NakCode::PsnSeqError))));
    }
}
