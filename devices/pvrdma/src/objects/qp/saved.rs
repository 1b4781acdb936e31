// SPDX-License-Identifier: Apache-2.0
//! How a [`Qp`] is saved: its `gen`, its [`Fixed`] part (rings' pages and
//! geometry, doorbells) unless that went ahead, and its short part
//! (its own plain fields packed into one byte string by
//! [`rdma_transport::packed`], its rings' consumer indices and its engine)
//! nested as a byte string, unless the destination has it already. A
//! migration's destination restores thousands of QPs inside the blackout,
//! and each serde call there costs tens of instructions through the
//! bounded decoder; this is a handful a QP.
//!
//! The [`Fixed`] part never changes from the QP's creation to its
//! destruction, and its `gen` names that life. A migration's source sends
//! it ahead, in the restore hint ([`crate::snapshot::hint`]), while the
//! guest runs. A later hint, taken just before the switch-over, carries
//! the short part of each QP sent ahead, and the source keeps those
//! bytes: a QP whose short part is the same inside the blackout is
//! saved as its `gen` alone, and one not even taken mutably since
//! ([`Watched`]) is not encoded again to be compared. The destination decodes what comes ahead as
//! it comes ([`Ahead`]) and the restore takes it ([`with_ahead`]).
//! A QP created after the first hint (a new `gen`) is saved whole.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt;

use pvrdma_abi::verbs::{QpAttr, QpCap};
use rdma_transport::packed::{self, Packed, Reader, Writer};
use rdma_transport::qp::QpState;
use serde::de::{self, SeqAccess, Visitor};
use serde::ser::{Error as _, SerializeTuple};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use vm_memory::ByteValued;
use vm_migration::nested;

use super::{Engine, Qp, Watched};
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

    /// This QP's short part, encoded: what a later hint sends and the
    /// save compares.
    pub(crate) fn short_bytes(&self) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        nested::encode_into(&ShortRef(self), &mut out)?;
        Ok(out)
    }

    /// Gives its [`Fixed`] part back (a QP decoded ahead whose state
    /// changed after all).
    fn into_fixed(self) -> Fixed<Ring, Doorbells> {
        Fixed {
            sq: self.sq.into_ring(),
            rq: self.rq.map(ConsumerRing::into_ring),
            doorbells: self.doorbells,
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

/// What a destination has of its source's QPs before the state comes,
/// by `gen`: the [`Fixed`] parts of the restore hint, and the QPs a later
/// hint's short parts completed.
#[derive(Debug, Default)]
pub(crate) struct Ahead {
    /// Boxed: a B-tree's removal shifts the values left in its node.
    fixed: BTreeMap<u64, Box<Fixed<Ring, Doorbells>>>,
    qps: BTreeMap<u64, Box<Qp>>,
    /// The kept rings' pages.
    pages: usize,
    /// QPs a restore took as decoded ahead.
    taken: usize,
}

impl Ahead {
    pub(crate) fn is_empty(&self) -> bool {
        self.fixed.is_empty() && self.qps.is_empty()
    }

    /// QPs kept, whole or in part.
    pub(crate) fn qps(&self) -> usize {
        self.fixed.len().saturating_add(self.qps.len())
    }

    pub(crate) fn pages(&self) -> usize {
        self.pages
    }

    /// Keeps the [`Fixed`] part of the QP of `gen` (its doorbells made).
    pub(crate) fn keep(&mut self, gen: u64, fixed: Fixed<Ring, Doorbells>) -> Result<(), String> {
        if self.fixed.contains_key(&gen) || self.qps.contains_key(&gen) {
            return Err(format!("QP {gen} sent ahead twice"));
        }
        self.pages = self.pages.saturating_add(fixed.pages());
        self.fixed.insert(gen, Box::new(fixed));
        Ok(())
    }

    /// Decodes a later hint's short part of a QP whose [`Fixed`] part
    /// is kept, into the whole QP, checked as a restore checks it.
    pub(crate) fn complete(&mut self, short: &[u8], budget: &mut usize) -> Result<(), String> {
        let short: ShortOwned = nested::decode(short, budget)?;
        let gen = short.plain.gen;
        let fixed = self
            .fixed
            .remove(&gen)
            .ok_or_else(|| format!("QP {gen}: a state sent ahead without its fixed part"))?;
        let qp = Qp::from_parts(*fixed, short)?;
        self.qps.insert(gen, Box::new(qp));
        Ok(())
    }

    /// The kept [`Fixed`] part of the QP of `gen`, taken back from its
    /// QP decoded ahead if there is one.
    fn take_fixed(&mut self, gen: u64) -> Option<Fixed<Ring, Doorbells>> {
        self.fixed
            .remove(&gen)
            .map(|fixed| *fixed)
            .or_else(|| self.qps.remove(&gen).map(|qp| qp.into_fixed()))
    }
}

thread_local! {
    /// What a restore on this thread may take ([`with_ahead`]).
    static AHEAD: RefCell<Ahead> = RefCell::new(Ahead::default());
    /// Memory the nested short parts of the state being decoded may
    /// still take.
    static BUDGET: Cell<usize> = const { Cell::new(0) };
    /// Where the save encodes each QP's short part.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `decode` with `ahead` for the QPs it decodes to take their parts
/// from, their nested parts within `budget`; what they leave is dropped.
/// Also returns how many QPs it took as decoded ahead. A thread-local,
/// because the derived decode of the whole state has no way to hand a QP
/// anything else.
pub(crate) fn with_ahead<T>(ahead: Ahead, budget: usize, decode: impl FnOnce() -> T) -> (T, usize) {
    AHEAD.with(|a| *a.borrow_mut() = ahead);
    BUDGET.with(|b| b.set(budget));
    let decoded = decode();
    let left = AHEAD.with(|a| std::mem::take(&mut *a.borrow_mut()));
    (decoded, left.taken)
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

/// What of a QP may change while it lives: its plain fields, its rings'
/// consumer indices and its engine (a tuple of three).
struct ShortRef<'a>(&'a Qp);

#[derive(Deserialize)]
struct ShortOwned {
    plain: Plain,
    cons: (u32, Option<u32>),
    engine: Option<QpState>,
}

impl Serialize for ShortRef<'_> {
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
            presented: _,
            sent: _,
        } = self.0;
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
        let cons = (sq.cons(), rq.as_ref().map(ConsumerRing::cons));
        let mut t = s.serialize_tuple(3)?;
        t.serialize_element(&plain)?;
        t.serialize_element(&cons)?;
        t.serialize_element(&engine.as_ref().map(|e| e.saved()))?;
        t.end()
    }
}

impl Qp {
    /// The QP of `fixed` and `short`, checked as a restore checks it.
    fn from_parts(fixed: Fixed<Ring, Doorbells>, short: ShortOwned) -> Result<Qp, String> {
        let ShortOwned {
            plain: p,
            cons: (sq_cons, rq_cons),
            engine,
        } = short;
        let Fixed { sq, rq, doorbells } = fixed;
        let rq = match (rq, rq_cons) {
            (Some(ring), Some(cons)) => Some(ConsumerRing::resume(ring, cons)),
            (None, None) => None,
            _ => return Err("a receive ring and its index, one without the other".into()),
        };
        let sq = ConsumerRing::resume(sq, sq_cons);
        let engine = engine
            .map(|s| Engine::restore(s).map(Box::new).map_err(|e| e.to_string()))
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
            sent: None,
        })
    }
}

/// A nested short part, decoded as it is read (within [`BUDGET`]).
struct NestedShort(ShortOwned);

impl<'de> Deserialize<'de> for NestedShort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = NestedShort;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a QP's state as a byte string")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<NestedShort, E> {
                BUDGET.with(|b| {
                    let mut left = b.get();
                    let short = nested::decode(v, &mut left);
                    b.set(left);
                    short.map(NestedShort).map_err(E::custom)
                })
            }
        }
        d.deserialize_bytes(V)
    }
}

/// Elements of the saved tuple: `gen`, the [`Fixed`] part if not sent
/// ahead, the short part if not the same as sent ahead.
const PARTS: usize = 3;

impl Serialize for Watched {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(PARTS)?;
        t.serialize_element(&self.gen)?;
        if self.as_sent() {
            // Not taken mutably since its short part was sent.
            t.serialize_element(&None::<Fixed<&Ring, &Doorbells>>)?;
            t.serialize_element(&None::<nested::Bytes<&[u8]>>)?;
            return t.end();
        }
        SCRATCH.with(|scratch| {
            let mut short = scratch.borrow_mut();
            short.clear();
            nested::encode_into(&ShortRef(self), &mut short).map_err(S::Error::custom)?;
            let same = self.presented && self.sent.as_deref() == Some(short.as_slice());
            t.serialize_element(&(!self.presented).then(|| self.fixed()))?;
            t.serialize_element(&(!same).then_some(nested::Bytes(short.as_slice())))
        })?;
        t.end()
    }
}

struct QpVisitor;

impl<'de> Visitor<'de> for QpVisitor {
    type Value = Box<Qp>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a QP of {PARTS} parts")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Box<Qp>, A::Error> {
        let missing = |i| de::Error::invalid_length(i, &self);
        let gen: u64 = seq.next_element()?.ok_or_else(|| missing(0))?;
        let fixed: Option<Fixed<Ring, Doorbells>> =
            seq.next_element()?.ok_or_else(|| missing(1))?;
        let short: Option<NestedShort> = seq.next_element()?.ok_or_else(|| missing(2))?;
        let not_ahead = || de::Error::custom(format!("QP {gen}: not sent ahead"));
        let Some(NestedShort(short)) = short else {
            // The same as sent ahead: decoded then.
            if fixed.is_some() {
                return Err(de::Error::custom(format!("QP {gen}: a fixed part alone")));
            }
            return AHEAD.with(|a| {
                let mut a = a.borrow_mut();
                let qp = a.qps.remove(&gen).ok_or_else(not_ahead)?;
                a.taken = a.taken.saturating_add(1);
                Ok(qp)
            });
        };
        if short.plain.gen != gen {
            return Err(de::Error::custom(format!(
                "QP {gen}: a state of another QP"
            )));
        }
        let fixed = match fixed {
            Some(fixed) => fixed,
            None => AHEAD
                .with(|a| a.borrow_mut().take_fixed(gen))
                .ok_or_else(not_ahead)?,
        };
        Qp::from_parts(fixed, short)
            .map(Box::new)
            .map_err(de::Error::custom)
    }
}

/// Boxed as the objects keep it: a QP decoded ahead is taken as it is.
impl<'de> Deserialize<'de> for Watched {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_tuple(PARTS, QpVisitor).map(Watched::new)
    }
}
