// SPDX-License-Identifier: Apache-2.0
//! Mock hypervisor hooks for device-model tests (feature `test-utils`):
//! MSI vectors whose firing a test can observe, and an ioeventfd
//! registrar that behaves like KVM's (unique address + datamatch, a write
//! that matches nothing falls through to MMIO).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use pci::{IoEventRegistrar, MsiMessage, MsiRouter, MsiVector};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Hands out irqfds (GSI = allocation order) and keeps a copy of each.
#[derive(Debug, Default)]
pub struct MockMsi {
    irqfds: Mutex<Vec<EventFd>>,
}

impl MockMsi {
    /// How often vector `gsi` fired since the last call.
    pub fn fired(&self, gsi: usize) -> u64 {
        lock(&self.irqfds)
            .get(gsi)
            .and_then(|fd| fd.read().ok())
            .unwrap_or(0)
    }
}

impl MsiRouter for MockMsi {
    fn allocate(&self) -> io::Result<MsiVector> {
        let irqfd = EventFd::new(EFD_NONBLOCK)?;
        let mut irqfds = lock(&self.irqfds);
        irqfds.push(irqfd.try_clone()?);
        let gsi = u32::try_from(irqfds.len() - 1).map_err(io::Error::other)?;
        Ok(MsiVector { gsi, irqfd })
    }

    fn set_route(&self, _gsi: u32, _msg: Option<MsiMessage>) -> io::Result<()> {
        Ok(())
    }

    fn release(&self, _vector: &MsiVector) -> io::Result<()> {
        Ok(())
    }
}

/// One registered ioeventfd.
#[derive(Debug)]
pub struct Registration {
    pub fd: EventFd,
    pub addr: u64,
    pub datamatch: Option<u32>,
}

/// Records ioeventfds like KVM: a second registration of the same address
/// and datamatch fails with EEXIST.
#[derive(Debug, Default)]
pub struct MockIoEvents {
    regs: Mutex<Vec<Registration>>,
    fail: AtomicBool,
}

impl MockIoEvents {
    /// Makes every later registration fail (as with RLIMIT_NOFILE hit).
    pub fn set_fail(&self, fail: bool) {
        self.fail.store(fail, Ordering::SeqCst);
    }

    pub fn count(&self) -> usize {
        lock(&self.regs).len()
    }

    /// (address, datamatch) of every registration, sorted.
    pub fn registrations(&self) -> Vec<(u64, Option<u32>)> {
        let mut all: Vec<_> = lock(&self.regs)
            .iter()
            .map(|r| (r.addr, r.datamatch))
            .collect();
        all.sort_unstable();
        all
    }

    /// The eventfd KVM would signal for a 4-byte write of `value` at
    /// `addr`, if any.
    pub fn lookup(&self, addr: u64, value: u32) -> Option<EventFd> {
        lock(&self.regs)
            .iter()
            .find(|r| r.addr == addr && r.datamatch.is_none_or(|d| d == value))
            .and_then(|r| r.fd.try_clone().ok())
    }
}

impl IoEventRegistrar for MockIoEvents {
    fn register(&self, fd: &EventFd, addr: u64, datamatch: Option<u32>) -> io::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(24));
        }
        let mut regs = lock(&self.regs);
        if regs
            .iter()
            .any(|r| r.addr == addr && r.datamatch == datamatch)
        {
            return Err(io::Error::from_raw_os_error(17));
        }
        regs.push(Registration {
            fd: fd.try_clone()?,
            addr,
            datamatch,
        });
        Ok(())
    }

    fn unregister(&self, _fd: &EventFd, addr: u64, datamatch: Option<u32>) -> io::Result<()> {
        let mut regs = lock(&self.regs);
        let before = regs.len();
        regs.retain(|r| !(r.addr == addr && r.datamatch == datamatch));
        if regs.len() == before {
            return Err(io::Error::from_raw_os_error(2));
        }
        Ok(())
    }
}
