// SPDX-License-Identifier: Apache-2.0
//! The link and network headers of RoCE frames: an Ethernet II frame,
//! optionally with one 802.1Q VLAN tag, then either one IP header without
//! options or extension headers and UDP to port 4791 (RoCE v2, IBA annex
//! A17), or EtherType 0x8915 and a Global Route Header (RoCE v1, annex
//! A16). How a frame is framed is its [`Encap`].
//!
//! Only what RoCE needs is accepted: anything else (IP options,
//! fragments, other protocols, stacked VLAN tags) is an error, since the
//! ICRC is defined only over the plain headers and a VMM has no business
//! reassembling a peer's fragments.
//!
//! Addresses are [`IpInfo`] whatever the version: a RoCE v1 GRH carries
//! GIDs, which [`ip_from_gid`] and [`gid_from_ip`] map to addresses and
//! back without loss.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use thiserror::Error;

pub use crate::icrc::{GRH_LEN, IPV4_LEN, IPV6_LEN, UDP_LEN};

/// Ethernet II header length (no VLAN tag).
pub const ETH_LEN: usize = 14;
/// Length of an 802.1Q tag (TPID and TCI), between the MACs and the
/// EtherType.
pub const VLAN_TAG_LEN: usize = 4;
/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// EtherType of RoCE v1 (IBTA annex A16).
pub const ETHERTYPE_ROCE_V1: u16 = 0x8915;
/// TPID of an 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// IANA UDP port of RoCE v2.
pub const ROCE_V2_PORT: u16 = 4791;
/// IP protocol number of UDP.
const IPPROTO_UDP: u8 = 17;
/// GRH next header of a packet whose BTH follows (IBA 8.3.1).
pub const GRH_NEXT_HDR_BTH: u8 = 0x1b;
/// The VLAN id bits of an 802.1Q TCI.
const VID_MASK: u16 = 0x0fff;

/// The RoCE version of a frame, which the source GID's type chooses.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum RoceVersion {
    /// EtherType 0x8915, a GRH, the BTH.
    V1,
    /// IPv4 or IPv6, UDP to port 4791, the BTH.
    #[default]
    V2,
}

/// How a frame is put on the link: its RoCE version and, if it is
/// tagged, its 802.1Q VLAN id (1 to 4094; priority 0). A received tag of
/// VLAN 0 (priority tagging only) counts as no VLAN.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Encap {
    /// RoCE v1 or v2.
    pub version: RoceVersion,
    /// The VLAN of the frame's tag; `None`: untagged.
    pub vlan: Option<u16>,
}

impl Encap {
    /// RoCE v2, untagged: what every frame was before GID types and
    /// VLANs.
    pub const V2: Encap = Encap {
        version: RoceVersion::V2,
        vlan: None,
    };

    /// Length of the Ethernet header with the tag, if any.
    const fn eth_len(self) -> usize {
        if self.vlan.is_some() {
            ETH_LEN + VLAN_TAG_LEN
        } else {
            ETH_LEN
        }
    }
}

/// A 48-bit MAC address.
pub type Mac = [u8; 6];

/// Why a network header was rejected.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum NetError {
    /// The frame ends inside a header.
    #[error("{0} header truncated")]
    Truncated(&'static str),
    /// Not IPv4, IPv6 or RoCE v1 (after one VLAN tag at most).
    #[error("EtherType {0:#06x} is neither IP nor RoCE v1")]
    NotIp(u16),
    /// A RoCE v1 GRH that is not version 6 or does not announce a BTH.
    #[error("RoCE v1 GRH: {0}")]
    BadGrh(&'static str),
    /// Version, IHL, options, fragmentation or protocol not plain IP/UDP.
    #[error("IP header not plain UDP: {0}")]
    BadIp(&'static str),
    /// The IPv4 header checksum is wrong.
    #[error("Bad IPv4 header checksum")]
    BadIpChecksum,
    /// A length field disagrees with the frame.
    #[error("{0} length field disagrees with the frame")]
    BadLength(&'static str),
    /// UDP destination port is not 4791.
    #[error("UDP port {0} is not RoCE v2")]
    NotRoce(u16),
}

/// IP addressing and the per-packet IP fields the sender controls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IpInfo {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// IPv4 TOS or IPv6 traffic class.
    pub tclass: u8,
    /// TTL or hop limit.
    pub hop_limit: u8,
    /// IPv6 flow label (ignored for IPv4).
    pub flow_label: u32,
}

/// Where the layers of a received frame are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layers {
    /// Source MAC.
    pub src_mac: Mac,
    /// Destination MAC.
    pub dst_mac: Mac,
    /// RoCE version and VLAN.
    pub encap: Encap,
    /// IP fields; for RoCE v1 the GRH's (its GIDs as addresses).
    pub ip: IpInfo,
    /// UDP source port (RoCE v2; 0 for v1).
    pub udp_sport: u16,
    /// Offset of the IP header or GRH.
    pub l3_off: usize,
    /// Length of the IP header or GRH.
    pub l3_len: usize,
    /// Offset of the transport part (the BTH).
    pub ib_off: usize,
    /// Length of the transport part, BTH to ICRC inclusive (the UDP
    /// payload, or the GRH's payload length).
    pub ib_len: usize,
}

fn be16(b: &[u8], off: usize) -> u16 {
    b.get(off..)
        .and_then(|s| s.first_chunk::<2>())
        .map_or(0, |a| u16::from_be_bytes(*a))
}

fn arr<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    b.get(off..)
        .and_then(|s| s.first_chunk::<N>())
        .copied()
        .unwrap_or([0; N])
}

/// Ones' complement sum (RFC 1071) folded to 16 bits, not complemented.
fn csum_add(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum = sum.wrapping_add(u32::from(be16(c, 0)));
        sum = (sum & 0xffff).wrapping_add(sum >> 16);
    }
    if let [last] = chunks.remainder() {
        sum = sum.wrapping_add(u32::from(*last) << 8);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff).wrapping_add(sum >> 16);
    }
    sum
}

/// The EtherType of a frame after its VLAN tag, if any, where its
/// network header starts, and the tag's VLAN (0: none).
fn ethertype(frame: &[u8]) -> Option<(u16, usize, u16)> {
    frame.get(..ETH_LEN)?;
    match be16(frame, 12) {
        ETHERTYPE_VLAN => {
            let tag = frame.get(ETH_LEN..ETH_LEN + VLAN_TAG_LEN)?;
            Some((
                be16(tag, 2),
                ETH_LEN + VLAN_TAG_LEN,
                be16(tag, 0) & VID_MASK,
            ))
        }
        other => Some((other, ETH_LEN, 0)),
    }
}

/// The destination IP of a frame we built ourselves (nothing checked
/// beyond the ethertype): where routing only needs that, without
/// [`parse_layers`]'s validation of every header. For RoCE v1, the
/// address of the GRH's destination GID.
pub fn dst_ip(frame: &[u8]) -> Option<IpAddr> {
    let (ethertype, l3_off, _) = ethertype(frame)?;
    let l3 = frame.get(l3_off..)?;
    match ethertype {
        ETHERTYPE_IPV4 => Some(Ipv4Addr::from(*l3.get(16..)?.first_chunk::<4>()?).into()),
        ETHERTYPE_IPV6 => Some(Ipv6Addr::from(*l3.get(24..)?.first_chunk::<16>()?).into()),
        ETHERTYPE_ROCE_V1 => Some(ip_from_gid(*l3.get(24..)?.first_chunk::<16>()?)),
        _ => None,
    }
}

/// Parses Ethernet (with one 802.1Q tag at most), then IP and UDP,
/// checking lengths, the IPv4 header checksum and the RoCE v2 port, or a
/// RoCE v1 GRH, checking its version, next header and payload length.
/// Trailing Ethernet padding is allowed.
pub fn parse_layers(frame: &[u8]) -> Result<Layers, NetError> {
    let eth = frame
        .get(..ETH_LEN)
        .ok_or(NetError::Truncated("Ethernet"))?;
    let (ethertype, l3_off, vid) = ethertype(frame).ok_or(NetError::Truncated("802.1Q"))?;
    let vlan = (vid != 0).then_some(vid);
    let l3 = frame.get(l3_off..).unwrap_or_default();
    if ethertype == ETHERTYPE_ROCE_V1 {
        return parse_grh(eth, l3, l3_off, vlan);
    }
    let (ip, l3_len, ip_payload_len) = match ethertype {
        ETHERTYPE_IPV4 => {
            let h = l3.get(..IPV4_LEN).ok_or(NetError::Truncated("IPv4"))?;
            if arr::<1>(h, 0) != [0x45] {
                return Err(NetError::BadIp("version/IHL (options unsupported)"));
            }
            if be16(h, 6) & 0x3fff != 0 {
                return Err(NetError::BadIp("fragment"));
            }
            if arr::<1>(h, 9) != [IPPROTO_UDP] {
                return Err(NetError::BadIp("protocol"));
            }
            if csum_add(0, h) != 0xffff {
                return Err(NetError::BadIpChecksum);
            }
            let total = usize::from(be16(h, 2));
            let payload = total
                .checked_sub(IPV4_LEN)
                .ok_or(NetError::BadLength("IPv4"))?;
            let ip = IpInfo {
                src: Ipv4Addr::from(arr::<4>(h, 12)).into(),
                dst: Ipv4Addr::from(arr::<4>(h, 16)).into(),
                tclass: arr::<1>(h, 1)[0],
                hop_limit: arr::<1>(h, 8)[0],
                flow_label: 0,
            };
            (ip, IPV4_LEN, payload)
        }
        ETHERTYPE_IPV6 => {
            let h = l3.get(..IPV6_LEN).ok_or(NetError::Truncated("IPv6"))?;
            let w0 = u32::from_be_bytes(arr(h, 0));
            if w0 >> 28 != 6 {
                return Err(NetError::BadIp("version"));
            }
            if arr::<1>(h, 6) != [IPPROTO_UDP] {
                return Err(NetError::BadIp("next header"));
            }
            let ip = IpInfo {
                src: Ipv6Addr::from(arr::<16>(h, 8)).into(),
                dst: Ipv6Addr::from(arr::<16>(h, 24)).into(),
                tclass: ((w0 >> 20) & 0xff) as u8,
                hop_limit: arr::<1>(h, 7)[0],
                flow_label: w0 & 0xf_ffff,
            };
            (ip, IPV6_LEN, usize::from(be16(h, 4)))
        }
        other => return Err(NetError::NotIp(other)),
    };
    let ip_payload = l3
        .get(l3_len..)
        .and_then(|p| p.get(..ip_payload_len))
        .ok_or(NetError::BadLength("IP"))?;
    let udp = ip_payload
        .get(..UDP_LEN)
        .ok_or(NetError::Truncated("UDP"))?;
    let dport = be16(udp, 2);
    if dport != ROCE_V2_PORT {
        return Err(NetError::NotRoce(dport));
    }
    let udp_len = usize::from(be16(udp, 4));
    if udp_len != ip_payload_len {
        return Err(NetError::BadLength("UDP"));
    }
    let l3_end = l3_off.saturating_add(l3_len);
    Ok(Layers {
        dst_mac: arr(eth, 0),
        src_mac: arr(eth, 6),
        encap: Encap {
            version: RoceVersion::V2,
            vlan,
        },
        ip,
        udp_sport: be16(udp, 0),
        l3_off,
        l3_len,
        ib_off: l3_end.saturating_add(UDP_LEN),
        ib_len: udp_len.saturating_sub(UDP_LEN),
    })
}

/// The layers of a RoCE v1 frame: `l3`, at `l3_off` of the frame, starts
/// with its GRH (IBA 8.3: version 6, the next header a BTH, the payload
/// length counting the transport part up to its ICRC).
fn parse_grh(eth: &[u8], l3: &[u8], l3_off: usize, vlan: Option<u16>) -> Result<Layers, NetError> {
    let h = l3.get(..GRH_LEN).ok_or(NetError::Truncated("GRH"))?;
    let w0 = u32::from_be_bytes(arr(h, 0));
    if w0 >> 28 != 6 {
        return Err(NetError::BadGrh("version"));
    }
    if arr::<1>(h, 6) != [GRH_NEXT_HDR_BTH] {
        return Err(NetError::BadGrh("next header"));
    }
    let ib_len = usize::from(be16(h, 4));
    l3.get(GRH_LEN..)
        .and_then(|p| p.get(..ib_len))
        .ok_or(NetError::BadLength("GRH"))?;
    Ok(Layers {
        dst_mac: arr(eth, 0),
        src_mac: arr(eth, 6),
        encap: Encap {
            version: RoceVersion::V1,
            vlan,
        },
        ip: IpInfo {
            src: ip_from_gid(arr(h, 8)),
            dst: ip_from_gid(arr(h, 24)),
            tclass: ((w0 >> 20) & 0xff) as u8,
            hop_limit: arr::<1>(h, 7)[0],
            flow_label: w0 & 0xf_ffff,
        },
        udp_sport: 0,
        l3_off,
        l3_len: GRH_LEN,
        ib_off: l3_off.saturating_add(GRH_LEN),
        ib_len,
    })
}

/// Length of the headers in front of the transport part for this
/// addressing and framing: Ethernet (with its tag), then IP and UDP, or
/// the GRH.
pub fn headers_len(ip: &IpInfo, encap: Encap) -> usize {
    let l3 = match (encap.version, ip.dst) {
        (RoceVersion::V1, _) => GRH_LEN,
        (RoceVersion::V2, IpAddr::V4(_)) => IPV4_LEN + UDP_LEN,
        (RoceVersion::V2, IpAddr::V6(_)) => IPV6_LEN + UDP_LEN,
    };
    encap.eth_len().saturating_add(l3)
}

/// Writes the headers in front of the transport part at
/// `frame[headers_len(ip, encap)..]` (BTH to ICRC inclusive): Ethernet
/// with the VLAN tag `encap` asks for, then IP and UDP (RoCE v2) or the GRH
/// (RoCE v1, the GIDs of `ip`'s addresses). The UDP checksum is left 0;
/// for IPv6 call [`finish_udp6_checksum`] once the ICRC is in.
pub fn write_headers(
    frame: &mut [u8],
    src_mac: Mac,
    dst_mac: Mac,
    ip: &IpInfo,
    udp_sport: u16,
    encap: Encap,
) -> Result<(), NetError> {
    let hl = headers_len(ip, encap);
    let ib_len = frame
        .len()
        .checked_sub(hl)
        .ok_or(NetError::BadLength("frame"))?;
    let (eth, rest) = frame
        .split_at_mut_checked(encap.eth_len())
        .ok_or(NetError::Truncated("Ethernet"))?;
    let mut w = Writer(eth, 0);
    w.put(&dst_mac);
    w.put(&src_mac);
    if let Some(vid) = encap.vlan {
        w.put(&ETHERTYPE_VLAN.to_be_bytes());
        w.put(&(vid & VID_MASK).to_be_bytes());
    }
    if encap.version == RoceVersion::V1 {
        w.put(&ETHERTYPE_ROCE_V1.to_be_bytes());
        let paylen = u16::try_from(ib_len).map_err(|_| NetError::BadLength("GRH"))?;
        let grh = rest.get_mut(..GRH_LEN).ok_or(NetError::Truncated("GRH"))?;
        let w0 = 6u32 << 28 | u32::from(ip.tclass) << 20 | ip.flow_label & 0xf_ffff;
        let mut w = Writer(grh, 0);
        w.put(&w0.to_be_bytes());
        w.put(&paylen.to_be_bytes());
        w.put(&[GRH_NEXT_HDR_BTH, ip.hop_limit]);
        w.put(&gid_from_ip(ip.src));
        w.put(&gid_from_ip(ip.dst));
        return Ok(());
    }
    let udp_len = ib_len
        .checked_add(UDP_LEN)
        .and_then(|l| u16::try_from(l).ok())
        .ok_or(NetError::BadLength("frame"))?;
    let rest = match (ip.src, ip.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            w.put(&ETHERTYPE_IPV4.to_be_bytes());
            let (l3, rest) = rest
                .split_at_mut_checked(IPV4_LEN)
                .ok_or(NetError::Truncated("IPv4"))?;
            let total = udp_len
                .checked_add(IPV4_LEN as u16)
                .ok_or(NetError::BadLength("IPv4"))?;
            let mut w = Writer(l3, 0);
            w.put(&[0x45, ip.tclass]);
            w.put(&total.to_be_bytes());
            w.put(&[0, 0, 0x40, 0]); // id 0, DF (RFC 6864)
            w.put(&[ip.hop_limit, IPPROTO_UDP, 0, 0]);
            w.put(&s.octets());
            w.put(&d.octets());
            let c = !(csum_add(0, l3) as u16);
            Writer(l3, 10).put(&c.to_be_bytes());
            rest
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            w.put(&ETHERTYPE_IPV6.to_be_bytes());
            let (l3, rest) = rest
                .split_at_mut_checked(IPV6_LEN)
                .ok_or(NetError::Truncated("IPv6"))?;
            let w0 = 6u32 << 28 | u32::from(ip.tclass) << 20 | ip.flow_label & 0xf_ffff;
            let mut w = Writer(l3, 0);
            w.put(&w0.to_be_bytes());
            w.put(&udp_len.to_be_bytes());
            w.put(&[IPPROTO_UDP, ip.hop_limit]);
            w.put(&s.octets());
            w.put(&d.octets());
            rest
        }
        _ => return Err(NetError::BadIp("mixed IPv4/IPv6 addresses")),
    };
    let mut w = Writer(rest, 0);
    w.put(&udp_sport.to_be_bytes());
    w.put(&ROCE_V2_PORT.to_be_bytes());
    w.put(&udp_len.to_be_bytes());
    w.put(&[0, 0]);
    Ok(())
}

/// Fills in the UDP checksum of an IPv6 frame built by [`write_headers`]
/// (mandatory for IPv6, RFC 8200 8.1); call it after the ICRC is written.
/// IPv4 frames keep checksum 0 as rxe sends them; RoCE v1 has no UDP.
pub fn finish_udp6_checksum(frame: &mut [u8]) {
    let Some((ETHERTYPE_IPV6, l3_off, _)) = ethertype(frame) else {
        return;
    };
    let Some((head, udp)) = frame.split_at_mut_checked(l3_off.saturating_add(IPV6_LEN)) else {
        return;
    };
    let addrs = head.get(l3_off.saturating_add(8)..).unwrap_or_default();
    let len = u32::try_from(udp.len()).unwrap_or(0);
    let mut sum = csum_add(0, addrs);
    sum = csum_add(sum, &len.to_be_bytes());
    sum = csum_add(sum, &[0, 0, 0, IPPROTO_UDP]);
    sum = csum_add(sum, udp);
    let c = match !(sum as u16) {
        0 => 0xffff,
        c => c,
    };
    Writer(udp, 6).put(&c.to_be_bytes());
}

/// A cursor writing into a slice it never overruns (short writes are
/// impossible by construction: every caller split the slice to size).
struct Writer<'a>(&'a mut [u8], usize);

impl Writer<'_> {
    fn put(&mut self, v: &[u8]) {
        if let Some(dst) = self.0.get_mut(self.1..).and_then(|s| s.get_mut(..v.len())) {
            dst.copy_from_slice(v);
        }
        self.1 = self.1.saturating_add(v.len());
    }
}

/// The 40 bytes a UD receive of a frame with `layers` places before the
/// payload (the GRH area, IBA 11.4.1.2): for RoCE v1 its GRH; for RoCE v2
/// the IPv6 header over IPv6, or zeros and the IPv4 header in the last 20
/// bytes over IPv4 (as rxe does and `ibv_init_ah_from_wc` expects,
/// checksum included). `payload_len` sets the IP length fields; a GRH
/// keeps the frame's own payload length.
pub fn grh(layers: &Layers, payload_len: u16) -> [u8; GRH_LEN] {
    let mut out = [0u8; GRH_LEN];
    let ip = &layers.ip;
    // The headers alone, untagged: the area holds no link header.
    let encap = Encap {
        version: layers.encap.version,
        vlan: None,
    };
    let ib_len = match encap.version {
        RoceVersion::V1 => layers.ib_len,
        RoceVersion::V2 => usize::from(payload_len),
    };
    let hl = headers_len(ip, encap);
    let mut frame = vec![0u8; hl.saturating_add(ib_len)];
    if write_headers(&mut frame, [0; 6], [0; 6], ip, 0, encap).is_ok() {
        let l3_end = match encap.version {
            RoceVersion::V1 => hl,
            RoceVersion::V2 => hl.saturating_sub(UDP_LEN),
        };
        let l3 = frame.get(ETH_LEN..l3_end).unwrap_or_default();
        let at = GRH_LEN.saturating_sub(l3.len());
        if let Some(dst) = out.get_mut(at..) {
            if dst.len() == l3.len() {
                dst.copy_from_slice(l3);
            }
        }
    }
    out
}

/// IP address of a RoCE v2 GID: IPv4-mapped GIDs (::ffff:a.b.c.d) are IPv4.
pub fn ip_from_gid(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// GID of an IP address (IPv4 becomes IPv4-mapped).
pub fn gid_from_ip(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// UDP source port for a QP, as rxe chooses it: 0xc000 plus 14 bits of
/// `hash_32(qpn)` (golden-ratio multiplicative hash), so flows spread over
/// ECMP paths while staying stable per QP.
pub fn udp_sport_for_qpn(qpn: u32) -> u16 {
    let hash = qpn.wrapping_mul(0x61c8_8647) >> (32 - 14);
    0xc000 | (hash & 0x3fff) as u16
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

    fn v4() -> IpInfo {
        IpInfo {
            src: Ipv4Addr::new(192, 168, 0, 7).into(),
            dst: Ipv4Addr::new(10, 0, 0, 1).into(),
            tclass: 0x1,
            hop_limit: 64,
            flow_label: 0,
        }
    }

    #[test]
    fn v4_roundtrip() {
        let mut f = vec![0u8; ETH_LEN + IPV4_LEN + UDP_LEN + 16];
        write_headers(&mut f, [2; 6], [3; 6], &v4(), 0xc123, Encap::V2).unwrap();
        let l = parse_layers(&f).unwrap();
        assert_eq!(
            (l.src_mac, l.dst_mac, l.ip, l.udp_sport),
            ([2; 6], [3; 6], v4(), 0xc123)
        );
        assert_eq!(
            (l.l3_off, l.l3_len, l.ib_off, l.ib_len, l.encap),
            (14, 20, 42, 16, Encap::V2)
        );
        // Corrupt the IP checksum.
        f[24] ^= 1;
        assert_eq!(parse_layers(&f), Err(NetError::BadIpChecksum));
    }

    #[test]
    fn v6_roundtrip_and_udp_checksum() {
        let ip = IpInfo {
            src: "fe80::1".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
            tclass: 3,
            hop_limit: 255,
            flow_label: 0xabcde,
        };
        let mut f = vec![0u8; ETH_LEN + IPV6_LEN + UDP_LEN + 5];
        f[ETH_LEN + IPV6_LEN + UDP_LEN..].copy_from_slice(b"hello");
        write_headers(&mut f, [2; 6], [3; 6], &ip, 1, Encap::V2).unwrap();
        finish_udp6_checksum(&mut f);
        let l = parse_layers(&f).unwrap();
        assert_eq!(l.ip, ip);
        // The checksum verifies: sum over pseudo header + UDP is 0xffff.
        let udp = &f[ETH_LEN + IPV6_LEN..];
        let mut sum = csum_add(0, &f[ETH_LEN + 8..ETH_LEN + 40]);
        sum = csum_add(sum, &(udp.len() as u32).to_be_bytes());
        sum = csum_add(sum, &[0, 0, 0, 17]);
        assert_eq!(csum_add(sum, udp), 0xffff);
    }

    #[test]
    fn rejects_non_roce_and_short() {
        let mut f = vec![0u8; ETH_LEN + IPV4_LEN + UDP_LEN + 4];
        write_headers(&mut f, [0; 6], [0; 6], &v4(), 1, Encap::V2).unwrap();
        for n in 0..f.len() {
            assert!(parse_layers(&f[..n]).is_err(), "prefix {n}");
        }
        f[ETH_LEN + IPV4_LEN + 3] = 1; // dport 4791 -> 4609
        assert!(matches!(parse_layers(&f), Err(NetError::NotRoce(_))));
        f[12] = 0x88;
        assert!(matches!(parse_layers(&f), Err(NetError::NotIp(_))));
    }

    fn grh_info() -> IpInfo {
        IpInfo {
            src: "fe80::1".parse().unwrap(),
            dst: Ipv4Addr::new(10, 0, 0, 2).into(),
            tclass: 0x12,
            hop_limit: 1,
            flow_label: 0xabcde,
        }
    }

    const V1: Encap = Encap {
        version: RoceVersion::V1,
        vlan: None,
    };

    #[test]
    fn v1_roundtrip() {
        let ip = grh_info();
        let mut f = vec![0u8; ETH_LEN + GRH_LEN + 16];
        assert_eq!(headers_len(&ip, V1), ETH_LEN + GRH_LEN);
        write_headers(&mut f, [2; 6], [3; 6], &ip, 0xc123, V1).unwrap();
        assert_eq!(&f[12..14], &[0x89, 0x15]);
        assert_eq!(
            &f[14..22],
            &[0x61, 0x2a, 0xbc, 0xde, 0, 16, 0x1b, 1],
            "version 6, traffic class, flow label, payload length, next header BTH, hop limit"
        );
        assert_eq!(&f[22..38], &gid_from_ip(ip.src));
        assert_eq!(&f[38..54], &gid_from_ip(ip.dst));
        let l = parse_layers(&f).unwrap();
        assert_eq!(
            (l.src_mac, l.dst_mac, l.ip, l.encap),
            ([2; 6], [3; 6], ip, V1)
        );
        assert_eq!(
            (l.l3_off, l.l3_len, l.ib_off, l.ib_len, l.udp_sport),
            (14, 40, 54, 16, 0)
        );
        assert_eq!(dst_ip(&f), Some(ip.dst));
        // Ethernet padding after the payload is allowed.
        f.extend_from_slice(&[0; 6]);
        assert_eq!(parse_layers(&f).unwrap().ib_len, 16);
    }

    #[test]
    fn hostile_grh_is_refused() {
        let mut f = vec![0u8; ETH_LEN + GRH_LEN + 16];
        write_headers(&mut f, [2; 6], [3; 6], &grh_info(), 0, V1).unwrap();
        for n in 0..f.len() {
            assert!(parse_layers(&f[..n]).is_err(), "prefix {n}");
        }
        let mut g = f.clone();
        g[14] = 0x41; // version 4
        assert_eq!(parse_layers(&g), Err(NetError::BadGrh("version")));
        let mut g = f.clone();
        g[20] = 17; // next header UDP
        assert_eq!(parse_layers(&g), Err(NetError::BadGrh("next header")));
        let mut g = f.clone();
        g[18..20].copy_from_slice(&17u16.to_be_bytes()); // longer than the frame
        assert_eq!(parse_layers(&g), Err(NetError::BadLength("GRH")));
        g[18..20].copy_from_slice(&0xffffu16.to_be_bytes());
        assert_eq!(parse_layers(&g), Err(NetError::BadLength("GRH")));
        // A payload that does not fit the GRH's 16 bits cannot be written.
        let mut big = vec![0u8; ETH_LEN + GRH_LEN + 0x1_0000];
        assert_eq!(
            write_headers(&mut big, [0; 6], [0; 6], &grh_info(), 0, V1),
            Err(NetError::BadLength("GRH"))
        );
    }

    #[test]
    fn vlan_tags_roundtrip_for_v1_and_v2() {
        let v6 = IpInfo {
            src: "2001:db8::1".parse().unwrap(),
            dst: "2001:db8::2".parse().unwrap(),
            tclass: 0,
            hop_limit: 64,
            flow_label: 0,
        };
        for (ip, version) in [
            (v4(), RoceVersion::V2),
            (v6, RoceVersion::V2),
            (grh_info(), RoceVersion::V1),
        ] {
            let encap = Encap {
                version,
                vlan: Some(100),
            };
            let untagged = headers_len(
                &ip,
                Encap {
                    vlan: None,
                    ..encap
                },
            );
            assert_eq!(headers_len(&ip, encap), untagged + VLAN_TAG_LEN);
            let mut f = vec![0u8; headers_len(&ip, encap) + 16];
            write_headers(&mut f, [2; 6], [3; 6], &ip, 7, encap).unwrap();
            assert_eq!(&f[12..16], &[0x81, 0x00, 0x00, 100], "TPID, PCP 0, VID 100");
            finish_udp6_checksum(&mut f);
            let l = parse_layers(&f).unwrap();
            assert_eq!((l.encap, l.ip, l.l3_off), (encap, ip, 18));
            assert_eq!((l.ib_off, l.ib_len), (f.len() - 16, 16));
            assert_eq!(dst_ip(&f), Some(ip.dst));
            // The same frame without its tag: the same layers 4 bytes on.
            let mut plain = f[..12].to_vec();
            plain.extend_from_slice(&f[16..]);
            let p = parse_layers(&plain).unwrap();
            assert_eq!((p.encap.vlan, p.ip, p.l3_off), (None, ip, 14));
            // A priority tag (VLAN 0) is no VLAN; PCP and DEI are ignored.
            let mut g = f.clone();
            g[14..16].copy_from_slice(&0xe000u16.to_be_bytes());
            assert_eq!(parse_layers(&g).unwrap().encap.vlan, None);
            g[14..16].copy_from_slice(&0xf064u16.to_be_bytes());
            assert_eq!(parse_layers(&g).unwrap().encap.vlan, Some(100));
            // A second tag (QinQ) or another protocol behind the tag.
            let mut g = f.clone();
            g[16..18].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
            assert_eq!(parse_layers(&g), Err(NetError::NotIp(ETHERTYPE_VLAN)));
            for n in 0..f.len() {
                assert!(parse_layers(&f[..n]).is_err(), "{version:?} prefix {n}");
            }
        }
    }

    #[test]
    fn tagged_ipv6_frames_get_their_udp_checksum() {
        let ip = IpInfo {
            src: "fe80::1".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
            tclass: 0,
            hop_limit: 64,
            flow_label: 0,
        };
        let encap = Encap {
            version: RoceVersion::V2,
            vlan: Some(7),
        };
        let hl = headers_len(&ip, encap);
        let mut f = vec![0u8; hl + 5];
        f[hl..].copy_from_slice(b"hello");
        write_headers(&mut f, [2; 6], [3; 6], &ip, 1, encap).unwrap();
        finish_udp6_checksum(&mut f);
        let l3 = ETH_LEN + VLAN_TAG_LEN;
        let udp = &f[l3 + IPV6_LEN..];
        let mut sum = csum_add(0, &f[l3 + 8..l3 + 40]);
        sum = csum_add(sum, &(udp.len() as u32).to_be_bytes());
        sum = csum_add(sum, &[0, 0, 0, 17]);
        assert_eq!(csum_add(sum, udp), 0xffff);
        // Nothing to do for RoCE v1.
        let mut v1 = vec![0u8; headers_len(&ip, V1) + 5];
        write_headers(&mut v1, [2; 6], [3; 6], &ip, 1, V1).unwrap();
        let before = v1.clone();
        finish_udp6_checksum(&mut v1);
        assert_eq!(v1, before);
    }

    #[test]
    fn grh_area_of_each_version() {
        // RoCE v1: the GRH as it came (its own payload length).
        let ip = grh_info();
        let mut f = vec![0u8; headers_len(&ip, V1) + 24];
        write_headers(&mut f, [2; 6], [3; 6], &ip, 0, V1).unwrap();
        let l = parse_layers(&f).unwrap();
        assert_eq!(&grh(&l, 8)[..], &f[ETH_LEN..ETH_LEN + GRH_LEN]);
        // A tag changes nothing in the area.
        let tagged = Layers {
            encap: Encap {
                vlan: Some(5),
                ..l.encap
            },
            ..l
        };
        assert_eq!(grh(&tagged, 8), grh(&l, 8));
        // RoCE v2 over IPv4: zeros, then the IPv4 header.
        let mut f = vec![0u8; headers_len(&v4(), Encap::V2) + 8];
        write_headers(&mut f, [2; 6], [3; 6], &v4(), 0, Encap::V2).unwrap();
        let l = parse_layers(&f).unwrap();
        let area = grh(&l, 8);
        assert_eq!(&area[..20], &[0; 20]);
        assert_eq!(&area[20..], &f[ETH_LEN..ETH_LEN + IPV4_LEN]);
    }

    #[test]
    fn gid_and_port_mapping() {
        let ip: IpAddr = Ipv4Addr::new(10, 1, 2, 3).into();
        assert_eq!(ip_from_gid(gid_from_ip(ip)), ip);
        let ip6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(ip_from_gid(gid_from_ip(ip6)), ip6);
        // hash_32(17, 14) = (17 * 0x61c88647) >> 18.
        assert_eq!(
            udp_sport_for_qpn(17),
            0xc000 | ((17u32.wrapping_mul(0x61c8_8647) >> 18) as u16)
        );
        assert!(udp_sport_for_qpn(u32::MAX) >= 0xc000);
    }
}
