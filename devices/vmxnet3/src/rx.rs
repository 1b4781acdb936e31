// SPDX-License-Identifier: Apache-2.0
//! RX: frames from the backend into a guest RX queue.
//!
//! The driver posts receive buffers in two rings. Ring 0 holds HEAD
//! buffers (one per packet, `mtu + 22` bytes, at least 128) and, when the
//! MTU needs more than 3 KiB, BODY pages after each HEAD; ring 1 holds BODY
//! pages. A frame takes a HEAD from ring 0, skipping ring-0 BODY buffers in
//! front of it (Linux re-posts skipped buffers when it sees the next
//! completion), then BODY buffers: ring 0's next one while it is a BODY,
//! else ring 1's. Each buffer used gets a completion, SOP on the first and
//! EOP on the last, then the queue's interrupt fires.
//!
//! The buffers for a whole frame are found (and checked) before anything
//! is written, so a frame either arrives complete or not at all: Linux
//! BUG()s on a SOP while a packet is still open. Without enough buffers
//! the frame is dropped and counted (`rx_no_buffer`), as a NIC does; a
//! buffer no driver would post (zero length, HEAD in ring 1, outside guest
//! RAM) stops the queue with RQERR.
//!
//! Completions say "checksum not calculated" (`cnc`): the backend hands
//! over whole frames (see `net_port::Tap`) and the guest verifies them.

use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions};

use crate::metrics::Vmxnet3Metrics;
use crate::ring::{CmdRing, CompRing, PosError, QueueFault, RingPos};
use crate::shared::RxQueueConf;
use crate::stats::RxStats;

/// Generation bit of an RX descriptor: bit 31 of dword 2.
const RXD_GEN_BIT: u32 = 31;
const RXD_LEN_MASK: u32 = 0x3fff;
/// `btype`: 1 for BODY buffers.
const RXD_BTYPE_BODY: u32 = 1 << 14;
/// Most buffers one frame may take. Linux needs 4 for 9000 bytes (a 3 KiB
/// HEAD and pages); more would only come from a driver posting tiny
/// buffers, whose frames are dropped as if buffers had run out.
const MAX_BUFFERS: usize = 32;
// RxCompDesc fields.
const RCD_IDX_MASK: u32 = 0xfff;
const RCD_EOP: u32 = 1 << 14;
const RCD_SOP: u32 = 1 << 15;
const RCD_RQID_SHIFT: u32 = 16;
const RCD_CNC: u32 = 1 << 30;
/// `VMXNET3_CDTYPE_RXCOMP`, in bits 24-30 of dword 3.
const RCD_TYPE_RXCOMP: u32 = 3 << 24;

/// One posted buffer, as the device found it.
#[derive(Clone, Copy, Debug, Default)]
struct Buffer {
    ring: usize,
    index: u32,
    addr: u64,
    len: u32,
    body: bool,
}

impl Buffer {
    fn decode(ring: usize, index: u32, raw: [u8; 16]) -> Self {
        let [a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, ..] = raw;
        let dw2 = u32::from_le_bytes([b0, b1, b2, b3]);
        Buffer {
            ring,
            index,
            addr: u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
            len: dw2 & RXD_LEN_MASK,
            body: dw2 & RXD_BTYPE_BODY != 0,
        }
    }
}

/// One RX queue of an activated device.
#[derive(Debug)]
pub(crate) struct RxQueue {
    pub(crate) conf: RxQueueConf,
    rings: [CmdRing; 2],
    comp: CompRing,
    /// `rqID` of ring 0 (the queue index) and of ring 1 (plus the number
    /// of RX queues), as Linux maps them back.
    rq_ids: [u32; 2],
    /// Stopped by a fault until the next activation.
    pub(crate) stopped: bool,
}

impl RxQueue {
    pub(crate) fn new(conf: RxQueueConf, index: usize, queues: usize) -> Self {
        let [r0, r1] = conf.rings;
        // Both below 16.
        let qid = u32::try_from(index).unwrap_or(0);
        let qid2 = u32::try_from(index.saturating_add(queues)).unwrap_or(0);
        RxQueue {
            rings: [
                CmdRing::new(r0.base, r0.size, RXD_GEN_BIT),
                CmdRing::new(r1.base, r1.size, RXD_GEN_BIT),
            ],
            comp: CompRing::new(conf.comp.base, conf.comp.size),
            rq_ids: [qid, qid2],
            conf,
            stopped: false,
        }
    }

    /// Where the device is in ring 0, ring 1 and the completion ring.
    pub(crate) fn positions(&self) -> [RingPos; 3] {
        let [r0, r1] = &self.rings;
        [r0.pos(), r1.pos(), self.comp.pos()]
    }

    /// Queue `index` of `queues` with `conf` as it was saved: at
    /// `positions`, maybe stopped.
    pub(crate) fn restore(
        conf: RxQueueConf,
        index: usize,
        queues: usize,
        [p0, p1, comp]: [RingPos; 3],
        stopped: bool,
    ) -> Result<Self, PosError> {
        let mut queue = Self::new(conf, index, queues);
        let [r0, r1] = &mut queue.rings;
        r0.set_pos(p0)?;
        r1.set_pos(p1)?;
        queue.comp.set_pos(comp)?;
        queue.stopped = stopped;
        Ok(queue)
    }

    /// Places `frame` in the guest's buffers. Returns whether it was
    /// delivered (completions written: interrupt the driver).
    pub(crate) fn deliver<M: GuestMemory>(
        &mut self,
        mem: &M,
        frame: &[u8],
        metrics: &Vmxnet3Metrics,
        stats: &mut RxStats,
    ) -> Result<bool, QueueFault> {
        let mut plan = [Buffer::default(); MAX_BUFFERS];
        let Some((used, taken)) = self.plan(mem, frame.len(), &mut plan)? else {
            stats.out_of_buf = stats.out_of_buf.wrapping_add(1);
            count_warn!(
                metrics.rx_no_buffer,
                "RX queue {} out of buffers, {}-byte frame dropped",
                self.rq_ids[0],
                frame.len()
            );
            return Ok(false);
        };
        let mut rest = frame;
        let last = used.saturating_sub(1);
        for (i, b) in plan.iter().take(used).enumerate() {
            let n = rest.len().min(usize::try_from(b.len).unwrap_or(usize::MAX));
            let (data, tail) = rest.split_at(n);
            rest = tail;
            mem.write_slice(data, GuestAddress(b.addr))
                .map_err(|_| QueueFault::BadRxBuffer {
                    ring: b.ring,
                    index: b.index,
                })?;
            let mut dw0 = (b.index & RCD_IDX_MASK) | RCD_CNC;
            if i == 0 {
                dw0 |= RCD_SOP;
            }
            if i == last {
                dw0 |= RCD_EOP;
            }
            let rq_id = self.rq_ids.get(b.ring).copied().unwrap_or(0);
            dw0 |= rq_id << RCD_RQID_SHIFT;
            // n <= len, a 14-bit field.
            let len = u32::try_from(n).unwrap_or(0);
            self.comp.push(mem, [dw0, 0, len, RCD_TYPE_RXCOMP])?;
        }
        for (ring, count) in self.rings.iter_mut().zip(taken) {
            ring.advance(count);
        }
        let len = u64::try_from(frame.len()).unwrap_or(u64::MAX);
        metrics.rx_frames.inc();
        metrics.rx_bytes.add(len);
        stats.received(frame);
        Ok(true)
    }

    /// Finds the buffers for a frame of `len` bytes without taking them:
    /// `Some((buffers used, entries to consume from each ring))`, or `None`
    /// if the guest has not posted enough.
    fn plan<M: GuestMemory>(
        &self,
        mem: &M,
        len: usize,
        plan: &mut [Buffer; MAX_BUFFERS],
    ) -> Result<Option<(usize, [u32; 2])>, QueueFault> {
        let [ring0, ring1] = &self.rings;
        let mut taken = [0u32; 2];
        // The HEAD: the first HEAD in ring 0; BODY buffers before it are
        // skipped. peek() returns None a whole ring ahead, ending the walk.
        let head = loop {
            let Some((index, raw)) = ring0.peek(mem, taken[0])? else {
                return Ok(None);
            };
            taken[0] = taken[0].wrapping_add(1);
            let b = Buffer::decode(0, index, raw);
            if !b.body {
                break b;
            }
        };
        let mut slots = plan.iter_mut();
        let mut used = 0usize;
        let mut remaining = len;
        let mut next = Some(head);
        while let Some(b) = next.take() {
            check_buffer(mem, &b)?;
            let Some(slot) = slots.next() else {
                return Ok(None);
            };
            *slot = b;
            used = used.wrapping_add(1);
            remaining = remaining.saturating_sub(usize::try_from(b.len).unwrap_or(usize::MAX));
            if remaining == 0 {
                return Ok(Some((used, taken)));
            }
            // The next BODY: ring 0's next entry if it is one, else ring 1's.
            let from0 = ring0
                .peek(mem, taken[0])?
                .map(|(index, raw)| Buffer::decode(0, index, raw))
                .filter(|b| b.body);
            next = match from0 {
                Some(b) => Some(b),
                None => ring1
                    .peek(mem, taken[1])?
                    .map(|(index, raw)| Buffer::decode(1, index, raw)),
            };
            if let Some(t) = next.as_ref().and_then(|b| taken.get_mut(b.ring)) {
                *t = t.wrapping_add(1);
            }
        }
        Ok(None)
    }
}

/// A buffer the driver could have posted: some length, HEAD only in ring
/// 0, and all of it in guest RAM.
fn check_buffer<M: GuestMemory>(mem: &M, b: &Buffer) -> Result<(), QueueFault> {
    let len = usize::try_from(b.len).unwrap_or(usize::MAX);
    let usable = b.len > 0
        && (b.ring == 0 || b.body)
        && mem.check_range(GuestAddress(b.addr), len, Permissions::Write);
    if usable {
        Ok(())
    } else {
        Err(QueueFault::BadRxBuffer {
            ring: b.ring,
            index: b.index,
        })
    }
}
