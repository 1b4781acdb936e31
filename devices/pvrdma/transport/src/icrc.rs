// SPDX-License-Identifier: Apache-2.0
//! The invariant CRC of RoCE v2 (IBA annex A17.3.3), computed exactly as
//! Linux rxe does (`rxe_icrc.c`): CRC-32 (IEEE, reflected) seeded with
//! 0xdebb20e3, the result of hashing a masked 8-byte LRH, over the IP and
//! UDP headers with their variant fields set to all ones, the BTH with its
//! reserved/FECN/BECN byte set to all ones, then the rest of the transport
//! headers, payload and pad. The complement goes on the wire least
//! significant byte first, like an Ethernet FCS.
//!
//! RoCE v1 (annex A16) has no IP or UDP header: the ICRC covers the GRH as
//! an InfiniBand packet's does (IBA 7.8.1), with its variant fields (traffic
//! class, flow label, hop limit) set to all ones, then the same masked BTH
//! and the rest ([`icrc_v1`]; the original System Fabric Works rxe, which
//! spoke RoCE v1, masked the same bytes). An IPv6 header and a GRH have one
//! layout, so both mask the same offsets.
//!
//! Hardware and rxe check it end to end; a mismatch drops the packet
//! silently (counted), so the requester's retry recovers it.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use thiserror::Error;

use crate::opcode::BTH_LEN;

/// IPv4 header length covered by the ICRC (rxe: no options).
pub const IPV4_LEN: usize = 20;
/// IPv6 fixed header length.
pub const IPV6_LEN: usize = 40;
/// UDP header length.
pub const UDP_LEN: usize = 8;
/// Global Route Header length (RoCE v1; the layout of an IPv6 header).
pub const GRH_LEN: usize = 40;

/// Seed: CRC-32 state after 0xffffffff and eight 0xff bytes (masked LRH).
const SEED: u32 = 0xdebb_20e3;

/// Why an ICRC could not be computed.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum IcrcError {
    /// The network header is neither a 20-byte IPv4 nor a 40-byte IPv6
    /// header or GRH.
    #[error("ICRC needs a 20-byte IPv4 or 40-byte IPv6 header or GRH, got {0} bytes")]
    BadL3Len(usize),
    /// The UDP header is not 8 bytes.
    #[error("ICRC needs an 8-byte UDP header")]
    BadUdpLen,
    /// The transport part is shorter than a BTH.
    #[error("ICRC needs at least a BTH")]
    NoBth,
}

/// Raw reflected CRC-32 update (no pre/post inversion), like `crc32_le`.
/// crc32fast (SIMD where the CPU has it) keeps its state inverted.
pub fn crc32_update(crc: u32, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(!crc);
    h.update(data);
    !h.finalize()
}

/// Computes the ICRC of a RoCE v2 packet and returns the four bytes to put
/// on (or expect from) the wire. `l3` is the IPv4 or IPv6 header, `udp`
/// the UDP header, and `ib` the transport part from the BTH up to but not
/// including the ICRC (headers, payload and pad).
pub fn icrc(l3: &[u8], udp: &[u8], ib: &[u8]) -> Result<[u8; 4], IcrcError> {
    let l3_len = l3.len();
    if l3_len != IPV4_LEN && l3_len != IPV6_LEN {
        return Err(IcrcError::BadL3Len(l3_len));
    }
    if udp.len() != UDP_LEN {
        return Err(IcrcError::BadUdpLen);
    }
    let (bth, tail) = ib.split_at_checked(BTH_LEN).ok_or(IcrcError::NoBth)?;
    let mut buf = [0u8; IPV6_LEN + UDP_LEN + BTH_LEN];
    let (masked_l3, rest) = buf.split_at_mut(l3_len);
    let (masked_udp, rest) = rest.split_at_mut(UDP_LEN);
    let (masked_bth, _) = rest.split_at_mut(BTH_LEN);
    masked_l3.copy_from_slice(l3);
    masked_udp.copy_from_slice(udp);
    masked_bth.copy_from_slice(bth);
    if l3_len == IPV4_LEN {
        // IPv4: tos, ttl and header checksum.
        if let [_, tos, _, _, _, _, _, _, ttl, _, c0, c1, ..] = masked_l3 {
            for b in [tos, ttl, c0, c1] {
                *b = 0xff;
            }
        }
    } else {
        mask_ipv6_or_grh(masked_l3);
    }
    // UDP checksum, and the BTH's FECN/BECN/reserved byte.
    for b in masked_udp.get_mut(6..).into_iter().flatten() {
        *b = 0xff;
    }
    mask_bth(masked_bth);
    let pseudo_len = l3_len.saturating_add(UDP_LEN + BTH_LEN);
    let crc = crc32_update(SEED, buf.get(..pseudo_len).unwrap_or_default());
    Ok((!crc32_update(crc, tail)).to_le_bytes())
}

/// Computes the ICRC of a RoCE v1 packet: `grh` is its Global Route
/// Header (40 bytes), `ib` the transport part from the BTH up to but not
/// including the ICRC.
pub fn icrc_v1(grh: &[u8], ib: &[u8]) -> Result<[u8; 4], IcrcError> {
    if grh.len() != GRH_LEN {
        return Err(IcrcError::BadL3Len(grh.len()));
    }
    let (bth, tail) = ib.split_at_checked(BTH_LEN).ok_or(IcrcError::NoBth)?;
    let mut buf = [0u8; GRH_LEN + BTH_LEN];
    let (masked_grh, masked_bth) = buf.split_at_mut(GRH_LEN);
    masked_grh.copy_from_slice(grh);
    masked_bth.copy_from_slice(bth);
    mask_ipv6_or_grh(masked_grh);
    mask_bth(masked_bth);
    let crc = crc32_update(SEED, &buf);
    Ok((!crc32_update(crc, tail)).to_le_bytes())
}

/// The variant fields of an IPv6 header or a GRH (one layout): the low
/// nibble of the first byte (traffic class, high half), then the rest of
/// the traffic class with the flow label, and the hop limit.
fn mask_ipv6_or_grh(h: &mut [u8]) {
    if let [v, f0, f1, f2, _, _, _, hop, ..] = h {
        *v |= 0x0f;
        for b in [f0, f1, f2, hop] {
            *b = 0xff;
        }
    }
}

/// The BTH's FECN/BECN/reserved byte.
fn mask_bth(bth: &mut [u8]) {
    if let Some(resv) = bth.get_mut(4) {
        *resv = 0xff;
    }
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

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn seed_is_masked_lrh() {
        assert_eq!(crc32_update(0xffff_ffff, &[0xff; 8]), SEED);
    }

    /// A CNP captured on a ConnectX-4 Lx (published with scapy's RoCE
    /// tests): its ICRC was computed by hardware.
    #[test]
    fn matches_connectx_capture() {
        let frame = hex("e41d2dab2bc2 7cfe90643b32 0800
             45c2003c718c400040119161 0a001101 0a001201
             000012b700280000
             8100ffff4000011800000000 00000000000000000000000000000000
             82fd002a");
        let l3 = &frame[14..34];
        let udp = &frame[34..42];
        let ib = &frame[42..frame.len() - 4];
        assert_eq!(icrc(l3, udp, ib).unwrap(), [0x82, 0xfd, 0x00, 0x2a]);
    }

    /// scapy's UC SEND Only example (IPv4, pad 2): ICRC 0x78f353f3.
    #[test]
    fn matches_scapy_uc_example() {
        let l3 = hex("45010040 04784000 4011b4d5 c0a80007 c0a80007");
        let udp = hex("c00012b7002caca2");
        let mut ib = hex("2460ffff000000d300cf1710");
        ib.extend_from_slice(b"F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P\x00\x00");
        assert_eq!(icrc(&l3, &udp, &ib).unwrap(), [0x78, 0xf3, 0x53, 0xf3]);
    }

    #[test]
    fn variant_fields_do_not_matter() {
        let l3 = hex("45010040 04784000 4011b4d5 c0a80007 c0a80007");
        let udp = hex("c00012b7002caca2");
        let ib = hex("2460ffff000000d300cf1710 0102");
        let base = icrc(&l3, &udp, &ib).unwrap();
        let mut l3b = l3.clone();
        l3b[1] = 0x22; // tos
        l3b[8] = 3; // ttl
        l3b[10] = 0;
        let mut udpb = udp.clone();
        udpb[6] = 0;
        let mut ibb = ib.clone();
        ibb[4] = 0xc0; // FECN/BECN
        assert_eq!(icrc(&l3b, &udpb, &ibb).unwrap(), base);
        ibb[13] ^= 1;
        assert_ne!(icrc(&l3b, &udpb, &ibb).unwrap(), base);
    }

    /// Plain bitwise CRC-32 (zlib's: initial value and final complement
    /// all ones, reflected polynomial 0xedb88320), independent of
    /// crc32fast and of the seed constant.
    fn zlib_crc32(data: &[u8]) -> u32 {
        let mut crc = 0xffff_ffffu32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    crc >> 1 ^ 0xedb8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// A RoCE v1 RC SEND: GRH (IPv4-mapped GIDs, tclass 0x12, flow label
    /// 0xabcde, hop limit 1, next header 0x1B), BTH, 5 bytes, pad 3.
    fn v1_packet() -> (Vec<u8>, Vec<u8>) {
        let grh = hex("6 12 abcde 0018 1b 01
             00000000000000000000ffff0a000001
             00000000000000000000ffff0a000002");
        let ib = hex("04b0ffff00000011 80000007 68656c6c6f000000");
        (grh, ib)
    }

    /// The ICRC over what IBA 7.8.1 and annex A16 cover, built by hand:
    /// eight 0xff bytes for the absent LRH, the GRH with traffic class,
    /// flow label and hop limit all ones, the BTH with its reserved byte
    /// all ones, the rest as it is; zlib's CRC-32 of that, least
    /// significant byte first on the wire (as the v2 vectors above).
    #[test]
    fn v1_covers_the_masked_grh() {
        let (grh, ib) = v1_packet();
        let mut pseudo = vec![0xff; 8];
        pseudo.extend_from_slice(&grh);
        pseudo[8] = 0x6f; // version 6, traffic class high nibble masked
        pseudo[9..12].copy_from_slice(&[0xff; 3]);
        pseudo[15] = 0xff;
        pseudo.extend_from_slice(&ib);
        pseudo[8 + 40 + 4] = 0xff;
        let want = zlib_crc32(&pseudo).to_le_bytes();
        assert_eq!(icrc_v1(&grh, &ib).unwrap(), want);
        // The same check for a v2 vector: the construction agrees with
        // the ConnectX-checked computation.
        let l3 = hex("45010040 04784000 4011b4d5 c0a80007 c0a80007");
        let udp = hex("c00012b7002caca2");
        let v2_ib = hex("2460ffff000000d300cf1710 0102");
        let mut pseudo = vec![0xff; 8];
        pseudo.extend_from_slice(&l3);
        pseudo[9] = 0xff;
        pseudo[16] = 0xff;
        pseudo[18..20].copy_from_slice(&[0xff; 2]);
        pseudo.extend_from_slice(&udp);
        pseudo[34..36].copy_from_slice(&[0xff; 2]);
        pseudo.extend_from_slice(&v2_ib);
        pseudo[36 + 4] = 0xff;
        assert_eq!(
            icrc(&l3, &udp, &v2_ib).unwrap(),
            zlib_crc32(&pseudo).to_le_bytes()
        );
    }

    #[test]
    fn v1_variant_fields_do_not_matter_and_the_rest_does() {
        let (grh, ib) = v1_packet();
        let base = icrc_v1(&grh, &ib).unwrap();
        let mut g = grh.clone();
        g[0] = 0x6a; // traffic class, high nibble
        g[1] = 0x00; // traffic class low nibble, flow label
        g[3] = 0x55;
        g[7] = 64; // hop limit
        let mut b = ib.clone();
        b[4] = 0xc0; // FECN/BECN
        assert_eq!(icrc_v1(&g, &b).unwrap(), base);
        // Version, payload length, next header, GIDs and the rest count.
        for i in [0usize, 4, 5, 6, 8, 23, 24, 39] {
            let mut g = grh.clone();
            g[i] ^= 0x10;
            assert_ne!(icrc_v1(&g, &ib).unwrap(), base, "GRH byte {i}");
        }
        for i in [0usize, 3, 5, 11, 12, 19] {
            let mut b = ib.clone();
            b[i] ^= 1;
            assert_ne!(icrc_v1(&grh, &b).unwrap(), base, "transport byte {i}");
        }
        // Not the v2 ICRC of the same bytes (no UDP header, GRH not IPv6).
        let udp = hex("c00012b7 0024 0000");
        assert_ne!(icrc(&grh, &udp, &ib).unwrap(), base);
    }

    #[test]
    fn rejects_bad_lengths() {
        assert_eq!(icrc_v1(&[0; 20], &[0; 12]), Err(IcrcError::BadL3Len(20)));
        assert_eq!(icrc_v1(&[0; 40], &[0; 11]), Err(IcrcError::NoBth));
        assert_eq!(
            icrc(&[0; 19], &[0; 8], &[0; 12]),
            Err(IcrcError::BadL3Len(19))
        );
        assert_eq!(icrc(&[0; 20], &[0; 7], &[0; 12]), Err(IcrcError::BadUdpLen));
        assert_eq!(icrc(&[0; 40], &[0; 8], &[0; 11]), Err(IcrcError::NoBth));
    }
}
