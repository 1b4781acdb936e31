// SPDX-License-Identifier: Apache-2.0
//! How a [`Qp`] is saved: its own plain fields (IDs, state, the guest's
//! capabilities and attributes) as one packed byte string
//! ([`rdma_transport::packed`]), then its rings, doorbells and engine as
//! serde values. A migration's destination restores thousands of QPs
//! inside the blackout, and each serde call there costs tens of
//! instructions through the bounded decoder; this is five a QP instead of
//! eighteen.

use std::fmt;

use pvrdma_abi::verbs::{QpAttr, QpCap};
use rdma_transport::packed::{self, Packed, Reader, Writer};
use rdma_transport::qp::QpState;
use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use vm_memory::ByteValued;

use super::{Engine, Qp};
use crate::ring::ConsumerRing;
use crate::uar::Doorbells;

/// A wire struct packed as its bytes.
#[derive(Clone, Copy)]
struct Wire<T>(T);

impl<T: ByteValued + Default> Packed for Wire<T> {
    fn pack(&self, w: &mut Writer) {
        w.bytes(self.0.as_slice());
    }
    fn unpack(r: &mut Reader<'_>) -> Option<Self> {
        let mut v = T::default();
        let dst = v.as_mut_slice();
        dst.copy_from_slice(r.take(dst.len())?);
        Some(Wire(v))
    }
}

/// A QP's plain fields.
struct Plain {
    gen: u64,
    qpn: u32,
    qp_type: u8,
    pd: u32,
    send_cq: u32,
    recv_cq: u32,
    srq: Option<u32>,
    cap: Wire<QpCap>,
    sq_sig_all: bool,
    state: u32,
    attrs: Wire<QpAttr>,
    events: u32,
    pages: u64,
}

rdma_transport::packed_struct! {
    Plain { gen, qpn, qp_type, pd, send_cq, recv_cq, srq, cap, sq_sig_all, state, attrs, events, pages }
}

impl Serialize for Plain {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        packed::serialize_with(s, |w| self.pack(w))
    }
}

impl<'de> Deserialize<'de> for Plain {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        packed::deserialize_with(d, Plain::unpack)
    }
}

/// Elements of the saved tuple.
const PARTS: usize = 5;

impl Serialize for Qp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Qp {
            gen,
            qpn,
            qp_type,
            pd,
            send_cq,
            recv_cq,
            srq,
            sq,
            rq,
            cap,
            sq_sig_all,
            state,
            attrs,
            events,
            pages,
            doorbells,
            engine,
        } = self;
        let plain = Plain {
            gen: *gen,
            qpn: *qpn,
            qp_type: *qp_type,
            pd: *pd,
            send_cq: *send_cq,
            recv_cq: *recv_cq,
            srq: *srq,
            cap: Wire(*cap),
            sq_sig_all: *sq_sig_all,
            state: *state,
            attrs: Wire(*attrs),
            events: *events,
            pages: *pages,
        };
        let mut t = s.serialize_tuple(PARTS)?;
        t.serialize_element(&plain)?;
        t.serialize_element(sq)?;
        t.serialize_element(rq)?;
        t.serialize_element(doorbells)?;
        t.serialize_element(&engine.as_ref().map(|e| e.saved()))?;
        t.end()
    }
}

struct QpVisitor;

impl<'de> Visitor<'de> for QpVisitor {
    type Value = Qp;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a QP of {PARTS} parts")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Qp, A::Error> {
        let missing = |i| de::Error::invalid_length(i, &self);
        let p: Plain = seq.next_element()?.ok_or_else(|| missing(0))?;
        let sq: ConsumerRing = seq.next_element()?.ok_or_else(|| missing(1))?;
        let rq: Option<ConsumerRing> = seq.next_element()?.ok_or_else(|| missing(2))?;
        let doorbells: Doorbells = seq.next_element()?.ok_or_else(|| missing(3))?;
        let engine: Option<QpState> = seq.next_element()?.ok_or_else(|| missing(4))?;
        let engine = engine
            .map(|s| Engine::restore(s).map(Box::new).map_err(de::Error::custom))
            .transpose()?;
        Ok(Qp {
            gen: p.gen,
            qpn: p.qpn,
            qp_type: p.qp_type,
            pd: p.pd,
            send_cq: p.send_cq,
            recv_cq: p.recv_cq,
            srq: p.srq,
            sq,
            rq,
            cap: p.cap.0,
            sq_sig_all: p.sq_sig_all,
            state: p.state,
            attrs: p.attrs.0,
            events: p.events,
            pages: p.pages,
            doorbells,
            engine,
        })
    }
}

impl<'de> Deserialize<'de> for Qp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_tuple(PARTS, QpVisitor)
    }
}
