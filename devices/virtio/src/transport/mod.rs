// SPDX-License-Identifier: Apache-2.0
//! Modern virtio-pci transport (VIRTIO 1.2 §4.1), split into the common
//! configuration state machine ([`common_cfg`]), interrupt delivery
//! ([`interrupt`]) and the PCI function itself ([`pci`]).
//!
//! A device plugs in through the small [`VirtioDevice`] trait, so the
//! transport knows nothing about block I/O and the block device knows
//! nothing about PCI.

pub(crate) mod common_cfg;
pub(crate) mod interrupt;
pub(crate) mod pci;

use ::pci::MsixError;
use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueT};
use vm_migration::Pausable;
use vmm_sys_util::eventfd::EventFd;

use self::interrupt::Interrupt;

/// VIRTIO 1.2 §4.1.5.1.2: the value of a vector register meaning "no vector".
pub(crate) const VIRTIO_MSI_NO_VECTOR: u16 = 0xffff;

/// Why a device could not start when the driver set DRIVER_OK. The device
/// then reports DEVICE_NEEDS_RESET instead of touching guest memory.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ActivateError {
    #[error("Queue {index} has invalid {field}")]
    InvalidQueue {
        index: usize,
        field: &'static str,
        #[source]
        source: virtio_queue::Error,
    },
    #[error("Queue {0} was not enabled by the driver")]
    QueueNotEnabled(usize),
    #[error("Queue {0} lies outside guest memory")]
    QueueOutsideMemory(usize),
    #[error("Expected {expected} queues, got {got}")]
    WrongQueueCount { expected: usize, got: usize },
}

/// Why a saved transport state (live migration, snapshots) was refused.
/// It may come from another host, so it is checked as guest writes are.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StateError {
    #[error("Saved device offered features {saved:#x}, this one offers {here:#x}")]
    DeviceFeatures { saved: u64, here: u64 },
    #[error("Saved device configuration differs from this device's")]
    DeviceConfig,
    #[error("Saved state has {saved} queues, the device has {here}")]
    QueueCount { saved: usize, here: usize },
    #[error("Queue {index} size {size} is not a power of two up to {max}")]
    QueueSize { index: usize, size: u16, max: u16 },
    #[error("Driver features {0:#x} were not offered")]
    UnofferedFeatures(u64),
    #[error("Device status {0:#x} cannot be reached by a driver")]
    Status(u8),
    #[error("ISR status {0:#x} has undefined bits")]
    Isr(u8),
    #[error("MSI-X vector {0} does not exist")]
    Vector(u16),
    #[error("Queue positions do not match whether the device is active")]
    Positions,
    #[error("Failed to restore the MSI-X table")]
    Msix(#[source] MsixError),
    #[error("Failed to reactivate the device")]
    Activate(#[source] ActivateError),
}

/// Where a live split queue stands: all it keeps besides what the driver
/// programmed through the common configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct QueuePosition {
    next_avail: u16,
    next_used: u16,
}

impl QueuePosition {
    pub(crate) fn of(queue: &Queue) -> Self {
        Self {
            next_avail: queue.next_avail(),
            next_used: queue.next_used(),
        }
    }

    /// Any value is memory-safe: the worker checks the ring against it as
    /// against a guest's (an available index more than a queue ahead makes
    /// it report NEEDS_RESET).
    fn apply(self, queue: &mut Queue) {
        queue.set_next_avail(self.next_avail);
        queue.set_next_used(self.next_used);
    }
}

/// Device-specific half of a virtio device, driven by the transport.
///
/// `Pausable`: once `pause` returns, the device has completed every request
/// it took and takes no new ones; `resume` serves what the driver queued
/// meanwhile.
pub(crate) trait VirtioDevice: Send + Pausable {
    /// The device's name in a VM snapshot.
    fn id(&self) -> &'static str;
    /// Virtio device id (VIRTIO 1.2 §5; 2 = block).
    fn device_type(&self) -> u16;
    /// Feature bits offered to the driver, transport bits included.
    fn features(&self) -> u64;
    /// Maximum size of each queue; the slice length is the queue count.
    fn queue_max_sizes(&self) -> &[u16];
    /// One eventfd per queue, signalled for each driver notification.
    fn queue_events(&self) -> &[EventFd];
    /// The device-specific configuration structure (read-only here).
    fn config(&self) -> &[u8];
    /// DRIVER_OK was set: start serving `queues`, built from what the driver
    /// programmed (features already applied).
    fn activate(&mut self, queues: Vec<Queue>, interrupt: Interrupt) -> Result<(), ActivateError>;
    /// The driver reset the device: once this returns, the device must no
    /// longer touch the queues or guest memory (VIRTIO 1.2 §2.4.1).
    fn reset(&mut self);
    /// Where each queue stands while the device is active, `None` when it
    /// is not. Taken while paused, for a snapshot.
    fn queue_positions(&self) -> Option<Vec<QueuePosition>>;
}

/// Decodes a little-endian register value of 1 to 8 bytes.
fn read_le(data: &[u8]) -> Option<u64> {
    let mut bytes = [0u8; 8];
    bytes.get_mut(..data.len())?.copy_from_slice(data);
    Some(u64::from_le_bytes(bytes))
}

/// Encodes the low `data.len()` bytes (at most 8) of `value`, little endian.
fn write_le(value: u64, data: &mut [u8]) {
    if let Some(bytes) = value.to_le_bytes().get(..data.len()) {
        data.copy_from_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn le_round_trip() {
        let mut data = [0u8; 2];
        write_le(0x1234_5678, &mut data);
        assert_eq!(data, [0x78, 0x56]);
        assert_eq!(read_le(&data), Some(0x5678));
        assert_eq!(read_le(&[0u8; 9]), None);
        let mut long = [0xaau8; 9];
        write_le(1, &mut long);
        assert_eq!(long, [0xaa; 9], "over-long accesses are left alone");
    }
}
