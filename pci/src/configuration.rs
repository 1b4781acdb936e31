// SPDX-License-Identifier: Apache-2.0
//! Type-0 configuration space of one function.
//!
//! The 256 bytes are kept as 64 dwords plus a mask of guest-writable bits,
//! so every guest write is one masked merge and read-only fields (IDs,
//! class, BAR type bits, capability IDs) need no special cases. BAR sizing
//! falls out of the same mask: the writable bits of a BAR are its address
//! bits, so writing all-ones reads back the size mask.
//!
//! # When a BAR move is reported
//!
//! [`PciConfiguration::write_reg`] reports a BAR move at most once per
//! guest-visible relocation, with the full 64-bit address:
//!
//! - A BAR dword whose last write was all-ones (every written byte 0xff,
//!   every address bit now set) is being sized: the BAR has no programmed
//!   address then and nothing is reported. Linux writes all-ones and
//!   restores the old value, dword by dword; a real address write carries
//!   the type bits, never all-ones.
//! - A 32-bit BAR is reported as soon as a write gives it a new address.
//! - A 64-bit BAR is reported when its high dword is written, since
//!   Linux, SeaBIOS and OVMF write the low dword first and the high dword
//!   right after (with memory decoding off, as the two halves cannot change
//!   atomically). A low-dword write is reported at once only while memory
//!   decoding is on, because the device decodes the new address right away.
//!   A guest that rewrites only the low dword with decoding off is not
//!   reported until it next writes the high dword.
//!
//! The reported address is the one the bus decodes and that
//! [`PciConfiguration::bar_address`] returns; register reads show the raw
//! register contents, including a half-written or sizing state.

#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use serde::{Deserialize, Serialize};

use crate::PciBusError;

/// Dwords in the 256-byte type-0 configuration space.
const NUM_REGS: usize = 64;
/// BAR registers in a type-0 header.
const NUM_BARS: usize = 6;
const COMMAND_REG: usize = 1;
const HEADER_TYPE_REG: usize = 3;
const BAR0_REG: usize = 4;
const SUBSYSTEM_REG: usize = 11;
const INTERRUPT_REG: usize = 15;
/// Byte offset of the capabilities pointer.
const CAP_POINTER: usize = 0x34;
/// Capabilities go after the standard header.
const FIRST_CAP: usize = 0x40;
const CONFIG_SIZE: usize = NUM_REGS * 4;

/// Guest-writable command bits: I/O space, memory space, bus master, parity
/// error response, SERR# enable, INTx disable (QEMU's set).
const COMMAND_WRITABLE: u32 = 0x0547;
const COMMAND_MEMORY: u32 = 1 << 1;
/// Status bit 4 (capabilities list), in the upper half of dword 1.
const STATUS_CAP_LIST: u32 = 1 << 20;
/// Header-type bit 7, in byte 2 of dword 3.
const HEADER_MULTIFUNCTION: u32 = 1 << 23;
/// Cache line size (byte 0 of dword 3) is writable; Linux programs it.
const CACHE_LINE_WRITABLE: u32 = 0xff;
/// Interrupt line (byte 0 of dword 15) is scratch space for the OS.
const INTERRUPT_LINE_WRITABLE: u32 = 0xff;

const BAR_MEM_64: u32 = 1 << 2;
const BAR_PREFETCHABLE: u32 = 1 << 3;
/// Low BAR bits that hold the type, not address.
const BAR_TYPE_BITS: u32 = 0xf;
/// Smallest memory BAR the spec allows.
const MIN_BAR_SIZE: u64 = 16;
/// Largest 32-bit BAR: bit 31 is the only address bit left.
const MAX_BAR32_SIZE: u64 = 1 << 31;

/// Identity of a function, written into its header at creation.
#[derive(Clone, Copy, Debug, Default)]
pub struct PciHeader {
    pub vendor_id: u16,
    pub device_id: u16,
    pub revision: u8,
    pub class: u8,
    pub subclass: u8,
    pub prog_if: u8,
    pub subsystem_vendor_id: u16,
    pub subsystem_id: u16,
    /// Sets bit 7 of the header type (function 0 of a multi-function slot).
    pub multifunction: bool,
    /// Interrupt pin (0 = none, 1 = INTA#...).
    pub interrupt_pin: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    Mmio32,
    /// Uses BAR slots `index` and `index + 1`.
    Mmio64,
}

/// A BAR a device asks for; `size` is a power of two, at least 16 bytes.
#[derive(Clone, Copy, Debug)]
pub struct BarSpec {
    pub index: usize,
    pub size: u64,
    pub kind: BarKind,
    pub prefetchable: bool,
}

/// Which dword of a BAR a register is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Half {
    Low,
    High,
}

#[derive(Clone, Copy, Debug)]
struct Bar {
    spec: BarSpec,
    /// The address the bus decodes, as last placed or reported moved.
    addr: Option<u64>,
}

/// The guest-visible part of a configuration space, for migration and
/// snapshots. Identity, capabilities and BAR sizes come from the device
/// that is created on the destination, so only the guest's writes travel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciConfigurationState {
    pub(crate) regs: Vec<u32>,
    /// Decoded address of each BAR slot (`None`: undeclared, high half or
    /// never placed).
    pub(crate) bar_addrs: Vec<Option<u64>>,
    pub(crate) sizing: Vec<bool>,
}

#[derive(Debug)]
pub struct PciConfiguration {
    regs: [u32; NUM_REGS],
    /// Guest-writable bits of each dword.
    writable: [u32; NUM_REGS],
    /// Indexed by a BAR's first slot; the high slot of a 64-bit BAR is
    /// `None` here and found through [`Self::bar_slot`].
    bars: [Option<Bar>; NUM_BARS],
    /// Per BAR slot: the last write was the sizing pattern.
    sizing: [bool; NUM_BARS],
    /// Offset of the last capability, whose next pointer the next one fills.
    last_cap: Option<usize>,
    /// Where the next capability goes (dword aligned).
    next_cap: usize,
}

impl PciConfiguration {
    pub fn new(header: PciHeader) -> Self {
        let mut regs = [0u32; NUM_REGS];
        let mut writable = [0u32; NUM_REGS];
        let id = u32::from(header.vendor_id) | u32::from(header.device_id) << 16;
        let class = u32::from_le_bytes([
            header.revision,
            header.prog_if,
            header.subclass,
            header.class,
        ]);
        let header_type = if header.multifunction {
            HEADER_MULTIFUNCTION
        } else {
            0
        };
        let subsystem =
            u32::from(header.subsystem_vendor_id) | u32::from(header.subsystem_id) << 16;
        for (reg, value, mask) in [
            (0, id, 0),
            (COMMAND_REG, 0, COMMAND_WRITABLE),
            (2, class, 0),
            (HEADER_TYPE_REG, header_type, CACHE_LINE_WRITABLE),
            (SUBSYSTEM_REG, subsystem, 0),
            (
                INTERRUPT_REG,
                u32::from(header.interrupt_pin) << 8,
                INTERRUPT_LINE_WRITABLE,
            ),
        ] {
            if let (Some(r), Some(w)) = (regs.get_mut(reg), writable.get_mut(reg)) {
                *r = value;
                *w = mask;
            }
        }
        PciConfiguration {
            regs,
            writable,
            bars: [None; NUM_BARS],
            sizing: [false; NUM_BARS],
            last_cap: None,
            next_cap: FIRST_CAP,
        }
    }

    /// Declares a BAR (its address is assigned later by the bus).
    pub fn add_bar(&mut self, bar: BarSpec) -> Result<(), PciBusError> {
        let max_size = match bar.kind {
            BarKind::Mmio32 => MAX_BAR32_SIZE,
            BarKind::Mmio64 => u64::MAX,
        };
        if !bar.size.is_power_of_two() || bar.size < MIN_BAR_SIZE || bar.size > max_size {
            return Err(PciBusError::InvalidBarSize(bar.size));
        }
        let extra_slots = match bar.kind {
            BarKind::Mmio32 => 0,
            BarKind::Mmio64 => 1,
        };
        let last = bar
            .index
            .checked_add(extra_slots)
            .filter(|&last| last < NUM_BARS)
            .ok_or(PciBusError::InvalidBarIndex(bar.index))?;
        for slot in bar.index..=last {
            if self.bar_slot(slot).is_some() {
                return Err(PciBusError::BarInUse(slot));
            }
        }

        // Validated above: size >= 16 and both slots < NUM_BARS.
        let size_mask = !bar.size.wrapping_sub(1);
        let mut type_bits = 0;
        if bar.kind == BarKind::Mmio64 {
            type_bits |= BAR_MEM_64;
        }
        if bar.prefetchable {
            type_bits |= BAR_PREFETCHABLE;
        }
        let low_writable = (size_mask as u32) & !BAR_TYPE_BITS;
        self.set_reg(BAR0_REG.wrapping_add(bar.index), type_bits, low_writable);
        if bar.kind == BarKind::Mmio64 {
            self.set_reg(BAR0_REG.wrapping_add(last), 0, (size_mask >> 32) as u32);
        }
        if let Some(entry) = self.bars.get_mut(bar.index) {
            *entry = Some(Bar {
                spec: bar,
                addr: None,
            });
        }
        Ok(())
    }

    /// Appends a read-only capability (`data[0]` = cap id; `data[1]`, the
    /// next pointer, is filled in) and returns its offset in config space.
    pub fn add_capability(&mut self, data: &[u8]) -> Result<usize, PciBusError> {
        self.add_capability_writable(data, &[])
    }

    /// Like [`Self::add_capability`], with guest-writable bits: byte `i` of
    /// `writable` masks byte `i` of the capability (missing bytes are
    /// read-only). The id and next-pointer bytes stay read-only regardless.
    pub fn add_capability_writable(
        &mut self,
        data: &[u8],
        writable: &[u8],
    ) -> Result<usize, PciBusError> {
        if data.len() < 2 {
            return Err(PciBusError::CapabilityTooShort(data.len()));
        }
        if writable.len() > data.len() {
            return Err(PciBusError::CapabilityMaskTooLong);
        }
        let offset = self.next_cap;
        let end = offset
            .checked_add(data.len())
            .filter(|&end| end <= CONFIG_SIZE)
            .ok_or(PciBusError::CapabilitySpaceFull(data.len()))?;

        for (i, &byte) in data.iter().enumerate() {
            // Offsets stay below CONFIG_SIZE, checked above.
            let pos = offset.wrapping_add(i);
            let value = if i == 1 { 0 } else { byte };
            let mask = match i {
                0 | 1 => 0,
                _ => writable.get(i).copied().unwrap_or(0),
            };
            self.set_byte(pos, value, mask);
        }
        let link = match self.last_cap {
            Some(last) => last.wrapping_add(1),
            None => CAP_POINTER,
        };
        // `offset` < CONFIG_SIZE, so it fits the one-byte pointer.
        self.set_byte(link, offset as u8, 0);
        if let Some(status) = self.regs.get_mut(COMMAND_REG) {
            *status |= STATUS_CAP_LIST;
        }
        self.last_cap = Some(offset);
        // Round up to a dword; at most CONFIG_SIZE + 3.
        self.next_cap = end.wrapping_add(3) & !3;
        Ok(offset)
    }

    /// Current guest-physical base of BAR `bar`, if it is programmed: the
    /// address the bus decodes and the last one reported as moved (see the
    /// module docs); `None` for undeclared BARs and 64-bit high slots.
    pub fn bar_address(&self, bar: usize) -> Option<u64> {
        self.bars.get(bar)?.as_ref()?.addr
    }

    pub fn read_reg(&self, reg: usize) -> u32 {
        self.regs.get(reg).copied().unwrap_or(u32::MAX)
    }

    /// Writes `data` (1, 2 or 4 bytes) at byte `offset` of dword `reg`,
    /// honouring read-only bits and BAR sizing. Returns which BAR moved, if
    /// any, as (bar, old, new); see the module docs for when that happens.
    /// Accesses that do not fit in the dword are ignored.
    pub fn write_reg(&mut self, reg: usize, offset: u64, data: &[u8]) -> Option<(usize, u64, u64)> {
        let offset = usize::try_from(offset).ok()?;
        if !matches!(data.len(), 1 | 2 | 4) || offset.checked_add(data.len())? > 4 {
            return None;
        }
        let (Some(value), Some(mask)) = (self.regs.get_mut(reg), self.writable.get(reg)) else {
            return None;
        };
        let mut bytes = value.to_le_bytes();
        let masks = mask.to_le_bytes();
        for ((byte, mask), new) in bytes.iter_mut().zip(masks).skip(offset).zip(data) {
            *byte = (*byte & !mask) | (new & mask);
        }
        *value = u32::from_le_bytes(bytes);
        let all_ones = *value & mask == *mask && data.iter().all(|&b| b == 0xff);

        let slot = reg.checked_sub(BAR0_REG)?;
        let (bar, half) = self.bar_slot(slot)?;
        if let Some(sizing) = self.sizing.get_mut(slot) {
            *sizing = all_ones;
        }
        self.check_bar_move(bar, half)
    }

    /// What the guest programmed, to be put back with [`Self::set_state`].
    pub fn state(&self) -> PciConfigurationState {
        PciConfigurationState {
            regs: self.regs.to_vec(),
            bar_addrs: self.bars.iter().map(|b| b.and_then(|b| b.addr)).collect(),
            sizing: self.sizing.to_vec(),
        }
    }

    /// Restores a saved state onto this (freshly created) configuration.
    /// Only guest-writable bits are taken, so a state from a hostile stream
    /// cannot change the function's identity or capabilities; BAR addresses
    /// must be naturally aligned for their size. Nothing changes on error.
    pub fn set_state(&mut self, state: &PciConfigurationState) -> Result<(), PciBusError> {
        if state.regs.len() != NUM_REGS
            || state.bar_addrs.len() != NUM_BARS
            || state.sizing.len() != NUM_BARS
        {
            return Err(PciBusError::InvalidState("register counts differ"));
        }
        for (bar, addr) in self.bars.iter().zip(&state.bar_addrs) {
            match (bar, addr) {
                (Some(bar), Some(addr)) if !addr.is_multiple_of(bar.spec.size) => {
                    return Err(PciBusError::InvalidState("misaligned BAR address"))
                }
                (None, Some(_)) => return Err(PciBusError::InvalidState("address of no BAR")),
                _ => {}
            }
        }
        for ((reg, &saved), &mask) in self.regs.iter_mut().zip(&state.regs).zip(&self.writable) {
            *reg = (*reg & !mask) | (saved & mask);
        }
        for (bar, addr) in self.bars.iter_mut().zip(&state.bar_addrs) {
            if let Some(bar) = bar {
                bar.addr = *addr;
            }
        }
        self.sizing.copy_from_slice(&state.sizing);
        Ok(())
    }

    /// Whether the command register enables memory decoding.
    pub fn memory_enabled(&self) -> bool {
        self.read_reg(COMMAND_REG) & COMMAND_MEMORY != 0
    }

    /// Declared BARs as (index, size, kind), for the bus to place.
    pub(crate) fn bars(&self) -> impl Iterator<Item = (usize, u64, BarKind)> + '_ {
        self.bars
            .iter()
            .flatten()
            .map(|bar| (bar.spec.index, bar.spec.size, bar.spec.kind))
    }

    /// Places BAR `bar` at `addr` (naturally aligned, chosen by the bus)
    /// without reporting a move.
    pub(crate) fn set_bar_address(&mut self, bar: usize, addr: u64) {
        let Some(Some(entry)) = self.bars.get_mut(bar) else {
            return;
        };
        entry.addr = Some(addr);
        let kind = entry.spec.kind;
        let low = BAR0_REG.wrapping_add(bar);
        self.merge_reg(low, addr as u32);
        if let Some(sizing) = self.sizing.get_mut(bar) {
            *sizing = false;
        }
        if kind == BarKind::Mmio64 {
            self.merge_reg(low.wrapping_add(1), (addr >> 32) as u32);
            if let Some(sizing) = self.sizing.get_mut(bar.wrapping_add(1)) {
                *sizing = false;
            }
        }
    }

    /// Replaces the writable bits of `reg` with those of `value`.
    fn merge_reg(&mut self, reg: usize, value: u32) {
        if let (Some(r), Some(&w)) = (self.regs.get_mut(reg), self.writable.get(reg)) {
            *r = (*r & !w) | (value & w);
        }
    }

    fn set_reg(&mut self, reg: usize, value: u32, writable: u32) {
        if let (Some(r), Some(w)) = (self.regs.get_mut(reg), self.writable.get_mut(reg)) {
            *r = value;
            *w = writable;
        }
    }

    fn set_byte(&mut self, pos: usize, value: u8, writable: u8) {
        let (reg, byte) = (pos / 4, pos % 4);
        if let (Some(r), Some(w)) = (self.regs.get_mut(reg), self.writable.get_mut(reg)) {
            let mut bytes = r.to_le_bytes();
            let mut masks = w.to_le_bytes();
            if let (Some(b), Some(m)) = (bytes.get_mut(byte), masks.get_mut(byte)) {
                *b = value;
                *m = writable;
            }
            *r = u32::from_le_bytes(bytes);
            *w = u32::from_le_bytes(masks);
        }
    }

    /// The BAR that BAR slot `slot` (0..6) belongs to, and which half it is.
    fn bar_slot(&self, slot: usize) -> Option<(usize, Half)> {
        if let Some(Some(_)) = self.bars.get(slot) {
            return Some((slot, Half::Low));
        }
        let below = slot.checked_sub(1)?;
        match self.bars.get(below) {
            Some(Some(bar)) if bar.spec.kind == BarKind::Mmio64 => Some((below, Half::High)),
            _ => None,
        }
    }

    /// The address in BAR `bar`'s registers, or `None` while it is sized.
    fn programmed_address(&self, bar: usize) -> Option<u64> {
        let spec = self.bars.get(bar)?.as_ref()?.spec;
        let dword = |slot: usize| -> Option<u64> {
            if *self.sizing.get(slot)? {
                return None;
            }
            let reg = BAR0_REG.checked_add(slot)?;
            Some(u64::from(self.regs.get(reg)? & self.writable.get(reg)?))
        };
        let low = dword(bar)?;
        let high = match spec.kind {
            BarKind::Mmio32 => 0,
            BarKind::Mmio64 => dword(bar.checked_add(1)?)?,
        };
        Some(high << 32 | low)
    }

    fn check_bar_move(&mut self, bar: usize, half: Half) -> Option<(usize, u64, u64)> {
        let memory_enabled = self.memory_enabled();
        let new = self.programmed_address(bar)?;
        let entry = self.bars.get_mut(bar)?.as_mut()?;
        let commit = entry.spec.kind == BarKind::Mmio32 || half == Half::High || memory_enabled;
        if !commit || entry.addr == Some(new) {
            return None;
        }
        let old = entry.addr.replace(new).unwrap_or(0);
        Some((bar, old, new))
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use super::*;

    fn header() -> PciHeader {
        PciHeader {
            vendor_id: 0x15ad,
            device_id: 0x0820,
            revision: 0x01,
            class: 0x02,
            subclass: 0x80,
            prog_if: 0x05,
            subsystem_vendor_id: 0x15ad,
            subsystem_id: 0x0821,
            multifunction: false,
            interrupt_pin: 1,
        }
    }

    fn bar(index: usize, size: u64, kind: BarKind, prefetchable: bool) -> BarSpec {
        BarSpec {
            index,
            size,
            kind,
            prefetchable,
        }
    }

    fn write32(config: &mut PciConfiguration, reg: usize, value: u32) -> Option<(usize, u64, u64)> {
        config.write_reg(reg, 0, &value.to_le_bytes())
    }

    fn enable_memory(config: &mut PciConfiguration) {
        write32(config, COMMAND_REG, COMMAND_MEMORY);
    }

    #[test]
    fn header_fields_read_only() {
        let mut config = PciConfiguration::new(header());
        assert_eq!(config.read_reg(0), 0x0820_15ad);
        assert_eq!(config.read_reg(2), 0x0280_0501);
        assert_eq!(config.read_reg(3), 0);
        assert_eq!(config.read_reg(11), 0x0821_15ad);
        assert_eq!(config.read_reg(15), 0x0100);

        for reg in [0, 2, 11, 10, 12, 13] {
            let before = config.read_reg(reg);
            write32(&mut config, reg, 0xffff_ffff);
            config.write_reg(reg, 2, &[0, 0]);
            assert_eq!(config.read_reg(reg), before, "reg {reg}");
        }
        // Header type is read-only, cache line size is writable.
        write32(&mut config, 3, 0xffff_ffff);
        assert_eq!(config.read_reg(3), 0xff);
        // Interrupt line writable, pin and the rest read-only.
        write32(&mut config, 15, 0xffff_ffff);
        assert_eq!(config.read_reg(15), 0x01ff);
        config.write_reg(15, 0, &[0x0b]);
        assert_eq!(config.read_reg(15), 0x010b);
    }

    #[test]
    fn command_and_status() {
        let mut config = PciConfiguration::new(header());
        write32(&mut config, COMMAND_REG, 0xffff_ffff);
        // I/O, memory, bus master, parity, SERR, INTx disable; status RO.
        assert_eq!(config.read_reg(COMMAND_REG), 0x0000_0547);
        assert!(config.memory_enabled());
        config.write_reg(COMMAND_REG, 0, &[0x04, 0x00]);
        assert!(!config.memory_enabled());
        assert_eq!(config.read_reg(COMMAND_REG), 0x0000_0004);
        // A byte write to the status half changes nothing.
        config.write_reg(COMMAND_REG, 2, &[0xff, 0xff]);
        assert_eq!(config.read_reg(COMMAND_REG), 0x0000_0004);
    }

    #[test]
    fn multifunction_header_bit() {
        let config = PciConfiguration::new(PciHeader {
            multifunction: true,
            ..header()
        });
        assert_eq!(config.read_reg(3), 0x0080_0000);
    }

    #[test]
    fn bar32_sizing() {
        let mut config = PciConfiguration::new(header());
        config
            .add_bar(bar(1, 0x1000, BarKind::Mmio32, false))
            .unwrap();
        config.set_bar_address(1, 0xc000_0000);
        assert_eq!(config.read_reg(5), 0xc000_0000);
        assert_eq!(config.bar_address(1), Some(0xc000_0000));

        assert_eq!(write32(&mut config, 5, 0xffff_ffff), None);
        assert_eq!(config.read_reg(5), 0xffff_f000);
        assert_eq!(config.bar_address(1), Some(0xc000_0000));
        assert_eq!(write32(&mut config, 5, 0xc000_0000), None);
        assert_eq!(config.read_reg(5), 0xc000_0000);
    }

    #[test]
    fn bar64_prefetchable_sizing() {
        let mut config = PciConfiguration::new(header());
        config
            .add_bar(bar(2, 0x4000, BarKind::Mmio64, true))
            .unwrap();
        config.set_bar_address(2, 0x1_0000_8000);
        assert_eq!(config.read_reg(6), 0x0000_800c);
        assert_eq!(config.read_reg(7), 1);

        // Linux: low dword all-ones and back, then high dword.
        assert_eq!(write32(&mut config, 6, 0xffff_ffff), None);
        assert_eq!(config.read_reg(6), 0xffff_c00c);
        assert_eq!(write32(&mut config, 6, 0x0000_800c), None);
        assert_eq!(write32(&mut config, 7, 0xffff_ffff), None);
        assert_eq!(config.read_reg(7), 0xffff_ffff);
        assert_eq!(write32(&mut config, 7, 1), None);
        assert_eq!(config.bar_address(2), Some(0x1_0000_8000));
    }

    #[test]
    fn bar64_larger_than_4g_sizing() {
        let mut config = PciConfiguration::new(header());
        config
            .add_bar(bar(0, 1 << 33, BarKind::Mmio64, false))
            .unwrap();
        config.set_bar_address(0, 1 << 34);
        assert_eq!(write32(&mut config, 4, 0xffff_ffff), None);
        assert_eq!(config.read_reg(4), 0x4);
        assert_eq!(write32(&mut config, 4, 0x4), None);
        assert_eq!(write32(&mut config, 5, 0xffff_ffff), None);
        assert_eq!(config.read_reg(5), 0xffff_fffe);
        assert_eq!(write32(&mut config, 5, 4), None);
        assert_eq!(config.bar_address(0), Some(1 << 34));
    }

    #[test]
    fn unimplemented_bars_read_zero() {
        let mut config = PciConfiguration::new(header());
        config
            .add_bar(bar(0, 0x100, BarKind::Mmio32, false))
            .unwrap();
        for reg in 5..10 {
            assert_eq!(write32(&mut config, reg, 0xffff_ffff), None);
            assert_eq!(config.read_reg(reg), 0);
        }
        // Expansion ROM is not implemented either.
        write32(&mut config, 12, 0xffff_ffff);
        assert_eq!(config.read_reg(12), 0);
        assert_eq!(config.bar_address(3), None);
    }

    #[test]
    fn bar32_move_reported_at_once() {
        let mut config = PciConfiguration::new(header());
        config
            .add_bar(bar(0, 0x100, BarKind::Mmio32, false))
            .unwrap();
        config.set_bar_address(0, 0xc000_0000);
        assert_eq!(
            write32(&mut config, 4, 0xc000_1000),
            Some((0, 0xc000_0000, 0xc000_1000))
        );
        assert_eq!(config.bar_address(0), Some(0xc000_1000));
        // Rewriting the same address is not a move; low bits are ignored.
        assert_eq!(write32(&mut config, 4, 0xc000_10ff), None);
    }

    #[test]
    fn bar64_move_reported_once_on_high_dword() {
        let mut config = PciConfiguration::new(header());
        config
            .add_bar(bar(2, 0x1000, BarKind::Mmio64, false))
            .unwrap();
        config.set_bar_address(2, 0x1_0000_0000);
        // Decoding off: low write is staged, the high write reports.
        assert_eq!(write32(&mut config, 6, 0x2000_0004), None);
        assert_eq!(config.bar_address(2), Some(0x1_0000_0000));
        assert_eq!(
            write32(&mut config, 7, 2),
            Some((2, 0x1_0000_0000, 0x2_2000_0000))
        );
        // Moving within the same 4 GiB still rewrites the high dword.
        assert_eq!(write32(&mut config, 6, 0x3000_0000), None);
        assert_eq!(
            write32(&mut config, 7, 2),
            Some((2, 0x2_2000_0000, 0x2_3000_0000))
        );
        // Decoding on: the low dword takes effect (and is reported) at once.
        enable_memory(&mut config);
        assert_eq!(
            write32(&mut config, 6, 0x4000_0000),
            Some((2, 0x2_3000_0000, 0x2_4000_0000))
        );
        assert_eq!(write32(&mut config, 7, 2), None);
    }

    #[test]
    fn bar64_low_dword_all_address_bits_is_an_address() {
        // 0x1_ffff_f000: the low dword holds every address bit of a 4 KiB
        // BAR, but it was written as an address, not as all-ones.
        let mut config = PciConfiguration::new(header());
        config
            .add_bar(bar(0, 0x1000, BarKind::Mmio64, false))
            .unwrap();
        config.set_bar_address(0, 0x1_0000_0000);
        assert_eq!(write32(&mut config, 4, 0xffff_f004), None);
        assert_eq!(
            write32(&mut config, 5, 1),
            Some((0, 0x1_0000_0000, 0x1_ffff_f000))
        );
    }

    #[test]
    fn bar_byte_writes() {
        let mut config = PciConfiguration::new(header());
        config
            .add_bar(bar(0, 0x100, BarKind::Mmio32, false))
            .unwrap();
        config.set_bar_address(0, 0xc000_0000);
        assert_eq!(
            config.write_reg(4, 1, &[0x12]),
            Some((0, 0xc000_0000, 0xc000_1200))
        );
    }

    #[test]
    fn add_bar_errors() {
        let mut config = PciConfiguration::new(header());
        for size in [0, 8, 0x300, 1 << 32] {
            assert!(matches!(
                config.add_bar(bar(0, size, BarKind::Mmio32, false)),
                Err(PciBusError::InvalidBarSize(_))
            ));
        }
        assert!(matches!(
            config.add_bar(bar(6, 0x100, BarKind::Mmio32, false)),
            Err(PciBusError::InvalidBarIndex(6))
        ));
        assert!(matches!(
            config.add_bar(bar(5, 0x100, BarKind::Mmio64, false)),
            Err(PciBusError::InvalidBarIndex(5))
        ));
        assert!(matches!(
            config.add_bar(bar(usize::MAX, 0x100, BarKind::Mmio64, false)),
            Err(PciBusError::InvalidBarIndex(_))
        ));
        config
            .add_bar(bar(1, 0x100, BarKind::Mmio64, false))
            .unwrap();
        assert!(matches!(
            config.add_bar(bar(2, 0x100, BarKind::Mmio32, false)),
            Err(PciBusError::BarInUse(2))
        ));
        assert!(matches!(
            config.add_bar(bar(0, 0x100, BarKind::Mmio64, false)),
            Err(PciBusError::BarInUse(1))
        ));
        config
            .add_bar(bar(0, 0x100, BarKind::Mmio32, false))
            .unwrap();
        let placed: Vec<_> = config.bars().collect();
        assert_eq!(
            placed,
            vec![(0, 0x100, BarKind::Mmio32), (1, 0x100, BarKind::Mmio64)]
        );
    }

    /// Walks the list as Linux's pci_find_capability does.
    fn walk_caps(config: &PciConfiguration) -> Vec<(usize, u8)> {
        let byte = |pos: usize| config.read_reg(pos / 4).to_le_bytes()[pos % 4];
        let mut caps = Vec::new();
        let mut pos = usize::from(byte(CAP_POINTER));
        while pos != 0 && caps.len() < 48 {
            assert_eq!(pos % 4, 0);
            caps.push((pos, byte(pos)));
            pos = usize::from(byte(pos + 1));
        }
        caps
    }

    #[test]
    fn capability_chain() {
        let mut config = PciConfiguration::new(header());
        assert_eq!(config.read_reg(COMMAND_REG) & STATUS_CAP_LIST, 0);
        assert!(walk_caps(&config).is_empty());

        assert_eq!(config.add_capability(&[0x09, 0xee, 0x03]).unwrap(), 0x40);
        assert_eq!(
            config.add_capability(&[0x05, 0, 1, 2, 3, 4, 5]).unwrap(),
            0x44
        );
        assert_eq!(config.add_capability(&[0x10, 0, 0, 0]).unwrap(), 0x4c);
        assert_ne!(config.read_reg(COMMAND_REG) & STATUS_CAP_LIST, 0);
        assert_eq!(
            walk_caps(&config),
            vec![(0x40, 0x09), (0x44, 0x05), (0x4c, 0x10)]
        );
        assert_eq!(config.read_reg(0x44 / 4), 0x0201_4c05);

        // Read-only by default: neither the guest nor sizing changes it.
        write32(&mut config, 0x44 / 4, 0xffff_ffff);
        assert_eq!(config.read_reg(0x44 / 4), 0x0201_4c05);
        write32(&mut config, COMMAND_REG, 0);
        assert_ne!(config.read_reg(COMMAND_REG) & STATUS_CAP_LIST, 0);
    }

    #[test]
    fn capability_writable_bits() {
        let mut config = PciConfiguration::new(header());
        let offset = config
            .add_capability_writable(&[0x11, 0, 0x03, 0x00], &[0xff, 0xff, 0x00, 0xc0])
            .unwrap();
        let reg = offset / 4;
        write32(&mut config, reg, 0xffff_ffff);
        // Id and next pointer stay, only bits 14/15 of control change.
        assert_eq!(config.read_reg(reg), 0xc003_0011);
        config.write_reg(reg, 3, &[0x00]);
        assert_eq!(config.read_reg(reg), 0x0003_0011);

        assert!(matches!(
            config.add_capability_writable(&[0x11, 0], &[0, 0, 0]),
            Err(PciBusError::CapabilityMaskTooLong)
        ));
        assert!(matches!(
            config.add_capability(&[0x11]),
            Err(PciBusError::CapabilityTooShort(1))
        ));
    }

    #[test]
    fn capability_space_full() {
        let mut config = PciConfiguration::new(header());
        let big = [0x09u8; 0xbc];
        assert_eq!(config.add_capability(&big).unwrap(), 0x40);
        assert_eq!(config.add_capability(&[0x09, 0, 0, 0]).unwrap(), 0xfc);
        assert!(matches!(
            config.add_capability(&[0x09, 0]),
            Err(PciBusError::CapabilitySpaceFull(2))
        ));
        assert!(matches!(
            PciConfiguration::new(header()).add_capability(&[0u8; 0xc1]),
            Err(PciBusError::CapabilitySpaceFull(0xc1))
        ));
        assert_eq!(walk_caps(&config), vec![(0x40, 0x09), (0xfc, 0x09)]);
    }

    #[test]
    fn hostile_accesses_ignored() {
        let mut config = PciConfiguration::new(header());
        config
            .add_bar(bar(0, 0x100, BarKind::Mmio32, false))
            .unwrap();
        let before: Vec<u32> = (0..NUM_REGS).map(|reg| config.read_reg(reg)).collect();
        for (reg, offset, len) in [
            (1, 0, 0),
            (1, 0, 3),
            (1, 0, 8),
            (1, 3, 2),
            (1, 4, 1),
            (1, u64::MAX, 1),
            (4, 2, 4),
            (64, 0, 4),
            (usize::MAX, 0, 4),
        ] {
            assert_eq!(config.write_reg(reg, offset, &vec![0xff; len]), None);
        }
        let after: Vec<u32> = (0..NUM_REGS).map(|reg| config.read_reg(reg)).collect();
        assert_eq!(before, after);
        assert_eq!(config.read_reg(64), u32::MAX);
        assert_eq!(config.read_reg(usize::MAX), u32::MAX);
        assert_eq!(config.bar_address(usize::MAX), None);
    }
}
