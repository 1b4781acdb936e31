// SPDX-License-Identifier: Apache-2.0
//! The RC completer (rxe_comp.c): consumes ACKs, NAKs, RNR NAKs, READ
//! responses and atomic ACKs for the oldest outstanding send WQE, and owns
//! the retransmission and RNR timers.
//!
//! [`comp_packet`] and [`comp_timer`] are pure: they read the head WQE's
//! PSN range and the role state and say what to do ([`CompStep`]); the
//! driver places READ data, completes WQEs in order and rewinds the
//! requester on [`CompStep::Retry`]. Time is the caller's `now` in
//! nanoseconds; nothing here reads a clock.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::hdr::{ack_timeout_ns, rnr_timer_ns, NakCode, Syndrome};
use crate::opcode::{OpClass, Opcode};
use crate::packet::Packet;
use crate::psn::{psn_compare, Psn};
use crate::req::{max_payload, read_psns};
use crate::verbs::{WcStatus, WrOpcode};

/// `rnr_retry` value meaning "retry forever" (IBA 9.7.5.2.8).
pub const RNR_RETRY_INFINITE: u8 = 7;

/// Per-QP attributes the completer uses (from modify_qp).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompAttrs {
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout, 0 = infinite.
    pub timeout: u8,
    /// Transport retries after a timeout or sequence error (0..=7).
    pub retry_cnt: u8,
    /// RNR retries, [`RNR_RETRY_INFINITE`] = unlimited.
    pub rnr_retry: u8,
    /// Path MTU in bytes.
    pub mtu: u32,
}

/// Completer role state (`qp->comp`); plain data, untrusted on restore.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompState {
    /// Oldest PSN not yet acknowledged.
    pub psn: Psn,
    /// Transport retries left before `RetryExcErr`.
    pub retries_left: u8,
    /// RNR retries left before `RnrRetryExcErr`.
    pub rnr_left: u8,
    /// Retransmission deadline (ns), armed while PSNs are outstanding.
    pub deadline: Option<u64>,
    /// End of an RNR wait (ns): the requester is paused until then.
    pub rnr_until: Option<u64>,
    /// A retransmission from `psn` is under way and nothing was
    /// acknowledged since (rxe's `started_retry`): the responses that
    /// were in flight behind a gap still arrive, each past `psn`, and
    /// must not start another retry each, spending the whole retry
    /// budget on one loss. Only progress or a timeout ends it.
    pub retrying: bool,
}

/// Shortest retransmission timeout, as a Local ACK Timeout exponent:
/// 4.096 µs × 2^16 ≈ 268 ms. Shorter ones are rounded up, as hardware with
/// a timer floor does (ConnectX parts enforce one), so that the blackout
/// of a peer's live migration, hundreds of milliseconds under nested
/// virtualisation, costs retries rather than the QP: `ibv_rc_pingpong`
/// asks for 14 (67 ms), which with 7 retries gives up after about half a
/// second. A lost packet at the tail of a message waits this long.
pub const MIN_ACK_TIMEOUT: u8 = 16;

/// The retransmission timeout (ns) the completer uses for the QP's Local
/// ACK Timeout `t`; `None` (0) waits forever.
pub fn retransmit_ns(t: u8) -> Option<u64> {
    if t == 0 {
        return None;
    }
    ack_timeout_ns(t.max(MIN_ACK_TIMEOUT))
}

impl CompState {
    /// A fresh state at `psn` with full retry budgets.
    pub fn new(psn: Psn, a: &CompAttrs) -> Self {
        CompState {
            psn,
            retries_left: a.retry_cnt,
            rnr_left: a.rnr_retry,
            deadline: None,
            rnr_until: None,
            retrying: false,
        }
    }

    /// Re-arms the ACK timer at `now` if PSNs are outstanding.
    pub fn rearm(&mut self, a: &CompAttrs, now: u64, outstanding: bool) {
        self.deadline = if outstanding {
            retransmit_ns(a.timeout).map(|t| now.saturating_add(t))
        } else {
            None
        };
    }

    /// Arms the ACK timer if it is not running (after a send).
    pub fn arm(&mut self, a: &CompAttrs, now: u64) {
        if self.deadline.is_none() {
            self.rearm(a, now, true);
        }
    }

    fn progress(&mut self, a: &CompAttrs, psn: Psn) {
        self.psn = psn;
        self.retries_left = a.retry_cnt;
        self.rnr_left = a.rnr_retry;
        self.retrying = false;
    }

    fn retry(&mut self) -> CompStep {
        match self.retries_left.checked_sub(1) {
            Some(left) => {
                self.retries_left = left;
                self.retrying = true;
                CompStep::Retry
            }
            None => CompStep::CqeErr(WcStatus::RetryExcErr),
        }
    }

    /// A response says something before it was lost (a gap in READ
    /// responses, an acknowledgement past a READ, a PSN sequence NAK):
    /// retry, unless the retry that loss asks for is already under way.
    fn retry_once(&mut self) -> CompStep {
        if self.retrying {
            return CompStep::Drop;
        }
        self.retry()
    }
}

/// What the completer knows about the oldest outstanding send WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompWqe {
    /// Operation.
    pub opcode: WrOpcode,
    /// PSN of its first packet.
    pub first_psn: Psn,
    /// Message length.
    pub len: u32,
}

impl CompWqe {
    /// PSN of its last packet (READs take one PSN per response).
    pub fn last_psn(&self, mtu: u32) -> Psn {
        self.first_psn
            .add(read_psns(self.len, mtu.max(1)).saturating_sub(1))
    }

    fn needs_response(&self) -> bool {
        matches!(
            self.opcode,
            WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }
}

/// What the completer does next (rxe's `COMPST_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompStep {
    /// Nothing to do with this packet (duplicate, stale or hostile).
    Drop,
    /// The packet acknowledges the whole head WQE: complete it with
    /// success and call again with the same packet for the next WQE.
    AckedHead,
    /// The head WQE's last PSN was acknowledged: complete it, packet done.
    Completed,
    /// Part of the head WQE was acknowledged.
    Progress,
    /// Place the READ response payload at message offset `offset` of the
    /// head WQE; `last` completes it.
    ReadData {
        /// Byte offset into the WQE's local SGEs.
        offset: u32,
        /// Last response of the READ.
        last: bool,
    },
    /// Write the original remote value into the atomic WQE's local buffer
    /// and complete it.
    AtomicOrig(u64),
    /// Retransmit from `CompState::psn`.
    Retry,
    /// RNR NAK: the requester waits until `CompState::rnr_until`.
    RnrWait,
    /// Complete the head WQE with this error; the QP goes to error.
    CqeErr(WcStatus),
}

/// Expected READ response opcode for a response that starts at the READ's
/// first PSN or not, and ends at its last PSN or not.
fn read_resp_ok(op: Opcode, first: bool, last: bool) -> bool {
    let want = match (first, last) {
        (true, true) => Opcode::RcRdmaReadResponseOnly,
        (true, false) => Opcode::RcRdmaReadResponseFirst,
        (false, true) => Opcode::RcRdmaReadResponseLast,
        (false, false) => Opcode::RcRdmaReadResponseMiddle,
    };
    op == want
}

/// The payload length of READ response `pkt` when `rest` bytes of the
/// READ are still due, if valid: all of them, or else a whole number of
/// MTUs, at most [`max_payload`].
fn read_response_len(pkt: &Packet<'_>, rest: u32, mtu: u32) -> Option<u32> {
    let max = max_payload(pkt.same_host, mtu);
    let n = u32::try_from(pkt.payload.len()).ok()?;
    let whole_mtus = n > 0 && n < rest && n.checked_rem(mtu) == Some(0);
    (n <= max && (n == rest || whole_mtus)).then_some(n)
}

/// IBA 9.7.5.1 / rxe `rxe_completer`: handles one response packet for the
/// head WQE. `next_psn` is the requester's next PSN: nothing at or beyond
/// it was sent, so acknowledgements for it are hostile and dropped.
pub fn comp_packet(
    st: &mut CompState,
    a: &CompAttrs,
    head: Option<&CompWqe>,
    next_psn: Psn,
    pkt: &Packet<'_>,
    now: u64,
) -> CompStep {
    let Some(w) = head else {
        return CompStep::Drop;
    };
    let psn = pkt.hdrs.bth.psn;
    let op = pkt.opcode;
    if !op.is(OpClass::ACK)
        || psn_compare(psn, st.psn) == Ordering::Less
        || psn_compare(psn, next_psn) != Ordering::Less
        || psn_compare(w.first_psn, st.psn) == Ordering::Greater
    {
        return CompStep::Drop;
    }
    let last = w.last_psn(a.mtu);
    if psn_compare(psn, last) == Ordering::Greater {
        // rxe `check_psn`: a later PSN acknowledges the head implicitly,
        // unless it needed a response, which was then lost.
        if w.needs_response() {
            return st.retry_once();
        }
        st.progress(a, last.add(1));
        return CompStep::AckedHead;
    }
    if op.is(OpClass::READ) {
        if w.opcode != WrOpcode::RdmaRead {
            return CompStep::Drop;
        }
        if psn != st.psn {
            // A response went missing: re-read from the oldest gap.
            return st.retry_once();
        }
        let mtu = a.mtu.max(1);
        let idx = psn.distance_from(w.first_psn);
        let offset = idx.saturating_mul(mtu);
        let Some(n) = read_response_len(pkt, w.len.saturating_sub(offset), mtu) else {
            return CompStep::Drop;
        };
        let end = psn.add(read_psns(n, mtu).saturating_sub(1));
        if !read_resp_ok(op, psn == w.first_psn, end == last) {
            return CompStep::Drop;
        }
        st.progress(a, end.add(1));
        return CompStep::ReadData {
            offset,
            last: end == last,
        };
    }
    let Some(aeth) = pkt.hdrs.aeth else {
        return CompStep::Drop;
    };
    match aeth.syndrome {
        Syndrome::Ack { .. } if op.is(OpClass::ATOMIC) => match pkt.hdrs.atomic_ack {
            Some(ack) if w.needs_response() && w.opcode != WrOpcode::RdmaRead => {
                st.progress(a, psn.add(1));
                CompStep::AtomicOrig(ack.orig)
            }
            _ => CompStep::Drop,
        },
        Syndrome::Ack { .. } if w.needs_response() => CompStep::Drop,
        Syndrome::Ack { .. } => {
            st.progress(a, psn.add(1));
            if psn == last {
                CompStep::Completed
            } else {
                CompStep::Progress
            }
        }
        Syndrome::RnrNak { timer } => {
            st.psn = psn;
            if st.rnr_left == 0 {
                return CompStep::CqeErr(WcStatus::RnrRetryExcErr);
            }
            if st.rnr_left != RNR_RETRY_INFINITE {
                st.rnr_left = st.rnr_left.saturating_sub(1);
            }
            st.rnr_until = Some(now.saturating_add(rnr_timer_ns(timer)));
            st.deadline = None;
            CompStep::RnrWait
        }
        Syndrome::Nak(NakCode::PsnSeqError) => {
            if st.rnr_until.is_some() {
                return CompStep::Drop;
            }
            // The NAK acknowledges every PSN before it: progress, which
            // restores the retry budget before this retry spends one.
            if psn != st.psn {
                st.progress(a, psn);
            }
            st.retry_once()
        }
        Syndrome::Nak(NakCode::RemoteAccessError) => CompStep::CqeErr(WcStatus::RemAccessErr),
        Syndrome::Nak(NakCode::RemoteOperationalError) => CompStep::CqeErr(WcStatus::RemOpErr),
        Syndrome::Nak(NakCode::InvalidRequest | NakCode::InvalidRdRequest) => {
            CompStep::CqeErr(WcStatus::RemInvReqErr)
        }
    }
}

/// rxe `rxe_retransmit_timer` / `rnr_nak_timer`: what the passage of time
/// to `now` asks for. `outstanding` says whether any PSN awaits an ACK.
pub fn comp_timer(st: &mut CompState, now: u64, outstanding: bool) -> Option<CompStep> {
    if let Some(until) = st.rnr_until {
        if now < until {
            return None;
        }
        st.rnr_until = None;
        return Some(CompStep::Retry);
    }
    if !outstanding {
        st.deadline = None;
        return None;
    }
    match st.deadline {
        Some(d) if now >= d => {
            st.deadline = None;
            Some(st.retry())
        }
        _ => None,
    }
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
    use crate::hdr::{Aeth, AtomicAckEth, Bth};
    use crate::packet::{test_packet, Headers};

    const A: CompAttrs = CompAttrs {
        timeout: 14,
        retry_cnt: 2,
        rnr_retry: 1,
        mtu: 256,
    };

    fn pkt(op: Opcode, psn: u32, syn: Option<Syndrome>, payload: &[u8]) -> Packet<'_> {
        let hdrs = Headers {
            bth: Bth {
                opcode: op as u8,
                psn: Psn::new(psn),
                ..Bth::default()
            },
            aeth: syn.map(|syndrome| Aeth { syndrome, msn: 0 }),
            atomic_ack: Some(AtomicAckEth { orig: 9 }),
            ..Headers::default()
        };
        test_packet(op, hdrs, payload)
    }

    fn wqe(opcode: WrOpcode, first: u32, len: u32) -> CompWqe {
        CompWqe {
            opcode,
            first_psn: Psn::new(first),
            len,
        }
    }

    const ACK: Option<Syndrome> = Some(Syndrome::Ack { credits: 0x1f });

    /// IBA 9.7.5.1.5: coalesced ACKs acknowledge every earlier PSN.
    #[test]
    fn acks_progress_and_implicit_completion() {
        let mut st = CompState::new(Psn::new(0xff_fffe), &A);
        let send = wqe(WrOpcode::Send, 0xff_fffe, 600); // 3 PSNs, wraps
        let next = Psn::new(5);
        let ack = |psn| pkt(Opcode::RcAcknowledge, psn, ACK, &[]);
        let r = comp_packet(&mut st, &A, Some(&send), next, &ack(0xff_ffff), 0);
        assert_eq!((r, st.psn.get()), (CompStep::Progress, 0));
        let r = comp_packet(&mut st, &A, Some(&send), next, &ack(3), 0);
        assert_eq!((r, st.psn.get()), (CompStep::AckedHead, 1));
        let r = comp_packet(&mut st, &A, Some(&send), next, &ack(7), 0);
        assert_eq!(r, CompStep::Drop, "PSN never sent");
        let r = comp_packet(&mut st, &A, None, next, &ack(3), 0);
        assert_eq!(r, CompStep::Drop);
    }

    #[test]
    fn read_responses_in_order() {
        let mut st = CompState::new(Psn::new(10), &A);
        let rd = wqe(WrOpcode::RdmaRead, 10, 300);
        let next = Psn::new(12);
        let full = [0u8; 256];
        let first = pkt(Opcode::RcRdmaReadResponseFirst, 10, ACK, &full);
        let last = pkt(Opcode::RcRdmaReadResponseLast, 11, ACK, &full[..44]);
        assert_eq!(
            comp_packet(&mut st, &A, Some(&rd), next, &last, 0),
            CompStep::Retry,
            "gap"
        );
        assert_eq!(st.retries_left, 1);
        let r = comp_packet(&mut st, &A, Some(&rd), next, &first, 0);
        assert_eq!(
            r,
            CompStep::ReadData {
                offset: 0,
                last: false
            }
        );
        assert_eq!(st.retries_left, 2, "progress resets retries");
        let short = pkt(Opcode::RcRdmaReadResponseLast, 11, ACK, &full[..40]);
        assert_eq!(
            comp_packet(&mut st, &A, Some(&rd), next, &short, 0),
            CompStep::Drop
        );
        let r = comp_packet(&mut st, &A, Some(&rd), next, &last, 0);
        assert_eq!(
            r,
            CompStep::ReadData {
                offset: 256,
                last: true
            }
        );
        // A plain ACK never completes a READ.
        let mut st = CompState::new(Psn::new(10), &A);
        let ack = pkt(Opcode::RcAcknowledge, 10, ACK, &[]);
        assert_eq!(
            comp_packet(&mut st, &A, Some(&rd), next, &ack, 0),
            CompStep::Drop
        );
    }

    #[test]
    fn atomic_ack_and_naks() {
        let at = wqe(WrOpcode::AtomicFetchAndAdd, 3, 8);
        let next = Psn::new(4);
        let mut st = CompState::new(Psn::new(3), &A);
        let p = pkt(Opcode::RcAtomicAcknowledge, 3, ACK, &[]);
        assert_eq!(
            comp_packet(&mut st, &A, Some(&at), next, &p, 0),
            CompStep::AtomicOrig(9)
        );
        let w = wqe(WrOpcode::RdmaWrite, 3, 8);
        for (code, want) in [
            (NakCode::RemoteAccessError, WcStatus::RemAccessErr),
            (NakCode::InvalidRequest, WcStatus::RemInvReqErr),
            (NakCode::RemoteOperationalError, WcStatus::RemOpErr),
        ] {
            let mut st = CompState::new(Psn::new(3), &A);
            let p = pkt(Opcode::RcAcknowledge, 3, Some(Syndrome::Nak(code)), &[]);
            assert_eq!(
                comp_packet(&mut st, &A, Some(&w), next, &p, 0),
                CompStep::CqeErr(want)
            );
        }
        let mut st = CompState::new(Psn::new(3), &A);
        let seq = pkt(
            Opcode::RcAcknowledge,
            3,
            Some(Syndrome::Nak(NakCode::PsnSeqError)),
            &[],
        );
        assert_eq!(
            comp_packet(&mut st, &A, Some(&w), next, &seq, 0),
            CompStep::Retry
        );
        // The same NAK again asks for the retry already under way; only a
        // timeout spends the budget then.
        assert_eq!(
            comp_packet(&mut st, &A, Some(&w), next, &seq, 0),
            CompStep::Drop
        );
        assert_eq!(st.retries_left, 1);
        assert_eq!(comp_timer(&mut st, 0, true), None, "not armed");
        st.deadline = Some(0);
        assert_eq!(comp_timer(&mut st, 0, true), Some(CompStep::Retry));
        st.deadline = Some(0);
        assert_eq!(
            comp_timer(&mut st, 0, true),
            Some(CompStep::CqeErr(WcStatus::RetryExcErr))
        );
    }

    /// One READ response lost in a burst: the responses behind the gap
    /// still arrive, and the first of them starts the one retry the loss
    /// needs (rxe's `started_retry`); the rest, and an acknowledgement
    /// past the READ, are dropped instead of each spending a retry, until
    /// the re-read responses make progress again.
    #[test]
    fn a_loss_in_a_burst_of_read_responses_costs_one_retry() {
        let mut st = CompState::new(Psn::new(10), &A);
        let rd = wqe(WrOpcode::RdmaRead, 10, 8 * 256);
        let next = Psn::new(20);
        let full = [0u8; 256];
        let resp = |psn: u32| {
            let op = match psn {
                10 => Opcode::RcRdmaReadResponseFirst,
                17 => Opcode::RcRdmaReadResponseLast,
                _ => Opcode::RcRdmaReadResponseMiddle,
            };
            pkt(op, psn, ACK, &full)
        };
        let r = comp_packet(&mut st, &A, Some(&rd), next, &resp(10), 0);
        assert!(matches!(r, CompStep::ReadData { offset: 0, .. }));
        // 11 is lost.
        let mut steps = vec![];
        for psn in 12..=17 {
            steps.push(comp_packet(&mut st, &A, Some(&rd), next, &resp(psn), 0));
        }
        let ack = pkt(Opcode::RcAcknowledge, 19, ACK, &[]);
        steps.push(comp_packet(&mut st, &A, Some(&rd), next, &ack, 0));
        assert_eq!(steps[0], CompStep::Retry);
        assert!(steps[1..].iter().all(|s| *s == CompStep::Drop), "{steps:?}");
        assert_eq!(st.retries_left, A.retry_cnt - 1, "one retry spent");
        // The driver rewinds to the READ's first PSN; the responses come
        // again, in order, and complete it.
        st.psn = Psn::new(10);
        for psn in 10..=17 {
            let r = comp_packet(&mut st, &A, Some(&rd), next, &resp(psn), 0);
            assert!(matches!(r, CompStep::ReadData { last, .. } if last == (psn == 17)));
        }
        assert!(!st.retrying);
        assert_eq!(st.retries_left, A.retry_cnt);
    }

    #[test]
    fn rnr_and_timers() {
        let w = wqe(WrOpcode::Send, 0, 8);
        let next = Psn::new(1);
        let mut st = CompState::new(Psn::new(0), &A);
        let rnr = pkt(
            Opcode::RcAcknowledge,
            0,
            Some(Syndrome::RnrNak { timer: 1 }),
            &[],
        );
        assert_eq!(
            comp_packet(&mut st, &A, Some(&w), next, &rnr, 100),
            CompStep::RnrWait
        );
        assert_eq!(st.rnr_until, Some(100 + 10_000));
        assert_eq!(comp_timer(&mut st, 10_099, true), None);
        assert_eq!(comp_timer(&mut st, 10_100, true), Some(CompStep::Retry));
        assert_eq!(
            comp_packet(&mut st, &A, Some(&w), next, &rnr, 0),
            CompStep::CqeErr(WcStatus::RnrRetryExcErr)
        );
        let inf = CompAttrs {
            rnr_retry: RNR_RETRY_INFINITE,
            ..A
        };
        let mut st = CompState::new(Psn::new(0), &inf);
        for _ in 0..20 {
            assert_eq!(
                comp_packet(&mut st, &inf, Some(&w), next, &rnr, 0),
                CompStep::RnrWait
            );
        }
        let mut st = CompState::new(Psn::new(0), &A);
        st.arm(&A, 0);
        // 14 is below the floor: the timer runs for 2^16 × 4.096 µs.
        let t = retransmit_ns(A.timeout).unwrap();
        assert_eq!(t, ack_timeout_ns(MIN_ACK_TIMEOUT).unwrap());
        assert_eq!(retransmit_ns(20), ack_timeout_ns(20));
        assert_eq!(retransmit_ns(0), None);
        assert_eq!(comp_timer(&mut st, t - 1, true), None);
        assert_eq!(comp_timer(&mut st, t, true), Some(CompStep::Retry));
        st.arm(&A, t);
        assert_eq!(comp_timer(&mut st, 3 * t, true), Some(CompStep::Retry));
        st.arm(&A, 3 * t);
        assert_eq!(
            comp_timer(&mut st, 5 * t, true),
            Some(CompStep::CqeErr(WcStatus::RetryExcErr))
        );
        st.arm(&A, 0);
        assert_eq!(comp_timer(&mut st, u64::MAX, false), None);
        assert_eq!(st.deadline, None);
    }
}
