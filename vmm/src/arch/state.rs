// SPDX-License-Identifier: Apache-2.0
//! What KVM holds of a VM, for live migration and snapshots: each vCPU's
//! architectural state (CPUID, registers, special registers, FPU/XSAVE,
//! XCRs, LAPIC, MSRs, MP state, pending events) and the VM's in-kernel devices
//! (PICs, IOAPIC, PIT, clock), saved with kvm-bindings' serde support and
//! put back in the order KVM needs.
//!
//! Save only a vCPU that is out of KVM_RUN with no I/O half done: after an
//! I/O exit KVM completes the instruction on the next entry, so the vCPU
//! thread re-enters once with `immediate_exit` set first ([`complete_io`]).

use kvm_bindings::{
    kvm_clock_data, kvm_cpuid_entry2, kvm_debugregs, kvm_fpu, kvm_irqchip, kvm_lapic_state,
    kvm_mp_state, kvm_msr_entry, kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs,
    kvm_xsave, CpuId, Msrs, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
    KVM_MAX_CPUID_ENTRIES,
};
use kvm_ioctls::{VcpuExit, VcpuFd, VmFd};
use serde::{Deserialize, Serialize};

use super::cpuid::{self, CpuidError};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("Failed to get the vCPU's {0}")]
    Get(&'static str, #[source] kvm_ioctls::Error),
    #[error("Failed to set the vCPU's {0}")]
    Set(&'static str, #[source] kvm_ioctls::Error),
    #[error("KVM took {0} of {1} saved MSRs")]
    Msrs(usize, usize),
    #[error("The guest's CPUID does not fit this host")]
    Cpuid(#[source] CpuidError),
}

/// Everything KVM keeps of one vCPU, in the order [`save`] reads it. The
/// CPUID is the one the guest booted with, which it keeps wherever it
/// moves. XSAVE and XCRs are optional: a host without them saves the
/// legacy FPU state instead. The TSC rate is the guest's (KVM_GET_TSC_KHZ),
/// so that another host can keep it. Untrusted on restore: the CPUID is
/// checked against this host's, KVM checks every other field.
#[derive(Debug, Serialize, Deserialize)]
pub struct VcpuState {
    cpuid: Vec<kvm_cpuid_entry2>,
    mp_state: kvm_mp_state,
    regs: kvm_regs,
    sregs: kvm_sregs,
    #[serde(with = "fpu_bytes")]
    fpu: kvm_fpu,
    xsave: Option<kvm_xsave>,
    xcrs: Option<kvm_xcrs>,
    debugregs: kvm_debugregs,
    lapic: kvm_lapic_state,
    tsc_khz: Option<u32>,
    msrs: Vec<kvm_msr_entry>,
    events: kvm_vcpu_events,
}

/// kvm-bindings has no serde for `kvm_fpu`: it travels as its bytes.
mod fpu_bytes {
    use kvm_bindings::kvm_fpu;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    const SIZE: usize = std::mem::size_of::<kvm_fpu>();

    pub(super) fn serialize<S: Serializer>(fpu: &kvm_fpu, s: S) -> Result<S::Ok, S::Error> {
        // SAFETY: `kvm_fpu` is a `repr(C)` struct of integers and byte
        // arrays with explicit padding fields, so all SIZE bytes are
        // initialised; the slice lives no longer than the borrow of `fpu`.
        let bytes =
            unsafe { std::slice::from_raw_parts((fpu as *const kvm_fpu).cast::<u8>(), SIZE) };
        s.serialize_bytes(bytes)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<kvm_fpu, D::Error> {
        let bytes: Vec<u8> = Deserialize::deserialize(d)?;
        if bytes.len() != SIZE {
            return Err(D::Error::invalid_length(
                bytes.len(),
                &"the size of kvm_fpu",
            ));
        }
        let mut fpu = kvm_fpu::default();
        // SAFETY: `bytes` holds exactly SIZE bytes and every bit pattern is
        // a valid `kvm_fpu` (integers and byte arrays only).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                (&mut fpu as *mut kvm_fpu).cast::<u8>(),
                SIZE,
            );
        }
        Ok(fpu)
    }
}

impl VcpuState {
    /// The instruction pointer (for logs and tests).
    pub fn rip(&self) -> u64 {
        self.regs.rip
    }

    /// The CPUID the guest booted with.
    pub fn cpuid(&self) -> &[kvm_cpuid_entry2] {
        &self.cpuid
    }
}

/// Most exits one instruction can still make once its first completes: a
/// string I/O or MMIO instruction exits once per page or fragment.
const MAX_IO_EXITS: usize = 4096;

/// Finishes an I/O exit's instruction without running the guest further.
/// A string or split access exits again for its next part: `serve` gets
/// each such exit and says whether it served it (an I/O exit).
pub fn complete_io(fd: &mut VcpuFd, mut serve: impl FnMut(VcpuExit<'_>) -> bool) {
    fd.set_kvm_immediate_exit(1);
    for _ in 0..MAX_IO_EXITS {
        // EINTR is the expected end: nothing is left half done.
        if !fd.run().is_ok_and(&mut serve) {
            break;
        }
    }
    fd.set_kvm_immediate_exit(0);
}

/// Reads the MSRs of `list` that this vCPU has (KVM stops at the first it
/// cannot read; that one is skipped and the rest read again).
fn get_msrs(fd: &VcpuFd, list: &[u32]) -> Result<Vec<kvm_msr_entry>, StateError> {
    let mut out = Vec::with_capacity(list.len());
    let mut rest = list;
    while !rest.is_empty() {
        let entries: Vec<kvm_msr_entry> = rest
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs =
            Msrs::from_entries(&entries).map_err(|_| StateError::Msrs(0, entries.len()))?;
        let n = fd
            .get_msrs(&mut msrs)
            .map_err(|e| StateError::Get("MSRs", e))?;
        out.extend(msrs.as_slice().iter().take(n).copied());
        rest = rest.get(n.saturating_add(1)..).unwrap_or_default();
    }
    Ok(out)
}

/// Saves vCPU `fd`'s state, with the MSRs of `msr_list` (KVM's index list).
///
/// The CPUID is read first (no other read changes it). Then the order is
/// Firecracker's and cloud-hypervisor's: KVM_GET_MP_STATE first, as it makes KVM take pending INIT/SIPI into the vCPU and LAPIC
/// (read after it, they agree with it); KVM_GET_VCPU_EVENTS last, as the
/// other reads may still queue an event.
pub fn save(fd: &VcpuFd, msr_list: &[u32]) -> Result<VcpuState, StateError> {
    let cpuid = get_cpuid(fd)?;
    let mp_state = fd
        .get_mp_state()
        .map_err(|e| StateError::Get("MP state", e))?;
    let regs = fd.get_regs().map_err(|e| StateError::Get("registers", e))?;
    let sregs = fd
        .get_sregs()
        .map_err(|e| StateError::Get("special registers", e))?;
    let fpu = fd.get_fpu().map_err(|e| StateError::Get("FPU", e))?;
    let xsave = fd.get_xsave().ok();
    let xcrs = fd.get_xcrs().ok();
    let debugregs = fd
        .get_debug_regs()
        .map_err(|e| StateError::Get("debug registers", e))?;
    let lapic = fd.get_lapic().map_err(|e| StateError::Get("LAPIC", e))?;
    let tsc_khz = fd.get_tsc_khz().ok().filter(|&khz| khz != 0);
    let msrs = get_msrs(fd, msr_list)?;
    let events = fd
        .get_vcpu_events()
        .map_err(|e| StateError::Get("events", e))?;
    Ok(VcpuState {
        cpuid,
        mp_state,
        regs,
        sregs,
        fpu,
        xsave,
        xcrs,
        debugregs,
        lapic,
        tsc_khz,
        msrs,
        events,
    })
}

/// The TSC-deadline MSR: KVM arms the LAPIC timer from it against the
/// guest TSC, so it is written after the LAPIC (its mode) and the TSC.
const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;

/// `msrs` in the order KVM must take them: the TSC deadline last.
fn restore_order(msrs: &[kvm_msr_entry]) -> Vec<kvm_msr_entry> {
    let (deadline, mut rest): (Vec<_>, Vec<_>) =
        msrs.iter().partition(|m| m.index == MSR_IA32_TSC_DEADLINE);
    rest.extend(deadline);
    rest
}

/// Puts `s` into vCPU `fd`, set up as for a booting guest (its CPUID by
/// [`super::cpu::set_cpuid`]) and not run, after checking that this host
/// offers what the guest's CPUID promised it ([`cpuid::check`]).
///
/// The guest's own CPUID goes first: KVM sizes the XSAVE state and checks
/// MSRs against it. Then the order is Firecracker's and QEMU's constraints
/// together: MP state first; the TSC rate before anything reads the guest TSC; special
/// registers (which carry the APIC base) before the LAPIC; the LAPIC
/// before the MSRs (the TSC deadline counts only in TSC-deadline mode);
/// the events last, as the other writes clear or queue events.
pub fn restore(fd: &VcpuFd, s: &VcpuState) -> Result<(), StateError> {
    check_cpuid(fd, &s.cpuid)?;
    // Within KVM's limit: `check` refused more entries.
    let guest_cpuid = CpuId::from_entries(&s.cpuid)
        .map_err(|_| StateError::Cpuid(CpuidError::TooMany(s.cpuid.len())))?;
    fd.set_cpuid2(&guest_cpuid)
        .map_err(|e| StateError::Set("CPUID", e))?;
    fd.set_mp_state(s.mp_state)
        .map_err(|e| StateError::Set("MP state", e))?;
    if let Some(khz) = s.tsc_khz {
        set_tsc_khz(fd, khz);
    }
    fd.set_regs(&s.regs)
        .map_err(|e| StateError::Set("registers", e))?;
    fd.set_sregs(&s.sregs)
        .map_err(|e| StateError::Set("special registers", e))?;
    match &s.xsave {
        // SAFETY: KVM_SET_XSAVE copies more than `kvm_xsave`'s 4 KiB only
        // for XSTATE features enabled dynamically (arch_prctl guest
        // permission, AMX), which this VMM never asks for; so KVM's
        // supported CPUID has none, nor has the guest's (`check` refused
        // any XCR0 bit beyond this host's).
        Some(xsave) => unsafe { fd.set_xsave(xsave) }.map_err(|e| StateError::Set("XSAVE", e))?,
        None => fd.set_fpu(&s.fpu).map_err(|e| StateError::Set("FPU", e))?,
    }
    if let Some(xcrs) = &s.xcrs {
        fd.set_xcrs(xcrs).map_err(|e| StateError::Set("XCRs", e))?;
    }
    fd.set_debug_regs(&s.debugregs)
        .map_err(|e| StateError::Set("debug registers", e))?;
    fd.set_lapic(&s.lapic)
        .map_err(|e| StateError::Set("LAPIC", e))?;
    let entries = restore_order(&s.msrs);
    let msrs = Msrs::from_entries(&entries).map_err(|_| StateError::Msrs(0, entries.len()))?;
    let n = fd.set_msrs(&msrs).map_err(|e| StateError::Set("MSRs", e))?;
    if n != entries.len() {
        return Err(StateError::Msrs(n, entries.len()));
    }
    fd.set_vcpu_events(&s.events)
        .map_err(|e| StateError::Set("events", e))?;
    Ok(())
}

/// The CPUID vCPU `fd` holds (KVM_GET_CPUID2).
pub fn get_cpuid(fd: &VcpuFd) -> Result<Vec<kvm_cpuid_entry2>, StateError> {
    Ok(cpuid::held(
        &fd.get_cpuid2(KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| StateError::Get("CPUID", e))?,
    ))
}

/// Checks `guest`, a CPUID saved on another host (untrusted), against
/// what vCPU `fd`, set up as for a booting guest and not run, holds
/// ([`cpuid::check`]).
pub fn check_cpuid(fd: &VcpuFd, guest: &[kvm_cpuid_entry2]) -> Result<(), StateError> {
    cpuid::check(guest, &get_cpuid(fd)?).map_err(StateError::Cpuid)
}

/// Gives the guest its source's TSC rate. A host that cannot scale the
/// TSC to it refuses; the guest then keeps running at this host's rate,
/// as under QEMU: kvmclock follows, timers the guest programs in TSC
/// ticks run faster or slower by the ratio.
fn set_tsc_khz(fd: &VcpuFd, khz: u32) {
    if fd.get_tsc_khz().is_ok_and(|here| here == khz) {
        return;
    }
    if let Err(e) = fd.set_tsc_khz(khz) {
        log::warn!(
            "The guest's TSC ran at {khz} kHz, this host's runs at {} kHz and KVM cannot scale it ({e})",
            fd.get_tsc_khz().unwrap_or(0)
        );
    }
}

/// What KVM keeps of the VM besides its vCPUs: the in-kernel PICs and
/// IOAPIC, the PIT and the clock.
#[derive(Debug, Serialize, Deserialize)]
pub struct VmState {
    pic_master: kvm_irqchip,
    pic_slave: kvm_irqchip,
    ioapic: kvm_irqchip,
    pit: kvm_pit_state2,
    clock: kvm_clock_data,
}

fn irqchip(fd: &VmFd, chip_id: u32) -> Result<kvm_irqchip, StateError> {
    let mut chip = kvm_irqchip {
        chip_id,
        ..Default::default()
    };
    fd.get_irqchip(&mut chip)
        .map_err(|e| StateError::Get("irqchip", e))?;
    Ok(chip)
}

/// Saves the VM-wide state of `fd` (its vCPUs paused).
pub fn save_vm(fd: &VmFd) -> Result<VmState, StateError> {
    Ok(VmState {
        pic_master: irqchip(fd, KVM_IRQCHIP_PIC_MASTER)?,
        pic_slave: irqchip(fd, KVM_IRQCHIP_PIC_SLAVE)?,
        ioapic: irqchip(fd, KVM_IRQCHIP_IOAPIC)?,
        pit: fd.get_pit2().map_err(|e| StateError::Get("PIT", e))?,
        clock: fd.get_clock().map_err(|e| StateError::Get("clock", e))?,
    })
}

/// Puts `s` into VM `fd` (created with its irqchip and PIT, no vCPU run).
pub fn restore_vm(fd: &VmFd, s: &VmState) -> Result<(), StateError> {
    for chip in [&s.pic_master, &s.pic_slave, &s.ioapic] {
        fd.set_irqchip(chip)
            .map_err(|e| StateError::Set("irqchip", e))?;
    }
    fd.set_pit2(&s.pit).map_err(|e| StateError::Set("PIT", e))?;
    // The clock goes on from where the source stopped it; a stable-TSC
    // flag from the source is not a promise this host can make.
    let clock = kvm_clock_data {
        clock: s.clock.clock,
        ..Default::default()
    };
    fd.set_clock(&clock)
        .map_err(|e| StateError::Set("clock", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kvm_ioctls::Kvm;

    use super::*;

    const MSR_STAR: u32 = 0xc000_0081;
    const MSR_LSTAR: u32 = 0xc000_0082;
    const MSR_CSTAR: u32 = 0xc000_0083;
    const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
    const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
    const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
    const MSR_IA32_CR_PAT: u32 = 0x277;
    const MSR_IA32_TSC: u32 = 0x10;

    /// The CPUID a booting guest's only vCPU gets on this host.
    fn booting_cpuid(kvm: &Kvm) -> CpuId {
        cpuid::for_vcpu(
            &kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).unwrap(),
            0,
            1,
        )
    }

    /// A VM with its irqchip and one vCPU with `cpuid`.
    fn vcpu_with(kvm: &Kvm, cpuid: &CpuId) -> (VmFd, VcpuFd) {
        let vm = kvm.create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        let fd = vm.create_vcpu(0).unwrap();
        fd.set_cpuid2(cpuid).unwrap();
        (vm, fd)
    }

    /// A VM with its irqchip and one vCPU as a booting guest has it.
    fn vcpu(kvm: &Kvm) -> (VmFd, VcpuFd) {
        vcpu_with(kvm, &booting_cpuid(kvm))
    }

    fn entry_mut(entries: &mut [kvm_cpuid_entry2], leaf: u32) -> &mut kvm_cpuid_entry2 {
        entries
            .iter_mut()
            .find(|e| e.function == leaf && e.index == 0)
            .unwrap()
    }

    /// A guest that booted on a host with fewer features (here: the
    /// lowest feature bit of leaf 1 ECX KVM lists, cleared) and another
    /// model keeps that CPUID on this host, whose own differs.
    #[test]
    fn a_restored_vcpu_keeps_its_source_cpuid() {
        let kvm = Kvm::new().unwrap();
        let list = kvm.get_msr_index_list().unwrap().as_slice().to_vec();
        let mut older = booting_cpuid(&kvm).as_slice().to_vec();
        let leaf1 = entry_mut(&mut older, 1);
        let cleared = leaf1.ecx & leaf1.ecx.wrapping_neg(); // lowest set bit
        leaf1.ecx &= !cleared;
        leaf1.eax ^= 0xf0; // another model
        let model = leaf1.eax;
        let (_vm_a, a) = vcpu_with(&kvm, &CpuId::from_entries(&older).unwrap());
        let saved = save(&a, &list).unwrap();
        let saved_leaf1 = saved.cpuid.iter().find(|e| e.function == 1).unwrap();
        assert_eq!((saved_leaf1.eax, saved_leaf1.ecx & cleared), (model, 0));

        let (_vm_b, b) = vcpu(&kvm);
        assert_ne!(get_cpuid(&b).unwrap(), saved.cpuid);
        restore(&b, &saved).unwrap();
        assert_eq!(get_cpuid(&b).unwrap(), saved.cpuid);
    }

    /// A state whose CPUID has a feature this host lacks is refused, by
    /// leaf, register and bit, before anything is set in the vCPU.
    #[test]
    fn a_cpuid_this_host_lacks_is_refused_before_the_restore() {
        let kvm = Kvm::new().unwrap();
        let list = kvm.get_msr_index_list().unwrap().as_slice().to_vec();
        let (_vm_a, a) = vcpu(&kvm);
        let mut saved = save(&a, &list).unwrap();
        let leaf7 = entry_mut(&mut saved.cpuid, 7);
        let lacking = !leaf7.ebx & (!leaf7.ebx).wrapping_neg(); // lowest clear bit
        assert_ne!(lacking, 0, "this host has every leaf 7 EBX feature");
        leaf7.ebx |= lacking;

        let (_vm_b, b) = vcpu(&kvm);
        let mut regs = b.get_regs().unwrap();
        regs.rip = 0x4321;
        b.set_regs(&regs).unwrap();
        let here = get_cpuid(&b).unwrap();
        let e = restore(&b, &saved).unwrap_err();
        let msg = crate::error_chain(&e);
        assert!(
            msg.contains(&format!(
                "leaf 0x7.0x0 EBX (extended features): the guest has bits {lacking:#010x} this \
                 host lacks"
            )),
            "{msg}"
        );
        assert_eq!(get_cpuid(&b).unwrap(), here);
        assert_eq!(b.get_regs().unwrap().rip, 0x4321);
    }

    fn msr_map(s: &VcpuState) -> BTreeMap<u32, u64> {
        s.msrs
            .iter()
            .filter(|m| m.index != MSR_IA32_TSC)
            .map(|m| (m.index, m.data))
            .collect()
    }

    /// State a guest kernel keeps in the vCPU (GS bases and the syscall
    /// MSRs of the swapgs dance, debug registers, an NMI mask) survives
    /// save, restore into a fresh vCPU and save again: every field the
    /// restore drops shows as a difference.
    #[test]
    fn a_restored_vcpu_saves_what_its_source_saved() {
        let kvm = Kvm::new().unwrap();
        let list = kvm.get_msr_index_list().unwrap().as_slice().to_vec();
        let (_vm_a, a) = vcpu(&kvm);
        let mut regs = a.get_regs().unwrap();
        regs.rip = 0x1234;
        regs.rax = 0x5eed;
        a.set_regs(&regs).unwrap();
        let mut sregs = a.get_sregs().unwrap();
        sregs.gs.base = 0xffff_8d8e_4ec0_0000;
        sregs.fs.base = 0x7ff0_9571_7e00;
        sregs.cr2 = 0xfffe_0000_1ff8;
        a.set_sregs(&sregs).unwrap();
        let msrs: Vec<kvm_msr_entry> = [
            (MSR_KERNEL_GS_BASE, 0xffff_8d8e_4ec1_0000),
            (MSR_STAR, 0x0023_0010_0000_0000),
            (MSR_LSTAR, 0xffff_ffff_b300_0000),
            (MSR_CSTAR, 0xffff_ffff_b300_1000),
            (MSR_SYSCALL_MASK, 0x0004_7700),
            (MSR_IA32_SYSENTER_EIP, 0xffff_ffff_b300_2000),
            (MSR_IA32_CR_PAT, 0x0007_0106_0007_0106),
        ]
        .into_iter()
        .map(|(index, data)| kvm_msr_entry {
            index,
            data,
            ..Default::default()
        })
        .collect();
        assert_eq!(
            a.set_msrs(&Msrs::from_entries(&msrs).unwrap()).unwrap(),
            msrs.len()
        );
        let mut debugregs = a.get_debug_regs().unwrap();
        debugregs.db[0] = 0xffff_ffff_b300_3000;
        debugregs.dr7 = 0x0000_0401;
        a.set_debug_regs(&debugregs).unwrap();
        let mut events = a.get_vcpu_events().unwrap();
        events.nmi.masked = 1;
        a.set_vcpu_events(&events).unwrap();

        let saved = save(&a, &list).unwrap();
        for m in &msrs {
            assert_eq!(
                msr_map(&saved).get(&m.index),
                Some(&m.data),
                "{:#x}",
                m.index
            );
        }
        let (_vm_b, b) = vcpu(&kvm);
        restore(&b, &saved).unwrap();
        let again = save(&b, &list).unwrap();

        assert_eq!(format!("{:?}", again.regs), format!("{:?}", saved.regs));
        assert_eq!(format!("{:?}", again.sregs), format!("{:?}", saved.sregs));
        assert_eq!(again.debugregs.db, saved.debugregs.db);
        assert_eq!(again.debugregs.dr7, saved.debugregs.dr7);
        assert_eq!(msr_map(&again), msr_map(&saved));
        assert_eq!(again.events.nmi.masked, 1);
        assert_eq!(again.mp_state.mp_state, saved.mp_state.mp_state);
        assert_eq!(again.tsc_khz, saved.tsc_khz);
        assert_eq!(format!("{:?}", again.xcrs), format!("{:?}", saved.xcrs));
    }

    /// The TSC deadline goes after the TSC whatever order KVM listed them in.
    #[test]
    fn the_tsc_deadline_is_restored_last() {
        let entry = |index| kvm_msr_entry {
            index,
            ..Default::default()
        };
        let order: Vec<u32> = restore_order(&[
            entry(MSR_STAR),
            entry(MSR_IA32_TSC_DEADLINE),
            entry(MSR_IA32_TSC),
        ])
        .iter()
        .map(|m| m.index)
        .collect();
        assert_eq!(order, [MSR_STAR, MSR_IA32_TSC, MSR_IA32_TSC_DEADLINE]);
    }
}
