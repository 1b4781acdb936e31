// SPDX-License-Identifier: Apache-2.0
//! Guest-physical memory map. One home for every fixed address the boot
//! path, the ACPI tables and the device manager agree on.

/// GDT and IDT used only until the kernel installs its own.
pub const BOOT_GDT_START: u64 = 0x500;
pub const BOOT_IDT_START: u64 = 0x520;
/// The Linux zero page (`struct boot_params`).
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Initial stack of the boot CPU (grows down below the page tables).
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Identity-map page tables: PML4, PDPT and one PD of 2 MiB pages (1 GiB).
pub const PML4_START: u64 = 0x9000;
pub const PDPTE_START: u64 = 0xa000;
pub const PDE_START: u64 = 0xb000;
/// Kernel command line.
pub const CMDLINE_START: u64 = 0x20000;
/// Top of the first low-memory RAM range; the EBDA sits above it.
pub const EBDA_START: u64 = 0x9fc00;
/// ACPI tables live in the BIOS area where Linux scans for the RSDP.
pub const ACPI_START: u64 = 0xe0000;
pub const ACPI_END: u64 = 0x10_0000;
/// Where the protected-mode kernel and everything above live.
pub const HIMEM_START: u64 = 0x10_0000;

/// RAM below 4 GiB ends here; the rest of RAM is placed above 4 GiB.
pub const MMIO_HOLE_START: u64 = 0xc000_0000;
/// 32-bit PCI BARs are placed in [`MMIO_HOLE_START`, `MMIO32_END`).
pub const MMIO32_END: u64 = IOAPIC_START;
pub const IOAPIC_START: u64 = 0xfec0_0000;
pub const APIC_START: u64 = 0xfee0_0000;
/// KVM's (Intel) TSS and identity-map pages, just below the BIOS ROM.
pub const KVM_TSS_START: u64 = 0xfffb_d000;
pub const KVM_IDENTITY_MAP_START: u64 = 0xfffb_c000;
pub const FOUR_GIB: u64 = 1 << 32;
/// 64-bit BARs get this much room, starting 1 GiB-aligned above RAM.
pub const MMIO64_SIZE: u64 = 64 << 30;

// The fixed regions must not overlap: checked when the crate compiles.
const _: () = assert!(BOOT_IDT_START < ZERO_PAGE_START && ZERO_PAGE_START + 0x1000 <= PML4_START);
const _: () = assert!(PDE_START + 0x1000 <= CMDLINE_START && CMDLINE_START < EBDA_START);
const _: () = assert!(MMIO_HOLE_START < MMIO32_END && MMIO32_END <= APIC_START);
const _: () = assert!(KVM_IDENTITY_MAP_START + 0x1000 <= KVM_TSS_START);

/// The guest's RAM ranges for `mem_size` bytes: below the 32-bit MMIO hole,
/// then above 4 GiB.
pub fn ram_ranges(mem_size: u64) -> Vec<(u64, u64)> {
    if mem_size <= MMIO_HOLE_START {
        vec![(0, mem_size)]
    } else {
        vec![(0, MMIO_HOLE_START), (FOUR_GIB, mem_size - MMIO_HOLE_START)]
    }
}

/// The 64-bit PCI window: the first 1 GiB boundary above RAM (and 4 GiB).
pub fn mmio64_window(mem_size: u64) -> (u64, u64) {
    let ram_end = ram_ranges(mem_size)
        .last()
        .map_or(FOUR_GIB, |&(start, len)| start + len)
        .max(FOUR_GIB);
    let start = ram_end.next_multiple_of(1 << 30);
    (start, MMIO64_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_splits_around_the_hole() {
        assert_eq!(ram_ranges(512 << 20), vec![(0, 512 << 20)]);
        assert_eq!(ram_ranges(MMIO_HOLE_START), vec![(0, MMIO_HOLE_START)]);
        assert_eq!(
            ram_ranges(4 << 30),
            vec![
                (0, MMIO_HOLE_START),
                (FOUR_GIB, (4 << 30) - MMIO_HOLE_START)
            ]
        );
        assert_eq!(mmio64_window(512 << 20).0, FOUR_GIB);
        assert_eq!(mmio64_window(4 << 30).0, 5 << 30);
    }
}
