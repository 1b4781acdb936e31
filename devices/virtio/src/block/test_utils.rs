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

/// An `MsiRouter` that hands out eventfds and keeps a copy of each, so a
/// test can see which vector fired.
#[derive(Default)]
pub(crate) struct MockRouter {
    irqfds: std::sync::Mutex<Vec<vmm_sys_util::eventfd::EventFd>>,
    routes: std::sync::Mutex<Vec<(u32, Option<pci::MsiMessage>)>>,
}

impl MockRouter {
    /// Times vector `index` fired since the last call (0 if it did not).
    pub(crate) fn fired(&self, index: usize) -> u64 {
        self.irqfds.lock().unwrap()[index].read().unwrap_or(0)
    }

    pub(crate) fn routed(&self, gsi: u32) -> bool {
        self.routes
            .lock()
            .unwrap()
            .iter()
            .any(|(g, m)| *g == gsi && m.is_some())
    }
}

impl pci::MsiRouter for MockRouter {
    fn allocate(&self) -> std::io::Result<pci::MsiVector> {
        let irqfd = vmm_sys_util::eventfd::EventFd::new(vmm_sys_util::eventfd::EFD_NONBLOCK)?;
        let mut irqfds = self.irqfds.lock().unwrap();
        irqfds.push(irqfd.try_clone()?);
        Ok(pci::MsiVector {
            gsi: irqfds.len() as u32 - 1,
            irqfd,
        })
    }

    fn set_route(&self, gsi: u32, msg: Option<pci::MsiMessage>) -> std::io::Result<()> {
        self.routes.lock().unwrap().push((gsi, msg));
        Ok(())
    }

    fn release(&self, _vector: &pci::MsiVector) -> std::io::Result<()> {
        Ok(())
    }
}

/// An `IoEventRegistrar` that records registrations, keeping the eventfd
/// so a test can signal it as KVM would.
#[derive(Default)]
pub(crate) struct MockIoEvents {
    pub(crate) registered: std::sync::Mutex<Vec<(u64, vmm_sys_util::eventfd::EventFd)>>,
    pub(crate) fail: std::sync::atomic::AtomicBool,
}

impl pci::IoEventRegistrar for MockIoEvents {
    fn register(
        &self,
        fd: &vmm_sys_util::eventfd::EventFd,
        addr: u64,
        datamatch: Option<u32>,
    ) -> std::io::Result<()> {
        assert_eq!(datamatch, None);
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("no ioeventfds here"));
        }
        self.registered
            .lock()
            .unwrap()
            .push((addr, fd.try_clone()?));
        Ok(())
    }

    fn unregister(
        &self,
        _fd: &vmm_sys_util::eventfd::EventFd,
        addr: u64,
        _datamatch: Option<u32>,
    ) -> std::io::Result<()> {
        let mut registered = self.registered.lock().unwrap();
        let before = registered.len();
        registered.retain(|(a, _)| *a != addr);
        assert_eq!(registered.len() + 1, before, "unregistered {addr:#x} once");
        Ok(())
    }
}
