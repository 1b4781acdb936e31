// SPDX-License-Identifier: Apache-2.0
//! Interrupt delivery from a device to its driver.
//!
//! The driver programs vector numbers on the vCPU thread (common config)
//! while the worker thread raises interrupts, so the routing lives in atomics
//! both sides read without a lock. Only the MSI-X table itself is behind a
//! mutex, shared with the transport that forwards table accesses to it. The
//! device-side DEVICE_NEEDS_RESET status bit lives here too, because the
//! worker is what discovers most fatal errors (a corrupt ring).

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use pci::Msix;

use super::VIRTIO_MSI_NO_VECTOR;

/// VIRTIO 1.2 §4.1.4.5: ISR bit for "a queue has new used buffers".
pub(crate) const ISR_QUEUE: u8 = 0x1;
/// VIRTIO 1.2 §4.1.4.5: ISR bit for "the device configuration changed".
pub(crate) const ISR_CONFIG: u8 = 0x2;

/// Interrupt routing as programmed by the driver, the ISR status byte and
/// the device's NEEDS_RESET flag.
#[derive(Debug)]
pub(crate) struct InterruptState {
    isr: AtomicU8,
    needs_reset: AtomicBool,
    config_vector: AtomicU16,
    queue_vectors: Box<[AtomicU16]>,
}

impl InterruptState {
    pub(crate) fn new(queues: usize) -> Self {
        Self {
            isr: AtomicU8::new(0),
            needs_reset: AtomicBool::new(false),
            config_vector: AtomicU16::new(VIRTIO_MSI_NO_VECTOR),
            queue_vectors: (0..queues)
                .map(|_| AtomicU16::new(VIRTIO_MSI_NO_VECTOR))
                .collect(),
        }
    }

    pub(crate) fn config_vector(&self) -> u16 {
        self.config_vector.load(Ordering::Acquire)
    }

    pub(crate) fn set_config_vector(&self, vector: u16) {
        self.config_vector.store(vector, Ordering::Release);
    }

    /// The vector of `queue`, or `None` for a queue the device does not have.
    pub(crate) fn queue_vector(&self, queue: usize) -> Option<u16> {
        self.queue_vectors
            .get(queue)
            .map(|v| v.load(Ordering::Acquire))
    }

    pub(crate) fn set_queue_vector(&self, queue: usize, vector: u16) {
        if let Some(v) = self.queue_vectors.get(queue) {
            v.store(vector, Ordering::Release);
        }
    }

    /// Reads and clears the ISR status (VIRTIO 1.2 §4.1.4.5: read-to-clear).
    pub(crate) fn take_isr(&self) -> u8 {
        self.isr.swap(0, Ordering::AcqRel)
    }

    /// The ISR status without clearing it, for a snapshot.
    pub(crate) fn isr(&self) -> u8 {
        self.isr.load(Ordering::Acquire)
    }

    fn raise_isr(&self, bits: u8) {
        self.isr.fetch_or(bits, Ordering::AcqRel);
    }

    /// Whether the device has reported DEVICE_NEEDS_RESET.
    pub(crate) fn needs_reset(&self) -> bool {
        self.needs_reset.load(Ordering::Acquire)
    }

    pub(crate) fn set_needs_reset(&self) {
        self.needs_reset.store(true, Ordering::Release);
    }

    /// Puts back a saved ISR status and NEEDS_RESET flag.
    pub(crate) fn restore(&self, isr: u8, needs_reset: bool) {
        self.isr.store(isr, Ordering::Release);
        self.needs_reset.store(needs_reset, Ordering::Release);
    }

    /// Device reset: no vectors, nothing pending, no error.
    pub(crate) fn reset(&self) {
        self.isr.store(0, Ordering::Release);
        self.needs_reset.store(false, Ordering::Release);
        self.set_config_vector(VIRTIO_MSI_NO_VECTOR);
        for v in self.queue_vectors.iter() {
            v.store(VIRTIO_MSI_NO_VECTOR, Ordering::Release);
        }
    }
}

/// What a device holds to interrupt its driver; cheap to clone.
#[derive(Clone)]
pub(crate) struct Interrupt {
    state: Arc<InterruptState>,
    msix: Arc<Mutex<Msix>>,
}

impl Interrupt {
    pub(crate) fn new(state: Arc<InterruptState>, msix: Arc<Mutex<Msix>>) -> Self {
        Self { state, msix }
    }

    /// Tells the driver that `queue` has new used buffers.
    pub(crate) fn signal_queue(&self, queue: usize) {
        if let Some(vector) = self.state.queue_vector(queue) {
            self.signal(ISR_QUEUE, vector);
        }
    }

    /// Enters DEVICE_NEEDS_RESET and, as §2.1.2 asks, sends a configuration
    /// change notification so the driver notices.
    pub(crate) fn report_failure(&self) {
        self.state.set_needs_reset();
        self.signal(ISR_CONFIG, self.state.config_vector());
    }

    /// The ISR bit is set even when MSI-X is in use, as QEMU does: a driver
    /// with MSI-X enabled never reads it (§4.1.4.5.2), and one without sees a
    /// consistent value. There is no INTx line; this device requires MSI-X.
    fn signal(&self, isr: u8, vector: u16) {
        self.state.raise_isr(isr);
        if vector != VIRTIO_MSI_NO_VECTOR {
            self.msix
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .trigger(vector);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_and_isr() {
        let state = InterruptState::new(2);
        assert_eq!(state.config_vector(), VIRTIO_MSI_NO_VECTOR);
        assert_eq!(state.queue_vector(1), Some(VIRTIO_MSI_NO_VECTOR));
        assert_eq!(state.queue_vector(2), None);
        state.set_queue_vector(1, 3);
        state.set_queue_vector(7, 3);
        state.set_config_vector(0);
        assert_eq!(state.queue_vector(1), Some(3));
        state.raise_isr(ISR_QUEUE);
        state.raise_isr(ISR_CONFIG);
        assert_eq!(state.take_isr(), ISR_QUEUE | ISR_CONFIG);
        assert_eq!(state.take_isr(), 0);
        state.raise_isr(ISR_QUEUE);
        state.set_needs_reset();
        assert!(state.needs_reset());
        state.reset();
        assert!(!state.needs_reset());
        assert_eq!(state.take_isr(), 0);
        assert_eq!(state.config_vector(), VIRTIO_MSI_NO_VECTOR);
        assert_eq!(state.queue_vector(1), Some(VIRTIO_MSI_NO_VECTOR));
    }
}
