// SPDX-License-Identifier: Apache-2.0
//! The same-host channel's one-copy path (`share_memory=on` on both
//! ends): a sender hands each peer, with its ring, a read-only descriptor
//! of its guest RAM's memfd (the view); the peer maps it `PROT_READ`, and
//! the ring then carries, for a frame with payload, a described record
//! instead: the frame's headers and where the payload lies in the
//! sender's memory (runs of offsets into the memfd, found after the
//! sender checked key, PD, bounds and rights as for a copy). The receiver
//! places the payload straight from there into its own MRs: one copy, by
//! the core that reads it next, and no ring area rewritten per byte.
//!
//! The peer is not trusted: a view must be a memfd sealed against
//! shrinking and growing (else a truncation would SIGBUS us) and opened
//! read-only (our view of it stays `PROT_READ`, and whoever holds a
//! writable descriptor could seal or write the sender's RAM); every run
//! is checked against the view's length before use (`Payload::runs`). A
//! view lives as long as the ring it came with: a BYE, a new SETUP or a
//! corrupt ring drops it, and nothing of it is migrated state.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;

use rdma_transport::packet::{Run, MAX_RUNS};

/// Largest view accepted from a peer (its guest RAM): 1 TiB.
const MAX_VIEW: u64 = 1 << 40;

/// Why a peer's view was refused (its ring is still taken: its frames
/// then carry their payload).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ViewError {
    #[error("the memory view is not a memfd sealed against shrinking and growing")]
    Unsealed,
    #[error("the memory view is not a read-only descriptor")]
    Writable,
    #[error("the memory view has a size of {0} bytes")]
    Size(u64),
    #[error("cannot map the memory view")]
    Map,
}

/// A peer's guest RAM, mapped read-only and shared.
#[derive(Debug)]
pub(crate) struct View {
    addr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is only read, through `bytes`, and lives until drop.
unsafe impl Send for View {}
// SAFETY: as above; nothing of it is written through `View`.
unsafe impl Sync for View {}

impl View {
    /// Maps `file`, which must be a read-only descriptor of a memfd sealed
    /// against resizing.
    pub(crate) fn map(file: &File) -> Result<Self, ViewError> {
        // SAFETY: F_GETFL on a descriptor `file` owns; no memory passed.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 || flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(ViewError::Writable);
        }
        // Before the size: unsealed, it could change after the check.
        let want = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        // SAFETY: F_GET_SEALS on a descriptor `file` owns; no memory passed.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & want != want {
            return Err(ViewError::Unsealed);
        }
        let size = file.metadata().map_err(|_| ViewError::Map)?.len();
        if size == 0 || size > MAX_VIEW {
            return Err(ViewError::Size(size));
        }
        let len = usize::try_from(size).map_err(|_| ViewError::Size(size))?;
        // SAFETY: a new shared read-only mapping of `len` bytes of `file`
        // (which cannot shrink under it), at an address of the kernel's
        // choosing; the result is checked.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(ViewError::Map);
        }
        Ok(Self { addr, len })
    }

    /// The sender's memory.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `addr..addr + len` is mapped readable while `self` lives.
        // JUSTIFICATION: placing straight from the peer's memory is the
        // point (one copy). The peer's guest may write there meanwhile: the
        // bytes are plain `u8` and only ever copied (never parsed), so it
        // can only spoil its own payload, as it could by sending other
        // bytes.
        unsafe { std::slice::from_raw_parts(self.addr.cast::<u8>(), self.len) }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe {
            libc::munmap(self.addr, self.len);
        }
    }
}

/// A read-only descriptor of `file` (our guest RAM's memfd) to hand to
/// peers: reopened through /proc, so that they can neither write it,
/// `mprotect` their mapping writable nor add seals.
pub(crate) fn read_only(file: &File) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// What a described record starts with where a frame has its destination
/// MAC: a multicast address, which no frame in a ring carries (rings go
/// to a peer's own unicast MAC). Then the number of runs (u16), the
/// payload's length (u32), the runs (offset u64, length u32; little
/// endian) and the frame, built for an empty payload.
pub(crate) const DESCRIBED: [u8; 6] = [0xff, b'P', b'V', b'1', b'C', b'P'];
const PREFIX: usize = 6 + 2 + 4;
const RUN_LEN: usize = 8 + 4;

/// Bytes of the described record of a frame of `frame` bytes and `runs`.
pub(crate) fn described_len(frame: usize, runs: usize) -> Option<usize> {
    runs.checked_mul(RUN_LEN)?
        .checked_add(PREFIX)?
        .checked_add(frame)
}

/// Writes the described record of `runs` (`payload` bytes in all) into
/// `out` (of [`described_len`] bytes), its frame by `frame`.
pub(crate) fn write_described(
    out: &mut [u8],
    runs: &[Run],
    payload: usize,
    frame: &mut dyn FnMut(&mut [u8]) -> bool,
) -> bool {
    let (Ok(n), Ok(payload)) = (u16::try_from(runs.len()), u32::try_from(payload)) else {
        return false;
    };
    let Some((prefix, rest)) = out.split_at_mut_checked(PREFIX) else {
        return false;
    };
    let Some((tag, counts)) = prefix.split_first_chunk_mut::<6>() else {
        return false;
    };
    *tag = DESCRIBED;
    let Some((count, len)) = counts.split_first_chunk_mut::<2>() else {
        return false;
    };
    *count = n.to_le_bytes();
    len.copy_from_slice(&payload.to_le_bytes());
    let Some((list, rest)) = rest.split_at_mut_checked(runs.len().saturating_mul(RUN_LEN)) else {
        return false;
    };
    for (slot, run) in list.chunks_exact_mut(RUN_LEN).zip(runs) {
        let (at, len) = slot.split_at_mut(8);
        at.copy_from_slice(&run.at.to_le_bytes());
        len.copy_from_slice(&run.len.to_le_bytes());
    }
    frame(rest)
}

/// Whether `record` is a described record (not a frame).
pub(crate) fn is_described(record: &[u8]) -> bool {
    record.starts_with(&DESCRIBED)
}

/// A described record as read: its runs (in the batch's list), its
/// payload's length and where its frame starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Described {
    pub(crate) runs: Range<usize>,
    pub(crate) payload: usize,
    pub(crate) frame: usize,
}

/// Reads the runs of described record `record` into `runs`; `None` for
/// one that is malformed (short, more than [`MAX_RUNS`] runs): the peer's
/// corruption, the record is dropped. The runs themselves are checked
/// against the view when placed from (`Payload::runs`).
pub(crate) fn read_described(record: &[u8], runs: &mut Vec<Run>) -> Option<Described> {
    let rest = record.strip_prefix(&DESCRIBED)?;
    let (count, rest) = rest.split_first_chunk::<2>()?;
    let (len, rest) = rest.split_first_chunk::<4>()?;
    let n = usize::from(u16::from_le_bytes(*count));
    if n > MAX_RUNS {
        return None;
    }
    let list = rest.get(..n.checked_mul(RUN_LEN)?)?;
    let start = runs.len();
    for slot in list.chunks_exact(RUN_LEN) {
        let (at, len) = slot.split_first_chunk::<8>()?;
        let len = <[u8; 4]>::try_from(len).ok()?;
        runs.push(Run {
            at: u64::from_le_bytes(*at),
            len: u32::from_le_bytes(len),
        });
    }
    Some(Described {
        runs: start..runs.len(),
        payload: usize::try_from(u32::from_le_bytes(*len)).ok()?,
        frame: described_len(0, n)?,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A memfd of `size` bytes with `seals`, and a descriptor of it as
    /// `read_only` makes it.
    fn memfd(size: u64, seals: libc::c_int) -> (File, File) {
        let file = super::super::shm_ring::memfd(size as usize, seals).unwrap();
        let ro = read_only(&file).unwrap();
        (file, ro)
    }

    #[test]
    fn a_sealed_read_only_memfd_is_mapped_and_reads_its_bytes() {
        let (mut file, ro) = memfd(8192, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW);
        file.write_all(b"guest bytes").unwrap();
        let view = View::map(&ro).unwrap();
        assert_eq!(view.bytes().len(), 8192);
        assert_eq!(&view.bytes()[..11], b"guest bytes");
        // What the peer got cannot be made writable or sealed further.
        // SAFETY: F_ADD_SEALS with flags only.
        let sealed = unsafe { libc::fcntl(ro.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE) };
        assert!(sealed < 0, "a read-only descriptor adds no seals");
    }

    #[test]
    fn views_unsealed_writable_or_empty_are_refused() {
        let (_f, ro) = memfd(4096, libc::F_SEAL_SHRINK);
        assert_eq!(View::map(&ro).unwrap_err(), ViewError::Unsealed);
        let (_f, ro) = memfd(4096, 0);
        assert_eq!(View::map(&ro).unwrap_err(), ViewError::Unsealed);
        let (file, _) = memfd(4096, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW);
        assert_eq!(View::map(&file).unwrap_err(), ViewError::Writable);
        let (_f, ro) = memfd(0, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW);
        assert_eq!(View::map(&ro).unwrap_err(), ViewError::Size(0));
        // Not a memfd at all: a regular file has no seals.
        let tmp = std::env::temp_dir().join(format!("view-test-{}", std::process::id()));
        std::fs::write(&tmp, [0u8; 4096]).unwrap();
        let plain = File::open(&tmp).unwrap();
        assert_eq!(View::map(&plain).unwrap_err(), ViewError::Unsealed);
        let _ = std::fs::remove_file(&tmp);
    }

    #[test]
    fn described_records_round_trip_and_malformed_ones_are_refused() {
        let runs = [Run { at: 4096, len: 100 }, Run { at: 0, len: 28 }];
        let len = described_len(10, runs.len()).unwrap();
        let mut rec = vec![0u8; len];
        assert!(write_described(&mut rec, &runs, 128, &mut |f| {
            f.copy_from_slice(b"0123456789");
            true
        }));
        assert!(is_described(&rec));
        let mut got = vec![Run::default()];
        let d = read_described(&rec, &mut got).unwrap();
        assert_eq!(&got[d.runs.clone()], &runs);
        assert_eq!((d.payload, &rec[d.frame..]), (128, &b"0123456789"[..]));
        // Short, too many runs, not described.
        assert!(read_described(&rec[..PREFIX + RUN_LEN], &mut got).is_none());
        let mut many = rec.clone();
        many[6..8].copy_from_slice(&(MAX_RUNS as u16 + 1).to_le_bytes());
        assert!(read_described(&many, &mut got).is_none());
        assert!(read_described(&rec[1..], &mut got).is_none());
        // A frame (to a unicast MAC) is never taken for one.
        assert!(!is_described(&[2, 0, 0, 0, 0, 1, 0, 0]));
    }
}
