// SPDX-License-Identifier: Apache-2.0
//! The device's side of the wire: RoCE frames in (steered off the shared
//! port before the NIC sees them) and out (through the port's backend),
//! and the addressing of outgoing frames from GIDs and MACs: the source
//! GID's type and VLAN frame them (RoCE v1 or v2, 802.1Q tag or none).
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use net_port::{FrameBackend, VnetHdr};
use rdma_transport::net::{
    dst_ip, gid_from_ip, ip_from_gid, parse_layers, udp_sport_for_qpn, Encap, IpInfo, Mac,
    RoceVersion,
};
use rdma_transport::packet::Located;
use rdma_transport::packet::{build_in_buffer, recycle, seal, Addr};
use rdma_transport::verbs::PacketSink;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::local::{InPlace, LocalChannel, Sent};
use super::view;
use crate::metrics::Metrics;
use crate::namespace::mr_index;
use crate::objects::gid::{Gid, GidTable};

/// Received frames waiting for the worker: beyond this, frames are
/// dropped (RC retransmits them), so a flood cannot grow the VMM.
pub(crate) const INBOX_FRAMES: usize = 1024;
/// Default hop limit / TTL of RoCE v2 packets (rxe's).
const DEFAULT_HOP_LIMIT: u8 = 64;

/// Buffers the inbox keeps for the next frames (see [`Queue::spare`]).
const SPARE_FRAMES: usize = 64;
/// The largest buffer kept: a jumbo frame's (RoCE at a 4096-byte path MTU
/// in an Ethernet MTU of 9000) and then some.
const SPARE_CAPACITY: usize = 16 << 10;

#[derive(Debug, Default)]
struct Queue {
    frames: VecDeque<Vec<u8>>,
    /// Buffers of frames the worker is done with ([`Inbox::give_back`]):
    /// [`Inbox::offer`] copies the next frames into them instead of
    /// allocating a buffer per frame on the NIC's thread.
    spare: Vec<Vec<u8>>,
}

/// RoCE frames steered to the device, for the worker.
#[derive(Debug)]
pub(crate) struct Inbox {
    queue: Mutex<Queue>,
    /// Signalled when the queue stops being empty; the worker watches it
    /// edge-triggered and never reads it.
    pub(crate) evt: EventFd,
    /// The guest driver has activated the device: until then (and after
    /// RESET) RoCE frames go to the NIC like any other.
    open: AtomicBool,
    /// The device is paused: RoCE frames are claimed and dropped (a
    /// paused VM must not see them on its NIC either).
    discard: AtomicBool,
    metrics: Arc<Metrics>,
}

impl Inbox {
    pub(crate) fn new(metrics: Arc<Metrics>) -> std::io::Result<Self> {
        Ok(Self {
            queue: Mutex::new(Queue::default()),
            evt: EventFd::new(EFD_NONBLOCK)?,
            open: AtomicBool::new(false),
            discard: AtomicBool::new(false),
            metrics,
        })
    }

    pub(crate) fn set_open(&self, open: bool) {
        self.open.store(open, Ordering::Release);
        if !open {
            self.lock().frames.clear();
        }
    }

    /// Whether the device takes RoCE frames (active), and if so whether
    /// it keeps them (`Some(false)`: paused, the caller drops and counts
    /// them as `roce_rx_dropped`).
    pub(crate) fn admits(&self) -> Option<bool> {
        if !self.open.load(Ordering::Acquire) {
            return None;
        }
        Some(!self.discard.load(Ordering::Acquire))
    }

    /// [`Inbox::admits`] for `frame`, if it is RoCE, v2 or v1, tagged or
    /// not (a dropped one is counted).
    fn claims(&self, frame: &[u8]) -> Option<bool> {
        parse_layers(frame).ok()?;
        let keep = self.admits()?;
        if !keep {
            self.metrics.roce_rx_dropped.inc();
        }
        Some(keep)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a copy of `frame` (the NIC's receive buffer) if it is RoCE
    /// and the device is active; true if taken (queued, or dropped).
    pub(crate) fn offer(&self, frame: &[u8]) -> bool {
        let claimed = self.claims(frame);
        if claimed == Some(true) {
            let mut queue = self.lock();
            let mut buf = queue.spare.pop().unwrap_or_default();
            buf.extend_from_slice(frame);
            self.queue_frame(queue, buf);
        }
        claimed.is_some()
    }

    /// Paused: frames are claimed and dropped (and those queued too).
    pub(crate) fn set_discard(&self, discard: bool) {
        self.discard.store(discard, Ordering::Release);
        if discard {
            self.lock().frames.clear();
        }
    }

    /// Queues a frame for the worker (also the loopback path).
    pub(crate) fn push(&self, frame: Vec<u8>) {
        self.queue_frame(self.lock(), frame);
    }

    fn queue_frame(&self, mut queue: std::sync::MutexGuard<'_, Queue>, frame: Vec<u8>) {
        if queue.frames.len() >= INBOX_FRAMES {
            self.metrics.roce_rx_dropped.inc();
            return;
        }
        let was_empty = queue.frames.is_empty();
        queue.frames.push_back(frame);
        drop(queue);
        // The worker drains the whole queue per wake-up: one wake-up per
        // batch, not per frame.
        if was_empty {
            if let Err(e) = self.evt.write(1) {
                log::warn!("pvrdma: cannot wake the worker for a received frame: {e}");
            }
        }
    }

    /// Up to `max` queued frames, oldest first.
    pub(crate) fn take(&self, max: usize) -> Vec<Vec<u8>> {
        let mut queue = self.lock();
        let n = queue.frames.len().min(max);
        queue.frames.drain(..n).collect()
    }

    /// Frames from [`Inbox::take`] the worker is done with: their buffers
    /// hold the next ones.
    pub(crate) fn give_back(&self, frames: Vec<Vec<u8>>) {
        let mut queue = self.lock();
        for mut buf in frames {
            if queue.spare.len() >= SPARE_FRAMES {
                break;
            }
            if buf.capacity() <= SPARE_CAPACITY {
                buf.clear();
                queue.spare.push(buf);
            }
        }
    }

    /// Frames still queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().frames.is_empty()
    }
}

/// Frames the engine emitted during one call, sent afterwards; or, for a
/// QP whose peer has an accepted same-host ring, written into that ring
/// (or its backlog) at once, in order, as they are built: the payload is
/// gathered from guest memory straight into the ring. That happens under
/// the state lock, which the channel holds for at most one socket send
/// of `SEND_WAIT` (asking a peer whose ring is full whether it is there).
#[derive(Debug, Default)]
pub(crate) struct Frames<'a> {
    /// Frames to send (see [`Wire::route`] and [`Wire::send`]).
    pub(crate) out: Vec<Vec<u8>>,
    /// The same-host peer: its channel, MAC, and our counters.
    same_host: Option<(&'a LocalChannel, [u8; 6], &'a Metrics)>,
    /// The peer maps our memory (see `view`).
    shares: bool,
}

impl<'a> Frames<'a> {
    /// The sink of a QP whose frames go to `dst_mac` over `local`.
    pub(crate) fn same_host(
        local: &'a LocalChannel,
        dst_mac: [u8; 6],
        metrics: &'a Metrics,
    ) -> Self {
        Self {
            out: Vec::new(),
            same_host: Some((local, dst_mac, metrics)),
            shares: local.shares_with(dst_mac),
        }
    }
}

impl PacketSink for Frames<'_> {
    fn send(&mut self, frame: Vec<u8>) {
        let Some((local, mac, metrics)) = self.same_host else {
            self.out.push(frame);
            return;
        };
        match local.send(mac, &frame) {
            Sent::Local => {
                metrics.roce_local_tx.inc();
                metrics.roce_local_copied.inc();
            }
            // The peer left since the run began: the frame may be a
            // segment, which no wire takes; RC resends it as MTU packets.
            Sent::Dropped | Sent::NotLocal => {
                metrics.roce_local_dropped.inc();
            }
        }
        recycle(frame);
    }

    fn send_in_place(&mut self, len: usize, write: &mut dyn FnMut(&mut [u8]) -> bool) -> bool {
        if let Some((local, mac, metrics)) = self.same_host {
            match local.push_with(mac, len, write) {
                InPlace::Pushed => {
                    metrics.roce_local_tx.inc();
                    return true;
                }
                InPlace::NotWritten => return false,
                InPlace::Elsewhere => {}
            }
        }
        build_in_buffer(len, write).is_some_and(|frame| {
            self.send(frame);
            true
        })
    }

    fn shares_memory(&self) -> bool {
        self.shares
    }

    fn send_described(
        &mut self,
        len: usize,
        located: &Located,
        payload_len: usize,
        write: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> bool {
        let Some((local, mac, metrics)) = self.same_host.filter(|_| self.shares) else {
            return false;
        };
        let runs = &located.runs;
        let Some(record_len) = view::described_len(len, runs.len()) else {
            return false;
        };
        let mut record = |out: &mut [u8]| view::write_described(out, runs, payload_len, write);
        let mrs = located.keys.iter().map(|&k| mr_index(k));
        match local.send_described(mac, record_len, mrs, &mut record) {
            Sent::Local => {
                metrics.roce_local_tx.inc();
                metrics.roce_local_described.inc();
            }
            // As for a segment (see `send`): RC sends it again.
            Sent::Dropped | Sent::NotLocal => {
                metrics.roce_local_dropped.inc();
            }
        }
        true
    }
}

/// Addressing of frames from `sgid` (ours, which frames them) to `dgid` at
/// `dmac`; `None` when RoCE v2 GIDs are not of the same IP version (a
/// RoCE v1 GRH carries any two GIDs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn addr(
    src_mac: Mac,
    sgid: &Gid,
    dgid: [u8; 16],
    dst_mac: Mac,
    tclass: u8,
    hop_limit: u8,
    flow_label: u32,
    qpn: u32,
) -> Option<Addr> {
    let (src, dst) = (ip_from_gid(sgid.raw), ip_from_gid(dgid));
    let encap = sgid.encap();
    if encap.version == RoceVersion::V2 && src.is_ipv4() != dst.is_ipv4() {
        return None;
    }
    Some(Addr {
        src_mac,
        dst_mac,
        ip: IpInfo {
            src,
            dst,
            tclass,
            // 0 is what the guest leaves when it means "default" (a GRH
            // with hop limit 0 would never leave the host).
            hop_limit: if hop_limit == 0 {
                DEFAULT_HOP_LIMIT
            } else {
                hop_limit
            },
            flow_label,
        },
        udp_sport: udp_sport_for_qpn(qpn),
        encap,
    })
}

/// The addressing of a QP that has no peer (UD, GSI: each send carries
/// its own): never used for a frame.
pub(crate) fn no_addr() -> Addr {
    let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    Addr {
        src_mac: [0; 6],
        dst_mac: [0; 6],
        ip: IpInfo {
            src: any,
            dst: any,
            tclass: 0,
            hop_limit: 0,
            flow_label: 0,
        },
        udp_sport: 0,
        encap: Encap::V2,
    }
}

/// The port's wire as the device uses it: the backend it sends through
/// and the inbox steered frames arrive in.
pub(crate) struct Wire {
    pub(crate) backend: Arc<dyn FrameBackend>,
    pub(crate) inbox: Arc<Inbox>,
    /// The same-host channel, unless disabled or unavailable.
    pub(crate) local: Option<LocalChannel>,
}

impl std::fmt::Debug for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wire")
            .field("inbox", &self.inbox)
            .field("local", &self.local)
            .finish()
    }
}

impl Wire {
    /// Loops the frames for one of our own GIDs (in `gids`) back into the
    /// inbox, sealed like every frame there (a TAP does not reflect a
    /// frame to its sender), and returns the others, for [`Wire::send`]
    /// once the state lock is released.
    pub(crate) fn route(
        &self,
        gids: &GidTable,
        metrics: &Metrics,
        frames: Vec<Vec<u8>>,
    ) -> Vec<Vec<u8>> {
        let mut out = Vec::with_capacity(frames.len());
        for mut frame in frames {
            let ours = dst_ip(&frame).is_some_and(|ip| gids.contains(&gid_from_ip(ip)));
            if ours {
                metrics.roce_loopback.inc();
                if seal(&mut frame).is_ok() {
                    self.inbox.push(frame);
                }
            } else {
                out.push(frame);
            }
        }
        out
    }

    /// Sends frames to a VMM of this host over the same-host channel when
    /// one owns the destination MAC, as they are (unsealed), else sealed
    /// onto the port's backend; then kicks the same-host consumers owed a
    /// kick (see [`LocalChannel::notify`]). Called once the state lock is
    /// released, after every run of the worker.
    pub(crate) fn send(&self, metrics: &Metrics, frames: Vec<Vec<u8>>) {
        if let Some(local) = self.local.as_ref() {
            // Frames that waited for room go before these.
            metrics.roce_local_dropped.add(local.flush() as u64);
        }
        for mut frame in frames {
            let dst_mac: Option<[u8; 6]> = frame.get(..6).and_then(|m| m.try_into().ok());
            let local = self
                .local
                .as_ref()
                .zip(dst_mac)
                .map(|(l, mac)| l.send(mac, &frame));
            match local {
                Some(Sent::Local) => {
                    metrics.roce_local_tx.inc();
                    recycle(frame);
                    continue;
                }
                Some(Sent::Dropped) => {
                    metrics.roce_local_dropped.inc();
                    recycle(frame);
                    continue;
                }
                Some(Sent::NotLocal) | None => {}
            }
            if let Err(e) = seal(&mut frame) {
                guest_warn!(metrics.roce_tx_error, "RoCE frame not sent: {e}");
                continue;
            }
            match self.backend.send(&VnetHdr::default(), &frame) {
                Ok(()) => {
                    metrics.roce_tx.inc();
                }
                Err(e) => {
                    guest_warn!(metrics.roce_tx_error, "RoCE frame not sent: {e}");
                }
            }
            recycle(frame);
        }
        if let Some(local) = self.local.as_ref() {
            // These frames', and those the engine put in rings before.
            metrics.roce_local_kicks.add(local.notify() as u64);
        }
    }
}
