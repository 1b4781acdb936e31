// SPDX-License-Identifier: Apache-2.0
//! Page directories (`pvrdma_pdir`, ABI doc 2.4): how the guest describes
//! every multi-page buffer. A directory page lists table pages, each table
//! lists up to 512 data pages.
//!
//! The walker reads each directory and table entry it needs exactly once,
//! in one read per page, and validates every GPA it returns: 4 KiB aligned
//! and wholly inside guest RAM. Callers ask only for the pages they will
//! use, so a guest that claims a huge page count costs nothing beyond the
//! pages its object actually needs.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::ops::Range;

use pvrdma_abi::{PAGE_SHIFT, PAGE_SIZE, PDIR_ENTRIES_PER_PAGE, PDIR_MAX_PAGES};
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError, Permissions};

/// Bytes of one directory or table entry.
const ENTRY_SIZE: usize = 8;
/// log2 of [`PDIR_ENTRIES_PER_PAGE`].
const ENTRIES_SHIFT: u32 = 9;

#[derive(Debug, thiserror::Error)]
pub(crate) enum PdirError {
    #[error("Page directory of {0} pages (1 to {PDIR_MAX_PAGES})")]
    PageCount(u32),
    #[error("Pages {start}..{end} are outside the {npages}-page directory")]
    Range { start: u32, end: u32, npages: u32 },
    #[error("Page {0:#x} is not 4 KiB aligned")]
    Unaligned(u64),
    #[error("Page {0:#x} is not guest RAM")]
    NotRam(u64),
    #[error("Failed to read the page directory")]
    Read(#[source] GuestMemoryError),
}

/// Checks that `gpa` names a whole guest RAM page.
pub(crate) fn check_page<M: GuestMemory>(mem: &M, gpa: u64) -> Result<u64, PdirError> {
    if gpa & (PAGE_SIZE - 1) != 0 {
        return Err(PdirError::Unaligned(gpa));
    }
    // PAGE_SIZE fits usize on every supported host.
    if !mem.check_range(
        GuestAddress(gpa),
        PAGE_SIZE as usize,
        Permissions::ReadWrite,
    ) {
        return Err(PdirError::NotRam(gpa));
    }
    Ok(gpa)
}

/// A validated page directory of `npages` logical pages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PageDir {
    dir: u64,
    npages: u32,
}

impl PageDir {
    /// Checks the page count and the directory page itself.
    pub(crate) fn new<M: GuestMemory>(mem: &M, dir: u64, npages: u32) -> Result<Self, PdirError> {
        if npages == 0 || npages > PDIR_MAX_PAGES {
            return Err(PdirError::PageCount(npages));
        }
        check_page(mem, dir)?;
        Ok(Self { dir, npages })
    }

    /// GPAs of logical pages `range`, read once and validated.
    pub(crate) fn pages<M: GuestMemory>(
        &self,
        mem: &M,
        range: Range<u32>,
    ) -> Result<Vec<u64>, PdirError> {
        let Range { start, end } = range;
        if start > end || end > self.npages {
            return Err(PdirError::Range {
                start,
                end,
                npages: self.npages,
            });
        }
        let mut pages = Vec::with_capacity(len_usize(end.saturating_sub(start)));
        if start == end {
            return Ok(pages);
        }
        // end >= 1 here; table indices are < 512 since end <= PDIR_MAX_PAGES.
        let first_table = start >> ENTRIES_SHIFT;
        let last_table = end.saturating_sub(1) >> ENTRIES_SHIFT;
        let tables = read_entries(mem, self.dir, first_table..last_table.saturating_add(1))?;
        for (table, gpa) in (first_table..).zip(tables) {
            check_page(mem, gpa)?;
            let base = table.saturating_mul(PDIR_ENTRIES_PER_PAGE);
            let lo = start.max(base).saturating_sub(base);
            let hi = end
                .min(base.saturating_add(PDIR_ENTRIES_PER_PAGE))
                .saturating_sub(base);
            for page in read_entries(mem, gpa, lo..hi)? {
                pages.push(check_page(mem, page)?);
            }
        }
        Ok(pages)
    }
}

/// Bytes spanned by `pages` pages (for sizing rings and regions).
pub(crate) const fn pages_to_bytes(pages: u32) -> u64 {
    (pages as u64) << PAGE_SHIFT
}

fn len_usize(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Entries `range` (< 512) of the table or directory page at `page`, in one
/// read.
fn read_entries<M: GuestMemory>(
    mem: &M,
    page: u64,
    range: Range<u32>,
) -> Result<Vec<u64>, PdirError> {
    let count = len_usize(range.end.saturating_sub(range.start));
    let mut buf = vec![0u8; count.saturating_mul(ENTRY_SIZE)];
    // range.start < 512, so the offset stays inside the page.
    let at = page.saturating_add(u64::from(range.start).saturating_mul(ENTRY_SIZE as u64));
    mem.read_slice(&mut buf, GuestAddress(at))
        .map_err(PdirError::Read)?;
    Ok(buf
        .chunks_exact(ENTRY_SIZE)
        .map(|chunk| {
            let mut bytes = [0u8; ENTRY_SIZE];
            bytes.copy_from_slice(chunk);
            u64::from_le_bytes(bytes)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use vm_memory::GuestMemoryMmap;

    use super::*;

    const MEM_SIZE: usize = 0x100_0000;
    type Mem = GuestMemoryMmap<()>;

    fn mem() -> Mem {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
    }

    /// A directory at 0x1000 with tables from 0x2000, mapping logical page
    /// i to 0x10_0000 + i * 4096.
    fn build(mem: &Mem, npages: u32) -> PageDir {
        let ntables = (npages - 1) / 512 + 1;
        for t in 0..ntables {
            let table = 0x2000 + u64::from(t) * 0x1000;
            mem.write_obj(table, GuestAddress(0x1000 + u64::from(t) * 8))
                .unwrap();
            for e in 0..512.min(npages - t * 512) {
                let page = 0x10_0000 + u64::from(t * 512 + e) * 0x1000;
                mem.write_obj(page, GuestAddress(table + u64::from(e) * 8))
                    .unwrap();
            }
        }
        PageDir::new(mem, 0x1000, npages).unwrap()
    }

    #[test]
    fn walks_one_and_several_tables() {
        let mem = mem();
        let dir = build(&mem, 1100);
        assert_eq!(dir.pages(&mem, 0..1).unwrap(), vec![0x10_0000]);
        let pages = dir.pages(&mem, 510..515).unwrap();
        let expected: Vec<u64> = (510..515).map(|i| 0x10_0000 + i * 0x1000).collect();
        assert_eq!(pages, expected);
        let all = dir.pages(&mem, 0..1100).unwrap();
        assert_eq!(all.len(), 1100);
        assert_eq!(all[1099], 0x10_0000 + 1099 * 0x1000);
        assert!(dir.pages(&mem, 7..7).unwrap().is_empty());
    }

    #[test]
    fn rejects_bad_counts_and_ranges() {
        let mem = mem();
        for npages in [0, PDIR_MAX_PAGES + 1, u32::MAX] {
            assert!(matches!(
                PageDir::new(&mem, 0x1000, npages),
                Err(PdirError::PageCount(_))
            ));
        }
        let dir = build(&mem, 4);
        assert!(matches!(
            dir.pages(&mem, 0..5),
            Err(PdirError::Range { .. })
        ));
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 3..2;
        assert!(matches!(
            dir.pages(&mem, backwards),
            Err(PdirError::Range { .. })
        ));
        assert!(PageDir::new(&mem, 0x1000, PDIR_MAX_PAGES).is_ok());
    }

    #[test]
    fn rejects_bad_directory_table_and_data_pages() {
        let mem = mem();
        for dir in [0x1008, MEM_SIZE as u64, !0xfffu64] {
            assert!(PageDir::new(&mem, dir, 1).is_err(), "dir {dir:#x}");
        }
        for table in [0x2004u64, MEM_SIZE as u64 + 0x1000, u64::MAX] {
            let dir = build(&mem, 2);
            mem.write_obj(table, GuestAddress(0x1000)).unwrap();
            assert!(dir.pages(&mem, 0..1).is_err(), "table {table:#x}");
        }
        for page in [0x10_0001u64, MEM_SIZE as u64, MEM_SIZE as u64 + 0x10_0000] {
            let dir = build(&mem, 2);
            mem.write_obj(page, GuestAddress(0x2008)).unwrap();
            assert!(dir.pages(&mem, 0..1).is_ok(), "page 0 untouched");
            assert!(dir.pages(&mem, 0..2).is_err(), "page {page:#x}");
        }
        assert!(matches!(
            check_page(&mem, 0x1001),
            Err(PdirError::Unaligned(0x1001))
        ));
        assert!(matches!(
            check_page(&mem, MEM_SIZE as u64),
            Err(PdirError::NotRam(_))
        ));
    }
}
