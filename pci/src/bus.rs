// SPDX-License-Identifier: Apache-2.0
//! Bus 0: the host bridge, slots/functions, CF8/CFC, BAR placement and
//! MMIO dispatch to BARs.
//!
//! Configuration mechanism #1: a dword write to 0xCF8 selects
//! bus/device/function/register (bit 31 enables it), and 1/2/4-byte
//! accesses to 0xCFC..=0xCFF reach that register. Only bus 0 exists.
//!
//! A config write goes to the function's [`PciConfiguration::write_reg`];
//! if that reports a BAR move the bus re-points its MMIO decoding and calls
//! [`PciDevice::bar_moved`], then it calls [`PciDevice::config_written`]
//! for every write.

#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};
use vm_migration::{MigratableError, Pausable, Snapshot, Snapshottable};

use crate::configuration::PciConfigurationState;
use crate::{BarKind, PciConfiguration, PciDevice, PciHeader};

/// The address register; only dword writes hit it.
const CONFIG_ADDRESS: u16 = 0xcf8;
/// The first of the four data ports.
const CONFIG_DATA: u16 = 0xcfc;
const ENABLE_BIT: u32 = 1 << 31;
const MAX_SLOTS: u8 = 32;
const MAX_FUNCTIONS: u8 = 8;
/// Header-type bit 7, in byte 2 of dword 3.
const HEADER_TYPE_REG: usize = 3;
const HEADER_MULTIFUNCTION: u32 = 1 << 23;

#[derive(Debug, thiserror::Error)]
pub enum PciBusError {
    #[error("Slot {0} is out of range (0-31)")]
    InvalidSlot(u8),
    #[error("Function {0} is out of range (0-7)")]
    InvalidFunction(u8),
    #[error("Function {slot:02x}.{function} is already taken")]
    FunctionTaken { slot: u8, function: u8 },
    #[error("Slot {0:02x} holds several functions but function 0 is not multi-function")]
    NotMultifunction(u8),
    #[error("No room for BAR {bar} ({size:#x} bytes) in its MMIO window")]
    WindowExhausted { bar: usize, size: u64 },
    #[error("BAR index {0} is out of range")]
    InvalidBarIndex(usize),
    #[error("Invalid BAR size {0:#x} (a power of two from 16 bytes)")]
    InvalidBarSize(u64),
    #[error("BAR slot {0} is already in use")]
    BarInUse(usize),
    #[error("Capability of {0} bytes is shorter than its header")]
    CapabilityTooShort(usize),
    #[error("No room for a {0}-byte capability in config space")]
    CapabilitySpaceFull(usize),
    #[error("Capability writable mask is longer than the capability")]
    CapabilityMaskTooLong,
    #[error("Saved configuration space does not fit this function: {0}")]
    InvalidState(&'static str),
}

/// The bus in a VM snapshot.
const BUS_ID: &str = "pci";
const BUS_VERSION: u32 = 1;
/// The functions' restore hints ([`PciBus::restore_hints`]).
const HINTS_ID: &str = "pci-hints";
const HINTS_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct SavedBus {
    config_address: u32,
    functions: Vec<SavedFunction>,
}

#[derive(Serialize, Deserialize)]
struct SavedFunction {
    devfn: u8,
    config: PciConfigurationState,
    device: Snapshot,
}

/// Where one BAR of a function is decoded.
#[derive(Clone, Copy, Debug)]
struct BarRange {
    bar: usize,
    base: u64,
    size: u64,
}

struct Function {
    dev: Arc<Mutex<dyn PciDevice>>,
    bars: Vec<BarRange>,
}

/// A bump allocator over one MMIO window.
#[derive(Clone, Copy, Debug)]
struct Window {
    next: u64,
    /// Exclusive.
    end: u64,
}

impl Window {
    fn new((start, len): (u64, u64)) -> Self {
        Window {
            next: start,
            end: start.saturating_add(len),
        }
    }

    /// A naturally aligned block of `size` (a power of two) bytes.
    fn allocate(&mut self, size: u64) -> Option<u64> {
        let align = size.checked_sub(1)?;
        let base = self.next.checked_add(align)? & !align;
        let end = base.checked_add(size)?;
        if end > self.end {
            return None;
        }
        self.next = end;
        Some(base)
    }
}

/// The host bridge at 00.0: an identity for the guest, nothing to decode.
struct HostBridge {
    config: PciConfiguration,
}

impl Pausable for HostBridge {}

impl Snapshottable for HostBridge {
    fn id(&self) -> String {
        "host-bridge".into()
    }
    fn snapshot(&mut self) -> Result<Snapshot, MigratableError> {
        Snapshot::new(&self.id(), 1, &())
    }
    fn restore(&mut self, snapshot: &Snapshot) -> Result<(), MigratableError> {
        snapshot.state::<()>(&self.id(), 1)
    }
}

impl PciDevice for HostBridge {
    fn config(&self) -> &PciConfiguration {
        &self.config
    }
    fn config_mut(&mut self) -> &mut PciConfiguration {
        &mut self.config
    }
    fn read_bar(&mut self, _bar: usize, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }
    fn write_bar(&mut self, _bar: usize, _offset: u64, _data: &[u8]) {}
}

pub struct PciBus {
    /// The CF8 register, kept verbatim so the guest reads back what it wrote.
    config_address: u32,
    /// Keyed by devfn (slot << 3 | function).
    functions: BTreeMap<u8, Function>,
    mmio32: Window,
    mmio64: Window,
}

impl std::fmt::Debug for PciBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PciBus")
            .field(
                "config_address",
                &format_args!("{:#x}", self.config_address),
            )
            .field("devfns", &self.functions.keys().collect::<Vec<_>>())
            .field("mmio32", &self.mmio32)
            .field("mmio64", &self.mmio64)
            .finish()
    }
}

impl PciBus {
    /// A bus with the host bridge at 00.0; 32-bit BARs are placed in
    /// `mmio32` (start, len), 64-bit BARs in `mmio64`.
    pub fn new(mmio32: (u64, u64), mmio64: (u64, u64)) -> Self {
        let bridge = HostBridge {
            config: PciConfiguration::new(PciHeader {
                vendor_id: 0x8086,
                device_id: 0x0d57,
                class: 0x06,
                subclass: 0x00,
                ..PciHeader::default()
            }),
        };
        let mut functions = BTreeMap::new();
        functions.insert(
            0,
            Function {
                dev: Arc::new(Mutex::new(bridge)),
                bars: Vec::new(),
            },
        );
        PciBus {
            config_address: 0,
            functions,
            mmio32: Window::new(mmio32),
            mmio64: Window::new(mmio64),
        }
    }

    /// Adds a function at `slot`.`function`, assigns its BARs and returns
    /// their bases. Nothing changes on error.
    ///
    /// Function 0 of a slot with several functions must set
    /// `PciHeader::multifunction`, or Linux never scans the others; this is
    /// checked whichever function is added first.
    pub fn add_device(
        &mut self,
        slot: u8,
        function: u8,
        dev: Arc<Mutex<dyn PciDevice>>,
    ) -> Result<Vec<(usize, u64)>, PciBusError> {
        if slot >= MAX_SLOTS {
            return Err(PciBusError::InvalidSlot(slot));
        }
        if function >= MAX_FUNCTIONS {
            return Err(PciBusError::InvalidFunction(function));
        }
        let devfn = slot << 3 | function;
        if self.functions.contains_key(&devfn) {
            return Err(PciBusError::FunctionTaken { slot, function });
        }

        // Read the slot's function 0 before locking `dev`, so a device
        // added twice cannot deadlock here.
        let existing_fn0 = self
            .functions
            .get(&(slot << 3))
            .map(|f| is_multifunction(lock(&f.dev).config()));
        let mut guard = lock(&dev);
        let fn0_multifunction = if function == 0 {
            Some(is_multifunction(guard.config()))
        } else {
            existing_fn0
        };
        let slot_shared = function != 0 || self.functions.range(devfn..=devfn | 7).next().is_some();
        if slot_shared && fn0_multifunction == Some(false) {
            return Err(PciBusError::NotMultifunction(slot));
        }

        // Largest first keeps the bump allocator's alignment gaps small.
        let mut specs: Vec<_> = guard.config().bars().collect();
        specs.sort_by_key(|&(_, size, _)| std::cmp::Reverse(size));
        let (mut mmio32, mut mmio64) = (self.mmio32, self.mmio64);
        let mut bars = Vec::with_capacity(specs.len());
        for (bar, size, kind) in specs {
            let window = match kind {
                BarKind::Mmio32 => &mut mmio32,
                BarKind::Mmio64 => &mut mmio64,
            };
            let base = window
                .allocate(size)
                .ok_or(PciBusError::WindowExhausted { bar, size })?;
            bars.push(BarRange { bar, base, size });
        }
        bars.sort_by_key(|range| range.bar);
        for range in &bars {
            guard.config_mut().set_bar_address(range.bar, range.base);
        }
        drop(guard);

        self.mmio32 = mmio32;
        self.mmio64 = mmio64;
        let placed = bars.iter().map(|range| (range.bar, range.base)).collect();
        self.functions.insert(devfn, Function { dev, bars });
        Ok(placed)
    }

    /// Stops every function's own threads (see [`Pausable`]); on error the
    /// ones already paused are resumed, leaving the bus as it was.
    pub fn pause(&self) -> Result<(), MigratableError> {
        let mut done = Vec::new();
        for func in self.functions.values() {
            if let Err(e) = lock(&func.dev).pause() {
                for func in done {
                    let _ = lock(func).resume();
                }
                return Err(e);
            }
            done.push(&func.dev);
        }
        Ok(())
    }

    pub fn resume(&self) -> Result<(), MigratableError> {
        self.resume_parked()?;
        self.released();
        Ok(())
    }

    /// Resumes every function while the vCPUs are parked; [`Self::released`]
    /// follows once they run (see [`Pausable::resume_parked`]).
    pub fn resume_parked(&self) -> Result<(), MigratableError> {
        // Each function's share, which a migrated guest waits for after the hand-over.
        let mut took = Vec::with_capacity(self.functions.len());
        for (&devfn, func) in &self.functions {
            let start = std::time::Instant::now();
            lock(&func.dev).resume_parked()?;
            took.push(took_ms(devfn, start));
        }
        log::info!("PCI functions resumed: {}", took.join(", "));
        Ok(())
    }

    /// Tells every function that the vCPUs run again.
    pub fn released(&self) {
        for func in self.functions.values() {
            lock(&func.dev).released();
        }
    }

    /// Every function's configuration space and device state (the bus
    /// must be paused).
    pub fn snapshot(&self) -> Result<Snapshot, MigratableError> {
        // Each function's share of the save, which sits inside a migration's blackout.
        let mut took = Vec::with_capacity(self.functions.len());
        let functions = self
            .functions
            .iter()
            .map(|(&devfn, func)| {
                let start = std::time::Instant::now();
                let mut dev = lock(&func.dev);
                let saved = SavedFunction {
                    devfn,
                    config: dev.config().state(),
                    device: dev.snapshot()?,
                };
                took.push(took_ms(devfn, start));
                Ok(saved)
            })
            .collect::<Result<Vec<_>, MigratableError>>()?;
        log::info!("PCI functions saved: {}", took.join(", "));
        let saved = SavedBus {
            config_address: self.config_address,
            functions,
        };
        Snapshot::new(BUS_ID, BUS_VERSION, &saved)
    }

    /// Every function's [`Snapshottable::restore_hint`], taken while the
    /// VM runs, for a destination to prepare with before the state comes.
    pub fn restore_hints(&self) -> Result<Snapshot, MigratableError> {
        let hints: Vec<(u8, Snapshot)> = self
            .functions
            .iter()
            .filter_map(|(&devfn, func)| Some((devfn, lock(&func.dev).restore_hint()?)))
            .collect();
        Snapshot::new(HINTS_ID, HINTS_VERSION, &hints)
    }

    /// Every function's [`Snapshottable::forget_hint`].
    pub fn forget_hints(&self) {
        for func in self.functions.values() {
            lock(&func.dev).forget_hint();
        }
    }

    /// Gives each function a source's [`Self::restore_hints`] (hostile
    /// input: a function this bus lacks, or repeated, is refused).
    pub fn prepare_restore(&self, hints: &Snapshot) -> Result<(), MigratableError> {
        let hints: Vec<(u8, Snapshot)> = hints.state(HINTS_ID, HINTS_VERSION)?;
        let mut last = None;
        for (devfn, hint) in &hints {
            let func = self
                .functions
                .get(devfn)
                .filter(|_| last < Some(*devfn))
                .ok_or_else(|| {
                    MigratableError::Restore(
                        HINTS_ID.into(),
                        format!("a hint for function {devfn:#x}, absent or repeated").into(),
                    )
                })?;
            last = Some(*devfn);
            lock(&func.dev).prepare_restore(hint)?;
        }
        Ok(())
    }

    /// Puts a [`Self::snapshot`] back onto a bus built with the same
    /// functions: configuration space first (BARs decode where the guest
    /// left them), then each device, which re-derives its doorbells and
    /// interrupt routes from both.
    pub fn restore(&mut self, snapshot: &Snapshot) -> Result<(), MigratableError> {
        let saved: SavedBus = snapshot.state(BUS_ID, BUS_VERSION)?;
        let ours: Vec<u8> = self.functions.keys().copied().collect();
        let theirs: Vec<u8> = saved.functions.iter().map(|f| f.devfn).collect();
        if ours != theirs {
            return Err(MigratableError::Restore(
                BUS_ID.into(),
                format!("functions differ: here {ours:?}, saved {theirs:?}").into(),
            ));
        }
        // Each function's share of the restore, which sits inside a migration's blackout.
        let mut took = Vec::with_capacity(saved.functions.len());
        for f in &saved.functions {
            let Some(func) = self.functions.get_mut(&f.devfn) else {
                continue;
            };
            let start = std::time::Instant::now();
            let mut dev = lock(&func.dev);
            dev.config_mut()
                .set_state(&f.config)
                .map_err(|e| MigratableError::Restore(BUS_ID.into(), Box::new(e)))?;
            for range in &mut func.bars {
                if let Some(base) = dev.config().bar_address(range.bar) {
                    range.base = base;
                }
            }
            dev.restore(&f.device)?;
            took.push(took_ms(f.devfn, start));
        }
        log::info!("PCI functions restored: {}", took.join(", "));
        self.config_address = saved.config_address;
        Ok(())
    }

    /// The first free slot number (for devices that take a whole slot).
    pub fn next_free_slot(&self) -> Option<u8> {
        (0..MAX_SLOTS).find(|&slot| {
            let first = slot << 3;
            self.functions.range(first..=first | 7).next().is_none()
        })
    }

    /// Port I/O at 0xCF8..=0xCFF (`port` is the absolute port). Anything
    /// that does not select a present function reads all-ones.
    pub fn pio_read(&self, port: u16, data: &mut [u8]) {
        data.fill(0xff);
        let Some((offset, len)) = port_access(port, data.len()) else {
            return;
        };
        let value = if port < CONFIG_DATA {
            self.config_address
        } else {
            match self.selected() {
                Some((func, reg)) => lock(&func.dev).config().read_reg(reg),
                None => return,
            }
        };
        let bytes = value.to_le_bytes();
        if let Some(src) = bytes.get(offset..offset.wrapping_add(len)) {
            data.copy_from_slice(src);
        }
    }

    pub fn pio_write(&mut self, port: u16, data: &[u8]) {
        let Some((offset, _)) = port_access(port, data.len()) else {
            return;
        };
        if port < CONFIG_DATA {
            // Only a dword write is the address register; Linux's probe
            // also pokes a byte at 0xCFB, which type-1 hosts ignore.
            if let Ok(dword) = <[u8; 4]>::try_from(data) {
                self.config_address = u32::from_le_bytes(dword);
            }
            return;
        }
        let Some(devfn) = self.selected_devfn() else {
            return;
        };
        let reg = self.selected_reg();
        let Some(func) = self.functions.get_mut(&devfn) else {
            return;
        };
        let mut dev = lock(&func.dev);
        if let Some((bar, old, new)) = dev.config_mut().write_reg(reg, offset as u64, data) {
            if let Some(range) = func.bars.iter_mut().find(|range| range.bar == bar) {
                range.base = new;
            }
            dev.bar_moved(bar, old, new);
        }
        dev.config_written(reg);
    }

    /// MMIO inside some BAR. Returns false when no enabled BAR covers `addr`.
    pub fn mmio_read(&self, addr: u64, data: &mut [u8]) -> bool {
        self.dispatch(addr, data.len(), |dev, bar, offset| {
            dev.read_bar(bar, offset, data)
        })
    }

    pub fn mmio_write(&self, addr: u64, data: &[u8]) -> bool {
        self.dispatch(addr, data.len(), |dev, bar, offset| {
            dev.write_bar(bar, offset, data)
        })
    }

    /// Runs `access` on the first function with memory decoding on whose
    /// BAR holds all of `addr..addr + len`.
    fn dispatch(
        &self,
        addr: u64,
        len: usize,
        access: impl FnOnce(&mut dyn PciDevice, usize, u64),
    ) -> bool {
        let Ok(len) = u64::try_from(len) else {
            return false;
        };
        for func in self.functions.values() {
            for range in &func.bars {
                let Some(offset) = addr.checked_sub(range.base) else {
                    continue;
                };
                if offset.checked_add(len).is_none_or(|end| end > range.size) {
                    continue;
                }
                let mut dev = lock(&func.dev);
                if dev.config().memory_enabled() {
                    access(&mut *dev, range.bar, offset);
                    return true;
                }
            }
        }
        false
    }

    fn selected_devfn(&self) -> Option<u8> {
        let address = self.config_address;
        let [_, devfn, bus, _] = address.to_le_bytes();
        (address & ENABLE_BIT != 0 && bus == 0).then_some(devfn)
    }

    fn selected_reg(&self) -> usize {
        // Bits 7:2; 0..64 always.
        usize::from(self.config_address.to_le_bytes()[0] >> 2)
    }

    fn selected(&self) -> Option<(&Function, usize)> {
        let func = self.functions.get(&self.selected_devfn()?)?;
        Some((func, self.selected_reg()))
    }
}

/// For a port in 0xCF8..=0xCFF: the byte offset within its dword and the
/// access length, when the access is 1, 2 or 4 bytes inside that dword.
/// "slot.function N ms": a function's share of a save or restore, for the log.
fn took_ms(devfn: u8, start: std::time::Instant) -> String {
    format!(
        "{:02x}.{} {} ms",
        devfn >> 3,
        devfn & 7,
        start.elapsed().as_millis()
    )
}

fn port_access(port: u16, len: usize) -> Option<(usize, usize)> {
    let offset = match port {
        CONFIG_ADDRESS..=0xcfb => port.checked_sub(CONFIG_ADDRESS)?,
        CONFIG_DATA..=0xcff => port.checked_sub(CONFIG_DATA)?,
        _ => return None,
    };
    let offset = usize::from(offset);
    (matches!(len, 1 | 2 | 4) && offset.checked_add(len)? <= 4).then_some((offset, len))
}

fn is_multifunction(config: &PciConfiguration) -> bool {
    config.read_reg(HEADER_TYPE_REG) & HEADER_MULTIFUNCTION != 0
}

/// Locks a device; with `panic = "abort"` nothing can poison the lock, and
/// a poisoned one would still hold consistent config state.
fn lock<'a>(dev: &'a Mutex<dyn PciDevice + 'static>) -> MutexGuard<'a, dyn PciDevice + 'static> {
    dev.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use super::*;
    use crate::BarSpec;

    const MMIO32: (u64, u64) = (0xc000_0000, 0x1000_0000);
    const MMIO64: (u64, u64) = (0x1_0000_0000, 0x1_0000_0000);

    /// Records what the bus does to it; BAR reads return `0xb0 | bar`.
    struct TestDevice {
        config: PciConfiguration,
        moves: Vec<(usize, u64, u64)>,
        written: Vec<usize>,
        accesses: Vec<(usize, u64, Vec<u8>)>,
        /// The restore hints it was given.
        prepared: Vec<usize>,
    }

    impl Pausable for TestDevice {}

    impl Snapshottable for TestDevice {
        fn id(&self) -> String {
            "test".into()
        }
        fn snapshot(&mut self) -> Result<Snapshot, MigratableError> {
            Snapshot::new("test", 1, &self.moves)
        }
        fn restore(&mut self, s: &Snapshot) -> Result<(), MigratableError> {
            self.moves = s.state("test", 1)?;
            Ok(())
        }
        /// Its BAR moves so far; none for a device that never moved.
        fn restore_hint(&mut self) -> Option<Snapshot> {
            (!self.moves.is_empty()).then(|| Snapshot::new("test", 1, &self.moves.len()).unwrap())
        }
        fn prepare_restore(&mut self, hint: &Snapshot) -> Result<(), MigratableError> {
            self.prepared.push(hint.state("test", 1)?);
            Ok(())
        }
    }

    impl PciDevice for TestDevice {
        fn config(&self) -> &PciConfiguration {
            &self.config
        }
        fn config_mut(&mut self) -> &mut PciConfiguration {
            &mut self.config
        }
        fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
            data.fill(0xb0 | bar as u8);
            self.accesses.push((bar, offset, Vec::new()));
        }
        fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]) {
            self.accesses.push((bar, offset, data.to_vec()));
        }
        fn config_written(&mut self, reg: usize) {
            self.written.push(reg);
        }
        fn bar_moved(&mut self, bar: usize, old: u64, new: u64) {
            self.moves.push((bar, old, new));
        }
    }

    fn device(multifunction: bool, bars: &[(usize, u64, BarKind)]) -> Arc<Mutex<TestDevice>> {
        let mut config = PciConfiguration::new(PciHeader {
            vendor_id: 0x15ad,
            device_id: 0x07b0,
            class: 0x02,
            multifunction,
            ..PciHeader::default()
        });
        for &(index, size, kind) in bars {
            config
                .add_bar(BarSpec {
                    index,
                    size,
                    kind,
                    prefetchable: false,
                })
                .unwrap();
        }
        Arc::new(Mutex::new(TestDevice {
            config,
            moves: Vec::new(),
            written: Vec::new(),
            accesses: Vec::new(),
            prepared: Vec::new(),
        }))
    }

    fn select(bus: &mut PciBus, bus_nr: u8, slot: u8, function: u8, reg: u8) {
        let address = ENABLE_BIT
            | u32::from(bus_nr) << 16
            | u32::from(slot) << 11
            | u32::from(function) << 8
            | u32::from(reg) << 2;
        bus.pio_write(CONFIG_ADDRESS, &address.to_le_bytes());
    }

    fn cfg_read(bus: &mut PciBus, slot: u8, function: u8, reg: u8) -> u32 {
        select(bus, 0, slot, function, reg);
        let mut data = [0u8; 4];
        bus.pio_read(CONFIG_DATA, &mut data);
        u32::from_le_bytes(data)
    }

    fn cfg_write(bus: &mut PciBus, slot: u8, function: u8, reg: u8, value: u32) {
        select(bus, 0, slot, function, reg);
        bus.pio_write(CONFIG_DATA, &value.to_le_bytes());
    }

    fn mmio_read32(bus: &PciBus, addr: u64) -> Option<u32> {
        let mut data = [0u8; 4];
        bus.mmio_read(addr, &mut data)
            .then(|| u32::from_le_bytes(data))
    }

    #[test]
    fn shareable_across_threads() {
        fn check<T: Send + Sync>() {}
        check::<PciBus>();
    }

    #[test]
    fn config_address_reads_back() {
        let mut bus = PciBus::new(MMIO32, MMIO64);
        // pci_check_type1: byte to 0xCFB, dword read, dword write/read.
        bus.pio_write(0xcfb, &[0x01]);
        let mut data = [0u8; 4];
        bus.pio_read(CONFIG_ADDRESS, &mut data);
        assert_eq!(u32::from_le_bytes(data), 0);
        bus.pio_write(CONFIG_ADDRESS, &0x8000_0000u32.to_le_bytes());
        bus.pio_read(CONFIG_ADDRESS, &mut data);
        assert_eq!(u32::from_le_bytes(data), 0x8000_0000);
        // Reserved bits are kept verbatim too.
        bus.pio_write(CONFIG_ADDRESS, &0x8f00_0a03u32.to_le_bytes());
        bus.pio_read(CONFIG_ADDRESS, &mut data);
        assert_eq!(u32::from_le_bytes(data), 0x8f00_0a03);
        let mut word = [0u8; 2];
        bus.pio_read(0xcfa, &mut word);
        assert_eq!(u16::from_le_bytes(word), 0x8f00);
        // Word writes do not reach the address register.
        bus.pio_write(CONFIG_ADDRESS, &[0, 0]);
        bus.pio_read(CONFIG_ADDRESS, &mut data);
        assert_eq!(u32::from_le_bytes(data), 0x8f00_0a03);
    }

    #[test]
    fn host_bridge_byte_word_dword() {
        let mut bus = PciBus::new(MMIO32, MMIO64);
        assert_eq!(cfg_read(&mut bus, 0, 0, 0), 0x0d57_8086);
        let mut word = [0u8; 2];
        bus.pio_read(CONFIG_DATA, &mut word);
        assert_eq!(u16::from_le_bytes(word), 0x8086);
        bus.pio_read(CONFIG_DATA + 2, &mut word);
        assert_eq!(u16::from_le_bytes(word), 0x0d57);
        // pci_sanity_check: class word at offset 0x0a.
        select(&mut bus, 0, 0, 0, 2);
        bus.pio_read(CONFIG_DATA + 2, &mut word);
        assert_eq!(u16::from_le_bytes(word), 0x0600);
        let mut byte = [0u8; 1];
        bus.pio_read(CONFIG_DATA + 3, &mut byte);
        assert_eq!(byte[0], 0x06);
        assert_eq!(cfg_read(&mut bus, 0, 0, 3), 0);
    }

    #[test]
    fn absent_functions_read_all_ones() {
        let mut bus = PciBus::new(MMIO32, MMIO64);
        assert_eq!(cfg_read(&mut bus, 5, 0, 0), u32::MAX);
        assert_eq!(cfg_read(&mut bus, 0, 1, 0), u32::MAX);
        // Other buses do not exist.
        select(&mut bus, 1, 0, 0, 0);
        let mut data = [0u8; 4];
        bus.pio_read(CONFIG_DATA, &mut data);
        assert_eq!(data, [0xff; 4]);
        // Enable bit clear.
        bus.pio_write(CONFIG_ADDRESS, &0u32.to_le_bytes());
        bus.pio_read(CONFIG_DATA, &mut data);
        assert_eq!(data, [0xff; 4]);
        bus.pio_write(CONFIG_DATA, &[0; 4]);
        // Writes to absent functions are dropped without panicking.
        cfg_write(&mut bus, 31, 7, 63, 0);
    }

    #[test]
    fn odd_port_accesses_ignored() {
        let mut bus = PciBus::new(MMIO32, MMIO64);
        select(&mut bus, 0, 0, 0, 0);
        for (port, len) in [
            (0xcfd, 4),
            (0xcff, 2),
            (0xcfc, 3),
            (0xcfc, 8),
            (0xcfc, 0),
            (0xcf0, 4),
            (0xd00, 1),
        ] {
            let mut data = vec![0u8; len];
            bus.pio_read(port, &mut data);
            assert!(data.iter().all(|&b| b == 0xff), "{port:#x}/{len}");
            bus.pio_write(port, &data);
        }
        let mut data = [0u8; 4];
        bus.pio_read(CONFIG_ADDRESS, &mut data);
        assert_eq!(u32::from_le_bytes(data), ENABLE_BIT);
        assert_eq!(cfg_read(&mut bus, 0, 0, 0), 0x0d57_8086);
    }

    #[test]
    fn add_device_places_bars_naturally_aligned() {
        let mut bus = PciBus::new(MMIO32, MMIO64);
        let dev = device(
            false,
            &[
                (0, 0x1000, BarKind::Mmio32),
                (2, 0x10_0000, BarKind::Mmio64),
                (4, 0x1_0000, BarKind::Mmio32),
            ],
        );
        let placed = bus.add_device(3, 0, dev.clone()).unwrap();
        assert_eq!(
            placed,
            vec![(0, 0xc001_0000), (2, 0x1_0000_0000), (4, 0xc000_0000)]
        );
        let other = device(
            false,
            &[(0, 0x100, BarKind::Mmio32), (1, 0x2000, BarKind::Mmio64)],
        );
        let placed = bus.add_device(4, 0, other).unwrap();
        assert_eq!(placed, vec![(0, 0xc001_1000), (1, 0x1_0010_0000)]);

        assert_eq!(cfg_read(&mut bus, 3, 0, 4), 0xc001_0000);
        assert_eq!(cfg_read(&mut bus, 3, 0, 6), 0x0000_0004);
        assert_eq!(cfg_read(&mut bus, 3, 0, 7), 1);
        assert_eq!(
            dev.lock().unwrap().config.bar_address(2),
            Some(0x1_0000_0000)
        );
        assert_eq!(bus.next_free_slot(), Some(1));
    }

    #[test]
    fn add_device_validation() {
        let mut bus = PciBus::new(MMIO32, MMIO64);
        assert!(matches!(
            bus.add_device(32, 0, device(false, &[])),
            Err(PciBusError::InvalidSlot(32))
        ));
        assert!(matches!(
            bus.add_device(1, 8, device(false, &[])),
            Err(PciBusError::InvalidFunction(8))
        ));
        assert!(matches!(
            bus.add_device(0, 0, device(false, &[])),
            Err(PciBusError::FunctionTaken {
                slot: 0,
                function: 0
            })
        ));
        // The host bridge is single-function.
        assert!(matches!(
            bus.add_device(0, 1, device(false, &[])),
            Err(PciBusError::NotMultifunction(0))
        ));
        bus.add_device(2, 1, device(false, &[])).unwrap();
        assert!(matches!(
            bus.add_device(2, 0, device(false, &[])),
            Err(PciBusError::NotMultifunction(2))
        ));
        bus.add_device(2, 0, device(true, &[])).unwrap();
        assert!(matches!(
            bus.add_device(2, 1, device(false, &[])),
            Err(PciBusError::FunctionTaken {
                slot: 2,
                function: 1
            })
        ));
    }

    #[test]
    fn multifunction_slot() {
        let mut bus = PciBus::new(MMIO32, MMIO64);
        bus.add_device(1, 0, device(true, &[])).unwrap();
        bus.add_device(1, 1, device(false, &[])).unwrap();
        // Header type byte (offset 0x0e) of function 0.
        select(&mut bus, 0, 1, 0, 3);
        let mut byte = [0u8; 1];
        bus.pio_read(CONFIG_DATA + 2, &mut byte);
        assert_eq!(byte[0], 0x80);
        assert_eq!(cfg_read(&mut bus, 1, 1, 0), 0x07b0_15ad);
        assert_eq!(cfg_read(&mut bus, 1, 1, 3), 0);
        assert_eq!(bus.next_free_slot(), Some(2));
    }

    #[test]
    fn window_exhaustion_is_an_error() {
        let mut bus = PciBus::new((0xc000_0000, 0x3000), (0x1_0000_0000, 0x1000));
        let dev = device(
            false,
            &[(0, 0x1000, BarKind::Mmio32), (1, 0x4000, BarKind::Mmio32)],
        );
        assert!(matches!(
            bus.add_device(1, 0, dev.clone()),
            Err(PciBusError::WindowExhausted {
                bar: 1,
                size: 0x4000
            })
        ));
        assert!(matches!(
            bus.add_device(1, 0, device(false, &[(0, 0x2000, BarKind::Mmio64)])),
            Err(PciBusError::WindowExhausted {
                bar: 0,
                size: 0x2000
            })
        ));
        // Nothing was consumed or added by the failures.
        assert_eq!(cfg_read(&mut bus, 1, 0, 0), u32::MAX);
        assert_eq!(dev.lock().unwrap().config.bar_address(0), None);
        let ok = device(
            false,
            &[(0, 0x2000, BarKind::Mmio32), (2, 0x1000, BarKind::Mmio64)],
        );
        assert_eq!(
            bus.add_device(1, 0, ok).unwrap(),
            vec![(0, 0xc000_0000), (2, 0x1_0000_0000)]
        );
        // Only 0x1000 bytes are left.
        assert!(bus
            .add_device(2, 0, device(false, &[(0, 0x2000, BarKind::Mmio32)]))
            .is_err());
        // A window ending at the top of the address space.
        let mut bus = PciBus::new(MMIO32, (u64::MAX - 0xfff, u64::MAX));
        assert!(matches!(
            bus.add_device(1, 0, device(false, &[(0, 0x2000, BarKind::Mmio64)])),
            Err(PciBusError::WindowExhausted { .. })
        ));
    }

    #[test]
    fn memory_decode_gates_mmio() {
        let mut bus = PciBus::new(MMIO32, MMIO64);
        let dev = device(false, &[(1, 0x1000, BarKind::Mmio32)]);
        bus.add_device(1, 0, dev.clone()).unwrap();
        assert_eq!(mmio_read32(&bus, 0xc000_0000), None);
        assert!(!bus.mmio_write(0xc000_0000, &[1, 2, 3, 4]));

        // Word write to the command register (memory space enable).
        select(&mut bus, 0, 1, 0, 1);
        bus.pio_write(CONFIG_DATA, &[0x02, 0x00]);
        assert_eq!(mmio_read32(&bus, 0xc000_0ffc), Some(0xb1b1_b1b1));
        assert!(bus.mmio_write(0xc000_0010, &[1, 2]));
        // Straddling the end or outside every BAR.
        assert_eq!(mmio_read32(&bus, 0xc000_0ffe), None);
        assert_eq!(mmio_read32(&bus, 0xc000_1000), None);
        assert_eq!(mmio_read32(&bus, 0xbfff_fffe), None);
        assert_eq!(mmio_read32(&bus, u64::MAX - 1), None);
        assert_eq!(
            dev.lock().unwrap().accesses,
            vec![(1, 0xffc, Vec::new()), (1, 0x10, vec![1, 2])]
        );

        cfg_write(&mut bus, 1, 0, 1, 0);
        assert_eq!(mmio_read32(&bus, 0xc000_0000), None);
    }

    #[test]
    fn bar_relocation_follows_config_writes() {
        let mut bus = PciBus::new(MMIO32, MMIO64);
        let dev = device(
            false,
            &[(0, 0x1000, BarKind::Mmio32), (2, 0x4000, BarKind::Mmio64)],
        );
        bus.add_device(1, 0, dev.clone()).unwrap();
        cfg_write(&mut bus, 1, 0, 1, 0x2);

        // Sizing is not a move.
        cfg_write(&mut bus, 1, 0, 4, u32::MAX);
        assert_eq!(cfg_read(&mut bus, 1, 0, 4), 0xffff_f000);
        cfg_write(&mut bus, 1, 0, 4, 0xc000_0000);
        assert!(dev.lock().unwrap().moves.is_empty());

        cfg_write(&mut bus, 1, 0, 4, 0xd000_0000);
        assert_eq!(
            dev.lock().unwrap().moves,
            vec![(0, 0xc000_0000, 0xd000_0000)]
        );
        assert_eq!(mmio_read32(&bus, 0xc000_0000), None);
        assert_eq!(mmio_read32(&bus, 0xd000_0004), Some(0xb0b0_b0b0));

        // 64-bit, the way Linux moves it: decoding off, low, high, on.
        cfg_write(&mut bus, 1, 0, 1, 0);
        cfg_write(&mut bus, 1, 0, 6, 0x8000_0004);
        cfg_write(&mut bus, 1, 0, 7, 0x2);
        cfg_write(&mut bus, 1, 0, 1, 0x2);
        assert_eq!(
            dev.lock().unwrap().moves[1..],
            [(2, 0x1_0000_0000, 0x2_8000_0000)]
        );
        assert_eq!(mmio_read32(&bus, 0x1_0000_0000), None);
        assert_eq!(mmio_read32(&bus, 0x2_8000_3ffc), Some(0xb2b2_b2b2));
        assert_eq!(
            dev.lock().unwrap().config.bar_address(2),
            Some(0x2_8000_0000)
        );
    }

    #[test]
    fn snapshot_carries_config_space_and_bar_placement() {
        let bars = [(0, 0x1000, BarKind::Mmio32), (2, 0x4000, BarKind::Mmio64)];
        let mut bus = PciBus::new(MMIO32, MMIO64);
        let dev = device(false, &bars);
        bus.add_device(1, 0, dev.clone()).unwrap();
        cfg_write(&mut bus, 1, 0, 1, 0x2);
        cfg_write(&mut bus, 1, 0, 4, 0xd000_0000);
        cfg_write(&mut bus, 1, 0, 15, 0x0b);
        let saved = bus.snapshot().unwrap();

        let mut fresh = PciBus::new(MMIO32, MMIO64);
        let copy = device(false, &bars);
        fresh.add_device(1, 0, copy.clone()).unwrap();
        assert_eq!(mmio_read32(&fresh, 0xd000_0004), None);
        fresh.restore(&saved).unwrap();
        assert_eq!(mmio_read32(&fresh, 0xd000_0004), Some(0xb0b0_b0b0));
        assert_eq!(cfg_read(&mut fresh, 1, 0, 15) & 0xff, 0x0b);
        // The device's own state travelled beside its configuration space.
        assert_eq!(copy.lock().unwrap().moves, dev.lock().unwrap().moves);

        // Another set of functions is refused, leaving the bus as it was.
        let mut other = PciBus::new(MMIO32, MMIO64);
        other.add_device(2, 0, device(false, &bars)).unwrap();
        assert!(other.restore(&saved).is_err());
        assert_eq!(mmio_read32(&other, 0xd000_0004), None);
    }

    /// Each function's restore hint reaches the same function of another
    /// bus; a function without one gets none; hints for a function the
    /// bus lacks, or twice for one, are refused.
    #[test]
    fn restore_hints_reach_their_functions() {
        let bars = [(0, 0x1000, BarKind::Mmio32)];
        let mut bus = PciBus::new(MMIO32, MMIO64);
        let (moved, still) = (device(false, &bars), device(false, &bars));
        bus.add_device(1, 0, moved.clone()).unwrap();
        bus.add_device(2, 0, still.clone()).unwrap();
        cfg_write(&mut bus, 1, 0, 1, 0x2);
        cfg_write(&mut bus, 1, 0, 4, 0xd000_0000);
        let hints = bus.restore_hints().unwrap();

        let mut fresh = PciBus::new(MMIO32, MMIO64);
        let (a, b) = (device(false, &bars), device(false, &bars));
        fresh.add_device(1, 0, a.clone()).unwrap();
        fresh.add_device(2, 0, b.clone()).unwrap();
        fresh.prepare_restore(&hints).unwrap();
        assert_eq!(
            a.lock().unwrap().prepared,
            [moved.lock().unwrap().moves.len()]
        );
        assert!(b.lock().unwrap().prepared.is_empty());

        let mut other = PciBus::new(MMIO32, MMIO64);
        other.add_device(2, 0, device(false, &bars)).unwrap();
        let e = other.prepare_restore(&hints).unwrap_err().to_string();
        assert!(e.contains("pci-hints"), "{e}");
        let hint = Snapshot::new("test", 1, &1usize).unwrap();
        let twice =
            Snapshot::new(HINTS_ID, HINTS_VERSION, &vec![(8u8, &hint), (8, &hint)]).unwrap();
        assert!(fresh.prepare_restore(&twice).is_err());
        assert_eq!(a.lock().unwrap().prepared.len(), 2, "the first of the two");
    }

    #[test]
    fn restored_config_keeps_read_only_bits() {
        let mut config = PciConfiguration::new(PciHeader {
            vendor_id: 0x15ad,
            ..PciHeader::default()
        });
        config
            .add_bar(BarSpec {
                index: 0,
                size: 0x1000,
                kind: BarKind::Mmio32,
                prefetchable: false,
            })
            .unwrap();
        let mut state = config.state();
        state.regs[0] = 0xdead_beef;
        state.regs[1] = 0xffff_ffff;
        config.set_state(&state).unwrap();
        assert_eq!(config.read_reg(0) & 0xffff, 0x15ad);
        assert_eq!(config.read_reg(1) & 0xffff, 0x0547);
        state.bar_addrs[0] = Some(0x800);
        assert!(config.set_state(&state).is_err());
        state.bar_addrs[0] = None;
        state.bar_addrs[1] = Some(0x1000);
        assert!(config.set_state(&state).is_err());
        state.regs.pop();
        assert!(config.set_state(&state).is_err());
    }

    #[test]
    fn config_written_after_every_write() {
        let mut bus = PciBus::new(MMIO32, MMIO64);
        let dev = device(false, &[(0, 0x1000, BarKind::Mmio32)]);
        bus.add_device(1, 0, dev.clone()).unwrap();
        cfg_write(&mut bus, 1, 0, 0, u32::MAX);
        cfg_write(&mut bus, 1, 0, 4, 0xd000_0000);
        select(&mut bus, 0, 1, 0, 15);
        bus.pio_write(CONFIG_DATA, &[0x0a]);
        assert_eq!(dev.lock().unwrap().written, vec![0, 4, 15]);
        assert_eq!(cfg_read(&mut bus, 1, 0, 15) & 0xff, 0x0a);
        assert_eq!(cfg_read(&mut bus, 1, 0, 0), 0x07b0_15ad);
    }
}
