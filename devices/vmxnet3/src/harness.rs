// SPDX-License-Identifier: Apache-2.0
//! A whole function on a real `PciBus`, for the device's tests and the
//! fuzz targets (feature `test-utils`): config space over 0xCF8/0xCFC,
//! registers over MMIO, a fake driver's rings in guest memory, mocks for
//! KVM's irqfds and ioeventfds and for the backend.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use net_port::Port;
use pci::test_utils::{MockIoEvents, MockMsi};
use pci::{DeviceHooks, PciBus};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::metrics::{Vmxnet3Counters, Vmxnet3Metrics};
use crate::regs::{MSIX_BAR, NUM_VECTORS, PT_BAR, VD_BAR};
use crate::test_utils::{DriverLayout, MockBackend, SHARED};
use crate::{Vmxnet3, Vmxnet3Config};

pub type TestMem = Arc<GuestMemoryMmap<AtomicBitmap>>;

pub const SLOT: u32 = 3;
pub const MAC: [u8; 6] = [0x02, 0x50, 0x56, 0x00, 0x00, 0x01];
pub const MEM_SIZE: usize = 16 << 20;
pub const RX_BUFS: u64 = 0x40_0000;
pub const TX_BUFS: u64 = 0xc0_0000;
// Registers.
pub const VRRS: u64 = 0x00;
pub const UVRS: u64 = 0x08;
pub const DSAL: u64 = 0x10;
pub const DSAH: u64 = 0x18;
pub const CMD: u64 = 0x20;
pub const MACL: u64 = 0x28;
pub const MACH: u64 = 0x30;
pub const ECR: u64 = 0x40;
pub const ACTIVATE: u32 = 0xcafe_0000;
pub const QUIESCE: u32 = 0xcafe_0001;
pub const RESET: u32 = 0xcafe_0002;
pub const UPDATE_RX_MODE: u32 = 0xcafe_0003;
pub const GET_STATS: u32 = 0xf00d_0001;
pub const GET_LINK: u32 = 0xf00d_0002;
pub const GET_CONF_INTR: u32 = 0xf00d_0008;
// Descriptor bits.
pub const TXD_GEN: u32 = 1 << 14;
pub const TXD_EOP: u32 = 1 << 12;
pub const TXD_CQ: u32 = 1 << 13;
pub const RXD_GEN: u32 = 1 << 31;
pub const RXD_BODY: u32 = 1 << 14;
pub const COMP_GEN: u32 = 1 << 31;

/// The offload fields of a SOP descriptor.
#[derive(Clone, Copy, Default)]
pub struct Sop {
    pub om: u32,
    pub hlen: u32,
    pub msscof: u32,
    pub tci: Option<u16>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct RxComp {
    pub idx: u32,
    pub rqid: u32,
    pub len: u32,
    pub sop: bool,
    pub eop: bool,
}

#[derive(Clone)]
pub struct TxSide {
    pub fill: u32,
    pub gen: bool,
    pub comp: u32,
    pub comp_gen: bool,
}

#[derive(Clone)]
pub struct RxSide {
    pub fill: [u32; 2],
    pub gen: [bool; 2],
    pub comp: u32,
    pub comp_gen: bool,
}

pub struct Harness {
    pub bus: PciBus,
    /// The device the bus holds, for calls the bus does not make.
    pub nic: Arc<Mutex<Vmxnet3<TestMem>>>,
    pub mem: TestMem,
    pub router: Arc<MockMsi>,
    pub ioevents: Arc<MockIoEvents>,
    pub backend: Arc<MockBackend>,
    pub port: Arc<Port>,
    pub metrics: Arc<Vmxnet3Metrics>,
    pub bars: Vec<(usize, u64)>,
    pub layout: DriverLayout,
    pub tx: Vec<TxSide>,
    pub rx: Vec<RxSide>,
    /// Configuration space as `new` left it, for [`Harness::reset`].
    config_space: Vec<u32>,
}

/// Dwords of a function's configuration space.
const CONFIG_REGS: u32 = 64;

/// Polls `cond` until it holds; panics after 5 s. Workers that run inline
/// (`device_worker::inline`) are run meanwhile.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        if device_worker::inline::run_pending() > 0 {
            continue;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Harness {
    /// A device on a bus as a booted guest's driver leaves it after
    /// probing: memory decoding, bus mastering and MSI-X on, link read.
    pub fn new() -> Self {
        let mem: TestMem =
            Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap());
        let mut h = Self::build(mem);
        // Memory decoding and bus mastering on, then MSI-X as Linux sets
        // it up; the driver's probe reads the link.
        h.cfg_write(1, 0, &[0x06, 0x00]);
        h.enable_msix();
        assert_eq!(h.cmd(GET_LINK), 10_000 << 16 | 1);
        h.config_space = (0..CONFIG_REGS).map(|reg| h.cfg_read(reg)).collect();
        h
    }

    /// Starts over on this function as a new driver would after one that
    /// left it in any state (and as the fuzz target does between inputs,
    /// instead of building a function each time): configuration space and
    /// the MSI-X table as [`Harness::new`] left them (Linux's
    /// `pci_restore_state`), the device's RESET_DEV, the registers a driver
    /// writes (MAC, DriverShared address) as on a new function, the
    /// backend's and the port's link and queues as new, guest memory all zero
    /// again. The device tests check that the saved state is a new
    /// function's (`persist::a_reset_function_is_a_new_one`).
    pub fn reset(&mut self) {
        // As Linux's `pci_restore_config_space`: only the registers that differ.
        for (reg, value) in (0..CONFIG_REGS).zip(self.config_space.clone()) {
            if self.cfg_read(reg) != value {
                self.cfg_write(reg, 0, &value.to_le_bytes());
            }
        }
        self.enable_msix();
        self.cmd(RESET);
        self.write(
            VD_BAR,
            MACL,
            u32::from_le_bytes([MAC[0], MAC[1], MAC[2], MAC[3]]),
        );
        self.write(VD_BAR, MACH, u32::from_le_bytes([MAC[4], MAC[5], 0, 0]));
        self.write(VD_BAR, DSAL, 0);
        self.write(VD_BAR, DSAH, 0);
        self.backend.clear();
        self.port.set_carrier(true);
        pci::test_utils::zero_written_pages(&self.mem);
        self.layout = DriverLayout::new(1, 1, 64, 1500);
        self.tx.clear();
        self.rx.clear();
        assert_eq!(self.cmd(GET_LINK), 10_000 << 16 | 1);
    }

    /// A fresh device on a fresh bus over `mem`, untouched by any driver.
    fn build(mem: TestMem) -> Self {
        let router = Arc::new(MockMsi::default());
        let ioevents = Arc::new(MockIoEvents::strict());
        let backend = Arc::new(MockBackend::new(true));
        let port = Arc::new(Port::new([0; 6], false));
        let hooks = DeviceHooks {
            msi: router.clone(),
            ioevents: ioevents.clone(),
        };
        let config = Vmxnet3Config {
            mac: MAC,
            multifunction: true,
        };
        let nic = Vmxnet3::new(&config, port.clone(), backend.clone(), mem.clone(), hooks).unwrap();
        let metrics = nic.metrics();
        let nic = Arc::new(Mutex::new(nic));
        let mut bus = PciBus::new((0xc000_0000, 0x1000_0000), (0x1_0000_0000, 0x1000_0000));
        let bars = bus.add_device(SLOT as u8, 0, nic.clone()).unwrap();
        Harness {
            bus,
            nic,
            mem,
            router,
            ioevents,
            backend,
            port,
            metrics,
            bars,
            layout: DriverLayout::new(1, 1, 64, 1500),
            tx: Vec::new(),
            rx: Vec::new(),
            config_space: Vec::new(),
        }
    }

    /// What a migration makes of `src` (which must be paused) on another
    /// host: a copy of its guest memory, a fresh device on a fresh bus
    /// with new hooks and backend, and the bus snapshot, through bytes,
    /// restored onto it (configuration space, then the device). The fake
    /// driver carries on where it was. The new device is paused, as after
    /// any restore.
    pub fn migrate(src: &Harness) -> Self {
        // Through bytes, as it crosses the network.
        let bytes = src.bus.snapshot().unwrap().to_bytes();
        let snapshot = vm_migration::Snapshot::from_bytes(&bytes).unwrap();
        let mem: TestMem =
            Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap());
        // The pages written since the source was created, as vm-memory's
        // dirty bitmap has them (the VMM's migration reads it too); the
        // others are zero on both sides.
        let mut page = vec![0u8; 4096];
        for at in pci::test_utils::written_pages(&src.mem) {
            src.mem.read_slice(&mut page, GuestAddress(at)).unwrap();
            mem.write_slice(&page, GuestAddress(at)).unwrap();
        }
        let mut h = Self::build(mem);
        h.bus.restore(&snapshot).unwrap();
        h.bars = src.bars.clone();
        h.layout = src.layout.clone();
        h.tx = src.tx.clone();
        h.rx = src.rx.clone();
        h.config_space = src.config_space.clone();
        h
    }

    pub fn bar(&self, bar: usize) -> u64 {
        self.bars.iter().find(|(b, _)| *b == bar).unwrap().1
    }

    pub fn cfg_read(&mut self, reg: u32) -> u32 {
        let address = 0x8000_0000 | SLOT << 11 | reg << 2;
        self.bus.pio_write(0xcf8, &address.to_le_bytes());
        let mut data = [0u8; 4];
        self.bus.pio_read(0xcfc, &mut data);
        u32::from_le_bytes(data)
    }

    pub fn cfg_write(&mut self, reg: u32, offset: u16, data: &[u8]) {
        let address = 0x8000_0000 | SLOT << 11 | reg << 2;
        self.bus.pio_write(0xcf8, &address.to_le_bytes());
        self.bus.pio_write(0xcfc + offset, data);
    }

    pub fn read(&self, bar: usize, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        assert!(self.bus.mmio_read(self.bar(bar) + offset, &mut data));
        u32::from_le_bytes(data)
    }

    pub fn write(&self, bar: usize, offset: u64, value: u32) {
        assert!(self
            .bus
            .mmio_write(self.bar(bar) + offset, &value.to_le_bytes()));
    }

    pub fn cmd(&self, cmd: u32) -> u32 {
        self.write(VD_BAR, CMD, cmd);
        self.read(VD_BAR, CMD)
    }

    pub fn enable_msix(&mut self) {
        for v in 0..u64::from(NUM_VECTORS) {
            let entry = 16 * v;
            self.write(MSIX_BAR, entry, 0xfee0_0000);
            self.write(MSIX_BAR, entry + 4, 0);
            self.write(MSIX_BAR, entry + 8, 0x40 + v as u32);
            self.write(MSIX_BAR, entry + 12, 0);
        }
        let cap = self.cfg_read(0x34 / 4) & 0xff;
        assert_eq!(self.cfg_read(cap / 4) & 0xff, u32::from(pci::MSIX_CAP_ID));
        self.cfg_write(cap / 4, 2, &[0x00, 0x80]);
    }

    /// Writes `layout`'s DriverShared, resets the fake driver's rings
    /// and issues ACTIVATE_DEV; returns what CMD reads.
    pub fn activate_with(&mut self, layout: DriverLayout) -> u32 {
        layout.write(&*self.mem);
        let tx =
            (0..usize::from(layout.num_tx)).flat_map(|q| [layout.tx_ring(q), layout.tx_comp(q)]);
        let rx = (0..usize::from(layout.num_rx)).flat_map(|q| {
            [
                layout.rx_ring(q, 0),
                layout.rx_ring(q, 1),
                layout.rx_comp(q),
            ]
        });
        self.clear_rings(tx.chain(rx));
        self.tx = (0..layout.num_tx)
            .map(|_| TxSide {
                fill: 0,
                gen: true,
                comp: 0,
                comp_gen: true,
            })
            .collect();
        self.rx = (0..layout.num_rx)
            .map(|_| RxSide {
                fill: [0; 2],
                gen: [true; 2],
                comp: 0,
                comp_gen: true,
            })
            .collect();
        self.layout = layout;
        self.write(VD_BAR, DSAL, SHARED as u32);
        self.write(VD_BAR, DSAH, 0);
        let result = self.cmd(ACTIVATE);
        // vmxnet3_enable_all_intrs.
        for i in 0..u64::from(self.layout.num_intrs) {
            self.write(PT_BAR, 8 * i, 0);
        }
        result
    }

    /// Zeroes the 64 KiB of each ring at `rings` that lie in RAM (hostile
    /// layouts put rings anywhere, up to 1275 of them). Pages never written
    /// are zero already: the dirty bitmap says which were, read once for all
    /// rings, which spares a fuzz input most of the work (each activation
    /// would write megabytes otherwise, or ask about thousands of pages).
    fn clear_rings(&self, rings: impl Iterator<Item = u64>) {
        const PAGE: u64 = 4096;
        static ZEROS: [u8; PAGE as usize] = [0; PAGE as usize];
        // Zeroing writes only pages in the list, so it stays the list.
        let written = pci::test_utils::written_pages(&self.mem);
        for addr in rings {
            let end = addr.saturating_add(0x1_0000).min(MEM_SIZE as u64);
            let first = written.partition_point(|&page| page + PAGE <= addr);
            for &page in written[first..].iter().take_while(|&&page| page < end) {
                let (from, to) = (page.max(addr), (page + PAGE).min(end));
                let _ = self
                    .mem
                    .write_slice(&ZEROS[..(to - from) as usize], GuestAddress(from));
            }
        }
    }

    pub fn activate(&mut self, num_tx: u8, num_rx: u8, mtu: u32) {
        assert_eq!(
            self.activate_with(DriverLayout::new(num_tx, num_rx, 64, mtu)),
            0
        );
    }

    pub fn tx_buf(&self, n: u64) -> u64 {
        TX_BUFS + n * 0x1_0000
    }

    /// Posts one packet on TX queue `q`: `bufs` as (address, length
    /// field), the SOP's offload fields, an EOP on the last descriptor
    /// if `eop`; flips the SOP's generation last. Returns the EOP index.
    pub fn post_tx(&mut self, q: usize, bufs: &[(u64, u32)], sop: Sop, eop: bool) -> u32 {
        let ring = self.layout.tx_ring(q);
        let side = &mut self.tx[q];
        let sop_index = side.fill;
        let mut last = sop_index;
        for (i, &(addr, len)) in bufs.iter().enumerate() {
            let gen = if i == 0 { !side.gen } else { side.gen };
            let mut dw2 = (len & 0x3fff) | (u32::from(gen) * TXD_GEN);
            let mut dw3 = 0;
            if i == 0 {
                dw2 |= sop.msscof << 18;
                dw3 |= sop.hlen | sop.om << 10;
                if let Some(tci) = sop.tci {
                    dw3 |= 1 << 15 | u32::from(tci) << 16;
                }
            }
            if eop && i == bufs.len() - 1 {
                dw3 |= TXD_EOP | TXD_CQ;
            }
            let at = ring + 16 * u64::from(side.fill);
            self.mem.write_obj(addr, GuestAddress(at)).unwrap();
            self.mem.write_obj(dw2, GuestAddress(at + 8)).unwrap();
            self.mem.write_obj(dw3, GuestAddress(at + 12)).unwrap();
            last = side.fill;
            step(&mut side.fill, &mut side.gen, self.layout.ring_size);
        }
        let at = GuestAddress(ring + 16 * u64::from(sop_index) + 8);
        let dw2: u32 = self.mem.read_obj(at).unwrap();
        self.mem.write_obj(dw2 ^ TXD_GEN, at).unwrap();
        last
    }

    /// Writes `frame` to TX buffer `n`; returns its address.
    pub fn put_frame(&self, n: u64, frame: &[u8]) -> u64 {
        let addr = self.tx_buf(n);
        self.mem.write_slice(frame, GuestAddress(addr)).unwrap();
        addr
    }

    pub fn send_one(&mut self, q: usize, frame: &[u8], sop: Sop) -> u32 {
        let addr = self.put_frame(0, frame);
        let eop = self.post_tx(q, &[(addr, frame.len() as u32)], sop, true);
        self.write(PT_BAR, 0x600 + 8 * q as u64, self.tx[q].fill);
        eop
    }

    /// The TX completions the driver has not seen yet (their txdIdx).
    pub fn tx_completions(&mut self, q: usize) -> Vec<u32> {
        let base = self.layout.tx_comp(q);
        let side = &mut self.tx[q];
        let size = self.layout.ring_size;
        let mut done = Vec::new();
        while let Some(at) = next_completion(
            &self.mem,
            base,
            (&mut side.comp, &mut side.comp_gen, size),
            TXCOMP_TYPE,
        ) {
            done.push(self.mem.read_obj::<u32>(GuestAddress(at)).unwrap() & 0xfff);
        }
        done
    }

    pub fn wait_tx_completions(&mut self, q: usize, n: usize) -> Vec<u32> {
        let mut all = Vec::new();
        wait_until("TX completions", || {
            all.extend(self.tx_completions(q));
            all.len() >= n
        });
        all
    }

    pub fn rx_buf(ring: usize, idx: u32) -> u64 {
        RX_BUFS + (ring as u64 * 256 + u64::from(idx)) * 0x4000
    }

    /// Posts `count` buffers of `len` bytes on ring `ring` of RX queue
    /// `q`, HEAD or BODY as `body(i)` says for the i-th.
    pub fn post_rx(
        &mut self,
        q: usize,
        ring: usize,
        count: u32,
        len: u32,
        body: impl Fn(u32) -> bool,
    ) {
        let base = self.layout.rx_ring(q, ring);
        let size = self.layout.ring_size;
        let side = &mut self.rx[q];
        for _ in 0..count {
            let idx = side.fill[ring];
            let at = base + 16 * u64::from(idx);
            let btype = if body(idx) { RXD_BODY } else { 0 };
            let dw2 = len | btype | (u32::from(side.gen[ring]) * RXD_GEN);
            self.mem
                .write_obj(Self::rx_buf(ring, idx), GuestAddress(at))
                .unwrap();
            self.mem.write_obj(dw2, GuestAddress(at + 8)).unwrap();
            step(&mut side.fill[ring], &mut side.gen[ring], size);
        }
    }

    pub fn rx_completions(&mut self, q: usize) -> Vec<RxComp> {
        let base = self.layout.rx_comp(q);
        let side = &mut self.rx[q];
        let size = self.layout.rx_comp_size;
        let mut done = Vec::new();
        while let Some(at) = next_completion(
            &self.mem,
            base,
            (&mut side.comp, &mut side.comp_gen, size),
            RXCOMP_TYPE,
        ) {
            let dw0: u32 = self.mem.read_obj(GuestAddress(at)).unwrap();
            let dw2: u32 = self.mem.read_obj(GuestAddress(at + 8)).unwrap();
            assert_ne!(dw0 & 1 << 30, 0, "checksum not calculated");
            done.push(RxComp {
                idx: dw0 & 0xfff,
                rqid: dw0 >> 16 & 0x3ff,
                len: dw2 & 0x3fff,
                sop: dw0 & 1 << 15 != 0,
                eop: dw0 & 1 << 14 != 0,
            });
        }
        done
    }

    pub fn wait_rx_completions(&mut self, q: usize, n: usize) -> Vec<RxComp> {
        let mut all = Vec::new();
        wait_until("RX completions", || {
            all.extend(self.rx_completions(q));
            all.len() >= n
        });
        all
    }

    pub fn read_rx(&self, ring: usize, idx: u32, len: u32) -> Vec<u8> {
        let mut data = vec![0u8; len as usize];
        self.mem
            .read_slice(&mut data, GuestAddress(Self::rx_buf(ring, idx)))
            .unwrap();
        data
    }

    pub fn ecr(&self) -> u32 {
        self.mem.read_obj(GuestAddress(SHARED + 696)).unwrap()
    }

    pub fn queue_status(&self, desc: usize) -> (u8, u32) {
        let d = self.layout.queue_desc(desc);
        (
            self.mem.read_obj(GuestAddress(d + 80)).unwrap(),
            self.mem.read_obj(GuestAddress(d + 84)).unwrap(),
        )
    }

    pub fn counters(&self) -> Vmxnet3Counters {
        self.metrics.counters()
    }
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

/// Completion descriptor types (`VMXNET3_CDTYPE_*`, dword 3 bits 24-30).
const TXCOMP_TYPE: u32 = 0;
const RXCOMP_TYPE: u32 = 3;

/// The address of the next completion of `kind` in the ring at `base`
/// (position, generation and size in `ring`) if the device wrote it (its
/// generation bit is the driver's), the position stepped past it.
fn next_completion(
    mem: &TestMem,
    base: u64,
    (pos, gen, size): (&mut u32, &mut bool, u32),
    kind: u32,
) -> Option<u64> {
    let at = base + 16 * u64::from(*pos);
    let dw3: u32 = mem.read_obj(GuestAddress(at + 12)).unwrap();
    if (dw3 & COMP_GEN != 0) != *gen {
        return None;
    }
    assert_eq!(dw3 >> 24 & 0x7f, kind, "completion type");
    step(pos, gen, size);
    Some(at)
}

/// The driver's side of a generation ring: one entry on, flipping the
/// generation at the wrap.
fn step(pos: &mut u32, gen: &mut bool, size: u32) {
    *pos += 1;
    if *pos == size {
        *pos = 0;
        *gen = !*gen;
    }
}
