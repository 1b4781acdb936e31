// SPDX-License-Identifier: Apache-2.0
//! MSI-X: capability, vector table, pending-bit array.

use std::sync::Arc;

use crate::{MsiRouter, PciConfiguration};

#[derive(Debug, thiserror::Error)]
pub enum MsixError { /* helper fills */ }

/// MSI-X state of one function. The table and PBA live in a BAR the device
/// owns: it forwards accesses to `read_table`/`write_table`/`read_pba`.
pub struct Msix { /* helper fills */ }

impl Msix {
    /// Allocates `vectors` routes, adds the capability to `config`, with the
    /// table at `table_offset` and the PBA at `pba_offset` of BAR `bar`.
    pub fn new(config: &mut PciConfiguration, router: Arc<dyn MsiRouter>, vectors: u16, bar: usize, table_offset: u32, pba_offset: u32) -> Result<Self, MsixError> { todo!() }
    pub fn read_table(&self, offset: u64, data: &mut [u8]) { todo!() }
    pub fn write_table(&mut self, offset: u64, data: &[u8]) { todo!() }
    pub fn read_pba(&self, offset: u64, data: &mut [u8]) { todo!() }
    /// Follow the enable / function-mask bits after a config write.
    pub fn config_written(&mut self, config: &PciConfiguration) { todo!() }
    /// Signals `vector`: delivered now, or left pending while masked.
    pub fn trigger(&mut self, vector: u16) { todo!() }
    pub fn enabled(&self) -> bool { todo!() }
}
