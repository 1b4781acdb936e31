// SPDX-License-Identifier: Apache-2.0
//! The RC/UD requester (rxe_req.c): turns the send WQE at the head of the
//! send queue into packets, one [`req_step`] per packet, with path-MTU
//! segmentation, PSN assignment and the unacknowledged-PSN window.
//!
//! Steps are pure: [`req_step`] reads the WQE and the role state and says
//! what to send ([`ReqStep::Packet`] with headers and the payload range of
//! the WQE to gather) or why not; the driver gathers the payload through
//! its MR table and hands the frame to its packet sink. Opcode choice is
//! the pure [`next_opcode`], as rxe's `next_opcode_rc`.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use serde::{Deserialize, Serialize};

use crate::hdr::{AtomicEth, Bth, Deth, Ieth, ImmDt, Reth, DEFAULT_PKEY};
use crate::opcode::Hdrs;
use crate::opcode::{OpClass, Opcode};
use crate::packet::Headers;
use crate::psn::Psn;
use crate::verbs::{WcStatus, WrOpcode};

/// Most PSNs in flight without an ACK (rxe's `RXE_MAX_UNACKED_PSNS`):
/// bounds the retransmission work one timeout can cause.
pub const MAX_UNACKED_PSNS: u32 = 128;
/// Most payload bytes in flight without an ACK while the QP sends
/// segments (its peer is on the same-host channel): 128 PSNs of 1 KiB
/// are two 64 KiB messages, so a stream went in lock-step with its ACKs
/// (the sender's worker idle until the receiver's had placed a message
/// and ACKed it). A wider window lets the sender run ahead into the
/// ring; it is still a window of PSNs, of MTU packets, so retransmission
/// and a switch to the wire (where the window is rxe's again) are
/// unchanged, and a timeout resends at most this much.
pub const SEGMENT_WINDOW: u32 = 1 << 20;
/// Most payload bytes of a segment: a packet of the same-host channel
/// that carries several path MTUs of its message at once (a multiple of
/// every MTU, and its frame stays within an IP datagram). It stands for
/// as many packets and takes as many PSNs ([`read_psns`] of its length),
/// so the PSN space, ACKs, retransmission and the switch to the wire are
/// those of MTU packets; it saves their per-packet work, not their PSNs.
pub const MAX_SEGMENT: u32 = 32 << 10;
/// Most payload bytes of a described segment (the one-copy path: its
/// record carries where the payload lies in the sender's memory, not the
/// bytes, so no datagram bounds it): a 64 KiB message is one record, not
/// two, and the requester's and responder's work per segment is paid
/// half as often (128 KiB measured no better at 64 KiB and worse at
/// 1 MiB: docs/benchmarks.md). Over 4 KiB pages, a segment of it from at
/// most [`DESCRIBED_SGES`] SGEs lies in at most 16 + 2 x 16 runs, so its
/// runs always fit [`crate::packet::MAX_RUNS`].
pub const MAX_DESCRIBED_SEGMENT: u32 = 64 << 10;
/// Most SGEs of a WQE that the requester sends in described segments of
/// up to [`MAX_DESCRIBED_SEGMENT`]; a WQE with more sends segments of up
/// to [`MAX_SEGMENT`], which the ring can carry copied when their runs
/// are too many to describe.
pub const DESCRIBED_SGES: usize = 16;

/// Remote part of a send WQE (RC RDMA/atomic or UD destination).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remote {
    /// Remote address (RDMA, atomics).
    pub addr: u64,
    /// Remote key (RDMA, atomics).
    pub rkey: u32,
    /// Compare (CmpSwap) or add (FetchAdd) operand.
    pub compare_add: u64,
    /// Swap operand (CmpSwap).
    pub swap: u64,
    /// UD destination QPN.
    pub ud_qpn: u32,
    /// UD Q_Key.
    pub ud_qkey: u32,
}

/// A validated send WQE, as the device decoded it from the SQ ring.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendWqe {
    /// WR id.
    pub wr_id: u64,
    /// Operation.
    pub opcode: WrOpcode,
    /// Total payload length (sum of SGE lengths, or inline length).
    pub len: u32,
    /// Solicited event.
    pub solicited: bool,
    /// Immediate data (`*_WITH_IMM`) or rkey to invalidate (`SEND_WITH_INV`).
    pub imm_or_inv: u32,
    /// Remote operands.
    pub remote: Remote,
}

/// Per-QP attributes the requester uses (set by modify_qp).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReqAttrs {
    /// Destination QPN (RC) — UD takes it from the WQE.
    pub dest_qpn: u32,
    /// Our QPN (DETH source QPN for UD).
    pub qpn: u32,
    /// Path MTU in bytes (256..=4096).
    pub mtu: u32,
    /// Most payload bytes per packet: `mtu`, or up to [`MAX_SEGMENT`]
    /// (rounded down to a multiple of `mtu`) towards a same-host peer, up
    /// to [`MAX_DESCRIBED_SEGMENT`] towards one that maps our memory.
    pub segment: u32,
    /// UD service.
    pub ud: bool,
}

/// Requester role state (`qp->req`); plain data, saved for migration and
/// untrusted on restore.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReqState {
    /// Next PSN to send.
    pub psn: Psn,
    /// Oldest unacknowledged PSN (advanced by the completer).
    pub una: Psn,
    /// Bytes of the current WQE already sent.
    pub offset: u32,
    /// Opcode of the previous packet of the current message.
    pub prev: Option<Opcode>,
    /// PSNs sent since the last AckReq (of this message, or of earlier
    /// ones that asked for none: [`req_step`]'s `follows`).
    pub since_ack_req: u32,
}

/// What the requester does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReqStep {
    /// Send a packet with these headers and WQE payload bytes
    /// `[payload_off, payload_off + payload_len)`; `done` when this was the
    /// WQE's last packet.
    Packet {
        /// Transport headers.
        hdrs: Headers,
        /// Offset into the WQE's payload.
        payload_off: u32,
        /// Payload bytes.
        payload_len: u32,
        /// Last packet of the WQE.
        done: bool,
    },
    /// A local operation (LOCAL_INV, REG_MR): execute without a packet.
    Local,
    /// The unacknowledged window is full: wait for the completer.
    WindowFull,
    /// The WQE cannot be sent: complete it with this status.
    CqeErr(WcStatus),
}

/// Chooses the opcode of the next packet of a `wr` message, given the
/// previous packet's opcode of the same message and whether the rest fits
/// in one MTU (rxe `next_opcode_rc`/`next_opcode_ud`). `None` for local
/// operations and for opcodes the service does not allow.
pub fn next_opcode(wr: WrOpcode, prev: Option<Opcode>, fits: bool, ud: bool) -> Option<Opcode> {
    use Opcode::*;
    let cont =
        prev.is_some_and(|p| p.is(OpClass::FIRST) && !p.is(OpClass::LAST) || p.is(OpClass::MIDDLE));
    let pick = |first, middle, last, only| {
        Some(match (cont, fits) {
            (false, true) => only,
            (false, false) => first,
            (true, true) => last,
            (true, false) => middle,
        })
    };
    if ud {
        return match wr {
            WrOpcode::Send => Some(UdSendOnly),
            WrOpcode::SendWithImm => Some(UdSendOnlyWithImmediate),
            _ => None,
        };
    }
    match wr {
        WrOpcode::Send => pick(RcSendFirst, RcSendMiddle, RcSendLast, RcSendOnly),
        WrOpcode::SendWithImm => pick(
            RcSendFirst,
            RcSendMiddle,
            RcSendLastWithImmediate,
            RcSendOnlyWithImmediate,
        ),
        WrOpcode::SendWithInv => pick(
            RcSendFirst,
            RcSendMiddle,
            RcSendLastWithInvalidate,
            RcSendOnlyWithInvalidate,
        ),
        WrOpcode::RdmaWrite => pick(
            RcRdmaWriteFirst,
            RcRdmaWriteMiddle,
            RcRdmaWriteLast,
            RcRdmaWriteOnly,
        ),
        WrOpcode::RdmaWriteWithImm => pick(
            RcRdmaWriteFirst,
            RcRdmaWriteMiddle,
            RcRdmaWriteLastWithImmediate,
            RcRdmaWriteOnlyWithImmediate,
        ),
        WrOpcode::RdmaRead => Some(RcRdmaReadRequest),
        WrOpcode::AtomicCmpAndSwp => Some(RcCompareSwap),
        WrOpcode::AtomicFetchAndAdd => Some(RcFetchAdd),
        WrOpcode::LocalInv | WrOpcode::RegMr => None,
    }
}

/// Number of PSNs a `len`-byte RDMA READ occupies (one per response
/// packet), and those a segment of `len` payload bytes stands for.
pub fn read_psns(len: u32, mtu: u32) -> u32 {
    len.saturating_sub(1)
        .checked_div(mtu)
        .unwrap_or(0)
        .saturating_add(1)
}

/// Most payload bytes a received packet may carry: one path MTU from a
/// wire, a segment's ([`MAX_DESCRIBED_SEGMENT`]) from the same-host
/// channel (a copied segment is at most [`MAX_SEGMENT`], which its ring
/// record bounds; a described one may be larger).
pub fn max_payload(same_host: bool, mtu: u32) -> u32 {
    if same_host {
        MAX_DESCRIBED_SEGMENT
    } else {
        mtu
    }
}

/// The payload bytes per packet for a `segment` limit at path MTU `mtu`
/// (256..=4096): a multiple of `mtu`, at least `mtu`, at most
/// [`MAX_DESCRIBED_SEGMENT`].
pub fn segment_len(segment: u32, mtu: u32) -> u32 {
    let seg = segment.clamp(mtu, MAX_DESCRIBED_SEGMENT.max(mtu));
    seg.checked_div(mtu).unwrap_or(1).saturating_mul(mtu)
}

/// The PSNs a QP of `a` may have in flight without an ACK:
/// [`MAX_UNACKED_PSNS`], or [`SEGMENT_WINDOW`] bytes' worth of MTU packets
/// while it sends segments. An AckReq goes out at least every half of it
/// (rxe sets AckReq on a message's last packet and when the window fills
/// up).
pub fn window(a: &ReqAttrs) -> u32 {
    let mtu = a.mtu.clamp(256, 4096);
    if segment_len(a.segment, mtu) > mtu {
        MAX_UNACKED_PSNS.max(SEGMENT_WINDOW.checked_div(mtu).unwrap_or(0))
    } else {
        MAX_UNACKED_PSNS
    }
}

/// Plans the next packet of `wqe` and advances `st` as if it were sent.
///
/// `follows`: another message goes out right behind this one (the send
/// queue holds a WRITE or SEND after it, which waits for no response).
/// While the QP sends segments, a message with one behind it asks for no
/// ACK of its own: the last of a run does, and one every half window. So
/// a stream's ACKs are one per run of messages the requester sends
/// however the receiver takes them; a receiver that kept up with the
/// ring used to ACK every message, one that lagged every batch of four
/// (docs/benchmarks.md, `speed6`). On a wire every message asks, as
/// rxe's do.
pub fn req_step(st: &mut ReqState, wqe: &SendWqe, a: &ReqAttrs, follows: bool) -> ReqStep {
    if matches!(wqe.opcode, WrOpcode::LocalInv | WrOpcode::RegMr) {
        return ReqStep::Local;
    }
    let window = window(a);
    if !a.ud && st.psn.distance_from(st.una) >= window {
        return ReqStep::WindowFull;
    }
    let mtu = a.mtu.clamp(256, 4096);
    let seg = segment_len(a.segment, mtu);
    let rest = wqe.len.saturating_sub(st.offset);
    let is_read = wqe.opcode == WrOpcode::RdmaRead;
    let fits = is_read || rest <= seg;
    let Some(op) = next_opcode(wqe.opcode, st.prev, fits, a.ud) else {
        return ReqStep::CqeErr(WcStatus::LocQpOpErr);
    };
    if a.ud && wqe.len > mtu {
        return ReqStep::CqeErr(WcStatus::LocLenErr);
    }
    let payload_len = if op.is(OpClass::PAYLOAD) {
        rest.min(seg)
    } else {
        0
    };
    let done = op.is(OpClass::LAST) || !op.is(OpClass::PAYLOAD);
    // A READ takes a PSN per response (of what is left after a rewind), a
    // segment those of the MTU packets it stands for.
    let psns = read_psns(if is_read { rest } else { payload_len }, mtu);
    st.since_ack_req = st.since_ack_req.saturating_add(psns);
    let asks = done && !(follows && seg > mtu);
    let ack_req = !a.ud && (asks || st.since_ack_req >= window.div_ceil(2));
    if ack_req {
        st.since_ack_req = 0;
    }
    let r = &wqe.remote;
    let mut hdrs = Headers {
        bth: Bth {
            opcode: op as u8,
            se: wqe.solicited && done,
            pkey: DEFAULT_PKEY,
            dqpn: if a.ud { r.ud_qpn } else { a.dest_qpn },
            ack_req,
            psn: st.psn,
            ..Bth::default()
        },
        ..Headers::default()
    };
    if op.has(Hdrs::RETH) {
        // A READ resumed by [`rewind`] asks for the rest only.
        let skip = if is_read { st.offset } else { 0 };
        hdrs.reth = Some(Reth {
            va: r.addr.wrapping_add(u64::from(skip)),
            rkey: r.rkey,
            len: wqe.len.saturating_sub(skip),
        });
    }
    if op.has(Hdrs::ATMETH) {
        let (swap_add, compare) = match wqe.opcode {
            WrOpcode::AtomicCmpAndSwp => (r.swap, r.compare_add),
            _ => (r.compare_add, 0),
        };
        hdrs.atomic = Some(AtomicEth {
            va: r.addr,
            rkey: r.rkey,
            swap_add,
            compare,
        });
    }
    if op.has(Hdrs::IMMDT) {
        hdrs.imm = Some(ImmDt {
            imm: wqe.imm_or_inv,
        });
    }
    if op.has(Hdrs::IETH) {
        hdrs.ieth = Some(Ieth {
            rkey: wqe.imm_or_inv,
        });
    }
    if op.has(Hdrs::DETH) {
        hdrs.deth = Some(Deth {
            qkey: r.ud_qkey,
            src_qpn: a.qpn,
        });
    }
    let payload_off = st.offset;
    st.psn = st.psn.add(psns);
    if done {
        st.offset = 0;
        st.prev = None;
    } else {
        st.offset = st.offset.saturating_add(payload_len);
        st.prev = Some(op);
    }
    ReqStep::Packet {
        hdrs,
        payload_off,
        payload_len,
        done,
    }
}

/// rxe `req_retry`: rewinds the requester to resend `wqe` (whose first
/// PSN is `first`) from `psn`. SEND and WRITE resume at the packet of
/// `psn`. A READ resumes there too: the request goes again with that PSN
/// for the rest of the data (RETH address and length advanced, as IBA
/// 9.7.5.1.4 allows and rxe does), and the responder re-serves from it;
/// restarting whole would re-read what already arrived, and on a link
/// that drops part of every burst a long READ would never complete.
/// Atomics restart (the responder replays the result). Returns the PSN
/// that goes out first.
pub fn rewind(st: &mut ReqState, wqe: &SendWqe, first: Psn, psn: Psn, mtu: u32) -> Psn {
    let mtu = mtu.clamp(256, 4096);
    let (k, kind) = match wqe.opcode {
        WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => {
            (psn.distance_from(first), Some(Opcode::RcSendFirst))
        }
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => {
            (psn.distance_from(first), Some(Opcode::RcRdmaWriteFirst))
        }
        WrOpcode::RdmaRead => (psn.distance_from(first), None),
        _ => (0, None),
    };
    let k = k.min(read_psns(wqe.len, mtu).saturating_sub(1));
    st.psn = first.add(k);
    st.offset = k.saturating_mul(mtu);
    st.prev = kind.filter(|_| k > 0);
    st.since_ack_req = 0;
    st.psn
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
    use Opcode::*;

    fn wqe(opcode: WrOpcode, len: u32) -> SendWqe {
        SendWqe {
            wr_id: 1,
            opcode,
            len,
            solicited: false,
            imm_or_inv: 0xabcd,
            remote: Remote::default(),
        }
    }

    const RC: ReqAttrs = ReqAttrs {
        dest_qpn: 0x22,
        qpn: 0x11,
        mtu: 1024,
        segment: 1024,
        ud: false,
    };

    /// IBA 9.4 (packet sequences): FIRST MIDDLE* LAST or ONLY.
    #[test]
    fn next_opcode_table() {
        let cases = [
            (WrOpcode::Send, None, true, Some(RcSendOnly)),
            (WrOpcode::Send, None, false, Some(RcSendFirst)),
            (WrOpcode::Send, Some(RcSendFirst), false, Some(RcSendMiddle)),
            (WrOpcode::Send, Some(RcSendMiddle), true, Some(RcSendLast)),
            (
                WrOpcode::SendWithImm,
                Some(RcSendMiddle),
                true,
                Some(RcSendLastWithImmediate),
            ),
            (
                WrOpcode::SendWithInv,
                None,
                true,
                Some(RcSendOnlyWithInvalidate),
            ),
            (
                WrOpcode::SendWithInv,
                Some(RcSendFirst),
                true,
                Some(RcSendLastWithInvalidate),
            ),
            (WrOpcode::RdmaWrite, None, false, Some(RcRdmaWriteFirst)),
            (
                WrOpcode::RdmaWrite,
                Some(RcSendOnly),
                true,
                Some(RcRdmaWriteOnly),
            ),
            (
                WrOpcode::RdmaWriteWithImm,
                Some(RcRdmaWriteFirst),
                true,
                Some(RcRdmaWriteLastWithImmediate),
            ),
            (
                WrOpcode::RdmaWriteWithImm,
                None,
                true,
                Some(RcRdmaWriteOnlyWithImmediate),
            ),
            (WrOpcode::RdmaRead, None, false, Some(RcRdmaReadRequest)),
            (WrOpcode::AtomicCmpAndSwp, None, true, Some(RcCompareSwap)),
            (WrOpcode::AtomicFetchAndAdd, None, true, Some(RcFetchAdd)),
            (WrOpcode::LocalInv, None, true, None),
            (WrOpcode::RegMr, None, true, None),
        ];
        for (wr, prev, fits, want) in cases {
            assert_eq!(
                next_opcode(wr, prev, fits, false),
                want,
                "{wr:?} {prev:?} {fits}"
            );
        }
        assert_eq!(
            next_opcode(WrOpcode::SendWithImm, None, true, true),
            Some(UdSendOnlyWithImmediate)
        );
        assert_eq!(next_opcode(WrOpcode::RdmaWrite, None, true, true), None);
    }

    #[test]
    fn segments_by_mtu_with_psns() {
        let mut st = ReqState {
            psn: Psn::new(0xff_fffe),
            una: Psn::new(0xff_fffe),
            ..ReqState::default()
        };
        let w = wqe(WrOpcode::SendWithImm, 2500);
        let mut got = vec![];
        loop {
            match req_step(&mut st, &w, &RC, false) {
                ReqStep::Packet {
                    hdrs,
                    payload_off,
                    payload_len,
                    done,
                } => {
                    got.push((
                        hdrs.bth.opcode,
                        hdrs.bth.psn.get(),
                        payload_off,
                        payload_len,
                        hdrs.bth.ack_req,
                    ));
                    if done {
                        break;
                    }
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            got,
            [
                (RcSendFirst as u8, 0xff_fffe, 0, 1024, false),
                (RcSendMiddle as u8, 0xff_ffff, 1024, 1024, false),
                (RcSendLastWithImmediate as u8, 0, 2048, 452, true),
            ]
        );
        assert_eq!((st.psn.get(), st.offset, st.prev), (1, 0, None));
    }

    /// Towards a same-host peer: segments of whole MTUs, each taking the
    /// PSNs of the MTU packets it stands for; AckReq on the last.
    #[test]
    fn segments_take_the_psns_of_their_mtus() {
        let mut st = ReqState::default();
        let a = ReqAttrs {
            segment: MAX_SEGMENT,
            ..RC
        };
        let w = wqe(WrOpcode::RdmaWrite, 70 << 10);
        let mut got = vec![];
        while let ReqStep::Packet {
            hdrs,
            payload_len,
            done,
            ..
        } = req_step(&mut st, &w, &a, false)
        {
            got.push((
                hdrs.bth.opcode,
                hdrs.bth.psn.get(),
                payload_len,
                hdrs.bth.ack_req,
            ));
            if done {
                break;
            }
        }
        assert_eq!(
            got,
            [
                (RcRdmaWriteFirst as u8, 0, 32 << 10, false),
                (RcRdmaWriteMiddle as u8, 32, 32 << 10, false),
                (RcRdmaWriteLast as u8, 64, 6 << 10, true),
            ]
        );
        assert_eq!(st.psn.get(), 70);
        assert_eq!(segment_len(0, 1024), 1024);
        assert_eq!(segment_len(5000, 4096), 4096);
        assert_eq!(segment_len(u32::MAX, 4096), MAX_DESCRIBED_SEGMENT);
    }

    /// How far ahead of its ACKs a QP may run: 128 PSNs on a wire (two
    /// 64 KiB messages at MTU 1024), [`SEGMENT_WINDOW`] bytes of them
    /// while it sends segments, with an AckReq every half window of a
    /// long message; a QP whose peer leaves the channel with more in
    /// flight waits until the ACKs bring it back under rxe's window.
    #[test]
    fn segments_have_a_window_of_bytes() {
        let seg = ReqAttrs {
            segment: MAX_SEGMENT,
            ..RC
        };
        for (a, psns) in [(RC, MAX_UNACKED_PSNS), (seg, SEGMENT_WINDOW / 1024)] {
            let mut st = ReqState::default();
            let w = wqe(WrOpcode::RdmaWrite, 4 << 20);
            let mut ack_reqs = vec![];
            while let ReqStep::Packet { hdrs, .. } = req_step(&mut st, &w, &a, false) {
                if hdrs.bth.ack_req {
                    ack_reqs.push(st.psn.get());
                }
            }
            assert_eq!(st.psn.get(), psns, "{a:?}");
            assert_eq!(ack_reqs, [psns / 2, psns], "{a:?}");
            assert_eq!(window(&a), psns);
        }
        assert_eq!(window(&ReqAttrs { mtu: 4096, ..seg }), 256);
        assert_eq!(window(&ReqAttrs { mtu: 256, ..seg }), 4096);
        // The peer moved off the channel with 1 MiB in flight.
        let mut st = ReqState {
            psn: Psn::new(1024),
            ..ReqState::default()
        };
        let w = wqe(WrOpcode::RdmaWrite, 1 << 20);
        assert_eq!(req_step(&mut st, &w, &RC, false), ReqStep::WindowFull);
        st.una = Psn::new(1024 - 127);
        assert!(matches!(
            req_step(&mut st, &w, &RC, false),
            ReqStep::Packet {
                payload_len: 1024,
                ..
            }
        ));
    }

    #[test]
    fn read_takes_one_psn_per_response() {
        let mut st = ReqState::default();
        let ReqStep::Packet {
            hdrs,
            payload_len,
            done,
            ..
        } = req_step(&mut st, &wqe(WrOpcode::RdmaRead, 3000), &RC, false)
        else {
            panic!()
        };
        assert_eq!((hdrs.reth.unwrap().len, payload_len, done), (3000, 0, true));
        assert_eq!(st.psn.get(), 3);
        assert_eq!(read_psns(0, 1024), 1);
        assert_eq!(read_psns(1024, 1024), 1);
        assert_eq!(read_psns(u32::MAX, 256), 16_777_216);
    }

    /// A READ whose first two responses arrived resumes at the third
    /// (IBA 9.7.5.1.4): the request goes again with that PSN, for the
    /// rest of the data; SEND and WRITE resume mid-message; an atomic
    /// restarts.
    #[test]
    fn rewind_resumes_at_the_first_missing_psn() {
        let mut read = wqe(WrOpcode::RdmaRead, 3000);
        read.remote.addr = 0x10_0000;
        let first = Psn::new(0xff_ffff);
        let mut st = ReqState {
            una: first,
            ..ReqState::default()
        };
        let psn = rewind(&mut st, &read, first, first.add(2), RC.mtu);
        assert_eq!(psn, Psn::new(1));
        let ReqStep::Packet { hdrs, done, .. } = req_step(&mut st, &read, &RC, false) else {
            panic!()
        };
        assert_eq!((hdrs.bth.psn, done), (Psn::new(1), true));
        let reth = hdrs.reth.unwrap();
        assert_eq!((reth.va, reth.len), (0x10_0000 + 2048, 952));
        assert_eq!((st.psn, st.offset, st.prev), (Psn::new(2), 0, None));
        // From its first PSN, the whole READ.
        rewind(&mut st, &read, first, first, RC.mtu);
        let ReqStep::Packet { hdrs, .. } = req_step(&mut st, &read, &RC, false) else {
            panic!()
        };
        assert_eq!(hdrs.reth.map(|r| (r.va, r.len)), Some((0x10_0000, 3000)));
        assert_eq!(st.psn, Psn::new(2));
        // A WRITE continues with a MIDDLE packet from byte 1024.
        let write = wqe(WrOpcode::RdmaWrite, 3000);
        rewind(&mut st, &write, first, first.add(1), RC.mtu);
        let ReqStep::Packet {
            hdrs, payload_off, ..
        } = req_step(&mut st, &write, &RC, false)
        else {
            panic!()
        };
        assert_eq!(
            (hdrs.bth.opcode, payload_off),
            (RcRdmaWriteMiddle as u8, 1024)
        );
        let atomic = wqe(WrOpcode::AtomicFetchAndAdd, 8);
        assert_eq!(rewind(&mut st, &atomic, first, first.add(1), RC.mtu), first);
    }

    #[test]
    fn atomics_zero_length_and_window() {
        let mut st = ReqState::default();
        let mut w = wqe(WrOpcode::AtomicCmpAndSwp, 8);
        w.remote = Remote {
            addr: 0x10,
            rkey: 3,
            compare_add: 1,
            swap: 2,
            ..Remote::default()
        };
        let ReqStep::Packet { hdrs, .. } = req_step(&mut st, &w, &RC, false) else {
            panic!()
        };
        assert_eq!(
            hdrs.atomic,
            Some(AtomicEth {
                va: 0x10,
                rkey: 3,
                swap_add: 2,
                compare: 1
            })
        );
        // Zero-length send is one ONLY packet.
        let ReqStep::Packet {
            hdrs,
            payload_len,
            done,
            ..
        } = req_step(&mut st, &wqe(WrOpcode::Send, 0), &RC, false)
        else {
            panic!()
        };
        assert_eq!(
            (hdrs.bth.opcode, payload_len, done),
            (RcSendOnly as u8, 0, true)
        );
        st.psn = st.una.add(MAX_UNACKED_PSNS);
        assert_eq!(
            req_step(&mut st, &wqe(WrOpcode::Send, 1), &RC, false),
            ReqStep::WindowFull
        );
        assert_eq!(
            req_step(&mut st, &wqe(WrOpcode::LocalInv, 0), &RC, false),
            ReqStep::Local
        );
    }

    #[test]
    fn ud_rules() {
        let ud = ReqAttrs { ud: true, ..RC };
        let mut st = ReqState::default();
        let mut w = wqe(WrOpcode::Send, 100);
        w.remote.ud_qpn = 1;
        w.remote.ud_qkey = crate::hdr::GSI_QKEY;
        let ReqStep::Packet { hdrs, .. } = req_step(&mut st, &w, &ud, false) else {
            panic!()
        };
        assert_eq!(
            hdrs.deth,
            Some(Deth {
                qkey: crate::hdr::GSI_QKEY,
                src_qpn: 0x11
            })
        );
        assert_eq!(hdrs.bth.dqpn, 1);
        assert_eq!(
            req_step(&mut st, &wqe(WrOpcode::Send, 2000), &ud, false),
            ReqStep::CqeErr(WcStatus::LocLenErr)
        );
        assert_eq!(
            req_step(&mut st, &wqe(WrOpcode::RdmaWrite, 1), &ud, false),
            ReqStep::CqeErr(WcStatus::LocQpOpErr)
        );
    }
}
