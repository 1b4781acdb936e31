// SPDX-License-Identifier: Apache-2.0
//! Test helpers shared by the block tests: a guest memory, a patterned
//! image file and request builders.
#![allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::io::Write as _;

use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use vm_memory::bitmap::NewBitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryMmap};
use vmm_sys_util::tempfile::TempFile;

use super::disk::SECTOR_SIZE;

pub(crate) type Mem = GuestMemoryMmap<()>;

pub(crate) const MEM_SIZE: u64 = 0x10_0000;
pub(crate) const HDR: u64 = 0x1_0000;
pub(crate) const DATA: u64 = 0x2_0000;
pub(crate) const STATUS: u64 = 0x3_0000;
pub(crate) const W: u16 = VRING_DESC_F_WRITE as u16;

/// Byte `i` of the test image.
pub(crate) fn pattern(i: u64) -> u8 {
    (i % 251) as u8
}

/// A temp image of `sectors` sectors filled with [`pattern`].
pub(crate) fn image(sectors: u64) -> TempFile {
    let f = TempFile::new().unwrap();
    let data: Vec<u8> = (0..sectors * SECTOR_SIZE).map(pattern).collect();
    f.as_file().write_all(&data).unwrap();
    f
}

pub(crate) fn guest_memory<B: NewBitmap>() -> GuestMemoryMmap<B> {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap()
}

pub(crate) fn write_header<M: GuestMemory>(mem: &M, at: u64, request_type: u32, sector: u64) {
    mem.write_obj(request_type.to_le(), GuestAddress(at))
        .unwrap();
    mem.write_obj(0u32, GuestAddress(at + 4)).unwrap();
    mem.write_obj(sector.to_le(), GuestAddress(at + 8)).unwrap();
}

pub(crate) fn desc(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
}
