// SPDX-License-Identifier: Apache-2.0
//! PCI for pvrdma-vmm: a host bridge, configuration space reached through
//! ports 0xCF8/0xCFC, BAR sizing and placement, multi-function slots and
//! MSI-X.
//!
//! Devices live below the VMM (`vmm` wires them, a device crate never
//! reaches into `vmm`), so everything a device needs from the hypervisor is
//! expressed by the two small traits here: [`MsiRouter`] (MSI-X vectors as
//! irqfds behind KVM GSI routes) and [`IoEventRegistrar`] (doorbells as
//! ioeventfds). The VMM implements them on KVM; unit tests use mocks.

// Guest input is hostile: no unwrap/expect outside tests (clippy.toml
// allows them in #[cfg(test)] code).
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::io;
use std::sync::Arc;

use vm_migration::{Pausable, Snapshottable};
use vmm_sys_util::eventfd::EventFd;

/// One MSI message as the guest programs it into an MSI-X table entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MsiMessage {
    pub addr_lo: u32,
    pub addr_hi: u32,
    pub data: u32,
}

/// An interrupt line from a device to the guest: an eventfd that KVM turns
/// into an MSI (irqfd) once a route is installed for `gsi`.
#[derive(Debug)]
pub struct MsiVector {
    /// The KVM GSI the route is installed under.
    pub gsi: u32,
    /// Writing 1 here injects the MSI in the kernel, without a VMM exit.
    pub irqfd: EventFd,
}

/// Delivers MSIs to the guest. Implemented by the VMM over KVM GSI routing
/// and irqfd; devices reach it only through their MSI-X capability.
pub trait MsiRouter: Send + Sync {
    /// Reserves a GSI and registers an irqfd for it (no route installed yet).
    fn allocate(&self) -> io::Result<MsiVector>;
    /// Installs (`Some`) or removes (`None`) the MSI route of `gsi`.
    fn set_route(&self, gsi: u32, msg: Option<MsiMessage>) -> io::Result<()>;
    /// Installs several routes at once, as a restore does: KVM replaces its
    /// whole table on each update and waits for a grace period, so one
    /// update for all is cheaper than one per vector.
    fn set_routes(&self, routes: &[(u32, MsiMessage)]) -> io::Result<()> {
        routes
            .iter()
            .try_for_each(|&(gsi, msg)| self.set_route(gsi, Some(msg)))
    }
    /// Drops the irqfd registration and frees the GSI.
    fn release(&self, vector: &MsiVector) -> io::Result<()>;
}

/// Registers doorbells: a 1/2/4/8-byte guest write to MMIO address `addr`
/// (optionally only with value `datamatch`) signals `fd` in the kernel and
/// never exits to the VMM. Implemented by the VMM over KVM ioeventfds.
pub trait IoEventRegistrar: Send + Sync {
    fn register(&self, fd: &EventFd, addr: u64, datamatch: Option<u32>) -> io::Result<()>;
    /// [`Self::register`] of an eventfd the caller shares: a registrar
    /// that keeps the eventfd for later (a deferred registration) holds
    /// this reference instead of a duplicate of the descriptor, a system
    /// call less per doorbell (thousands in a restore).
    fn register_shared(
        &self,
        fd: &Arc<EventFd>,
        addr: u64,
        datamatch: Option<u32>,
    ) -> io::Result<()> {
        self.register(fd, addr, datamatch)
    }
    fn unregister(&self, fd: &EventFd, addr: u64, datamatch: Option<u32>) -> io::Result<()>;
}

/// What a device gets from the VMM at creation time.
#[derive(Clone)]
pub struct DeviceHooks {
    pub msi: Arc<dyn MsiRouter>,
    pub ioevents: Arc<dyn IoEventRegistrar>,
}

impl std::fmt::Debug for DeviceHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceHooks")
    }
}

mod bus;
mod configuration;
mod counters;
mod doorbells;
mod msix;
// Test support (mock hypervisor hooks), not device code: it may panic.
#[cfg(any(test, feature = "test-utils"))]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub mod test_utils;

pub use bus::{PciBus, PciBusError};
pub use configuration::{BarKind, BarSpec, PciConfiguration, PciConfigurationState, PciHeader};
pub use counters::{Counter, DeviceCounters, QueuePairCounters};
pub use doorbells::{DoorbellAddress, IoEventDoorbells};
pub use msix::{
    msix_pba_size, msix_table_size, Msix, MsixError, MsixState, MAX_MSIX_VECTORS, MSIX_CAP_ID,
};

/// A PCI function on the bus. Generic config-space behaviour (read-only
/// fields, BAR sizing, the capability list, MSI-X control bits) lives in
/// [`PciConfiguration`]; a device only adds its registers behind BARs.
///
/// For migration every function is [`Pausable`] (its own threads stop
/// touching guest memory and the network) and [`Snapshottable`] (the bus
/// saves the configuration space; the device saves the rest, its MSI-X
/// table included, and on restore re-derives doorbells and routes from the
/// configuration space already put back).
pub trait PciDevice: Send + Pausable + Snapshottable {
    fn config(&self) -> &PciConfiguration;
    fn config_mut(&mut self) -> &mut PciConfiguration;
    /// A guest read of `data.len()` bytes at `offset` inside BAR `bar`.
    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]);
    /// A guest write of `data` at `offset` inside BAR `bar`.
    fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]);
    /// Config register `reg` (dword index) was written, after the generic
    /// handling; devices react to e.g. the MSI-X enable bit here.
    fn config_written(&mut self, _reg: usize) {}
    /// The guest moved BAR `bar` from `old` to `new` (both guest-physical);
    /// devices with ioeventfds inside that BAR re-register them here.
    fn bar_moved(&mut self, _bar: usize, _old: u64, _new: u64) {}
}
