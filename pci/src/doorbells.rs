// SPDX-License-Identifier: Apache-2.0
//! A device's doorbell eventfds as ioeventfds at addresses inside one of
//! its BARs, following the BAR as the guest moves it or turns memory
//! decoding off and on.

use std::io;
use std::sync::Arc;

use log::warn;
use vmm_sys_util::eventfd::EventFd;

use crate::IoEventRegistrar;

/// Where doorbell `index` sits for a given base address (`None` if the
/// address overflows).
pub type DoorbellAddress = fn(base: u64, index: usize) -> Option<u64>;

/// Keeps a device's doorbells registered at one base address, all of them
/// or none: when one fails the others are removed again and the guest's
/// writes take the MMIO path, which signals the same eventfds. The
/// eventfds stay the device's; every call passes the same slice.
pub struct IoEventDoorbells {
    ioevents: Arc<dyn IoEventRegistrar>,
    address: DoorbellAddress,
    /// The log prefix ("vmxnet3") and what a doorbell serves ("TX queue").
    owner: &'static str,
    what: &'static str,
    /// Where the doorbells are registered now, if they are.
    base: Option<u64>,
}

impl std::fmt::Debug for IoEventDoorbells {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoEventDoorbells")
            .field("owner", &self.owner)
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl IoEventDoorbells {
    pub fn new(
        ioevents: Arc<dyn IoEventRegistrar>,
        address: DoorbellAddress,
        owner: &'static str,
        what: &'static str,
    ) -> Self {
        Self {
            ioevents,
            address,
            owner,
            what,
            base: None,
        }
    }

    /// Where the doorbells are registered, if they are.
    pub fn base(&self) -> Option<u64> {
        self.base
    }

    /// Moves the doorbells to `want`: unregistered with `None`, else
    /// registered there (or, on failure, nowhere).
    pub fn sync(&mut self, want: Option<u64>, evts: &[EventFd]) {
        if want == self.base {
            return;
        }
        if let Some(old) = self.base.take() {
            self.unregister(old, evts, evts.len());
        }
        if let Some(base) = want {
            if self.register(base, evts) {
                self.base = Some(base);
            }
        }
    }

    /// Registers all doorbells at `base`, or none.
    fn register(&self, base: u64, evts: &[EventFd]) -> bool {
        for (index, evt) in evts.iter().enumerate() {
            let result = (self.address)(base, index)
                .ok_or_else(|| io::Error::other("doorbell address overflows"))
                .and_then(|addr| self.ioevents.register(evt, addr, None));
            if let Err(e) = result {
                warn!(
                    "{}: no ioeventfd for {} {index}, its doorbell writes will exit to the VMM: {e}",
                    self.owner, self.what
                );
                self.unregister(base, evts, index);
                return false;
            }
        }
        true
    }

    /// Unregisters the first `count` doorbells at `base`.
    fn unregister(&self, base: u64, evts: &[EventFd], count: usize) {
        for (index, evt) in evts.iter().enumerate().take(count) {
            if let Some(addr) = (self.address)(base, index) {
                if let Err(e) = self.ioevents.unregister(evt, addr, None) {
                    warn!(
                        "{}: failed to unregister the ioeventfd of {} {index}: {e}",
                        self.owner, self.what
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    use super::*;
    use crate::test_utils::MockIoEvents;

    fn address(base: u64, index: usize) -> Option<u64> {
        base.checked_add(8 * u64::try_from(index).ok()?)
    }

    fn setup() -> (Arc<MockIoEvents>, IoEventDoorbells, Vec<EventFd>) {
        let ioevents = Arc::new(MockIoEvents::strict());
        let doorbells = IoEventDoorbells::new(ioevents.clone(), address, "test", "queue");
        let evts = (0..3).map(|_| EventFd::new(EFD_NONBLOCK).unwrap());
        (ioevents, doorbells, evts.collect())
    }

    #[test]
    fn follows_the_base() {
        let (ioevents, mut doorbells, evts) = setup();
        doorbells.sync(Some(0x1000), &evts);
        assert_eq!(doorbells.base(), Some(0x1000));
        let at = |io: &MockIoEvents| {
            io.registrations()
                .into_iter()
                .map(|r| r.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(at(&ioevents), vec![0x1000, 0x1008, 0x1010]);
        doorbells.sync(Some(0x1000), &evts);
        assert_eq!(ioevents.count(), 3, "same base: nothing to do");
        doorbells.sync(Some(0x2000), &evts);
        assert_eq!(at(&ioevents), vec![0x2000, 0x2008, 0x2010]);
        doorbells.sync(None, &evts);
        assert_eq!((doorbells.base(), ioevents.count()), (None, 0));
    }

    #[test]
    fn all_or_none() {
        let (ioevents, mut doorbells, evts) = setup();
        // The third address overflows: the first two are removed again.
        doorbells.sync(Some(u64::MAX - 8), &evts);
        assert_eq!((doorbells.base(), ioevents.count()), (None, 0));
        ioevents.set_fail(true);
        doorbells.sync(Some(0x1000), &evts);
        assert_eq!((doorbells.base(), ioevents.count()), (None, 0));
        ioevents.set_fail(false);
        doorbells.sync(Some(0x1000), &evts);
        assert_eq!(ioevents.count(), 3);
    }
}
