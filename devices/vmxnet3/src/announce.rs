// SPDX-License-Identifier: Apache-2.0
//! Telling the network where the guest went after a migration: until the
//! guest itself sends a frame, bridges and switches still deliver its
//! traffic to the port it left. A restored device therefore sends frames
//! from its MAC when it resumes, as QEMU's NICs do (`qemu_announce_self`):
//! broadcast RARP requests, which every switch learns from and no host
//! answers. The worker sends them on the schedule of [`ANNOUNCE_AT`].

use std::time::Duration;

/// When each announcement frame goes out, counted from the resume: the
/// first at once, the others spaced as QEMU's announce-self does by
/// default (50 ms, then 100 ms longer each round). Frames back to back
/// would all be lost to a bridge that is still adding the new port, or to
/// a switch whose link to the new host has just come up.
pub(crate) const ANNOUNCE_AT: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(450),
];

/// An announcement in progress: the frame and how many times it went out.
#[derive(Debug)]
pub(crate) struct Announcement {
    frame: [u8; FRAME_LEN],
    sent: usize,
}

impl Announcement {
    pub(crate) fn new(mac: [u8; 6]) -> Self {
        Announcement {
            frame: rarp_announcement(mac),
            sent: 0,
        }
    }

    /// The frame to send now; counts it as sent.
    pub(crate) fn next_frame(&mut self) -> &[u8] {
        self.sent = self.sent.saturating_add(1);
        &self.frame
    }

    /// How long after the frame just sent the next one is due, or `None`
    /// once all of [`ANNOUNCE_AT`] went out.
    pub(crate) fn next_gap(&self) -> Option<Duration> {
        let last = ANNOUNCE_AT.get(self.sent.checked_sub(1)?)?;
        Some(ANNOUNCE_AT.get(self.sent)?.saturating_sub(*last))
    }
}

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
    fn announcement_follows_the_schedule() {
        let mut a = Announcement::new([2, 0, 0, 0, 0, 1]);
        let mut gaps = Vec::new();
        loop {
            assert_eq!(a.next_frame(), rarp_announcement([2, 0, 0, 0, 0, 1]));
            match a.next_gap() {
                Some(gap) => gaps.push(gap.as_millis()),
                None => break,
            }
        }
        assert_eq!(gaps, [50, 150, 250]);
    }

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
