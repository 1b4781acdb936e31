// SPDX-License-Identifier: Apache-2.0
//! Test helpers: a mock backend, the
//! memory layout of a fake driver, and frame builders.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use net_port::{FrameBackend, VnetHdr};
use vm_memory::{Bytes, GuestAddress, GuestMemory};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// A backend in memory: frames sent are recorded, frames injected are
/// received, and an eventfd is readable while any are queued.
pub struct MockBackend {
    sent: Mutex<Vec<(VnetHdr, Vec<u8>)>>,
    /// When each frame of `sent` was sent.
    sent_at: Mutex<Vec<Instant>>,
    inbox: Mutex<VecDeque<(VnetHdr, Vec<u8>)>>,
    rx_evt: EventFd,
    link: AtomicBool,
    pub fail_send: AtomicBool,
    pub fail_recv: AtomicBool,
}

impl MockBackend {
    pub fn new(link: bool) -> Self {
        MockBackend {
            sent: Mutex::default(),
            sent_at: Mutex::default(),
            inbox: Mutex::default(),
            rx_evt: EventFd::new(EFD_NONBLOCK).unwrap(),
            link: AtomicBool::new(link),
            fail_send: AtomicBool::new(false),
            fail_recv: AtomicBool::new(false),
        }
    }

    pub fn inject_with(&self, hdr: VnetHdr, frame: Vec<u8>) {
        let mut inbox = self.inbox.lock().unwrap();
        inbox.push_back((hdr, frame));
        self.rx_evt.write(1).unwrap();
    }

    pub fn inject(&self, frame: Vec<u8>) {
        self.inject_with(VnetHdr::default(), frame);
    }

    /// Frames sent since the last call.
    pub fn take_sent(&self) -> Vec<(VnetHdr, Vec<u8>)> {
        self.sent_at.lock().unwrap().clear();
        std::mem::take(&mut *self.sent.lock().unwrap())
    }

    /// Frames sent since the last call, each with when it was sent.
    pub fn take_sent_timed(&self) -> Vec<(Instant, (VnetHdr, Vec<u8>))> {
        let times = std::mem::take(&mut *self.sent_at.lock().unwrap());
        times.into_iter().zip(self.take_sent()).collect()
    }

    /// Frames injected and not received yet.
    pub fn queued(&self) -> usize {
        self.inbox.lock().unwrap().len()
    }

    pub fn set_link(&self, up: bool) {
        self.link.store(up, Ordering::SeqCst);
    }

    /// Back as [`MockBackend::new`] with the link up made it: nothing
    /// sent or queued, nothing failing.
    pub fn clear(&self) {
        self.take_sent();
        self.inbox.lock().unwrap().clear();
        let _ = self.rx_evt.read();
        self.link.store(true, Ordering::SeqCst);
        self.fail_send.store(false, Ordering::SeqCst);
        self.fail_recv.store(false, Ordering::SeqCst);
    }
}

impl FrameBackend for MockBackend {
    fn send(&self, hdr: &VnetHdr, frame: &[u8]) -> io::Result<()> {
        if self.fail_send.load(Ordering::SeqCst) {
            return Err(io::Error::other("mock backend refuses"));
        }
        self.sent.lock().unwrap().push((*hdr, frame.to_vec()));
        self.sent_at.lock().unwrap().push(Instant::now());
        Ok(())
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<Option<(VnetHdr, usize)>> {
        if self.fail_recv.load(Ordering::SeqCst) {
            return Err(io::Error::other("TAP detached"));
        }
        let mut inbox = self.inbox.lock().unwrap();
        match inbox.pop_front() {
            Some((hdr, frame)) => {
                buf[..frame.len()].copy_from_slice(&frame);
                Ok(Some((hdr, frame.len())))
            }
            None => {
                let _ = self.rx_evt.read();
                Ok(None)
            }
        }
    }

    fn rx_fd(&self) -> RawFd {
        self.rx_evt.as_raw_fd()
    }

    fn link_up(&self) -> bool {
        self.link.load(Ordering::SeqCst)
    }
}

/// Where the fake driver puts DriverShared.
pub const SHARED: u64 = 0x1000;
const QUEUE_TABLE: u64 = 0x2000;
const TX_AREA: u64 = 0x10_0000;
const RX_AREA: u64 = 0x20_0000;
/// Room for one ring of 4096 entries.
const RING_ROOM: u64 = 0x1_0000;

/// What a driver puts in DriverShared and the queue descriptors; tests
/// change fields to make it hostile.
#[derive(Clone, Debug)]
pub struct DriverLayout {
    pub magic: u32,
    pub num_tx: u8,
    pub num_rx: u8,
    pub mtu: u32,
    pub num_intrs: u8,
    pub event_intr: u8,
    pub auto_mask: bool,
    pub tx_intr: Vec<u8>,
    pub rx_intr: Vec<u8>,
    pub ring_size: u32,
    pub rx_comp_size: u32,
    pub tx_ring_base: Vec<u64>,
    pub queue_table: u64,
}

impl DriverLayout {
    /// Linux's interrupt plan with shared TX/RX vectors: queue `i` uses
    /// vector `i`, the event vector comes last.
    pub fn new(num_tx: u8, num_rx: u8, ring_size: u32, mtu: u32) -> Self {
        let vectors = num_tx.max(num_rx);
        DriverLayout {
            magic: 0xbabe_fee1,
            num_tx,
            num_rx,
            mtu,
            num_intrs: vectors + 1,
            event_intr: vectors,
            auto_mask: true,
            tx_intr: (0..num_tx).collect(),
            rx_intr: (0..num_rx).collect(),
            ring_size,
            rx_comp_size: 2 * ring_size,
            tx_ring_base: (0..u64::from(num_tx))
                .map(|q| TX_AREA + q * 2 * RING_ROOM)
                .collect(),
            queue_table: QUEUE_TABLE,
        }
    }

    /// Where queue `i`'s descriptor is: wrapped past the end of the address
    /// space when a hostile table lies near it (the device checks what it
    /// reads; [`Self::write`] skips what is not RAM).
    pub fn queue_desc(&self, i: usize) -> u64 {
        self.queue_table.wrapping_add(256 * i as u64)
    }

    pub fn tx_ring(&self, q: usize) -> u64 {
        self.tx_ring_base
            .get(q)
            .copied()
            .unwrap_or(TX_AREA + q as u64 * 2 * RING_ROOM)
    }

    pub fn tx_comp(&self, q: usize) -> u64 {
        TX_AREA + q as u64 * 2 * RING_ROOM + RING_ROOM
    }

    pub fn rx_ring(&self, q: usize, ring: usize) -> u64 {
        RX_AREA + q as u64 * 4 * RING_ROOM + ring as u64 * RING_ROOM
    }

    pub fn rx_comp(&self, q: usize) -> u64 {
        RX_AREA + q as u64 * 4 * RING_ROOM + 2 * RING_ROOM
    }

    /// Writes DriverShared and the queue descriptors (rings stay as they are),
    /// each built in a buffer and written whole: one guest write per
    /// structure, not one per field (hostile layouts have 510 descriptors).
    pub fn write<M: GuestMemory>(&self, mem: &M) {
        fn put(buf: &mut [u8], off: usize, bytes: &[u8]) {
            buf[off..off + bytes.len()].copy_from_slice(bytes);
        }
        let mut shared = [0u8; 720];
        put(&mut shared, 0, &self.magic.to_le_bytes());
        put(&mut shared, 40, &self.queue_table.to_le_bytes());
        put(&mut shared, 56, &self.mtu.to_le_bytes());
        put(&mut shared, 62, &[self.num_tx, self.num_rx]);
        put(
            &mut shared,
            80,
            &[u8::from(self.auto_mask), self.num_intrs, self.event_intr],
        );
        // intrCtrl DISABLE_ALL, as Linux leaves it at activation.
        put(&mut shared, 108, &1u32.to_le_bytes());
        mem.write_slice(&shared, GuestAddress(SHARED)).unwrap();
        let tx = (0..usize::from(self.num_tx)).map(|q| {
            let sizes = [self.ring_size; 3];
            let intr = self.tx_intr.get(q).copied().unwrap_or(0);
            ([self.tx_ring(q), 0, self.tx_comp(q)], sizes, intr)
        });
        let rx = (0..usize::from(self.num_rx)).map(|q| {
            let rings = [self.rx_ring(q, 0), self.rx_ring(q, 1), self.rx_comp(q)];
            let sizes = [self.ring_size, self.ring_size, self.rx_comp_size];
            (rings, sizes, self.rx_intr.get(q).copied().unwrap_or(0))
        });
        // TX: ring at 16, completion ring at 32; RX: rings at 16 and 24,
        // completion ring at 32; then three sizes at 56 and the vector at 72.
        for (i, (rings, sizes, intr)) in tx.chain(rx).enumerate() {
            let d = self.queue_desc(i);
            if !mem.check_range(GuestAddress(d), 256, vm_memory::Permissions::Write) {
                continue;
            }
            let mut desc = [0u8; 256];
            for (k, ring) in rings.iter().enumerate() {
                put(&mut desc, 16 + 8 * k, &ring.to_le_bytes());
            }
            for (k, size) in sizes.iter().enumerate() {
                put(&mut desc, 56 + 4 * k, &size.to_le_bytes());
            }
            desc[72] = intr;
            mem.write_slice(&desc, GuestAddress(d)).unwrap();
        }
    }
}

/// An Ethernet header to 02:00:00:00:00:01 from 02:00:00:00:00:02.
fn ethernet(ethertype: u16) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

fn tcp_header(flags: u8) -> [u8; 20] {
    let mut tcp = [0u8; 20];
    tcp[..4].copy_from_slice(&[0x30, 0x39, 0x00, 0x50]);
    tcp[12] = 5 << 4;
    tcp[13] = flags | 0x10;
    tcp
}

/// A TCP/IPv4 frame with `payload` bytes and extra TCP `flags`.
pub fn tcp4_frame(payload: usize, flags: u8) -> Vec<u8> {
    let mut f = ethernet(0x0800);
    let total = (40 + payload) as u16;
    let [t0, t1] = total.to_be_bytes();
    f.extend_from_slice(&[
        0x45, 0, t0, t1, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ]);
    f.extend_from_slice(&tcp_header(flags));
    extend_cycled(&mut f, &COUNTING[..251], payload);
    f
}

/// A TCP/IPv6 frame with `payload` bytes.
pub fn tcp6_frame(payload: usize) -> Vec<u8> {
    let mut f = ethernet(0x86dd);
    let [l0, l1] = ((20 + payload) as u16).to_be_bytes();
    f.extend_from_slice(&[0x60, 0, 0, 0, l0, l1, 6, 64]);
    f.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    f.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    f.extend_from_slice(&tcp_header(0));
    extend_cycled(&mut f, &COUNTING[..251], payload);
    f
}

/// A frame of `len` bytes with a pattern seeded by `seed`.
pub fn frame(len: usize, seed: u8) -> Vec<u8> {
    let mut f = ethernet(0x88b5);
    let seed = usize::from(seed);
    extend_cycled(&mut f, &COUNTING[seed..seed + 256], len.saturating_sub(14));
    f
}

/// 0, 1, ..., 255, 0, 1, ..., 255: the frames' payload patterns are
/// windows of it.
const COUNTING: [u8; 512] = {
    let mut t = [0u8; 512];
    let mut i = 0;
    while i < t.len() {
        t[i] = i as u8;
        i += 1;
    }
    t
};

/// Appends `len` bytes of `cycle` repeated, a copy per cycle rather than a
/// byte at a time (the fuzz target makes frames of up to 64 KiB, and
/// coverage instrumentation made a byte-wise loop a seventh of its time).
fn extend_cycled(f: &mut Vec<u8>, cycle: &[u8], len: usize) {
    f.reserve(len);
    let mut left = len;
    while left > 0 {
        let n = left.min(cycle.len());
        f.extend_from_slice(&cycle[..n]);
        left -= n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The payloads are the patterns they always were, a byte at a time.
    #[test]
    fn frame_payloads_follow_their_patterns() {
        for len in [0, 1, 250, 251, 252, 256, 257, 5000] {
            let tcp: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            assert_eq!(tcp4_frame(len, 0)[54..], tcp[..], "tcp4 {len}");
            assert_eq!(tcp6_frame(len)[74..], tcp[..], "tcp6 {len}");
            for seed in [0u8, 7, 255] {
                let f = frame(len + 14, seed);
                let want: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_add(seed)).collect();
                assert_eq!(f[14..], want[..], "frame {len} seed {seed}");
            }
        }
    }
}
