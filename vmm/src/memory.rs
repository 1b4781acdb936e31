// SPDX-License-Identifier: Apache-2.0
//! Guest RAM: one memfd (shareable with another process, and the thing a
//! migration or snapshot streams), mapped once per RAM range, each region
//! with a dirty bitmap that every VMM-side write marks.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};

use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};

use crate::arch::layout;

/// Guest memory as every part of the VMM sees it.
pub type GuestMemory = GuestMemoryMmap<AtomicBitmap>;

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("Failed to create the guest memory file")]
    Memfd(#[source] std::io::Error),
    #[error("Failed to size the guest memory file to {0} bytes")]
    Resize(u64, #[source] std::io::Error),
    #[error("Failed to seal the guest memory file's size")]
    Seal(#[source] std::io::Error),
    #[error("Guest memory size {0} is not supported on this host")]
    TooLarge(u64),
    #[error("Failed to map guest memory")]
    Mmap(#[source] vm_memory::mmap::MmapRegionError),
    #[error("Failed to build the guest memory map")]
    Collection(#[source] vm_memory::GuestRegionCollectionError),
}

/// Creates `size` bytes of guest RAM laid out by [`layout::ram_ranges`].
pub fn create_guest_memory(size: u64) -> Result<GuestMemory, MemoryError> {
    let name = CString::new("pvrdma-vmm-guest-ram").map_err(|e| MemoryError::Memfd(e.into()))?;
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: memfd_create with a valid NUL-terminated name and flags; the
    // return value is checked before use.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(MemoryError::Memfd(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size)
        .map_err(|e| MemoryError::Resize(size, e))?;
    // Guest RAM never resizes; sealed, a same-host peer may map it
    // (`share_memory=on`) without a truncation being able to crash it.
    // SAFETY: F_ADD_SEALS on the descriptor `file` owns, flags only.
    let sealed = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        )
    };
    if sealed < 0 {
        return Err(MemoryError::Seal(std::io::Error::last_os_error()));
    }
    let file = std::sync::Arc::new(file);

    let mut regions = Vec::new();
    let mut file_offset = 0u64;
    for (start, len) in layout::ram_ranges(size) {
        let len_usize = usize::try_from(len).map_err(|_| MemoryError::TooLarge(size))?;
        let mapping = MmapRegion::<AtomicBitmap>::from_file(
            FileOffset::from_arc(file.clone(), file_offset),
            len_usize,
        )
        .map_err(MemoryError::Mmap)?;
        let region = GuestRegionMmap::new(mapping, GuestAddress(start))
            .ok_or(MemoryError::TooLarge(size))?;
        regions.push(region);
        file_offset += len;
    }
    let mem = GuestMemory::from_regions(regions).map_err(MemoryError::Collection)?;
    Ok(mem)
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestMemoryBackend as _, GuestMemoryRegion};

    use super::*;

    #[test]
    fn small_guest_is_one_region() {
        let mem = create_guest_memory(64 << 20).unwrap();
        assert_eq!(mem.num_regions(), 1);
        mem.write_obj(0xdead_beef_u32, GuestAddress(0x1000))
            .unwrap();
        assert_eq!(
            mem.read_obj::<u32>(GuestAddress(0x1000)).unwrap(),
            0xdead_beef
        );
    }

    /// Sealed against resizing: a same-host peer may map it safely.
    #[test]
    fn guest_memory_cannot_be_resized() {
        use vm_memory::FileOffset;
        let mem = create_guest_memory(16 << 20).unwrap();
        let region = mem.find_region(GuestAddress(0)).unwrap();
        let file = region.file_offset().map(FileOffset::file).unwrap();
        assert!(file.set_len(8 << 20).is_err(), "shrunk");
        assert!(file.set_len(32 << 20).is_err(), "grown");
    }

    #[test]
    fn writes_mark_the_dirty_bitmap() {
        use vm_memory::bitmap::Bitmap;
        let mem = create_guest_memory(16 << 20).unwrap();
        let region = mem.find_region(GuestAddress(0)).unwrap();
        assert!(!region.bitmap().dirty_at(0x5000));
        mem.write_obj(1u8, GuestAddress(0x5000)).unwrap();
        assert!(region.bitmap().dirty_at(0x5000));
        assert!(!region.bitmap().dirty_at(0x6000));
    }
}
