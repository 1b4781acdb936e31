// SPDX-License-Identifier: Apache-2.0
//! The host side of the port: whatever carries the guest's Ethernet frames
//! (a TAP device in production, an in-memory queue in tests).
//!
//! Frames travel with a `virtio_net_hdr_v1` in front, the layout Linux's
//! TAP driver speaks when opened with `IFF_VNET_HDR`. On the way out it lets
//! a NIC model hand checksum and TCP segmentation work to the host kernel
//! instead of doing it in the VMM; on the way in it tells what the host
//! left undone.

use std::io;
use std::os::fd::RawFd;

use virtio_bindings::virtio_net::{
    VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_ECN, VIRTIO_NET_HDR_GSO_NONE,
    VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6,
};

/// Bytes of `struct virtio_net_hdr_v1` (with `num_buffers`), the header
/// size the TAP is configured for (`TUNSETVNETHDRSZ`).
pub const VNET_HDR_LEN: usize = 12;

// The bindings give these as u32; all of them fit the header's u8 fields.
/// `flags`: the checksum from `csum_start` to the end still has to be
/// computed and stored at `csum_start + csum_offset`.
pub const VNET_HDR_F_NEEDS_CSUM: u8 = VIRTIO_NET_HDR_F_NEEDS_CSUM as u8;
/// `gso_type` values.
pub const VNET_HDR_GSO_NONE: u8 = VIRTIO_NET_HDR_GSO_NONE as u8;
pub const VNET_HDR_GSO_TCPV4: u8 = VIRTIO_NET_HDR_GSO_TCPV4 as u8;
pub const VNET_HDR_GSO_TCPV6: u8 = VIRTIO_NET_HDR_GSO_TCPV6 as u8;
/// Or-ed into `gso_type` when the TCP header has CWR set.
pub const VNET_HDR_GSO_ECN: u8 = VIRTIO_NET_HDR_GSO_ECN as u8;

/// `struct virtio_net_hdr_v1` without `num_buffers` (always 0 here: the
/// TAP never merges receive buffers). Little endian on the wire, which is
/// also the TAP's native order on x86.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    /// Length of the headers copied into each segment (GSO only).
    pub hdr_len: u16,
    /// Payload bytes per segment (GSO only).
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    pub fn to_bytes(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        let [h0, h1] = self.hdr_len.to_le_bytes();
        let [g0, g1] = self.gso_size.to_le_bytes();
        let [s0, s1] = self.csum_start.to_le_bytes();
        let [o0, o1] = self.csum_offset.to_le_bytes();
        b[..10].copy_from_slice(&[self.flags, self.gso_type, h0, h1, g0, g1, s0, s1, o0, o1]);
        b
    }

    pub fn from_bytes(b: &[u8; VNET_HDR_LEN]) -> Self {
        let [flags, gso_type, h0, h1, g0, g1, s0, s1, o0, o1, _, _] = *b;
        VnetHdr {
            flags,
            gso_type,
            hdr_len: u16::from_le_bytes([h0, h1]),
            gso_size: u16::from_le_bytes([g0, g1]),
            csum_start: u16::from_le_bytes([s0, s1]),
            csum_offset: u16::from_le_bytes([o0, o1]),
        }
    }

    /// The frame is complete: no checksum or segmentation left to do.
    pub fn is_plain(&self) -> bool {
        self.flags & VNET_HDR_F_NEEDS_CSUM == 0 && self.gso_type == VNET_HDR_GSO_NONE
    }
}

/// A host network backend shared by every function of the port: the NIC
/// model owns the receive side, and any function (the RDMA engine of the
/// next issue) may send, so `send` takes `&self` and each call puts one
/// whole frame on the wire atomically.
pub trait FrameBackend: Send + Sync {
    /// Sends one Ethernet frame; `hdr` asks the host to finish its
    /// checksum or to segment it.
    fn send(&self, hdr: &VnetHdr, frame: &[u8]) -> io::Result<()>;

    /// Takes the next frame into `buf`: its header and length, or `None`
    /// when nothing is queued. `buf` must hold [`MAX_FRAME_LEN`] bytes.
    fn recv(&self, buf: &mut [u8]) -> io::Result<Option<(VnetHdr, usize)>>;

    /// Readable (for epoll) whenever `recv` has a frame to give.
    fn rx_fd(&self) -> RawFd;

    /// Whether the host side can carry traffic (for a TAP: the interface
    /// is up and running).
    fn link_up(&self) -> bool;
}

/// The largest frame a backend may deliver: a TAP's MTU is at most 65535
/// minus the Ethernet header, plus room for VLAN tags.
pub const MAX_FRAME_LEN: usize = 65536 + 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_is_virtio_net_hdr_v1() {
        let hdr = VnetHdr {
            flags: VNET_HDR_F_NEEDS_CSUM,
            gso_type: VNET_HDR_GSO_TCPV6 | VNET_HDR_GSO_ECN,
            hdr_len: 0x0102,
            gso_size: 0x0304,
            csum_start: 0x0506,
            csum_offset: 0x0708,
        };
        let bytes = hdr.to_bytes();
        assert_eq!(bytes, [1, 0x84, 2, 1, 4, 3, 6, 5, 8, 7, 0, 0]);
        assert_eq!(VnetHdr::from_bytes(&bytes), hdr);
        assert!(!hdr.is_plain());
        assert!(VnetHdr::default().is_plain());
        assert_eq!(VNET_HDR_GSO_TCPV4, 1);
    }
}
