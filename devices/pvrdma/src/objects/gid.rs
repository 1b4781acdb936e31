// SPDX-License-Identifier: Apache-2.0
//! The port's GID table, filled by the guest (CREATE_BIND / DESTROY_BIND)
//! with the RoCE GIDs it derives from the vmxnet3 netdev's addresses and
//! those of its VLAN interfaces.
//!
//! Each GID says how the frames of its QPs and AHs are framed: its type
//! (CREATE_BIND's `gid_type`) chooses RoCE v1 or v2, and its VLAN tags
//! them. The VLAN is CREATE_BIND's if it gives one (1 to 4094); the
//! upstream driver never does (it always sends 0xFFF), so otherwise it is
//! what the port learned from the guest's own frames about the GID's
//! address (`net_port::SeenVlans`: a VLAN interface's address is seen only
//! in tagged frames). A received frame is for a GID only if it came with
//! the GID's RoCE version and on one of its VLANs (untagged for a GID
//! never seen tagged), on the wire and on the same-host channel alike.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use net_port::{Port, SeenVlans};
use pvrdma_abi::cmd::{CreateBindReq, DestroyBindReq};
use rdma_transport::net::{ip_from_gid, Encap, RoceVersion};

use super::session::Ctx;
use crate::error::{check, CmdError};

/// VLAN ids are 12-bit; 0xFFF means "no VLAN".
const MAX_VLAN: u32 = 0xfff;
/// VLAN ids a frame can be tagged with (0 is a priority tag only).
const VLAN_IDS: std::ops::RangeInclusive<u32> = 1..=0xffe;

/// One bound GID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Gid {
    pub(crate) raw: [u8; 16],
    /// RoCE v1 or v2, from CREATE_BIND's `gid_type`.
    pub(crate) version: RoceVersion,
    /// The VLAN CREATE_BIND gave, if any.
    pub(crate) bound_vlan: Option<u16>,
    /// The VLANs the port saw the GID's address on (kept here so that they
    /// move with a migration); `None`: never seen.
    pub(crate) seen: Option<SeenVlans>,
}

impl Gid {
    /// How frames from this GID are framed.
    pub(crate) fn encap(&self) -> Encap {
        Encap {
            version: self.version,
            vlan: self
                .bound_vlan
                .or_else(|| self.seen.and_then(|s| s.send_vlan())),
        }
    }

    /// Whether the GID is on `vlan` (`None`: untagged).
    fn on_vlan(&self, vlan: Option<u16>) -> bool {
        match (self.bound_vlan, self.seen) {
            (Some(bound), _) => vlan == Some(bound),
            (None, Some(seen)) => seen.contains(vlan),
            (None, None) => vlan.is_none(),
        }
    }
}

/// Whether a received frame is for one of our GIDs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Accept {
    Yes,
    /// The GID is ours, of the frame's RoCE version, but not on its VLAN.
    WrongVlan,
    No,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct GidTable {
    entries: Vec<Option<Gid>>,
    /// The port's `guest_vlans_generation` the entries last took in.
    #[serde(skip)]
    synced: Option<u64>,
}

impl GidTable {
    pub(crate) fn new(len: u32) -> Self {
        Self {
            entries: vec![None; usize::try_from(len).unwrap_or(0)],
            synced: None,
        }
    }

    fn slot(&mut self, index: u32) -> Result<&mut Option<Gid>, CmdError> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.entries.get_mut(i))
            .ok_or(CmdError::Invalid("GID index"))
    }

    /// Whether `gid` is bound, whatever its type and VLAN.
    pub(crate) fn contains(&self, gid: &[u8; 16]) -> bool {
        self.entries.iter().flatten().any(|g| g.raw == *gid)
    }

    /// Whether a frame framed `encap` for `gid` is for us: a GID of that
    /// value, of the frame's RoCE version, on the frame's VLAN.
    pub(crate) fn accepts(&self, gid: &[u8; 16], encap: Encap) -> Accept {
        let mut verdict = Accept::No;
        let same = self
            .entries
            .iter()
            .flatten()
            .filter(|g| g.raw == *gid && g.version == encap.version);
        for g in same {
            if g.on_vlan(encap.vlan) {
                return Accept::Yes;
            }
            verdict = Accept::WrongVlan;
        }
        verdict
    }

    /// The GID bound at `index`, if any.
    pub(crate) fn get(&self, index: u32) -> Option<&Gid> {
        self.entries.get(usize::try_from(index).ok()?)?.as_ref()
    }

    /// Takes in what `port` learned since the last call about the VLANs of
    /// the GIDs' addresses (cheap when nothing changed). What it never saw
    /// stays as it was: a migrated device keeps what its source learned.
    pub(crate) fn sync(&mut self, port: &Port) {
        let generation = port.guest_vlans_generation();
        if self.synced == Some(generation) {
            return;
        }
        self.synced = Some(generation);
        for g in self.entries.iter_mut().flatten() {
            if let Some(seen) = port.guest_vlans(ip_from_gid(g.raw)) {
                g.seen = Some(seen);
            }
        }
    }
}

pub(crate) fn handle_create_bind<M>(
    cx: &mut Ctx<'_, M>,
    req: &CreateBindReq,
) -> Result<(), CmdError> {
    let gid_type = cx.env.config.gid_type;
    if req.gid_type != gid_type.abi() {
        return Err(CmdError::Unsupported("GID type"));
    }
    check(req.new_gid != [0; 16], "GID (all zeroes)")?;
    check(req.vlan <= MAX_VLAN, "VLAN id")?;
    let bound_vlan = VLAN_IDS
        .contains(&req.vlan)
        .then(|| u16::try_from(req.vlan).ok())
        .flatten();
    *cx.s.objects.gids.slot(req.index)? = Some(Gid {
        raw: req.new_gid,
        version: gid_type.version(),
        bound_vlan,
        seen: cx.env.port.guest_vlans(ip_from_gid(req.new_gid)),
    });
    Ok(())
}

pub(crate) fn handle_destroy_bind<M>(
    cx: &mut Ctx<'_, M>,
    req: &DestroyBindReq,
) -> Result<(), CmdError> {
    let slot = cx.s.objects.gids.slot(req.index)?;
    check(
        slot.is_some_and(|g| g.raw == req.dest_gid),
        "GID (not bound at that index)",
    )?;
    *slot = None;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    const GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 100, 0, 1];

    fn seen(untagged: bool, tagged: [u16; 4]) -> Option<SeenVlans> {
        Some(SeenVlans { untagged, tagged })
    }

    fn gid(version: RoceVersion, bound_vlan: Option<u16>, seen: Option<SeenVlans>) -> Gid {
        Gid {
            raw: GID,
            version,
            bound_vlan,
            seen,
        }
    }

    fn encap(version: RoceVersion, vlan: Option<u16>) -> Encap {
        Encap { version, vlan }
    }

    #[test]
    fn framing_follows_type_and_vlan() {
        use RoceVersion::{V1, V2};
        // Never seen, no VLAN bound: untagged, of its type.
        assert_eq!(gid(V1, None, None).encap(), encap(V1, None));
        // Seen only on VLAN 100: tagged.
        let vlan100 = gid(V2, None, seen(false, [100, 0, 0, 0]));
        assert_eq!(vlan100.encap(), encap(V2, Some(100)));
        // Seen untagged too (a link-local address on eth0 and eth0.100).
        let both = gid(V2, None, seen(true, [100, 0, 0, 0]));
        assert_eq!(both.encap(), encap(V2, None));
        // A VLAN CREATE_BIND gave wins.
        let bound = gid(V2, Some(7), seen(true, [100, 0, 0, 0]));
        assert_eq!(bound.encap(), encap(V2, Some(7)));
    }

    #[test]
    fn received_frames_must_match_version_and_vlan() {
        use RoceVersion::{V1, V2};
        let table = |g: Gid| GidTable {
            entries: vec![None, Some(g)],
            synced: None,
        };
        let t = table(gid(V2, None, seen(false, [100, 0, 0, 0])));
        assert_eq!(t.accepts(&GID, encap(V2, Some(100))), Accept::Yes);
        assert_eq!(t.accepts(&GID, encap(V2, None)), Accept::WrongVlan);
        assert_eq!(t.accepts(&GID, encap(V2, Some(200))), Accept::WrongVlan);
        assert_eq!(t.accepts(&GID, encap(V1, Some(100))), Accept::No);
        assert_eq!(t.accepts(&[1; 16], encap(V2, Some(100))), Accept::No);
        let t = table(gid(V1, None, None));
        assert_eq!(t.accepts(&GID, encap(V1, None)), Accept::Yes);
        assert_eq!(t.accepts(&GID, encap(V1, Some(100))), Accept::WrongVlan);
        assert_eq!(t.accepts(&GID, encap(V2, None)), Accept::No);
        let t = table(gid(V2, Some(7), seen(true, [100, 0, 0, 0])));
        assert_eq!(t.accepts(&GID, encap(V2, Some(7))), Accept::Yes);
        assert_eq!(t.accepts(&GID, encap(V2, None)), Accept::WrongVlan);
        // The same GID at two indices (eth0 and eth0.100): either VLAN.
        let mut t = table(gid(V2, None, seen(true, [0; 4])));
        t.entries[0] = Some(gid(V2, Some(100), None));
        assert_eq!(t.accepts(&GID, encap(V2, None)), Accept::Yes);
        assert_eq!(t.accepts(&GID, encap(V2, Some(100))), Accept::Yes);
        assert_eq!(t.accepts(&GID, encap(V2, Some(5))), Accept::WrongVlan);
    }

    #[test]
    fn sync_takes_in_what_the_port_learned_and_keeps_the_rest() {
        let port = Port::new([2; 6], true);
        let mut t = GidTable::new(2);
        let other = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 13, 0, 1];
        t.entries[0] = Some(Gid {
            raw: other,
            ..gid(RoceVersion::V2, None, seen(false, [42, 0, 0, 0]))
        });
        t.entries[1] = Some(gid(RoceVersion::V2, None, None));
        t.sync(&port);
        assert_eq!(t.get(1).unwrap().encap().vlan, None);
        // The guest sends an ARP from 10.100.0.1 on VLAN 100.
        let mut arp = vec![0xff; 6];
        arp.extend_from_slice(&[2; 6]);
        arp.extend_from_slice(&[0x81, 0, 0, 100, 8, 6, 0, 1, 8, 0, 6, 4, 0, 1]);
        arp.extend_from_slice(&[2; 6]);
        arp.extend_from_slice(&[10, 100, 0, 1]);
        arp.extend_from_slice(&[0; 10]);
        port.note_guest_frame(&arp);
        t.sync(&port);
        assert_eq!(t.get(1).unwrap().encap().vlan, Some(100));
        // 10.13.0.1 was never seen by this port (a migration's
        // destination): what the table had stays.
        assert_eq!(t.get(0).unwrap().encap().vlan, Some(42));
    }
}
