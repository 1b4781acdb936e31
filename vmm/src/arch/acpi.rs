// SPDX-License-Identifier: Apache-2.0
//! ACPI tables (hardware-reduced): RSDP, XSDT, FADT, DSDT and MADT.
//!
//! Why ACPI and not only an MP table: Linux powers off through ACPI S5 (the
//! FADT's sleep-control register) and resets through the FADT reset
//! register; both land on `legacy_devices::AcpiPm`. The MADT lists every
//! vCPU's local APIC. With ACPI on, Linux finds PCI only through a host
//! bridge in the DSDT (it does no legacy bus scan), so the DSDT describes
//! bus 0 and its address windows.

use acpi_tables::aml::{self, AddressSpace, AddressSpaceCacheable};
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::gas::{AccessSize, AddressSpace as GasSpace, GAS};
use acpi_tables::madt::{
    EnabledStatus, IoApic, LocalInterruptController, ProcessorLocalApic, MADT,
};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;
use legacy_devices::{
    ACPI_PM_PORT, RESET_VALUE, SERIAL_IRQ, SERIAL_PORT, SERIAL_PORT_LEN, SLEEP_TYPE_S5,
};
use vm_memory::{Bytes, GuestAddress};

use super::layout;
use crate::memory::GuestMemory;

const OEM_ID: [u8; 6] = *b"PVRDMA";
const OEM_TABLE_ID: [u8; 8] = *b"PVRDMAVM";
const OEM_REVISION: u32 = 1;
/// IAPC_BOOT_ARCH: no VGA (bit 2), no CMOS RTC (bit 5): Linux then skips
/// probing hardware we do not emulate.
const IAPC_BOOT_ARCH: u16 = (1 << 2) | (1 << 5);
/// MADT flag PCAT_COMPAT: the (in-kernel) dual 8259 PIC exists.
const MADT_PCAT_COMPAT: u32 = 1;
/// Offset of the MADT flags field (after the 36-byte header and LAPIC address).
const MADT_FLAGS_OFFSET: usize = 40;

#[derive(Debug, thiserror::Error)]
pub enum AcpiError {
    #[error("ACPI tables ({0} bytes) do not fit in the BIOS area")]
    TooLarge(u64),
    #[error("Failed to write ACPI tables to guest memory")]
    GuestWrite(#[source] vm_memory::GuestMemoryError),
}

fn bytes_of(table: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    table.to_aml_bytes(&mut v);
    v
}

/// The byte sum of a whole ACPI table must be zero.
fn fix_checksum(table: &mut [u8]) {
    if let Some(slot) = table.get_mut(9) {
        *slot = 0;
    }
    let sum = table.iter().fold(0u8, |acc, b| acc.wrapping_add(*b));
    if let Some(slot) = table.get_mut(9) {
        *slot = 0u8.wrapping_sub(sum);
    }
}

fn build_dsdt(mmio64: (u64, u64)) -> Vec<u8> {
    let s5 = aml::Name::new("_S5_".into(), &aml::Package::new(vec![&SLEEP_TYPE_S5]));
    let bus = AddressSpace::<u16>::new_bus_number(0, 0);
    let cfg_ports = aml::IO::new(0xcf8, 0xcf8, 1, 8);
    let io_low = AddressSpace::<u16>::new_io(0, 0xcf7, None);
    let io_high = AddressSpace::<u16>::new_io(0xd00, 0xffff, None);
    let mmio32 = AddressSpace::<u32>::new_memory(
        AddressSpaceCacheable::NotCacheable,
        true,
        layout::MMIO_HOLE_START as u32,
        (layout::MMIO32_END - 1) as u32,
        None,
    );
    let mmio64 = AddressSpace::<u64>::new_memory(
        AddressSpaceCacheable::NotCacheable,
        true,
        mmio64.0,
        mmio64.0 + mmio64.1 - 1,
        None,
    );
    let crs =
        aml::ResourceTemplate::new(vec![&bus, &cfg_ports, &io_low, &io_high, &mmio32, &mmio64]);
    let hid = aml::EISAName::new("PNP0A03");
    let zero = 0u8;
    let names = [
        aml::Name::new("_HID".into(), &hid),
        aml::Name::new("_ADR".into(), &zero),
        aml::Name::new("_SEG".into(), &zero),
        aml::Name::new("_UID".into(), &zero),
        aml::Name::new("_BBN".into(), &zero),
        aml::Name::new("_CRS".into(), &crs),
    ];
    let pci0 = aml::Device::new(
        "_SB_.PCI0".into(),
        names.iter().map(|n| n as &dyn Aml).collect(),
    );
    let mut dsdt = Sdt::new(*b"DSDT", 36, 6, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    s5.to_aml_bytes(&mut dsdt);
    pci0.to_aml_bytes(&mut dsdt);
    dsdt.append_slice(&com1());
    dsdt.as_slice().to_vec()
}

/// COM1 as a PNP0501 device. In hardware-reduced mode Linux has no legacy
/// PIC and maps no ISA IRQ by itself: without this the 8250 driver's IRQ 4
/// never reaches IOAPIC pin 4 and interrupt-driven console output stalls.
fn com1() -> Vec<u8> {
    let irq = aml::Interrupt::new(true, true, false, false, SERIAL_IRQ);
    let io = aml::IO::new(SERIAL_PORT, SERIAL_PORT, 1, SERIAL_PORT_LEN as u8);
    let crs = aml::ResourceTemplate::new(vec![&io, &irq]);
    let hid = aml::EISAName::new("PNP0501");
    let uid = 0u8;
    let names = [
        aml::Name::new("_HID".into(), &hid),
        aml::Name::new("_UID".into(), &uid),
        aml::Name::new("_CRS".into(), &crs),
    ];
    let dev = aml::Device::new(
        "_SB_.COM1".into(),
        names.iter().map(|n| n as &dyn Aml).collect(),
    );
    bytes_of(&dev)
}

fn build_fadt(dsdt_addr: u64) -> Vec<u8> {
    let pm_port = |offset: u16| {
        GAS::new(
            GasSpace::SystemIo,
            8,
            0,
            AccessSize::ByteAccess,
            u64::from(ACPI_PM_PORT + offset),
        )
    };
    let mut fadt = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::ResetRegSup)
        .dsdt_64(dsdt_addr);
    fadt.iapc_boot_arch = IAPC_BOOT_ARCH.into();
    fadt.sleep_control_reg = pm_port(0);
    fadt.sleep_status_reg = pm_port(0);
    fadt.reset_reg = pm_port(1);
    fadt.reset_value = RESET_VALUE;
    fadt.hypervisor_vendor_identity = u64::from_le_bytes(*b"PVRDMAVM").into();
    bytes_of(&fadt.finalize())
}

fn build_madt(num_cpus: u8) -> Vec<u8> {
    let mut madt = MADT::new(
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
        LocalInterruptController::Address(layout::APIC_START as u32),
    );
    for cpu in 0..num_cpus {
        madt.add_structure(ProcessorLocalApic::new(cpu, cpu, EnabledStatus::Enabled));
    }
    madt.add_structure(IoApic::new(0, layout::IOAPIC_START as u32, 0));
    let mut bytes = bytes_of(&madt);
    if let Some(flags) = bytes.get_mut(MADT_FLAGS_OFFSET..MADT_FLAGS_OFFSET + 4) {
        flags.copy_from_slice(&MADT_PCAT_COMPAT.to_le_bytes());
    }
    fix_checksum(&mut bytes);
    bytes
}

/// Writes all tables into [`layout::ACPI_START`, `layout::ACPI_END`); the
/// RSDP comes first, at the address the zero page also advertises.
pub fn create_acpi_tables(
    mem: &GuestMemory,
    num_cpus: u8,
    mmio64: (u64, u64),
) -> Result<(), AcpiError> {
    let align = |a: u64| a.next_multiple_of(16);
    let xsdt_addr = align(layout::ACPI_START + Rsdp::len() as u64);
    // XSDT with two entries: header + 2 * 8 bytes.
    let dsdt_addr = align(xsdt_addr + 36 + 16);
    let dsdt = build_dsdt(mmio64);
    let fadt_addr = align(dsdt_addr + dsdt.len() as u64);
    let fadt = build_fadt(dsdt_addr);
    let madt_addr = align(fadt_addr + fadt.len() as u64);
    let madt = build_madt(num_cpus);
    let end = madt_addr + madt.len() as u64;
    if end > layout::ACPI_END {
        return Err(AcpiError::TooLarge(end - layout::ACPI_START));
    }
    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    xsdt.add_entry(fadt_addr);
    xsdt.add_entry(madt_addr);
    let rsdp = Rsdp::new(OEM_ID, xsdt_addr);
    for (addr, table) in [
        (layout::ACPI_START, bytes_of(&rsdp)),
        (xsdt_addr, bytes_of(&xsdt)),
        (dsdt_addr, dsdt),
        (fadt_addr, fadt),
        (madt_addr, madt),
    ] {
        mem.write_slice(&table, GuestAddress(addr))
            .map_err(AcpiError::GuestWrite)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checksum_ok(t: &[u8]) -> bool {
        t.iter().fold(0u8, |a, b| a.wrapping_add(*b)) == 0
    }

    #[test]
    fn tables_have_valid_checksums_and_lengths() {
        let dsdt = build_dsdt((1 << 32, 1 << 30));
        let fadt = build_fadt(0xe0100);
        let madt = build_madt(2);
        for (sig, t) in [(b"DSDT", &dsdt), (b"FACP", &fadt), (b"APIC", &madt)] {
            assert_eq!(&t[..4], sig);
            assert!(checksum_ok(t), "{} checksum", String::from_utf8_lossy(sig));
            let len = u32::from_le_bytes(t[4..8].try_into().unwrap()) as usize;
            assert_eq!(len, t.len());
        }
        // Two LAPIC entries (8 bytes each) and one IOAPIC (12 bytes).
        assert_eq!(madt.len(), 44 + 2 * 8 + 12);
        assert_eq!(
            u32::from_le_bytes(madt[40..44].try_into().unwrap()),
            MADT_PCAT_COMPAT
        );
        // The DSDT names the S5 object and the PCI host bridge.
        let find = |needle: &[u8]| dsdt.windows(needle.len()).any(|w| w == needle);
        assert!(find(b"_S5_") && find(b"PCI0") && find(b"_CRS") && find(b"COM1"));
    }

    #[test]
    fn rsdp_is_where_linux_scans_and_points_to_xsdt() {
        let mem = crate::memory::create_guest_memory(16 << 20).unwrap();
        create_acpi_tables(&mem, 4, (1 << 32, 1 << 30)).unwrap();
        let mut rsdp = [0u8; 36];
        mem.read_slice(&mut rsdp, GuestAddress(layout::ACPI_START))
            .unwrap();
        assert_eq!(&rsdp[..8], b"RSD PTR ");
        assert!(checksum_ok(&rsdp[..20]) && checksum_ok(&rsdp));
        let xsdt_addr = u64::from_le_bytes(rsdp[24..32].try_into().unwrap());
        let mut sig = [0u8; 4];
        mem.read_slice(&mut sig, GuestAddress(xsdt_addr)).unwrap();
        assert_eq!(&sig, b"XSDT");
    }
}
