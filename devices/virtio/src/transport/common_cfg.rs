// SPDX-License-Identifier: Apache-2.0
//! The common configuration structure (`struct virtio_pci_common_cfg`,
//! VIRTIO 1.2 §4.1.4.3): feature negotiation, device status and queue setup.
//!
//! Everything here is driven by guest MMIO writes, so every value is checked
//! and unexpected accesses are ignored (reads return 0) instead of trusted.
//! The state machine only records what the driver programmed; turning queue
//! settings into live queues happens at DRIVER_OK, in [`CommonConfig::build_queues`].
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
    VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;

use super::interrupt::{InterruptState, ISR_CONFIG, ISR_QUEUE};
use super::{read_le, write_le, ActivateError, StateError, VIRTIO_MSI_NO_VECTOR};

// Register offsets inside `struct virtio_pci_common_cfg`.
const DEVICE_FEATURE_SELECT: u64 = 0x00;
const DEVICE_FEATURE: u64 = 0x04;
const DRIVER_FEATURE_SELECT: u64 = 0x08;
const DRIVER_FEATURE: u64 = 0x0c;
const CONFIG_MSIX_VECTOR: u64 = 0x10;
const NUM_QUEUES: u64 = 0x12;
const DEVICE_STATUS: u64 = 0x14;
const CONFIG_GENERATION: u64 = 0x15;
const QUEUE_SELECT: u64 = 0x16;
const QUEUE_SIZE: u64 = 0x18;
const QUEUE_MSIX_VECTOR: u64 = 0x1a;
const QUEUE_ENABLE: u64 = 0x1c;
const QUEUE_NOTIFY_OFF: u64 = 0x1e;
const QUEUE_DESC: u64 = 0x20;
const QUEUE_DRIVER: u64 = 0x28;
const QUEUE_DEVICE: u64 = 0x30;
/// Last byte of the three 64-bit queue address registers.
const QUEUE_ADDR_END: u64 = 0x37;
/// Size of the structure without the VIRTIO_F_RING_RESET / NOTIFICATION_DATA
/// fields, which this transport does not offer.
pub(crate) const COMMON_CFG_LEN: u64 = 0x38;

/// Status bits as the one-byte register holds them (the bindings are u32).
const STATUS_FEATURES_OK: u8 = VIRTIO_CONFIG_S_FEATURES_OK as u8;
const STATUS_DRIVER_OK: u8 = VIRTIO_CONFIG_S_DRIVER_OK as u8;
const STATUS_NEEDS_RESET: u8 = VIRTIO_CONFIG_S_NEEDS_RESET as u8;

/// What the transport must do after a common-config write.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StatusAction {
    None,
    /// The driver wrote 0 to `device_status`: the transport must stop the
    /// device, then call [`CommonConfig::reset`].
    Reset,
    /// The driver set DRIVER_OK after a successful FEATURES_OK.
    Activate,
}

/// One queue as the driver programmed it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct QueueConfig {
    /// The device's, not the driver's: never taken from a saved state.
    #[serde(skip)]
    max_size: u16,
    size: u16,
    enabled: bool,
    desc: u64,
    driver: u64,
    device: u64,
}

impl QueueConfig {
    fn new(max_size: u16) -> Self {
        Self {
            max_size,
            size: max_size,
            ..Self::default()
        }
    }

    fn addr_mut(&mut self, base: u64) -> Option<&mut u64> {
        match base {
            QUEUE_DESC => Some(&mut self.desc),
            QUEUE_DRIVER => Some(&mut self.driver),
            QUEUE_DEVICE => Some(&mut self.device),
            _ => None,
        }
    }
}

/// What the driver programmed into the common configuration, for live
/// migration and snapshots, plus the interrupt state behind it (ISR,
/// NEEDS_RESET, vectors). Untrusted on restore: see
/// [`CommonConfig::set_state`].
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedCommon {
    /// What the saved device offered; must be what this one offers.
    device_features: u64,
    driver_features: u64,
    device_feature_select: u32,
    driver_feature_select: u32,
    /// The driver's status bits; the device's NEEDS_RESET is `needs_reset`.
    status: u8,
    needs_reset: bool,
    isr: u8,
    queue_select: u16,
    config_vector: u16,
    queue_vectors: Vec<u16>,
    queues: Vec<QueueConfig>,
}

/// Transport state of one virtio-pci function.
#[derive(Debug)]
pub(crate) struct CommonConfig {
    device_features: u64,
    driver_features: u64,
    device_feature_select: u32,
    driver_feature_select: u32,
    status: u8,
    queue_select: u16,
    queues: Vec<QueueConfig>,
    /// Number of MSI-X vectors; vector registers only accept lower values.
    msix_vectors: u16,
    irq: Arc<InterruptState>,
}

impl CommonConfig {
    pub(crate) fn new(
        device_features: u64,
        queue_max_sizes: &[u16],
        msix_vectors: u16,
        irq: Arc<InterruptState>,
    ) -> Self {
        Self {
            device_features,
            driver_features: 0,
            device_feature_select: 0,
            driver_feature_select: 0,
            status: 0,
            queue_select: 0,
            queues: queue_max_sizes
                .iter()
                .copied()
                .map(QueueConfig::new)
                .collect(),
            msix_vectors,
            irq,
        }
    }

    /// Features the driver acknowledged (final once FEATURES_OK is set).
    pub(crate) fn driver_features(&self) -> u64 {
        self.driver_features
    }

    /// Whether the device serves its queues: DRIVER_OK was accepted and
    /// the device has not failed since.
    pub(crate) fn active(&self) -> bool {
        self.status & STATUS_DRIVER_OK != 0 && !self.irq.needs_reset()
    }

    /// The driver's status bits plus the device's NEEDS_RESET.
    pub(crate) fn status(&self) -> u8 {
        if self.irq.needs_reset() {
            self.status | STATUS_NEEDS_RESET
        } else {
            self.status
        }
    }

    /// A guest read of `data.len()` bytes at `offset`.
    pub(crate) fn read(&self, offset: u64, data: &mut [u8]) {
        let value = self.read_reg(offset, data.len()).unwrap_or_else(|| {
            guest_warn!(
                "virtio-pci: ignored {}-byte common config read at {offset:#x}",
                data.len()
            );
            0
        });
        write_le(value, data);
    }

    /// A guest write of `data` at `offset`.
    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) -> StatusAction {
        match read_le(data) {
            Some(value) if self.write_reg(offset, data.len(), value) => {
                if offset == DEVICE_STATUS {
                    return self.write_status(u8::try_from(value).unwrap_or(0));
                }
            }
            _ => guest_warn!(
                "virtio-pci: ignored {}-byte common config write at {offset:#x}",
                data.len()
            ),
        }
        StatusAction::None
    }

    fn selected(&self) -> Option<&QueueConfig> {
        self.queues.get(usize::from(self.queue_select))
    }

    /// The selected queue, if it exists and may still be configured: the
    /// driver must set everything before enabling it (§4.1.4.3.2).
    fn selected_configurable(&mut self) -> Option<&mut QueueConfig> {
        self.queues
            .get_mut(usize::from(self.queue_select))
            .filter(|q| !q.enabled)
    }

    fn read_reg(&self, offset: u64, len: usize) -> Option<u64> {
        let queue = self.selected();
        let value = match (offset, len) {
            (DEVICE_FEATURE_SELECT, 4) => self.device_feature_select.into(),
            (DEVICE_FEATURE, 4) => feature_word(self.device_features, self.device_feature_select),
            (DRIVER_FEATURE_SELECT, 4) => self.driver_feature_select.into(),
            (DRIVER_FEATURE, 4) => feature_word(self.driver_features, self.driver_feature_select),
            (CONFIG_MSIX_VECTOR, 2) => self.irq.config_vector().into(),
            (NUM_QUEUES, 2) => u64::try_from(self.queues.len()).unwrap_or(0),
            (DEVICE_STATUS, 1) => self.status().into(),
            // The block configuration never changes, so neither does this.
            (CONFIG_GENERATION, 1) => 0,
            (QUEUE_SELECT, 2) => self.queue_select.into(),
            (QUEUE_SIZE, 2) => queue.map_or(0, |q| q.size.into()),
            (QUEUE_MSIX_VECTOR, 2) => self
                .irq
                .queue_vector(usize::from(self.queue_select))
                .unwrap_or(VIRTIO_MSI_NO_VECTOR)
                .into(),
            (QUEUE_ENABLE, 2) => queue.map_or(0, |q| q.enabled.into()),
            // Queue n notifies at notify_off n times the notify multiplier.
            (QUEUE_NOTIFY_OFF, 2) => queue.map_or(0, |_| self.queue_select.into()),
            (QUEUE_DESC..=QUEUE_ADDR_END, 4 | 8) => {
                let base = offset & !7;
                let addr = queue.map_or(0, |q| match base {
                    QUEUE_DESC => q.desc,
                    QUEUE_DRIVER => q.driver,
                    _ => q.device,
                });
                match (offset & 7, len) {
                    (0, 8) => addr,
                    (0, 4) => addr & 0xffff_ffff,
                    (4, 4) => addr.checked_shr(32).unwrap_or(0),
                    _ => return None,
                }
            }
            _ => return None,
        };
        Some(value)
    }

    /// Applies a register write; false when nothing lives at that
    /// offset/width. Writes the state machine refuses still return true.
    fn write_reg(&mut self, offset: u64, len: usize, value: u64) -> bool {
        let word = u32::try_from(value).unwrap_or(0);
        let half = u16::try_from(value).unwrap_or(0);
        match (offset, len) {
            (DEVICE_FEATURE_SELECT, 4) => self.device_feature_select = word,
            (DRIVER_FEATURE_SELECT, 4) => self.driver_feature_select = word,
            (DRIVER_FEATURE, 4) => self.write_driver_features(word),
            (CONFIG_MSIX_VECTOR, 2) => self.irq.set_config_vector(self.check_vector(half)),
            // Handled by the caller, which needs to return an action.
            (DEVICE_STATUS, 1) => {}
            (QUEUE_SELECT, 2) => self.queue_select = half,
            (QUEUE_SIZE, 2) => self.write_queue_size(half),
            (QUEUE_MSIX_VECTOR, 2) => {
                let vector = self.check_vector(half);
                self.irq
                    .set_queue_vector(usize::from(self.queue_select), vector);
            }
            (QUEUE_ENABLE, 2) => {
                // Only 1 is meaningful: disabling one queue needs
                // VIRTIO_F_RING_RESET, which is not offered.
                if let Some(q) = self.selected_configurable().filter(|_| half == 1) {
                    q.enabled = true;
                }
            }
            (QUEUE_DESC..=QUEUE_ADDR_END, 4 | 8) => self.write_queue_addr(offset, len, value),
            _ => return false,
        }
        true
    }

    /// §4.1.5.1.2 (MSI-X vector configuration): a vector the device cannot
    /// map reads back as NO_VECTOR,
    /// which is how the driver learns the assignment failed.
    fn check_vector(&self, vector: u16) -> u16 {
        if vector < self.msix_vectors {
            vector
        } else {
            VIRTIO_MSI_NO_VECTOR
        }
    }

    fn write_driver_features(&mut self, word: u32) {
        if self.status & STATUS_FEATURES_OK != 0 {
            guest_warn!("virtio-pci: driver features written after FEATURES_OK");
            return;
        }
        let word = u64::from(word);
        self.driver_features = match self.driver_feature_select {
            0 => (self.driver_features & !0xffff_ffff) | word,
            1 => (self.driver_features & 0xffff_ffff) | word.checked_shl(32).unwrap_or(0),
            // Feature bits above 63 do not exist; the driver writes zeros.
            _ => self.driver_features,
        };
    }

    fn write_queue_size(&mut self, size: u16) {
        let Some(q) = self.selected_configurable() else {
            return;
        };
        if size_fits(size, q.max_size) {
            q.size = size;
        } else {
            guest_warn!("virtio-pci: rejected queue size {size}");
        }
    }

    fn write_queue_addr(&mut self, offset: u64, len: usize, value: u64) {
        let Some(addr) = self
            .selected_configurable()
            .and_then(|q| q.addr_mut(offset & !7))
        else {
            return;
        };
        *addr = match (offset & 7, len) {
            (0, 8) => value,
            (0, 4) => (*addr & !0xffff_ffff) | value,
            (4, 4) => (*addr & 0xffff_ffff) | value.checked_shl(32).unwrap_or(0),
            // A 64-bit access at the high half: not a register.
            _ => *addr,
        };
    }

    /// §2.1.1: the driver only ever adds bits, except by writing 0 (reset).
    fn write_status(&mut self, value: u8) -> StatusAction {
        if value == 0 {
            return StatusAction::Reset;
        }
        // NEEDS_RESET is the device's to set; the driver's copy is ignored.
        let old = self.status;
        let mut new = value & !STATUS_NEEDS_RESET;
        if old & !new != 0 {
            guest_warn!("virtio-pci: driver cleared status bits {old:#x} -> {new:#x}");
            return StatusAction::None;
        }
        let added = new & !old;
        if added & STATUS_FEATURES_OK != 0
            && !features_acceptable(self.driver_features, self.device_features)
        {
            // §3.1.1: the driver re-reads status and sees FEATURES_OK unset.
            guest_warn!(
                "virtio-pci: refused features {:#x} (offered {:#x})",
                self.driver_features,
                self.device_features
            );
            new &= !STATUS_FEATURES_OK;
        }
        let mut action = StatusAction::None;
        if added & STATUS_DRIVER_OK != 0 {
            if new & STATUS_FEATURES_OK == 0 {
                guest_warn!("virtio-pci: DRIVER_OK without FEATURES_OK");
                new &= !STATUS_DRIVER_OK;
            } else {
                action = StatusAction::Activate;
            }
        }
        self.status = new;
        action
    }

    /// The driver's settings and the interrupt state, for a snapshot.
    pub(crate) fn state(&self) -> SavedCommon {
        SavedCommon {
            device_features: self.device_features,
            driver_features: self.driver_features,
            device_feature_select: self.device_feature_select,
            driver_feature_select: self.driver_feature_select,
            status: self.status,
            needs_reset: self.irq.needs_reset(),
            isr: self.irq.isr(),
            queue_select: self.queue_select,
            config_vector: self.irq.config_vector(),
            queue_vectors: (0..self.queues.len())
                .map(|q| self.irq.queue_vector(q).unwrap_or(VIRTIO_MSI_NO_VECTOR))
                .collect(),
            queues: self.queues.clone(),
        }
    }

    /// Puts back a saved state, accepting only what a driver could have
    /// programmed here: the same offered features and queue count, queue
    /// sizes the guest could write, acked features that were offered, a
    /// status the state machine can reach, existing vectors and ISR bits.
    /// Nothing changes on error. Queue addresses are checked when the
    /// queues are built, as at DRIVER_OK.
    pub(crate) fn set_state(&mut self, saved: &SavedCommon) -> Result<(), StateError> {
        self.check_state(saved)?;
        self.driver_features = saved.driver_features;
        self.device_feature_select = saved.device_feature_select;
        self.driver_feature_select = saved.driver_feature_select;
        self.status = saved.status;
        self.queue_select = saved.queue_select;
        for (q, s) in self.queues.iter_mut().zip(&saved.queues) {
            *q = QueueConfig {
                max_size: q.max_size,
                ..s.clone()
            };
        }
        self.irq.restore(saved.isr, saved.needs_reset);
        self.irq.set_config_vector(saved.config_vector);
        for (index, &vector) in saved.queue_vectors.iter().enumerate() {
            self.irq.set_queue_vector(index, vector);
        }
        Ok(())
    }

    fn check_state(&self, saved: &SavedCommon) -> Result<(), StateError> {
        if saved.device_features != self.device_features {
            return Err(StateError::DeviceFeatures {
                saved: saved.device_features,
                here: self.device_features,
            });
        }
        for count in [saved.queues.len(), saved.queue_vectors.len()] {
            if count != self.queues.len() {
                return Err(StateError::QueueCount {
                    saved: count,
                    here: self.queues.len(),
                });
            }
        }
        for (index, (s, q)) in saved.queues.iter().zip(&self.queues).enumerate() {
            if !size_fits(s.size, q.max_size) {
                return Err(StateError::QueueSize {
                    index,
                    size: s.size,
                    max: q.max_size,
                });
            }
        }
        let unoffered = saved.driver_features & !self.device_features;
        if unoffered != 0 {
            return Err(StateError::UnofferedFeatures(unoffered));
        }
        let status = saved.status;
        let reachable = status & STATUS_NEEDS_RESET == 0
            && (status & STATUS_FEATURES_OK == 0
                || features_acceptable(saved.driver_features, self.device_features))
            && (status & STATUS_DRIVER_OK == 0 || status & STATUS_FEATURES_OK != 0);
        if !reachable {
            return Err(StateError::Status(status));
        }
        if saved.isr & !(ISR_QUEUE | ISR_CONFIG) != 0 {
            return Err(StateError::Isr(saved.isr));
        }
        let bad_vector = std::iter::once(&saved.config_vector)
            .chain(&saved.queue_vectors)
            .find(|&&v| v != VIRTIO_MSI_NO_VECTOR && v >= self.msix_vectors);
        match bad_vector {
            Some(&v) => Err(StateError::Vector(v)),
            None => Ok(()),
        }
    }

    /// Device reset (VIRTIO 1.2 §4.1.4.3.1): back to power-on values.
    pub(crate) fn reset(&mut self) {
        self.driver_features = 0;
        self.device_feature_select = 0;
        self.driver_feature_select = 0;
        self.status = 0;
        self.queue_select = 0;
        for q in &mut self.queues {
            *q = QueueConfig::new(q.max_size);
        }
        self.irq.reset();
    }

    /// Turns the programmed queue settings into queues, applying the
    /// transport features (EVENT_IDX). Whether each queue is usable against
    /// guest memory is the device's check at activation.
    pub(crate) fn build_queues(&self) -> Result<Vec<Queue>, ActivateError> {
        let event_idx = self.driver_features & feature_bit(VIRTIO_RING_F_EVENT_IDX) != 0;
        self.queues
            .iter()
            .enumerate()
            .map(|(index, cfg)| {
                let setup = |field| {
                    move |source| ActivateError::InvalidQueue {
                        index,
                        field,
                        source,
                    }
                };
                let mut q = Queue::new(cfg.max_size).map_err(setup("maximum size"))?;
                q.try_set_size(cfg.size).map_err(setup("size"))?;
                q.try_set_desc_table_address(GuestAddress(cfg.desc))
                    .map_err(setup("descriptor table address"))?;
                q.try_set_avail_ring_address(GuestAddress(cfg.driver))
                    .map_err(setup("driver area address"))?;
                q.try_set_used_ring_address(GuestAddress(cfg.device))
                    .map_err(setup("device area address"))?;
                q.set_event_idx(event_idx);
                q.set_ready(cfg.enabled);
                Ok(q)
            })
            .collect()
    }
}

/// The 64-bit mask of feature bit `bit` (a bindings constant, always < 64).
pub(crate) const fn feature_bit(bit: u32) -> u64 {
    1u64 << bit
}

/// A size the driver may select: split virtqueues need a power of two
/// (virtio-queue enforces it) no larger than the device's maximum.
fn size_fits(size: u16, max_size: u16) -> bool {
    size.is_power_of_two() && size <= max_size
}

/// A subset of what was offered, and the modern interface (VERSION_1),
/// the only one this transport speaks.
fn features_acceptable(driver: u64, device: u64) -> bool {
    driver & !device == 0 && driver & feature_bit(VIRTIO_F_VERSION_1) != 0
}

/// Word `select` of a 64-bit feature set; words above 1 are all zero.
fn feature_word(features: u64, select: u32) -> u64 {
    match select {
        0 => features & 0xffff_ffff,
        1 => features.checked_shr(32).unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use virtio_bindings::virtio_config::{VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER};

    use super::*;

    const VERSION_1: u64 = feature_bit(VIRTIO_F_VERSION_1);
    const EVENT_IDX: u64 = feature_bit(VIRTIO_RING_F_EVENT_IDX);
    const OFFERED: u64 = VERSION_1 | EVENT_IDX | 1 << 9;
    const ACK_DRIVER: u8 = (VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER) as u8;

    fn cfg() -> CommonConfig {
        CommonConfig::new(OFFERED, &[256, 64], 3, Arc::new(InterruptState::new(2)))
    }

    fn rd(c: &CommonConfig, offset: u64, len: usize) -> u64 {
        let mut data = vec![0xffu8; len];
        c.read(offset, &mut data);
        read_le(&data).unwrap()
    }

    fn wr(c: &mut CommonConfig, offset: u64, len: usize, value: u64) -> StatusAction {
        c.write(offset, &value.to_le_bytes()[..len])
    }

    fn ack_features(c: &mut CommonConfig, features: u64) {
        wr(c, DRIVER_FEATURE_SELECT, 4, 0);
        wr(c, DRIVER_FEATURE, 4, features & 0xffff_ffff);
        wr(c, DRIVER_FEATURE_SELECT, 4, 1);
        wr(c, DRIVER_FEATURE, 4, features >> 32);
    }

    #[test]
    fn device_features_by_word() {
        let mut c = cfg();
        assert_eq!(rd(&c, DEVICE_FEATURE, 4), OFFERED & 0xffff_ffff);
        wr(&mut c, DEVICE_FEATURE_SELECT, 4, 1);
        assert_eq!(rd(&c, DEVICE_FEATURE_SELECT, 4), 1);
        assert_eq!(rd(&c, DEVICE_FEATURE, 4), OFFERED >> 32);
        wr(&mut c, DEVICE_FEATURE_SELECT, 4, 2);
        assert_eq!(rd(&c, DEVICE_FEATURE, 4), 0);
        assert_eq!(rd(&c, NUM_QUEUES, 2), 2);
    }

    #[test]
    fn negotiation_succeeds() {
        let mut c = cfg();
        wr(&mut c, DEVICE_STATUS, 1, ACK_DRIVER.into());
        ack_features(&mut c, VERSION_1 | EVENT_IDX);
        assert_eq!(rd(&c, DRIVER_FEATURE, 4), (VERSION_1 | EVENT_IDX) >> 32);
        let s = ACK_DRIVER | STATUS_FEATURES_OK;
        assert_eq!(wr(&mut c, DEVICE_STATUS, 1, s.into()), StatusAction::None);
        assert_eq!(rd(&c, DEVICE_STATUS, 1), u64::from(s));
        assert_eq!(c.driver_features(), VERSION_1 | EVENT_IDX);
        // Features are frozen once accepted.
        ack_features(&mut c, VERSION_1);
        assert_eq!(c.driver_features(), VERSION_1 | EVENT_IDX);
        let s = s | STATUS_DRIVER_OK;
        assert_eq!(
            wr(&mut c, DEVICE_STATUS, 1, s.into()),
            StatusAction::Activate
        );
        assert_eq!(c.status(), s);
        // Setting it again is not a new activation.
        assert_eq!(wr(&mut c, DEVICE_STATUS, 1, s.into()), StatusAction::None);
    }

    #[test]
    fn features_ok_refused_for_unoffered_or_legacy() {
        for bad in [VERSION_1 | 1 << 3, 1 << 9, VERSION_1 | 1 << 63] {
            let mut c = cfg();
            wr(&mut c, DEVICE_STATUS, 1, ACK_DRIVER.into());
            ack_features(&mut c, bad);
            wr(
                &mut c,
                DEVICE_STATUS,
                1,
                (ACK_DRIVER | STATUS_FEATURES_OK).into(),
            );
            assert_eq!(c.status() & STATUS_FEATURES_OK, 0, "features {bad:#x}");
            // And DRIVER_OK cannot follow.
            let s = ACK_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK;
            assert_eq!(wr(&mut c, DEVICE_STATUS, 1, s.into()), StatusAction::None);
            assert_eq!(c.status(), ACK_DRIVER);
        }
    }

    #[test]
    fn status_bits_cannot_be_cleared_and_needs_reset_sticks() {
        let mut c = cfg();
        wr(&mut c, DEVICE_STATUS, 1, ACK_DRIVER.into());
        wr(&mut c, DEVICE_STATUS, 1, VIRTIO_CONFIG_S_ACKNOWLEDGE.into());
        assert_eq!(c.status(), ACK_DRIVER);
        c.irq.set_needs_reset();
        wr(&mut c, DEVICE_STATUS, 1, ACK_DRIVER.into());
        assert_eq!(
            rd(&c, DEVICE_STATUS, 1),
            u64::from(ACK_DRIVER | STATUS_NEEDS_RESET)
        );
        assert_eq!(wr(&mut c, DEVICE_STATUS, 1, 0), StatusAction::Reset);
        c.reset();
        assert_eq!(c.status(), 0);
    }

    #[test]
    fn queue_setup_and_build() {
        let mut c = cfg();
        ack_features(&mut c, VERSION_1 | EVENT_IDX);
        wr(&mut c, QUEUE_SELECT, 2, 1);
        assert_eq!(rd(&c, QUEUE_SIZE, 2), 64);
        assert_eq!(rd(&c, QUEUE_NOTIFY_OFF, 2), 1);
        wr(&mut c, QUEUE_SIZE, 2, 100); // not a power of two
        wr(&mut c, QUEUE_SIZE, 2, 128); // above the maximum
        assert_eq!(rd(&c, QUEUE_SIZE, 2), 64);
        wr(&mut c, QUEUE_SIZE, 2, 32);
        wr(&mut c, QUEUE_DESC, 4, 0x1000);
        wr(&mut c, QUEUE_DESC + 4, 4, 0x1);
        wr(&mut c, QUEUE_DRIVER, 8, 0x2000);
        wr(&mut c, QUEUE_DEVICE, 4, 0x3000);
        wr(&mut c, QUEUE_MSIX_VECTOR, 2, 2);
        wr(&mut c, QUEUE_ENABLE, 2, 1);
        assert_eq!(rd(&c, QUEUE_DESC, 8), 0x1_0000_1000);
        assert_eq!(rd(&c, QUEUE_DESC + 4, 4), 1);
        assert_eq!(rd(&c, QUEUE_DRIVER, 4), 0x2000);
        assert_eq!(rd(&c, QUEUE_MSIX_VECTOR, 2), 2);
        assert_eq!(rd(&c, QUEUE_ENABLE, 2), 1);
        // Enabled queues are frozen.
        wr(&mut c, QUEUE_SIZE, 2, 16);
        wr(&mut c, QUEUE_DEVICE, 4, 0x4000);
        assert_eq!(rd(&c, QUEUE_SIZE, 2), 32);
        assert_eq!(rd(&c, QUEUE_DEVICE, 4), 0x3000);

        let queues = c.build_queues().unwrap();
        assert_eq!(queues.len(), 2);
        assert!(!queues[0].ready());
        let q = &queues[1];
        assert!(q.ready() && q.event_idx_enabled());
        assert_eq!((q.size(), q.desc_table()), (32, 0x1_0000_1000));
        assert_eq!((q.avail_ring(), q.used_ring()), (0x2000, 0x3000));
    }

    #[test]
    fn misaligned_queue_rejected_at_build() {
        let mut c = cfg();
        wr(&mut c, QUEUE_DESC, 4, 0x1001);
        assert!(matches!(
            c.build_queues(),
            Err(ActivateError::InvalidQueue { index: 0, .. })
        ));
    }

    #[test]
    fn vectors_validated() {
        let mut c = cfg();
        wr(&mut c, CONFIG_MSIX_VECTOR, 2, 0);
        assert_eq!(rd(&c, CONFIG_MSIX_VECTOR, 2), 0);
        wr(&mut c, CONFIG_MSIX_VECTOR, 2, 3);
        assert_eq!(
            rd(&c, CONFIG_MSIX_VECTOR, 2),
            u64::from(VIRTIO_MSI_NO_VECTOR)
        );
        wr(&mut c, QUEUE_MSIX_VECTOR, 2, 1);
        assert_eq!(rd(&c, QUEUE_MSIX_VECTOR, 2), 1);
        wr(&mut c, QUEUE_MSIX_VECTOR, 2, 0x8000);
        assert_eq!(
            rd(&c, QUEUE_MSIX_VECTOR, 2),
            u64::from(VIRTIO_MSI_NO_VECTOR)
        );
    }

    #[test]
    fn absent_queue_reads_zero_and_ignores_writes() {
        let mut c = cfg();
        wr(&mut c, QUEUE_SELECT, 2, 9);
        wr(&mut c, QUEUE_SIZE, 2, 4);
        wr(&mut c, QUEUE_ENABLE, 2, 1);
        wr(&mut c, QUEUE_MSIX_VECTOR, 2, 1);
        assert_eq!(rd(&c, QUEUE_SIZE, 2), 0);
        assert_eq!(rd(&c, QUEUE_ENABLE, 2), 0);
        assert_eq!(
            rd(&c, QUEUE_MSIX_VECTOR, 2),
            u64::from(VIRTIO_MSI_NO_VECTOR)
        );
        assert_eq!(rd(&c, QUEUE_DESC, 8), 0);
    }

    #[test]
    fn odd_accesses_ignored() {
        let mut c = cfg();
        for (offset, len) in [
            (DEVICE_STATUS, 2),
            (QUEUE_SIZE, 4),
            (QUEUE_DESC + 4, 8),
            (0x40, 4),
        ] {
            assert_eq!(rd(&c, offset, len), 0);
            assert_eq!(wr(&mut c, offset, len, u64::MAX), StatusAction::None);
        }
        assert_eq!(c.write(DEVICE_STATUS, &[1; 9]), StatusAction::None);
        assert_eq!(c.status(), 0);
        assert_eq!(rd(&c, QUEUE_DESC, 8), 0);
    }

    #[test]
    fn reset_restores_defaults() {
        let mut c = cfg();
        wr(&mut c, DEVICE_STATUS, 1, ACK_DRIVER.into());
        ack_features(&mut c, VERSION_1);
        wr(&mut c, QUEUE_SELECT, 2, 1);
        wr(&mut c, QUEUE_SIZE, 2, 16);
        wr(&mut c, QUEUE_DESC, 8, 0x1000);
        wr(&mut c, QUEUE_MSIX_VECTOR, 2, 1);
        wr(&mut c, CONFIG_MSIX_VECTOR, 2, 0);
        wr(&mut c, QUEUE_ENABLE, 2, 1);
        assert_eq!(wr(&mut c, DEVICE_STATUS, 1, 0), StatusAction::Reset);
        c.reset();
        assert_eq!(c.driver_features(), 0);
        assert_eq!(rd(&c, QUEUE_SELECT, 2), 0);
        assert_eq!(
            rd(&c, CONFIG_MSIX_VECTOR, 2),
            u64::from(VIRTIO_MSI_NO_VECTOR)
        );
        wr(&mut c, QUEUE_SELECT, 2, 1);
        assert_eq!(rd(&c, QUEUE_SIZE, 2), 64);
        assert_eq!(rd(&c, QUEUE_ENABLE, 2), 0);
        assert_eq!(rd(&c, QUEUE_DESC, 8), 0);
        assert_eq!(
            rd(&c, QUEUE_MSIX_VECTOR, 2),
            u64::from(VIRTIO_MSI_NO_VECTOR)
        );
    }

    #[test]
    fn state_round_trip() {
        let mut c = cfg();
        wr(&mut c, DEVICE_STATUS, 1, ACK_DRIVER.into());
        ack_features(&mut c, VERSION_1 | EVENT_IDX);
        wr(
            &mut c,
            DEVICE_STATUS,
            1,
            (ACK_DRIVER | STATUS_FEATURES_OK).into(),
        );
        wr(&mut c, DEVICE_FEATURE_SELECT, 4, 1);
        wr(&mut c, CONFIG_MSIX_VECTOR, 2, 0);
        wr(&mut c, QUEUE_SELECT, 2, 1);
        wr(&mut c, QUEUE_SIZE, 2, 16);
        wr(&mut c, QUEUE_DESC, 8, 0x1000);
        wr(&mut c, QUEUE_MSIX_VECTOR, 2, 2);
        wr(&mut c, QUEUE_ENABLE, 2, 1);
        c.irq.set_needs_reset();
        let saved = c.state();

        let mut fresh = cfg();
        fresh.set_state(&saved).unwrap();
        assert_eq!(fresh.state(), saved);
        assert_eq!(rd(&fresh, DEVICE_FEATURE, 4), OFFERED >> 32);
        assert_eq!(rd(&fresh, QUEUE_SIZE, 2), 16);
        assert_eq!(rd(&fresh, QUEUE_MSIX_VECTOR, 2), 2);
        assert_eq!(
            fresh.status(),
            ACK_DRIVER | STATUS_FEATURES_OK | STATUS_NEEDS_RESET
        );
        // The queue's maximum stays the device's.
        wr(&mut fresh, QUEUE_SELECT, 2, 0);
        wr(&mut fresh, QUEUE_SIZE, 2, 256);
        assert_eq!(rd(&fresh, QUEUE_SIZE, 2), 256);

        // A device offering other features refuses it, unchanged.
        let mut other =
            CommonConfig::new(VERSION_1, &[256, 64], 3, Arc::new(InterruptState::new(2)));
        assert!(matches!(
            other.set_state(&saved),
            Err(StateError::DeviceFeatures { .. })
        ));
        assert_eq!(other.status(), 0);
    }
}
