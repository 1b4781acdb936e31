// SPDX-License-Identifier: Apache-2.0
//! Loading the device shared region on DSRHIGH (ABI doc 2.2, 6.1): read it
//! once, validate every GPA and ring descriptor in it, map the two event
//! rings, and fill in the capabilities before the write returns (the
//! driver reads them right after).
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::mem::size_of;

use pvrdma_abi::dsr::{DeviceCaps, Dsr, RingPageInfo, DSR_CAPS_OFFSET};
use pvrdma_abi::ring::{RingGeometry, RX_OFFSET};
use pvrdma_abi::wqe::{Cqne, Eqe};
use pvrdma_abi::PAGE_SIZE;
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError};

use crate::events::EventRings;
use crate::pdir::{check_page, pages_to_bytes, PageDir, PdirError};
use crate::ring::{ProducerRing, Ring};

/// Pages (header included) a DSR ring may have: one page table's worth.
/// The driver uses 4; QEMU's unbounded count was CVE-2023-1544.
pub(crate) const MAX_EVENT_RING_PAGES: u32 = 512;

#[derive(Debug, thiserror::Error)]
pub(crate) enum DsrError {
    #[error("DSR at {0:#x} is not a page of guest RAM")]
    Address(u64),
    #[error("Failed to access the DSR")]
    Memory(#[source] GuestMemoryError),
    #[error("Invalid command or response slot")]
    Slot(#[source] PdirError),
    #[error("{ring} ring has {pages} pages (2 to {MAX_EVENT_RING_PAGES})")]
    RingPages { ring: &'static str, pages: u32 },
    #[error("Invalid {ring} ring page directory")]
    RingPdir {
        ring: &'static str,
        #[source]
        source: PdirError,
    },
}

/// What the device keeps from a loaded DSR.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct LoadedDsr {
    /// The guest driver's `PVRDMA_VERSION`.
    pub(crate) driver_version: u32,
    pub(crate) cmd_slot: u64,
    pub(crate) resp_slot: u64,
    pub(crate) events: EventRings,
}

/// Loads the DSR at `gpa` and writes `caps` into it.
pub(crate) fn load<M: GuestMemory>(
    mem: &M,
    gpa: u64,
    caps: &DeviceCaps,
) -> Result<LoadedDsr, DsrError> {
    if gpa & (PAGE_SIZE - 1) != 0 {
        return Err(DsrError::Address(gpa));
    }
    check_page(mem, gpa).map_err(|_| DsrError::Address(gpa))?;
    let dsr: Dsr = mem.read_obj(GuestAddress(gpa)).map_err(DsrError::Memory)?;
    let cmd_slot = check_page(mem, dsr.cmd_slot_dma).map_err(DsrError::Slot)?;
    let resp_slot = check_page(mem, dsr.resp_slot_dma).map_err(DsrError::Slot)?;
    let async_ring = map_ring(mem, "async event", &dsr.async_ring_pages, size_of::<Eqe>())?;
    let cq_ring = map_ring(
        mem,
        "CQ notification",
        &dsr.cq_ring_pages,
        size_of::<Cqne>(),
    )?;
    // The DSR is a page of RAM (checked above): caps fit behind it.
    mem.write_obj(*caps, GuestAddress(gpa.saturating_add(DSR_CAPS_OFFSET)))
        .map_err(DsrError::Memory)?;
    Ok(LoadedDsr {
        driver_version: dsr.driver_version,
        cmd_slot,
        resp_slot,
        events: EventRings::new(async_ring, cq_ring),
    })
}

/// Maps a DSR ring: page 0 holds the state (`rx` indices), the rest
/// entries of `entry_size` bytes, counted as the driver counts them.
fn map_ring<M: GuestMemory>(
    mem: &M,
    ring: &'static str,
    info: &RingPageInfo,
    entry_size: usize,
) -> Result<ProducerRing, DsrError> {
    let pages = info.num_pages;
    if !(2..=MAX_EVENT_RING_PAGES).contains(&pages) {
        return Err(DsrError::RingPages { ring, pages });
    }
    let pdir_err = |source| DsrError::RingPdir { ring, source };
    let pdir = PageDir::new(mem, info.pdir_dma, pages).map_err(pdir_err)?;
    let all = pdir.pages(mem, 0..pages).map_err(pdir_err)?;
    let (&header, data) = all
        .split_first()
        .ok_or(DsrError::RingPages { ring, pages })?;
    // Both sizes are tiny constants; data pages <= 511.
    let entry = u32::try_from(entry_size).unwrap_or(u32::MAX);
    let data_bytes = pages_to_bytes(pages.saturating_sub(1));
    let max_elems = data_bytes
        .checked_div(u64::from(entry))
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0);
    RingGeometry::new(max_elems)
        .and_then(|g| Ring::new(header, RX_OFFSET, data.to_vec(), g, entry))
        .map(ProducerRing::new)
        .ok_or(DsrError::RingPages { ring, pages })
}
