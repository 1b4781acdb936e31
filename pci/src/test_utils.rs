// SPDX-License-Identifier: Apache-2.0
//! Mock hypervisor hooks for device tests (feature `test-utils`, and this
//! crate's own tests): an [`MsiRouter`] whose vectors a test can watch
//! fire, an [`IoEventRegistrar`] that records doorbells the way KVM
//! does, and guest memory given back as new ([`zero_written_pages`]) or as
//! it was once set up ([`MemoryImage`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MmapRegion,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::{IoEventRegistrar, MsiMessage, MsiRouter, MsiVector, Msix, PciConfiguration};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Hands out non-blocking irqfds (GSI `n` is the `n`th allocation) and
/// keeps a copy of each, so a test can see which vector fired; records
/// routes and releases.
#[derive(Debug, Default)]
pub struct MockMsi {
    state: Mutex<MsiState>,
}

#[derive(Debug, Default)]
struct MsiState {
    /// Every irqfd handed out, by GSI.
    irqfds: Vec<EventFd>,
    live: BTreeSet<u32>,
    /// Fails `allocate` once this many vectors are live.
    limit: Option<usize>,
    routes: BTreeMap<u32, MsiMessage>,
    route_calls: usize,
    released: Vec<u32>,
}

impl MockMsi {
    /// Makes `allocate` fail while `limit` vectors are live.
    pub fn set_limit(&self, limit: usize) {
        lock(&self.state).limit = Some(limit);
    }

    /// How often vector `gsi` fired since the last call. Panics if `gsi`
    /// was never allocated.
    pub fn fired(&self, gsi: usize) -> u64 {
        lock(&self.state).irqfds[gsi].read().unwrap_or(0)
    }

    /// A copy of vector `gsi`'s irqfd (non-blocking), to wait on as a
    /// guest's interrupt handler would; reading it counts as [`Self::fired`]
    /// does. Panics if `gsi` was never allocated.
    pub fn irqfd(&self, gsi: usize) -> io::Result<EventFd> {
        lock(&self.state).irqfds[gsi].try_clone()
    }

    /// The route installed for `gsi`, if any.
    pub fn route(&self, gsi: u32) -> Option<MsiMessage> {
        lock(&self.state).routes.get(&gsi).copied()
    }

    /// Whether a route is installed for `gsi`.
    pub fn routed(&self, gsi: u32) -> bool {
        self.route(gsi).is_some()
    }

    /// How many times `set_route` was called.
    pub fn route_calls(&self) -> usize {
        lock(&self.state).route_calls
    }

    /// The GSIs allocated and not released yet.
    pub fn live(&self) -> Vec<u32> {
        lock(&self.state).live.iter().copied().collect()
    }

    /// The GSIs released so far, in order.
    pub fn released(&self) -> Vec<u32> {
        lock(&self.state).released.clone()
    }
}

impl MsiRouter for MockMsi {
    fn allocate(&self) -> io::Result<MsiVector> {
        let mut state = lock(&self.state);
        if state.limit.is_some_and(|limit| state.live.len() >= limit) {
            return Err(io::Error::other("out of GSIs"));
        }
        let gsi = u32::try_from(state.irqfds.len()).map_err(io::Error::other)?;
        let irqfd = EventFd::new(EFD_NONBLOCK)?;
        state.irqfds.push(irqfd.try_clone()?);
        state.live.insert(gsi);
        Ok(MsiVector { gsi, irqfd })
    }

    fn set_route(&self, gsi: u32, msg: Option<MsiMessage>) -> io::Result<()> {
        let mut state = lock(&self.state);
        state.route_calls += 1;
        match msg {
            Some(msg) => state.routes.insert(gsi, msg),
            None => state.routes.remove(&gsi),
        };
        Ok(())
    }

    /// One update, as KVM's: counted as one route call.
    fn set_routes(&self, routes: &[(u32, MsiMessage)]) -> io::Result<()> {
        let mut state = lock(&self.state);
        state.route_calls += 1;
        state.routes.extend(routes.iter().copied());
        Ok(())
    }

    fn release(&self, vector: &MsiVector) -> io::Result<()> {
        let mut state = lock(&self.state);
        state.live.remove(&vector.gsi);
        state.released.push(vector.gsi);
        Ok(())
    }
}

/// Programs and unmasks every MSI-X table entry and enables MSI-X, as
/// Linux's `pci_enable_msix` does (the capability must be the function's
/// first).
pub fn enable_all_vectors(config: &mut PciConfiguration, msix: &mut Msix) {
    for v in 0..u32::from(msix.vectors()) {
        let entry = u64::from(v) * 16;
        for (off, value) in [(0, 0xfee0_0000u32), (4, 0), (8, 0x40 + v), (12, 0)] {
            msix.write_table(entry + off, &value.to_le_bytes());
        }
    }
    let cap = config.read_reg(0x34 / 4) as usize & 0xff;
    config.write_reg(cap / 4, 3, &[0x80]);
    msix.config_written(config);
    assert!(msix.enabled());
}

/// Records ioeventfds like KVM: a second registration of the same address
/// and datamatch fails with EEXIST, unregistering what is not registered
/// with ENOENT. A [`MockIoEvents::strict`] one panics instead, and on any
/// datamatch too: for devices that must never do either. Registrations
/// are kept by (address, datamatch), so thousands of doorbells cost what
/// they cost in KVM, not a search each.
#[derive(Debug, Default)]
pub struct MockIoEvents {
    regs: Mutex<Registrations>,
    fail: AtomicBool,
    strict: bool,
}

/// Each registration's sequence number and copy of its eventfd.
#[derive(Debug, Default)]
struct Registrations {
    next: u64,
    by_key: BTreeMap<(u64, Option<u32>), (u64, EventFd)>,
}

impl Registrations {
    /// The eventfd KVM signals for a 4-byte write of `value` at `addr`:
    /// an exact datamatch first, else one without.
    fn find(&self, addr: u64, value: u32) -> Option<&EventFd> {
        self.by_key
            .get(&(addr, Some(value)))
            .or_else(|| self.by_key.get(&(addr, None)))
            .map(|(_, fd)| fd)
    }
}

impl MockIoEvents {
    /// Panics on a datamatch, a duplicate registration or an unregister of
    /// what is not registered.
    pub fn strict() -> Self {
        Self {
            strict: true,
            ..Self::default()
        }
    }

    /// Makes every later registration fail (as with RLIMIT_NOFILE hit).
    pub fn set_fail(&self, fail: bool) {
        self.fail.store(fail, Ordering::SeqCst);
    }

    pub fn count(&self) -> usize {
        lock(&self.regs).by_key.len()
    }

    /// (address, datamatch) of every registration, sorted.
    pub fn registrations(&self) -> Vec<(u64, Option<u32>)> {
        lock(&self.regs).by_key.keys().copied().collect()
    }

    /// (address, eventfd) of every registration, in registration order, so
    /// a test can signal a doorbell as KVM would.
    pub fn doorbells(&self) -> Vec<(u64, EventFd)> {
        let regs = lock(&self.regs);
        let mut all: Vec<_> = regs
            .by_key
            .iter()
            .map(|(&(addr, _), (seq, fd))| {
                let fd = fd.try_clone().unwrap_or_else(|e| panic!("{e}"));
                (*seq, addr, fd)
            })
            .collect();
        all.sort_unstable_by_key(|&(seq, ..)| seq);
        all.into_iter().map(|(_, addr, fd)| (addr, fd)).collect()
    }

    /// The eventfd KVM would signal for a 4-byte write of `value` at
    /// `addr`, if any.
    pub fn lookup(&self, addr: u64, value: u32) -> Option<EventFd> {
        lock(&self.regs)
            .find(addr, value)
            .and_then(|fd| fd.try_clone().ok())
    }

    /// Signals the eventfd KVM would for a 4-byte write of `value` at
    /// `addr`, as KVM does: without duplicating it (two system calls that
    /// would weigh on latency benchmarks). False when none matches.
    pub fn signal(&self, addr: u64, value: u32) -> bool {
        let regs = lock(&self.regs);
        let Some(fd) = regs.find(addr, value) else {
            return false;
        };
        fd.write(1).unwrap_or_else(|e| panic!("ioeventfd: {e}"));
        true
    }
}

impl IoEventRegistrar for MockIoEvents {
    fn register(&self, fd: &EventFd, addr: u64, datamatch: Option<u32>) -> io::Result<()> {
        if self.strict {
            assert_eq!(datamatch, None, "datamatch at {addr:#x}");
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc_errno::EMFILE));
        }
        let mut regs = lock(&self.regs);
        if regs.by_key.contains_key(&(addr, datamatch)) {
            assert!(!self.strict, "registered {addr:#x} twice");
            return Err(io::Error::from_raw_os_error(libc_errno::EEXIST));
        }
        let seq = regs.next;
        regs.next += 1;
        regs.by_key
            .insert((addr, datamatch), (seq, fd.try_clone()?));
        Ok(())
    }

    fn unregister(&self, _fd: &EventFd, addr: u64, datamatch: Option<u32>) -> io::Result<()> {
        if lock(&self.regs).by_key.remove(&(addr, datamatch)).is_none() {
            assert!(
                !self.strict,
                "unregistered {addr:#x}, which is not registered"
            );
            return Err(io::Error::from_raw_os_error(libc_errno::ENOENT));
        }
        Ok(())
    }
}

/// The errno values KVM returns (this crate does not depend on libc).
mod libc_errno {
    pub(super) const ENOENT: i32 = 2;
    pub(super) const EEXIST: i32 = 17;
    pub(super) const EMFILE: i32 = 24;
}

/// Puts guest memory back as it was created (all zero, nothing dirty), by
/// zeroing only the pages its dirty bitmap says were written: a harness
/// that keeps its guest across fuzz inputs pays for what an input wrote,
/// not for the whole of RAM, and faults nothing in again.
pub fn zero_written_pages(mem: &GuestMemoryMmap<AtomicBitmap>) {
    MemoryImage::default().rewind(mem);
}

const PAGE: usize = 4096;

/// The pages of guest memory written since it was created (or since the
/// last [`MemoryImage::take`] or [`MemoryImage::rewind`]), with their
/// contents: what a VMM's snapshot of a fresh guest holds. A harness that
/// set a guest up once takes its image, then puts memory back to it after
/// every input ([`MemoryImage::rewind`]) instead of setting it up again.
#[derive(Clone, Debug, Default)]
pub struct MemoryImage {
    /// Guest address of each written page, and its bytes.
    pages: BTreeMap<u64, Box<[u8; PAGE]>>,
}

/// Takes every dirty page of `mem` off its bitmap, in address order.
fn take_written(mem: &GuestMemoryMmap<AtomicBitmap>) -> Vec<u64> {
    let mut pages = Vec::new();
    for region in mem.iter() {
        let start = region.start_addr().0;
        // The region's own bitmap, not the trait's slice of it.
        let bitmap: &AtomicBitmap = MmapRegion::bitmap(region);
        for (word, bits) in bitmap.get_and_reset().into_iter().enumerate() {
            let mut bits = bits;
            while bits != 0 {
                let page = word * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                pages.push(start + (page * PAGE) as u64);
            }
        }
    }
    pages
}

/// The guest addresses of the pages of `mem` its dirty bitmap says were
/// written, in order, with the bitmap left as it was: one pass over its
/// words instead of a question per page (a harness clearing a fuzz input's
/// rings asked about thousands of pages).
pub fn written_pages(mem: &GuestMemoryMmap<AtomicBitmap>) -> Vec<u64> {
    let pages = take_written(mem);
    for &at in &pages {
        if let Some(region) = mem.find_region(GuestAddress(at)) {
            let offset = at - region.start_addr().0;
            MmapRegion::bitmap(region).set_addr_range(offset as usize, PAGE);
        }
    }
    pages
}

impl MemoryImage {
    /// The pages of `mem` its dirty bitmap says were written (all that are
    /// not zero if nothing reset the bitmap since `mem` was created), and
    /// their bytes now; the bitmap starts over.
    pub fn take(mem: &GuestMemoryMmap<AtomicBitmap>) -> Self {
        let mut pages = BTreeMap::new();
        for at in take_written(mem) {
            let mut page = Box::new([0u8; PAGE]);
            if mem.read_slice(&mut page[..], GuestAddress(at)).is_ok() {
                pages.insert(at, page);
            }
        }
        Self { pages }
    }

    /// Writes the image's pages into `mem`, another guest at least as large,
    /// as a migration destination receives a source's memory.
    pub fn copy_to(&self, mem: &GuestMemoryMmap<AtomicBitmap>) {
        for (at, page) in &self.pages {
            mem.write_slice(&page[..], GuestAddress(*at))
                .unwrap_or_else(|e| panic!("page {at:#x}: {e}"));
        }
    }

    /// Puts `mem` back as it was when this image was taken: every page
    /// written since gets the image's bytes, or zeros if the image has none
    /// (a page the image has but nothing wrote since is as it was). Nothing
    /// is dirty afterwards.
    pub fn rewind(&self, mem: &GuestMemoryMmap<AtomicBitmap>) {
        let zeros = [0u8; PAGE];
        for at in take_written(mem) {
            let bytes = self.pages.get(&at).map_or(&zeros, |p| &**p);
            let _ = mem.write_slice(bytes, GuestAddress(at));
        }
        // The writes marked the pages again.
        for region in mem.iter() {
            MmapRegion::bitmap(region).reset();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rewinding puts back the image's pages, zeroes pages written only
    /// after it, leaves the rest alone and nothing dirty.
    #[test]
    fn memory_image_rewinds_written_pages() {
        let mem: GuestMemoryMmap<AtomicBitmap> =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 * PAGE)]).expect("memory");
        let page = |n: usize| GuestAddress((n * PAGE) as u64);
        mem.write_slice(&[1; 8], page(1)).expect("write");
        mem.write_slice(&[2; 8], page(3)).expect("write");
        let image = MemoryImage::take(&mem);
        let set_up = |mem: &GuestMemoryMmap<AtomicBitmap>| {
            let mut all = vec![0u8; 16 * PAGE];
            mem.read_slice(&mut all, GuestAddress(0)).expect("read");
            all
        };
        let before = set_up(&mem);
        for round in 0..2u8 {
            mem.write_slice(&[9; 8], page(1)).expect("write");
            mem.write_slice(&[round + 7; 100], page(5)).expect("write");
            image.rewind(&mem);
            assert!(set_up(&mem) == before, "round {round}: memory differs");
            assert!(take_written(&mem).is_empty(), "round {round}: dirty pages");
        }
        zero_written_pages(&mem);
        assert!(set_up(&mem) == before, "nothing was written since");
        let other: GuestMemoryMmap<AtomicBitmap> =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 * PAGE)]).expect("memory");
        image.copy_to(&other);
        assert!(set_up(&other) == before, "the copy differs");
    }

    /// The written pages, in order, across regions, and the bitmap as it was.
    #[test]
    fn written_pages_leave_the_bitmap_alone() {
        let mem: GuestMemoryMmap<AtomicBitmap> = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 130 * PAGE),
            (GuestAddress(0x100_0000), 4 * PAGE),
        ])
        .expect("memory");
        let pages = [0x100_2000, 129 * PAGE as u64, 64 * PAGE as u64, 0x3000];
        for at in pages {
            mem.write_slice(&[1], GuestAddress(at)).expect("write");
        }
        let want = vec![0x3000, 64 * PAGE as u64, 129 * PAGE as u64, 0x100_2000];
        assert_eq!(written_pages(&mem), want);
        assert_eq!(written_pages(&mem), want, "asked again");
        assert_eq!(take_written(&mem), want, "the bitmap");
        assert!(written_pages(&mem).is_empty());
    }
}
