// SPDX-License-Identifier: Apache-2.0
//! The RoCE v2 invariant CRC (IBA annex A17.3.3), computed exactly as
//! Linux rxe does (`rxe_icrc.c`): CRC-32 (IEEE, reflected) seeded with
//! 0xdebb20e3, the result of hashing a masked 8-byte LRH, over the IP and
//! UDP headers with their variant fields set to all ones, the BTH with its
//! reserved/FECN/BECN byte set to all ones, then the rest of the transport
//! headers, payload and pad. The complement goes on the wire least
//! significant byte first, like an Ethernet FCS.
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

/// Seed: CRC-32 state after 0xffffffff and eight 0xff bytes (masked LRH).
const SEED: u32 = 0xdebb_20e3;

/// Why an ICRC could not be computed.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum IcrcError {
    /// The network header is neither a 20-byte IPv4 nor a 40-byte IPv6 one.
    #[error("ICRC needs a 20-byte IPv4 or 40-byte IPv6 header, got {0} bytes")]
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
    match masked_l3 {
        // IPv4: tos, ttl and header checksum.
        [_, tos, _, _, _, _, _, _, ttl, _, c0, c1, ..] if l3_len == IPV4_LEN => {
            for b in [tos, ttl, c0, c1] {
                *b = 0xff;
            }
        }
        // IPv6: priority nibble, flow label (with the rest of the traffic
        // class), hop limit.
        [v, f0, f1, f2, _, _, _, hop, ..] => {
            *v |= 0x0f;
            for b in [f0, f1, f2, hop] {
                *b = 0xff;
            }
        }
        _ => return Err(IcrcError::BadL3Len(l3_len)),
    }
    // UDP checksum, and the BTH's FECN/BECN/reserved byte.
    for b in masked_udp.get_mut(6..).into_iter().flatten() {
        *b = 0xff;
    }
    if let Some(resv) = masked_bth.get_mut(4) {
        *resv = 0xff;
    }
    let pseudo_len = l3_len.saturating_add(UDP_LEN + BTH_LEN);
    let crc = crc32_update(SEED, buf.get(..pseudo_len).unwrap_or_default());
    Ok((!crc32_update(crc, tail)).to_le_bytes())
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

    #[test]
    fn rejects_bad_lengths() {
        assert_eq!(
            icrc(&[0; 19], &[0; 8], &[0; 12]),
            Err(IcrcError::BadL3Len(19))
        );
        assert_eq!(icrc(&[0; 20], &[0; 7], &[0; 12]), Err(IcrcError::BadUdpLen));
        assert_eq!(icrc(&[0; 40], &[0; 8], &[0; 11]), Err(IcrcError::NoBth));
    }
}
