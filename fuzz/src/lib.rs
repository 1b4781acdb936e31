// SPDX-License-Identifier: Apache-2.0
//! Helpers shared by the fuzz targets: a reader that turns the fuzzer's bytes into
//! operations, a framer that wraps fuzzer-chosen transport bytes in valid Ethernet, IP
//! and UDP headers with a correct ICRC, so that mutations reach the transport code instead
//! of dying at the checksum, and a virtio-blk function with its driver ([`virtio_blk`]).

pub mod virtio_blk;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::time::Duration;

use rdma_transport::icrc::icrc;
use rdma_transport::net::{self, IpInfo};
use vmm_sys_util::eventfd::EventFd;

/// How long a target waits for a device worker to take a notification.
pub const SETTLE: Duration = Duration::from_millis(20);

/// Whether `fd` has a count to read: a worker has not taken the notification yet.
pub fn readable(fd: &EventFd) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd that lives across the call; a zero timeout.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// Reads fixed-size values off the fuzzer's input; past the end everything reads as 0.
pub struct Input<'a>(pub &'a [u8]);

impl<'a> Input<'a> {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }

    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let b = self.bytes(N);
        out[..b.len()].copy_from_slice(b);
        out
    }

    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A length-prefixed chunk of at most `max` bytes.
    pub fn chunk(&mut self, max: usize) -> &'a [u8] {
        let n = usize::from(self.u16()) % (max + 1);
        self.bytes(n)
    }
}

/// IP addressing of a framed packet: the IPv4-mapped GIDs `10.0.0.src` to `10.0.0.dst`, or
/// the IPv6 link-local equivalents.
pub fn ip_info(v6: bool, src: u8, dst: u8) -> IpInfo {
    let (s, d): (IpAddr, IpAddr) = if v6 {
        (
            Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, src.into()).into(),
            Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, dst.into()).into(),
        )
    } else {
        (
            Ipv4Addr::new(10, 0, 0, src).into(),
            Ipv4Addr::new(10, 0, 0, dst).into(),
        )
    };
    IpInfo {
        src: s,
        dst: d,
        tclass: 0,
        hop_limit: 64,
        flow_label: 0,
    }
}

/// A frame carrying `transport` (BTH onwards, without ICRC) with valid lower layers and a
/// correct ICRC; `None` when it would not fit a UDP datagram.
pub fn frame(
    ip: &IpInfo,
    macs: ([u8; 6], [u8; 6]),
    sport: u16,
    transport: &[u8],
) -> Option<Vec<u8>> {
    let hl = net::headers_len(ip);
    let mut f = vec![0u8; hl + transport.len() + 4];
    f[hl..hl + transport.len()].copy_from_slice(transport);
    net::write_headers(&mut f, macs.0, macs.1, ip, sport).ok()?;
    fix_icrc(&mut f);
    Some(f)
}

/// Recomputes the ICRC (and the IPv6 UDP checksum) of a frame whose lower layers parse,
/// after its transport bytes were changed. Frames whose layers do not parse are left alone.
pub fn fix_icrc(f: &mut [u8]) {
    let Ok(layers) = net::parse_layers(f) else {
        return;
    };
    let l3_end = layers.l3_off + layers.l3_len;
    let udp_end = l3_end + 8;
    let ib_end = udp_end + layers.udp_payload_len;
    if layers.udp_payload_len < 4 || ib_end > f.len() {
        return;
    }
    let covered_end = ib_end - 4;
    let Ok(crc) = icrc(
        &f[layers.l3_off..l3_end],
        &f[l3_end..udp_end],
        &f[udp_end..covered_end],
    ) else {
        return;
    };
    f[covered_end..ib_end].copy_from_slice(&crc);
    net::finish_udp6_checksum(f);
}
