// SPDX-License-Identifier: Apache-2.0
//! Helpers shared by the fuzz targets: a reader that turns the fuzzer's bytes into
//! operations, the device workers run on the fuzzer's thread ([`inline_workers`],
//! [`settle`]), a framer that wraps fuzzer-chosen transport bytes in valid Ethernet, IP
//! and UDP headers with a correct ICRC, so that mutations reach the transport code instead
//! of dying at the checksum, and a virtio-blk function with its driver ([`virtio_blk`]).

pub mod virtio_blk;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rdma_transport::net::{self, Encap, IpInfo, RoceVersion};

/// From now on the device workers this thread builds have no thread of their own: they run
/// on the fuzzer's thread, in [`settle`]. Nothing waits for a thread to wake, and a run is
/// the same for the same input. Call at the start of every input (it is idempotent).
pub fn inline_workers() {
    device_worker::inline::enable();
}

/// Lets the device workers handle everything the input signalled so far (doorbells,
/// frames, timers that expired), until none has work left. Only while the devices run: a
/// paused vmxnet3 worker waits for its resume.
pub fn settle() {
    device_worker::inline::run_pending();
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

/// A hostile edit's choices ([`vm_migration::test_utils::mutate`]) from the input.
impl vm_migration::test_utils::Choices for Input<'_> {
    fn u8(&mut self) -> u8 {
        Input::u8(self)
    }

    fn u16(&mut self) -> u16 {
        Input::u16(self)
    }

    fn u64(&mut self) -> u64 {
        Input::u64(self)
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

/// A frame carrying `transport` (BTH onwards, without ICRC) with valid lower layers (RoCE v2
/// or v1, tagged or not: `encap`) and a correct ICRC; `None` when it would not fit a UDP
/// datagram or a GRH.
pub fn frame(
    ip: &IpInfo,
    macs: ([u8; 6], [u8; 6]),
    sport: u16,
    encap: Encap,
    transport: &[u8],
) -> Option<Vec<u8>> {
    let hl = net::headers_len(ip, encap);
    let mut f = vec![0u8; hl + transport.len() + 4];
    f[hl..hl + transport.len()].copy_from_slice(transport);
    net::write_headers(&mut f, macs.0, macs.1, ip, sport, encap).ok()?;
    fix_icrc(&mut f);
    Some(f)
}

/// How the fuzzer's `bits` (two of them) frame a packet: RoCE v2 or v1, untagged or on VLAN 5.
pub fn encap(bits: u8) -> Encap {
    Encap {
        version: if bits & 1 == 0 {
            RoceVersion::V2
        } else {
            RoceVersion::V1
        },
        vlan: (bits & 2 != 0).then_some(5),
    }
}

/// Recomputes the ICRC (and the IPv6 UDP checksum) of a frame whose lower layers parse,
/// after its transport bytes were changed. Frames whose layers do not parse are left alone.
pub fn fix_icrc(f: &mut [u8]) {
    let _ = rdma_transport::packet::seal(f);
}
