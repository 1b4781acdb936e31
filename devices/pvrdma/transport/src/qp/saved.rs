// SPDX-License-Identifier: Apache-2.0
//! How a [`QpState`] is encoded: its plain fields (attributes, the three
//! roles' sequence state, the counters) as one [`packed`] byte string,
//! then its queues (send WQEs, receive WQEs, the responder's open receive
//! WQE and replay cache) as serde values, which the bounded decoder
//! charges. A busy QP's state had about 80 serde calls each way; this is
//! five, and a save serializes the engine's own fields instead of a clone
//! of them ([`Qp::saved`]).

use std::collections::VecDeque;
use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{CompState, Metrics, Qp, QpAttrs, QpState, RecvWqe, ReqState, RespState, Slot};
use crate::hdr::{Aeth, Syndrome};
use crate::net::{Encap, IpInfo, RoceVersion};
use crate::opcode::Opcode;
use crate::packed::{self, Packed, Reader, Writer};
use crate::packet::Addr;
use crate::psn::Psn;
use crate::resp::Res;
use crate::verbs::Access;

impl Packed for Psn {
    fn pack(&self, w: &mut Writer) {
        self.get().pack(w);
    }
    fn unpack(r: &mut Reader<'_>) -> Option<Self> {
        // As serde's `From<u32>`: masked to 24 bits.
        u32::unpack(r).map(Psn::new)
    }
}

impl Packed for Access {
    fn pack(&self, w: &mut Writer) {
        self.bits().pack(w);
    }
    fn unpack(r: &mut Reader<'_>) -> Option<Self> {
        Access::from_bits(u32::unpack(r)?)
    }
}

impl Packed for Opcode {
    fn pack(&self, w: &mut Writer) {
        (*self as u8).pack(w);
    }
    fn unpack(r: &mut Reader<'_>) -> Option<Self> {
        Opcode::try_from(u8::unpack(r)?).ok()
    }
}

impl Packed for Syndrome {
    fn pack(&self, w: &mut Writer) {
        self.to_u8().pack(w);
    }
    fn unpack(r: &mut Reader<'_>) -> Option<Self> {
        Syndrome::try_from(u8::unpack(r)?).ok()
    }
}

impl Packed for RoceVersion {
    fn pack(&self, w: &mut Writer) {
        matches!(self, RoceVersion::V2).pack(w);
    }
    fn unpack(r: &mut Reader<'_>) -> Option<Self> {
        Some(match bool::unpack(r)? {
            false => RoceVersion::V1,
            true => RoceVersion::V2,
        })
    }
}

crate::packed_struct! {
    Aeth { syndrome, msn }
    Encap { version, vlan }
    IpInfo { src, dst, tclass, hop_limit, flow_label }
    Addr { src_mac, dst_mac, ip, udp_sport, encap }
    QpAttrs {
        qpn, dest_qpn, pd, access, mtu, ud, timeout, retry_cnt, rnr_retry, min_rnr_timer,
        max_rd_atomic, qkey, sq_psn, rq_psn, addr,
    }
    ReqState { psn, una, offset, prev, since_ack_req }
    CompState { psn, retries_left, rnr_left, deadline, rnr_until, retrying }
}

/// The responder's plain fields; its open WQE and replay cache are
/// sequences, saved beside.
impl Packed for RespState {
    fn pack(&self, w: &mut Writer) {
        let RespState {
            psn,
            msn,
            prev,
            sent_psn_nak,
            wqe: _,
            offset,
            write,
            unacked,
            res: _,
            held,
        } = self;
        psn.pack(w);
        msn.pack(w);
        prev.pack(w);
        sent_psn_nak.pack(w);
        offset.pack(w);
        write.pack(w);
        unacked.pack(w);
        held.pack(w);
    }
    fn unpack(r: &mut Reader<'_>) -> Option<Self> {
        Some(RespState {
            psn: Packed::unpack(r)?,
            msn: Packed::unpack(r)?,
            prev: Packed::unpack(r)?,
            sent_psn_nak: Packed::unpack(r)?,
            wqe: None,
            offset: Packed::unpack(r)?,
            write: Packed::unpack(r)?,
            unacked: Packed::unpack(r)?,
            res: VecDeque::new(),
            held: Packed::unpack(r)?,
        })
    }
}

/// A state's plain fields, borrowed to save and owned when restored (its
/// queues then empty, filled from the sequences that follow).
struct Plain<'a> {
    attrs: &'a QpAttrs,
    req: &'a ReqState,
    comp: &'a CompState,
    resp: &'a RespState,
    next: usize,
    error: bool,
    metrics: &'a Metrics,
}

impl Plain<'_> {
    fn pack(&self, w: &mut Writer) {
        self.attrs.pack(w);
        self.req.pack(w);
        self.comp.pack(w);
        self.resp.pack(w);
        self.next.pack(w);
        self.error.pack(w);
        self.metrics.pack(w);
    }
}

impl Serialize for Plain<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        packed::serialize_with(s, |w| self.pack(w))
    }
}

/// What [`Plain`] packed, read back as a state with empty queues.
struct Unpacked(QpState);

impl<'de> Deserialize<'de> for Unpacked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        packed::deserialize_with(d, |r| {
            Some(Unpacked(QpState {
                attrs: Packed::unpack(r)?,
                req: Packed::unpack(r)?,
                comp: Packed::unpack(r)?,
                resp: Packed::unpack(r)?,
                next: Packed::unpack(r)?,
                error: Packed::unpack(r)?,
                metrics: Packed::unpack(r)?,
                sq: Vec::new(),
                rq: Vec::new(),
            }))
        })
    }
}

/// A state as saved: its plain fields, then its queues.
struct Saved<'a, Q, R> {
    plain: Plain<'a>,
    sq: &'a Q,
    rq: &'a R,
    wqe: &'a Option<RecvWqe>,
    res: &'a VecDeque<Res>,
}

/// Elements of the saved tuple.
const PARTS: usize = 5;

impl<Q: Serialize, R: Serialize> Serialize for Saved<'_, Q, R> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(PARTS)?;
        t.serialize_element(&self.plain)?;
        t.serialize_element(self.sq)?;
        t.serialize_element(self.rq)?;
        t.serialize_element(self.wqe)?;
        t.serialize_element(self.res)?;
        t.end()
    }
}

/// The [`Saved`] view of `$s`, a [`QpState`] or a [`Qp`] (whose fields
/// have the same names), with its receive queue `$rq`.
macro_rules! saved_view {
    ($s:expr, $rq:expr) => {
        Saved {
            plain: Plain {
                attrs: &$s.attrs,
                req: &$s.req,
                comp: &$s.comp,
                resp: &$s.resp,
                next: $s.next,
                error: $s.error,
                metrics: &$s.metrics,
            },
            sq: &$s.sq,
            rq: $rq,
            wqe: &$s.resp.wqe,
            res: &$s.resp.res,
        }
    };
}

impl Serialize for QpState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        saved_view!(self, &self.rq).serialize(s)
    }
}

impl Qp {
    /// The engine's state as [`Qp::save`] would give it, serialized from
    /// the engine's own fields (no copy of its queues).
    pub fn saved(&self) -> impl Serialize + '_ {
        saved_view!(self, &self.rq.0)
    }
}

struct StateVisitor;

impl<'de> Visitor<'de> for StateVisitor {
    type Value = QpState;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a QP state of {PARTS} parts")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<QpState, A::Error> {
        let missing = |i| de::Error::invalid_length(i, &self);
        let Unpacked(mut state) = seq.next_element()?.ok_or_else(|| missing(0))?;
        state.sq = seq.next_element::<Vec<Slot>>()?.ok_or_else(|| missing(1))?;
        state.rq = seq.next_element()?.ok_or_else(|| missing(2))?;
        state.resp.wqe = seq.next_element()?.ok_or_else(|| missing(3))?;
        state.resp.res = seq.next_element()?.ok_or_else(|| missing(4))?;
        Ok(state)
    }
}

impl<'de> Deserialize<'de> for QpState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_tuple(PARTS, StateVisitor)
    }
}
