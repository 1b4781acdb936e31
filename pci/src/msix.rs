// SPDX-License-Identifier: Apache-2.0
//! MSI-X: capability, vector table, pending-bit array.
//!
//! Each vector is an irqfd behind a KVM GSI route. Routes are installed
//! lazily: when an entry becomes deliverable (MSI-X enabled, function and
//! entry unmasked) and its message differs from the installed route. Linux
//! writes a message only while the entry is masked, so this costs one route
//! update per unmask instead of one per dword. Routes are never removed
//! while the device lives; masking is enforced in [`Msix::trigger`], which
//! sets the pending bit instead of signalling the irqfd. Unmasking delivers
//! a pending vector and clears its bit.
//!
//! The enable and function-mask bits live in config space (guest-writable
//! bits of the capability); the device calls [`Msix::config_written`] from
//! its `PciDevice::config_written` so this state follows them.

#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::io;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{MsiMessage, MsiRouter, MsiVector, PciBusError, PciConfiguration};

/// MSI-X capability ID.
pub const MSIX_CAP_ID: u8 = 0x11;
/// The table-size field has 11 bits.
pub const MAX_MSIX_VECTORS: u16 = 2048;
/// Bytes per table entry: address low/high, data, vector control.
const ENTRY_SIZE: u64 = 16;
const NUM_BARS: usize = 6;
/// Message control bits (upper half of the capability's first dword).
const CTRL_ENABLE: u32 = 1 << 31;
const CTRL_FUNCTION_MASK: u32 = 1 << 30;
/// Vector control: only the mask bit is defined.
const VECTOR_MASKED: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum MsixError {
    #[error("MSI-X needs 1 to {MAX_MSIX_VECTORS} vectors, not {0}")]
    VectorCount(u16),
    #[error("MSI-X BAR index {0} is out of range")]
    InvalidBar(usize),
    #[error("MSI-X table or PBA offset {0:#x} is not 8-byte aligned")]
    UnalignedOffset(u32),
    #[error("Failed to allocate an MSI vector")]
    AllocateVector(#[source] io::Error),
    #[error("Failed to add the MSI-X capability")]
    AddCapability(#[source] PciBusError),
    #[error("Saved MSI-X table has {saved} vectors, this function {here}")]
    StateVectors { saved: usize, here: usize },
}

/// Size in bytes of the MSI-X table for `vectors` entries, for laying out
/// the BAR that holds it.
pub const fn msix_table_size(vectors: u16) -> u64 {
    (vectors as u64).wrapping_mul(ENTRY_SIZE)
}

/// Size in bytes of the pending-bit array for `vectors` entries (whole
/// qwords, as the spec lays it out).
pub const fn msix_pba_size(vectors: u16) -> u64 {
    (vectors as u64).div_ceil(64).wrapping_mul(8)
}

/// What the guest programmed into an MSI-X table, for migration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsixState {
    enabled: bool,
    function_masked: bool,
    /// Per vector: message, masked, pending.
    vectors: Vec<(MsiMessage, bool, bool)>,
}

#[derive(Debug)]
struct Vector {
    line: MsiVector,
    msg: MsiMessage,
    masked: bool,
    pending: bool,
    /// The message of the route installed for `line.gsi`, if any.
    route: Option<MsiMessage>,
}

/// MSI-X state of one function. The table and PBA live in a BAR the device
/// owns: it forwards accesses to `read_table`/`write_table`/`read_pba`, with
/// offsets relative to the start of the table or PBA. Table accesses are 4
/// or 8 bytes, naturally aligned; anything else is ignored (reads return
/// all-ones). Dropping it releases the vectors back to the router.
pub struct Msix {
    router: Arc<dyn MsiRouter>,
    vectors: Vec<Vector>,
    table_size: u64,
    pba_size: u64,
    cap_offset: usize,
    enabled: bool,
    function_masked: bool,
}

impl std::fmt::Debug for Msix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Msix")
            .field("vectors", &self.vectors)
            .field("cap_offset", &self.cap_offset)
            .field("enabled", &self.enabled)
            .field("function_masked", &self.function_masked)
            .finish_non_exhaustive()
    }
}

impl Msix {
    /// Allocates `vectors` routes, adds the capability to `config`, with the
    /// table at `table_offset` and the PBA at `pba_offset` of BAR `bar`.
    pub fn new(
        config: &mut PciConfiguration,
        router: Arc<dyn MsiRouter>,
        vectors: u16,
        bar: usize,
        table_offset: u32,
        pba_offset: u32,
    ) -> Result<Self, MsixError> {
        if vectors == 0 || vectors > MAX_MSIX_VECTORS {
            return Err(MsixError::VectorCount(vectors));
        }
        if bar >= NUM_BARS {
            return Err(MsixError::InvalidBar(bar));
        }
        for offset in [table_offset, pba_offset] {
            if !offset.is_multiple_of(8) {
                return Err(MsixError::UnalignedOffset(offset));
            }
        }
        let mut msix = Msix {
            router,
            vectors: Vec::with_capacity(usize::from(vectors)),
            table_size: msix_table_size(vectors),
            pba_size: msix_pba_size(vectors),
            cap_offset: 0,
            enabled: false,
            function_masked: false,
        };
        // On error `msix` drops and releases what was allocated so far.
        for _ in 0..vectors {
            let line = msix.router.allocate().map_err(MsixError::AllocateVector)?;
            msix.vectors.push(Vector {
                line,
                msg: MsiMessage::default(),
                masked: true,
                pending: false,
                route: None,
            });
        }

        // `bar` < 6 fits the 3-bit BIR field; offsets are 8-byte aligned.
        let bir = bar as u32;
        let mut cap = [0u8; 12];
        cap[0] = MSIX_CAP_ID;
        cap[2..4].copy_from_slice(&vectors.wrapping_sub(1).to_le_bytes());
        cap[4..8].copy_from_slice(&(table_offset | bir).to_le_bytes());
        cap[8..12].copy_from_slice(&(pba_offset | bir).to_le_bytes());
        // Only the function-mask and enable bits of message control.
        let writable = [0, 0, 0, 0xc0];
        msix.cap_offset = config
            .add_capability_writable(&cap, &writable)
            .map_err(MsixError::AddCapability)?;
        Ok(msix)
    }

    pub fn read_table(&self, offset: u64, data: &mut [u8]) {
        let Some(first) = dword_index(offset, data.len(), self.table_size) else {
            data.fill(0xff);
            return;
        };
        for (dword, chunk) in (first..).zip(data.chunks_exact_mut(4)) {
            let value = self.read_table_dword(dword).unwrap_or(u32::MAX);
            chunk.copy_from_slice(&value.to_le_bytes());
        }
    }

    pub fn write_table(&mut self, offset: u64, data: &[u8]) {
        let Some(first) = dword_index(offset, data.len(), self.table_size) else {
            return;
        };
        for (dword, chunk) in (first..).zip(data.chunks_exact(4)) {
            let mut bytes = [0u8; 4];
            bytes.copy_from_slice(chunk);
            self.write_table_dword(dword, u32::from_le_bytes(bytes));
        }
    }

    /// The PBA is read-only; writes to it are simply not forwarded.
    pub fn read_pba(&self, offset: u64, data: &mut [u8]) {
        let Some(first) = dword_index(offset, data.len(), self.pba_size) else {
            data.fill(0xff);
            return;
        };
        for (dword, chunk) in (first..).zip(data.chunks_exact_mut(4)) {
            let bits = self.vectors.chunks(32).nth(dword).map_or(0, |vectors| {
                vectors
                    .iter()
                    .rev()
                    .fold(0u32, |acc, v| (acc << 1) | u32::from(v.pending))
            });
            chunk.copy_from_slice(&bits.to_le_bytes());
        }
    }

    /// Follow the enable / function-mask bits after a config write.
    pub fn config_written(&mut self, config: &PciConfiguration) {
        let ctrl = config.read_reg(self.cap_offset / 4);
        let enabled = ctrl & CTRL_ENABLE != 0;
        let function_masked = ctrl & CTRL_FUNCTION_MASK != 0;
        if (enabled, function_masked) == (self.enabled, self.function_masked) {
            return;
        }
        self.enabled = enabled;
        self.function_masked = function_masked;
        for index in 0..self.vectors.len() {
            self.sync(index);
        }
    }

    /// Signals `vector`: delivered now, or left pending while masked.
    pub fn trigger(&mut self, vector: u16) {
        let index = usize::from(vector);
        let Some(v) = self.vectors.get_mut(index) else {
            log::warn!(
                "MSI-X vector {vector} out of range ({} vectors)",
                self.vectors.len()
            );
            return;
        };
        v.pending = true;
        self.sync(index);
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The table, PBA and control bits, to be put back with
    /// [`Self::set_state`].
    pub fn state(&self) -> MsixState {
        MsixState {
            enabled: self.enabled,
            function_masked: self.function_masked,
            vectors: self
                .vectors
                .iter()
                .map(|v| (v.msg, v.masked, v.pending))
                .collect(),
        }
    }

    /// Restores a saved table onto this one (same vector count), installs
    /// the routes of deliverable vectors and delivers what was pending.
    pub fn set_state(&mut self, state: &MsixState) -> Result<(), MsixError> {
        if state.vectors.len() != self.vectors.len() {
            return Err(MsixError::StateVectors {
                saved: state.vectors.len(),
                here: self.vectors.len(),
            });
        }
        self.enabled = state.enabled;
        self.function_masked = state.function_masked;
        for (v, &(msg, masked, pending)) in self.vectors.iter_mut().zip(&state.vectors) {
            v.msg = msg;
            v.masked = masked;
            v.pending = pending;
        }
        self.install_routes();
        for index in 0..self.vectors.len() {
            self.sync(index);
        }
        Ok(())
    }

    /// Installs the routes of every deliverable vector in one update (a
    /// restore sits in a migration's blackout); if that fails, [`Self::sync`]
    /// tries them one by one.
    fn install_routes(&mut self) {
        if !self.enabled || self.function_masked {
            return;
        }
        let wanted = |v: &&mut Vector| !v.masked && v.route != Some(v.msg);
        let routes: Vec<(u32, MsiMessage)> = self
            .vectors
            .iter_mut()
            .filter(wanted)
            .map(|v| (v.line.gsi, v.msg))
            .collect();
        if routes.is_empty() {
            return;
        }
        match self.router.set_routes(&routes) {
            Ok(()) => {
                for v in self.vectors.iter_mut().filter(wanted) {
                    v.route = Some(v.msg);
                }
            }
            Err(e) => log::warn!("MSI-X routes of a restore failed: {e}"),
        }
    }

    /// Table size; vector numbers at or above it are invalid (virtio-pci
    /// answers NO_VECTOR to those).
    pub fn vectors(&self) -> u16 {
        u16::try_from(self.vectors.len()).unwrap_or(MAX_MSIX_VECTORS)
    }

    fn read_table_dword(&self, dword: usize) -> Option<u32> {
        let v = self.vectors.get(dword / 4)?;
        Some(match dword % 4 {
            0 => v.msg.addr_lo,
            1 => v.msg.addr_hi,
            2 => v.msg.data,
            _ => u32::from(v.masked),
        })
    }

    fn write_table_dword(&mut self, dword: usize, value: u32) {
        let index = dword / 4;
        let Some(v) = self.vectors.get_mut(index) else {
            return;
        };
        match dword % 4 {
            0 => v.msg.addr_lo = value,
            1 => v.msg.addr_hi = value,
            2 => v.msg.data = value,
            _ => v.masked = value & VECTOR_MASKED != 0,
        }
        self.sync(index);
    }

    /// If vector `index` is deliverable: installs its route when the message
    /// changed, then delivers it if pending.
    fn sync(&mut self, index: usize) {
        let deliverable = self.enabled && !self.function_masked;
        let Some(v) = self.vectors.get_mut(index) else {
            return;
        };
        if !deliverable || v.masked {
            return;
        }
        if v.route != Some(v.msg) {
            match self.router.set_route(v.line.gsi, Some(v.msg)) {
                Ok(()) => v.route = Some(v.msg),
                Err(e) => {
                    // Stays pending; the next unmask or trigger retries.
                    log::warn!("MSI-X route for gsi={} failed: {e}", v.line.gsi);
                    return;
                }
            }
        }
        if v.pending {
            match v.line.irqfd.write(1) {
                Ok(()) => v.pending = false,
                Err(e) => log::warn!("MSI-X irqfd for gsi={} failed: {e}", v.line.gsi),
            }
        }
    }
}

impl Drop for Msix {
    fn drop(&mut self) {
        for v in &self.vectors {
            if let Err(e) = self.router.release(&v.line) {
                log::warn!("Failed to release MSI vector gsi={}: {e}", v.line.gsi);
            }
        }
    }
}

/// The first dword of a 4- or 8-byte access at `offset`, naturally aligned
/// and inside `limit` bytes; `None` for anything else.
fn dword_index(offset: u64, len: usize, limit: u64) -> Option<usize> {
    let len64 = match len {
        4 => 4,
        8 => 8,
        _ => return None,
    };
    if !offset.is_multiple_of(len64) || offset.checked_add(len64)? > limit {
        return None;
    }
    usize::try_from(offset / 4).ok()
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use super::*;
    use crate::test_utils::MockMsi;
    use crate::{BarKind, BarSpec, PciHeader};

    const TABLE: u32 = 0x2000;
    const PBA: u32 = 0x3000;

    fn setup(vectors: u16) -> (PciConfiguration, Arc<MockMsi>, Msix) {
        let mut config = PciConfiguration::new(PciHeader::default());
        config
            .add_bar(BarSpec {
                index: 1,
                size: 0x4000,
                kind: BarKind::Mmio32,
                prefetchable: false,
            })
            .unwrap();
        let router = Arc::new(MockMsi::default());
        let msix = Msix::new(&mut config, router.clone(), vectors, 1, TABLE, PBA).unwrap();
        (config, router, msix)
    }

    fn read32(msix: &Msix, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        msix.read_table(offset, &mut data);
        u32::from_le_bytes(data)
    }

    fn write32(msix: &mut Msix, offset: u64, value: u32) {
        msix.write_table(offset, &value.to_le_bytes());
    }

    fn pba(msix: &Msix) -> u64 {
        let mut data = [0u8; 8];
        msix.read_pba(0, &mut data);
        u64::from_le_bytes(data)
    }

    fn message(vector: u32) -> MsiMessage {
        MsiMessage {
            addr_lo: 0xfee0_0000 | vector << 12,
            addr_hi: 0,
            data: 0x40 + vector,
        }
    }

    /// Programs entry `v` as Linux does: address, data, then unmask.
    fn program(msix: &mut Msix, v: u32, unmask: bool) {
        let base = u64::from(v) * 16;
        let msg = message(v);
        write32(msix, base, msg.addr_lo);
        write32(msix, base + 4, msg.addr_hi);
        write32(msix, base + 8, msg.data);
        if unmask {
            write32(msix, base + 12, 0);
        }
    }

    /// Writes message control (bit 15 enable, 14 function mask).
    fn set_control(config: &mut PciConfiguration, msix: &mut Msix, enable: bool, mask: bool) {
        let control = u8::from(enable) << 7 | u8::from(mask) << 6;
        config.write_reg(msix.cap_offset / 4, 3, &[control]);
        msix.config_written(config);
    }

    #[test]
    fn shareable_across_threads() {
        fn check<T: Send>() {}
        check::<Msix>();
    }

    #[test]
    fn capability_layout() {
        let (config, router, msix) = setup(5);
        assert_eq!(msix.vectors(), 5);
        let reg = msix.cap_offset / 4;
        assert_eq!(config.read_reg(reg), 0x0004_0011);
        assert_eq!(config.read_reg(reg + 1), TABLE | 1);
        assert_eq!(config.read_reg(reg + 2), PBA | 1);
        assert_eq!(router.live().len(), 5);
        assert!(!msix.enabled());
    }

    #[test]
    fn entries_masked_at_reset() {
        let (_config, _router, msix) = setup(3);
        for v in 0..3 {
            assert_eq!(read32(&msix, v * 16), 0);
            assert_eq!(read32(&msix, v * 16 + 12), 1);
        }
        assert_eq!(pba(&msix), 0);
    }

    #[test]
    fn enable_via_config_space() {
        let (mut config, _router, mut msix) = setup(2);
        set_control(&mut config, &mut msix, true, false);
        assert!(msix.enabled());
        // The guest cannot touch the table size or the id.
        let reg = msix.cap_offset / 4;
        config.write_reg(reg, 0, &[0xff, 0xff, 0xff, 0xbf]);
        assert_eq!(config.read_reg(reg), 0x8001_0011);
        set_control(&mut config, &mut msix, false, false);
        assert!(!msix.enabled());
    }

    #[test]
    fn delivers_when_unmasked() {
        let (mut config, router, mut msix) = setup(2);
        set_control(&mut config, &mut msix, true, false);
        program(&mut msix, 1, true);
        msix.trigger(1);
        assert_eq!(router.fired(1), 1);
        assert_eq!(router.fired(0), 0);
        assert_eq!(pba(&msix), 0);
    }

    #[test]
    fn pending_while_entry_masked_then_delivered() {
        let (mut config, router, mut msix) = setup(2);
        set_control(&mut config, &mut msix, true, false);
        program(&mut msix, 0, false);
        msix.trigger(0);
        msix.trigger(0);
        assert_eq!(router.fired(0), 0);
        assert_eq!(pba(&msix), 0b01);

        write32(&mut msix, 12, 0);
        // One delivery for however many triggers were held.
        assert_eq!(router.fired(0), 1);
        assert_eq!(pba(&msix), 0);
        assert_eq!(router.route(0), Some(message(0)));
    }

    #[test]
    fn pending_while_function_masked_then_delivered() {
        let (mut config, router, mut msix) = setup(2);
        set_control(&mut config, &mut msix, true, true);
        program(&mut msix, 1, true);
        msix.trigger(1);
        assert_eq!(router.fired(1), 0);
        assert_eq!(pba(&msix), 0b10);

        set_control(&mut config, &mut msix, true, false);
        assert_eq!(router.fired(1), 1);
        assert_eq!(pba(&msix), 0);
    }

    #[test]
    fn pending_while_disabled_then_delivered_on_enable() {
        let (mut config, router, mut msix) = setup(1);
        program(&mut msix, 0, true);
        msix.trigger(0);
        assert_eq!(router.fired(0), 0);
        assert_eq!(pba(&msix), 1);
        assert_eq!(router.route_calls(), 0);
        set_control(&mut config, &mut msix, true, false);
        assert_eq!(router.fired(0), 1);
        assert_eq!(pba(&msix), 0);
    }

    #[test]
    fn route_updates_on_table_writes() {
        let (mut config, router, mut msix) = setup(2);
        set_control(&mut config, &mut msix, true, false);
        // Written while masked: no route yet.
        program(&mut msix, 0, false);
        assert_eq!(router.route_calls(), 0);
        write32(&mut msix, 12, 0);
        assert_eq!(router.route(0), Some(message(0)));
        assert_eq!(router.route_calls(), 1);

        // Masking and unmasking with the same message costs nothing.
        write32(&mut msix, 12, 1);
        write32(&mut msix, 12, 0);
        assert_eq!(router.route_calls(), 1);

        // A message written while unmasked takes effect at once.
        write32(&mut msix, 8, 0x99);
        assert_eq!(router.route(0).unwrap().data, 0x99);

        // An 8-byte write of address low/high.
        msix.write_table(0, &0x0000_0001_fee0_1000u64.to_le_bytes());
        let route = router.route(0).unwrap();
        assert_eq!((route.addr_lo, route.addr_hi), (0xfee0_1000, 1));
        let mut data = [0u8; 8];
        msix.read_table(8, &mut data);
        assert_eq!(u64::from_le_bytes(data), 0x99);
        assert_eq!(router.route(1), None);
    }

    #[test]
    fn vector_control_only_mask_bit() {
        let (_config, _router, mut msix) = setup(1);
        write32(&mut msix, 12, 0xffff_fffe);
        assert_eq!(read32(&msix, 12), 0);
        write32(&mut msix, 12, 0xffff_ffff);
        assert_eq!(read32(&msix, 12), 1);
    }

    #[test]
    fn state_moves_routes_and_pending_vectors() {
        let (mut config, _router, mut msix) = setup(3);
        set_control(&mut config, &mut msix, true, false);
        program(&mut msix, 0, true);
        program(&mut msix, 1, false);
        msix.trigger(1);
        let state = msix.state();

        // A fresh function on another "host" gets the routes installed and
        // the vector still pending, not delivered, while it stays masked.
        let (_config, router, mut copy) = setup(3);
        copy.set_state(&state).unwrap();
        assert_eq!(router.route(0), Some(message(0)));
        assert!(!router.routed(1));
        assert_eq!(pba(&copy), 0b10);
        write32(&mut copy, 16 + 12, 0);
        assert_eq!(router.fired(1), 1);
        assert_eq!(copy.state().vectors.len(), 3);

        let (_config, _router, mut small) = setup(2);
        assert!(matches!(
            small.set_state(&state),
            Err(MsixError::StateVectors { saved: 3, here: 2 })
        ));
    }

    /// A restore installs every deliverable vector's route in one update
    /// (one grace period in KVM); a masked vector keeps its pending bit.
    #[test]
    fn a_restore_installs_its_routes_at_once() {
        let (mut config, _router, mut msix) = setup(4);
        set_control(&mut config, &mut msix, true, false);
        for v in 0..3 {
            program(&mut msix, v, true);
        }
        program(&mut msix, 3, false);
        msix.trigger(3);
        let state = msix.state();

        let (_config, router, mut copy) = setup(4);
        copy.set_state(&state).unwrap();
        assert_eq!(router.route_calls(), 1);
        for v in 0..3 {
            assert_eq!(router.route(v), Some(message(v)));
        }
        assert!(!router.routed(3));
        assert_eq!(pba(&copy), 0b1000);
    }

    #[test]
    fn pba_spans_qwords() {
        let (mut config, _router, mut msix) = setup(70);
        set_control(&mut config, &mut msix, true, true);
        msix.trigger(3);
        msix.trigger(33);
        msix.trigger(69);
        assert_eq!(pba(&msix), 1 << 3 | 1 << 33);
        let mut data = [0u8; 4];
        msix.read_pba(8, &mut data);
        assert_eq!(u32::from_le_bytes(data), 1 << 5);
        msix.read_pba(12, &mut data);
        assert_eq!(u32::from_le_bytes(data), 0);
        assert_eq!(msix_pba_size(70), 16);
        assert_eq!(msix_table_size(70), 1120);
    }

    #[test]
    fn hostile_accesses_ignored() {
        let (mut config, router, mut msix) = setup(2);
        set_control(&mut config, &mut msix, true, false);
        program(&mut msix, 0, true);
        let snapshot = |msix: &Msix| -> Vec<u32> { (0..8).map(|d| read32(msix, d * 4)).collect() };
        let before = snapshot(&msix);

        for (offset, len) in [
            (0, 1),
            (0, 2),
            (0, 3),
            (0, 16),
            (2, 4),
            (4, 8),
            (6, 4),
            (32, 4),
            (28, 8),
            (u64::MAX - 3, 4),
            (u64::MAX - 7, 8),
        ] {
            msix.write_table(offset, &vec![0u8; len]);
            let mut data = vec![0u8; len];
            msix.read_table(offset, &mut data);
            assert!(data.iter().all(|&b| b == 0xff), "{offset}/{len}");
            msix.read_pba(offset, &mut data);
            assert!(data.iter().all(|&b| b == 0xff), "pba {offset}/{len}");
        }
        assert_eq!(snapshot(&msix), before);

        msix.trigger(2);
        msix.trigger(u16::MAX);
        assert_eq!(router.fired(0), 0);
        assert_eq!(pba(&msix), 0);
    }

    #[test]
    fn invalid_arguments() {
        let mut config = PciConfiguration::new(PciHeader::default());
        let router: Arc<dyn MsiRouter> = Arc::new(MockMsi::default());
        for (vectors, bar, table, pba) in [
            (0, 0, 0, 0x800),
            (MAX_MSIX_VECTORS + 1, 0, 0, 0x8000),
            (1, 6, 0, 0x800),
            (1, 0, 4, 0x800),
            (1, 0, 0, 0x801),
        ] {
            assert!(Msix::new(&mut config, router.clone(), vectors, bar, table, pba).is_err());
        }
        // Nothing half-added.
        assert_eq!(config.read_reg(0x34 / 4), 0);
        assert!(Msix::new(&mut config, router, MAX_MSIX_VECTORS, 0, 0, 0x8000).is_ok());
    }

    #[test]
    fn vectors_released() {
        let (_config, router, msix) = setup(3);
        drop(msix);
        assert!(router.live().is_empty());
        assert_eq!(router.released(), vec![0, 1, 2]);
    }

    #[test]
    fn allocation_failure_releases_partial() {
        let mut config = PciConfiguration::new(PciHeader::default());
        let router = Arc::new(MockMsi::default());
        router.set_limit(2);
        let err = Msix::new(&mut config, router.clone(), 3, 0, 0, 0x800).unwrap_err();
        assert!(matches!(err, MsixError::AllocateVector(_)));
        assert!(router.live().is_empty());
        assert_eq!(router.released(), vec![0, 1]);
        assert_eq!(config.read_reg(0x34 / 4), 0);
    }

    #[test]
    fn capability_failure_releases_vectors() {
        let mut config = PciConfiguration::new(PciHeader::default());
        config.add_capability(&[0x09; 0xbc]).unwrap();
        let router = Arc::new(MockMsi::default());
        let err = Msix::new(&mut config, router.clone(), 2, 0, 0, 0x800).unwrap_err();
        assert!(matches!(err, MsixError::AddCapability(_)));
        assert!(router.live().is_empty());
    }
}
