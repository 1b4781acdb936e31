// SPDX-License-Identifier: Apache-2.0
//! The RC responder's checks (rxe_resp.c `check_psn`, `check_op_seq`,
//! `check_length`, `check_rkey`), as pure functions returning the step to
//! take. Error outcomes are data: `Nak(Syndrome)` for the peer.
//!
//! A peer is never trusted: every RETH/AtomicETH is validated against the
//! responder's own MR table (key, PD, rights, bounds with overflow checks)
//! and against the path MTU before any byte is placed.
//!
//! Execution (placement, READ responses, atomics and their replay cache,
//! ACK coalescing, UD receive) lives in [`exec`].
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::cmp::Ordering;

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::hdr::{Aeth, NakCode, Syndrome};
use crate::opcode::{OpClass, Opcode};
use crate::packet::Packet;
use crate::psn::{psn_compare, Psn};
use crate::req::max_payload;
use crate::verbs::{check_mr, Access, MrInfo, MrTable};

pub mod exec;

pub use exec::{RecvQueue, RecvWqe, Res, RespAttrs, RespCtx, RespOut};

/// Responder role state (`qp->resp`); plain data, untrusted on restore.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RespState {
    /// Next expected PSN.
    pub psn: Psn,
    /// Message sequence number (24 bits) of completed requests.
    pub msn: u32,
    /// Opcode of the previous in-sequence packet.
    pub prev: Option<Opcode>,
    /// A PSN sequence error NAK was sent and not yet resolved: IBA 9.7.5.1.1
    /// allows one NAK per error, later out-of-order packets are dropped.
    pub sent_psn_nak: bool,
    /// Receive WQE of the open SEND / WRITE_WITH_IMM message.
    pub wqe: Option<RecvWqe>,
    /// Bytes of the open message placed so far.
    pub offset: u32,
    /// Open RDMA WRITE: next va, rkey, bytes left of the DMA length.
    pub write: Option<(u64, u32, u32)>,
    /// Requests executed since the last ACK (coalescing).
    pub unacked: u32,
    /// READ/atomic replay cache and the READ responses and atomic ACKs
    /// still owed (at most [`exec::MAX_RES`]).
    pub res: VecDeque<Res>,
    /// An ACK or NAK (its PSN and AETH) held back until the responses
    /// owed for earlier requests are sent: IBA 9.7.5.1 has the responder
    /// answer in PSN order, and an ACK past a READ that overtook its
    /// responses would tell the requester they were lost.
    pub held: Option<(Psn, Aeth)>,
}

/// What the responder does with a request packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RespStep {
    /// All checks passed: execute.
    Execute,
    /// Already executed (PSN below expected): re-ACK or replay.
    Duplicate,
    /// Silently drop (out of sequence after a NAK was already sent).
    Drop,
    /// Send this NAK.
    Nak(Syndrome),
}

/// IBA 9.7.5.1.1: classify the PSN of a request against the expected one.
pub fn check_psn(st: &mut RespState, psn: Psn) -> RespStep {
    match psn_compare(psn, st.psn) {
        Ordering::Equal => {
            st.sent_psn_nak = false;
            RespStep::Execute
        }
        Ordering::Less => RespStep::Duplicate,
        Ordering::Greater if st.sent_psn_nak => RespStep::Drop,
        Ordering::Greater => {
            st.sent_psn_nak = true;
            RespStep::Nak(Syndrome::Nak(NakCode::PsnSeqError))
        }
    }
}

/// IBA 9.8.3.3: a MIDDLE/LAST must continue a FIRST/MIDDLE of the same
/// kind, and a new message must not start while one is open.
pub fn check_op_seq(prev: Option<Opcode>, op: Opcode) -> Result<(), Syndrome> {
    let open =
        prev.filter(|p| p.is(OpClass::MIDDLE) || p.is(OpClass::FIRST) && !p.is(OpClass::LAST));
    let cont = op.is(OpClass::MIDDLE) || op.is(OpClass::LAST) && !op.is(OpClass::FIRST);
    let same_kind = |p: Opcode| {
        [OpClass::SEND, OpClass::WRITE]
            .iter()
            .any(|k| p.is(*k) && op.is(*k))
    };
    match (open, cont) {
        (Some(p), true) if same_kind(p) => Ok(()),
        (None, false) => Ok(()),
        _ => Err(Syndrome::Nak(NakCode::InvalidRequest)),
    }
}

/// IBA 9.7.5.1.3 / rxe `check_length`: FIRST and MIDDLE payloads are
/// exactly one MTU, others at most one. A segment of the same-host
/// channel stands for several packets: FIRST and MIDDLE carry a whole
/// number of MTUs, any payload at most [`max_payload`].
pub fn check_length(pkt: &Packet<'_>, mtu: u32) -> Result<(), Syndrome> {
    let len = u32::try_from(pkt.payload.len()).unwrap_or(u32::MAX);
    let op = pkt.opcode;
    let max = max_payload(pkt.same_host, mtu);
    let ok = if op.is(OpClass::MIDDLE) || op.is(OpClass::FIRST) && !op.is(OpClass::LAST) {
        len > 0 && len <= max && len.checked_rem(mtu) == Some(0)
    } else {
        len <= max
    };
    if ok {
        Ok(())
    } else {
        Err(Syndrome::Nak(NakCode::InvalidRequest))
    }
}

/// rxe `check_op_valid`: an RC request for an RDMA WRITE, READ or atomic
/// must be allowed by the QP's own remote access rights (`qp_access_flags`)
/// as well as by the MR's (checked by [`check_rkey`]); a QP that forbids it
/// answers with a remote access NAK, so that the requester completes with
/// REM_ACCESS_ERR, as a hardware HCA does.
pub fn check_qp_access(pkt: &Packet<'_>, allowed: Access) -> Result<(), Syndrome> {
    let op = pkt.opcode;
    let need = if op.is(OpClass::ATOMIC) {
        Access::REMOTE_ATOMIC
    } else if op.is(OpClass::READ) {
        Access::REMOTE_READ
    } else if op.is(OpClass::WRITE) {
        Access::REMOTE_WRITE
    } else {
        return Ok(());
    };
    if allowed.contains(need) {
        Ok(())
    } else {
        Err(Syndrome::Nak(NakCode::RemoteAccessError))
    }
}

/// rxe `check_rkey`: validates the RETH or AtomicETH of a first/only
/// request against the responder's MR table and PD; returns the MR.
/// Atomics must be 8-byte aligned (invalid request), everything else that
/// fails is a remote access error.
pub fn check_rkey(
    pkt: &Packet<'_>,
    pd: u32,
    table: &dyn MrTable,
) -> Result<Option<MrInfo>, Syndrome> {
    let access_err = Syndrome::Nak(NakCode::RemoteAccessError);
    let op = pkt.opcode;
    let (va, rkey, len, need) = if let Some(a) = pkt.hdrs.atomic {
        if a.va % 8 != 0 {
            return Err(Syndrome::Nak(NakCode::InvalidRequest));
        }
        (a.va, a.rkey, 8, Access::REMOTE_ATOMIC)
    } else if let Some(r) = pkt.hdrs.reth {
        let need = if op.is(OpClass::READ) {
            Access::REMOTE_READ
        } else {
            Access::REMOTE_WRITE
        };
        // A zero-length RDMA needs no key (IBA 9.4.4, rxe skips it).
        if r.len == 0 {
            return Ok(None);
        }
        (r.va, r.rkey, u64::from(r.len), need)
    } else {
        return Ok(None);
    };
    check_mr(table, rkey, pd, va, len, need)
        .map(Some)
        .map_err(|_| access_err)
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
    use crate::hdr::{AtomicEth, Bth, Reth};
    use crate::packet::{test_packet, Headers};
    use crate::verbs::MemError;
    use Opcode::*;

    fn pkt(op: Opcode, payload: &[u8]) -> Packet<'_> {
        let bth = Bth {
            opcode: op as u8,
            ..Bth::default()
        };
        test_packet(
            op,
            Headers {
                bth,
                ..Headers::default()
            },
            payload,
        )
    }

    #[test]
    fn psn_states() {
        let mut st = RespState {
            psn: Psn::new(10),
            ..RespState::default()
        };
        assert_eq!(check_psn(&mut st, Psn::new(9)), RespStep::Duplicate);
        let nak = RespStep::Nak(Syndrome::Nak(NakCode::PsnSeqError));
        assert_eq!(check_psn(&mut st, Psn::new(12)), nak);
        assert_eq!(
            check_psn(&mut st, Psn::new(13)),
            RespStep::Drop,
            "one NAK per error"
        );
        assert_eq!(check_psn(&mut st, Psn::new(10)), RespStep::Execute);
        assert!(!st.sent_psn_nak);
        // Wrap: expected 0, PSN 0xffffff is a duplicate.
        st.psn = Psn::new(0);
        assert_eq!(check_psn(&mut st, Psn::new(0xff_ffff)), RespStep::Duplicate);
    }

    #[test]
    fn op_sequence() {
        let bad = Err(Syndrome::Nak(NakCode::InvalidRequest));
        assert_eq!(check_op_seq(None, RcSendOnly), Ok(()));
        assert_eq!(check_op_seq(None, RcSendMiddle), bad);
        assert_eq!(check_op_seq(None, RcRdmaWriteLast), bad);
        assert_eq!(check_op_seq(Some(RcSendFirst), RcSendMiddle), Ok(()));
        assert_eq!(
            check_op_seq(Some(RcSendMiddle), RcSendLastWithInvalidate),
            Ok(())
        );
        assert_eq!(check_op_seq(Some(RcSendFirst), RcRdmaWriteLast), bad);
        assert_eq!(check_op_seq(Some(RcSendFirst), RcSendOnly), bad);
        assert_eq!(
            check_op_seq(Some(RcRdmaWriteFirst), RcRdmaWriteLastWithImmediate),
            Ok(())
        );
        assert_eq!(check_op_seq(Some(RcSendOnly), RcRdmaReadRequest), Ok(()));
    }

    #[test]
    fn lengths() {
        let full = [0u8; 256];
        assert!(check_length(&pkt(RcSendFirst, &full), 256).is_ok());
        assert!(check_length(&pkt(RcSendFirst, &full[..255]), 256).is_err());
        assert!(check_length(&pkt(RcSendMiddle, &full[..1]), 256).is_err());
        assert!(check_length(&pkt(RcSendLast, &full[..1]), 256).is_ok());
        assert!(check_length(&pkt(RcSendOnly, &full), 255).is_err());
    }

    /// A segment (several MTUs in one packet) is taken from the same-host
    /// channel only, and only in whole MTUs but for the last.
    #[test]
    fn segments_only_from_the_same_host_channel() {
        const MAX: usize = crate::req::MAX_DESCRIBED_SEGMENT as usize;
        let big = vec![0u8; MAX + 256];
        let seg = |op, len: usize, same_host| {
            let mut p = pkt(op, &big[..len]);
            p.same_host = same_host;
            check_length(&p, 256)
        };
        assert!(seg(RcRdmaWriteFirst, 4096, true).is_ok());
        assert!(seg(RcRdmaWriteFirst, 4096, false).is_err(), "from a wire");
        assert!(seg(RcSendMiddle, MAX, true).is_ok());
        assert!(seg(RcSendMiddle, 4000, true).is_err(), "not whole MTUs");
        assert!(seg(RcSendMiddle, 0, true).is_err());
        assert!(seg(RcSendLast, 4000, true).is_ok());
        assert!(seg(RcRdmaWriteOnly, MAX + 1, true).is_err());
        assert!(seg(RcSendFirst, MAX + 256, true).is_err());
    }

    struct Table;
    impl MrTable for Table {
        fn lookup(&self, key: u32) -> Option<MrInfo> {
            let access = Access::REMOTE_WRITE | Access::REMOTE_ATOMIC | Access::LOCAL_WRITE;
            (key == 7).then_some(MrInfo {
                pd: 1,
                access,
                iova: 0x1000,
                len: 0x1000,
            })
        }
        fn read(&self, _: u32, _: u64, _: &mut [u8]) -> Result<(), MemError> {
            Err(MemError)
        }
        fn write(&mut self, _: u32, _: u64, _: &[u8]) -> Result<(), MemError> {
            Err(MemError)
        }
        fn invalidate(&mut self, _: u32, _: u32) -> bool {
            false
        }
        fn fast_reg(&mut self, _: &crate::verbs::FastReg, _: u32) -> bool {
            false
        }
    }

    #[test]
    fn rkey_checks_are_hostile_safe() {
        let acc = Err(Syndrome::Nak(NakCode::RemoteAccessError));
        let reth = |op, va, rkey, len| {
            let mut p = pkt(op, &[]);
            p.hdrs.reth = Some(Reth { va, rkey, len });
            check_rkey(&p, 1, &Table)
        };
        assert!(reth(RcRdmaWriteOnly, 0x1000, 7, 0x1000).unwrap().is_some());
        assert_eq!(reth(RcRdmaWriteOnly, 0x1000, 8, 1), acc, "bad rkey");
        assert_eq!(reth(RcRdmaWriteOnly, 0x1001, 7, 0x1000), acc, "beyond MR");
        assert_eq!(
            reth(RcRdmaWriteOnly, u64::MAX, 7, u32::MAX),
            acc,
            "huge DMA length"
        );
        assert_eq!(reth(RcRdmaReadRequest, 0x1000, 7, 8), acc, "no remote read");
        assert_eq!(
            reth(RcRdmaReadRequest, 0, 99, 0),
            Ok(None),
            "zero length needs no key"
        );
        let mut p = pkt(RcFetchAdd, &[]);
        p.hdrs.atomic = Some(AtomicEth {
            va: 0x1004,
            rkey: 7,
            swap_add: 1,
            compare: 0,
        });
        assert_eq!(
            check_rkey(&p, 1, &Table),
            Err(Syndrome::Nak(NakCode::InvalidRequest))
        );
        p.hdrs.atomic = Some(AtomicEth {
            va: 0x1ff8,
            rkey: 7,
            swap_add: 1,
            compare: 0,
        });
        assert!(check_rkey(&p, 1, &Table).unwrap().is_some());
        assert_eq!(check_rkey(&p, 2, &Table), acc, "other PD");
    }
}
