// SPDX-License-Identifier: Apache-2.0
//! The raw disk image behind a virtio-blk device.
//!
//! I/O is positional (`pread`/`pwrite` through [`FileExt`]), so there is no
//! shared file cursor to keep consistent. Data moves through one bounce
//! buffer of [`BOUNCE_BUFFER_SIZE`] bytes allocated at open time: it costs a
//! memcpy, but keeps the crate free of `unsafe` (a zero-copy `preadv` into
//! guest memory would need raw pointers into the mapping) and bounds host
//! memory per request no matter what lengths the guest claims.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use virtio_bindings::virtio_blk::VIRTIO_BLK_ID_BYTES;

/// Bytes per sector: the unit of `capacity` and of request offsets
/// (VIRTIO 1.2 §5.2.4), whatever the image's own block size is.
pub(crate) const SECTOR_SIZE: u64 = 512;

/// Length of the GET_ID serial string (NUL-padded, not terminated at 20).
pub(crate) const ID_BYTES: usize = VIRTIO_BLK_ID_BYTES as usize;

/// Largest chunk copied per system call. Bounds the host memory a request
/// can make the device use (a guest may describe up to 4 GiB per chain).
const BOUNCE_BUFFER_SIZE: usize = 128 << 10;

/// Why a disk image cannot back a device.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("Failed to open disk image {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("Failed to get the size of disk image {path}")]
    Size {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Rejected rather than rounded down: silently hiding the tail of an
    /// image would make writes there vanish without any error.
    #[error("Disk image {path} is {size} bytes, not a multiple of 512")]
    UnalignedSize { path: PathBuf, size: u64 },
    #[error("Disk id {0:?} is longer than 20 bytes")]
    IdTooLong(String),
}

/// A request's byte range does not fit the disk.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("Sector {sector} plus {len} bytes is past the end of the disk")]
pub(crate) struct OutOfRange {
    pub(crate) sector: u64,
    pub(crate) len: u64,
}

pci::device_counters! {
    /// What the device did with the driver's requests, for the VMM's
    /// `vm.counters` (see [`crate::Block::counters`]).
    pub(crate) struct BlockCounters {
        /// Reads (VIRTIO_BLK_T_IN) completed.
        read_requests,
        /// Bytes of those reads.
        read_bytes,
        /// Writes (VIRTIO_BLK_T_OUT) completed.
        write_requests,
        /// Bytes of those writes.
        write_bytes,
        /// Flushes completed.
        flush_requests,
        /// GET_ID requests completed.
        get_id_requests,
        /// Requests answered with IOERR (bad buffers, out of range, a
        /// write to a read-only disk, an I/O error of the image).
        request_error,
        /// Requests answered with UNSUPP (unknown type).
        request_unsupported,
        /// Chains dropped without a status (no status byte to write).
        chain_dropped,
        /// Queues stopped until a reset because the ring itself is corrupt.
        queue_broken,
    }
}

/// An open disk image, its fixed geometry and what was done with it.
#[derive(Debug)]
pub(crate) struct Disk {
    file: File,
    /// Image size in bytes, a multiple of [`SECTOR_SIZE`].
    size: u64,
    readonly: bool,
    serial: [u8; ID_BYTES],
    bounce: Vec<u8>,
    /// Shared with the VMM, which reads them without the backend lock.
    pub(crate) counters: Arc<BlockCounters>,
}

impl Disk {
    /// Opens `path` (read-only when `readonly`), reporting `id` as serial.
    pub(crate) fn open(path: &Path, readonly: bool, id: &str) -> Result<Self, DiskError> {
        let mut serial = [0u8; ID_BYTES];
        serial
            .get_mut(..id.len())
            .ok_or_else(|| DiskError::IdTooLong(id.to_owned()))?
            .copy_from_slice(id.as_bytes());
        let file = OpenOptions::new()
            .read(true)
            .write(!readonly)
            .open(path)
            .map_err(|source| DiskError::Open {
                path: path.to_owned(),
                source,
            })?;
        // Seeking to the end also sizes block devices, where metadata says 0.
        let size = (&file)
            .seek(SeekFrom::End(0))
            .map_err(|source| DiskError::Size {
                path: path.to_owned(),
                source,
            })?;
        if size % SECTOR_SIZE != 0 {
            return Err(DiskError::UnalignedSize {
                path: path.to_owned(),
                size,
            });
        }
        Ok(Self {
            file,
            size,
            readonly,
            serial,
            bounce: vec![0; BOUNCE_BUFFER_SIZE],
            counters: Arc::default(),
        })
    }

    /// Capacity in 512-byte sectors, as the config space reports it.
    pub(crate) fn sectors(&self) -> u64 {
        self.size / SECTOR_SIZE
    }

    pub(crate) fn readonly(&self) -> bool {
        self.readonly
    }

    pub(crate) fn serial(&self) -> &[u8; ID_BYTES] {
        &self.serial
    }

    /// Byte offset of `len` bytes at `sector`, if they lie inside the disk;
    /// every step is checked since both values come from the guest.
    pub(crate) fn offset_of(&self, sector: u64, len: u64) -> Result<u64, OutOfRange> {
        sector
            .checked_mul(SECTOR_SIZE)
            .filter(|offset| offset.checked_add(len).is_some_and(|end| end <= self.size))
            .ok_or(OutOfRange { sector, len })
    }

    /// Copies `len` image bytes at `offset` into `dst`.
    pub(crate) fn read_to(
        &mut self,
        offset: u64,
        len: u64,
        dst: &mut impl Write,
    ) -> io::Result<()> {
        self.copy_chunks(offset, len, |file, buf, at| {
            file.read_exact_at(buf, at)?;
            dst.write_all(buf)
        })
    }

    /// Copies `len` bytes from `src` into the image at `offset`.
    pub(crate) fn write_from(
        &mut self,
        offset: u64,
        len: u64,
        src: &mut impl Read,
    ) -> io::Result<()> {
        self.copy_chunks(offset, len, |file, buf, at| {
            src.read_exact(buf)?;
            file.write_all_at(buf, at)
        })
    }

    /// Makes completed writes durable (fdatasync): the guest issues FLUSH
    /// exactly when it needs that, e.g. for a journal commit.
    pub(crate) fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Runs `step` over `[offset, offset + len)` in bounce-buffer sized
    /// pieces. Callers have checked the range with [`Disk::offset_of`].
    fn copy_chunks(
        &mut self,
        offset: u64,
        len: u64,
        mut step: impl FnMut(&File, &mut [u8], u64) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut done = 0u64;
        while done < len {
            let remaining = len.saturating_sub(done);
            let chunk =
                usize::try_from(remaining).map_or(self.bounce.len(), |r| r.min(self.bounce.len()));
            let buf = self
                .bounce
                .get_mut(..chunk)
                .ok_or_else(|| io::Error::other("bounce buffer too small"))?;
            let at = offset
                .checked_add(done)
                .ok_or_else(|| io::Error::other("offset overflow"))?;
            step(&self.file, buf, at)?;
            done = done.saturating_add(u64::try_from(chunk).unwrap_or(u64::MAX));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use vmm_sys_util::tempfile::TempFile;

    use super::*;

    fn image(len: usize) -> TempFile {
        let f = TempFile::new().unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        f.as_file().write_all(&data).unwrap();
        f
    }

    #[test]
    fn open_sizes_and_validates() {
        let f = image(4096);
        let disk = Disk::open(f.as_path(), false, "serial-1").unwrap();
        assert_eq!(disk.sectors(), 8);
        assert!(!disk.readonly());
        assert_eq!(&disk.serial()[..9], b"serial-1\0");

        let odd = image(1000);
        assert!(matches!(
            Disk::open(odd.as_path(), true, ""),
            Err(DiskError::UnalignedSize { size: 1000, .. })
        ));
        assert!(matches!(
            Disk::open(Path::new("/nonexistent/disk.img"), true, ""),
            Err(DiskError::Open { .. })
        ));
        let long = "x".repeat(21);
        assert!(matches!(
            Disk::open(f.as_path(), true, &long),
            Err(DiskError::IdTooLong(_))
        ));
        let exact = "y".repeat(20);
        assert_eq!(
            Disk::open(f.as_path(), true, &exact).unwrap().serial(),
            exact.as_bytes()
        );
    }

    #[test]
    fn range_checks() {
        let f = image(4096);
        let disk = Disk::open(f.as_path(), true, "").unwrap();
        assert_eq!(disk.offset_of(0, 4096), Ok(0));
        assert_eq!(disk.offset_of(7, 512), Ok(3584));
        assert!(disk.offset_of(7, 513).is_err());
        assert!(disk.offset_of(8, 0).is_ok(), "empty I/O at the end is fine");
        assert!(disk.offset_of(9, 0).is_err());
        assert!(
            disk.offset_of(u64::MAX / 512 + 1, 0).is_err(),
            "sector * 512 overflows"
        );
        assert!(
            disk.offset_of(u64::MAX / 512, 512).is_err(),
            "offset + len overflows"
        );
    }

    #[test]
    fn chunked_copies_cross_the_bounce_buffer() {
        let len = BOUNCE_BUFFER_SIZE * 2 + 1024;
        let f = image(len);
        let mut disk = Disk::open(f.as_path(), false, "").unwrap();
        let mut out = Vec::new();
        disk.read_to(512, (len - 512) as u64, &mut out).unwrap();
        assert_eq!(out.len(), len - 512);
        assert!(out
            .iter()
            .enumerate()
            .all(|(i, b)| *b == ((i + 512) % 251) as u8));

        let pattern = vec![0x5au8; BOUNCE_BUFFER_SIZE + 512];
        disk.write_from(1024, pattern.len() as u64, &mut pattern.as_slice())
            .unwrap();
        disk.flush().unwrap();
        let mut back = Vec::new();
        disk.read_to(1024, pattern.len() as u64, &mut back).unwrap();
        assert_eq!(back, pattern);
        // A source that runs dry is an error, not a short write.
        assert!(disk
            .write_from(0, 1024, &mut [0u8; 512].as_slice())
            .is_err());
    }
}
