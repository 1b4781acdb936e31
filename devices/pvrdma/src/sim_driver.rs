// SPDX-License-Identifier: Apache-2.0
//! A simulated guest driver (feature `test-utils`): Linux's `vmw_pvrdma`
//! probe sequence, command posting and ring handling, step by step, on
//! guest memory, through a real [`PciBus`] (config space over CF8/CFC,
//! BARs by address), with [`MockMsi`]/[`MockIoEvents`] standing in for
//! KVM. Doorbell writes go where KVM would send them: to a registered
//! ioeventfd whose address and datamatch match, else to the bus as MMIO.
//!
//! Everything that can fail on the device side returns a [`Failure`], so
//! tests can feed hostile values and check the answer.

use std::collections::BTreeMap;
use std::mem::size_of;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use net_port::{FrameBackend, Port, VnetHdr};
use pci::test_utils::{MemoryImage, MockIoEvents, MockMsi};
use pci::{DeviceHooks, PciBus};
use pvrdma_abi::cmd::*;
use pvrdma_abi::dsr::{DeviceCaps, Dsr, RingPageInfo, DSR_CAPS_OFFSET};
use pvrdma_abi::regs::{uar, version, Ctl, Reg, BAR_MSIX, BAR_REG, BAR_UAR};
use pvrdma_abi::ring::{RingGeometry, RX_OFFSET, TX_OFFSET};
use pvrdma_abi::verbs::{qp_attr_mask as m, qp_state, qp_type, AhAttr, QpAttr, AH_FLAG_GRH};
use pvrdma_abi::wqe::{rq_stride, sq_stride, Cqe, Cqne, Eqe, RqWqeHdr, Sge, SqWqeHdr};
use pvrdma_abi::{PAGE_SIZE, PDIR_ENTRIES_PER_PAGE};
use vm_memory::bitmap::{AtomicBitmap, Bitmap};
use vm_memory::{
    ByteValued, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};
use vmm_sys_util::eventfd::EventFd;

pub mod endpoint;
pub mod fleet;
pub mod ib;
pub mod sharing;
mod verbs;
pub use verbs::{PageLayout, RcPath, RC_INIT_MASK, RC_RTR_MASK};
mod work;
use self::ib::Writer;
use crate::snapshot::thread_cpu;
use crate::{Pvrdma, PvrdmaConfig};
pub use work::ud_send;

/// Guest memory as the VMM passes it.
pub type Mem = Arc<GuestMemoryMmap<AtomicBitmap>>;

/// Guest memory in a memfd sealed against resizing, as the VMM makes it:
/// what `share_memory=on` hands to same-host peers.
fn memfd_memory(size: u64) -> GuestMemoryMmap<AtomicBitmap> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    let file = crate::datapath::shm_ring::memfd(size as usize, seals).expect("guest memory");
    let region =
        vm_memory::MmapRegion::from_file(vm_memory::FileOffset::new(file, 0), size as usize)
            .expect("guest memory mapping");
    GuestMemoryMmap::from_regions(vec![vm_memory::GuestRegionMmap::new(
        region,
        GuestAddress(0),
    )
    .expect("guest memory region")])
    .expect("guest memory")
}
pub const MEM_SIZE: u64 = 64 << 20;
/// The vmxnet3 MAC the port starts with.
pub const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
/// The default GID the tests bind (a link-local from the MAC).
pub const GID: [u8; 16] = [
    0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56,
];
/// The Q_Key [`SimDriver::to_rts`] gives UD QPs: the GSI's, as ib_mad's.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// How long a test waits for the worker.
pub const WAIT: Duration = Duration::from_secs(10);
const SLOT: u8 = 2;
const FUNCTION: u8 = 1;
/// The page allocator starts here and leaves a gap after every page, so
/// nothing the device does can rely on contiguity.
const FIRST_PAGE: u64 = 0x10_0000;
/// Dwords of a function's configuration space.
const CONFIG_REGS: u8 = 64;
/// The Linux driver's ring sizes: header page + 3 data pages.
const EVENT_RING_PAGES: u32 = 4;

/// How a command or a step of the probe failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// ERR read back non-zero.
    Err(u32),
    /// ERR was 0 but vector 0 did not fire.
    NoInterrupt,
    /// The response's `ack` was not the expected one.
    BadAck(u32),
    /// The caps fail the driver's `PVRDMA_SUPPORTED` check.
    Unsupported,
}

/// A ring the device fills, read with the driver's own arithmetic.
#[derive(Clone, Debug)]
pub struct DeviceRing {
    /// GPA of the `rx` index pair.
    pub indices: u64,
    pub data: Vec<u64>,
    pub geometry: RingGeometry,
    pub elem: u64,
}

/// A work queue the simulated driver fills.
#[derive(Clone, Debug)]
pub struct SimWq {
    pub indices: u64,
    pub data: Vec<u64>,
    pub geometry: RingGeometry,
    pub stride: u64,
}

#[derive(Clone, Debug)]
pub struct SimCq {
    pub handle: u32,
    pub cqe: u32,
    /// Who reads its CQEs (the kernel's CQs are context 0's).
    pub writer: Writer,
    /// UAR page of its context.
    pub page: u32,
    pub ring: DeviceRing,
}

#[derive(Clone, Debug)]
pub struct SimQp {
    pub handle: u32,
    pub qpn: u32,
    /// Who writes its WQEs (the kernel's QPs are those of its PDs).
    pub writer: Writer,
    pub page: u32,
    pub header: u64,
    pub sq: SimWq,
    pub rq: Option<SimWq>,
}

#[derive(Clone, Debug)]
pub struct SimSrq {
    pub handle: u32,
    pub page: u32,
    pub wq: SimWq,
}

/// What to create a QP with.
#[derive(Clone, Copy, Debug)]
pub struct QpSpec {
    pub qp_type: u8,
    pub pd: u32,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub srq: Option<u32>,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
}

impl QpSpec {
    /// An RC QP of 16 entries and one SGE each way.
    pub fn rc(pd: u32, cq: u32) -> Self {
        Self {
            qp_type: qp_type::RC,
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
        }
    }
}

pub struct SimDriver {
    config: PvrdmaConfig,
    pub mem: Mem,
    pub port: Arc<Port>,
    /// The simulated wire; unused when the device has another backend
    /// ([`SimDriver::with_backend`]).
    pub wire: Arc<SimWire>,
    /// What the device sends through: `wire`, or a real one.
    backend: Arc<dyn FrameBackend>,
    pub msi: Arc<MockMsi>,
    pub ioevents: Arc<MockIoEvents>,
    pub bus: PciBus,
    pub dev: Arc<Mutex<Pvrdma<Mem>>>,
    /// Guest-physical base of BAR0..BAR2.
    pub bars: [u64; 3],
    /// What the driver writes as `driver_version`.
    pub driver_version: u32,
    pub version: u32,
    pub dsr: u64,
    pub cmd_slot: u64,
    pub resp_slot: u64,
    pub async_ring: Option<DeviceRing>,
    pub cq_notify_ring: Option<DeviceRing>,
    /// UAR index of each user context.
    pub contexts: BTreeMap<u32, u32>,
    /// Context of each PD.
    pub pds: BTreeMap<u32, u32>,
    next_page: u64,
    /// Bytes of guest memory.
    mem_size: u64,
    seq: u64,
    /// Configuration space as `with_memory` left it, for [`Self::reset`].
    config_space: Vec<u32>,
}

/// What [`SimDriver::migrate_timed`] measured.
#[derive(Clone, Copy, Debug)]
pub struct MigrateTimes {
    /// Encoded snapshot.
    pub bytes: usize,
    /// Pause and snapshot.
    pub save: Duration,
    pub encode: Duration,
    pub decode: Duration,
    /// The new device on a new bus, its PCI state replayed, and what the
    /// source's restore hint names made ahead.
    pub plug: Duration,
    pub restore: Duration,
    /// This thread's CPU time in pause + save + encode + decode + restore,
    /// and in encode + decode alone: what the wall times cost without the
    /// waits of a loaded machine (other threads' work not included).
    pub cpu_migrate: Duration,
    pub cpu_codec: Duration,
}

/// A device, its guest memory and its driver saved by
/// [`SimDriver::checkpoint`], to go back to with [`SimDriver::rewind`].
pub struct Checkpoint {
    device: vm_migration::Snapshot,
    memory: MemoryImage,
    version: u32,
    /// DSR, command and response slots.
    slots: (u64, u64, u64),
    /// Async and CQ notification rings.
    rings: (Option<DeviceRing>, Option<DeviceRing>),
    contexts: BTreeMap<u32, u32>,
    pds: BTreeMap<u32, u32>,
    next_page: u64,
    seq: u64,
}

/// The simulated wire of a [`SimDriver`]: frames the device sends are
/// offered to the peer's port ([`SimDriver::connect`]) as a TAP on one
/// bridge would deliver them, or kept in `sent` without a peer.
pub struct SimWire {
    peer: Mutex<Option<std::sync::Weak<Port>>>,
    pub sent: Mutex<Vec<Vec<u8>>>,
    /// Frames the peer's RDMA function did not claim.
    pub unclaimed: std::sync::atomic::AtomicU64,
    /// Drop one frame in n, pseudo-randomly (0: none), as a lossy link
    /// would (a periodic pattern could hit the same PSN every round).
    pub drop_one_in: std::sync::atomic::AtomicU64,
    /// Frames sent (dropped ones included).
    pub frames: std::sync::atomic::AtomicU64,
    never: EventFd,
}

impl SimWire {
    /// A wire with no peer: sent frames are kept in `sent`.
    pub fn unconnected() -> Self {
        Self {
            peer: Mutex::new(None),
            sent: Mutex::new(Vec::new()),
            unclaimed: std::sync::atomic::AtomicU64::new(0),
            drop_one_in: std::sync::atomic::AtomicU64::new(0),
            frames: std::sync::atomic::AtomicU64::new(0),
            never: EventFd::new(0).expect("eventfd"),
        }
    }
}

impl SimWire {
    /// Forgets the frames sent and the counts, keeping the peer and the
    /// loss setting.
    fn clear(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.unclaimed.store(0, Relaxed);
        self.frames.store(0, Relaxed);
    }
}

impl FrameBackend for SimWire {
    fn send(&self, _: &VnetHdr, frame: &[u8]) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        let n = self.frames.fetch_add(1, Relaxed) + 1;
        let one_in = self.drop_one_in.load(Relaxed);
        // The frame count, mixed (splitmix64's finaliser): repeatable, and
        // no stride of counts maps to a stride of hashes. A multiplicative
        // hash (`n * K >> 40`) did: bursts of 123 frames after each
        // retransmission lost the same first frame every time, so one PSN
        // never arrived and the sender ran out of retries (about one run
        // in 20-50 of device_migration_keeps_queue_pairs_and_traffic).
        let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        if one_in != 0 && (z ^ (z >> 31)).is_multiple_of(one_in) {
            return Ok(());
        }
        let peer = self
            .peer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match peer.and_then(|p| p.upgrade()) {
            Some(port) => {
                if !port.steer_to_rdma(frame) {
                    self.unclaimed
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            None => self
                .sent
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(frame.to_vec()),
        }
        Ok(())
    }

    fn recv(&self, _: &mut [u8]) -> std::io::Result<Option<(VnetHdr, usize)>> {
        Ok(None)
    }

    fn rx_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.never)
    }

    fn link_up(&self) -> bool {
        true
    }
}

/// A new device on a fresh bus: its BARs (placed the same way every time).
fn plug(
    config: &PvrdmaConfig,
    port: &Arc<Port>,
    backend: &Arc<dyn FrameBackend>,
    mem: &Mem,
    hooks: DeviceHooks,
) -> (Arc<Mutex<Pvrdma<Mem>>>, PciBus, [u64; 3]) {
    let dev = Arc::new(Mutex::new(
        Pvrdma::new(config, port.clone(), backend.clone(), mem.clone(), hooks).expect("device"),
    ));
    let mut bus = PciBus::new((0xc000_0000, 0x1000_0000), (0x1_0000_0000, 0x1_0000_0000));
    let placed = bus
        .add_device(SLOT, FUNCTION, dev.clone())
        .expect("add device");
    let mut bars = [0; 3];
    for (bar, base) in placed {
        if let Some(b) = bars.get_mut(bar) {
            *b = base;
        }
    }
    (dev, bus, bars)
}

impl SimDriver {
    /// Live-migrates the device under the running driver: its snapshot
    /// (encoded, as it would cross the network) goes into a new device on
    /// the same guest memory, port and wire, after the old one is gone
    /// (its doorbells unregistered, its worker stopped). The PCI side is
    /// replayed as the VMM's bus restore would: the same BARs, memory
    /// decoding, MSI-X vectors.
    pub fn migrate(self) -> Self {
        self.migrate_timed().0
    }

    /// [`Self::migrate`], timing each of its stages (the resume is not
    /// timed: a VMM does it after the hand-over).
    pub fn migrate_timed(self) -> (Self, MigrateTimes) {
        use vm_migration::Pausable;
        let (sim, times) = self.migrate_paused_timed();
        sim.device().resume().expect("resume");
        (sim, times)
    }

    /// [`Self::migrate_timed`] up to the restore: the new device, paused
    /// from the start as a destination VMM's is, stays so.
    pub fn migrate_paused_timed(self) -> (Self, MigrateTimes) {
        self.migrate_paused_after(|_| ())
    }

    /// [`Self::migrate_paused_timed`], the guest doing `between` after
    /// the restore hint was taken (while the memory is copied).
    pub fn migrate_paused_after(self, between: impl FnOnce(&mut Self)) -> (Self, MigrateTimes) {
        self.migrate_paused_around(between, |_| ())
    }

    /// [`Self::migrate_paused_timed`], the guest doing `between` after the
    /// restore hint was taken (while the memory is copied) and `last`
    /// after the later hint (just before the switch-over), as a VMM takes
    /// them.
    pub fn migrate_paused_around(
        mut self,
        between: impl FnOnce(&mut Self),
        last: impl FnOnce(&mut Self),
    ) -> (Self, MigrateTimes) {
        use vm_migration::{Pausable, Snapshot, Snapshottable};
        // Taken at the migration's start, while the device runs.
        let hint = self.device().restore_hint();
        between(&mut self);
        let late = hint.as_ref().and_then(|_| self.device().restore_hint());
        last(&mut self);
        let c = thread_cpu();
        let t = Instant::now();
        self.device().pause().expect("pause");
        let snapshot = self.device().snapshot().expect("snapshot");
        let save = t.elapsed();
        let c_codec = thread_cpu();
        let t = Instant::now();
        let bytes = snapshot.to_bytes();
        let encode = t.elapsed();
        let t = Instant::now();
        let snapshot = Snapshot::from_bytes(&bytes).expect("decode");
        let decode = t.elapsed();
        let cpu_codec = thread_cpu().saturating_sub(c_codec);
        let cpu_before_plug = thread_cpu().saturating_sub(c);
        // The destination VMM's interrupt routes: GSIs from 0 again, as
        // the driver's vectors are numbered here.
        let t = Instant::now();
        self.msi = Arc::new(MockMsi::default());
        let hooks = DeviceHooks {
            msi: self.msi.clone(),
            ioevents: self.ioevents.clone(),
        };
        // The new device registers no doorbell before its restore, so the
        // old one (paused) may go only when it is replaced; a same-host
        // channel would need the old one gone first (not used here).
        let (dev, bus, bars) = plug(&self.config, &self.port, &self.backend, &self.mem, hooks);
        assert_eq!(self.bars, bars, "the same BARs");
        self.bus = bus;
        self.dev = dev;
        self.cfg_write(1, 0x6);
        self.enable_msix();
        self.device().pause().expect("pause");
        // Before the state comes: not part of the blackout.
        for hint in hint.iter().chain(&late) {
            self.device().prepare_restore(hint).expect("prepare");
        }
        let plug = t.elapsed();
        let c = thread_cpu();
        let t = Instant::now();
        self.device().restore(&snapshot).expect("restore");
        let restore = t.elapsed();
        let times = MigrateTimes {
            bytes: bytes.len(),
            save,
            encode,
            decode,
            plug,
            restore,
            cpu_migrate: cpu_before_plug + thread_cpu().saturating_sub(c),
            cpu_codec,
        };
        (self, times)
    }

    /// [`Self::migrate`] to a VMM whose port is new (same MAC, link and
    /// MTU), as another VMM's NIC is: it has seen nothing of the guest's
    /// frames yet. Join the wires again ([`Self::connect`]).
    pub fn migrate_to_new_port(mut self) -> Self {
        let state = self.port.state();
        let port = Arc::new(Port::new(state.mac, state.carrier));
        port.set_active(state.active);
        port.set_mtu(state.mtu);
        self.port = port;
        self.migrate()
    }

    /// Joins the wires of two simulated devices, as one bridge would.
    pub fn connect(a: &SimDriver, b: &SimDriver) {
        *a.wire.peer.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::downgrade(&b.port));
        *b.wire.peer.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::downgrade(&a.port));
    }

    pub fn new() -> Self {
        Self::with_config(&PvrdmaConfig::default())
    }

    /// A device on a fresh bus, memory decoding and MSI-X enabled, the
    /// port's link up; not probed yet.
    pub fn with_config(config: &PvrdmaConfig) -> Self {
        Self::with_config_and_mac(config, MAC)
    }

    /// [`Self::with_config`] with the port's MAC `mac`.
    pub fn with_config_and_mac(config: &PvrdmaConfig, mac: [u8; 6]) -> Self {
        Self::with_memory(config, mac, MEM_SIZE)
    }

    /// [`Self::with_config_and_mac`] with `mem_size` bytes of guest memory
    /// instead of [`MEM_SIZE`] (thousands of QPs need more).
    pub fn with_memory(config: &PvrdmaConfig, mac: [u8; 6], mem_size: u64) -> Self {
        let wire = Arc::new(SimWire::unconnected());
        Self::plugged(config, mac, mem_size, wire.clone(), wire)
    }

    /// [`Self::with_config_and_mac`] sending through `backend` (a TAP, for
    /// the wire benchmark) instead of the simulated wire. Nothing reads
    /// the backend for the device: whoever does offers the frames it
    /// receives to `port` ([`Port::steer_to_rdma`]), as the NIC would.
    pub fn with_backend(
        config: &PvrdmaConfig,
        mac: [u8; 6],
        backend: Arc<dyn FrameBackend>,
    ) -> Self {
        Self::plugged(
            config,
            mac,
            MEM_SIZE,
            Arc::new(SimWire::unconnected()),
            backend,
        )
    }

    fn plugged(
        config: &PvrdmaConfig,
        mac: [u8; 6],
        mem_size: u64,
        wire: Arc<SimWire>,
        backend: Arc<dyn FrameBackend>,
    ) -> Self {
        // A worker on this thread (`device_worker::inline`) has nobody to
        // busy-poll for: each of its yields would only hand the CPU to other
        // processes for a time slice (a fuzz input took 24 s at nice 19 on a
        // busy machine, 0.2 s alone).
        let config = &PvrdmaConfig {
            busy_poll: if device_worker::inline::enabled() {
                Duration::ZERO
            } else {
                config.busy_poll
            },
            ..config.clone()
        };
        let mem: Mem = Arc::new(if config.share_memory {
            memfd_memory(mem_size)
        } else {
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), mem_size as usize)])
                .expect("guest memory")
        });
        let port = Arc::new(Port::new(mac, true));
        port.set_active(true);
        let msi = Arc::new(MockMsi::default());
        let ioevents = Arc::new(MockIoEvents::default());
        let hooks = DeviceHooks {
            msi: msi.clone(),
            ioevents: ioevents.clone(),
        };
        let (dev, bus, bars) = plug(config, &port, &backend, &mem, hooks);
        let mut sim = Self {
            config: config.clone(),
            mem,
            port,
            wire,
            backend,
            msi,
            ioevents,
            bus,
            dev,
            bars,
            driver_version: version::QP_HANDLE,
            version: 0,
            dsr: 0,
            cmd_slot: 0,
            resp_slot: 0,
            async_ring: None,
            cq_notify_ring: None,
            contexts: BTreeMap::new(),
            pds: BTreeMap::new(),
            next_page: FIRST_PAGE,
            mem_size,
            seq: 0,
            config_space: Vec::new(),
        };
        // Memory decoding and bus mastering, as pci_enable_device does.
        sim.cfg_write(1, 0x6);
        sim.enable_msix();
        sim.config_space = (0..CONFIG_REGS).map(|reg| sim.cfg_read(reg)).collect();
        sim
    }

    /// Starts over on this device as a new driver would after one that left
    /// it in any state ([`Self::rewind`] starts the same way): configuration
    /// space and the MSI-X table as [`Self::with_memory`] left them (Linux's
    /// `pci_restore_state`), the device's RESET, guest memory all zero
    /// again, and this driver's own bookkeeping forgotten. A probe then
    /// finds what it finds on a new device; the device tests check that
    /// its saved state is the same.
    pub fn reset(&mut self) {
        self.start_over(&MemoryImage::default());
        self.enable_msix();
        self.version = 0;
        (self.dsr, self.cmd_slot, self.resp_slot) = (0, 0, 0);
        (self.async_ring, self.cq_notify_ring) = (None, None);
        self.contexts.clear();
        self.pds.clear();
        self.next_page = FIRST_PAGE;
        self.seq = 0;
    }

    /// [`Self::reset`] but for the MSI-X table and the driver's bookkeeping,
    /// with guest memory put back to `memory` instead of all zero. As
    /// Linux's `pci_restore_config_space`, only the configuration registers
    /// that differ are written.
    fn start_over(&mut self, memory: &MemoryImage) {
        for (reg, value) in (0..CONFIG_REGS).zip(self.config_space.clone()) {
            if self.cfg_read(reg) != value {
                self.cfg_write(reg, value);
            }
        }
        let reset = self.bars[BAR_REG] + Reg::Ctl.offset();
        self.bus
            .mmio_write(reset, &(Ctl::Reset as u32).to_le_bytes());
        memory.rewind(&self.mem);
        for gsi in 0..3 {
            self.msi.fired(gsi);
        }
        self.wire.clear();
    }

    /// Saves the device and its guest as a VMM saves them for a snapshot
    /// (the device paused, its state, the guest memory written so far), with
    /// this driver's bookkeeping, for [`Self::rewind`]. Only on a device
    /// whose guest memory nothing but this driver and the device wrote since
    /// it was built or [`Self::reset`].
    pub fn checkpoint(&mut self) -> Checkpoint {
        use vm_migration::{Pausable, Snapshottable};
        let mut dev = self.device();
        dev.pause().expect("pause");
        let device = dev.snapshot().expect("snapshot");
        dev.resume().expect("resume");
        drop(dev);
        Checkpoint {
            device,
            memory: MemoryImage::take(&self.mem),
            version: self.version,
            slots: (self.dsr, self.cmd_slot, self.resp_slot),
            rings: (self.async_ring.clone(), self.cq_notify_ring.clone()),
            contexts: self.contexts.clone(),
            pds: self.pds.clone(),
            next_page: self.next_page,
            seq: self.seq,
        }
    }

    /// Puts the device and its guest back as they were at `saved`, whatever
    /// state they were left in, as a VMM restores a snapshot (and as the
    /// fuzz targets do between inputs, instead of probing and making the
    /// objects again): [`Self::reset`]'s configuration space and RESET, then
    /// guest memory as saved and the device's state (MSI-X table included)
    /// restored onto the reset device, which is a new one (the device tests
    /// check that the result is the pair that was saved).
    pub fn rewind(&mut self, saved: &Checkpoint) {
        use vm_migration::Snapshottable;
        self.start_over(&saved.memory);
        self.device().restore(&saved.device).expect("restore");
        self.version = saved.version;
        (self.dsr, self.cmd_slot, self.resp_slot) = saved.slots;
        (self.async_ring, self.cq_notify_ring) = saved.rings.clone();
        self.contexts.clone_from(&saved.contexts);
        self.pds.clone_from(&saved.pds);
        self.next_page = saved.next_page;
        self.seq = saved.seq;
    }

    pub fn device(&self) -> MutexGuard<'_, Pvrdma<Mem>> {
        self.dev.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The device counter `name`.
    pub fn metric(&self, name: &str) -> u64 {
        self.device()
            .metrics()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map_or_else(|| panic!("no metric {name}"), |(_, v)| v)
    }

    fn cfg_select(&mut self, reg: u8) {
        let addr =
            0x8000_0000u32 | u32::from(SLOT) << 11 | u32::from(FUNCTION) << 8 | u32::from(reg) << 2;
        self.bus.pio_write(0xcf8, &addr.to_le_bytes());
    }

    pub fn cfg_read(&mut self, reg: u8) -> u32 {
        self.cfg_select(reg);
        let mut data = [0u8; 4];
        self.bus.pio_read(0xcfc, &mut data);
        u32::from_le_bytes(data)
    }

    pub fn cfg_write(&mut self, reg: u8, value: u32) {
        self.cfg_select(reg);
        self.bus.pio_write(0xcfc, &value.to_le_bytes());
    }

    /// Finds the MSI-X capability, programs every vector and enables it.
    fn enable_msix(&mut self) {
        let mut pos = (self.cfg_read(0x34 / 4) & 0xff) as u8;
        while pos != 0 && (self.cfg_read(pos / 4) & 0xff) != 0x11 {
            pos = ((self.cfg_read(pos / 4) >> 8) & 0xff) as u8;
        }
        assert_ne!(pos, 0, "MSI-X capability");
        for v in 0..3u64 {
            let entry = self.bars[BAR_MSIX] + v * 16;
            self.write32(entry, 0xfee0_0000);
            self.write32(entry + 4, 0);
            self.write32(entry + 8, 0x40 + v as u32);
            self.write32(entry + 12, 0);
        }
        self.cfg_select(pos / 4);
        self.bus.pio_write(0xcff, &[0x80]);
    }

    pub fn read32(&self, addr: u64) -> u32 {
        let mut data = [0u8; 4];
        assert!(
            self.bus.mmio_read(addr, &mut data),
            "MMIO read at {addr:#x}"
        );
        u32::from_le_bytes(data)
    }

    pub fn write32(&self, addr: u64, value: u32) {
        assert!(
            self.bus.mmio_write(addr, &value.to_le_bytes()),
            "MMIO write at {addr:#x}"
        );
    }

    pub fn reg_read(&self, reg: Reg) -> u32 {
        self.read32(self.bars[BAR_REG] + reg.offset())
    }

    pub fn reg_write(&self, reg: Reg, value: u32) {
        self.write32(self.bars[BAR_REG] + reg.offset(), value);
    }

    /// A zeroed page (with an unused page after it).
    pub fn alloc_page(&mut self) -> u64 {
        let page = self.reserve(1);
        self.zero(page);
        page
    }

    /// `n` zeroed pages, each with an unused page after it, so that no
    /// two are guest-physically contiguous.
    pub fn alloc_pages(&mut self, n: u32) -> Vec<u64> {
        (0..n).map(|_| self.alloc_page()).collect()
    }

    /// `n` zeroed pages that follow each other in guest-physical memory
    /// (as a buffer in a guest's huge page), with an unused page after
    /// the last.
    pub fn alloc_run(&mut self, n: u32) -> Vec<u64> {
        let start = self.reserve(n);
        let pages: Vec<u64> = (0..u64::from(n)).map(|i| start + i * PAGE_SIZE).collect();
        for &page in &pages {
            self.zero(page);
        }
        pages
    }

    /// The first of `n` pages not handed out yet, and an unused one after
    /// them.
    fn reserve(&mut self, n: u32) -> u64 {
        let start = self.next_page;
        self.next_page += (u64::from(n) + 1) * PAGE_SIZE;
        assert!(
            self.next_page <= self.mem_size,
            "sim guest memory exhausted"
        );
        start
    }

    /// Zeroes `page` if it was ever written: a page never written is zero
    /// already (the dirty bitmap knows which were), and writing it would
    /// only fault it in, for every page of every device a fuzz input
    /// builds.
    fn zero(&self, page: u64) {
        let region = self.mem.find_region(GuestAddress(page)).expect("RAM");
        if region
            .bitmap()
            .dirty_at((page - region.start_addr().0) as usize)
        {
            self.mem
                .write_slice(&[0; PAGE_SIZE as usize], GuestAddress(page))
                .expect("zero page");
        }
    }

    /// A page directory for `pages`, as `pvrdma_page_dir_init` builds it.
    pub fn make_pdir(&mut self, pages: &[u64]) -> u64 {
        let dir = self.alloc_page();
        for (t, chunk) in pages.chunks(PDIR_ENTRIES_PER_PAGE as usize).enumerate() {
            let table = self.alloc_page();
            self.write(dir + 8 * t as u64, table);
            for (i, page) in chunk.iter().enumerate() {
                self.write(table + 8 * i as u64, *page);
            }
        }
        dir
    }

    pub fn write<T: ByteValued>(&self, addr: u64, value: T) {
        self.mem
            .write_obj(value, GuestAddress(addr))
            .expect("guest write");
    }

    pub fn read<T: ByteValued>(&self, addr: u64) -> T {
        self.mem.read_obj(GuestAddress(addr)).expect("guest read")
    }

    /// `pvrdma_pci_probe` up to ACTIVATE. Returns the caps.
    pub fn probe(&mut self) -> Result<DeviceCaps, Failure> {
        self.version = self.reg_read(Reg::Version);
        let dsr = self.alloc_page();
        let (async_info, async_ring) = self.event_ring(size_of::<Eqe>() as u64);
        let (cq_info, cq_ring) = self.event_ring(size_of::<Cqne>() as u64);
        let (cmd_slot, resp_slot) = (self.alloc_page(), self.alloc_page());
        let uar_pfn = self.bars[BAR_UAR] >> 12;
        self.write(
            dsr,
            Dsr {
                driver_version: self.driver_version,
                // 64-bit Linux, version 1.
                gos_info: 2 | 1 << 2 | 1 << 6,
                cmd_slot_dma: cmd_slot,
                resp_slot_dma: resp_slot,
                async_ring_pages: async_info,
                cq_ring_pages: cq_info,
                uar_pfn64: if self.version >= version::PPN64 {
                    uar_pfn
                } else {
                    uar_pfn & 0xffff_ffff
                },
                ..Dsr::default()
            },
        );
        (self.dsr, self.cmd_slot, self.resp_slot) = (dsr, cmd_slot, resp_slot);
        (self.async_ring, self.cq_notify_ring) = (Some(async_ring), Some(cq_ring));
        self.load_dsr(dsr);
        let caps: DeviceCaps = self.read(dsr + DSR_CAPS_OFFSET);
        let gid_ok = match self.version {
            17 => caps.gid_types == 1,
            v => v >= 18 && matches!(caps.gid_types, 1 | 2),
        };
        if caps.mode != 0 || !gid_ok || !caps.max_uar.is_power_of_two() {
            return Err(Failure::Unsupported);
        }
        self.reg_write(Reg::Imr, 0);
        self.ctl(Ctl::Activate)?;
        Ok(caps)
    }

    /// Writes DSRLOW then DSRHIGH.
    pub fn load_dsr(&self, dsr: u64) {
        self.reg_write(Reg::DsrLow, dsr as u32);
        self.reg_write(Reg::DsrHigh, (dsr >> 32) as u32);
    }

    /// Writes CTL and reads ERR, as the driver does.
    pub fn ctl(&self, ctl: Ctl) -> Result<(), Failure> {
        self.reg_write(Reg::Ctl, ctl as u32);
        match self.reg_read(Reg::Err) {
            0 => Ok(()),
            err => Err(Failure::Err(err)),
        }
    }

    /// A DSR ring of the driver's size: its descriptor and its view.
    fn event_ring(&mut self, elem: u64) -> (RingPageInfo, DeviceRing) {
        let pages = self.alloc_pages(EVENT_RING_PAGES);
        let pdir = self.make_pdir(&pages);
        let n = (EVENT_RING_PAGES as u64 - 1) * PAGE_SIZE / elem;
        let info = RingPageInfo {
            num_pages: EVENT_RING_PAGES,
            reserved: 0,
            pdir_dma: pdir,
        };
        let ring = DeviceRing {
            indices: pages[0] + RX_OFFSET,
            data: pages[1..].to_vec(),
            geometry: RingGeometry::new(n as u32).expect("geometry"),
            elem,
        };
        (info, ring)
    }

    /// Copies `bytes` (a whole request, header included) to the command
    /// slot, writes REQUEST and reads ERR.
    pub fn post_raw(&mut self, bytes: &[u8]) -> Result<(), Failure> {
        self.mem
            .write_slice(bytes, GuestAddress(self.cmd_slot))
            .expect("command slot");
        self.msi.fired(0);
        self.reg_write(Reg::Request, 0);
        match self.reg_read(Reg::Err) {
            0 if self.msi.fired(0) == 0 => Err(Failure::NoInterrupt),
            0 => Ok(()),
            err => Err(Failure::Err(err)),
        }
    }

    /// Posts `req` as command `code` without reading the response (the
    /// driver's "no response expected" commands).
    pub fn post<Req: ByteValued>(&mut self, code: CmdCode, req: Req) -> Result<(), Failure> {
        self.seq += 1;
        let hdr = CmdHdr {
            response: self.seq,
            cmd: code as u32,
            reserved: 0,
        };
        let mut bytes = req.as_slice().to_vec();
        bytes[..size_of::<CmdHdr>()].copy_from_slice(hdr.as_slice());
        self.post_raw(&bytes)
    }

    /// Posts a command and returns its response, checking `ack` and the
    /// echoed key as `pvrdma_cmd_post` does.
    pub fn cmd<Req: ByteValued, Resp: ByteValued>(
        &mut self,
        code: CmdCode,
        req: Req,
    ) -> Result<Resp, Failure> {
        self.post(code, req)?;
        let hdr: RespHdr = self.read(self.resp_slot);
        if hdr.ack != code.ack() || hdr.response != self.seq {
            return Err(Failure::BadAck(hdr.ack));
        }
        Ok(self.read(self.resp_slot))
    }

    /// A DESTROY_* command (they all carry one handle).
    pub fn destroy(&mut self, code: CmdCode, handle: u32) -> Result<(), Failure> {
        self.post(
            code,
            DestroyPdReq {
                pd_handle: handle,
                ..Default::default()
            },
        )
    }

    /// Polls `cond` until it holds or [`WAIT`] passes; false on timeout.
    /// Workers that run inline (`device_worker::inline`) are run meanwhile.
    pub fn wait_until(&self, mut cond: impl FnMut(&Self) -> bool) -> bool {
        let deadline = Instant::now() + WAIT;
        while !cond(self) {
            if device_worker::inline::run_pending() > 0 {
                continue;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

impl Default for SimDriver {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Workers on the test's thread do not busy-poll; workers of their own
    /// do, as configured.
    #[test]
    fn inline_workers_do_not_busy_poll() {
        let threaded = SimDriver::new();
        assert_eq!(threaded.config.busy_poll, crate::DEFAULT_BUSY_POLL);
        device_worker::inline::enable();
        let inline = SimDriver::new();
        assert_eq!(inline.config.busy_poll, Duration::ZERO);
    }
}
