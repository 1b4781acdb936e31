// SPDX-License-Identifier: Apache-2.0
//! The KVM VM: memory slots, in-kernel irqchip and PIT, and the two hooks
//! devices get from the hypervisor (`pci::MsiRouter` over GSI routing +
//! irqfd, `pci::IoEventRegistrar` over ioeventfd).

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

use kvm_bindings::{
    kvm_irq_routing_entry, kvm_pit_config, kvm_userspace_memory_region, CpuId, KvmIrqRouting,
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_IRQ_ROUTING_IRQCHIP,
    KVM_IRQ_ROUTING_MSI, KVM_MAX_CPUID_ENTRIES, KVM_MEM_LOG_DIRTY_PAGES, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{IoEventAddress, Kvm, NoDatamatch, VmFd};
use pci::{IoEventRegistrar, MsiMessage, MsiRouter, MsiVector};
use vm_memory::{Address, GuestMemoryBackend as _, GuestMemoryRegion};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::arch::layout;
use crate::ioevents::DeferredIoEvents;
use crate::memory::GuestMemory;

#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    #[error("Failed to open /dev/kvm")]
    Open(#[source] kvm_ioctls::Error),
    #[error("Failed to create the VM")]
    CreateVm(#[source] kvm_ioctls::Error),
    #[error("Failed to set up the VM ({0})")]
    Setup(&'static str, #[source] kvm_ioctls::Error),
    #[error("Failed to register guest memory with KVM")]
    MemorySlot(#[source] kvm_ioctls::Error),
    #[error("KVM supports at most {max} vCPUs, {requested} requested")]
    TooManyVcpus { requested: u8, max: usize },
}

/// Legacy GSIs are the 24 IOAPIC pins; MSI routes start above them.
const IOAPIC_PINS: u32 = 24;
/// KVM_MAX_IRQ_ROUTES: the routing table cannot hold more entries.
const MAX_GSI: u32 = 4096;

pub struct Vm {
    fd: Arc<VmFd>,
    supported_cpuid: CpuId,
    /// The MSRs KVM saves and restores for a vCPU (KVM_GET_MSR_INDEX_LIST).
    msr_list: Vec<u32>,
    max_vcpus: usize,
    routes: Arc<GsiRoutes>,
    ioevents: Arc<DeferredIoEvents>,
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm")
            .field("max_vcpus", &self.max_vcpus)
            .finish_non_exhaustive()
    }
}

impl Vm {
    /// Creates the VM with an in-kernel LAPIC/IOAPIC/PIC and PIT, and
    /// registers every RAM region of `mem` as a memory slot.
    pub fn new(mem: &GuestMemory) -> Result<Self, KvmError> {
        let kvm = Kvm::new().map_err(KvmError::Open)?;
        let fd = kvm.create_vm().map_err(KvmError::CreateVm)?;
        fd.set_tss_address(layout::KVM_TSS_START as usize)
            .map_err(|e| KvmError::Setup("TSS address", e))?;
        fd.set_identity_map_address(layout::KVM_IDENTITY_MAP_START)
            .map_err(|e| KvmError::Setup("identity map address", e))?;
        fd.create_irq_chip()
            .map_err(|e| KvmError::Setup("irqchip", e))?;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        fd.create_pit2(pit).map_err(|e| KvmError::Setup("PIT", e))?;
        register_memory(&fd, mem, 0)?;
        let supported_cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| KvmError::Setup("supported CPUID", e))?;
        let msr_list = kvm
            .get_msr_index_list()
            .map_err(|e| KvmError::Setup("MSR index list", e))?
            .as_slice()
            .to_vec();
        let fd = Arc::new(fd);
        let routes = Arc::new(GsiRoutes::new(fd.clone()));
        routes.commit().map_err(|e| {
            KvmError::Setup(
                "GSI routing",
                kvm_ioctls::Error::new(e.raw_os_error().unwrap_or(libc::EINVAL)),
            )
        })?;
        let ioevents = Arc::new(DeferredIoEvents::new(Arc::new(IoEvents(fd.clone()))));
        Ok(Self {
            fd,
            supported_cpuid,
            msr_list,
            max_vcpus: kvm.get_max_vcpus(),
            routes,
            ioevents,
        })
    }

    /// Turns KVM's dirty page logging on or off for every RAM slot (on:
    /// from now, every page a vCPU writes is reported once by
    /// [`Self::dirty_log`]).
    pub fn set_dirty_logging(&self, mem: &GuestMemory, on: bool) -> Result<(), KvmError> {
        register_memory(&self.fd, mem, if on { KVM_MEM_LOG_DIRTY_PAGES } else { 0 })
    }

    /// Per RAM region (in `mem.iter()` order), the pages vCPUs wrote since
    /// the last call, one bit per 4 KiB page; reading clears them.
    pub fn dirty_log(&self, mem: &GuestMemory) -> Result<Vec<Vec<u64>>, KvmError> {
        mem.iter()
            .enumerate()
            .map(|(slot, region)| {
                let len = usize::try_from(region.len()).map_err(|_| {
                    KvmError::Setup("dirty log", kvm_ioctls::Error::new(libc::EINVAL))
                })?;
                self.fd
                    .get_dirty_log(slot as u32, len)
                    .map_err(|e| KvmError::Setup("dirty log", e))
            })
            .collect()
    }

    pub fn fd(&self) -> &Arc<VmFd> {
        &self.fd
    }

    pub fn supported_cpuid(&self) -> &CpuId {
        &self.supported_cpuid
    }

    /// The MSRs a vCPU's saved state includes.
    pub fn msr_list(&self) -> &[u32] {
        &self.msr_list
    }

    pub fn check_vcpu_count(&self, requested: u8) -> Result<(), KvmError> {
        if usize::from(requested) > self.max_vcpus {
            return Err(KvmError::TooManyVcpus {
                requested,
                max: self.max_vcpus,
            });
        }
        Ok(())
    }

    pub fn msi_router(&self) -> Arc<dyn MsiRouter> {
        self.routes.clone()
    }

    pub fn ioevent_registrar(&self) -> Arc<dyn IoEventRegistrar> {
        self.ioevents.clone()
    }

    /// Records the devices' doorbell registrations instead of making them
    /// (a restore: see [`DeferredIoEvents`]) until [`Self::flush_ioevents`].
    pub fn defer_ioevents(&self) {
        self.ioevents.defer();
    }

    /// The VM is being torn down: its devices' doorbells are not removed
    /// one by one (see [`DeferredIoEvents::close`]).
    pub fn close_ioevents(&self) {
        self.ioevents.close();
    }

    /// Makes the deferred doorbell registrations from a thread of their own.
    pub fn flush_ioevents(&self) -> io::Result<()> {
        self.ioevents.flush().map(drop)
    }

    /// Keeps the devices' MSI route changes in the VMM's table until
    /// [`Self::commit_routes`]: a restore installs every function's routes
    /// with one KVM_SET_GSI_ROUTING (a grace period each, in the blackout
    /// of a migration) instead of one per function.
    pub fn hold_routes(&self) {
        self.routes.lock().holding = true;
    }

    /// Installs the routes changed since [`Self::hold_routes`], if any, in
    /// one update; changes are made at once again from now on.
    pub fn commit_routes(&self) -> io::Result<()> {
        let mut state = self.routes.lock();
        state.holding = false;
        if std::mem::take(&mut state.stale) {
            self.routes.commit_locked(&mut state)?;
        }
        Ok(())
    }

    /// KVM_SET_GSI_ROUTING calls made so far.
    pub fn route_updates(&self) -> u64 {
        self.routes.lock().updates
    }
}

/// The GSI routing table. KVM replaces the whole table on every update, so
/// the legacy IOAPIC/PIC routes KVM installs by default are re-created
/// each time alongside the MSI routes.
struct GsiRoutes {
    vm: Arc<VmFd>,
    state: Mutex<RouteState>,
}

struct RouteState {
    next_gsi: u32,
    free: Vec<u32>,
    msi: BTreeMap<u32, MsiMessage>,
    /// Changes wait for [`Vm::commit_routes`].
    holding: bool,
    /// `msi` changed since KVM's table was last set.
    stale: bool,
    /// KVM_SET_GSI_ROUTING calls made.
    updates: u64,
}

impl GsiRoutes {
    fn new(vm: Arc<VmFd>) -> Self {
        let state = RouteState {
            next_gsi: IOAPIC_PINS,
            free: Vec::new(),
            msi: BTreeMap::new(),
            holding: false,
            stale: false,
            updates: 0,
        };
        Self {
            vm,
            state: Mutex::new(state),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RouteState> {
        // A poisoned lock means another thread panicked mid-update; with
        // panic=abort that cannot happen, so take the data as it is.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn commit(&self) -> io::Result<()> {
        let mut state = self.lock();
        self.commit_locked(&mut state)
    }

    /// Sets KVM's table to `state`'s now, or once the hold ends.
    fn changed(&self, state: &mut RouteState) -> io::Result<()> {
        if state.holding {
            state.stale = true;
            return Ok(());
        }
        self.commit_locked(state)
    }

    fn commit_locked(&self, state: &mut RouteState) -> io::Result<()> {
        state.updates += 1;
        let mut entries = Vec::new();
        for pin in 0..IOAPIC_PINS {
            entries.push(irqchip_route(pin, KVM_IRQCHIP_IOAPIC, pin));
            match pin {
                0..=7 if pin != 2 => entries.push(irqchip_route(pin, KVM_IRQCHIP_PIC_MASTER, pin)),
                8..=15 => entries.push(irqchip_route(pin, KVM_IRQCHIP_PIC_SLAVE, pin - 8)),
                _ => {}
            }
        }
        for (&gsi, msg) in &state.msi {
            let mut e = kvm_irq_routing_entry {
                gsi,
                type_: KVM_IRQ_ROUTING_MSI,
                ..Default::default()
            };
            e.u.msi.address_lo = msg.addr_lo;
            e.u.msi.address_hi = msg.addr_hi;
            e.u.msi.data = msg.data;
            entries.push(e);
        }
        let routing = KvmIrqRouting::from_entries(&entries)
            .map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
        self.vm.set_gsi_routing(&routing).map_err(io::Error::from)
    }
}

fn irqchip_route(gsi: u32, chip: u32, pin: u32) -> kvm_irq_routing_entry {
    let mut e = kvm_irq_routing_entry {
        gsi,
        type_: KVM_IRQ_ROUTING_IRQCHIP,
        ..Default::default()
    };
    e.u.irqchip.irqchip = chip;
    e.u.irqchip.pin = pin;
    e
}

impl MsiRouter for GsiRoutes {
    fn allocate(&self) -> io::Result<MsiVector> {
        let mut state = self.lock();
        let gsi = match state.free.pop() {
            Some(gsi) => gsi,
            None if state.next_gsi < MAX_GSI => {
                state.next_gsi += 1;
                state.next_gsi - 1
            }
            None => return Err(io::Error::from_raw_os_error(libc::ENOSPC)),
        };
        let irqfd = EventFd::new(EFD_NONBLOCK)?;
        if let Err(e) = self.vm.register_irqfd(&irqfd, gsi) {
            state.free.push(gsi);
            return Err(e.into());
        }
        Ok(MsiVector { gsi, irqfd })
    }

    fn set_route(&self, gsi: u32, msg: Option<MsiMessage>) -> io::Result<()> {
        let mut state = self.lock();
        let changed = match msg {
            Some(m) => state.msi.insert(gsi, m) != Some(m),
            None => state.msi.remove(&gsi).is_some(),
        };
        if changed {
            self.changed(&mut state)?;
        }
        Ok(())
    }

    fn set_routes(&self, routes: &[(u32, MsiMessage)]) -> io::Result<()> {
        let mut state = self.lock();
        let mut changed = false;
        for &(gsi, msg) in routes {
            changed |= state.msi.insert(gsi, msg) != Some(msg);
        }
        if changed {
            self.changed(&mut state)?;
        }
        Ok(())
    }

    fn release(&self, vector: &MsiVector) -> io::Result<()> {
        let mut state = self.lock();
        let result = self
            .vm
            .unregister_irqfd(&vector.irqfd, vector.gsi)
            .map_err(io::Error::from);
        if state.msi.remove(&vector.gsi).is_some() {
            self.changed(&mut state)?;
        }
        state.free.push(vector.gsi);
        result
    }
}

/// Doorbells as KVM ioeventfds on MMIO addresses.
struct IoEvents(Arc<VmFd>);

impl IoEventRegistrar for IoEvents {
    fn register(&self, fd: &EventFd, addr: u64, datamatch: Option<u32>) -> io::Result<()> {
        let addr = IoEventAddress::Mmio(addr);
        match datamatch {
            Some(v) => self.0.register_ioevent(fd, &addr, v),
            None => self.0.register_ioevent(fd, &addr, NoDatamatch),
        }
        .map_err(io::Error::from)
    }

    fn unregister(&self, fd: &EventFd, addr: u64, datamatch: Option<u32>) -> io::Result<()> {
        let addr = IoEventAddress::Mmio(addr);
        match datamatch {
            Some(v) => self.0.unregister_ioevent(fd, &addr, v),
            None => self.0.unregister_ioevent(fd, &addr, NoDatamatch),
        }
        .map_err(io::Error::from)
    }
}

/// Registers every RAM region of `mem` as KVM memory slot `index` with
/// `flags`; registering an existing slot again changes its flags.
fn register_memory(fd: &VmFd, mem: &GuestMemory, flags: u32) -> Result<(), KvmError> {
    for (slot, region) in mem.iter().enumerate() {
        let host = mem
            .get_host_address(region.start_addr())
            .map_err(|_| KvmError::Setup("guest memory", kvm_ioctls::Error::new(libc::EFAULT)))?;
        let slot_region = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().raw_value(),
            memory_size: region.len(),
            userspace_addr: host as u64,
            flags,
        };
        // SAFETY: the mapping behind `host` is owned by `mem`, which the
        // VMM keeps alive for the VM's whole lifetime, and is exactly
        // `region.len()` bytes long.
        unsafe { fd.set_user_memory_region(slot_region) }.map_err(KvmError::MemorySlot)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msi(data: u32) -> MsiMessage {
        MsiMessage {
            addr_lo: 0xfee0_0000,
            addr_hi: 0,
            data,
        }
    }

    /// While held, route changes (one per function, as a restore makes
    /// them) reach KVM as one update at the commit; without a hold, each
    /// is an update of its own, and an unchanged route none.
    #[test]
    fn held_routes_are_one_update() {
        let mem = crate::memory::create_guest_memory(2 << 20).unwrap();
        let vm = Vm::new(&mem).unwrap();
        let router = vm.msi_router();
        let vectors: Vec<MsiVector> = (0..3).map(|_| router.allocate().unwrap()).collect();

        let before = vm.route_updates();
        vm.hold_routes();
        for (i, v) in (0u32..).zip(&vectors) {
            router.set_routes(&[(v.gsi, msi(0x40 + i))]).unwrap();
        }
        router.set_route(vectors[0].gsi, Some(msi(0x50))).unwrap();
        assert_eq!(vm.route_updates(), before);
        vm.commit_routes().unwrap();
        assert_eq!(vm.route_updates(), before + 1);
        // Nothing changed since: a commit makes no update.
        vm.hold_routes();
        vm.commit_routes().unwrap();
        assert_eq!(vm.route_updates(), before + 1);

        for (i, v) in (0u32..).zip(&vectors) {
            router.set_routes(&[(v.gsi, msi(0x60 + i))]).unwrap();
        }
        router.set_route(vectors[2].gsi, Some(msi(0x62))).unwrap();
        assert_eq!(vm.route_updates(), before + 4);
        for v in &vectors {
            router.release(v).unwrap();
        }
    }
}
