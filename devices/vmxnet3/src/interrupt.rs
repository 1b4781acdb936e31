// SPDX-License-Identifier: Apache-2.0
//! Interrupts: vmxnet3's per-vector mask registers (`IMR[i]`) and
//! auto-masking, on top of MSI-X.
//!
//! A vector raised while its IMR bit is set stays pending and fires when
//! the driver clears the bit, so a completion written between the end of
//! a NAPI poll and the unmask is never missed. In auto-mask mode (what
//! GET_CONF_INTR offers and Linux then asks for in `intrConf.autoMask`)
//! the device sets the IMR bit itself whenever the vector fires; the
//! driver clears it when its poll is done.
//!
//! DriverShared's `intrCtrl` DISABLE_ALL bit is deliberately not consulted:
//! Linux unmasks every IMR first and clears DISABLE_ALL afterwards with no
//! register write, so a device honouring it would keep interrupts that
//! arrived in between pending until some later event. The IMR bits alone
//! say what the driver wants (it sets them all whenever it sets the bit).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pci::Msix;
use serde::{Deserialize, Serialize};

use crate::metrics::Vmxnet3Metrics;
use crate::regs::NUM_VECTORS;

const VECTORS: usize = NUM_VECTORS as usize;

/// The IMR bits, the interrupts they hold back and the mask mode: all
/// guest-visible, so saved for migration (any value is valid).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IntrState {
    masked: [bool; VECTORS],
    pending: [bool; VECTORS],
    auto_mask: bool,
}

impl IntrState {
    /// Delivers vector `index` if it is pending and unmasked.
    fn sync(&mut self, index: usize, msix: &Mutex<Msix>, metrics: &Vmxnet3Metrics) {
        let (Some(masked), Some(pending)) =
            (self.masked.get_mut(index), self.pending.get_mut(index))
        else {
            return;
        };
        if *masked || !*pending {
            return;
        }
        *pending = false;
        *masked = self.auto_mask;
        metrics.intr_fired.inc();
        // index < 25 fits u16.
        lock(msix).trigger(u16::try_from(index).unwrap_or(u16::MAX));
    }
}

/// The device's interrupt state, shared by the register side and the worker.
#[derive(Debug)]
pub(crate) struct Interrupts {
    state: Mutex<IntrState>,
    msix: Mutex<Msix>,
    metrics: Arc<Vmxnet3Metrics>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Interrupts {
    /// Every vector starts masked, as after RESET_DEV.
    pub(crate) fn new(msix: Msix, metrics: Arc<Vmxnet3Metrics>) -> Self {
        Interrupts {
            state: Mutex::new(IntrState {
                masked: [true; VECTORS],
                pending: [false; VECTORS],
                auto_mask: true,
            }),
            msix: Mutex::new(msix),
            metrics,
        }
    }

    /// The MSI-X table, for config-space and BAR accesses.
    pub(crate) fn msix(&self) -> MutexGuard<'_, Msix> {
        lock(&self.msix)
    }

    /// Raises vector `index` (an index validated at activation).
    pub(crate) fn trigger(&self, index: u8) {
        let index = usize::from(index);
        let mut state = lock(&self.state);
        if let Some(pending) = state.pending.get_mut(index) {
            *pending = true;
        }
        if state.masked.get(index).copied().unwrap_or(true) {
            self.metrics.intr_held.inc();
        }
        state.sync(index, &self.msix, &self.metrics);
    }

    /// A write of `IMR[index]`.
    pub(crate) fn set_masked(&self, index: usize, masked: bool) {
        let mut state = lock(&self.state);
        if let Some(m) = state.masked.get_mut(index) {
            *m = masked;
        }
        state.sync(index, &self.msix, &self.metrics);
    }

    /// A read of `IMR[index]`.
    pub(crate) fn masked(&self, index: usize) -> bool {
        lock(&self.state).masked.get(index).copied().unwrap_or(true)
    }

    /// `intrConf.autoMask` from DriverShared, at activation.
    pub(crate) fn set_auto_mask(&self, on: bool) {
        lock(&self.state).auto_mask = on;
    }

    pub(crate) fn save(&self) -> IntrState {
        lock(&self.state).clone()
    }

    /// Puts saved state back. Nothing is delivered: the device never saves
    /// a vector both pending and unmasked, and one from a doctored stream
    /// fires at its next trigger or unmask.
    pub(crate) fn restore(&self, saved: &IntrState) {
        *lock(&self.state) = saved.clone();
    }

    /// RESET_DEV: every vector masked, nothing pending.
    pub(crate) fn reset(&self) {
        let mut state = lock(&self.state);
        state.masked = [true; VECTORS];
        state.pending = [false; VECTORS];
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use pci::test_utils::{enable_all_vectors, MockMsi};
    use pci::{BarKind, BarSpec, PciConfiguration, PciHeader};

    use super::*;

    fn setup() -> (Arc<MockMsi>, Interrupts, Arc<Vmxnet3Metrics>) {
        let mut config = PciConfiguration::new(PciHeader::default());
        config
            .add_bar(BarSpec {
                index: 2,
                size: 0x2000,
                kind: BarKind::Mmio32,
                prefetchable: false,
            })
            .unwrap();
        let router = Arc::new(MockMsi::default());
        let msix = Msix::new(&mut config, router.clone(), NUM_VECTORS, 2, 0, 0x1000).unwrap();
        let metrics = Arc::new(Vmxnet3Metrics::default());
        let intr = Interrupts::new(msix, metrics.clone());
        enable_all_vectors(&mut config, &mut intr.msix());
        (router, intr, metrics)
    }

    #[test]
    fn masked_vectors_stay_pending_and_auto_mask_rearms_the_mask() {
        let (router, intr, metrics) = setup();
        intr.trigger(3);
        assert_eq!(router.fired(3), 0, "masked after reset");
        assert_eq!((metrics.intr_held.get(), metrics.intr_fired.get()), (1, 0));
        intr.set_masked(3, false);
        assert_eq!(router.fired(3), 1, "pending vector fires on unmask");
        assert_eq!((metrics.intr_held.get(), metrics.intr_fired.get()), (1, 1));
        assert!(intr.masked(3), "auto-masked when it fired");
        intr.trigger(3);
        intr.trigger(3);
        assert_eq!(router.fired(3), 0);
        intr.set_masked(3, false);
        assert_eq!(router.fired(3), 1, "one interrupt for both");

        intr.set_auto_mask(false);
        intr.set_masked(3, false);
        intr.trigger(3);
        intr.trigger(3);
        assert_eq!(router.fired(3), 2, "active mode: the driver masks");
        assert_eq!((metrics.intr_held.get(), metrics.intr_fired.get()), (3, 4));
        assert!(!intr.masked(3));

        intr.trigger(200);
        intr.set_masked(200, false);
        assert!(intr.masked(200), "out of range reads masked");
        intr.trigger(4);
        intr.reset();
        intr.set_masked(4, false);
        assert_eq!(router.fired(4), 0, "reset drops pending interrupts");
    }
}
