// SPDX-License-Identifier: Apache-2.0
//! Direct kernel boot (Linux x86 64-bit boot protocol): loads a bzImage or
//! an ELF vmlinux, the command line and an initramfs, and writes the zero
//! page with the e820 map. Returns the 64-bit entry point.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_params, setup_header};
use linux_loader::loader::{load_cmdline, BzImage, Cmdline, Elf, KernelLoader};
use vm_memory::{Address, GuestAddress, GuestMemoryBackend as _, GuestMemoryRegion, ReadVolatile};

use super::layout;
use crate::memory::GuestMemory;

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("Failed to read the kernel image")]
    ReadKernel(#[source] std::io::Error),
    #[error("Failed to load the kernel")]
    LoadKernel(#[source] linux_loader::loader::Error),
    #[error("Invalid kernel command line")]
    Cmdline(#[source] linux_loader::cmdline::Error),
    #[error("Failed to write the kernel command line")]
    LoadCmdline(#[source] linux_loader::loader::Error),
    #[error("Failed to read the initramfs")]
    ReadInitramfs(#[source] std::io::Error),
    #[error("The initramfs ({0} bytes) does not fit in guest memory below the kernel's limit")]
    InitramfsTooLarge(u64),
    #[error("Failed to copy the initramfs into guest memory")]
    CopyInitramfs(#[source] vm_memory::GuestMemoryError),
    #[error("Failed to write the zero page")]
    ZeroPage(#[source] linux_loader::configurator::Error),
}

const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
/// startup_64 sits 0x200 bytes into the protected-mode part of a bzImage.
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;
/// "HdrS", the boot-protocol header magic.
const HDRS_MAGIC: u32 = 0x5372_6448;
const BOOT_FLAG_MAGIC: u16 = 0xaa55;
/// Loader type 0xff: "undefined/other boot loader".
const LOADER_TYPE_UNDEFINED: u8 = 0xff;
/// Command-line capacity when the kernel does not say (ELF images).
const DEFAULT_CMDLINE_SIZE: usize = 2048;
/// Highest initramfs address an ELF kernel is assumed to accept.
const DEFAULT_INITRD_ADDR_MAX: u64 = 0x37ff_ffff;
const PAGE_SIZE: u64 = 4096;
const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;

/// What the boot path needs to know to start the boot CPU.
#[derive(Debug, Clone, Copy)]
pub struct KernelEntry {
    pub entry: u64,
}

pub fn load_kernel(
    mem: &GuestMemory,
    kernel: &mut File,
    initramfs: Option<&mut File>,
    cmdline: &str,
) -> Result<KernelEntry, BootError> {
    let mut magic = [0u8; 4];
    kernel
        .seek(SeekFrom::Start(0))
        .map_err(BootError::ReadKernel)?;
    kernel
        .read_exact(&mut magic)
        .map_err(BootError::ReadKernel)?;
    kernel
        .seek(SeekFrom::Start(0))
        .map_err(BootError::ReadKernel)?;
    let himem = Some(GuestAddress(layout::HIMEM_START));
    let (result, entry) = if magic == ELF_MAGIC {
        let r = Elf::load(mem, None, kernel, himem).map_err(BootError::LoadKernel)?;
        (r, r.kernel_load.raw_value())
    } else {
        let r = BzImage::load(mem, None, kernel, himem).map_err(BootError::LoadKernel)?;
        (r, r.kernel_load.raw_value() + BZIMAGE_64BIT_ENTRY_OFFSET)
    };

    let mut hdr = result.setup_header.unwrap_or_else(|| setup_header {
        header: HDRS_MAGIC,
        boot_flag: BOOT_FLAG_MAGIC,
        kernel_alignment: 0x100_0000,
        ..Default::default()
    });
    let cmdline_size = match hdr.cmdline_size {
        0 => DEFAULT_CMDLINE_SIZE,
        n => n as usize,
    };
    let cmdline = Cmdline::try_from(cmdline, cmdline_size).map_err(BootError::Cmdline)?;
    load_cmdline(mem, GuestAddress(layout::CMDLINE_START), &cmdline)
        .map_err(BootError::LoadCmdline)?;
    hdr.type_of_loader = LOADER_TYPE_UNDEFINED;
    hdr.cmd_line_ptr = layout::CMDLINE_START as u32;
    hdr.cmdline_size = cmdline
        .as_cstring()
        .map_or(0, |c| c.as_bytes().len() as u32);

    if let Some(initramfs) = initramfs {
        let initrd_max = match hdr.initrd_addr_max {
            0 => DEFAULT_INITRD_ADDR_MAX,
            n => u64::from(n),
        };
        let (addr, size) = load_initramfs(mem, initramfs, initrd_max, result.kernel_end)?;
        hdr.ramdisk_image = addr as u32;
        hdr.ramdisk_size = size as u32;
    }

    let mut params = boot_params {
        hdr,
        ..Default::default()
    };
    params.acpi_rsdp_addr = layout::ACPI_START;
    add_e820_map(&mut params, mem);
    LinuxBootConfigurator::write_bootparams(
        &BootParams::new(&params, GuestAddress(layout::ZERO_PAGE_START)),
        mem,
    )
    .map_err(BootError::ZeroPage)?;
    Ok(KernelEntry { entry })
}

/// Places the initramfs page-aligned as high as the kernel allows in low
/// RAM, above the kernel image. Returns (address, size).
fn load_initramfs(
    mem: &GuestMemory,
    file: &mut File,
    initrd_addr_max: u64,
    kernel_end: u64,
) -> Result<(u64, u64), BootError> {
    let size = file
        .seek(SeekFrom::End(0))
        .map_err(BootError::ReadInitramfs)?;
    file.seek(SeekFrom::Start(0))
        .map_err(BootError::ReadInitramfs)?;
    let low_ram_end = mem.iter().next().map_or(0, |r| r.len());
    let top = low_ram_end.min(initrd_addr_max.saturating_add(1));
    let addr = top
        .checked_sub(size)
        .map(|a| a & !(PAGE_SIZE - 1))
        .filter(|&a| a >= kernel_end && a >= layout::HIMEM_START)
        .ok_or(BootError::InitramfsTooLarge(size))?;
    let len = usize::try_from(size).map_err(|_| BootError::InitramfsTooLarge(size))?;
    let mut slice = mem
        .get_slice(GuestAddress(addr), len)
        .map_err(BootError::CopyInitramfs)?;
    file.read_exact_volatile(&mut slice)
        .map_err(|e| BootError::ReadInitramfs(std::io::Error::other(format!("{e:?}"))))?;
    Ok((addr, size))
}

/// RAM below the EBDA, the EBDA and BIOS area (holding our ACPI tables) as
/// reserved, then every RAM region from 1 MiB up.
fn add_e820_map(params: &mut boot_params, mem: &GuestMemory) {
    let mut entries = vec![
        (0, layout::EBDA_START, E820_RAM),
        (
            layout::EBDA_START,
            0xa0000 - layout::EBDA_START,
            E820_RESERVED,
        ),
        (
            layout::ACPI_START,
            layout::ACPI_END - layout::ACPI_START,
            E820_RESERVED,
        ),
    ];
    for region in mem.iter() {
        let start = region.start_addr().raw_value().max(layout::HIMEM_START);
        let end = region.start_addr().raw_value() + region.len();
        if end > start {
            entries.push((start, end - start, E820_RAM));
        }
    }
    for (slot, (addr, size, kind)) in params.e820_table.iter_mut().zip(&entries) {
        slot.addr = *addr;
        slot.size = *size;
        slot.r#type = *kind;
    }
    params.e820_entries = entries.len().min(params.e820_table.len()) as u8;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e820_map_covers_ram_and_reserves_the_bios_area() {
        let mem = crate::memory::create_guest_memory(64 << 20).unwrap();
        let mut params = boot_params::default();
        add_e820_map(&mut params, &mem);
        let n = params.e820_entries as usize;
        let table: Vec<(u64, u64, u32)> = params.e820_table[..n]
            .iter()
            .map(|e| (e.addr, e.size, e.r#type))
            .collect();
        assert_eq!(table[0], (0, layout::EBDA_START, E820_RAM));
        assert!(table.contains(&(layout::ACPI_START, 0x20000, E820_RESERVED)));
        assert_eq!(
            *table.last().unwrap(),
            (
                layout::HIMEM_START,
                (64 << 20) - layout::HIMEM_START,
                E820_RAM
            )
        );
    }

    #[test]
    fn initramfs_goes_high_and_page_aligned() {
        let mem = crate::memory::create_guest_memory(64 << 20).unwrap();
        let mut f = tempfile_with(&[7u8; 5000]);
        let (addr, size) = load_initramfs(&mem, &mut f, u64::MAX, 0x200_0000).unwrap();
        assert_eq!(size, 5000);
        assert_eq!(addr % PAGE_SIZE, 0);
        assert!(addr + size <= 64 << 20 && addr >= 0x200_0000);
        // Too large for the space above the kernel.
        let mut big = tempfile_with(&vec![0u8; 1 << 20]);
        assert!(matches!(
            load_initramfs(&mem, &mut big, u64::MAX, (64 << 20) - 4096),
            Err(BootError::InitramfsTooLarge(_))
        ));
    }

    #[test]
    fn garbage_kernel_is_an_error_not_a_panic() {
        let mem = crate::memory::create_guest_memory(64 << 20).unwrap();
        let mut f = tempfile_with(&[0x42u8; 4096]);
        assert!(matches!(
            load_kernel(&mem, &mut f, None, "console=ttyS0"),
            Err(BootError::LoadKernel(_))
        ));
        let mut tiny = tempfile_with(b"ab");
        assert!(matches!(
            load_kernel(&mem, &mut tiny, None, ""),
            Err(BootError::ReadKernel(_))
        ));
    }

    fn tempfile_with(data: &[u8]) -> File {
        use std::io::Write;
        let mut f = vmm_sys_util::tempfile::TempFile::new().unwrap().into_file();
        f.write_all(data).unwrap();
        f
    }
}
