// SPDX-License-Identifier: Apache-2.0
//! What KVM holds of a VM, for live migration and snapshots: each vCPU's
//! architectural state (registers, special registers, FPU/XSAVE, XCRs,
//! LAPIC, MSRs, MP state, pending events) and the VM's in-kernel devices
//! (PICs, IOAPIC, PIT, clock), saved with kvm-bindings' serde support and
//! put back in the order KVM needs.
//!
//! Save only a vCPU that is out of KVM_RUN with no I/O half done: after an
//! I/O exit KVM completes the instruction on the next entry, so the vCPU
//! thread re-enters once with `immediate_exit` set first ([`complete_io`]).

use kvm_bindings::{
    kvm_clock_data, kvm_fpu, kvm_irqchip, kvm_lapic_state, kvm_mp_state, kvm_msr_entry,
    kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, Msrs,
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
};
use kvm_ioctls::{VcpuFd, VmFd};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("Failed to get the vCPU's {0}")]
    Get(&'static str, #[source] kvm_ioctls::Error),
    #[error("Failed to set the vCPU's {0}")]
    Set(&'static str, #[source] kvm_ioctls::Error),
    #[error("KVM took {0} of {1} saved MSRs")]
    Msrs(usize, usize),
}

/// Everything KVM keeps of one vCPU. XSAVE and XCRs are optional: a host
/// without them saves the legacy FPU state instead.
#[derive(Debug, Serialize, Deserialize)]
pub struct VcpuState {
    regs: kvm_regs,
    sregs: kvm_sregs,
    #[serde(with = "fpu_bytes")]
    fpu: kvm_fpu,
    xsave: Option<kvm_xsave>,
    xcrs: Option<kvm_xcrs>,
    lapic: kvm_lapic_state,
    msrs: Vec<kvm_msr_entry>,
    mp_state: kvm_mp_state,
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
}

/// Finishes an I/O exit's instruction without running the guest further.
pub fn complete_io(fd: &mut VcpuFd) {
    fd.set_kvm_immediate_exit(1);
    // EINTR is the expected answer; anything else leaves nothing pending.
    let _ = fd.run();
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
pub fn save(fd: &VcpuFd, msr_list: &[u32]) -> Result<VcpuState, StateError> {
    Ok(VcpuState {
        regs: fd.get_regs().map_err(|e| StateError::Get("registers", e))?,
        sregs: fd
            .get_sregs()
            .map_err(|e| StateError::Get("special registers", e))?,
        fpu: fd.get_fpu().map_err(|e| StateError::Get("FPU", e))?,
        xsave: fd.get_xsave().ok(),
        xcrs: fd.get_xcrs().ok(),
        lapic: fd.get_lapic().map_err(|e| StateError::Get("LAPIC", e))?,
        msrs: get_msrs(fd, msr_list)?,
        mp_state: fd
            .get_mp_state()
            .map_err(|e| StateError::Get("MP state", e))?,
        events: fd
            .get_vcpu_events()
            .map_err(|e| StateError::Get("events", e))?,
    })
}

/// Puts `s` into vCPU `fd`, which must have its CPUID set already.
pub fn restore(fd: &VcpuFd, s: &VcpuState) -> Result<(), StateError> {
    fd.set_mp_state(s.mp_state)
        .map_err(|e| StateError::Set("MP state", e))?;
    fd.set_regs(&s.regs)
        .map_err(|e| StateError::Set("registers", e))?;
    fd.set_sregs(&s.sregs)
        .map_err(|e| StateError::Set("special registers", e))?;
    match &s.xsave {
        // SAFETY: the buffer was filled by KVM_GET_XSAVE of a vCPU with the
        // same CPUID, so its layout is the one KVM expects back.
        Some(xsave) => unsafe { fd.set_xsave(xsave) }.map_err(|e| StateError::Set("XSAVE", e))?,
        None => fd.set_fpu(&s.fpu).map_err(|e| StateError::Set("FPU", e))?,
    }
    if let Some(xcrs) = &s.xcrs {
        fd.set_xcrs(xcrs).map_err(|e| StateError::Set("XCRs", e))?;
    }
    fd.set_lapic(&s.lapic)
        .map_err(|e| StateError::Set("LAPIC", e))?;
    let msrs = Msrs::from_entries(&s.msrs).map_err(|_| StateError::Msrs(0, s.msrs.len()))?;
    let n = fd.set_msrs(&msrs).map_err(|e| StateError::Set("MSRs", e))?;
    if n != s.msrs.len() {
        return Err(StateError::Msrs(n, s.msrs.len()));
    }
    fd.set_vcpu_events(&s.events)
        .map_err(|e| StateError::Set("events", e))?;
    Ok(())
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
