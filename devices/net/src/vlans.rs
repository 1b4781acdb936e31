// SPDX-License-Identifier: Apache-2.0
//! Which VLANs the guest's own addresses use, learned from the frames its
//! NIC sends.
//!
//! A guest VLAN interface (`eth0.100`) shares the NIC's MAC; the guest's
//! RDMA stack gives its addresses RoCE GIDs, but the unmodified
//! `vmw_pvrdma` driver never tells the device a GID's VLAN: CREATE_BIND
//! always carries VLAN 0xFFF (`pvrdma_add_gid_at_index`), the address
//! vector has no VLAN field and `ah_attr.vlan_id` is never filled. The
//! guest's IP stack does say it, in every frame it sends from such an
//! address: the vmxnet3 function notes the source address and the 802.1Q
//! tag (inserted by the device for the driver's `ti`/`tci`, or in the
//! frame) of each ARP, IPv4 and IPv6 frame, and the RDMA function tags the
//! frames of the address's GIDs with what was seen.
//!
//! An address can be seen on several VLANs: an IPv6 link-local address is
//! the same on `eth0` and `eth0.100` (one MAC). [`SeenVlans`] keeps them
//! all; a frame from the address goes untagged if it was ever seen
//! untagged, else on the first VLAN it was seen on.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

/// Addresses learned at most (a guest that sends from more forgets none:
/// the later ones stay unknown, which means untagged).
const MAX_ADDRS: usize = 256;
/// VLANs kept per address.
const MAX_VLANS: usize = 4;

const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_ARP: u16 = 0x0806;
const ETH_LEN: usize = 14;

/// The VLANs one address of the guest was seen on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SeenVlans {
    /// Seen in untagged frames (or with a priority tag, VLAN 0).
    pub untagged: bool,
    /// VLAN ids seen, in the order first seen; 0 marks a free slot.
    pub tagged: [u16; MAX_VLANS],
}

impl SeenVlans {
    /// Whether the address was seen on `vlan` (`None`: untagged).
    pub fn contains(&self, vlan: Option<u16>) -> bool {
        match vlan {
            None => self.untagged,
            Some(v) => v != 0 && self.tagged.contains(&v),
        }
    }

    /// The VLAN frames from the address go on: none if it was seen
    /// untagged, else the first VLAN it was seen on.
    pub fn send_vlan(&self) -> Option<u16> {
        if self.untagged {
            return None;
        }
        self.tagged.first().copied().filter(|&v| v != 0)
    }

    /// Adds `vlan`; whether that changed anything (a full set stays as
    /// it is).
    fn add(&mut self, vlan: Option<u16>) -> bool {
        if self.contains(vlan) {
            return false;
        }
        match vlan {
            None => self.untagged = true,
            Some(v) => match self.tagged.iter_mut().find(|t| **t == 0) {
                Some(slot) => *slot = v,
                None => return false,
            },
        }
        true
    }
}

/// The table the port keeps: address -> VLANs seen, and a generation
/// that moves with every change, so that readers can cache.
#[derive(Debug, Default)]
pub(crate) struct GuestVlans {
    map: RwLock<HashMap<IpAddr, SeenVlans>>,
    generation: AtomicU64,
}

impl GuestVlans {
    pub(crate) fn note(&self, frame: &[u8]) {
        let Some((addr, vlan)) = source(frame) else {
            return;
        };
        let known = self
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&addr)
            .is_some_and(|s| s.contains(vlan));
        if known {
            return;
        }
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= MAX_ADDRS && !map.contains_key(&addr) {
            return;
        }
        if map.entry(addr).or_default().add(vlan) {
            self.generation.fetch_add(1, Ordering::Release);
            log::info!(
                "port: guest address {addr} seen on {}",
                vlan.map_or_else(|| "no VLAN".to_string(), |v| format!("VLAN {v}"))
            );
        }
    }

    pub(crate) fn get(&self, addr: IpAddr) -> Option<SeenVlans> {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&addr)
            .copied()
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(*b.get(at..)?.first_chunk()?))
}

/// The source address of an ARP, IPv4 or IPv6 frame and its VLAN (VLAN 0,
/// a priority tag, is none); `None` for other frames and unspecified
/// sources (DHCP, duplicate address detection).
fn source(frame: &[u8]) -> Option<(IpAddr, Option<u16>)> {
    let (ethertype, l3, vlan) = match be16(frame, 12)? {
        ETHERTYPE_VLAN => {
            let vid = be16(frame, ETH_LEN)? & 0x0fff;
            (be16(frame, ETH_LEN + 2)?, frame.get(ETH_LEN + 4..)?, vid)
        }
        other => (other, frame.get(ETH_LEN..)?, 0),
    };
    let addr: IpAddr = match ethertype {
        // Ethernet/IPv4 ARP: its sender protocol address.
        ETHERTYPE_ARP if l3.get(..6)? == [0, 1, 8, 0, 6, 4] => {
            Ipv4Addr::from(*l3.get(14..)?.first_chunk::<4>()?).into()
        }
        ETHERTYPE_IPV4 if l3.first()? >> 4 == 4 => {
            Ipv4Addr::from(*l3.get(12..)?.first_chunk::<4>()?).into()
        }
        ETHERTYPE_IPV6 if l3.first()? >> 4 == 6 => {
            Ipv6Addr::from(*l3.get(8..)?.first_chunk::<16>()?).into()
        }
        _ => return None,
    };
    if addr.is_unspecified() {
        return None;
    }
    Some((addr, (vlan != 0).then_some(vlan)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(vid: Option<u16>, ethertype: u16, l3: &[u8]) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&[2, 0, 0, 0, 0, 1]);
        if let Some(v) = vid {
            f.extend_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
            f.extend_from_slice(&(0x2000 | v).to_be_bytes());
        }
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(l3);
        f
    }

    fn arp(sender: [u8; 4]) -> Vec<u8> {
        let mut a = vec![0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 1];
        a.extend_from_slice(&sender);
        a.extend_from_slice(&[0; 10]);
        a
    }

    fn ipv4(src: [u8; 4]) -> Vec<u8> {
        let mut h = vec![0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0];
        h.extend_from_slice(&src);
        h.extend_from_slice(&[10, 0, 0, 9]);
        h
    }

    fn ipv6(src: Ipv6Addr) -> Vec<u8> {
        let mut h = vec![0x60, 0, 0, 0, 0, 0, 58, 255];
        h.extend_from_slice(&src.octets());
        h.extend_from_slice(&[0; 16]);
        h
    }

    #[test]
    fn learns_sources_and_their_vlans() {
        let t = GuestVlans::default();
        let a: IpAddr = Ipv4Addr::new(10, 100, 0, 1).into();
        let b: IpAddr = Ipv4Addr::new(10, 13, 0, 1).into();
        let ll: IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(t.get(a), None);
        t.note(&tagged(Some(100), ETHERTYPE_ARP, &arp([10, 100, 0, 1])));
        let g = t.generation();
        assert_eq!(t.get(a).map(|s| s.send_vlan()), Some(Some(100)));
        // Seen again the same way: nothing changes.
        t.note(&tagged(Some(100), ETHERTYPE_IPV4, &ipv4([10, 100, 0, 1])));
        assert_eq!(t.generation(), g);
        t.note(&tagged(None, ETHERTYPE_IPV4, &ipv4([10, 13, 0, 1])));
        assert!(t.generation() > g);
        let seen = t.get(b).unwrap();
        assert!(seen.contains(None) && !seen.contains(Some(100)));
        assert_eq!(seen.send_vlan(), None);
        // The link-local address on eth0 and on eth0.100: both, and
        // frames from it go untagged.
        t.note(&tagged(
            Some(100),
            ETHERTYPE_IPV6,
            &ipv6("fe80::1".parse().unwrap()),
        ));
        t.note(&tagged(
            None,
            ETHERTYPE_IPV6,
            &ipv6("fe80::1".parse().unwrap()),
        ));
        let seen = t.get(ll).unwrap();
        assert!(seen.contains(None) && seen.contains(Some(100)));
        assert!(!seen.contains(Some(200)));
        assert_eq!(seen.send_vlan(), None);
        // A priority tag is no VLAN.
        t.note(&tagged(Some(0), ETHERTYPE_IPV4, &ipv4([10, 9, 0, 1])));
        assert_eq!(
            t.get(Ipv4Addr::new(10, 9, 0, 1).into())
                .unwrap()
                .send_vlan(),
            None
        );
    }

    #[test]
    fn ignores_what_names_no_source() {
        let t = GuestVlans::default();
        for f in [
            tagged(Some(5), ETHERTYPE_IPV4, &ipv4([0, 0, 0, 0])),
            tagged(Some(5), ETHERTYPE_IPV6, &ipv6(Ipv6Addr::UNSPECIFIED)),
            tagged(Some(5), 0x8915, &[0x60; 40]),
            tagged(Some(5), ETHERTYPE_ARP, &[0, 6, 8, 0, 6, 4]),
            tagged(Some(5), ETHERTYPE_IPV4, &[0x60; 20]),
        ] {
            t.note(&f);
            for n in 0..f.len() {
                t.note(&f[..n]);
            }
        }
        assert_eq!(t.generation(), 0);
    }

    #[test]
    fn bounded() {
        let t = GuestVlans::default();
        for i in 0..MAX_ADDRS + 10 {
            let [_, _, hi, lo] = (i as u32).to_be_bytes();
            t.note(&tagged(None, ETHERTYPE_IPV4, &ipv4([10, 1, hi, lo])));
        }
        assert_eq!(t.map.read().unwrap().len(), MAX_ADDRS);
        let a: IpAddr = Ipv4Addr::new(10, 1, 0, 0).into();
        for v in 1..=10 {
            t.note(&tagged(Some(v), ETHERTYPE_IPV4, &ipv4([10, 1, 0, 0])));
        }
        let seen = t.get(a).unwrap();
        assert_eq!(seen.tagged, [1, 2, 3, 4]);
        assert!(!seen.contains(Some(5)));
    }
}
