// SPDX-License-Identifier: Apache-2.0
//! How a [`Qp`] is saved: its own plain fields (IDs, state, the guest's
//! capabilities and attributes) as one packed byte string
//! ([`rdma_transport::packed`]), then its [`Fixed`] part (rings' pages and
//! geometry, doorbells), its rings' consumer indices and its engine as
//! serde values. A migration's destination restores thousands of QPs
//! inside the blackout, and each serde call there costs tens of
//! instructions through the bounded decoder; this is a handful a QP.
//!
//! The [`Fixed`] part never changes from the QP's creation to its
//! destruction, and its `gen` names that life. A migration's source sends
//! it ahead, in the restore hint ([`crate::snapshot::hint`]), while the
//! guest runs; the QP's save inside the blackout then leaves it out (its
//! plain fields name it by `gen`), and the destination takes the part it
//! kept ([`with_presented`]).
//! A QP created after the hint (a new `gen`) is saved whole.

use std::cell::RefCell;
use std::fmt;

use pvrdma_abi::verbs::{QpAttr, QpCap};
use rdma_transport::packed::{self, Packed, Reader, Writer};
use rdma_transport::qp::QpState;
use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use vm_memory::ByteValued;

use super::{Engine, Qp};
use crate::ring::{ConsumerRing, Ring};
use crate::uar::Doorbells;

/// What of a QP stays as created: `R` and `D` are references when saving,
/// owned when restoring.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Fixed<R, D> {
    sq: R,
    rq: Option<R>,
    doorbells: D,
}

/// A QP's [`Fixed`] part as a destination keeps it, by the QP's `gen`.
pub(crate) type Presented = (u64, Fixed<Ring, Doorbells>);

impl Qp {
    /// This QP's [`Fixed`] part, for the restore hint.
    pub(crate) fn fixed(&self) -> Fixed<&Ring, &Doorbells> {
        Fixed {
            sq: self.sq.ring(),
            rq: self.rq.as_ref().map(ConsumerRing::ring),
            doorbells: &self.doorbells,
        }
    }
}

impl Fixed<Ring, Doorbells> {
    /// Makes the doorbells of the QP of `gen` (eventfds, the worker's
    /// watch, ioeventfds at BAR2 `base`) while the guest still runs on
    /// the source: the restore then finds them made, and only moves them
    /// if BAR2 came back elsewhere.
    pub(crate) fn attach(
        &mut self,
        hub: &std::sync::Arc<crate::uar::Hub>,
        gen: u64,
        base: Option<u64>,
    ) -> std::io::Result<()> {
        self.doorbells.attach(hub, gen, base)
    }

    /// Guest pages its rings map (what a destination bounds).
    pub(crate) fn pages(&self) -> usize {
        let rq = self.rq.as_ref().map_or(0, Ring::pages);
        self.sq.pages().saturating_add(rq)
    }
}

thread_local! {
    /// The [`Fixed`] parts a restore on this thread may take, in the order
    /// the source sent them (its QPs' handles, ascending, which is also
    /// the order of the QPs in the state): [`with_presented`].
    static PRESENTED: RefCell<std::vec::IntoIter<Presented>> =
        RefCell::new(Vec::new().into_iter());
}

/// Runs `decode` with `presented` for the QPs it decodes to take their
/// [`Fixed`] part from; what they leave is dropped. A thread-local,
/// because the derived decode of the whole state has no way to hand a QP
/// anything else.
pub(crate) fn with_presented<T>(presented: Vec<Presented>, decode: impl FnOnce() -> T) -> T {
    PRESENTED.with(|p| *p.borrow_mut() = presented.into_iter());
    let decoded = decode();
    PRESENTED.with(|p| *p.borrow_mut() = Vec::new().into_iter());
    decoded
}

/// The kept [`Fixed`] part of the QP of `gen`: the parts before it are of
/// QPs destroyed since they were sent (they come in the same order), so
/// they are dropped on the way. `None` if it was not sent ahead.
fn take_presented(gen: u64) -> Option<Fixed<Ring, Doorbells>> {
    PRESENTED.with(|p| {
        p.borrow_mut()
            .find(|(g, _)| *g == gen)
            .map(|(_, fixed)| fixed)
    })
}

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
const PARTS: usize = 4;

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
            doorbells: _,
            engine,
            presented,
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
        let fixed = (!presented).then(|| self.fixed());
        let cons = (sq.cons(), rq.as_ref().map(ConsumerRing::cons));
        let mut t = s.serialize_tuple(PARTS)?;
        t.serialize_element(&plain)?;
        t.serialize_element(&fixed)?;
        t.serialize_element(&cons)?;
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
        let fixed: Option<Fixed<Ring, Doorbells>> =
            seq.next_element()?.ok_or_else(|| missing(1))?;
        let (sq_cons, rq_cons): (u32, Option<u32>) =
            seq.next_element()?.ok_or_else(|| missing(2))?;
        let engine: Option<QpState> = seq.next_element()?.ok_or_else(|| missing(3))?;
        let Fixed { sq, rq, doorbells } = fixed
            .or_else(|| take_presented(p.gen))
            .ok_or_else(|| de::Error::custom(format!("QP {}: not sent ahead", p.gen)))?;
        let rq = match (rq, rq_cons) {
            (Some(ring), Some(cons)) => Some(ConsumerRing::resume(ring, cons)),
            (None, None) => None,
            _ => {
                return Err(de::Error::custom(
                    "a receive ring and its index, one without the other",
                ))
            }
        };
        let sq = ConsumerRing::resume(sq, sq_cons);
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
            presented: false,
        })
    }
}

impl<'de> Deserialize<'de> for Qp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_tuple(PARTS, QpVisitor)
    }
}
