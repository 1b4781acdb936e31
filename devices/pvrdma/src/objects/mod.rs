// SPDX-License-Identifier: Apache-2.0
//! The verbs objects of one session and the rules that tie them together.
//!
//! Ownership: every object belongs to a context, the kernel's (handle 0,
//! UAR page 0) or a user context (its own UAR page). CQs name their
//! context directly; PDs too; QPs, SRQs and MRs through their PD. A QP may
//! only use CQs and an SRQ of its own context.
//!
//! References: a context is used by its PDs and CQs, a PD by its MRs, QPs
//! and SRQs, a CQ and an SRQ by their QPs. An object in use refuses
//! destruction (EBUSY), so a handle is never freed, and so never reused,
//! while something still names it.
//!
//! Every create validates everything first and inserts the object last; an
//! object under construction owns what it acquired (page lists, doorbells)
//! and releases it on drop, so a failed create leaves nothing behind.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

pub(crate) mod cq;
pub(crate) mod ctx;
pub(crate) mod gid;
pub(crate) mod mr;
pub(crate) mod qp;
pub(crate) mod session;
pub(crate) mod srq;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::Limits;
use crate::error::{check, CmdError};
use crate::uar::{Doorbells, Owner};

/// The kernel's context: always there, owns UAR page 0.
pub(crate) const KERNEL_CTX: u32 = 0;

/// Every object of a session. The maps decode with [`ascending`].
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Objects {
    #[serde(deserialize_with = "ascending::deserialize")]
    pub(crate) ctxs: BTreeMap<u32, ctx::Context>,
    #[serde(deserialize_with = "ascending::deserialize")]
    pub(crate) pds: BTreeMap<u32, ctx::Pd>,
    #[serde(deserialize_with = "ascending::deserialize")]
    pub(crate) cqs: BTreeMap<u32, cq::Cq>,
    #[serde(with = "qp::saved::map")]
    pub(crate) qps: BTreeMap<u32, qp::Watched>,
    #[serde(deserialize_with = "ascending::deserialize")]
    pub(crate) srqs: BTreeMap<u32, srq::Srq>,
    #[serde(deserialize_with = "ascending::deserialize")]
    pub(crate) mrs: BTreeMap<u32, mr::Mr>,
    pub(crate) gids: gid::GidTable,
    /// QP handle of each QPN (received packets name the QPN): an index of
    /// `qps`, not saved but made again by [`Objects::index_qpns`] (a saved
    /// one was thousands of entries to decode inside a migration's
    /// blackout, and could have named another QP than the QPN's own).
    #[serde(skip)]
    pub(crate) qpns: BTreeMap<u32, u32>,
    /// Guest pages all objects map, against `Limits::max_mapped_pages`.
    mapped_pages: u64,
    /// Creation counter: tells a new object from an old one with the same
    /// handle (the worker may see a late doorbell of the old one).
    next_gen: u64,
}

impl Objects {
    /// Logs the IDs peers know this device's objects by, after the device
    /// `done` ("saved", "restored") them, so that an operator (and the
    /// migration tests) can see they did not change: a summary at info
    /// level (see [`ids_line`]), every ID at debug level.
    pub(crate) fn log_ids(&self, done: &str) {
        let qpns: Vec<u32> = self.qpns.keys().copied().collect();
        let keys: Vec<u32> = self.mrs.values().map(|m| m.key).collect();
        log::info!("pvrdma: {done} {}", ids_line(&qpns, &keys));
        log::debug!(
            "pvrdma: {done} every ID: qpns=[{}] keys=[{}]",
            hex_list(&qpns),
            hex_list(&keys)
        );
    }

    pub(crate) fn new(limits: &Limits) -> Self {
        Self {
            ctxs: BTreeMap::new(),
            pds: BTreeMap::new(),
            cqs: BTreeMap::new(),
            qps: BTreeMap::new(),
            srqs: BTreeMap::new(),
            mrs: BTreeMap::new(),
            gids: gid::GidTable::new(limits.gid_tbl_len),
            qpns: BTreeMap::new(),
            mapped_pages: 0,
            next_gen: 0,
        }
    }

    pub(crate) fn next_gen(&mut self) -> u64 {
        self.next_gen = self.next_gen.wrapping_add(1);
        self.next_gen
    }

    /// Fails unless `pages` more guest pages fit the per-VM budget.
    pub(crate) fn check_pages(&self, limits: &Limits, pages: u64) -> Result<(), CmdError> {
        match self.mapped_pages.checked_add(pages) {
            Some(total) if total <= limits.max_mapped_pages => Ok(()),
            _ => Err(CmdError::Exhausted("mappable pages")),
        }
    }

    /// Accounts `pages` of a created object (checked by `check_pages`).
    pub(crate) fn add_pages(&mut self, pages: u64) {
        self.mapped_pages = self.mapped_pages.saturating_add(pages);
    }

    /// Releases `pages` of a destroyed object.
    pub(crate) fn sub_pages(&mut self, pages: u64) {
        self.mapped_pages = self.mapped_pages.saturating_sub(pages);
    }

    /// The UAR page of context `ctx`, which must exist.
    pub(crate) fn uar_page(&self, ctx: u32) -> Result<u32, CmdError> {
        if ctx == KERNEL_CTX {
            return Ok(0);
        }
        get(&self.ctxs, "context", ctx).map(|c| c.uar_index)
    }

    /// The opcode numbering of QP `handle`, from the context it belongs
    /// to through its PD.
    pub(crate) fn qp_numbering(&self, handle: u32) -> ctx::Numbering {
        let ctx = self
            .qps
            .get(&handle)
            .and_then(|qp| ctx::pd_ctx(self, qp.pd).ok());
        ctx::Numbering::of_ctx(ctx)
    }

    /// Indexes restored QPs by QPN; fails if two have the same QPN.
    pub(crate) fn index_qpns(&mut self) -> Result<(), CmdError> {
        let mut qpns: Vec<(u32, u32)> = self.qps.iter().map(|(&h, q)| (q.qpn, h)).collect();
        qpns.sort_unstable();
        check(
            qpns.windows(2).all(|w| matches!(w, [a, b] if a.0 != b.0)),
            "two QPs of one QPN",
        )?;
        self.qpns = qpns.into_iter().collect();
        Ok(())
    }

    /// Checks restored objects' doorbells against the objects: each names
    /// its own handle, its context's UAR page and its kind's doorbells
    /// ([`Doorbells::are`]).
    pub(crate) fn check_doorbells(&self) -> Result<(), CmdError> {
        // The page of the last QP's PD: thousands of QPs share a few PDs,
        // and this runs inside a migration's blackout.
        let mut last: Option<(u32, u32)> = None;
        for (&handle, q) in &self.qps {
            let page = match last {
                Some((pd, page)) if pd == q.pd => page,
                _ => self.uar_page(get(&self.pds, "PD", q.pd)?.ctx)?,
            };
            last = Some((q.pd, page));
            let kinds = qp::doorbells(q.rq.is_some());
            check(q.doorbells.are(page, handle, kinds), "a QP's doorbells")?;
        }
        let cqs = self.cqs.iter().map(|(&handle, c)| {
            let kinds: &[_] = &cq::DOORBELLS;
            (handle, c.ctx, &c.doorbells, kinds, "a CQ's doorbells")
        });
        let srqs = self.srqs.iter().map(|(&handle, s)| {
            let kinds: &[_] = &srq::DOORBELLS;
            (handle, s.ctx, &s.doorbells, kinds, "an SRQ's doorbells")
        });
        for (handle, ctx, doorbells, kinds, what) in cqs.chain(srqs) {
            check(doorbells.are(self.uar_page(ctx)?, handle, kinds), what)?;
        }
        Ok(())
    }

    /// The doorbells of object `handle` of kind `owner`.
    pub(crate) fn doorbells(&self, owner: Owner, handle: u32) -> Option<&Doorbells> {
        match owner {
            Owner::Qp => self.qps.get(&handle).map(|o| &o.doorbells),
            Owner::Cq => self.cqs.get(&handle).map(|o| &o.doorbells),
            Owner::Srq => self.srqs.get(&handle).map(|o| &o.doorbells),
        }
    }

    /// Makes the doorbells of restored objects (eventfds, the worker's
    /// watch, ioeventfds at BAR2 `base`); the caller wakes the worker once
    /// for all of them.
    pub(crate) fn attach_doorbells(
        &mut self,
        hub: &std::sync::Arc<crate::uar::Hub>,
        base: Option<u64>,
    ) -> std::io::Result<()> {
        for o in self.qps.values_mut().map(|o| &mut **o) {
            o.doorbells.attach(hub, o.gen, base)?;
        }
        for o in self.cqs.values_mut() {
            o.doorbells.attach(hub, o.gen, base)?;
        }
        for o in self.srqs.values_mut() {
            o.doorbells.attach(hub, o.gen, base)?;
        }
        Ok(())
    }

    /// The eventfds the objects' doorbells hold (what a restore makes).
    pub(crate) fn eventfds(&self) -> usize {
        let qps = self.qps.values().map(|o| &o.doorbells);
        let cqs = self.cqs.values().map(|o| &o.doorbells);
        let srqs = self.srqs.values().map(|o| &o.doorbells);
        qps.chain(cqs)
            .chain(srqs)
            .map(|d| d.classes().count())
            .fold(0, usize::saturating_add)
    }

    /// Moves every doorbell to BAR2 `base` (BAR moved, decoding toggled).
    pub(crate) fn rebase_doorbells(&mut self, base: Option<u64>) {
        let qps = self.qps.values_mut().map(|o| &mut o.doorbells);
        let cqs = self.cqs.values_mut().map(|o| &mut o.doorbells);
        let srqs = self.srqs.values_mut().map(|o| &mut o.doorbells);
        for doorbells in qps.chain(cqs).chain(srqs) {
            doorbells.rebase(base);
        }
    }
}

/// Decoding a saved `BTreeMap` (serde writes one in key order, the same
/// bytes as any map): the entries are collected and the tree built from
/// them at once, instead of an insert per entry that moves large objects
/// around the tree's nodes (a sixth of a restore of 4096 QPs). Keys must
/// ascend strictly, as the saver writes them: a repeated key would
/// otherwise replace an object without a word.
pub(crate) mod ascending {
    use std::collections::BTreeMap;
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{Error, MapAccess, Visitor};
    use serde::{Deserialize, Deserializer};

    /// Entries reserved before any is decoded: the length prefix is the
    /// sender's word, and the bounded decoder charges each entry only as
    /// it comes.
    const RESERVE: usize = 1024;

    pub(crate) fn deserialize<'de, D, K, V>(d: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        D: Deserializer<'de>,
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
    {
        struct Entries<K, V>(PhantomData<(K, V)>);

        impl<'de, K: Deserialize<'de> + Ord, V: Deserialize<'de>> Visitor<'de> for Entries<K, V> {
            type Value = BTreeMap<K, V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map with ascending keys")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries: Vec<(K, V)> =
                    Vec::with_capacity(map.size_hint().unwrap_or(0).min(RESERVE));
                while let Some((key, value)) = map.next_entry::<K, V>()? {
                    if entries.last().is_some_and(|(last, _)| *last >= key) {
                        return Err(A::Error::custom("map keys not in ascending order"));
                    }
                    entries.push((key, value));
                }
                // Sorted already: the sort only checks, the build is linear.
                Ok(entries.into_iter().collect())
            }
        }

        d.deserialize_map(Entries(PhantomData))
    }
}

/// The object `handle` of `map`, or the error naming `kind`.
pub(crate) fn get<'a, T>(
    map: &'a BTreeMap<u32, T>,
    kind: &'static str,
    handle: u32,
) -> Result<&'a T, CmdError> {
    map.get(&handle).ok_or(CmdError::NoObject { kind, handle })
}

pub(crate) fn get_mut<'a, T>(
    map: &'a mut BTreeMap<u32, T>,
    kind: &'static str,
    handle: u32,
) -> Result<&'a mut T, CmdError> {
    map.get_mut(&handle)
        .ok_or(CmdError::NoObject { kind, handle })
}

/// A reference count: how many objects name this one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Refs(u32);

impl Refs {
    pub(crate) fn take(&mut self) {
        self.0 = self.0.saturating_add(1);
    }

    pub(crate) fn release(&mut self) {
        self.0 = self.0.saturating_sub(1);
    }

    /// Fails with EBUSY while referenced.
    pub(crate) fn check_unused(self, kind: &'static str, handle: u32) -> Result<(), CmdError> {
        if self.0 == 0 {
            Ok(())
        } else {
            Err(CmdError::Busy { kind, handle })
        }
    }
}

/// How many IDs of each kind [`ids_line`] lists at most before the last:
/// a 4096-QP guest's whole lists would make a line of 100 KiB on every
/// save and restore.
const LISTED_IDS: usize = 8;

/// "N QPs qpns=[..] M MRs keys=[..] crc=0x..": the QPNs and MR keys with
/// their counts, each list cut to its first [`LISTED_IDS`] and its last,
/// and a CRC-32 of every ID, so that two lines are the same when (CRC
/// collisions aside) all the IDs are.
fn ids_line(qpns: &[u32], keys: &[u32]) -> String {
    let mut crc = crc32fast::Hasher::new();
    for id in qpns.iter().chain(keys) {
        crc.update(&id.to_le_bytes());
    }
    format!(
        "{} QPs qpns=[{}] {} MRs keys=[{}] crc={:#010x}",
        qpns.len(),
        listed(qpns),
        keys.len(),
        listed(keys),
        crc.finalize()
    )
}

/// `ids` in hex, the first [`LISTED_IDS`] and the last if there are more.
fn listed(ids: &[u32]) -> String {
    match (ids.get(..LISTED_IDS), ids.split_last()) {
        (Some(first), Some((last, _))) if ids.len() > LISTED_IDS.saturating_add(1) => {
            format!("{},...,{last:#x}", hex_list(first))
        }
        _ => hex_list(ids),
    }
}

fn hex_list(ids: &[u32]) -> String {
    let hex: Vec<String> = ids.iter().map(|id| format!("{id:#x}")).collect();
    hex.join(",")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use vm_migration::Snapshot;

    #[derive(Debug, serde::Deserialize)]
    struct Saved {
        #[serde(deserialize_with = "super::ascending::deserialize")]
        map: BTreeMap<u32, u64>,
    }

    /// `entries` encoded as a map is (postcard writes a map as its length
    /// and pairs), decoded as the device decodes its objects.
    fn decode(entries: &[(u32, u64)]) -> Result<BTreeMap<u32, u64>, vm_migration::MigratableError> {
        let snapshot = Snapshot::new("t", 1, &(entries.to_vec(),)).unwrap();
        snapshot.state::<Saved>("t", 1).map(|s| s.map)
    }

    /// A few IDs are listed whole; thousands are cut to a short line with
    /// their count, first and last, whose CRC still tells any change.
    #[test]
    fn the_ids_line_lists_a_few_and_counts_the_rest() {
        assert_eq!(
            super::ids_line(&[0x1, 0x12], &[0x101]),
            "2 QPs qpns=[0x1,0x12] 1 MRs keys=[0x101] crc=0x6790b104"
        );
        let qpns: Vec<u32> = (1..=4097).collect();
        let keys: Vec<u32> = (1..=4096).map(|k| k << 8 | 1).collect();
        let line = super::ids_line(&qpns, &keys);
        assert!(line.len() < 300, "{} bytes: {line}", line.len());
        assert!(
            line.starts_with(
                "4097 QPs qpns=[0x1,0x2,0x3,0x4,0x5,0x6,0x7,0x8,...,0x1001] 4096 MRs \
                 keys=[0x101,0x201,0x301,0x401,0x501,0x601,0x701,0x801,...,0x100001] crc="
            ),
            "{line}"
        );
        let mut moved = qpns.clone();
        *moved.get_mut(2000).unwrap() = 0x10_0000;
        assert_ne!(super::ids_line(&moved, &keys), line);
    }

    /// A saved map decodes to the same map; keys out of order or repeated
    /// (which a B-tree insert would have sorted or overwritten) are
    /// refused.
    #[test]
    fn saved_maps_decode_only_in_ascending_order() {
        let map: BTreeMap<u32, u64> = [(1, 10), (4, 40), (9, 90)].into();
        let snapshot = Snapshot::new("t", 1, &(&map,)).unwrap();
        assert_eq!(snapshot.state::<Saved>("t", 1).unwrap().map, map);
        assert_eq!(decode(&[]).unwrap(), BTreeMap::new());
        assert!(decode(&[(4, 40), (1, 10)]).is_err());
        assert!(decode(&[(1, 10), (1, 11)]).is_err());
    }
}
