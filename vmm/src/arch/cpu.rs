// SPDX-License-Identifier: Apache-2.0
//! Per-vCPU architectural setup for the Linux 64-bit boot protocol: CPUID
//! (from KVM's supported set), boot MSRs, long-mode registers with an
//! identity-mapped first GiB, FPU and the local APIC's LINT pins.

use kvm_bindings::{
    kvm_cpuid_entry2, kvm_fpu, kvm_msr_entry, kvm_regs, kvm_segment, kvm_sregs, kvm_xcr, kvm_xcrs,
    CpuId, Msrs, KVM_MAX_CPUID_ENTRIES,
};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress};

use super::{cpuid, layout};
use crate::memory::GuestMemory;

#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("Failed to set CPUID")]
    SetCpuid(#[source] kvm_ioctls::Error),
    #[error("Failed to read CPUID back")]
    GetCpuid(#[source] kvm_ioctls::Error),
    #[error("Failed to build the MSR list")]
    MsrList,
    #[error("Failed to set MSRs")]
    SetMsrs(#[source] kvm_ioctls::Error),
    #[error("KVM accepted only {0} of {1} boot MSRs")]
    PartialMsrs(usize, usize),
    #[error("Failed to access vCPU registers")]
    Regs(#[source] kvm_ioctls::Error),
    #[error("Failed to write the boot page tables or GDT to guest memory")]
    GuestWrite(#[source] vm_memory::GuestMemoryError),
    #[error("Failed to program the local APIC")]
    Lapic(#[source] kvm_ioctls::Error),
    #[error("Failed to set XCR0")]
    Xcr0(#[source] kvm_ioctls::Error),
}

/// Gives vCPU `id` of `count` the CPUID a booting guest gets
/// ([`cpuid::for_vcpu`]); returns it as KVM holds it then (KVM may add to
/// it, see [`cpuid::check`]).
pub fn set_cpuid(
    vcpu: &VcpuFd,
    supported: &CpuId,
    id: u8,
    count: u8,
) -> Result<Vec<kvm_cpuid_entry2>, CpuError> {
    vcpu.set_cpuid2(&cpuid::for_vcpu(supported, id, count))
        .map_err(CpuError::SetCpuid)?;
    Ok(cpuid::held(
        &vcpu
            .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
            .map_err(CpuError::GetCpuid)?,
    ))
}

const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
/// MISC_ENABLE bit 0: fast string operations.
const MISC_ENABLE_FAST_STRING: u64 = 1;
/// MTRRs enabled (bit 11) with write-back (6) as the default memory type,
/// so guest RAM is cacheable before the kernel programs MTRRs itself.
const MTRR_ENABLE_WB_DEFAULT: u64 = (1 << 11) | 6;

/// The TSC is deliberately not written: KVM synchronises the TSCs of vCPUs
/// as it creates them, and per-vCPU writes made a few milliseconds apart
/// make Linux mark the TSC unstable.
pub fn set_boot_msrs(vcpu: &VcpuFd) -> Result<(), CpuError> {
    let entry = |index, data| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    };
    let entries = [
        entry(MSR_IA32_SYSENTER_CS, 0),
        entry(MSR_IA32_SYSENTER_ESP, 0),
        entry(MSR_IA32_SYSENTER_EIP, 0),
        entry(MSR_STAR, 0),
        entry(MSR_CSTAR, 0),
        entry(MSR_KERNEL_GS_BASE, 0),
        entry(MSR_SYSCALL_MASK, 0),
        entry(MSR_LSTAR, 0),
        entry(MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        entry(MSR_MTRR_DEF_TYPE, MTRR_ENABLE_WB_DEFAULT),
    ];
    let msrs = Msrs::from_entries(&entries).map_err(|_| CpuError::MsrList)?;
    let set = vcpu.set_msrs(&msrs).map_err(CpuError::SetMsrs)?;
    if set != entries.len() {
        return Err(CpuError::PartialMsrs(set, entries.len()));
    }
    Ok(())
}

/// Boot CPU registers: 64-bit entry at `entry`, zero page in RSI.
pub fn set_boot_regs(vcpu: &VcpuFd, entry: u64) -> Result<(), CpuError> {
    let regs = kvm_regs {
        rflags: 0x2, // bit 1 is reserved and must be set
        rip: entry,
        rsp: layout::BOOT_STACK_POINTER,
        rbp: layout::BOOT_STACK_POINTER,
        rsi: layout::ZERO_PAGE_START,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(CpuError::Regs)
}

pub fn set_boot_fpu(vcpu: &VcpuFd) -> Result<(), CpuError> {
    let fpu = kvm_fpu {
        fcw: 0x37f,    // x87 default control word
        mxcsr: 0x1f80, // SSE default: all exceptions masked
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(CpuError::Regs)
}

/// XCR0 as the guest kernel will set it: every user state component the
/// vCPU's CPUID offers (leaf 0xD, sub-leaf 0, EDX:EAX). Set before the
/// guest runs so that KVM sizes CPUID 0xD's EBX (bytes needed for the
/// enabled components) for it from the start: a nested KVM whose XSETBV
/// is not intercepted (TCG's emulated SVM) never updates EBX, and Linux
/// then warns "XSAVE consistency problem" at boot. Without XSAVE (no
/// leaf 0xD) there is nothing to set.
pub fn set_boot_xcr0(vcpu: &VcpuFd, supported: &CpuId) -> Result<(), CpuError> {
    let Some(leaf) = supported
        .as_slice()
        .iter()
        .find(|e| e.function == 0xd && e.index == 0)
    else {
        return Ok(());
    };
    let mut xcrs = kvm_xcrs {
        nr_xcrs: 1,
        ..Default::default()
    };
    xcrs.xcrs[0] = kvm_xcr {
        xcr: 0,
        value: u64::from(leaf.eax) | u64::from(leaf.edx) << 32,
        ..Default::default()
    };
    vcpu.set_xcrs(&xcrs).map_err(CpuError::Xcr0)
}

const X86_CR0_PE: u64 = 1;
const X86_CR0_PG: u64 = 1 << 31;
const X86_CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// GDT descriptors used until the kernel loads its own: null, 64-bit code,
/// data, TSS (access/flags in the packed 16-bit form of the descriptor).
const BOOT_GDT: [(u16, u32, u32); 4] = [
    (0, 0, 0),
    (0xa09b, 0, 0xfffff),
    (0xc093, 0, 0xfffff),
    (0x808b, 0, 0xfffff),
];

fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    let (flags, base, limit) = (u64::from(flags), u64::from(base), u64::from(limit));
    ((base & 0xff00_0000) << 32)
        | ((flags & 0xf0ff) << 40)
        | ((limit & 0xf_0000) << 32)
        | ((base & 0x00ff_ffff) << 16)
        | (limit & 0xffff)
}

fn segment_from_gdt(entry: u64, index: u8) -> kvm_segment {
    let bit = |shift: u32| u8::from(entry & (1 << shift) != 0);
    let base = ((entry >> 16) & 0x00ff_ffff) | ((entry >> 32) & 0xff00_0000);
    let mut limit = (entry & 0xffff) | ((entry >> 32) & 0xf_0000);
    if bit(55) == 1 {
        limit = (limit << 12) | 0xfff; // 4 KiB granularity
    }
    kvm_segment {
        base,
        limit: u32::try_from(limit).unwrap_or(u32::MAX),
        selector: u16::from(index) * 8,
        type_: ((entry >> 40) & 0xf) as u8,
        present: bit(47),
        dpl: ((entry >> 45) & 0x3) as u8,
        db: bit(54),
        s: bit(44),
        l: bit(53),
        g: bit(55),
        avl: bit(52),
        unusable: u8::from(bit(47) == 0),
        padding: 0,
    }
}

/// Writes the boot GDT, IDT and identity page tables into guest memory.
/// Shared by all vCPUs, so done once per VM.
pub fn write_boot_tables(mem: &GuestMemory) -> Result<(), CpuError> {
    for (i, &(flags, base, limit)) in BOOT_GDT.iter().enumerate() {
        let addr = GuestAddress(layout::BOOT_GDT_START + 8 * i as u64);
        mem.write_obj(gdt_entry(flags, base, limit), addr)
            .map_err(CpuError::GuestWrite)?;
    }
    mem.write_obj(0u64, GuestAddress(layout::BOOT_IDT_START))
        .map_err(CpuError::GuestWrite)?;
    // PML4[0] -> PDPT, PDPT[0] -> PD, PD: 512 x 2 MiB present+writable+huge.
    mem.write_obj(layout::PDPTE_START | 0x03, GuestAddress(layout::PML4_START))
        .map_err(CpuError::GuestWrite)?;
    mem.write_obj(layout::PDE_START | 0x03, GuestAddress(layout::PDPTE_START))
        .map_err(CpuError::GuestWrite)?;
    for i in 0..512u64 {
        mem.write_obj((i << 21) | 0x83, GuestAddress(layout::PDE_START + i * 8))
            .map_err(CpuError::GuestWrite)?;
    }
    Ok(())
}

/// Long mode with paging on, segments from the boot GDT.
pub fn set_boot_sregs(vcpu: &VcpuFd) -> Result<(), CpuError> {
    let mut sregs: kvm_sregs = vcpu.get_sregs().map_err(CpuError::Regs)?;
    let seg = |i: usize| {
        let (flags, base, limit) = BOOT_GDT[i];
        segment_from_gdt(gdt_entry(flags, base, limit), i as u8)
    };
    sregs.gdt.base = layout::BOOT_GDT_START;
    sregs.gdt.limit = (BOOT_GDT.len() * 8 - 1) as u16;
    sregs.idt.base = layout::BOOT_IDT_START;
    sregs.idt.limit = 7;
    sregs.cs = seg(1);
    let data = seg(2);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = seg(3);
    sregs.cr0 |= X86_CR0_PE | X86_CR0_PG;
    sregs.cr3 = layout::PML4_START;
    sregs.cr4 |= X86_CR4_PAE;
    sregs.efer |= EFER_LME | EFER_LMA;
    vcpu.set_sregs(&sregs).map_err(CpuError::Regs)
}

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

/// LINT0 as ExtINT (the PIC's output) and LINT1 as NMI, as firmware leaves
/// them on a PC; Linux relies on it for its timer and NMI checks.
pub fn set_lint(vcpu: &VcpuFd) -> Result<(), CpuError> {
    let mut lapic = vcpu.get_lapic().map_err(CpuError::Lapic)?;
    for (reg, mode) in [(APIC_LVT0, APIC_MODE_EXTINT), (APIC_LVT1, APIC_MODE_NMI)] {
        let Some(bytes) = lapic.regs.get_mut(reg..reg + 4) else {
            continue;
        };
        let mut raw = [0u8; 4];
        for (dst, src) in raw.iter_mut().zip(bytes.iter()) {
            *dst = *src as u8;
        }
        let value = (u32::from_le_bytes(raw) & !0x700) | (mode << 8);
        for (dst, src) in bytes.iter_mut().zip(value.to_le_bytes()) {
            *dst = src as i8;
        }
    }
    vcpu.set_lapic(&lapic).map_err(CpuError::Lapic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdt_entries_decode_to_long_mode_segments() {
        let code = segment_from_gdt(gdt_entry(0xa09b, 0, 0xfffff), 1);
        assert_eq!(
            (code.selector, code.l, code.db, code.present, code.s),
            (8, 1, 0, 1, 1)
        );
        assert_eq!((code.type_, code.limit, code.g), (0xb, 0xffff_ffff, 1));
        let data = segment_from_gdt(gdt_entry(0xc093, 0, 0xfffff), 2);
        assert_eq!((data.selector, data.l, data.db, data.type_), (16, 0, 1, 3));
        let tss = segment_from_gdt(gdt_entry(0x808b, 0, 0xfffff), 3);
        assert_eq!((tss.selector, tss.type_, tss.s), (24, 0xb, 0));
        let null = segment_from_gdt(0, 0);
        assert_eq!(null.unusable, 1);
    }

    #[test]
    fn boot_tables_identity_map_the_first_gib() {
        let mem = crate::memory::create_guest_memory(16 << 20).unwrap();
        write_boot_tables(&mem).unwrap();
        let pml4: u64 = mem.read_obj(GuestAddress(layout::PML4_START)).unwrap();
        assert_eq!(pml4, layout::PDPTE_START | 3);
        let last: u64 = mem
            .read_obj(GuestAddress(layout::PDE_START + 511 * 8))
            .unwrap();
        assert_eq!(last, (511 << 21) | 0x83);
        let code: u64 = mem
            .read_obj(GuestAddress(layout::BOOT_GDT_START + 8))
            .unwrap();
        assert_eq!(code, 0x00af_9b00_0000_ffff);
    }
}
