// SPDX-License-Identifier: Apache-2.0
//! virtio-blk (VIRTIO 1.2 §5.2) over a raw image file, as a virtio-pci
//! function.
//!
//! [`Block`] is what the VMM puts on the PCI bus. Inside, the transport
//! drives a [`BlockDevice`] (features, config space, activate/reset,
//! pause/resume), whose [`worker`] thread serves the single request queue.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

mod disk;
mod request;
#[cfg(test)]
mod test_utils;
mod worker;

use std::io;
use std::mem::offset_of;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub use device_worker::SpawnError;
use device_worker::WorkerHandle;
use pci::{DeviceCounters, DeviceHooks, PciConfiguration, PciDevice};
use virtio_bindings::virtio_blk::{
    virtio_blk_config, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddressSpace;
use vm_migration::{MigratableError, Pausable, Snapshot, Snapshottable};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub use self::disk::DiskError;
use self::disk::{BlockCounters, Disk};
use self::worker::{lock, ActiveQueue, Backend, BlockWorker, SharedBackend};
use crate::transport::common_cfg::feature_bit;
use crate::transport::interrupt::Interrupt;
use crate::transport::pci::{TransportError, VirtioPciDevice};
use crate::transport::{ActivateError, QueuePosition, VirtioDevice};

/// The device's name in a VM snapshot, and its worker thread's.
const ID: &str = "virtio-blk";

/// Size of the one request queue. Linux uses the size offered; 256 lets
/// 254-segment requests (`seg_max`) in flight without indirect descriptors.
const QUEUE_SIZE: u16 = 256;

/// PCI class "mass storage, other" (0x01/0x80): the device is not SCSI.
const PCI_CLASS_STORAGE: u8 = 0x01;
const PCI_SUBCLASS_STORAGE_OTHER: u8 = 0x80;

/// The whole `struct virtio_blk_config` is exposed, zeros past `seg_max`
/// (fields of features not offered): Linux's `vp_get` BUG()s on a config
/// read past the advertised length, so a short structure would turn any
/// driver that reads one more field into a guest crash.
const CONFIG_LEN: usize = std::mem::size_of::<virtio_blk_config>();

/// Each chain carries a header and a status descriptor besides the data,
/// and must fit the queue: Linux limits its segments to this.
const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;

/// The device configuration: capacity and `seg_max`, the rest zero.
/// `size_max` stays 0 because VIRTIO_BLK_F_SIZE_MAX is not offered: the
/// bounce buffer copes with segments of any size.
fn config_space(sectors: u64) -> [u8; CONFIG_LEN] {
    let mut cfg = [0u8; CONFIG_LEN];
    for (at, bytes) in [
        (
            offset_of!(virtio_blk_config, capacity),
            &sectors.to_le_bytes()[..],
        ),
        (
            offset_of!(virtio_blk_config, seg_max),
            &SEG_MAX.to_le_bytes()[..],
        ),
    ] {
        if let Some(dst) = at
            .checked_add(bytes.len())
            .and_then(|end| cfg.get_mut(at..end))
        {
            dst.copy_from_slice(bytes);
        }
    }
    cfg
}

/// A virtio-blk disk as the user configured it (`--disk path=..,readonly=on`).
#[derive(Clone, Debug)]
pub struct BlockConfig {
    /// Raw image file or block device; its size must be a multiple of 512.
    pub path: PathBuf,
    /// Open read-only, offer VIRTIO_BLK_F_RO, fail writes with IOERR.
    pub readonly: bool,
    /// Serial returned by GET_ID (`/sys/block/vdX/serial`); at most 20 bytes.
    pub id: String,
}

#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("Failed to open the disk")]
    Disk(#[from] DiskError),
    #[error("Failed to create an eventfd")]
    EventFd(#[source] std::io::Error),
    #[error("Failed to start the disk worker")]
    Worker(#[from] SpawnError),
    #[error("Failed to set up the virtio-pci function")]
    Transport(#[from] TransportError),
}

/// The device half of virtio-blk: what the transport needs to know.
pub(crate) struct BlockDevice<M> {
    features: u64,
    config: [u8; CONFIG_LEN],
    queue_evts: [EventFd; 1],
    queue_max_sizes: [u16; 1],
    backend: SharedBackend,
    mem: M,
    /// Stops and joins the worker thread when the device is dropped.
    _worker: WorkerHandle,
}

impl<M> BlockDevice<M>
where
    M: GuestAddressSpace + Send + 'static,
{
    fn new(config: &BlockConfig, mem: M) -> Result<Self, BlockError> {
        let disk = Disk::open(&config.path, config.readonly, &config.id)?;
        let mut features = feature_bit(VIRTIO_F_VERSION_1)
            | feature_bit(VIRTIO_RING_F_EVENT_IDX)
            | feature_bit(VIRTIO_BLK_F_FLUSH)
            | feature_bit(VIRTIO_BLK_F_SEG_MAX);
        if disk.readonly() {
            features |= feature_bit(VIRTIO_BLK_F_RO);
        }
        let cfg = config_space(disk.sectors());
        let queue_evt = EventFd::new(EFD_NONBLOCK).map_err(BlockError::EventFd)?;
        let kill_evt = EventFd::new(EFD_NONBLOCK).map_err(BlockError::EventFd)?;
        let worker_evt = queue_evt.try_clone().map_err(BlockError::EventFd)?;
        log::info!(
            "virtio-blk: {} ({} sectors{}, id {:?})",
            config.path.display(),
            disk.sectors(),
            if disk.readonly() { ", read-only" } else { "" },
            config.id
        );
        let backend = Arc::new(Mutex::new(Backend::new(disk)));
        let worker = BlockWorker::new(mem.clone(), worker_evt, kill_evt, backend.clone());
        Ok(Self {
            features,
            config: cfg,
            queue_evts: [queue_evt],
            queue_max_sizes: [QUEUE_SIZE],
            backend,
            mem,
            _worker: WorkerHandle::spawn(ID, worker)?,
        })
    }

    /// Makes the worker look at the queue.
    fn kick(&self) -> io::Result<()> {
        let [queue_evt] = &self.queue_evts;
        queue_evt.write(1)
    }
}

impl<M> VirtioDevice for BlockDevice<M>
where
    M: GuestAddressSpace + Send + 'static,
{
    fn id(&self) -> &'static str {
        ID
    }

    fn device_type(&self) -> u16 {
        // VIRTIO_ID_BLOCK is 2.
        u16::try_from(VIRTIO_ID_BLOCK).unwrap_or(0)
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_max_sizes
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    fn config(&self) -> &[u8] {
        &self.config
    }

    fn activate(&mut self, queues: Vec<Queue>, interrupt: Interrupt) -> Result<(), ActivateError> {
        let [queue] =
            <[Queue; 1]>::try_from(queues).map_err(|q| ActivateError::WrongQueueCount {
                expected: 1,
                got: q.len(),
            })?;
        if !queue.ready() {
            return Err(ActivateError::QueueNotEnabled(0));
        }
        if !queue.is_valid(&*self.mem.memory()) {
            return Err(ActivateError::QueueOutsideMemory(0));
        }
        lock(&self.backend).active = Some(ActiveQueue { queue, interrupt });
        // Serve anything the driver queued before DRIVER_OK (or, restored,
        // before the snapshot).
        if let Err(e) = self.kick() {
            log::error!("virtio-blk: failed to kick the worker: {e}");
        }
        Ok(())
    }

    fn reset(&mut self) {
        // Waits for the batch in progress: after this the worker is idle.
        lock(&self.backend).active = None;
    }

    fn queue_positions(&self) -> Option<Vec<QueuePosition>> {
        lock(&self.backend)
            .active
            .as_ref()
            .map(|active| vec![QueuePosition::of(&active.queue)])
    }
}

impl<M> Pausable for BlockDevice<M>
where
    M: GuestAddressSpace + Send + 'static,
{
    /// Waits out the batch in progress (every request the worker took is
    /// then in the used ring, its interrupt sent or pending in MSI-X),
    /// stops further ones, and makes completed writes durable so that a
    /// VMM opening the image after the switch-over reads them.
    fn pause(&mut self) -> Result<(), MigratableError> {
        let mut backend = lock(&self.backend);
        backend.disk.flush().map_err(MigratableError::Pause)?;
        backend.paused = true;
        Ok(())
    }

    /// Serves whatever the driver queued while paused: the notifications
    /// the worker set aside come down to this one kick.
    fn resume(&mut self) -> Result<(), MigratableError> {
        lock(&self.backend).paused = false;
        self.kick().map_err(MigratableError::Resume)
    }
}

/// A virtio-blk PCI function (vendor 0x1af4, device 0x1042).
pub struct Block<M: GuestAddressSpace + Send + 'static> {
    pci: VirtioPciDevice<BlockDevice<M>>,
    counters: Arc<BlockCounters>,
}

impl<M> Block<M>
where
    M: GuestAddressSpace + Send + 'static,
{
    /// Opens the image, starts the worker thread and builds the PCI function
    /// (BAR, capabilities, MSI-X vectors from `hooks.msi`). Doorbells are
    /// registered with `hooks.ioevents` once the guest enables the BAR.
    pub fn new(config: &BlockConfig, mem: M, hooks: DeviceHooks) -> Result<Self, BlockError> {
        let device = BlockDevice::new(config, mem)?;
        let counters = Arc::clone(&lock(&device.backend).disk.counters);
        let pci =
            VirtioPciDevice::new(device, PCI_CLASS_STORAGE, PCI_SUBCLASS_STORAGE_OTHER, hooks)?;
        Ok(Self { pci, counters })
    }

    /// A handle on the device's request counters, for the VMM to read
    /// while the device runs.
    pub fn counters(&self) -> Arc<dyn DeviceCounters> {
        self.counters.clone()
    }
}

/// Migration is the transport's: it saves the driver's settings, the
/// MSI-X table and the queue position; the disk itself travels apart.
impl<M> Pausable for Block<M>
where
    M: GuestAddressSpace + Send + 'static,
{
    fn pause(&mut self) -> Result<(), MigratableError> {
        self.pci.pause()
    }

    fn resume(&mut self) -> Result<(), MigratableError> {
        self.pci.resume()
    }
}

impl<M> Snapshottable for Block<M>
where
    M: GuestAddressSpace + Send + 'static,
{
    fn id(&self) -> String {
        self.pci.id()
    }

    fn snapshot(&mut self) -> Result<Snapshot, MigratableError> {
        self.pci.snapshot()
    }

    fn restore(&mut self, snapshot: &Snapshot) -> Result<(), MigratableError> {
        self.pci.restore(snapshot)
    }
}

impl<M> PciDevice for Block<M>
where
    M: GuestAddressSpace + Send + 'static,
{
    fn config(&self) -> &PciConfiguration {
        self.pci.config()
    }

    fn config_mut(&mut self) -> &mut PciConfiguration {
        self.pci.config_mut()
    }

    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        self.pci.read_bar(bar, offset, data);
    }

    fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]) {
        self.pci.write_bar(bar, offset, data);
    }

    fn config_written(&mut self, reg: usize) {
        self.pci.config_written(reg);
    }

    fn bar_moved(&mut self, bar: usize, old: u64, new: u64) {
        self.pci.bar_moved(bar, old, new);
    }
}

#[cfg(test)]
mod tests {
    //! The whole function through a real `PciBus`: config space over
    //! 0xCF8/0xCFC, registers over MMIO, a driver-side split ring in guest
    //! memory, and mocks standing in for KVM's irqfds and ioeventfds.
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use std::sync::Weak;
    use std::time::{Duration, Instant};

    use pci::test_utils::{MockIoEvents, MockMsi};
    use pci::PciBus;
    use serde_json::json;
    use vm_migration::test_utils::{state_json, with_state, Choices, Seeded};

    use crate::transport::pci::SavedVirtioPci;
    use virtio_bindings::virtio_blk::{VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT};
    use virtio_bindings::virtio_ring::VRING_DESC_F_NEXT;
    use vm_memory::bitmap::{AtomicBitmap, Bitmap};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
    use vmm_sys_util::tempfile::TempFile;

    use super::test_utils::*;
    use super::*;

    /// Production's memory type, behind an `Arc` (a `GuestAddressSpace`).
    type TestMem = Arc<GuestMemoryMmap<AtomicBitmap>>;

    const SLOT: u32 = 1;
    const MMIO64: (u64, u64) = (0x1_0000_0000, 0x1000_0000);
    // The BAR layout, and `virtio_pci_common_cfg` offsets from the spec.
    const ISR: u64 = 0x1000;
    const DEVICE: u64 = 0x2000;
    const NOTIFY: u64 = 0x3000;
    const MSIX_TABLE: u64 = 0x4000;
    const DEVICE_FEATURE_SELECT: u64 = 0x00;
    const DEVICE_FEATURE: u64 = 0x04;
    const DRIVER_FEATURE_SELECT: u64 = 0x08;
    const DRIVER_FEATURE: u64 = 0x0c;
    const CONFIG_MSIX_VECTOR: u64 = 0x10;
    const NUM_QUEUES: u64 = 0x12;
    const DEVICE_STATUS: u64 = 0x14;
    const QUEUE_SELECT: u64 = 0x16;
    const QUEUE_SIZE: u64 = 0x18;
    const QUEUE_MSIX_VECTOR: u64 = 0x1a;
    const QUEUE_ENABLE: u64 = 0x1c;
    const QUEUE_NOTIFY_OFF: u64 = 0x1e;
    const QUEUE_DESC: u64 = 0x20;
    const QUEUE_DRIVER: u64 = 0x28;
    const QUEUE_DEVICE: u64 = 0x30;
    const ACKNOWLEDGE: u8 = 1;
    const DRIVER: u8 = 2;
    const DRIVER_OK: u8 = 4;
    const FEATURES_OK: u8 = 8;
    const NEEDS_RESET: u8 = 0x40;
    const NO_VECTOR: u64 = 0xffff;
    const VERSION_1: u64 = 1 << 32;
    const EVENT_IDX: u64 = 1 << 29;
    // The driver's ring.
    const DESC_TABLE: u64 = 0x1000;
    const AVAIL: u64 = 0x2000;
    const USED: u64 = 0x3000;
    const QSIZE: u16 = 16;
    const NEXT: u16 = VRING_DESC_F_NEXT as u16;

    struct Harness {
        bus: PciBus,
        /// The function on the bus, which holds the only strong reference.
        dev: Weak<Mutex<Block<TestMem>>>,
        mem: TestMem,
        router: Arc<MockMsi>,
        ioevents: Arc<MockIoEvents>,
        bar: u64,
        file: TempFile,
        /// Requests the driver has made available so far.
        avail_idx: u16,
    }

    /// A block function of its own (not on a bus), with its mock hooks.
    fn block(
        file: &TempFile,
        mem: TestMem,
        readonly: bool,
    ) -> (Block<TestMem>, Arc<MockMsi>, Arc<MockIoEvents>) {
        let router = Arc::new(MockMsi::default());
        let ioevents = Arc::new(MockIoEvents::strict());
        let hooks = DeviceHooks {
            msi: router.clone(),
            ioevents: ioevents.clone(),
        };
        let config = BlockConfig {
            path: file.as_path().to_owned(),
            readonly,
            id: "disk0".into(),
        };
        (Block::new(&config, mem, hooks).unwrap(), router, ioevents)
    }

    impl Harness {
        fn new(readonly: bool) -> Self {
            Self::with(image(64), Arc::new(guest_memory()), readonly)
        }

        /// A freshly created function over `file` and `mem`, as on the
        /// destination of a migration.
        fn with(file: TempFile, mem: TestMem, readonly: bool) -> Self {
            let (block, router, ioevents) = block(&file, mem.clone(), readonly);
            let block = Arc::new(Mutex::new(block));
            let dev = Arc::downgrade(&block);
            let mut bus = PciBus::new((0xc000_0000, 0x1000_0000), MMIO64);
            let bars = bus.add_device(SLOT as u8, 0, block).unwrap();
            assert_eq!(bars, vec![(0, MMIO64.0)]);
            let mut h = Self {
                bus,
                dev,
                mem,
                router,
                ioevents,
                bar: MMIO64.0,
                file,
                avail_idx: 0,
            };
            // The guest's PCI core: memory decoding and bus mastering on.
            h.cfg_write(1, 0, &[0x06, 0x00]);
            h
        }

        fn cfg_select(&mut self, reg: u32) {
            let address = 0x8000_0000 | SLOT << 11 | reg << 2;
            self.bus.pio_write(0xcf8, &address.to_le_bytes());
        }

        fn cfg_read(&mut self, reg: u32) -> u32 {
            self.cfg_select(reg);
            let mut data = [0u8; 4];
            self.bus.pio_read(0xcfc, &mut data);
            u32::from_le_bytes(data)
        }

        fn cfg_write(&mut self, reg: u32, offset: u16, data: &[u8]) {
            self.cfg_select(reg);
            self.bus.pio_write(0xcfc + offset, data);
        }

        fn read(&self, offset: u64, len: usize) -> u64 {
            let mut data = vec![0u8; len];
            assert!(self.bus.mmio_read(self.bar + offset, &mut data));
            let mut bytes = [0u8; 8];
            bytes[..len].copy_from_slice(&data);
            u64::from_le_bytes(bytes)
        }

        fn write(&self, offset: u64, len: usize, value: u64) {
            assert!(self
                .bus
                .mmio_write(self.bar + offset, &value.to_le_bytes()[..len]));
        }

        fn status(&self) -> u8 {
            self.read(DEVICE_STATUS, 1) as u8
        }

        /// Each capability as (offset, first 20 bytes).
        fn capabilities(&mut self) -> Vec<(u32, Vec<u8>)> {
            let mut caps = Vec::new();
            let mut ptr = self.cfg_read(0x34 / 4) & 0xff;
            while ptr != 0 {
                let bytes: Vec<u8> = (0..5)
                    .flat_map(|i| self.cfg_read(ptr / 4 + i).to_le_bytes())
                    .collect();
                let next = u32::from(bytes[1]);
                caps.push((ptr, bytes));
                ptr = next;
            }
            caps
        }

        /// Programs both MSI-X entries (unmasked) and enables MSI-X, as
        /// Linux's `pci_enable_msix` does.
        fn enable_msix(&mut self) {
            for i in 0..2u64 {
                let entry = MSIX_TABLE + 16 * i;
                self.write(entry, 4, 0xfee0_0000);
                self.write(entry + 4, 4, 0);
                self.write(entry + 8, 4, 0x30 + i);
                self.write(entry + 12, 4, 0);
            }
            let (cap, _) = self
                .capabilities()
                .into_iter()
                .find(|(_, b)| b[0] == pci::MSIX_CAP_ID)
                .unwrap();
            self.cfg_write(cap / 4, 2, &[0x00, 0x80]);
        }

        /// Reset, ACKNOWLEDGE, DRIVER, features, FEATURES_OK; returns status.
        fn negotiate(&self, features: u64) -> u8 {
            self.write(DEVICE_STATUS, 1, 0);
            self.write(DEVICE_STATUS, 1, ACKNOWLEDGE.into());
            self.write(DEVICE_STATUS, 1, (ACKNOWLEDGE | DRIVER).into());
            self.write(DRIVER_FEATURE_SELECT, 4, 0);
            self.write(DRIVER_FEATURE, 4, features & 0xffff_ffff);
            self.write(DRIVER_FEATURE_SELECT, 4, 1);
            self.write(DRIVER_FEATURE, 4, features >> 32);
            self.write(
                DEVICE_STATUS,
                1,
                (ACKNOWLEDGE | DRIVER | FEATURES_OK).into(),
            );
            self.status()
        }

        /// Sets up queue 0 at `desc` (64-bit addresses as two dword
        /// writes, as Linux does) with MSI-X vector 1, and enables it.
        fn setup_queue(&mut self, desc: u64) {
            for a in [AVAIL, USED] {
                self.mem.write_slice(&[0; 0x200], GuestAddress(a)).unwrap();
            }
            self.avail_idx = 0;
            self.write(QUEUE_SELECT, 2, 0);
            self.write(QUEUE_SIZE, 2, QSIZE.into());
            for (reg, addr) in [
                (QUEUE_DESC, desc),
                (QUEUE_DRIVER, AVAIL),
                (QUEUE_DEVICE, USED),
            ] {
                self.write(reg, 4, addr & 0xffff_ffff);
                self.write(reg + 4, 4, addr >> 32);
            }
            self.write(QUEUE_MSIX_VECTOR, 2, 1);
            assert_eq!(self.read(QUEUE_MSIX_VECTOR, 2), 1);
            self.write(QUEUE_ENABLE, 2, 1);
        }

        /// The whole driver bring-up; returns the final status.
        fn start(&mut self, features: u64, desc: u64) -> u8 {
            self.enable_msix();
            assert_ne!(self.negotiate(features) & FEATURES_OK, 0);
            self.write(CONFIG_MSIX_VECTOR, 2, 0);
            self.setup_queue(desc);
            let status = self.status() | DRIVER_OK;
            self.write(DEVICE_STATUS, 1, status.into());
            self.status()
        }

        /// Makes a 512-byte request (descriptors 0-2) available.
        fn submit(&mut self, request_type: u32, sector: u64) {
            self.submit_at(0, request_type, sector);
        }

        /// Makes a 512-byte request available in request slot `slot`:
        /// descriptors 3 * slot.., its own header, data and status buffers.
        fn submit_at(&mut self, slot: u16, request_type: u32, sector: u64) {
            let m = &*self.mem;
            let (hdr, data, status) = slot_buffers(slot);
            write_header(m, hdr, request_type, sector);
            let data_flags = if request_type == VIRTIO_BLK_T_IN {
                W
            } else {
                0
            };
            let head = 3 * slot;
            for (i, d) in [
                desc(hdr, 16, NEXT, head + 1),
                desc(data, 512, data_flags | NEXT, head + 2),
                desc(status, 1, W, 0),
            ]
            .into_iter()
            .enumerate()
            {
                let index = u64::from(head) + i as u64;
                m.write_obj(d, GuestAddress(DESC_TABLE + 16 * index))
                    .unwrap();
            }
            let entry = u64::from(self.avail_idx % QSIZE);
            m.write_obj(head, GuestAddress(AVAIL + 4 + 2 * entry))
                .unwrap();
            self.avail_idx = self.avail_idx.wrapping_add(1);
            m.write_obj(self.avail_idx, GuestAddress(AVAIL + 2))
                .unwrap();
        }

        fn used_idx(&self) -> u16 {
            self.mem.read_obj(GuestAddress(USED + 2)).unwrap()
        }

        /// (id, len) of used ring entry `i`.
        fn used(&self, i: u64) -> (u32, u32) {
            let at = USED + 4 + 8 * i;
            (
                self.mem.read_obj(GuestAddress(at)).unwrap(),
                self.mem.read_obj(GuestAddress(at + 4)).unwrap(),
            )
        }

        fn request_status(&self) -> u8 {
            self.mem.read_obj(GuestAddress(STATUS)).unwrap()
        }

        /// Moves BAR 0 to `base` as Linux does (decoding off, low dword,
        /// high dword, decoding on).
        fn move_bar(&mut self, base: u64) {
            self.cfg_write(1, 0, &[0x00, 0x00]);
            self.cfg_write(4, 0, &(base as u32 | 0x4).to_le_bytes());
            self.cfg_write(5, 0, &((base >> 32) as u32).to_le_bytes());
            self.cfg_write(1, 0, &[0x06, 0x00]);
            self.bar = base;
        }

        /// The function's own snapshot, as the bus would take it.
        fn device_snapshot(&self) -> Snapshot {
            let dev = self.dev.upgrade().unwrap();
            let mut dev = dev.lock().unwrap();
            dev.snapshot().unwrap()
        }

        /// The queue's registered ioeventfd, as (address, eventfd).
        fn ioevent(&self) -> Option<(u64, vmm_sys_util::eventfd::EventFd)> {
            let mut registered = self.ioevents.doorbells();
            assert!(registered.len() <= 1);
            registered.pop()
        }
    }

    /// Header, data and status addresses of request slot `slot`.
    fn slot_buffers(slot: u16) -> (u64, u64, u64) {
        let slot = u64::from(slot);
        (HDR + 16 * slot, DATA + 512 * slot, STATUS + slot)
    }

    /// Polls `cond` until it holds; panics after 5 s.
    fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn identity_capabilities_and_config() {
        let mut h = Harness::new(false);
        assert_eq!(h.cfg_read(0), 0x1042_1af4);
        assert_eq!(h.cfg_read(2), 0x0180_0001, "class 01/80, revision 1");
        assert_eq!(h.cfg_read(11), 0x0040_1af4);
        let caps = h.capabilities();
        let virtio: Vec<_> = caps
            .iter()
            .filter(|(_, b)| b[0] == 0x09)
            .map(|(_, b)| {
                let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
                (b[3], b[4], word(8), word(12), b[2])
            })
            .collect();
        // (cfg_type, bar, offset, length, cap_len)
        assert_eq!(
            virtio,
            vec![
                (1, 0, 0, 0x38, 16),
                (3, 0, 0x1000, 1, 16),
                (2, 0, 0x3000, 4, 20),
                (4, 0, 0x2000, 96, 16)
            ]
        );
        let notify = caps
            .iter()
            .find(|(_, b)| b[0] == 0x09 && b[3] == 2)
            .unwrap();
        assert_eq!(
            &notify.1[16..20],
            &4u32.to_le_bytes(),
            "notify_off_multiplier"
        );
        let (_, msix) = caps.iter().find(|(_, b)| b[0] == pci::MSIX_CAP_ID).unwrap();
        assert_eq!(
            u16::from_le_bytes([msix[2], msix[3]]) & 0x7ff,
            1,
            "2 vectors"
        );
        assert_eq!(
            &msix[4..12],
            &[0x00, 0x40, 0, 0, 0x00, 0x60, 0, 0],
            "BAR 0 table/PBA"
        );

        h.write(DEVICE_FEATURE_SELECT, 4, 1);
        let high = h.read(DEVICE_FEATURE, 4);
        h.write(DEVICE_FEATURE_SELECT, 4, 0);
        let features = h.read(DEVICE_FEATURE, 4) | high << 32;
        // No VIRTIO_BLK_F_RO on a writable disk.
        let want = VERSION_1 | EVENT_IDX | 1 << VIRTIO_BLK_F_FLUSH | 1 << VIRTIO_BLK_F_SEG_MAX;
        assert_eq!(features, want);
        assert_eq!(h.read(NUM_QUEUES, 2), 1);
        assert_eq!(h.read(QUEUE_SIZE, 2), 256);
        assert_eq!(h.read(QUEUE_NOTIFY_OFF, 2), 0);
        assert_eq!(h.read(DEVICE, 8), 64, "capacity in sectors");
        assert_eq!(h.read(DEVICE + 4, 4), 0, "high half read alone");
        assert_eq!(h.read(DEVICE + 12, 4), 254, "seg_max");
        assert_eq!(h.read(DEVICE + 92, 4), 0, "fields of features not offered");
        assert_eq!(h.read(DEVICE + 96, 4), 0, "past the config reads nothing");
        // Config and ISR are read-only; outside the regions nothing happens.
        h.write(DEVICE, 4, 0xdead);
        assert_eq!(h.read(DEVICE, 4), 64);
        assert_eq!(h.read(0x7000, 4), 0);

        // Offsets from the bindings, so a layout slip shows here.
        assert_eq!(
            &config_space(3)[..16],
            &[3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 254, 0, 0, 0]
        );

        let mut ro = Harness::new(true);
        ro.write(DEVICE_FEATURE_SELECT, 4, 0);
        assert_ne!(ro.read(DEVICE_FEATURE, 4) & (1 << VIRTIO_BLK_F_RO), 0);
        assert_eq!(ro.cfg_read(0), 0x1042_1af4);
    }

    #[test]
    fn feature_negotiation_over_mmio() {
        let h = Harness::new(false);
        // Not offered (VIRTIO_BLK_F_RO on a writable disk), then legacy (no VERSION_1).
        assert_eq!(
            h.negotiate(VERSION_1 | 1 << VIRTIO_BLK_F_RO),
            ACKNOWLEDGE | DRIVER
        );
        assert_eq!(h.negotiate(1 << VIRTIO_BLK_F_FLUSH), ACKNOWLEDGE | DRIVER);
        assert_eq!(
            h.negotiate(VERSION_1 | EVENT_IDX),
            ACKNOWLEDGE | DRIVER | FEATURES_OK
        );
    }

    #[test]
    fn notify_serves_request_and_fires_msix() {
        let mut h = Harness::new(false);
        assert_eq!(
            h.start(VERSION_1, DESC_TABLE),
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK
        );
        assert!(
            h.router.routed(1),
            "queue vector routed once unmasked and enabled"
        );
        let (addr, ioevent) = h.ioevent().expect("doorbell registered as ioeventfd");
        assert_eq!(addr, h.bar + NOTIFY);

        // A notify that reaches the VMM as MMIO (Linux writes the queue index, 16 bits).
        h.submit(VIRTIO_BLK_T_IN, 5);
        h.write(NOTIFY, 2, 0);
        wait_until("MSI-X vector 1", || h.router.fired(1) > 0);
        assert_eq!(h.used_idx(), 1);
        assert_eq!(h.request_status(), 0);
        let got: Vec<u8> = (0..512)
            .map(|i| h.mem.read_obj(GuestAddress(DATA + i)).unwrap())
            .collect();
        assert_eq!(got, (5 * 512..6 * 512).map(pattern).collect::<Vec<_>>());
        // The device's write into guest RAM is in the dirty log (migration).
        let region = h.mem.find_region(GuestAddress(DATA)).unwrap();
        assert!(region.bitmap().dirty_at(DATA as usize));
        assert_eq!(h.router.fired(0), 0, "no config interrupt");

        // ISR: queue bit set, cleared by the read.
        assert_eq!(h.read(ISR, 1), 1);
        assert_eq!(h.read(ISR, 1), 0);

        // A notify through the ioeventfd, as KVM delivers it: a write.
        h.mem.write_slice(&[0x77; 512], GuestAddress(DATA)).unwrap();
        h.submit(VIRTIO_BLK_T_OUT, 9);
        ioevent.write(1).unwrap();
        wait_until("MSI-X vector 1 again", || h.router.fired(1) > 0);
        assert_eq!(h.used_idx(), 2);
        assert_eq!(h.request_status(), 0);
        let file = std::fs::read(h.file.as_path()).unwrap();
        assert!(file[9 * 512..10 * 512].iter().all(|b| *b == 0x77));
    }

    #[test]
    fn event_idx_device_works_end_to_end() {
        let mut h = Harness::new(false);
        h.start(VERSION_1 | EVENT_IDX, DESC_TABLE);
        // used_event (after the avail ring) left at 0: interrupt on the first.
        h.submit(VIRTIO_BLK_T_IN, 1);
        h.write(NOTIFY, 2, 0);
        wait_until("MSI-X vector 1", || h.router.fired(1) > 0);
        let avail_event: u16 = h
            .mem
            .read_obj(GuestAddress(USED + 4 + 8 * u64::from(QSIZE)))
            .unwrap();
        assert_eq!(
            avail_event, 1,
            "device asks to be notified of the next buffer"
        );
    }

    #[test]
    fn reset_stops_the_device_and_clears_state() {
        let mut h = Harness::new(false);
        h.start(VERSION_1, DESC_TABLE);
        h.write(DEVICE_STATUS, 1, 0);
        assert_eq!(h.status(), 0);
        assert_eq!(h.read(QUEUE_ENABLE, 2), 0);
        assert_eq!(h.read(QUEUE_MSIX_VECTOR, 2), NO_VECTOR);
        assert_eq!(h.read(CONFIG_MSIX_VECTOR, 2), NO_VECTOR);
        assert_eq!(h.read(DRIVER_FEATURE, 4), 0);
        assert_eq!(h.read(QUEUE_DESC, 8), 0);

        // A notify after reset is not served. (Bounded wait for an absence.)
        h.submit(VIRTIO_BLK_T_IN, 0);
        h.write(NOTIFY, 2, 0);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(h.used_idx(), 0);
        assert_eq!(h.router.fired(1), 0);

        // Brought up again, it serves as before.
        h.start(VERSION_1, DESC_TABLE);
        h.submit(VIRTIO_BLK_T_IN, 0);
        h.write(NOTIFY, 2, 0);
        wait_until("MSI-X vector 1", || h.router.fired(1) > 0);
        assert_eq!(h.used_idx(), 1);
    }

    #[test]
    fn queue_outside_memory_needs_reset() {
        let mut h = Harness::new(false);
        let status = h.start(VERSION_1, MEM_SIZE + 0x1000);
        assert_eq!(
            status,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK | NEEDS_RESET
        );
        assert_eq!(h.router.fired(0), 1, "config change interrupt");
        assert_eq!(h.read(ISR, 1), 2, "ISR config bit");
        // Reset clears it.
        h.write(DEVICE_STATUS, 1, 0);
        assert_eq!(h.status(), 0);
    }

    #[test]
    fn corrupt_ring_needs_reset() {
        let mut h = Harness::new(false);
        h.start(VERSION_1, DESC_TABLE);
        h.mem.write_obj(QSIZE + 1, GuestAddress(AVAIL + 2)).unwrap();
        h.write(NOTIFY, 2, 0);
        wait_until("config interrupt", || h.router.fired(0) > 0);
        assert_ne!(h.status() & NEEDS_RESET, 0);
        assert_eq!(h.used_idx(), 0);
    }

    #[test]
    fn ioeventfd_follows_memory_decoding_and_bar_moves() {
        let mut h = Harness::new(false);
        h.start(VERSION_1, DESC_TABLE);
        assert_eq!(h.ioevent().unwrap().0, MMIO64.0 + NOTIFY);
        // Decoding off: the doorbell must not catch writes any more.
        h.cfg_write(1, 0, &[0x00, 0x00]);
        assert!(h.ioevent().is_none());
        let new_base = MMIO64.0 + 0x10_0000;
        h.move_bar(new_base);
        assert_eq!(h.ioevent().unwrap().0, new_base + NOTIFY);
        h.submit(VIRTIO_BLK_T_IN, 0);
        h.ioevent().unwrap().1.write(1).unwrap();
        wait_until("MSI-X vector 1", || h.router.fired(1) > 0);

        // Without ioeventfds (registration fails), MMIO notifies still work.
        h.cfg_write(1, 0, &[0x00, 0x00]);
        h.ioevents.set_fail(true);
        h.cfg_write(1, 0, &[0x06, 0x00]);
        assert!(h.ioevent().is_none());
        h.submit(VIRTIO_BLK_T_IN, 0);
        h.write(NOTIFY, 2, 0);
        wait_until("MSI-X vector 1 via MMIO", || h.router.fired(1) > 0);
        assert_eq!(h.used_idx(), 2);
    }

    #[test]
    fn drop_unregisters_and_stops_the_worker() {
        let mut h = Harness::new(false);
        h.start(VERSION_1, DESC_TABLE);
        assert!(h.ioevent().is_some());
        let ioevents = h.ioevents.clone();
        // The bus holds the only reference to the device; dropping it must
        // join the worker (a hang fails the test) and remove the doorbell.
        drop(h);
        assert_eq!(ioevents.count(), 0);
    }

    /// `used_event` in the driver's avail ring (EVENT_IDX).
    const USED_EVENT: u64 = AVAIL + 4 + 2 * QSIZE as u64;

    /// Bounded wait for something that must not happen.
    fn settle() {
        std::thread::sleep(Duration::from_millis(50));
    }

    /// Fills request slot `slot`'s data buffer with `byte`.
    fn fill(h: &Harness, slot: u16, byte: u8) {
        let (_, data, _) = slot_buffers(slot);
        h.mem.write_slice(&[byte; 512], GuestAddress(data)).unwrap();
    }

    #[test]
    fn paused_device_serves_notifications_after_resume() {
        for readonly in [false, true] {
            let mut h = Harness::new(readonly);
            h.start(VERSION_1, DESC_TABLE);
            // Flushes even a read-only image.
            h.bus.pause().unwrap();
            h.submit(VIRTIO_BLK_T_IN, 0);
            h.ioevent().unwrap().1.write(1).unwrap();
            h.write(NOTIFY, 2, 0);
            settle();
            assert_eq!(h.used_idx(), 0, "no request taken while paused");
            assert_eq!(h.router.fired(1), 0);
            h.bus.resume().unwrap();
            wait_until("MSI-X vector 1", || h.router.fired(1) > 0);
            assert_eq!(h.used_idx(), 1);
            assert_eq!(h.request_status(), 0);
        }
    }

    /// A migration in the middle of a stream of writes: request 0
    /// completes before the pause, 1 is posted without a notification,
    /// 2 is notified while paused. The destination serves 1 and 2 when
    /// restored, then 3, and nothing twice.
    #[test]
    fn block_migrates_mid_stream() {
        let mut src = Harness::new(false);
        // Where the guest moved the BAR, not where a fresh bus puts it.
        let moved = MMIO64.0 + 0x10_0000;
        src.move_bar(moved);
        src.start(VERSION_1 | EVENT_IDX, DESC_TABLE);
        fill(&src, 0, 0xa0);
        src.submit_at(0, VIRTIO_BLK_T_OUT, 1);
        src.write(NOTIFY, 2, 0);
        wait_until("request 0", || src.used_idx() == 1);
        // The driver reuses request 0's buffers: serving it again would
        // write 0xee to sector 1 and clear the status sentinel.
        fill(&src, 0, 0xee);
        src.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        // The driver saw completion 1 and wants to hear of the next.
        src.mem.write_obj(1u16, GuestAddress(USED_EVENT)).unwrap();
        fill(&src, 1, 0xa1);
        src.submit_at(1, VIRTIO_BLK_T_OUT, 2);

        src.bus.pause().unwrap();
        // Request 0 is durable for a VMM opening the image now.
        let image = std::fs::read(src.file.as_path()).unwrap();
        assert!(image[512..1024].iter().all(|&b| b == 0xa0));
        fill(&src, 2, 0xa2);
        src.submit_at(2, VIRTIO_BLK_T_OUT, 3);
        src.ioevent().unwrap().1.write(1).unwrap();
        settle();
        assert_eq!(src.used_idx(), 1, "paused: nothing more taken");
        // Through bytes, as over the network.
        let saved = Snapshot::from_bytes(&src.bus.snapshot().unwrap().to_bytes()).unwrap();
        // Switch-over: the source goes away; guest RAM and the image stay.
        let Harness {
            bus,
            mem,
            file,
            avail_idx,
            ..
        } = src;
        drop(bus);

        let mut dst = Harness::with(file, mem, false);
        dst.avail_idx = avail_idx;
        dst.bus.restore(&saved).unwrap();
        dst.bar = moved;
        // Activation serves what was pending at the source.
        wait_until("requests 1 and 2", || dst.used_idx() == 3);
        wait_until("MSI-X vector 1", || dst.router.fired(1) > 0);
        assert_eq!(dst.ioevent().unwrap().0, moved + NOTIFY);
        assert_eq!(dst.status(), ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK);
        assert_eq!(dst.read(QUEUE_SIZE, 2), u64::from(QSIZE));
        assert_eq!(dst.read(QUEUE_DESC, 8), DESC_TABLE);
        assert_eq!(dst.read(QUEUE_DEVICE, 8), USED);
        assert_eq!(dst.read(QUEUE_ENABLE, 2), 1);
        assert_eq!(dst.read(QUEUE_MSIX_VECTOR, 2), 1);
        assert_eq!(dst.read(CONFIG_MSIX_VECTOR, 2), 0);
        dst.write(DRIVER_FEATURE_SELECT, 4, 0);
        assert_eq!(dst.read(DRIVER_FEATURE, 4), EVENT_IDX);

        // Read request 1's sector back, through the restored doorbell.
        dst.mem.write_obj(3u16, GuestAddress(USED_EVENT)).unwrap();
        dst.submit_at(3, VIRTIO_BLK_T_IN, 2);
        dst.ioevent().unwrap().1.write(1).unwrap();
        wait_until("request 3", || dst.used_idx() == 4);
        wait_until("MSI-X vector 1 again", || dst.router.fired(1) > 0);
        settle();
        assert_eq!(dst.used_idx(), 4, "no request served twice");
        let used: Vec<_> = (0..4).map(|i| dst.used(i)).collect();
        assert_eq!(used, vec![(0, 1), (3, 1), (6, 1), (9, 513)]);
        for slot in 0..4 {
            let (_, data, status) = slot_buffers(slot);
            let want = if slot == 0 { 0xff } else { 0 };
            assert_eq!(dst.mem.read_obj::<u8>(GuestAddress(status)).unwrap(), want);
            if slot == 3 {
                let mut back = [0u8; 512];
                dst.mem.read_slice(&mut back, GuestAddress(data)).unwrap();
                assert!(back.iter().all(|&b| b == 0xa1));
            }
        }
        let image = std::fs::read(dst.file.as_path()).unwrap();
        assert_eq!(image[..512], (0..512).map(pattern).collect::<Vec<_>>());
        for (sector, byte) in [(1, 0xa0), (2, 0xa1), (3, 0xa2)] {
            let at = sector * 512;
            assert!(
                image[at..at + 512].iter().all(|&b| b == byte),
                "sector {sector}"
            );
        }
    }

    /// A function the driver never started, and one whose start failed,
    /// come back as they were, not serving.
    #[test]
    fn inactive_and_failed_functions_restore_as_they_were() {
        for failed in [false, true] {
            let mut src = Harness::new(false);
            if failed {
                src.start(VERSION_1, MEM_SIZE + 0x1000);
            }
            let status = src.status();
            src.bus.pause().unwrap();
            let saved = src.bus.snapshot().unwrap();
            let Harness { bus, mem, file, .. } = src;
            drop(bus);

            let mut dst = Harness::with(file, mem, false);
            dst.bus.restore(&saved).unwrap();
            assert_eq!(dst.status(), status);
            assert_eq!(dst.read(ISR, 1), if failed { 2 } else { 0 });
            dst.setup_queue(DESC_TABLE);
            dst.submit(VIRTIO_BLK_T_IN, 0);
            dst.write(NOTIFY, 2, 0);
            settle();
            assert_eq!(dst.used_idx(), 0);
        }
    }

    /// Snapshots from a broken or hostile source: each out-of-range field
    /// is refused and leaves the function reset; random damage never
    /// panics.
    #[test]
    fn hostile_snapshots_are_refused() {
        let mut src = Harness::new(false);
        src.start(VERSION_1 | EVENT_IDX, DESC_TABLE);
        src.bus.pause().unwrap();
        let good = src.device_snapshot();
        let file = image(64);
        let (mut target, _router, _ioevents) = block(&file, Arc::new(guest_memory()), false);
        let status = |target: &mut Block<TestMem>| {
            let mut byte = [0u8];
            target.read_bar(0, DEVICE_STATUS, &mut byte);
            byte[0]
        };
        let running = ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK;
        target.restore(&good).unwrap();
        assert_eq!(status(&mut target), running);

        let json = state_json::<SavedVirtioPci>(&good);
        let position = json!({"next_avail": 0, "next_used": 0});
        let cases = [
            ("/common/device_features", json!(VERSION_1)),
            (
                "/common/driver_features",
                json!(VERSION_1 | 1 << VIRTIO_BLK_F_RO),
            ),
            ("/common/driver_features", json!(EVENT_IDX)),
            ("/common/status", json!(ACKNOWLEDGE | DRIVER | DRIVER_OK)),
            ("/common/status", json!(running | NEEDS_RESET)),
            ("/common/status", json!(256)),
            ("/common/isr", json!(0x80)),
            ("/common/config_vector", json!(2)),
            ("/common/queue_vectors", json!([1, 1])),
            ("/common/queue_vectors/0", json!(0x8000)),
            ("/common/queues", json!([])),
            ("/common/queues/0/size", json!(0)),
            ("/common/queues/0/size", json!(24)),
            ("/common/queues/0/size", json!(512)),
            ("/common/queues/0/size", json!(-1)),
            ("/common/queues/0/desc", json!(DESC_TABLE + 1)),
            ("/common/queues/0/device", json!(MEM_SIZE)),
            ("/common/queues/0/enabled", json!(false)),
            ("/common/needs_reset", json!(true)),
            ("/queues", json!(null)),
            ("/queues", json!([position, position])),
            ("/device_config/0", json!(65)),
            ("/device_config", json!([])),
            ("/msix/vectors", json!([])),
        ];
        let mut unrepresentable = Vec::new();
        for (pointer, value) in cases {
            let mut bad = json.clone();
            *bad.pointer_mut(pointer).unwrap() = value.clone();
            // A value the state's types cannot hold (-1 in a u16, null
            // for a list) has no binary encoding either.
            let Some(bad) = with_state::<SavedVirtioPci>(&good, bad) else {
                unrepresentable.push(format!("{pointer} = {value}"));
                continue;
            };
            let result = target.restore(&bad);
            assert!(
                matches!(result, Err(MigratableError::Restore(..))),
                "{pointer} = {value}: {result:?}"
            );
            assert_eq!(status(&mut target), 0, "{pointer} = {value}: left reset");
        }
        assert_eq!(
            unrepresentable,
            ["/common/status = 256", "/common/queues/0/size = -1"]
        );
        target.restore(&good).unwrap();
        assert_eq!(status(&mut target), running);

        let other = Snapshot {
            id: "serial".into(),
            ..good.clone()
        };
        assert!(matches!(
            target.restore(&other),
            Err(MigratableError::WrongId { .. })
        ));
        let newer = Snapshot {
            version: 2,
            ..good.clone()
        };
        assert!(matches!(
            target.restore(&newer),
            Err(MigratableError::Version { .. })
        ));

        // Damage a few bytes at a time, then pure noise.
        let mut rng = Seeded(0x9e37_79b9_7f4a_7c15);
        let mut next = move || rng.u64();
        for _ in 0..300 {
            let mut data = good.data.clone();
            for _ in 0..=next() % 4 {
                let at = (next() % data.len() as u64) as usize;
                data[at] = next() as u8;
            }
            let _ = target.restore(&Snapshot {
                data,
                ..good.clone()
            });
        }
        for len in [0, 1, 100, 4096] {
            let data = (0..len).map(|_| next() as u8).collect();
            assert!(target
                .restore(&Snapshot {
                    data,
                    ..good.clone()
                })
                .is_err());
        }
    }
}
