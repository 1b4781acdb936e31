// SPDX-License-Identifier: Apache-2.0
//! Whole RoCE frames, v2 or v1, tagged with a VLAN or not ([`Encap`]):
//! [`parse`] validates a received frame into a [`Packet`] (headers decoded,
//! payload borrowed), [`build`] makes one from addressing, transport
//! headers and payload.
//!
//! The ICRC (and an IPv6 UDP checksum) only guards a frame on a wire: the
//! engine builds frames unsealed ([`build_unsealed`]) and whoever puts one
//! on a wire [`seal`]s it; the same-host channel, shared memory that a
//! peer could forge a checksum into anyway, moves them unsealed and reads
//! them with [`parse_unsealed`].
//!
//! Parsing does every check that needs no QP state, in rxe's order
//! (`rxe_udp_encap_recv`, `hdr_check`, `rxe_icrc_check`): layers and
//! lengths, transport version, opcode, header/pad/payload lengths, ICRC.
//! A frame that fails is dropped and counted by the caller; nothing here
//! can panic or allocate on a peer's say-so.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use thiserror::Error;

use crate::hdr::{Aeth, AtomicAckEth, AtomicEth, Bth, Deth, HdrError, Ieth, ImmDt, Reth, BTH_TVER};
use crate::icrc::{icrc, icrc_v1, IcrcError, UDP_LEN};
use crate::net::{self, Encap, IpInfo, Layers, Mac, NetError, RoceVersion};
use crate::opcode::{Hdrs, OpClass, Opcode, UnknownOpcode, ICRC_LEN};

/// Largest transport part a frame may carry: the IPv6 payload length
/// (16 bits) less the UDP header.
const MAX_IB_LEN: usize = u16::MAX as usize - UDP_LEN;

/// Why a received frame was dropped.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum ParseError {
    /// Ethernet/IP/UDP layer rejected.
    #[error("Network headers")]
    Net(#[from] NetError),
    /// A transport header is truncated or malformed.
    #[error("Transport header")]
    Hdr(#[from] HdrError),
    /// BTH transport version is not 0.
    #[error("BTH transport version {0}")]
    BadVersion(u8),
    /// Opcode not in the RC/UD table.
    #[error("Opcode")]
    Opcode(#[from] UnknownOpcode),
    /// The UDP (or GRH) payload is too short for headers, pad and ICRC,
    /// or an opcode without payload carries some.
    #[error("Pad or payload length mismatch")]
    Length,
    /// ICRC mismatch.
    #[error("Bad ICRC")]
    BadIcrc,
}

/// Why a frame could not be built.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum BuildError {
    /// The BTH opcode is not in the table.
    #[error("Opcode")]
    Opcode(#[from] UnknownOpcode),
    /// A header the opcode requires was not given.
    #[error("Missing header {0:?}")]
    MissingHeader(Hdrs),
    /// Frame too long for the UDP length field, or payload for an opcode
    /// without payload.
    #[error("Bad length")]
    Length,
    /// Network header writing failed.
    #[error("Network headers")]
    Net(#[from] NetError),
    /// Transport header writing failed.
    #[error("Transport header")]
    Hdr(#[from] HdrError),
    /// ICRC could not be computed.
    #[error("ICRC")]
    Icrc(#[from] IcrcError),
    /// The payload could not be read (the caller's `fill` failed).
    #[error("Payload unreadable")]
    Payload,
}

/// The transport headers of one packet; which extension headers are
/// present follows from `bth.opcode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Headers {
    /// Base transport header.
    pub bth: Bth,
    /// RDMA ETH.
    pub reth: Option<Reth>,
    /// ACK ETH.
    pub aeth: Option<Aeth>,
    /// Datagram ETH.
    pub deth: Option<Deth>,
    /// Immediate data.
    pub imm: Option<ImmDt>,
    /// Invalidate ETH.
    pub ieth: Option<Ieth>,
    /// Atomic ETH.
    pub atomic: Option<AtomicEth>,
    /// Atomic ACK ETH.
    pub atomic_ack: Option<AtomicAckEth>,
}

/// A validated received packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    /// Network addressing it arrived with.
    pub layers: Layers,
    /// Its opcode (validated).
    pub opcode: Opcode,
    /// Transport headers.
    pub hdrs: Headers,
    /// Payload (without pad and ICRC).
    pub payload: Payload<'a>,
    /// It came over the same-host channel (parsed by [`parse_unsealed`]):
    /// it may be a segment, a packet carrying several path MTUs of its
    /// message (see [`crate::req::MAX_SEGMENT`] and
    /// [`crate::req::MAX_DESCRIBED_SEGMENT`]); a wire packet carries at
    /// most one.
    pub same_host: bool,
}

/// Most runs a described frame ([`Payload::runs`]) may stand for: a
/// segment of [`crate::req::MAX_DESCRIBED_SEGMENT`] bytes over 4 KiB pages
/// that follow no order is 17, each of its SGEs after the first adds
/// at most two ([`crate::req::DESCRIBED_SGES`]).
pub const MAX_RUNS: usize = 64;

/// A run of payload bytes in the sender's memory as the receiver maps it
/// (the same-host channel's one-copy path): offset and length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Run {
    /// Offset into the sender's memory (its guest RAM's memfd).
    pub at: u64,
    /// Bytes.
    pub len: u32,
}

/// Where a payload lies in the memory the peer maps: its runs, and the
/// keys of the MRs they are in (before one of those MRs changes, the
/// device waits until no peer may still read the payload from it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Located {
    pub runs: Vec<Run>,
    /// Each key once, in the order first met.
    pub keys: Vec<u32>,
}

impl Located {
    pub fn clear(&mut self) {
        self.runs.clear();
        self.keys.clear();
    }

    /// Notes that runs are in MR `key`: once per piece of an SGE list or
    /// READ response, not per run (a page each).
    pub fn key(&mut self, key: u32) {
        if !self.keys.contains(&key) {
            self.keys.push(key);
        }
    }

    /// Appends the run of `len` bytes at `at`: as part of the last run
    /// where it follows it in the view; `None` where that would make more
    /// than [`MAX_RUNS`].
    #[inline]
    pub fn push(&mut self, at: u64, len: u32) -> Option<()> {
        let full = self.runs.len() >= MAX_RUNS;
        match self.runs.last_mut() {
            Some(last) if last.at.checked_add(u64::from(last.len)) == Some(at) => {
                last.len = last.len.checked_add(len)?;
            }
            _ if full => return None,
            _ => self.runs.push(Run { at, len }),
        }
        Some(())
    }
}

/// A packet's payload: bytes of its frame, or runs of a view of the
/// sender's memory that the receiver maps read-only, each checked against
/// the view when the payload was made ([`Payload::runs`]): the receiver
/// places it straight from there, the payload's only copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Payload<'a>(Pieces<'a>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pieces<'a> {
    Bytes(&'a [u8]),
    Runs {
        view: &'a [u8],
        runs: &'a [Run],
        len: usize,
    },
}

impl<'a> From<&'a [u8]> for Payload<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        Self(Pieces::Bytes(bytes))
    }
}

impl<'a> Payload<'a> {
    /// `runs` of `view`; `None` if one is empty or leaves it, there are more than
    /// [`MAX_RUNS`] or they add up to more than `max` bytes (a peer's
    /// record is not trusted).
    pub fn runs(view: &'a [u8], runs: &'a [Run], max: usize) -> Option<Self> {
        if runs.len() > MAX_RUNS {
            return None;
        }
        let mut len = 0usize;
        for r in runs {
            let start = usize::try_from(r.at).ok()?;
            let n = usize::try_from(r.len).ok().filter(|&n| n > 0)?;
            view.get(start..start.checked_add(n)?)?;
            len = len.checked_add(n)?;
        }
        (len <= max).then_some(Self(Pieces::Runs { view, runs, len }))
    }

    /// Bytes of payload.
    pub fn len(&self) -> usize {
        match self.0 {
            Pieces::Bytes(b) => b.len(),
            Pieces::Runs { len, .. } => len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The payload's pieces, in order.
    pub fn pieces(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let (one, view, runs) = match self.0 {
            Pieces::Bytes(b) => (Some(b), &[][..], &[][..]),
            Pieces::Runs { view, runs, .. } => (None, view, runs),
        };
        one.into_iter().chain(runs.iter().map(move |r| {
            // Checked in `Payload::runs`.
            let start = usize::try_from(r.at).unwrap_or(usize::MAX);
            let end = start.saturating_add(r.len as usize);
            view.get(start..end).unwrap_or_default()
        }))
    }

    /// The bytes of a payload that is its frame's.
    pub fn bytes(&self) -> Option<&'a [u8]> {
        match self.0 {
            Pieces::Bytes(b) => Some(b),
            Pieces::Runs { .. } => None,
        }
    }
}

/// Addressing of an outgoing frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Addr {
    /// Our MAC.
    pub src_mac: Mac,
    /// Next hop's MAC.
    pub dst_mac: Mac,
    /// IP addressing (from the GIDs, see [`net::ip_from_gid`]).
    pub ip: IpInfo,
    /// UDP source port ([`net::udp_sport_for_qpn`]; unused by RoCE v1).
    pub udp_sport: u16,
    /// RoCE version and VLAN tag, from the source GID.
    pub encap: Encap,
}

/// Calls `f(header, offset)` for every extension header of `op`.
fn for_each_hdr(
    op: Opcode,
    mut f: impl FnMut(Hdrs, usize) -> Result<(), HdrError>,
) -> Result<(), HdrError> {
    op.info().hdrs.iter().try_for_each(|h| f(h, op.offset(h)))
}

/// Parses and validates a received frame, its ICRC included.
pub fn parse(frame: &[u8]) -> Result<Packet<'_>, ParseError> {
    parse_checked(frame, true)
}

/// [`parse`] of a frame that never crossed a wire (the same-host
/// channel's): every check but the ICRC's, and the packet may be a
/// segment ([`Packet::same_host`]).
pub fn parse_unsealed(frame: &[u8]) -> Result<Packet<'_>, ParseError> {
    parse_checked(frame, false)
}

/// The network header (IP or GRH), the UDP header (empty for RoCE v1) and
/// the transport part of a frame with `layers`.
fn split_layers<'f>(frame: &'f [u8], layers: &Layers) -> Result<[&'f [u8]; 3], NetError> {
    let l3_end = layers.l3_off.saturating_add(layers.l3_len);
    let l3 = frame
        .get(layers.l3_off..l3_end)
        .ok_or(NetError::Truncated("IP"))?;
    let udp = frame
        .get(l3_end..layers.ib_off)
        .ok_or(NetError::Truncated("UDP"))?;
    let ib = frame
        .get(layers.ib_off..)
        .and_then(|s| s.get(..layers.ib_len))
        .ok_or(NetError::BadLength("UDP"))?;
    Ok([l3, udp, ib])
}

/// The ICRC of a packet of `version` over `covered` (the transport part
/// without its ICRC).
fn icrc_of(
    version: RoceVersion,
    l3: &[u8],
    udp: &[u8],
    covered: &[u8],
) -> Result<[u8; 4], IcrcError> {
    match version {
        RoceVersion::V1 => icrc_v1(l3, covered),
        RoceVersion::V2 => icrc(l3, udp, covered),
    }
}

fn parse_checked(frame: &[u8], check_icrc: bool) -> Result<Packet<'_>, ParseError> {
    let layers = net::parse_layers(frame)?;
    let [l3, udp, ib] = split_layers(frame, &layers)?;
    let bth = Bth::parse(ib)?;
    if bth.tver != BTH_TVER {
        return Err(ParseError::BadVersion(bth.tver));
    }
    let opcode = Opcode::try_from(bth.opcode)?;
    let hdr_len = opcode.hdr_len();
    let covered_len = ib.len().checked_sub(ICRC_LEN).ok_or(ParseError::Length)?;
    let payload_len = covered_len
        .checked_sub(hdr_len)
        .and_then(|l| l.checked_sub(usize::from(bth.pad)))
        .ok_or(ParseError::Length)?;
    if !opcode.is(OpClass::PAYLOAD) && (payload_len != 0 || bth.pad != 0) {
        return Err(ParseError::Length);
    }
    let (covered, wire_icrc) = ib.split_at_checked(covered_len).ok_or(ParseError::Length)?;
    if check_icrc
        && icrc_of(layers.encap.version, l3, udp, covered).map_err(|_| ParseError::BadIcrc)?
            != wire_icrc
    {
        return Err(ParseError::BadIcrc);
    }
    let mut hdrs = Headers {
        bth,
        ..Headers::default()
    };
    for_each_hdr(opcode, |h, off| {
        let at = ib.get(off..).unwrap_or_default();
        match h {
            Hdrs::RETH => hdrs.reth = Some(Reth::parse(at)?),
            Hdrs::AETH => hdrs.aeth = Some(Aeth::parse(at)?),
            Hdrs::DETH => hdrs.deth = Some(Deth::parse(at)?),
            Hdrs::IMMDT => hdrs.imm = Some(ImmDt::parse(at)?),
            Hdrs::IETH => hdrs.ieth = Some(Ieth::parse(at)?),
            Hdrs::ATMETH => hdrs.atomic = Some(AtomicEth::parse(at)?),
            _ => hdrs.atomic_ack = Some(AtomicAckEth::parse(at)?),
        }
        Ok(())
    })?;
    let payload = ib
        .get(hdr_len..)
        .and_then(|p| p.get(..payload_len))
        .ok_or(ParseError::Length)?;
    Ok(Packet {
        layers,
        opcode,
        hdrs,
        payload: payload.into(),
        same_host: !check_icrc,
    })
}

/// Builds a sealed frame (see [`build_unsealed`] and [`seal`]).
pub fn build(addr: &Addr, hdrs: &Headers, payload: &[u8]) -> Result<Vec<u8>, BuildError> {
    let mut frame = build_unsealed(addr, hdrs, payload.len(), |dst| {
        dst.copy_from_slice(payload);
        true
    })?;
    seal(&mut frame)?;
    Ok(frame)
}

/// Builds a frame without its ICRC: sets the BTH pad count, writes every
/// header the opcode needs (an absent one is an error), then lets `fill`
/// write the `payload_len` payload bytes in place (false: unreadable).
/// The payload is the caller's own data, bounded by its path MTU (or a
/// segment's length, see [`crate::req::MAX_SEGMENT`]).
pub fn build_unsealed(
    addr: &Addr,
    hdrs: &Headers,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]) -> bool,
) -> Result<Vec<u8>, BuildError> {
    let mut frame = spare_frame(frame_len(addr, hdrs, payload_len)?);
    write_unsealed(&mut frame, addr, hdrs, payload_len, fill)?;
    Ok(frame)
}

/// The length of the frame [`write_unsealed`] writes.
pub fn frame_len(addr: &Addr, hdrs: &Headers, payload_len: usize) -> Result<usize, BuildError> {
    let opcode = Opcode::try_from(hdrs.bth.opcode)?;
    if !opcode.is(OpClass::PAYLOAD) && payload_len != 0 {
        return Err(BuildError::Length);
    }
    let pad = payload_len.wrapping_neg() & 3;
    let ib_len = opcode
        .hdr_len()
        .checked_add(payload_len)
        .and_then(|l| l.checked_add(pad))
        .and_then(|l| l.checked_add(ICRC_LEN))
        .filter(|&l| l <= MAX_IB_LEN)
        .ok_or(BuildError::Length)?;
    Ok(net::headers_len(&addr.ip, addr.encap).saturating_add(ib_len))
}

/// [`build_unsealed`] into `frame`, of [`frame_len`] bytes, wherever it
/// lies (a buffer, or a same-host ring straight away): every byte is
/// written, the payload by `fill` only (no pass over it beforehand).
pub fn write_unsealed(
    frame: &mut [u8],
    addr: &Addr,
    hdrs: &Headers,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]) -> bool,
) -> Result<(), BuildError> {
    if frame_len(addr, hdrs, payload_len)? != frame.len() {
        return Err(BuildError::Length);
    }
    let opcode = Opcode::try_from(hdrs.bth.opcode)?;
    let pad = payload_len.wrapping_neg() & 3;
    let hl = net::headers_len(&addr.ip, addr.encap);
    // All but the payload is zeroed first: reserved fields, pad, ICRC.
    let payload_at = hl.saturating_add(opcode.hdr_len());
    let (head, rest) = frame
        .split_at_mut_checked(payload_at)
        .ok_or(BuildError::Length)?;
    head.fill(0);
    rest.get_mut(payload_len..).unwrap_or_default().fill(0);
    let (_, ib) = frame.split_at_mut(hl);
    let mut bth = hdrs.bth;
    bth.pad = (pad & 3) as u8;
    bth.write(ib)?;
    let mut missing = None;
    for_each_hdr(opcode, |h, off| {
        let at = ib.get_mut(off..).unwrap_or_default();
        let res = match h {
            Hdrs::RETH => hdrs.reth.map(|x| x.write(at)),
            Hdrs::AETH => hdrs.aeth.map(|x| x.write(at)),
            Hdrs::DETH => hdrs.deth.map(|x| x.write(at)),
            Hdrs::IMMDT => hdrs.imm.map(|x| x.write(at)),
            Hdrs::IETH => hdrs.ieth.map(|x| x.write(at)),
            Hdrs::ATMETH => hdrs.atomic.map(|x| x.write(at)),
            _ => hdrs.atomic_ack.map(|x| x.write(at)),
        };
        match res {
            Some(r) => r,
            None => {
                missing = Some(h);
                Ok(())
            }
        }
    })?;
    if let Some(h) = missing {
        return Err(BuildError::MissingHeader(h));
    }
    let dst = ib
        .get_mut(opcode.hdr_len()..)
        .and_then(|s| s.get_mut(..payload_len))
        .ok_or(BuildError::Length)?;
    if !fill(dst) {
        return Err(BuildError::Payload);
    }
    net::write_headers(
        frame,
        addr.src_mac,
        addr.dst_mac,
        &addr.ip,
        addr.udp_sport,
        addr.encap,
    )?;
    Ok(())
}

thread_local! {
    /// Frame buffers handed back with [`recycle`], for this thread's next
    /// [`build_unsealed`]: on the same-host channel a frame lives from its
    /// building to its copy into a ring, so the next frame can take its
    /// memory instead of an allocation.
    static SPARE: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}
/// Buffers kept per thread, and the largest kept (a segment's frame).
const SPARE_FRAMES: usize = 128;
const SPARE_CAPACITY: usize = 64 << 10;

/// A buffer of `len` bytes, recycled if one is spare (then it holds an
/// old frame's bytes: the caller overwrites them all), the latest
/// recycled first (its memory is the likeliest to be in cache).
fn spare_frame(len: usize) -> Vec<u8> {
    let mut frame = SPARE.with_borrow_mut(Vec::pop).unwrap_or_default();
    if frame.len() >= len {
        frame.truncate(len);
    } else {
        frame.resize(len, 0);
    }
    frame
}

/// A frame of `len` bytes that `write` writes in a spare buffer; `None`
/// (the buffer recycled) when `write` fails.
pub fn build_in_buffer(len: usize, write: &mut dyn FnMut(&mut [u8]) -> bool) -> Option<Vec<u8>> {
    let mut frame = spare_frame(len);
    if write(&mut frame) {
        Some(frame)
    } else {
        recycle(frame);
        None
    }
}

/// Hands a sent frame's buffer back for this thread's next frame.
pub fn recycle(frame: Vec<u8>) {
    if frame.capacity() > SPARE_CAPACITY {
        return;
    }
    SPARE.with_borrow_mut(|spare| {
        if spare.len() < SPARE_FRAMES {
            spare.push(frame);
        }
    });
}

/// Seals a frame of [`build_unsealed`] for a wire: its ICRC and, for
/// IPv6, the UDP checksum over it. Hostile-input tests also reseal the
/// frames they forge with it, so that their mutations reach the transport
/// instead of dying at the ICRC check.
pub fn seal(frame: &mut [u8]) -> Result<(), BuildError> {
    let layers = net::parse_layers(frame)?;
    let l3_end = layers.l3_off.saturating_add(layers.l3_len);
    let (l3udp, rest) = frame
        .split_at_mut_checked(layers.ib_off)
        .ok_or(NetError::Truncated("UDP"))?;
    let ib = rest
        .get_mut(..layers.ib_len)
        .ok_or(NetError::BadLength("UDP"))?;
    let (l3, udp) = l3udp.split_at(l3_end);
    let covered_len = ib.len().checked_sub(ICRC_LEN).ok_or(BuildError::Length)?;
    let (covered, icrc_out) = ib.split_at_mut(covered_len);
    icrc_out.copy_from_slice(&icrc_of(
        layers.encap.version,
        l3.get(layers.l3_off..).unwrap_or_default(),
        udp,
        covered,
    )?);
    net::finish_udp6_checksum(frame);
    Ok(())
}

/// A packet as `parse` would return it, on loopback IPv4 with `hdrs`:
/// what the role tests (completer, responder) feed their state machines.
#[cfg(test)]
pub(crate) fn test_packet(op: Opcode, hdrs: Headers, payload: &[u8]) -> Packet<'_> {
    let ip = std::net::Ipv4Addr::LOCALHOST.into();
    Packet {
        layers: Layers {
            src_mac: [0; 6],
            dst_mac: [0; 6],
            encap: Encap::V2,
            ip: IpInfo {
                src: ip,
                dst: ip,
                tclass: 0,
                hop_limit: 0,
                flow_label: 0,
            },
            udp_sport: 0,
            l3_off: 14,
            l3_len: 20,
            ib_off: 42,
            ib_len: 0,
        },
        opcode: op,
        hdrs,
        payload: payload.into(),
        same_host: false,
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
    use std::net::Ipv4Addr;

    use super::*;
    use crate::hdr::{NakCode, Syndrome};
    use crate::psn::Psn;

    fn addr(v6: bool) -> Addr {
        let ip = if v6 {
            IpInfo {
                src: "fe80::1".parse().unwrap(),
                dst: "fe80::2".parse().unwrap(),
                tclass: 0,
                hop_limit: 64,
                flow_label: 0,
            }
        } else {
            IpInfo {
                src: Ipv4Addr::new(10, 0, 0, 1).into(),
                dst: Ipv4Addr::new(10, 0, 0, 2).into(),
                tclass: 0,
                hop_limit: 64,
                flow_label: 0,
            }
        };
        Addr {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            ip,
            udp_sport: 0xc001,
            encap: Encap::V2,
        }
    }

    fn write_imm() -> Headers {
        Headers {
            bth: Bth {
                opcode: Opcode::RcRdmaWriteOnlyWithImmediate as u8,
                pkey: 0xffff,
                dqpn: 0x11,
                psn: Psn::new(0xff_fffe),
                ack_req: true,
                ..Bth::default()
            },
            reth: Some(Reth {
                va: 0x1000,
                rkey: 0x42,
                len: 5,
            }),
            imm: Some(ImmDt { imm: 0xdead_beef }),
            ..Headers::default()
        }
    }

    #[test]
    fn build_parse_roundtrip_v4_v6() {
        for v6 in [false, true] {
            let f = build(&addr(v6), &write_imm(), b"hello").unwrap();
            let p = parse(&f).unwrap();
            assert_eq!(p.opcode, Opcode::RcRdmaWriteOnlyWithImmediate);
            assert_eq!(p.payload.bytes(), Some(&b"hello"[..]));
            assert_eq!(p.hdrs.bth.pad, 3);
            let mut want = write_imm();
            want.bth.pad = 3;
            assert_eq!(p.hdrs, want);
            assert_eq!(p.layers.ip, addr(v6).ip);
        }
    }

    #[test]
    fn unsealed_frames_parse_only_unsealed_until_sealed() {
        for v6 in [false, true] {
            let fill = |dst: &mut [u8]| {
                dst.copy_from_slice(b"hello");
                true
            };
            let mut f = build_unsealed(&addr(v6), &write_imm(), 5, fill).unwrap();
            assert_eq!(parse(&f), Err(ParseError::BadIcrc));
            assert_eq!(
                parse_unsealed(&f).unwrap().payload.bytes(),
                Some(&b"hello"[..])
            );
            seal(&mut f).unwrap();
            assert_eq!(f, build(&addr(v6), &write_imm(), b"hello").unwrap());
        }
        let unreadable = build_unsealed(&addr(false), &write_imm(), 5, |_| false);
        assert_eq!(unreadable, Err(BuildError::Payload));
    }

    #[test]
    fn a_recycled_buffer_builds_the_same_frame() {
        let ack = Headers {
            bth: Bth {
                opcode: Opcode::RcAcknowledge as u8,
                psn: Psn::new(9),
                ..Bth::default()
            },
            aeth: Some(Aeth {
                syndrome: Syndrome::Ack { credits: 31 },
                msn: 1,
            }),
            ..Headers::default()
        };
        let fresh = build(&addr(false), &ack, &[]).unwrap();
        recycle(vec![0xa5; 2000]);
        assert_eq!(build(&addr(false), &ack, &[]).unwrap(), fresh);
    }

    #[test]
    fn dst_ip_reads_what_parse_layers_reads() {
        for v6 in [false, true] {
            let f = build(&addr(v6), &write_imm(), b"hello").unwrap();
            assert_eq!(net::dst_ip(&f), Some(addr(v6).ip.dst));
        }
        assert_eq!(net::dst_ip(&[0u8; 20]), None);
    }

    #[test]
    fn ack_without_payload() {
        let h = Headers {
            bth: Bth {
                opcode: Opcode::RcAcknowledge as u8,
                dqpn: 7,
                ..Bth::default()
            },
            aeth: Some(Aeth {
                syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                msn: 3,
            }),
            ..Headers::default()
        };
        let f = build(&addr(false), &h, &[]).unwrap();
        assert_eq!(f.len(), 14 + 20 + 8 + 16 + 4);
        assert_eq!(parse(&f).unwrap().hdrs.aeth, h.aeth);
        assert_eq!(build(&addr(false), &h, b"x"), Err(BuildError::Length));
        let no_aeth = Headers { aeth: None, ..h };
        assert_eq!(
            build(&addr(false), &no_aeth, &[]),
            Err(BuildError::MissingHeader(Hdrs::AETH))
        );
    }

    #[test]
    fn hostile_frames_are_errors() {
        let f = build(&addr(false), &write_imm(), b"hello").unwrap();
        // Every truncation (the IP/UDP lengths then disagree) is an error.
        for n in 0..f.len() {
            assert!(parse(&f[..n]).is_err());
        }
        // Any single bit flip in the transport part breaks the ICRC (or an
        // earlier check), never panics.
        for i in 42..f.len() {
            if i == 46 {
                continue; // FECN/BECN/reserved: masked out of the ICRC by design
            }
            for bit in 0..8 {
                let mut g = f.clone();
                g[i] ^= 1 << bit;
                assert!(parse(&g).is_err(), "byte {i} bit {bit}");
            }
        }
        let mut g = f.clone();
        g[42] = 0x15; // reserved opcode
        assert_eq!(parse(&g), Err(ParseError::Opcode(UnknownOpcode(0x15))));
        let mut g = f.clone();
        g[43] |= 1; // tver
        assert_eq!(parse(&g), Err(ParseError::BadVersion(1)));
        let mut g = f;
        g[43] = 0x30; // pad 3 is fine; claim payload-less opcode instead
        g[42] = Opcode::RcAcknowledge as u8;
        assert_eq!(parse(&g), Err(ParseError::Length));
    }

    fn v1_addr(vlan: Option<u16>, v6: bool) -> Addr {
        Addr {
            encap: Encap {
                version: RoceVersion::V1,
                vlan,
            },
            ..addr(v6)
        }
    }

    #[test]
    fn v1_and_tagged_frames_roundtrip() {
        let cases = [
            v1_addr(None, false),
            v1_addr(None, true),
            v1_addr(Some(100), false),
            Addr {
                encap: Encap {
                    version: RoceVersion::V2,
                    vlan: Some(100),
                },
                ..addr(true)
            },
        ];
        for a in cases {
            let f = build(&a, &write_imm(), b"hello").unwrap();
            let tag = if a.encap.vlan.is_some() { 4 } else { 0 };
            let ethertype = if a.encap.version == RoceVersion::V1 {
                [0x89, 0x15]
            } else {
                [0x86, 0xdd]
            };
            assert_eq!(f[12 + tag..14 + tag], ethertype, "{a:?}");
            let p = parse(&f).unwrap();
            assert_eq!(p.payload.bytes(), Some(&b"hello"[..]));
            assert_eq!((p.layers.encap, p.layers.ip), (a.encap, a.ip));
            let mut want = write_imm();
            want.bth.pad = 3;
            assert_eq!(p.hdrs, want);
            // Unsealed, then sealed: the same frame.
            let fill = |dst: &mut [u8]| {
                dst.copy_from_slice(b"hello");
                true
            };
            let mut u = build_unsealed(&a, &write_imm(), 5, fill).unwrap();
            assert_eq!(parse(&u), Err(ParseError::BadIcrc));
            assert_eq!(
                parse_unsealed(&u).unwrap().payload.bytes(),
                Some(&b"hello"[..])
            );
            seal(&mut u).unwrap();
            assert_eq!(u, f);
        }
        // RoCE v1: no IP, no UDP; the GRH counts the transport part.
        let f = build(&v1_addr(None, false), &write_imm(), b"hello").unwrap();
        assert_eq!(f.len(), 14 + 40 + 12 + 16 + 4 + 8 + 4);
        assert_eq!(u16::from_be_bytes([f[18], f[19]]), 12 + 16 + 4 + 8 + 4);
    }

    /// A RoCE v1 frame stays a RoCE v1 frame: its ICRC is not a v2 one, so
    /// the same bytes relabelled do not pass (and vice versa).
    #[test]
    fn v1_icrc_is_its_own() {
        let f = build(&v1_addr(None, true), &write_imm(), b"hello").unwrap();
        // The GRH as an IPv6 header: next header 0x1B is not UDP.
        let mut g = f.clone();
        g[12..14].copy_from_slice(&[0x86, 0xdd]);
        assert!(matches!(
            parse(&g),
            Err(ParseError::Net(NetError::BadIp(_)))
        ));
        let v2 = build(&addr(true), &write_imm(), b"hello").unwrap();
        let covered = &f[54..f.len() - 4];
        assert_ne!(
            f[f.len() - 4..],
            icrc(&v2[14..54], &v2[54..62], covered).unwrap()
        );
    }

    #[test]
    fn hostile_v1_frames_are_errors() {
        for vlan in [None, Some(100)] {
            let f = build(&v1_addr(vlan, false), &write_imm(), b"hello").unwrap();
            let l3 = if vlan.is_some() { 18 } else { 14 };
            for n in 0..f.len() {
                assert!(parse(&f[..n]).is_err(), "prefix {n}");
            }
            // Every bit of the GRH and the transport part counts, but the
            // masked ones (traffic class, flow label, hop limit, the BTH's
            // FECN/BECN/reserved byte).
            let masked = |i: usize, bit: u8| {
                (i == l3 && bit < 4)
                    || (l3 + 1..=l3 + 3).contains(&i)
                    || i == l3 + 7
                    || i == l3 + 44
            };
            for i in l3..f.len() {
                for bit in 0..8 {
                    let mut g = f.clone();
                    g[i] ^= 1 << bit;
                    let r = parse(&g);
                    if masked(i, bit) {
                        assert!(r.is_ok(), "byte {i} bit {bit} is masked");
                    } else {
                        assert!(r.is_err(), "byte {i} bit {bit}");
                    }
                }
            }
            // A GRH that claims more than the frame holds, or less than
            // headers and ICRC.
            for paylen in [0u16, 3, 27, 45, 0xffff] {
                let mut g = f.clone();
                g[l3 + 4..l3 + 6].copy_from_slice(&paylen.to_be_bytes());
                assert!(parse(&g).is_err(), "payload length {paylen}");
                assert!(seal(&mut g).is_err() || parse(&g).is_err());
            }
            // Resealed forgeries reach the transport checks.
            let mut g = f.clone();
            g[l3 + 40] = 0x15; // reserved opcode
            seal(&mut g).unwrap();
            assert_eq!(parse(&g), Err(ParseError::Opcode(UnknownOpcode(0x15))));
            let mut g = f.clone();
            g[l3 + 41] |= 1; // tver
            seal(&mut g).unwrap();
            assert_eq!(parse(&g), Err(ParseError::BadVersion(1)));
        }
    }

    #[test]
    fn short_transport_part_is_length_error() {
        // A frame whose UDP payload is only a BTH and ICRC for an opcode
        // needing a RETH.
        let h = Headers {
            bth: Bth {
                opcode: Opcode::RcSendOnly as u8,
                ..Bth::default()
            },
            ..Headers::default()
        };
        let mut f = build(&addr(false), &h, &[]).unwrap();
        f[42] = Opcode::RcRdmaWriteOnly as u8;
        assert_eq!(parse(&f), Err(ParseError::Length));
    }

    #[test]
    fn seeded_garbage_never_panics() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let bases = [
            build(&addr(true), &write_imm(), b"payload!").unwrap(),
            build(&v1_addr(Some(7), true), &write_imm(), b"payload!").unwrap(),
        ];
        for n in 0..40_000 {
            let base = &bases[n % 2];
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut g = base.clone();
            let i = (x as usize) % g.len();
            g[i] = (x >> 32) as u8;
            g.truncate(((x >> 40) as usize) % (base.len() + 1));
            let _ = parse(&g);
            let _ = seal(&mut g);
            let _ = net::dst_ip(&g);
        }
    }
}
