// SPDX-License-Identifier: Apache-2.0
//! Bus 0: the host bridge, slots/functions, CF8/CFC, BAR placement and
//! MMIO dispatch to BARs.

use std::sync::{Arc, Mutex};

use crate::PciDevice;

#[derive(Debug, thiserror::Error)]
pub enum PciBusError { /* helper fills */ }

pub struct PciBus { /* helper fills */ }

impl PciBus {
    /// A bus with the host bridge at 00.0; 32-bit BARs are placed in
    /// `mmio32` (start, len), 64-bit BARs in `mmio64`.
    pub fn new(mmio32: (u64, u64), mmio64: (u64, u64)) -> Self { todo!() }
    /// Adds a function at `slot`.`function`, assigns its BARs and returns
    /// their bases.
    pub fn add_device(&mut self, slot: u8, function: u8, dev: Arc<Mutex<dyn PciDevice>>) -> Result<Vec<(usize, u64)>, PciBusError> { todo!() }
    /// The first free slot number (for devices that take a whole slot).
    pub fn next_free_slot(&self) -> Option<u8> { todo!() }
    /// Port I/O at 0xCF8..=0xCFF (`port` is the absolute port).
    pub fn pio_read(&self, port: u16, data: &mut [u8]) { todo!() }
    pub fn pio_write(&mut self, port: u16, data: &[u8]) { todo!() }
    /// MMIO inside some BAR. Returns false when no enabled BAR covers `addr`.
    pub fn mmio_read(&self, addr: u64, data: &mut [u8]) -> bool { todo!() }
    pub fn mmio_write(&self, addr: u64, data: &[u8]) -> bool { todo!() }
}
