// SPDX-License-Identifier: Apache-2.0
//! A single-producer single-consumer ring of frames in memory shared by
//! two VMM processes (a memfd both map): the same-host channel's data path.
//!
//! Layout: a 64-byte header (`head` at 0: bytes ever written; `tail` at
//! 8: bytes ever read; `waiting` at 16: the consumer is about to sleep),
//! then `cap` bytes of records, `cap` a power of two. A record is a
//! little-endian u32 length, the frame, and padding to 4 bytes; records
//! wrap around the end of the area. A length of [`SKIP`] instead says
//! that the rest of the area is unused and the next record is at its
//! start: the producer goes back to the start early, while its consumer
//! keeps up, so that the bytes in use stay within the first [`HOT`] of
//! the area, in the two CPUs' caches (a 64 KiB frame copied into a ring
//! that cycles through 4 MiB cost its producer 4.5-7.4 us of CPU on a
//! busy host, 3.2-4.2 us with a footprint of 1 MiB, docs/benchmarks.md),
//! and a record that would wrap around the end goes to the start whole
//! instead of through a buffer.
//!
//! The other process is not trusted: the consumer validates `head`, every
//! length, and copies a frame out before anyone parses it. A corrupt ring
//! is dropped, never read past. The memfd is sealed against shrinking and
//! growing before it is handed over, and a ring is mapped only with those
//! seals in place: a peer that could truncate the file under our mapping
//! would crash us with SIGBUS on the next access.
//!
//! Wake-ups follow virtio's notification suppression: the consumer sets
//! `waiting` and re-checks for data before it sleeps; the producer, after
//! publishing `head`, kicks the consumer only if it finds `waiting` set.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use net_port::MAX_FRAME_LEN;
use rdma_transport::packet::{build_in_buffer, recycle};
use vm_memory::mmap::MmapRegion;
use vm_memory::{Bytes, FileOffset, VolatileMemory, VolatileSlice};

const HEAD: usize = 0;
const TAIL: usize = 8;
const WAITING: usize = 16;
/// Bytes before the record area.
pub(crate) const HEADER: usize = 64;
const LEN: usize = 4;
/// The length of a record that skips the rest of the area.
const SKIP: u32 = u32::MAX;
/// Bytes of the area the producer keeps to while its consumer keeps up
/// (is at most [`KEPT_UP`] behind): it goes back to the start once a
/// record would end beyond them. The rest of the area is dead room until
/// the consumer passes the skip; a consumer further behind (a burst)
/// lets the producer use the whole area.
const HOT: u64 = 1 << 20;
/// How far behind a consumer may be for the producer to go back to the
/// start at [`HOT`]: the dead room lasts while the consumer reads this
/// much, and a burst meanwhile has `HOT` less this of room (with a
/// quarter of `HOT`, one QP's 1 MiB READ responses went through the
/// backlog, a copy more each, 102-180 frames per bench run against 0-16).
const KEPT_UP: u64 = 64 << 10;

/// A record the consumer found ([`ShmRing::next`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// Ring position of its frame.
    start: u64,
    /// Bytes of its frame.
    pub(crate) len: usize,
    /// Ring position after it (the consumer's next cursor).
    pub(crate) end: u64,
}

/// The writer of a frame given to [`ShmRing::push_with`] failed: nothing
/// was published.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NotWritten;

/// Why a ring was given up.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum RingError {
    #[error("shared ring of {0} bytes is not a power of two of 4 KiB to 64 MiB")]
    Size(usize),
    #[error("cannot map the shared ring")]
    Map,
    #[error("the peer corrupted the shared ring")]
    Corrupt,
    #[error("shared ring is not a memfd sealed against shrinking and growing")]
    Unsealed,
}

/// One direction of the channel between two VMMs.
#[derive(Debug)]
pub(crate) struct ShmRing {
    map: MmapRegion<()>,
    cap: usize,
}

/// Smallest and largest record areas accepted from a peer.
const MIN_CAP: usize = 4096;
const MAX_CAP: usize = 64 << 20;

/// The seals a ring's memfd must carry: its size is fixed for good.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// The seals of `file`; an error for a file that cannot be sealed (not
/// a memfd).
fn seals(file: &File) -> Result<libc::c_int, RingError> {
    // SAFETY: F_GET_SEALS on a descriptor `file` owns; no memory passed.
    let got = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    if got < 0 {
        return Err(RingError::Unsealed);
    }
    Ok(got)
}

impl ShmRing {
    /// Maps `file` (at least `HEADER + cap` bytes, sealed against
    /// resizing) as a ring of `cap` bytes.
    pub(crate) fn map(file: File, cap: usize) -> Result<Self, RingError> {
        if !cap.is_power_of_two() || !(MIN_CAP..=MAX_CAP).contains(&cap) {
            return Err(RingError::Size(cap));
        }
        // Before the size check: unsealed, the size could change after it.
        if seals(&file)? & SEALS != SEALS {
            return Err(RingError::Unsealed);
        }
        let size = cap.checked_add(HEADER).ok_or(RingError::Size(cap))?;
        let len = file.metadata().map_err(|_| RingError::Map)?.len();
        if len < size as u64 {
            return Err(RingError::Size(cap));
        }
        let map =
            MmapRegion::from_file(FileOffset::new(file, 0), size).map_err(|_| RingError::Map)?;
        Ok(Self { map, cap })
    }

    fn mem(&self) -> VolatileSlice<'_> {
        self.map.as_volatile_slice()
    }

    fn load(&self, at: usize) -> u64 {
        self.mem().load::<u64>(at, Ordering::Acquire).unwrap_or(0)
    }

    fn store(&self, at: usize, v: u64) {
        let _ = self.mem().store(v, at, Ordering::Release);
    }

    /// Offset in the mapping of ring position `pos`.
    fn at(&self, pos: u64) -> usize {
        // `cap` is a power of two no larger than 64 MiB.
        HEADER.saturating_add((pos & (self.cap as u64).wrapping_sub(1)) as usize)
    }

    /// Copies `data` in at ring position `pos`, wrapping.
    fn write_at(&self, pos: u64, data: &[u8]) {
        let start = self.at(pos);
        let room = HEADER.saturating_add(self.cap).saturating_sub(start);
        let (first, second) = data.split_at(room.min(data.len()));
        let _ = self.mem().write_slice(first, start);
        if !second.is_empty() {
            let _ = self.mem().write_slice(second, HEADER);
        }
    }

    /// Copies out `buf.len()` bytes at ring position `pos`, wrapping.
    fn read_at(&self, pos: u64, buf: &mut [u8]) {
        let start = self.at(pos);
        let room = HEADER.saturating_add(self.cap).saturating_sub(start);
        let (first, second) = buf.split_at_mut(room.min(buf.len()));
        let _ = self.mem().read_slice(first, start);
        if !second.is_empty() {
            let _ = self.mem().read_slice(second, HEADER);
        }
    }

    fn record_len(frame: usize) -> usize {
        LEN.saturating_add(frame).saturating_add(3) & !3
    }

    /// Producer: appends `frame`; false when the ring has no room (the
    /// consumer is slow or gone). Returns whether the consumer waits for a
    /// kick, in which case the caller must wake it.
    pub(crate) fn push(&self, frame: &[u8]) -> Option<bool> {
        let head = self.place(frame.len())?;
        self.write_at(head.wrapping_add(LEN as u64), frame);
        self.publish(head, frame.len())
    }

    /// Producer: appends a frame of `len` bytes that `write` writes in
    /// place, in the ring's memory (no copy of it elsewhere first; only a
    /// record that wraps around the end is written through a buffer);
    /// `Ok(None)` when the ring has no room, else as [`ShmRing::push`].
    pub(crate) fn push_with(
        &self,
        len: usize,
        write: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Result<Option<bool>, NotWritten> {
        let Some(head) = self.place(len) else {
            return Ok(None);
        };
        let start = self.at(head.wrapping_add(LEN as u64));
        if start.saturating_add(len) <= HEADER.saturating_add(self.cap) {
            // SAFETY: `start..start + len` lies within the mapping (checked
            // just above; the mapping is `HEADER + cap` bytes), and it is
            // the producer's part of the ring, free until `publish` moves
            // `head` past it: the consumer reads no byte there, and we are
            // its only producer (the caller holds the channel's lock).
            // JUSTIFICATION: writing the frame where it goes saves a copy
            // of every byte; the peer process could still write there
            // (hostile), which can only spoil the frame it is to receive:
            // the bytes are plain `u8`, and none is read back but by the
            // builder's own header checksums.
            let frame =
                unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().add(start), len) };
            if !write(frame) {
                return Err(NotWritten);
            }
        } else {
            let frame = build_in_buffer(len, write).ok_or(NotWritten)?;
            self.write_at(head.wrapping_add(LEN as u64), &frame);
            recycle(frame);
        }
        Ok(self.publish(head, len))
    }

    /// Where a record for a frame of `len` bytes goes, if it fits: at
    /// `head`, or at the start of the area when the record would end
    /// beyond [`HOT`] (or the area) and the start is free; then a
    /// [`SKIP`] record is written at `head`, published with the record.
    fn place(&self, len: usize) -> Option<u64> {
        let (head, tail) = (self.load(HEAD), self.load(TAIL));
        let cap = self.cap as u64;
        let used = head.wrapping_sub(tail);
        let need = Self::record_len(len) as u64;
        if used > cap || need > cap.saturating_sub(used) {
            return None;
        }
        u32::try_from(len).ok()?;
        let off = head & cap.wrapping_sub(1);
        let gap = cap.saturating_sub(off);
        let end = off.saturating_add(need);
        let kept_up = used <= KEPT_UP;
        let fits = used.saturating_add(gap).saturating_add(need) <= cap;
        if (end > cap || (end > HOT && kept_up)) && fits {
            self.write_at(head, &SKIP.to_le_bytes());
            return Some(head.wrapping_add(gap));
        }
        Some(head)
    }

    /// Writes the length of the frame of the record at `head` (written),
    /// publishes the record, and says whether the consumer waits for a
    /// kick.
    fn publish(&self, head: u64, len: usize) -> Option<bool> {
        let len32 = u32::try_from(len).ok()?;
        self.write_at(head, &len32.to_le_bytes());
        let new_head = head.wrapping_add(Self::record_len(len) as u64);
        // SeqCst: the head must be visible before `waiting` is read.
        let _ = self.mem().store(new_head, HEAD, Ordering::SeqCst);
        let waiting = self
            .mem()
            .load::<u64>(WAITING, Ordering::SeqCst)
            .unwrap_or(0);
        if waiting != 0 {
            self.store(WAITING, 0);
        }
        Some(waiting != 0)
    }

    /// Consumer: the record at ring position `pos` (the consumer's
    /// cursor: at or past `tail`, which moves only on
    /// [`ShmRing::release`], so the producer leaves the record alone
    /// while the consumer reads it in place); `Ok(None)` when there is
    /// none. Its length is read once and checked against what the producer
    /// published.
    /// A [`SKIP`] record before it is passed over; one that reaches
    /// `head` (a producer publishes a skip with the record after it) or
    /// beyond is corruption, and so is a second in a row.
    pub(crate) fn next(&self, pos: u64) -> Result<Option<Record>, RingError> {
        let (head, tail) = (self.load(HEAD), self.load(TAIL));
        let cap = self.cap as u64;
        if head.wrapping_sub(tail) > cap || head.wrapping_sub(pos) > cap {
            return Err(RingError::Corrupt);
        }
        let mut pos = pos;
        for _ in 0..2 {
            let used = head.wrapping_sub(pos);
            if used == 0 {
                return Ok(None);
            }
            if used < LEN as u64 {
                return Err(RingError::Corrupt);
            }
            let mut len = [0u8; LEN];
            self.read_at(pos, &mut len);
            let len = u32::from_le_bytes(len);
            if len == SKIP {
                let gap = cap.saturating_sub(pos & cap.wrapping_sub(1));
                if gap >= used {
                    return Err(RingError::Corrupt);
                }
                pos = pos.wrapping_add(gap);
                continue;
            }
            let len = len as usize;
            let rec = Self::record_len(len) as u64;
            if len > MAX_FRAME_LEN || rec > used {
                return Err(RingError::Corrupt);
            }
            return Ok(Some(Record {
                start: pos.wrapping_add(LEN as u64),
                len,
                end: pos.wrapping_add(rec),
            }));
        }
        Err(RingError::Corrupt)
    }

    /// The bytes of `r`, in place, unless they wrap around the end of the
    /// area (then [`ShmRing::copy`] them out).
    pub(crate) fn frame(&self, r: &Record) -> Option<&[u8]> {
        let at = self.at(r.start);
        if at.saturating_add(r.len) > HEADER.saturating_add(self.cap) {
            return None;
        }
        // SAFETY: `at..at + len` lies within the mapping (checked above),
        // which lives as long as `self`; the record was published by the
        // producer (`next` checked it against `head`) and stays unwritten
        // by a well-behaved producer until `release` moves `tail` past it.
        // JUSTIFICATION: reading the frame where it is saves a copy of
        // every byte received. A hostile producer may still write there
        // meanwhile: the bytes are plain `u8`, the slice's bounds are ours,
        // and everything taken from them (headers, lengths) is parsed once
        // and checked, so it can only spoil its own frame.
        Some(unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(at), r.len) })
    }

    /// Copies out the bytes of `r` (a frame that wraps) into `out`, of
    /// `r.len` bytes.
    pub(crate) fn copy(&self, r: &Record, out: &mut [u8]) {
        self.read_at(r.start, out);
    }

    /// Producer: bytes of records that still fit (a frame of up to this
    /// less its length word and padding goes in, at `head` or, after a
    /// skip, at the start of the area).
    pub(crate) fn room(&self) -> usize {
        let used = self.load(HEAD).wrapping_sub(self.load(TAIL));
        usize::try_from((self.cap as u64).saturating_sub(used)).unwrap_or(0)
    }

    /// Consumer: everything before `pos` is read; the producer may reuse it.
    pub(crate) fn release(&self, pos: u64) {
        self.store(TAIL, pos);
    }

    /// Producer: bytes written so far (the end of the last record).
    pub(crate) fn head(&self) -> u64 {
        self.load(HEAD)
    }

    /// Bytes the consumer has read so far: it moves when the consumer
    /// answers a kick.
    pub(crate) fn tail(&self) -> u64 {
        self.load(TAIL)
    }

    /// Consumer, before sleeping with every record read and released:
    /// announces it and says whether data came in meanwhile (then it must
    /// not sleep).
    pub(crate) fn prepare_to_wait(&self) -> bool {
        let _ = self.mem().store(1u64, WAITING, Ordering::SeqCst);
        let head = self.mem().load::<u64>(HEAD, Ordering::SeqCst).unwrap_or(0);
        head != self.load(TAIL)
    }

    /// Consumer: whether records wait past those released (what a peer
    /// says here is checked when they are read).
    pub(crate) fn has_data(&self) -> bool {
        self.load(HEAD) != self.load(TAIL)
    }
}

/// Positions for logs: bytes written, bytes read, and whether the
/// consumer announced a sleep.
impl std::fmt::Display for ShmRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "head={} tail={} waiting={}",
            self.load(HEAD),
            self.load(TAIL),
            self.load(WAITING)
        )
    }
}

/// A memfd of `size` bytes, sealed with `seals` (none: `0`): a ring's,
/// and the simulated driver's guest memory (`share_memory=on` hands it to
/// peers, who refuse it unsealed).
pub(crate) fn memfd(size: usize, seals: libc::c_int) -> std::io::Result<File> {
    use std::os::fd::FromRawFd;
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: memfd_create with a NUL-terminated name and flags only.
    let fd = unsafe { libc::memfd_create(c"pvrdma-local".as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size as u64)?;
    if seals != 0 {
        // SAFETY: F_ADD_SEALS on a descriptor `file` owns, flags only.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(file)
}

/// A fresh memfd-backed ring of `cap` bytes, and the file to hand over
/// (sealed: its size can no longer change).
pub(crate) fn create(cap: usize) -> std::io::Result<(ShmRing, File)> {
    let file = memfd(cap.saturating_add(HEADER), SEALS | libc::F_SEAL_SEAL)?;
    let ring =
        ShmRing::map(file.try_clone()?, cap).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok((ring, file))
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
mod tests {
    use super::*;

    /// The next frame, read in place or copied if it wraps, and released.
    fn pop(rx: &ShmRing) -> Result<Option<Vec<u8>>, RingError> {
        let Some(r) = rx.next(rx.tail())? else {
            return Ok(None);
        };
        let frame = rx.frame(&r).map(<[u8]>::to_vec).unwrap_or_else(|| {
            let mut out = vec![0; r.len];
            rx.copy(&r, &mut out);
            out
        });
        rx.release(r.end);
        Ok(Some(frame))
    }

    fn pair(cap: usize) -> (ShmRing, ShmRing) {
        let (tx, file) = create(cap).unwrap();
        (tx, ShmRing::map(file, cap).unwrap())
    }

    #[test]
    fn frames_cross_in_order_and_wrap() {
        let (tx, rx) = pair(4096);
        for round in 0..50u32 {
            let frames: Vec<Vec<u8>> = (0..5)
                .map(|i| vec![(round + i) as u8; 100 + 37 * i as usize])
                .collect();
            for f in &frames {
                assert!(tx.push(f).is_some());
            }
            for f in &frames {
                assert_eq!(pop(&rx).unwrap().as_ref(), Some(f));
            }
            assert_eq!(pop(&rx).unwrap(), None);
        }
    }

    /// Frames written in place cross like pushed ones, across the end of
    /// the area too; a writer that fails publishes nothing.
    #[test]
    fn frames_written_in_place_cross_in_order_and_wrap() {
        let (tx, rx) = pair(4096);
        for round in 0..40u8 {
            let len = 300 + 53 * usize::from(round % 7);
            let mut fill = |f: &mut [u8]| {
                f.fill(round);
                true
            };
            assert_eq!(tx.push_with(len, &mut fill), Ok(Some(false)));
            assert_eq!(
                tx.push_with(len, &mut |_: &mut [u8]| false),
                Err(NotWritten)
            );
            assert_eq!(pop(&rx).unwrap(), Some(vec![round; len]));
            assert_eq!(pop(&rx).unwrap(), None, "the failed one is not there");
        }
        let mut big = |f: &mut [u8]| {
            f.fill(1);
            true
        };
        assert_eq!(tx.push_with(4096, &mut big), Ok(None), "no room");
    }

    /// While the consumer keeps up, the producer goes back to the start
    /// of the area once a record would end beyond [`HOT`]: records never
    /// lie past it, and none wraps.
    #[test]
    fn a_producer_kept_up_with_stays_in_the_first_hot_bytes() {
        let cap = 4 * HOT as usize;
        let (tx, rx) = pair(cap);
        let len = 32 << 10;
        for i in 0..200u8 {
            let mut fill = |f: &mut [u8]| {
                f.fill(i);
                true
            };
            assert_eq!(tx.push_with(len, &mut fill), Ok(Some(false)));
            let r = rx.next(rx.tail()).unwrap().unwrap();
            assert!(
                rx.at(r.end) - HEADER <= HOT as usize,
                "record {i} ends past HOT"
            );
            assert_eq!(rx.frame(&r), Some(&vec![i; len][..]));
            rx.release(r.end);
        }
        // A consumer that lags lets records go beyond.
        let fill = &mut |f: &mut [u8]| {
            f.fill(7);
            true
        };
        let n = (cap - HOT as usize) / (len + LEN);
        for _ in 0..n {
            assert_eq!(tx.push_with(len, fill), Ok(Some(false)));
        }
        for _ in 0..n {
            assert_eq!(pop(&rx).unwrap(), Some(vec![7; len]));
        }
        assert!(rx.at(rx.tail()) - HEADER > HOT as usize);
    }

    /// A record that would wrap around the end with the start of the area
    /// still in use goes through a buffer, in two pieces.
    #[test]
    fn a_record_wraps_when_the_start_is_in_use() {
        let (tx, rx) = pair(4096);
        tx.push(&[1; 100]).unwrap();
        tx.push(&[2; 3900]).unwrap();
        assert_eq!(pop(&rx).unwrap(), Some(vec![1; 100]));
        // 104..4008 in use; 152 bytes more fit only across the end.
        let mut fill = |f: &mut [u8]| {
            f.fill(3);
            true
        };
        assert_eq!(tx.push_with(150, &mut fill), Ok(Some(false)));
        assert_eq!(pop(&rx).unwrap(), Some(vec![2; 3900]));
        let r = rx.next(rx.tail()).unwrap().unwrap();
        assert_eq!(rx.frame(&r), None, "it wraps");
        assert_eq!(pop(&rx).unwrap(), Some(vec![3; 150]));
    }

    #[test]
    fn full_ring_refuses_and_waiting_consumer_is_kicked_once() {
        let (tx, rx) = pair(4096);
        let f = [1u8; 1000];
        let mut n = 0;
        while tx.push(&f).is_some() {
            n += 1;
        }
        assert_eq!(n, 4, "4 records of 1004 bytes fit 4096");
        while pop(&rx).unwrap().is_some() {}
        assert!(!rx.has_data());
        assert!(!rx.prepare_to_wait(), "empty: may sleep");
        assert_eq!(tx.push(&f), Some(true), "the sleeper is kicked");
        assert_eq!(tx.push(&f), Some(false), "once");
        assert!(rx.has_data());
        assert!(rx.prepare_to_wait(), "data: must not sleep");
    }

    #[test]
    fn a_corrupt_ring_is_refused_not_read() {
        let (tx, rx) = pair(4096);
        tx.push(&[0u8; 10]).unwrap();
        // The peer writes a length beyond what it published.
        tx.write_at(0, &1000u32.to_le_bytes());
        assert_eq!(pop(&rx), Err(RingError::Corrupt));
        // Or a skip past what it published, or up to it with no record
        // after it (the consumer would find data it can never read).
        tx.write_at(0, &SKIP.to_le_bytes());
        assert_eq!(pop(&rx), Err(RingError::Corrupt));
        tx.store(HEAD, 4096);
        assert_eq!(pop(&rx), Err(RingError::Corrupt));
        // And a head beyond the ring.
        tx.store(HEAD, 1 << 40);
        assert_eq!(pop(&rx), Err(RingError::Corrupt));
        assert!(matches!(
            ShmRing::map(tempfile(), 1000),
            Err(RingError::Size(1000))
        ));
    }

    fn tempfile() -> File {
        create(4096).unwrap().1
    }

    #[test]
    fn a_ring_the_peer_could_resize_is_refused() {
        let size = 4096 + HEADER;
        // Unsealed, or sealed against only one direction: the peer could
        // truncate it under our mapping.
        for seals in [0, libc::F_SEAL_GROW, libc::F_SEAL_SHRINK] {
            assert_eq!(
                ShmRing::map(memfd(size, seals).unwrap(), 4096).err(),
                Some(RingError::Unsealed),
                "seals {seals:#x}"
            );
        }
        // Not a memfd at all.
        let dir = std::env::temp_dir().join(format!("pvrdma-ring-{}", std::process::id()));
        let plain = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&dir)
            .unwrap();
        plain.set_len(size as u64).unwrap();
        let _ = std::fs::remove_file(&dir);
        assert_eq!(ShmRing::map(plain, 4096).err(), Some(RingError::Unsealed));
        // What we hand over cannot be truncated.
        let file = tempfile();
        assert!(file.set_len(0).is_err());
        assert!(ShmRing::map(file, 4096).is_ok());
    }
}
