// SPDX-License-Identifier: Apache-2.0
//! Ethernet, IPv4, IPv6 and UDP headers as RoCE v2 uses them (IBA annex
//! A17): one Ethernet II frame, one IP header without options or extension
//! headers, UDP to port 4791.
//!
//! Only what RoCE v2 needs is accepted: anything else (IP options,
//! fragments, other protocols) is an error, since the ICRC is defined only
//! over the plain headers and a VMM has no business reassembling a peer's
//! fragments.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use thiserror::Error;

pub use crate::icrc::{IPV4_LEN, IPV6_LEN, UDP_LEN};

/// Ethernet II header length (no VLAN tag).
pub const ETH_LEN: usize = 14;
/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// IANA UDP port of RoCE v2.
pub const ROCE_V2_PORT: u16 = 4791;
/// IP protocol number of UDP.
const IPPROTO_UDP: u8 = 17;

/// A 48-bit MAC address.
pub type Mac = [u8; 6];

/// Why a network header was rejected.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum NetError {
    /// The frame ends inside a header.
    #[error("{0} header truncated")]
    Truncated(&'static str),
    /// Not IPv4 or IPv6.
    #[error("EtherType {0:#06x} is not IP")]
    NotIp(u16),
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
    /// IP fields.
    pub ip: IpInfo,
    /// UDP source port.
    pub udp_sport: u16,
    /// Offset of the IP header.
    pub l3_off: usize,
    /// Length of the IP header.
    pub l3_len: usize,
    /// Length of the UDP payload (BTH to ICRC inclusive).
    pub udp_payload_len: usize,
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

/// The destination IP of a frame we built ourselves (nothing checked
/// beyond the ethertype): where routing only needs that, without
/// [`parse_layers`]'s validation of every header.
pub fn dst_ip(frame: &[u8]) -> Option<IpAddr> {
    let l3 = frame.get(ETH_LEN..)?;
    match be16(frame, 12) {
        ETHERTYPE_IPV4 => Some(Ipv4Addr::from(*l3.get(16..)?.first_chunk::<4>()?).into()),
        ETHERTYPE_IPV6 => Some(Ipv6Addr::from(*l3.get(24..)?.first_chunk::<16>()?).into()),
        _ => None,
    }
}

/// Parses Ethernet, IP and UDP, checking lengths, the IPv4 header checksum
/// and the RoCE v2 port. Trailing Ethernet padding is allowed.
pub fn parse_layers(frame: &[u8]) -> Result<Layers, NetError> {
    let eth = frame
        .get(..ETH_LEN)
        .ok_or(NetError::Truncated("Ethernet"))?;
    let ethertype = be16(eth, 12);
    let l3 = frame.get(ETH_LEN..).unwrap_or_default();
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
    Ok(Layers {
        dst_mac: arr(eth, 0),
        src_mac: arr(eth, 6),
        ip,
        udp_sport: be16(udp, 0),
        l3_off: ETH_LEN,
        l3_len,
        udp_payload_len: udp_len.saturating_sub(UDP_LEN),
    })
}

/// Length of Ethernet + IP + UDP headers for this addressing.
pub fn headers_len(ip: &IpInfo) -> usize {
    match ip.dst {
        IpAddr::V4(_) => ETH_LEN + IPV4_LEN + UDP_LEN,
        IpAddr::V6(_) => ETH_LEN + IPV6_LEN + UDP_LEN,
    }
}

/// Writes Ethernet, IP and UDP headers in front of the transport part at
/// `frame[headers_len(ip)..]` (BTH to ICRC inclusive). The UDP checksum is
/// left 0; for IPv6 call [`finish_udp6_checksum`] once the ICRC is in.
pub fn write_headers(
    frame: &mut [u8],
    src_mac: Mac,
    dst_mac: Mac,
    ip: &IpInfo,
    udp_sport: u16,
) -> Result<(), NetError> {
    let hl = headers_len(ip);
    let udp_len = frame
        .len()
        .checked_sub(hl)
        .and_then(|l| l.checked_add(UDP_LEN))
        .and_then(|l| u16::try_from(l).ok())
        .ok_or(NetError::BadLength("frame"))?;
    let (eth, rest) = frame
        .split_at_mut_checked(ETH_LEN)
        .ok_or(NetError::Truncated("Ethernet"))?;
    let mut w = Writer(eth, 0);
    w.put(&dst_mac);
    w.put(&src_mac);
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
/// IPv4 frames keep checksum 0 as rxe sends them.
pub fn finish_udp6_checksum(frame: &mut [u8]) {
    if be16(frame, 12) != ETHERTYPE_IPV6 {
        return;
    }
    let Some((head, udp)) = frame.split_at_mut_checked(ETH_LEN + IPV6_LEN) else {
        return;
    };
    let addrs = head.get(ETH_LEN + 8..).unwrap_or_default();
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

/// Length of the GRH area at the start of a UD receive buffer (IBA 11.4.1.2).
pub const GRH_LEN: usize = 40;

/// The 40 bytes a UD receive places before the payload: the IPv6 header
/// for RoCE v2 over IPv6, or zeros and the IPv4 header in the last 20
/// bytes over IPv4 (as rxe does and `ibv_init_ah_from_wc` expects, checksum
/// included). `payload_len` sets the IP length fields.
pub fn grh(ip: &IpInfo, payload_len: u16) -> [u8; GRH_LEN] {
    let mut out = [0u8; GRH_LEN];
    let hl = headers_len(ip);
    let mut frame = vec![0u8; hl.saturating_add(usize::from(payload_len))];
    if write_headers(&mut frame, [0; 6], [0; 6], ip, 0).is_ok() {
        let l3 = frame
            .get(ETH_LEN..hl.saturating_sub(UDP_LEN))
            .unwrap_or_default();
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
        write_headers(&mut f, [2; 6], [3; 6], &v4(), 0xc123).unwrap();
        let l = parse_layers(&f).unwrap();
        assert_eq!(
            (l.src_mac, l.dst_mac, l.ip, l.udp_sport),
            ([2; 6], [3; 6], v4(), 0xc123)
        );
        assert_eq!((l.l3_off, l.l3_len, l.udp_payload_len), (14, 20, 16));
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
        write_headers(&mut f, [2; 6], [3; 6], &ip, 1).unwrap();
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
        write_headers(&mut f, [0; 6], [0; 6], &v4(), 1).unwrap();
        for n in 0..f.len() {
            assert!(parse_layers(&f[..n]).is_err(), "prefix {n}");
        }
        f[ETH_LEN + IPV4_LEN + 3] = 1; // dport 4791 -> 4609
        assert!(matches!(parse_layers(&f), Err(NetError::NotRoce(_))));
        f[12] = 0x88;
        assert!(matches!(parse_layers(&f), Err(NetError::NotIp(_))));
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
