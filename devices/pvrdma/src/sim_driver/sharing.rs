// SPDX-License-Identifier: Apache-2.0
//! Two ends of the same-host channel that share memory (`share_memory=on`),
//! for tests and the `described_record` fuzz target: A hands B, with its
//! ring, a view of A's "guest RAM" (a sealed memfd), and then writes
//! whatever records it likes into B's ring, as a hostile VMM can. What B
//! makes of each is what its device would place.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use rdma_transport::packet::{Packet, Run};

use crate::datapath::local::{Batch, LocalChannel, Sent, Wake};
use crate::datapath::{shm_ring, view};

/// A's memory, as B may read it through the view.
pub const RAM: usize = 64 << 10;

/// What a described record starts with (a fuzzer puts it before raw bytes).
pub const DESCRIBED_TAG: [u8; 6] = view::DESCRIBED;

/// The seals a VMM's guest RAM has (`share_memory=on` requires them).
pub const SEALED: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// Guest RAM as a memfd of [`RAM`] bytes with `seals`, holding `bytes` at
/// its start, and the read-only descriptor of it a VMM shares with peers.
pub fn guest_ram(bytes: &[u8], seals: libc::c_int) -> (File, File) {
    let mut file = shm_ring::memfd(RAM, seals).expect("memfd");
    file.write_all(bytes).expect("guest RAM");
    let ro = view::read_only(&file).expect("read-only view");
    (file, ro)
}

/// A sharing pair: A's records go to B.
pub struct SharingPair {
    a: LocalChannel,
    b: LocalChannel,
    mac_b: [u8; 6],
    dir: PathBuf,
    ram: Vec<u8>,
    batch: Batch,
}

impl SharingPair {
    /// A and B in a directory of their own, A's memory a known pattern,
    /// A's ring to B handed over with A's view and B's answer read.
    pub fn new() -> Self {
        static PAIRS: AtomicU32 = AtomicU32::new(0);
        let n = PAIRS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pvrdma-sharing-{}-{n}", std::process::id()));
        let n = n.to_le_bytes()[0];
        let (mac_a, mac_b) = ([2, 0, 0, 2, n, 1], [2, 0, 0, 2, n, 2]);
        let ram: Vec<u8> = (0..=255u8).cycle().take(RAM).collect();
        let mut a = LocalChannel::bind(&dir, mac_a, false).expect("bind A");
        let mut b = LocalChannel::bind(&dir, mac_b, false).expect("bind B");
        a.share(guest_ram(&ram, SEALED).1);
        b.share(guest_ram(&[], SEALED).1);
        let mut pair = Self {
            a,
            b,
            mac_b,
            dir,
            ram,
            batch: Batch::default(),
        };
        assert_eq!(pair.a.send(mac_b, b"hello"), Sent::Local);
        pair.b.recv(8, Wake::Socket, &mut pair.batch);
        pair.batch.release();
        pair.a.recv(8, Wake::Socket, &mut pair.batch);
        pair.batch.release();
        assert!(pair.a.shares_with(mac_b), "B took A's view");
        pair
    }

    /// A's memory.
    pub fn ram(&self) -> &[u8] {
        &self.ram
    }

    /// A described record: `runs` (offset, length) of A's memory said to
    /// hold `payload` bytes, and `frame` after them (a well-behaved sender
    /// builds it for an empty payload). `None` if the record cannot be
    /// laid out (more runs than a count holds).
    pub fn described(runs: &[(u64, u32)], payload: usize, frame: &[u8]) -> Option<Vec<u8>> {
        let runs: Vec<Run> = runs.iter().map(|&(at, len)| Run { at, len }).collect();
        let mut record = vec![0u8; view::described_len(frame.len(), runs.len())?];
        let ok = view::write_described(&mut record, &runs, payload, &mut |out| {
            out.get_mut(..frame.len())
                .map(|o| o.copy_from_slice(frame))
                .is_some()
        });
        ok.then_some(record)
    }

    /// A writes `records` into B's ring; B takes them and gives `take`
    /// each in order: the packet its device would run (payload in A's
    /// memory for a described record), or `None` for a record dropped as
    /// bad. Returns whether they all reached B's ring (a full ring loses
    /// the rest, as a real one would).
    pub fn deliver(
        &mut self,
        records: &[&[u8]],
        take: &mut dyn FnMut(Option<&Packet<'_>>),
    ) -> bool {
        let sent = records
            .iter()
            .all(|r| self.a.send(self.mac_b, r) == Sent::Local);
        self.b.recv(records.len(), Wake::Ring, &mut self.batch);
        for pkt in self.batch.packets() {
            take(pkt.as_ref().ok());
        }
        self.batch.release();
        sent
    }
}

impl Default for SharingPair {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for SharingPair {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
