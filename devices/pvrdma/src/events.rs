// SPDX-License-Identifier: Apache-2.0
//! Interrupts (MSI-X vectors, ICR, IMR) and the two rings the device fills
//! for the driver: async events (vector 1) and CQ notifications (vector 2).
//!
//! Both rings come from the DSR; their element counts are computed with
//! the driver's own formula, `(num_pages - 1) * 4096 / entry size`, which
//! is not a power of two, so the device does its own occupancy accounting
//! (see `pvrdma_abi::ring`) and drops an entry rather than overwrite one
//! the driver has not consumed.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use pci::Msix;
use pvrdma_abi::regs::{icr, Vector};
use pvrdma_abi::wqe::{Cqne, Eqe};
use vm_memory::GuestMemory;

use crate::metrics::Metrics;
use crate::ring::{ProducerRing, RingError};

/// The device's interrupt state, shared by the vCPU and worker threads.
#[derive(Debug)]
pub(crate) struct Interrupts {
    msix: Mutex<Msix>,
    /// Non-zero suppresses every interrupt (the driver writes ~0 at
    /// teardown, 0 before ACTIVATE).
    imr: AtomicU32,
    /// Causes raised since the last ICR read.
    icr: AtomicU32,
}

impl Interrupts {
    pub(crate) fn new(msix: Msix) -> Self {
        Self {
            msix: Mutex::new(msix),
            // Masked until the driver unmasks, as after a hardware reset.
            imr: AtomicU32::new(u32::MAX),
            icr: AtomicU32::new(0),
        }
    }

    pub(crate) fn msix(&self) -> MutexGuard<'_, Msix> {
        self.msix.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the cause and signals `vector` unless masked by IMR.
    pub(crate) fn raise(&self, vector: Vector) {
        let cause = match vector {
            Vector::Response => icr::RESPONSE,
            Vector::Async => icr::ASYNC,
            Vector::Cq => icr::CQ,
        };
        self.icr.fetch_or(cause, Ordering::AcqRel);
        if self.imr.load(Ordering::Acquire) == 0 {
            self.msix().trigger(vector as u16);
        }
    }

    /// ICR is read-to-clear.
    pub(crate) fn take_icr(&self) -> u32 {
        self.icr.swap(0, Ordering::AcqRel)
    }

    pub(crate) fn imr(&self) -> u32 {
        self.imr.load(Ordering::Acquire)
    }

    pub(crate) fn set_imr(&self, value: u32) {
        self.imr.store(value, Ordering::Release);
    }

    /// Causes not yet read, for a snapshot (reading would clear them).
    pub(crate) fn icr(&self) -> u32 {
        self.icr.load(Ordering::Acquire)
    }

    pub(crate) fn set_icr(&self, value: u32) {
        self.icr.store(value, Ordering::Release);
    }

    /// Forgets causes (device RESET).
    pub(crate) fn clear(&self) {
        self.icr.store(0, Ordering::Release);
    }
}

/// The async event and CQ notification rings of one DSR.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct EventRings {
    async_ring: ProducerRing,
    cq_ring: ProducerRing,
}

impl EventRings {
    pub(crate) fn new(async_ring: ProducerRing, cq_ring: ProducerRing) -> Self {
        Self {
            async_ring,
            cq_ring,
        }
    }

    /// Posts async event `event_type` about `info` and raises vector 1.
    pub(crate) fn post_async<M: GuestMemory>(
        &mut self,
        mem: &M,
        irq: &Interrupts,
        metrics: &Metrics,
        event_type: u32,
        info: u32,
    ) {
        let entry = Eqe { event_type, info };
        match self.async_ring.push(mem, &entry) {
            Ok(()) => {
                metrics.event_posted.inc();
                irq.raise(Vector::Async);
            }
            Err(e) => report_drop(&metrics.event_dropped, "async event", &e),
        }
    }

    /// Tells the driver CQ `cq` has a completion it asked to hear about,
    /// and raises vector 2.
    pub(crate) fn post_cq_notify<M: GuestMemory>(
        &mut self,
        mem: &M,
        irq: &Interrupts,
        metrics: &Metrics,
        cq: u32,
    ) {
        match self.cq_ring.push(mem, &Cqne { info: cq }) {
            Ok(()) => {
                metrics.cq_notify_posted.inc();
                irq.raise(Vector::Cq);
            }
            Err(e) => report_drop(&metrics.cq_notify_dropped, "CQ notification", &e),
        }
    }
}

fn report_drop(counter: &crate::metrics::Counter, what: &str, e: &RingError) {
    guest_warn!(counter, "{what} dropped: {e}");
}
