// SPDX-License-Identifier: Apache-2.0
//! Doorbell ioeventfds registered after a restore instead of inside it.
//!
//! Each KVM_IOEVENTFD copies the VM's whole I/O bus and waits for an SRCU
//! grace period, so registering N doorbells costs N grace periods and
//! grows with N² (8192 take 267 ms on this project's host, see
//! docs/benchmarks.md); a restore registers every device's doorbells at
//! once, and on a migration's destination that sits in the blackout.
//! While [`DeferredIoEvents::defer`] is on, registrations are only
//! recorded; [`DeferredIoEvents::flush`] makes them afterwards from a
//! thread of its own, while the guest runs. Until then a doorbell write
//! exits to the VMM as MMIO, where every device signals the same eventfd
//! (the path it takes when a registration fails): nothing is lost, the
//! first doorbells are only slower.
//!
//! Removals are as slow, and a VM being torn down removes every doorbell
//! of every device: [`DeferredIoEvents::close`] skips them, since KVM
//! drops the ioeventfds with the VM (a source with 4096 QPs spent longer
//! than the test host's 30 s on them after its hand-over).

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use pci::IoEventRegistrar;
use vmm_sys_util::eventfd::EventFd;

use crate::sandbox;

/// A KVM registration is keyed as KVM keys it: address and datamatch.
type Key = (u64, Option<u32>);

/// Wraps the KVM registrar every device of a VM shares.
pub struct DeferredIoEvents {
    kvm: Arc<dyn IoEventRegistrar>,
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    deferring: bool,
    /// The VM is going away: nothing is registered or removed any more.
    closing: bool,
    /// Each deferred registration's eventfd: the device's own if it shares
    /// it (`register_shared`), else a copy (the same eventfd: KVM signals
    /// it whichever descriptor registered it).
    by_key: BTreeMap<Key, Arc<EventFd>>,
}

impl DeferredIoEvents {
    pub fn new(kvm: Arc<dyn IoEventRegistrar>) -> Self {
        Self {
            kvm,
            pending: Mutex::new(Pending::default()),
        }
    }

    /// From now on registrations are recorded, not made.
    pub fn defer(&self) {
        crate::lock(&self.pending).deferring = true;
    }

    /// Stops deferring and makes the recorded registrations, if any, on a
    /// thread of its own, one at a time, so that a device registering or
    /// removing a doorbell meanwhile waits for one ioctl at most. The
    /// thread's handle is for tests: it ends on its own.
    pub fn flush(self: &Arc<Self>) -> io::Result<Option<std::thread::JoinHandle<()>>> {
        let deferred = {
            let mut pending = crate::lock(&self.pending);
            pending.deferring = false;
            pending.by_key.len()
        };
        if deferred == 0 {
            return Ok(None);
        }
        let this = Arc::clone(self);
        std::thread::Builder::new()
            .name("ioeventfds".into())
            .spawn(move || {
                sandbox::enter(sandbox::Kind::Device);
                let start = Instant::now();
                while this.register_one() {}
                log::info!(
                    "Registered {deferred} deferred doorbell ioeventfds in {} ms",
                    start.elapsed().as_millis()
                );
            })
            .map(Some)
    }

    /// The VM is being torn down: registrations and removals from now on
    /// are not made (KVM drops every ioeventfd with the VM), and the ones
    /// still deferred are dropped.
    pub fn close(&self) {
        let mut pending = crate::lock(&self.pending);
        pending.closing = true;
        pending.by_key.clear();
    }

    /// Makes one deferred registration; false when none is left.
    fn register_one(&self) -> bool {
        let mut pending = crate::lock(&self.pending);
        let Some(((addr, datamatch), fd)) = pending.by_key.pop_first() else {
            return false;
        };
        if let Err(e) = self.kvm.register(&fd, addr, datamatch) {
            // The device believes it registered: its doorbell keeps taking
            // the MMIO path, which works.
            log::warn!("Deferred ioeventfd at {addr:#x} failed: {e}");
        }
        true
    }
}

impl DeferredIoEvents {
    /// Registers `fd` at once, or records the eventfd `keep` gives while
    /// deferring.
    fn register_or_keep(
        &self,
        fd: &EventFd,
        addr: u64,
        datamatch: Option<u32>,
        keep: impl FnOnce() -> io::Result<Arc<EventFd>>,
    ) -> io::Result<()> {
        let mut pending = crate::lock(&self.pending);
        if pending.closing {
            return Ok(());
        }
        if !pending.deferring {
            return self.kvm.register(fd, addr, datamatch);
        }
        // One search per registration: a restore records thousands.
        match pending.by_key.entry((addr, datamatch)) {
            Entry::Occupied(_) => Err(io::Error::from_raw_os_error(libc::EEXIST)),
            Entry::Vacant(slot) => {
                slot.insert(keep()?);
                Ok(())
            }
        }
    }
}

impl IoEventRegistrar for DeferredIoEvents {
    fn register(&self, fd: &EventFd, addr: u64, datamatch: Option<u32>) -> io::Result<()> {
        self.register_or_keep(fd, addr, datamatch, || fd.try_clone().map(Arc::new))
    }

    fn register_shared(
        &self,
        fd: &Arc<EventFd>,
        addr: u64,
        datamatch: Option<u32>,
    ) -> io::Result<()> {
        self.register_or_keep(fd, addr, datamatch, || Ok(Arc::clone(fd)))
    }

    fn unregister(&self, fd: &EventFd, addr: u64, datamatch: Option<u32>) -> io::Result<()> {
        let mut pending = crate::lock(&self.pending);
        if pending.closing || pending.by_key.remove(&(addr, datamatch)).is_some() {
            return Ok(());
        }
        self.kvm.unregister(fd, addr, datamatch)
    }
}

#[cfg(test)]
mod tests {
    use pci::test_utils::MockIoEvents;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    use super::*;

    fn setup() -> (Arc<MockIoEvents>, Arc<DeferredIoEvents>) {
        let kvm = Arc::new(MockIoEvents::default());
        let deferred = Arc::new(DeferredIoEvents::new(kvm.clone()));
        (kvm, deferred)
    }

    /// Registrations while deferring reach KVM only once flushed; those
    /// removed meanwhile never do; afterwards registrations go straight
    /// through again.
    #[test]
    fn deferred_registrations_are_made_after_the_flush() {
        let (kvm, io) = setup();
        let fds: Vec<EventFd> = (0..3)
            .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
            .collect();
        io.register(&fds[0], 0x1000, None).unwrap();
        io.defer();
        io.register(&fds[1], 0x2000, Some(7)).unwrap();
        io.register(&fds[2], 0x3000, Some(8)).unwrap();
        // KVM's rule holds while deferred: one registration per key.
        assert!(io.register(&fds[2], 0x3000, Some(8)).is_err());
        io.unregister(&fds[2], 0x3000, Some(8)).unwrap();
        // What was registered before deferring is removed from KVM.
        io.unregister(&fds[0], 0x1000, None).unwrap();
        assert_eq!(kvm.count(), 0);

        io.flush().unwrap().unwrap().join().unwrap();
        assert_eq!(kvm.registrations(), [(0x2000, Some(7))]);
        // KVM signals the device's own eventfd.
        assert!(kvm.signal(0x2000, 7));
        assert_eq!(fds[1].read().unwrap(), 1);

        io.register(&fds[0], 0x4000, None).unwrap();
        assert_eq!(kvm.count(), 2);
        io.unregister(&fds[1], 0x2000, Some(7)).unwrap();
        assert_eq!(kvm.registrations(), [(0x4000, None)]);
    }

    /// Once closed, removals (a device torn down with its VM) make no KVM
    /// call, registrations neither, and the deferred ones are dropped.
    #[test]
    fn a_closing_vm_removes_nothing_one_by_one() {
        let (kvm, io) = setup();
        let fds: Vec<EventFd> = (0..3)
            .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
            .collect();
        io.register(&fds[0], 0x1000, Some(1)).unwrap();
        io.defer();
        io.register(&fds[1], 0x1000, Some(2)).unwrap();
        io.close();
        io.unregister(&fds[0], 0x1000, Some(1)).unwrap();
        io.register(&fds[2], 0x1000, Some(3)).unwrap();
        assert_eq!(kvm.registrations(), [(0x1000, Some(1))]);
        assert!(io.flush().unwrap().is_none());
        assert_eq!(kvm.count(), 1);
    }

    /// A shared eventfd is kept while deferred, not duplicated (a system
    /// call per doorbell in a restore), and let go once registered.
    #[test]
    fn a_shared_eventfd_is_kept_not_copied() {
        let (kvm, io) = setup();
        let fd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        io.defer();
        io.register_shared(&fd, 0x2000, Some(1)).unwrap();
        io.register_shared(&fd, 0x2000, Some(2)).unwrap();
        assert_eq!(Arc::strong_count(&fd), 3, "copied instead of shared");
        assert!(io.register_shared(&fd, 0x2000, Some(2)).is_err());
        io.flush().unwrap().unwrap().join().unwrap();
        assert_eq!(Arc::strong_count(&fd), 1);
        assert!(kvm.signal(0x2000, 2));
        assert_eq!(fd.read().unwrap(), 1);
    }

    /// A VM dropped before its flush (a failed incoming migration) leaves
    /// nothing registered.
    #[test]
    fn nothing_is_registered_without_a_flush() {
        let (kvm, io) = setup();
        io.defer();
        let fd = EventFd::new(EFD_NONBLOCK).unwrap();
        io.register(&fd, 0x2000, Some(1)).unwrap();
        drop(io);
        assert_eq!(kvm.count(), 0);
    }
}
