// SPDX-License-Identifier: Apache-2.0
//! Type-0 configuration space of one function.

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

#[derive(Debug)]
pub struct PciConfiguration { /* helper fills */ }

impl PciConfiguration {
    pub fn new(header: PciHeader) -> Self { todo!() }
    /// Declares a BAR (its address is assigned later by the bus).
    pub fn add_bar(&mut self, bar: BarSpec) -> Result<(), crate::PciBusError> { todo!() }
    /// Appends a capability (`data[0]` = cap id; `data[1]`, the next pointer,
    /// is filled in) and returns its offset in config space.
    pub fn add_capability(&mut self, data: &[u8]) -> Result<usize, crate::PciBusError> { todo!() }
    /// Current guest-physical base of BAR `bar`, if it is programmed.
    pub fn bar_address(&self, bar: usize) -> Option<u64> { todo!() }
    pub fn read_reg(&self, reg: usize) -> u32 { todo!() }
    /// Writes `data` (1, 2 or 4 bytes) at byte `offset` of dword `reg`,
    /// honouring read-only bits and BAR sizing. Returns which BAR moved, if
    /// any, as (bar, old, new).
    pub fn write_reg(&mut self, reg: usize, offset: u64, data: &[u8]) -> Option<(usize, u64, u64)> { todo!() }
    /// Whether the command register enables memory decoding.
    pub fn memory_enabled(&self) -> bool { todo!() }
}
