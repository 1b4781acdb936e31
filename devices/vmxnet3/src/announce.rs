// SPDX-License-Identifier: Apache-2.0
//! Telling the network where the guest went after a migration: until the
//! guest itself sends a frame, bridges and switches still deliver its
//! traffic to the port it left. A restored device therefore sends
//! [`ANNOUNCE_COUNT`] frames from its MAC when it resumes, as QEMU's
//! NICs do (`qemu_announce_self`): broadcast RARP requests, which every
//! switch learns from and no host answers.

/// Frames per announcement, back to back: one may be lost while the
/// host's bridge is still adding the new port.
pub(crate) const ANNOUNCE_COUNT: usize = 3;
/// The Ethernet minimum (without FCS); the rest is zero padding.
const FRAME_LEN: usize = 60;
/// `ETH_P_RARP`.
const ETHERTYPE_RARP: u16 = 0x8035;
/// ARP hardware type Ethernet, protocol type IPv4, and their address lengths.
const HTYPE_ETHERNET: u16 = 1;
const PTYPE_IPV4: u16 = 0x0800;
const HLEN: u8 = 6;
const PLEN: u8 = 4;
/// RARP "request reverse" (RFC 903).
const OP_REQUEST_REVERSE: u16 = 3;

/// The announcement of `mac`: a broadcast RARP "request reverse" from
/// `mac` about `mac` (sender and target hardware address), both IPv4
/// addresses 0, zero-padded to 60 bytes.
pub(crate) fn rarp_announcement(mac: [u8; 6]) -> [u8; FRAME_LEN] {
    let no_ip = [0u8; 4];
    let fields: [&[u8]; 11] = [
        // Ethernet: destination, source, EtherType.
        &[0xff; 6],
        &mac,
        &ETHERTYPE_RARP.to_be_bytes(),
        // RARP: as ARP, with sender and target both the announced MAC.
        &HTYPE_ETHERNET.to_be_bytes(),
        &PTYPE_IPV4.to_be_bytes(),
        &[HLEN, PLEN],
        &OP_REQUEST_REVERSE.to_be_bytes(),
        &mac,
        &no_ip,
        &mac,
        &no_ip,
    ];
    let mut frame = [0u8; FRAME_LEN];
    // 42 bytes of fields, the padding stays zero.
    for (byte, value) in frame.iter_mut().zip(fields.into_iter().flatten()) {
        *byte = *value;
    }
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rarp_announcement_bytes() {
        let mac = [0x02, 0x50, 0x56, 0xab, 0xcd, 0xef];
        #[rustfmt::skip]
        let expected: [u8; 60] = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // broadcast
            0x02, 0x50, 0x56, 0xab, 0xcd, 0xef, // from the MAC
            0x80, 0x35,                         // RARP
            0x00, 0x01,                         // htype Ethernet
            0x08, 0x00,                         // ptype IPv4
            6, 4,                               // hlen, plen
            0x00, 0x03,                         // reverse request
            0x02, 0x50, 0x56, 0xab, 0xcd, 0xef, // sender hardware address
            0, 0, 0, 0,                         // sender IP
            0x02, 0x50, 0x56, 0xab, 0xcd, 0xef, // target hardware address
            0, 0, 0, 0,                         // target IP
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // padding
        ];
        assert_eq!(rarp_announcement(mac), expected);
    }
}
