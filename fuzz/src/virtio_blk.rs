// SPDX-License-Identifier: Apache-2.0
//! A virtio-blk function (`virtio_devices::Block`, the real device and its worker) on
//! a real PCI bus, over its own guest memory and a fresh image file, with the mock hypervisor
//! hooks of `pci::test_utils`; and the register-level driver the targets play: VIRTIO 1.2
//! §4.1 offsets, in Linux's bring-up order. Nothing here asserts that an access decodes: a
//! hostile input may leave the function in any state.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use pci::test_utils::{MockIoEvents, MockMsi};
use pci::{DeviceHooks, PciBus};
use virtio_devices::{Block, BlockConfig};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::tempfile::TempFile;

/// Guest memory as the VMM passes it.
pub type Mem = Arc<GuestMemoryMmap<AtomicBitmap>>;

pub const MEM_SIZE: u64 = 1 << 20;
/// Image size: 64 sectors.
pub const SECTORS: u64 = 64;
pub const SECTOR: u64 = 512;
const SLOT: u32 = 1;
/// The 64-bit MMIO window: the bus places the function's only BAR at its start.
const MMIO64: (u64, u64) = (0x1_0000_0000, 0x1000_0000);
pub const BAR: u64 = MMIO64.0;
pub const BAR_SIZE: u64 = 0x8000;

// BAR 0 regions (devices/virtio/src/transport/pci.rs).
pub const COMMON: u64 = 0x0000;
pub const ISR: u64 = 0x1000;
pub const DEVICE: u64 = 0x2000;
pub const NOTIFY: u64 = 0x3000;
pub const MSIX_TABLE: u64 = 0x4000;
/// `struct virtio_pci_common_cfg`, VIRTIO 1.2 §4.1.4.3.
pub mod common {
    pub const DRIVER_FEATURE_SELECT: u64 = 0x08;
    pub const DRIVER_FEATURE: u64 = 0x0c;
    pub const CONFIG_MSIX_VECTOR: u64 = 0x10;
    pub const DEVICE_STATUS: u64 = 0x14;
    pub const QUEUE_SELECT: u64 = 0x16;
    pub const QUEUE_SIZE: u64 = 0x18;
    pub const QUEUE_MSIX_VECTOR: u64 = 0x1a;
    pub const QUEUE_ENABLE: u64 = 0x1c;
    pub const QUEUE_DESC: u64 = 0x20;
    pub const QUEUE_DRIVER: u64 = 0x28;
    pub const QUEUE_DEVICE: u64 = 0x30;
    pub const LEN: u64 = 0x38;
}
// Device status bits.
pub const ACKNOWLEDGE: u8 = 1;
pub const DRIVER: u8 = 2;
pub const DRIVER_OK: u8 = 4;
pub const FEATURES_OK: u8 = 8;
pub const NEEDS_RESET: u8 = 0x40;
// Feature bits the device offers (and one it does not: VIRTIO_F_INDIRECT_DESC).
pub const VERSION_1: u64 = 1 << 32;
pub const EVENT_IDX: u64 = 1 << 29;
pub const INDIRECT_DESC: u64 = 1 << 28;
pub const FLUSH: u64 = 1 << 9;
pub const SEG_MAX: u64 = 1 << 2;
// Descriptor flags.
pub const NEXT: u16 = 1;
pub const WRITE: u16 = 2;
pub const INDIRECT: u16 = 4;
// Request types and the OK status.
pub const T_IN: u32 = 0;
pub const T_OUT: u32 = 1;
pub const S_OK: u8 = 0;

// The driver's memory: one split ring of at most 256 entries, room for indirect tables,
// request headers, status bytes and data buffers.
pub const DESC_TABLE: u64 = 0x1000;
pub const AVAIL: u64 = 0x2000;
pub const USED: u64 = 0x3000;
pub const INDIRECT_TABLES: u64 = 0x4000;
pub const HEADERS: u64 = 0x8000;
pub const STATUS: u64 = 0x9000;
pub const DATA: u64 = 0x1_0000;
/// The device's queue size.
pub const QUEUE_MAX: u16 = 256;

/// A descriptor as the driver writes it.
pub fn descriptor(addr: u64, len: u32, flags: u16, next: u16) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[12..14].copy_from_slice(&flags.to_le_bytes());
    d[14..].copy_from_slice(&next.to_le_bytes());
    d
}

/// A `struct virtio_blk_outhdr`.
pub fn header(request_type: u32, sector: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&request_type.to_le_bytes());
    h[8..].copy_from_slice(&sector.to_le_bytes());
    h
}

pub struct VirtioBlk {
    pub bus: PciBus,
    pub dev: Arc<Mutex<Block<Mem>>>,
    pub mem: Mem,
    pub ioevents: Arc<MockIoEvents>,
    pub image: TempFile,
    /// Queue size the driver programmed last.
    pub qsize: u16,
    /// Requests the driver has made available since the queue was set up.
    pub avail_idx: u16,
}

impl VirtioBlk {
    /// A function on a fresh bus, memory decoding and bus mastering on, over a fresh zeroed
    /// image of [`SECTORS`] sectors and fresh guest memory; no driver yet.
    pub fn new(readonly: bool) -> Self {
        let mem: Mem = Arc::new(
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)])
                .expect("guest memory"),
        );
        // On tmpfs: pausing the device flushes the image, which is then free.
        let image = TempFile::new_in(Path::new("/dev/shm")).expect("image");
        image
            .as_file()
            .set_len(SECTORS * SECTOR)
            .expect("image size");
        let ioevents = Arc::new(MockIoEvents::strict());
        let hooks = DeviceHooks {
            msi: Arc::new(MockMsi::default()),
            ioevents: ioevents.clone(),
        };
        let config = BlockConfig {
            path: image.as_path().to_owned(),
            readonly,
            id: "fuzz0".into(),
        };
        let dev = Arc::new(Mutex::new(
            Block::new(&config, mem.clone(), hooks).expect("block device"),
        ));
        let mut bus = PciBus::new((0xc000_0000, 0x1000_0000), MMIO64);
        let bars = bus
            .add_device(SLOT as u8, 0, dev.clone())
            .expect("add device");
        assert_eq!(bars, vec![(0, BAR)]);
        let mut v = Self {
            bus,
            dev,
            mem,
            ioevents,
            image,
            qsize: 0,
            avail_idx: 0,
        };
        v.cfg_write(1, 0x6);
        v
    }

    pub fn cfg_read(&mut self, reg: u32) -> u32 {
        self.bus
            .pio_write(0xcf8, &(0x8000_0000 | SLOT << 11 | reg << 2).to_le_bytes());
        let mut data = [0u8; 4];
        self.bus.pio_read(0xcfc, &mut data);
        u32::from_le_bytes(data)
    }

    pub fn cfg_write(&mut self, reg: u32, value: u32) {
        self.bus
            .pio_write(0xcf8, &(0x8000_0000 | SLOT << 11 | reg << 2).to_le_bytes());
        self.bus.pio_write(0xcfc, &value.to_le_bytes());
    }

    /// A `len`-byte read of BAR 0 at `offset` (0 when nothing decodes).
    pub fn read(&self, offset: u64, len: usize) -> u64 {
        let mut data = [0u8; 8];
        let len = len.min(8);
        self.bus.mmio_read(BAR + offset, &mut data[..len]);
        u64::from_le_bytes(data)
    }

    pub fn write(&self, offset: u64, len: usize, value: u64) {
        self.bus
            .mmio_write(BAR + offset, &value.to_le_bytes()[..len.min(8)]);
    }

    pub fn status(&self) -> u8 {
        self.read(COMMON + common::DEVICE_STATUS, 1) as u8
    }

    /// Programs both MSI-X entries and enables MSI-X, as `pci_enable_msix` does.
    pub fn enable_msix(&mut self) {
        for i in 0..2u64 {
            let entry = MSIX_TABLE + 16 * i;
            self.write(entry, 4, 0xfee0_0000);
            self.write(entry + 4, 4, 0);
            self.write(entry + 8, 4, 0x30 + i);
            self.write(entry + 12, 4, 0);
        }
        let mut ptr = self.cfg_read(0x34 / 4) & 0xfc;
        // At most 48 capabilities fit in config space.
        for _ in 0..48 {
            if ptr == 0 {
                return;
            }
            let head = self.cfg_read(ptr / 4);
            if head & 0xff == u32::from(pci::MSIX_CAP_ID) {
                self.cfg_write(ptr / 4, head & 0xffff | 0x8000 << 16);
                return;
            }
            ptr = head >> 8 & 0xfc;
        }
    }

    /// The whole bring-up of a driver that starts over: reset, features, the queue at the
    /// fixed ring addresses with `qsize` entries (rings cleared), DRIVER_OK. Returns the
    /// device status it reads at the end.
    pub fn start(&mut self, features: u64, qsize: u16) -> u8 {
        use common::*;
        self.enable_msix();
        self.write(DEVICE_STATUS, 1, 0);
        self.write(DEVICE_STATUS, 1, ACKNOWLEDGE.into());
        self.write(DEVICE_STATUS, 1, (ACKNOWLEDGE | DRIVER).into());
        for half in 0..2u64 {
            self.write(DRIVER_FEATURE_SELECT, 4, half);
            self.write(DRIVER_FEATURE, 4, features >> (32 * half) & 0xffff_ffff);
        }
        self.write(
            DEVICE_STATUS,
            1,
            (ACKNOWLEDGE | DRIVER | FEATURES_OK).into(),
        );
        self.write(CONFIG_MSIX_VECTOR, 2, 0);
        for ring in [AVAIL, USED] {
            let _ = self.mem.write_slice(&[0; 0x1000], GuestAddress(ring));
        }
        self.avail_idx = 0;
        self.qsize = qsize;
        self.write(QUEUE_SELECT, 2, 0);
        self.write(QUEUE_SIZE, 2, qsize.into());
        for (reg, addr) in [
            (QUEUE_DESC, DESC_TABLE),
            (QUEUE_DRIVER, AVAIL),
            (QUEUE_DEVICE, USED),
        ] {
            self.write(reg, 4, addr & 0xffff_ffff);
            self.write(reg + 4, 4, addr >> 32);
        }
        self.write(QUEUE_MSIX_VECTOR, 2, 1);
        self.write(QUEUE_ENABLE, 2, 1);
        let status = self.status() | DRIVER_OK;
        self.write(DEVICE_STATUS, 1, status.into());
        self.status()
    }

    pub fn write_descriptor(&self, index: u16, d: [u8; 16]) {
        let _ = self
            .mem
            .write_slice(&d, GuestAddress(DESC_TABLE + 16 * u64::from(index)));
    }

    /// Puts `head` in the next available slot and publishes it.
    pub fn publish(&mut self, head: u16) {
        let slot = u64::from(self.avail_idx % self.qsize.clamp(1, QUEUE_MAX));
        let _ = self.mem.write_obj(head, GuestAddress(AVAIL + 4 + 2 * slot));
        self.avail_idx = self.avail_idx.wrapping_add(1);
        let _ = self.mem.write_obj(self.avail_idx, GuestAddress(AVAIL + 2));
    }

    /// A queue notification as KVM delivers it: to the registered ioeventfd, else as MMIO.
    pub fn notify(&self, value: u16) {
        match self.ioevents.lookup(BAR + NOTIFY, value.into()) {
            Some(fd) => {
                let _ = fd.write(1);
            }
            None => self.write(NOTIFY, 2, value.into()),
        }
    }

    /// The worker (inline, see [`crate::inline_workers`]) serves what the driver signalled.
    pub fn settle(&self) {
        crate::settle();
    }

    pub fn used_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(USED + 2)).unwrap_or(0)
    }

    /// (id, len) of used ring entry `i`.
    pub fn used(&self, i: u16) -> (u32, u32) {
        let at = USED + 4 + 8 * u64::from(i % self.qsize.clamp(1, QUEUE_MAX));
        (
            self.mem.read_obj(GuestAddress(at)).unwrap_or(0),
            self.mem.read_obj(GuestAddress(at + 4)).unwrap_or(0),
        )
    }

    /// The image's bytes at `offset`, as the disk holds them now.
    pub fn image_bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.image
            .as_file()
            .read_exact_at(&mut buf, offset)
            .expect("image read");
        buf
    }
}
