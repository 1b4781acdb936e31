// SPDX-License-Identifier: Apache-2.0
//! TX: packets from a guest TX ring to the backend.
//!
//! A packet is a chain of `Vmxnet3_TxDesc` from a start (SOP) to an
//! end-of-packet (EOP) descriptor. The driver writes the whole chain, then
//! hands it over by flipping the SOP's generation bit, so a chain whose
//! SOP is the device's but whose EOP cannot be reached (a descriptor still
//! the driver's, or no EOP within a whole ring) is a broken driver: the
//! queue stops with TQERR. Everything else wrong with a packet (a buffer
//! outside RAM, too long, offload fields that do not fit) drops that one
//! packet, counted by reason; it is still completed so the driver can
//! reuse its descriptors.
//!
//! Offloads go to the host kernel through the backend's virtio-net header,
//! as QEMU does: Linux enables checksum offload and TSO on vmxnet3 without
//! asking, so every packet with `om` CSUM or TSO gets a header that makes
//! the kernel fill in the checksum or segment it. The fields are checked
//! against the frame first, so the kernel's own checks never fire.

use net_port::{
    FrameBackend, Port, VnetHdr, VNET_HDR_F_NEEDS_CSUM, VNET_HDR_GSO_ECN, VNET_HDR_GSO_NONE,
    VNET_HDR_GSO_TCPV4, VNET_HDR_GSO_TCPV6,
};
use vm_memory::{Bytes, GuestAddress, GuestMemory};

use crate::metrics::Vmxnet3Metrics;
use crate::ring::{CmdRing, CompRing, PosError, QueueFault, RingPos};
use crate::shared::TxQueueConf;
use crate::stats::TxStats;

/// Largest frame without TSO: the 9000-byte MTU limit plus
/// `VMXNET3_MAX_ETH_HDR_SIZE` (Ethernet header and two VLAN tags).
const MAX_FRAME: usize = 9000 + 22;
/// Largest TSO frame: Linux's GSO limit for a device that does not raise it
/// (`GSO_LEGACY_MAX_SIZE`; vmxnet3 does not).
const MAX_TSO_FRAME: usize = 65536;
/// An 802.1Q tag, inserted in front of the EtherType when `ti` is set.
const VLAN_TAG_LEN: usize = 4;
/// Size of the gather buffer every TX queue of a device shares: the
/// largest frame with room in front for an inserted tag.
pub(crate) const TX_BUF_LEN: usize = VLAN_TAG_LEN + MAX_TSO_FRAME;
/// Smallest MSS accepted for TSO, Linux's `TCP_MIN_SND_MSS`: smaller ones
/// would have the host cut a 64 KiB frame into thousands of segments.
const MIN_TSO_MSS: u16 = 48;

/// Generation bit of a TX descriptor: bit 14 of dword 2.
pub(crate) const TXD_GEN_BIT: u32 = 14;
/// `VMXNET3_MAX_TX_BUF_SIZE`: a length field of 0 means this much.
const MAX_TX_BUF: u32 = 1 << 14;
const LEN_MASK: u32 = 0x3fff;
const MSSCOF_SHIFT: u32 = 18;
const HLEN_MASK: u32 = 0x3ff;
const OM_SHIFT: u32 = 10;
const EOP: u32 = 1 << 12;
const TI: u32 = 1 << 15;
const TCI_SHIFT: u32 = 16;
/// Offload modes (`VMXNET3_OM_*`); ENCAP (1) exists from revision 4 only.
const OM_NONE: u32 = 0;
const OM_CSUM: u32 = 2;
const OM_TSO: u32 = 3;
/// TxCompDesc `txdIdx`: 12 bits.
const TXD_IDX_MASK: u32 = 0xfff;

const ETH_TYPE_AT: usize = 12;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const IPPROTO_TCP: u8 = 6;
const IPV6_HLEN: usize = 40;
const TCP_MIN_HLEN: usize = 20;
/// Offset of the checksum in a TCP header.
const TCP_CSUM_OFFSET: u16 = 16;
/// Offset of the flags byte in a TCP header, and its CWR bit.
const TCP_FLAGS_AT: usize = 13;
const TCP_CWR: u8 = 0x80;

/// The fields of a `Vmxnet3_TxDesc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TxDesc {
    addr: u64,
    /// Buffer length, 1 to 16384.
    len: u32,
    /// CSUM: absolute offset of the checksum field; TSO: the MSS.
    msscof: u32,
    /// CSUM: start of the checksummed part; TSO: length of all headers.
    hlen: u32,
    om: u32,
    eop: bool,
    /// Insert an 802.1Q tag with `tci`.
    ti: bool,
    tci: u16,
}

impl TxDesc {
    fn decode(raw: [u8; 16]) -> Self {
        let [a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, c0, c1, c2, c3] = raw;
        let addr = u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]);
        let dw2 = u32::from_le_bytes([b0, b1, b2, b3]);
        let dw3 = u32::from_le_bytes([c0, c1, c2, c3]);
        let len = match dw2 & LEN_MASK {
            0 => MAX_TX_BUF,
            len => len,
        };
        TxDesc {
            addr,
            len,
            msscof: dw2 >> MSSCOF_SHIFT,
            hlen: dw3 & HLEN_MASK,
            om: (dw3 >> OM_SHIFT) & 0x3,
            eop: dw3 & EOP != 0,
            ti: dw3 & TI != 0,
            tci: u16::try_from(dw3 >> TCI_SHIFT).unwrap_or(0),
        }
    }
}

/// Why a packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TxDrop {
    /// A buffer outside guest RAM.
    BadDesc,
    /// Offload fields that do not fit the frame.
    BadOffload,
    TooLarge,
}

/// A chain read up to its EOP.
struct Chain {
    sop: TxDesc,
    /// Descriptors in the chain.
    count: u32,
    eop_index: u32,
    /// The frame's length at `buf[VLAN_TAG_LEN..]`, or why it was dropped.
    frame: Result<usize, TxDrop>,
}

/// What a TX queue needs from the worker for one pass.
pub(crate) struct TxContext<'a, M> {
    pub(crate) mem: &'a M,
    pub(crate) backend: &'a dyn FrameBackend,
    /// Learns the VLANs of the guest's addresses from what it sends.
    pub(crate) port: &'a Port,
    pub(crate) metrics: &'a Vmxnet3Metrics,
    /// [`TX_BUF_LEN`] bytes.
    pub(crate) buf: &'a mut [u8],
}

/// What a pass over the ring did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TxPass {
    /// Completions were written: interrupt the driver.
    pub(crate) completed: bool,
    /// The pass stopped at its budget with packets possibly left.
    pub(crate) more: bool,
}

/// One TX queue of an activated device.
#[derive(Debug)]
pub(crate) struct TxQueue {
    pub(crate) conf: TxQueueConf,
    ring: CmdRing,
    comp: CompRing,
    /// Stopped by a fault until the next activation.
    pub(crate) stopped: bool,
}

impl TxQueue {
    pub(crate) fn new(conf: TxQueueConf) -> Self {
        TxQueue {
            ring: CmdRing::new(conf.ring.base, conf.ring.size, TXD_GEN_BIT),
            comp: CompRing::new(conf.comp.base, conf.comp.size),
            conf,
            stopped: false,
        }
    }

    /// Where the device is in the TX ring and in the completion ring.
    pub(crate) fn positions(&self) -> [RingPos; 2] {
        [self.ring.pos(), self.comp.pos()]
    }

    /// The queue `conf` as it was saved: at `positions`, maybe stopped.
    pub(crate) fn restore(
        conf: TxQueueConf,
        [ring, comp]: [RingPos; 2],
        stopped: bool,
    ) -> Result<Self, PosError> {
        let mut queue = Self::new(conf);
        queue.ring.set_pos(ring)?;
        queue.comp.set_pos(comp)?;
        queue.stopped = stopped;
        Ok(queue)
    }

    /// Sends and completes the packets the driver has handed over, at most
    /// a ring's worth, so other queues get their turn.
    pub(crate) fn process<M: GuestMemory>(
        &mut self,
        ctx: &mut TxContext<'_, M>,
        stats: &mut TxStats,
    ) -> Result<TxPass, QueueFault> {
        let mut pass = TxPass::default();
        for _ in 0..self.ring.size() {
            let Some((_, raw)) = self.ring.peek(ctx.mem, 0)? else {
                return Ok(pass);
            };
            let chain = self.gather(ctx, TxDesc::decode(raw))?;
            self.ring.advance(chain.count);
            let sent = chain
                .frame
                .and_then(|len| frame_and_header(ctx.buf, len, &chain.sop));
            match sent {
                Ok((frame, hdr)) => {
                    ctx.port.note_guest_frame(frame);
                    send(ctx.backend, ctx.metrics, stats, frame, &hdr);
                }
                Err(drop) => {
                    stats.discards = stats.discards.wrapping_add(1);
                    let m = ctx.metrics;
                    let (counter, why) = match drop {
                        TxDrop::BadDesc => (&m.tx_bad_desc, "buffer outside guest RAM"),
                        TxDrop::BadOffload => (&m.tx_bad_offload, "offload fields do not fit"),
                        TxDrop::TooLarge => (&m.tx_too_large, "frame too long"),
                    };
                    count_warn!(
                        counter,
                        "TX queue dropped a packet: {why} (sop {:?})",
                        chain.sop
                    );
                }
            }
            self.comp
                .push(ctx.mem, [chain.eop_index & TXD_IDX_MASK, 0, 0, 0])?;
            pass.completed = true;
        }
        pass.more = true;
        Ok(pass)
    }

    /// Reads the chain starting at the next descriptor (`sop`), copying
    /// its buffers into `ctx.buf` while they fit.
    fn gather<M: GuestMemory>(
        &self,
        ctx: &mut TxContext<'_, M>,
        sop: TxDesc,
    ) -> Result<Chain, QueueFault> {
        let limit = if sop.om == OM_TSO {
            MAX_TSO_FRAME
        } else {
            MAX_FRAME
        };
        let mut len = 0usize;
        let mut frame = Ok(());
        for ahead in 0..self.ring.size() {
            let Some((index, raw)) = self.ring.peek(ctx.mem, ahead)? else {
                break;
            };
            let desc = if ahead == 0 { sop } else { TxDesc::decode(raw) };
            if frame.is_ok() {
                frame = copy_buffer(ctx, &desc, &mut len, limit);
            }
            if desc.eop {
                return Ok(Chain {
                    sop,
                    count: ahead.wrapping_add(1),
                    eop_index: index,
                    frame: frame.map(|()| len),
                });
            }
        }
        Err(QueueFault::NoEop(
            self.ring.peek(ctx.mem, 0)?.map_or(0, |(i, _)| i),
        ))
    }
}

/// Appends `desc`'s buffer to the frame of `*len` bytes in `ctx.buf`.
fn copy_buffer<M: GuestMemory>(
    ctx: &mut TxContext<'_, M>,
    desc: &TxDesc,
    len: &mut usize,
    limit: usize,
) -> Result<(), TxDrop> {
    let n = usize::try_from(desc.len).map_err(|_| TxDrop::TooLarge)?;
    let end = len
        .checked_add(n)
        .filter(|&end| end <= limit)
        .ok_or(TxDrop::TooLarge)?;
    let dst = ctx
        .buf
        .get_mut(VLAN_TAG_LEN.saturating_add(*len)..VLAN_TAG_LEN.saturating_add(end))
        .ok_or(TxDrop::TooLarge)?;
    ctx.mem
        .read_slice(dst, GuestAddress(desc.addr))
        .map_err(|_| TxDrop::BadDesc)?;
    *len = end;
    Ok(())
}

/// The frame of `len` bytes at `buf[VLAN_TAG_LEN..]` as it goes on the
/// wire (with the tag inserted if asked), and its virtio-net header.
fn frame_and_header<'b>(
    buf: &'b mut [u8],
    len: usize,
    sop: &TxDesc,
) -> Result<(&'b [u8], VnetHdr), TxDrop> {
    let (start, shift) = if sop.ti {
        // Move the MAC addresses forward over the room left for the tag.
        if len < ETH_TYPE_AT {
            return Err(TxDrop::BadOffload);
        }
        buf.copy_within(VLAN_TAG_LEN..VLAN_TAG_LEN.saturating_add(ETH_TYPE_AT), 0);
        let tag = buf
            .get_mut(ETH_TYPE_AT..ETH_TYPE_AT.saturating_add(VLAN_TAG_LEN))
            .ok_or(TxDrop::BadOffload)?;
        let [t0, t1] = ETH_P_8021Q.to_be_bytes();
        let [c0, c1] = sop.tci.to_be_bytes();
        tag.copy_from_slice(&[t0, t1, c0, c1]);
        (0, VLAN_TAG_LEN)
    } else {
        (VLAN_TAG_LEN, 0)
    };
    let frame = buf
        .get_mut(start..VLAN_TAG_LEN.saturating_add(len))
        .ok_or(TxDrop::TooLarge)?;
    // 10 bits.
    let hlen = usize::try_from(sop.hlen).map_err(|_| TxDrop::BadOffload)?;
    let hdr = match sop.om {
        OM_NONE => VnetHdr::default(),
        OM_CSUM => csum_header(frame.len(), hlen.saturating_add(shift), sop.msscof, shift)?,
        OM_TSO => tso_header(frame, hlen.saturating_add(shift), sop.msscof)?,
        _ => return Err(TxDrop::BadOffload),
    };
    Ok((frame, hdr))
}

/// CSUM: the checksum of everything from `start` goes to the absolute
/// offset `field` (+ `shift` for an inserted tag).
fn csum_header(len: usize, start: usize, field: u32, shift: usize) -> Result<VnetHdr, TxDrop> {
    let field = usize::try_from(field)
        .ok()
        .and_then(|f| f.checked_add(shift))
        .ok_or(TxDrop::BadOffload)?;
    let offset = field.checked_sub(start).ok_or(TxDrop::BadOffload)?;
    if start >= len || field.checked_add(2).is_none_or(|end| end > len) {
        return Err(TxDrop::BadOffload);
    }
    Ok(VnetHdr {
        flags: VNET_HDR_F_NEEDS_CSUM,
        csum_start: u16::try_from(start).map_err(|_| TxDrop::BadOffload)?,
        csum_offset: u16::try_from(offset).map_err(|_| TxDrop::BadOffload)?,
        ..VnetHdr::default()
    })
}

fn be16(frame: &[u8], at: usize) -> Option<u16> {
    let b = frame.get(at..at.checked_add(2)?)?;
    Some(u16::from_be_bytes([*b.first()?, *b.get(1)?]))
}

/// One's-complement sum of `bytes` (big-endian 16-bit words), folded.
fn csum_fold(bytes: &[u8], mut sum: u32) -> u16 {
    for word in bytes.chunks(2) {
        let [hi, lo] = match *word {
            [hi, lo] => [hi, lo],
            [hi] => [hi, 0],
            _ => [0, 0],
        };
        sum = sum.wrapping_add(u32::from(u16::from_be_bytes([hi, lo])));
        // Keep the carries folded so the sum never overflows.
        sum = (sum & 0xffff).wrapping_add(sum >> 16);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff).wrapping_add(sum >> 16);
    }
    u16::try_from(sum).unwrap_or(0)
}

/// The TCP pseudo-header sum (not complemented) for `tcp_len` bytes of TCP
/// header and payload between the addresses in `addrs` (source then
/// destination, 8 bytes for IPv4, 32 for IPv6).
fn pseudo_header_sum(addrs: &[u8], tcp_len: usize) -> u16 {
    // tcp_len < 64 KiB + headers; its upper 16 bits are summed too (IPv6
    // uses a 32-bit length).
    let len = u32::try_from(tcp_len).unwrap_or(u32::MAX);
    let sum = u32::from(IPPROTO_TCP)
        .wrapping_add(len >> 16)
        .wrapping_add(len & 0xffff);
    csum_fold(addrs, sum)
}

/// TSO: `hlen` must be exactly the Ethernet, IP and TCP headers the frame
/// carries (what Linux's driver puts there), and `mss` a sane segment size.
///
/// The TCP checksum field is rewritten to what the host kernel's GSO
/// expects of a partial-checksum frame: the pseudo-header sum over the
/// whole frame's TCP length (it subtracts that length and adds each
/// segment's). Linux's vmxnet3 driver leaves the pseudo-header sum with a
/// length of 0 there (`vmxnet3_prepare_tso`; real devices recompute it, as
/// QEMU does), which would give every segment a wrong checksum.
fn tso_header(frame: &mut [u8], hlen: usize, mss: u32) -> Result<VnetHdr, TxDrop> {
    let bad = TxDrop::BadOffload;
    let mss = u16::try_from(mss)
        .ok()
        .filter(|&m| m >= MIN_TSO_MSS)
        .ok_or(bad)?;
    let mut type_at = ETH_TYPE_AT;
    // Up to two VLAN tags (QinQ) before the IP header.
    for _ in 0..2 {
        if matches!(be16(frame, type_at), Some(ETH_P_8021Q | ETH_P_8021AD)) {
            type_at = type_at.saturating_add(VLAN_TAG_LEN);
        }
    }
    let l3 = type_at.saturating_add(2);
    let version = frame.get(l3).ok_or(bad)? >> 4;
    // Where the source and destination addresses are, and their length.
    let (l4, gso_type, addrs) = match (be16(frame, type_at), version) {
        (Some(ETH_P_IP), 4) => {
            let ihl = usize::from(frame.get(l3).ok_or(bad)? & 0xf).saturating_mul(4);
            let proto = *frame.get(l3.saturating_add(9)).ok_or(bad)?;
            if ihl < 20 || proto != IPPROTO_TCP {
                return Err(bad);
            }
            (
                l3.saturating_add(ihl),
                VNET_HDR_GSO_TCPV4,
                (l3.saturating_add(12), 8),
            )
        }
        (Some(ETH_P_IPV6), 6) => {
            if *frame.get(l3.saturating_add(6)).ok_or(bad)? != IPPROTO_TCP {
                return Err(bad);
            }
            (
                l3.saturating_add(IPV6_HLEN),
                VNET_HDR_GSO_TCPV6,
                (l3.saturating_add(8), 32),
            )
        }
        _ => return Err(bad),
    };
    let doff = usize::from(frame.get(l4.saturating_add(12)).ok_or(bad)? >> 4).saturating_mul(4);
    let flags = *frame.get(l4.saturating_add(TCP_FLAGS_AT)).ok_or(bad)?;
    if doff < TCP_MIN_HLEN || l4.saturating_add(doff) != hlen || hlen > frame.len() {
        return Err(bad);
    }
    let (at, n) = addrs;
    let addrs = frame.get(at..at.saturating_add(n)).ok_or(bad)?;
    let seed = pseudo_header_sum(addrs, frame.len().saturating_sub(l4)).to_be_bytes();
    let check_at = l4.saturating_add(usize::from(TCP_CSUM_OFFSET));
    frame
        .get_mut(check_at..check_at.saturating_add(2))
        .ok_or(bad)?
        .copy_from_slice(&seed);
    let ecn = if flags & TCP_CWR != 0 {
        VNET_HDR_GSO_ECN
    } else {
        0
    };
    Ok(VnetHdr {
        flags: VNET_HDR_F_NEEDS_CSUM,
        gso_type: gso_type | ecn,
        hdr_len: u16::try_from(hlen).map_err(|_| bad)?,
        gso_size: mss,
        csum_start: u16::try_from(l4).map_err(|_| bad)?,
        csum_offset: TCP_CSUM_OFFSET,
    })
}

/// Hands one frame to the backend and counts it.
fn send(
    backend: &dyn FrameBackend,
    m: &Vmxnet3Metrics,
    stats: &mut TxStats,
    frame: &[u8],
    hdr: &VnetHdr,
) {
    if let Err(e) = backend.send(hdr, frame) {
        stats.errors = stats.errors.wrapping_add(1);
        count_warn!(
            m.tx_backend_error,
            "backend refused a {}-byte frame: {e}",
            frame.len()
        );
        return;
    }
    let len = u64::try_from(frame.len()).unwrap_or(u64::MAX);
    m.tx_frames.inc();
    m.tx_bytes.add(len);
    let tso = hdr.gso_type != VNET_HDR_GSO_NONE;
    let (segments, wire_bytes) = if tso {
        m.tx_tso_frames.inc();
        let header = u64::from(hdr.hdr_len);
        let payload = len.saturating_sub(header);
        let segments = payload.div_ceil(u64::from(hdr.gso_size)).max(1);
        (
            segments,
            len.saturating_add(segments.saturating_sub(1).saturating_mul(header)),
        )
    } else {
        if hdr.flags & VNET_HDR_F_NEEDS_CSUM != 0 {
            m.tx_csum_frames.inc();
        }
        (1, len)
    };
    stats.sent(frame, segments, wire_bytes, tso);
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use super::*;
    use crate::test_utils::{tcp4_frame, tcp6_frame};

    fn desc(om: u32, hlen: u32, msscof: u32) -> TxDesc {
        TxDesc {
            addr: 0,
            len: 1,
            msscof,
            hlen,
            om,
            eop: true,
            ti: false,
            tci: 0,
        }
    }

    /// Runs `frame_and_header` on a copy of `frame`.
    fn header(frame: &[u8], sop: &TxDesc) -> Result<(Vec<u8>, VnetHdr), TxDrop> {
        let mut buf = vec![0u8; TX_BUF_LEN];
        buf[VLAN_TAG_LEN..VLAN_TAG_LEN + frame.len()].copy_from_slice(frame);
        frame_and_header(&mut buf, frame.len(), sop).map(|(f, h)| (f.to_vec(), h))
    }

    #[test]
    fn descriptor_fields() {
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&0x1234_5678u64.to_le_bytes());
        let dw2: u32 = 54 << 18;
        let dw3: u32 = 0xabc << 16 | TI | EOP | 3 << 10 | 54;
        raw[8..12].copy_from_slice(&dw2.to_le_bytes());
        raw[12..].copy_from_slice(&dw3.to_le_bytes());
        let d = TxDesc::decode(raw);
        assert_eq!(d.len, 16384, "0 means 16 KiB");
        assert_eq!(
            (d.msscof, d.hlen, d.om, d.eop, d.ti, d.tci),
            (54, 54, 3, true, true, 0xabc)
        );
    }

    #[test]
    fn csum_offload_header() {
        let frame = tcp4_frame(100, 0);
        let (_, hdr) = header(&frame, &desc(OM_CSUM, 34, 34 + 16)).unwrap();
        assert_eq!((hdr.flags, hdr.csum_start, hdr.csum_offset), (1, 34, 16));
        assert_eq!(hdr.gso_type, 0);
        // Checksum start past the end, field before the start, field past the end.
        for (hlen, cof) in [(154, 170), (34, 20), (34, 153)] {
            assert_eq!(
                header(&frame, &desc(OM_CSUM, hlen, cof)).unwrap_err(),
                TxDrop::BadOffload
            );
        }
        assert_eq!(
            header(&frame, &desc(1, 0, 0)).unwrap_err(),
            TxDrop::BadOffload,
            "ENCAP"
        );
    }

    #[test]
    fn tso_headers_for_v4_v6_vlan_and_ecn() {
        let (_, hdr) = header(&tcp4_frame(3000, 0), &desc(OM_TSO, 54, 1448)).unwrap();
        assert_eq!(
            hdr,
            VnetHdr {
                flags: 1,
                gso_type: VNET_HDR_GSO_TCPV4,
                hdr_len: 54,
                gso_size: 1448,
                csum_start: 34,
                csum_offset: 16
            }
        );
        let (_, hdr) = header(&tcp6_frame(3000), &desc(OM_TSO, 74, 1428)).unwrap();
        assert_eq!(
            (hdr.gso_type, hdr.csum_start, hdr.hdr_len),
            (VNET_HDR_GSO_TCPV6, 54, 74)
        );
        let (_, hdr) = header(&tcp4_frame(3000, TCP_CWR), &desc(OM_TSO, 54, 1448)).unwrap();
        assert_eq!(hdr.gso_type, VNET_HDR_GSO_TCPV4 | VNET_HDR_GSO_ECN);

        // Tag insertion shifts every offset by 4 and puts the tag after the MACs.
        let mut sop = desc(OM_TSO, 54, 1448);
        sop.ti = true;
        sop.tci = 0x0123;
        let frame = tcp4_frame(3000, 0);
        let (wire, hdr) = header(&frame, &sop).unwrap();
        assert_eq!(wire.len(), frame.len() + 4);
        assert_eq!(&wire[..12], &frame[..12]);
        assert_eq!(&wire[12..16], &[0x81, 0, 0x01, 0x23]);
        // All but the TCP checksum field, which gets the pseudo-header sum.
        assert_eq!(&wire[16..54], &frame[12..50]);
        assert_eq!(&wire[56..], &frame[52..]);
        assert_eq!((hdr.csum_start, hdr.hdr_len), (38, 58));
    }

    /// The TCP checksum of every segment the host kernel cuts a TSO frame
    /// into, as its GSO does for a partial-checksum frame headed to a
    /// device without checksum offload (`tcp_gso_segment`): the seed in the
    /// checksum field is adjusted from the whole TCP length to the
    /// segment's, then the segment is summed from the TCP header on.
    /// Returns whether each segment's checksum verifies.
    fn kernel_gso_checksums_ok(wire: &[u8], hdr: &VnetHdr, addrs: &[u8]) -> Vec<bool> {
        let l4 = usize::from(hdr.csum_start);
        let hlen = usize::from(hdr.hdr_len);
        let check_at = l4 + 16;
        let seed = u32::from(u16::from_be_bytes([wire[check_at], wire[check_at + 1]]));
        let full_len = (wire.len() - l4) as u32;
        let payload = &wire[hlen..];
        payload
            .chunks(usize::from(hdr.gso_size))
            .map(|chunk| {
                let seg_len = (hlen - l4 + chunk.len()) as u32;
                // One's complement: subtract the whole length, add the segment's.
                let adjusted = csum_fold(&[], seed + (!full_len & 0xffff) + seg_len);
                let mut seg = wire[l4..hlen].to_vec();
                seg.extend_from_slice(chunk);
                seg[16..18].copy_from_slice(&adjusted.to_be_bytes());
                let check = !csum_fold(&seg, 0);
                seg[16..18].copy_from_slice(&check.to_be_bytes());
                // The receiver: pseudo header (with the segment's length) plus segment.
                csum_fold(&seg, u32::from(pseudo_header_sum(addrs, seg.len()))) == 0xffff
            })
            .collect()
    }

    /// A frame as Linux's vmxnet3 driver hands it over for TSO
    /// (`vmxnet3_prepare_tso`): IPv4 checksum 0, TCP checksum field the
    /// pseudo-header sum with a TCP length of 0.
    fn as_vmxnet3_driver_leaves_it(
        mut frame: Vec<u8>,
        l4: usize,
        addrs: (usize, usize),
    ) -> Vec<u8> {
        let seed = pseudo_header_sum(&frame[addrs.0..addrs.0 + addrs.1], 0);
        frame[l4 + 16..l4 + 18].copy_from_slice(&seed.to_be_bytes());
        frame
    }

    #[test]
    fn tso_segments_get_valid_tcp_checksums() {
        // IPv4, 3000 bytes at MSS 1448: segments of 1448, 1448 and 104.
        let frame = as_vmxnet3_driver_leaves_it(tcp4_frame(3000, 0), 34, (26, 8));
        let (wire, hdr) = header(&frame, &desc(OM_TSO, 54, 1448)).unwrap();
        assert_eq!(
            kernel_gso_checksums_ok(&wire, &hdr, &wire[26..34]),
            [true; 3]
        );
        // IPv6, 20000 bytes at MSS 8928.
        let frame = as_vmxnet3_driver_leaves_it(tcp6_frame(20000), 54, (22, 32));
        let (wire, hdr) = header(&frame, &desc(OM_TSO, 74, 8928)).unwrap();
        assert_eq!(
            kernel_gso_checksums_ok(&wire, &hdr, &wire[22..54]),
            [true; 3]
        );
        // With an inserted tag, the field moves with the headers.
        let mut sop = desc(OM_TSO, 54, 1448);
        sop.ti = true;
        let frame = as_vmxnet3_driver_leaves_it(tcp4_frame(5000, 0), 34, (26, 8));
        let (wire, hdr) = header(&frame, &sop).unwrap();
        assert_eq!(
            kernel_gso_checksums_ok(&wire, &hdr, &wire[30..38]),
            [true; 4]
        );
    }

    #[test]
    fn hostile_tso_fields_are_refused() {
        let frame = tcp4_frame(3000, 0);
        for (what, hlen, mss) in [
            ("hlen short of the TCP header", 50, 1448),
            ("hlen beyond the headers", 60, 1448),
            ("MSS 0", 54, 0),
            ("tiny MSS", 54, 47),
        ] {
            assert_eq!(
                header(&frame, &desc(OM_TSO, hlen, mss)).unwrap_err(),
                TxDrop::BadOffload,
                "{what}"
            );
        }
        // hlen beyond the frame itself.
        assert_eq!(
            header(&frame[..50], &desc(OM_TSO, 54, 1448)).unwrap_err(),
            TxDrop::BadOffload
        );
        let mut udp = frame.clone();
        udp[23] = 17;
        assert_eq!(
            header(&udp, &desc(OM_TSO, 54, 1448)).unwrap_err(),
            TxDrop::BadOffload
        );
        let mut arp = frame;
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(
            header(&arp, &desc(OM_TSO, 54, 1448)).unwrap_err(),
            TxDrop::BadOffload
        );
        let mut short = desc(OM_NONE, 0, 0);
        short.ti = true;
        assert_eq!(header(&[1, 2, 3], &short).unwrap_err(), TxDrop::BadOffload);
    }
}
