// SPDX-License-Identifier: Apache-2.0
//! How a [`Qp`] is saved: its handle and `gen`, its [`Fixed`] part
//! (rings' pages and geometry, doorbells) unless that went ahead, and its
//! short part (its own plain fields packed into one byte string by
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
//! the short part of each QP sent ahead. A QP nothing took mutably since
//! ([`Watched`]) is saved in a list of (handle, `gen`) pairs ([`map`]).
//! The destination decodes what comes ahead as it comes ([`Ahead`]) and
//! the restore takes those QPs all at once ([`with_ahead`]). A QP created
//! after the first hint (a new `gen`) is saved whole.

use std::borrow::Borrow;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt;

use pvrdma_abi::verbs::{QpAttr, QpCap};
use rdma_transport::packed::{self, Packed, Reader, Writer};
use rdma_transport::qp::QpState;
use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
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

impl<R: Borrow<Ring>, D> Fixed<R, D> {
    /// Guest pages its rings map (what a hint and a destination bound).
    pub(crate) fn pages(&self) -> usize {
        let rq = self.rq.as_ref().map_or(0, |rq| rq.borrow().pages());
        self.sq.borrow().pages().saturating_add(rq)
    }
}

/// A QP's [`Fixed`] part as a hint sends it: the QP's handle and `gen`.
pub(crate) type Presented = (u32, u64, Fixed<Ring, Doorbells>);

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
}

/// What a destination has of its source's QPs before the state comes,
/// by handle: the [`Fixed`] parts of the restore hint, with their `gen`,
/// and the QPs a later hint's short parts completed. The latter are kept
/// as the objects keep them, so that a restore takes them all at once.
#[derive(Debug, Default)]
pub(crate) struct Ahead {
    /// Boxed: a B-tree's removal shifts the values left in its node.
    fixed: BTreeMap<u32, (u64, Box<Fixed<Ring, Doorbells>>)>,
    qps: BTreeMap<u32, Watched>,
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

    /// Keeps the [`Fixed`] part of the QP `handle` of `gen` (its doorbells
    /// made), in place of an earlier QP of that handle (destroyed since).
    pub(crate) fn keep(
        &mut self,
        handle: u32,
        gen: u64,
        fixed: Fixed<Ring, Doorbells>,
    ) -> Result<(), String> {
        let old = match (self.fixed.remove(&handle), self.qps.remove(&handle)) {
            (Some((old, f)), _) => Some((old, f.pages())),
            (None, Some(qp)) => Some((qp.gen, qp.fixed().pages())),
            (None, None) => None,
        };
        if let Some((old, pages)) = old {
            if old == gen {
                return Err(format!("QP {handle} sent ahead twice"));
            }
            self.pages = self.pages.saturating_sub(pages);
        }
        self.pages = self.pages.saturating_add(fixed.pages());
        self.fixed.insert(handle, (gen, Box::new(fixed)));
        Ok(())
    }

    /// Decodes a later hint's short part of the QP `handle`, whose
    /// [`Fixed`] part is kept, into the whole QP, checked as a restore
    /// checks it.
    pub(crate) fn complete(
        &mut self,
        handle: u32,
        short: &[u8],
        budget: &mut usize,
    ) -> Result<(), String> {
        let short: ShortOwned = nested::decode(short, budget)?;
        let (gen, fixed) = self
            .fixed
            .remove(&handle)
            .ok_or_else(|| format!("QP {handle}: a state sent ahead without its fixed part"))?;
        if gen != short.plain.gen {
            return Err(format!("QP {handle}: a state of another QP"));
        }
        let qp = Qp::from_parts(*fixed, short)?;
        self.qps.insert(handle, Watched::new(Box::new(qp)));
        Ok(())
    }

    /// The kept [`Fixed`] part of the QP `handle` of `gen`, taken back from
    /// its QP decoded ahead if there is one.
    fn take_fixed(&mut self, handle: u32, gen: u64) -> Option<Fixed<Ring, Doorbells>> {
        if self.fixed.get(&handle).is_some_and(|(g, _)| *g == gen) {
            return self.fixed.remove(&handle).map(|(_, fixed)| *fixed);
        }
        if self.qps.get(&handle).is_some_and(|qp| qp.gen == gen) {
            return self
                .qps
                .remove(&handle)
                .map(|qp| qp.into_inner().into_fixed());
        }
        None
    }

    /// The objects' QPs: those decoded ahead that `as_sent` lists
    /// ((handle, `gen`) varint pairs, ascending handles), and `others`.
    /// Every QP listed must have been decoded ahead; one decoded ahead
    /// but not listed was destroyed since, or came among `others`.
    fn take_qps(
        &mut self,
        as_sent: &[u8],
        others: Vec<Other>,
    ) -> Result<BTreeMap<u32, Watched>, String> {
        let mut listed = Reader::new(as_sent);
        let mut next = || -> Result<Option<(u32, u64)>, String> {
            if listed.is_empty() {
                return Ok(None);
            }
            let handle = listed.varint().and_then(|h| u32::try_from(h).ok());
            match (handle, listed.varint()) {
                (Some(handle), Some(gen)) => Ok(Some((handle, gen))),
                _ => Err("a malformed list of the QPs as sent ahead".into()),
            }
        };
        let mut qps = std::mem::take(&mut self.qps);
        let mut want = next()?;
        let mut failed = None;
        let mut taken = 0usize;
        qps.retain(|&handle, qp| match want {
            _ if failed.is_some() => false,
            Some((h, gen)) if h == handle => {
                if gen != qp.gen {
                    failed = Some(format!("QP {h}: another QP sent ahead"));
                }
                taken = taken.saturating_add(1);
                want = next().unwrap_or_else(|e| {
                    failed = Some(e);
                    None
                });
                true
            }
            Some((h, _)) if h < handle => {
                failed = Some(format!("QP {h}: not sent ahead"));
                false
            }
            _ => false,
        });
        if let Some(e) = failed {
            return Err(e);
        }
        if let Some((h, _)) = want {
            return Err(format!("QP {h}: not sent ahead"));
        }
        for Other(handle, qp) in others {
            if qps.insert(handle, qp).is_some() {
                return Err(format!("QP {handle} saved twice"));
            }
        }
        self.taken = taken;
        Ok(qps)
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

/// How the objects' QPs are saved: a byte string listing the QPs as sent
/// ahead, (handle, `gen`) varint pairs in ascending handles, then each
/// other QP as an [`Other`]. A QP nothing took mutably since a later hint
/// kept its short part ([`Watched`]) is as sent; one taken mutably is
/// saved with its short part even if that came out the same (the worker
/// takes a QP mutably to run it, so it has mostly changed). The
/// destination keeps the QPs decoded ahead as the objects keep them, so
/// the listed QPs cost it a walk beside the list, not a decode each (most
/// of a restore of 4096 idle QPs before).
pub(crate) mod map {
    use std::collections::BTreeMap;
    use std::fmt;

    use rdma_transport::packed::Writer;
    use serde::de::{self, SeqAccess, Visitor};
    use serde::ser::{Error as _, SerializeSeq, SerializeTuple};
    use serde::{Deserializer, Serializer};
    use vm_migration::nested;

    use super::{Other, ShortRef, Watched, AHEAD, SCRATCH};

    pub(crate) fn serialize<S: Serializer>(
        qps: &BTreeMap<u32, Watched>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut as_sent = Writer::default();
        let mut listed = 0usize;
        for (&handle, qp) in qps.iter().filter(|(_, qp)| qp.as_sent()) {
            as_sent.varint(u64::from(handle));
            as_sent.varint(qp.gen);
            listed = listed.saturating_add(1);
        }
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element(&nested::Bytes(as_sent.into_inner()))?;
        t.serialize_element(&Others(qps, qps.len().saturating_sub(listed)))?;
        t.end()
    }

    /// The QPs not as sent (so many of them), each encoding its short
    /// part as it goes.
    struct Others<'a>(&'a BTreeMap<u32, Watched>, usize);

    impl serde::Serialize for Others<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut seq = s.serialize_seq(Some(self.1))?;
            SCRATCH.with(|scratch| {
                let mut short = scratch.borrow_mut();
                for (&handle, qp) in self.0.iter().filter(|(_, qp)| !qp.as_sent()) {
                    short.clear();
                    nested::encode_into(&ShortRef(qp), &mut short).map_err(S::Error::custom)?;
                    let fixed = (!qp.presented).then(|| qp.fixed());
                    seq.serialize_element(&(handle, qp.gen, fixed, nested::Bytes(&short[..])))?;
                }
                Ok(())
            })?;
            seq.end()
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<u32, Watched>, D::Error> {
        d.deserialize_tuple(2, MapVisitor)
    }

    struct MapVisitor;

    impl<'de> Visitor<'de> for MapVisitor {
        type Value = BTreeMap<u32, Watched>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("the QPs as sent ahead and the others")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let missing = |i| de::Error::invalid_length(i, &self);
            let nested::Bytes(as_sent): nested::Bytes<Vec<u8>> =
                seq.next_element()?.ok_or_else(|| missing(0))?;
            let others: Vec<Other> = seq.next_element()?.ok_or_else(|| missing(1))?;
            AHEAD
                .with(|a| a.borrow_mut().take_qps(&as_sent, others))
                .map_err(de::Error::custom)
        }
    }
}

/// A saved QP not as sent ahead: its handle, `gen`, [`Fixed`] part unless
/// that went ahead, and short part.
struct Other(u32, Watched);

const OTHER_PARTS: usize = 4;

struct OtherVisitor;

impl<'de> Visitor<'de> for OtherVisitor {
    type Value = Other;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a QP of {OTHER_PARTS} parts")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Other, A::Error> {
        let missing = |i| de::Error::invalid_length(i, &self);
        let handle: u32 = seq.next_element()?.ok_or_else(|| missing(0))?;
        let gen: u64 = seq.next_element()?.ok_or_else(|| missing(1))?;
        let fixed: Option<Fixed<Ring, Doorbells>> =
            seq.next_element()?.ok_or_else(|| missing(2))?;
        let NestedShort(short) = seq.next_element()?.ok_or_else(|| missing(3))?;
        if short.plain.gen != gen {
            return Err(de::Error::custom(format!(
                "QP {handle}: a state of another QP"
            )));
        }
        let fixed = match fixed {
            Some(fixed) => fixed,
            None => AHEAD
                .with(|a| a.borrow_mut().take_fixed(handle, gen))
                .ok_or_else(|| de::Error::custom(format!("QP {handle}: not sent ahead")))?,
        };
        Qp::from_parts(fixed, short)
            .map(|qp| Other(handle, Watched::new(Box::new(qp))))
            .map_err(de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for Other {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_tuple(OTHER_PARTS, OtherVisitor)
    }
}
