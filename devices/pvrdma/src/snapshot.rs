// SPDX-License-Identifier: Apache-2.0
//! The device's saved state (live migration, snapshots): registers, the
//! session's DSR, namespace and every object with its IDs, rings, MR
//! mappings and transport engine. Restoring re-creates the objects with
//! the same handles, QPNs and keys, so peers keep their (GID, QPN, rkey),
//! and makes their doorbell eventfds and ioeventfds again.
//!
//! Taking the state lock quiesces the device: the worker runs every QP
//! under it, so a snapshot falls between two runs. Frames in flight then
//! are lost, and RC retransmission brings them back after the restore.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pci::MsixState;
use serde::{Deserialize, Serialize};
use vm_migration::{MigratableError, Snapshot};

use crate::dsr::LoadedDsr;
use crate::namespace::{Namespace, NamespaceState};
use crate::objects::session::Session;
use crate::objects::Objects;
use crate::state::Shared;

/// The component name in a VM snapshot.
pub(crate) const ID: &str = "pvrdma";
/// Layout of [`Saved`]; bump on any change (postcard is positional: a field
/// added anywhere inside, even `#[serde(default)]`, shifts everything after
/// it). 4: the completer's `retrying` and the responder's held ACK/NAK.
/// 5: a CQ's `ever_armed`. 6: a QP's and its engine's plain fields packed
/// into a byte string each (`rdma_transport::packed`).
pub(crate) const VERSION: u32 = 6;

/// A restore's hint ([`hint`]): its name and layout.
const HINT_ID: &str = "pvrdma-hint";
const HINT_VERSION: u32 = 1;

/// What a destination can make before the state comes.
#[derive(Serialize, Deserialize)]
struct Hint {
    /// Eventfds the objects' doorbells hold.
    eventfds: u64,
}

/// What a destination can make ahead of restoring this device's state (its
/// doorbells' eventfds, a system call each inside the blackout otherwise),
/// taken while the device runs; `None` without a session.
pub(crate) fn hint(shared: &Shared) -> Option<Snapshot> {
    let eventfds = shared.lock().session.as_ref()?.objects.eventfds();
    let hint = Hint {
        eventfds: u64::try_from(eventfds).unwrap_or(u64::MAX),
    };
    Snapshot::new(HINT_ID, HINT_VERSION, &hint).ok()
}

/// Heap the decode of the objects behind one doorbell eventfd takes, with
/// room (about 1.2 KiB a QP in process: docs/benchmarks.md), and for the
/// larger blocks (the objects' maps built at once) taken from it too.
const HEAP_PER_EVENTFD: usize = 2560;
/// Most heap [`warm_heap`] touches for one restore.
const MOST_WARM_HEAP: usize = 16 << 20;
/// Blocks [`warm_heap`] allocates: below glibc's mmap threshold (128 KiB),
/// so that they come from this thread's arena, where the decode's
/// allocations will.
const WARM_BLOCK: usize = 64 << 10;
/// glibc's default trim and mmap thresholds, put back once the restore is
/// done.
const THRESHOLD: libc::c_int = 128 << 10;

/// Touches `bytes` of this thread's heap and keeps them mapped until the
/// restore ends ([`CoolHeap`]), so that the decode inside a migration's
/// blackout finds its pages already there: in a nested TCG test host each
/// first touch of a page costs tens of microseconds, and a restore of 4096
/// QPs touched about 1700 of them (docs/benchmarks.md). Called on the
/// thread that will restore. Meanwhile glibc neither trims the heap nor
/// serves the decode's larger blocks with fresh mappings of their own.
fn warm_heap(bytes: usize) {
    let keep = libc::c_int::try_from(bytes.saturating_mul(2)).unwrap_or(libc::c_int::MAX);
    let most = libc::c_int::try_from(MOST_WARM_HEAP).unwrap_or(libc::c_int::MAX);
    // SAFETY: mallopt only changes glibc's malloc parameters.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, keep.max(THRESHOLD));
        libc::mallopt(libc::M_MMAP_THRESHOLD, most);
    }
    let blocks: Vec<Vec<u8>> = (0..bytes.div_ceil(WARM_BLOCK))
        .map(|_| vec![1u8; WARM_BLOCK])
        .collect();
    drop(std::hint::black_box(blocks));
}

/// Lets glibc give the heap [`warm_heap`] kept back to the system again
/// when dropped: at the end of a restore, whichever way it ends.
struct CoolHeap;

impl Drop for CoolHeap {
    fn drop(&mut self) {
        // SAFETY: as in `warm_heap`.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, THRESHOLD);
        }
    }
}

/// Makes the eventfds a source's [`hint`] names, at most as many as this
/// device's limits allow its objects (the source's word is not trusted),
/// and warms the heap their objects' decode will take.
pub(crate) fn prepare(shared: &Shared, hint: &Snapshot) -> Result<(), MigratableError> {
    let start = Instant::now();
    let hint: Hint = hint.state(HINT_ID, HINT_VERSION)?;
    let l = &shared.env.config.limits;
    // A QP's send and receive share one, a CQ has two (arm, arm-solicited).
    let most = u64::from(l.max_qp)
        .saturating_add(u64::from(l.max_cq).saturating_mul(2))
        .saturating_add(u64::from(l.max_srq));
    let n = usize::try_from(hint.eventfds.min(most)).unwrap_or(0);
    let made = shared.env.hub.make_ahead(n);
    let heap = n.saturating_mul(HEAP_PER_EVENTFD).min(MOST_WARM_HEAP);
    warm_heap(heap);
    log::info!(
        "pvrdma: {made} doorbell eventfds made and {} KiB of heap warmed ahead of the restore \
         in {} ms (hint: {})",
        heap / 1024,
        start.elapsed().as_millis(),
        hint.eventfds
    );
    Ok(())
}

/// What is saved; `D` and `O` are references when saving, owned when
/// restoring.
#[derive(Serialize, Deserialize)]
struct Saved<D, O> {
    err: u32,
    dsr_low: u32,
    active: bool,
    imr: u32,
    icr: u32,
    msix: MsixState,
    session: Option<SavedSession<D, O>>,
}

#[derive(Serialize, Deserialize)]
struct SavedSession<D, O> {
    dsr: D,
    ns: NamespaceState,
    objects: O,
    link_up: bool,
}

pub(crate) fn save(shared: &Shared) -> Result<Snapshot, MigratableError> {
    let start = Instant::now();
    let state = shared.lock();
    let locked = start.elapsed();
    let saved = Saved {
        err: state.err,
        dsr_low: state.dsr_low,
        active: state.active,
        imr: shared.env.irq.imr(),
        icr: shared.env.irq.icr(),
        msix: shared.env.irq.msix().state(),
        session: state.session.as_ref().map(|s| SavedSession {
            dsr: &s.dsr,
            ns: s.ns.save(),
            objects: &s.objects,
            link_up: s.link_up,
        }),
    };
    let snapshot = Snapshot::new(ID, VERSION, &saved)?;
    log::info!(
        "pvrdma: save steps: state lock {} ms, encoded in {} ms",
        locked.as_millis(),
        start.elapsed().saturating_sub(locked).as_millis()
    );
    if let Some(s) = &state.session {
        s.objects.log_ids("saved");
    }
    Ok(snapshot)
}

/// CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`).
pub(crate) fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the struct we pass.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// This thread's minor page faults, CPU time and involuntary context
/// switches, and the process's heap in use, taken between a restore's
/// steps: in a nested TCG guest a page's first touch costs far more than
/// the work on it, and on its one vCPU other threads (the source, the
/// peer's traffic) take turns with this one, so the step line says how
/// many pages each step touched first, how long it ran and how often it
/// was preempted, and how much the decode allocated.
#[derive(Clone, Copy, Default)]
struct Usage {
    faults: u64,
    cpu_us: u64,
    preempted: u64,
    heap: u64,
}

impl Usage {
    fn now() -> Self {
        // SAFETY: an all-zero `rusage` is valid; getrusage only writes it.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; RUSAGE_THREAD (1, not in libc's gnu constants)
        // is this thread's usage since Linux 2.6.26.
        if unsafe { libc::getrusage(1, &mut ru) } != 0 {
            return Self::default();
        }
        // Not getrusage's times: they count in scheduler ticks.
        let cpu_us = u64::try_from(thread_cpu().as_micros()).unwrap_or(u64::MAX);
        // SAFETY: mallinfo2 only reads glibc's arenas (under their locks).
        let m = unsafe { libc::mallinfo2() };
        Self {
            faults: u64::try_from(ru.ru_minflt).unwrap_or(0),
            cpu_us,
            preempted: u64::try_from(ru.ru_nivcsw).unwrap_or(0),
            heap: u64::try_from(m.uordblks.saturating_add(m.hblkhd)).unwrap_or(0),
        }
    }

    /// What happened between `then` and `self`, for the step line.
    fn since(&self, then: &Self) -> String {
        let cpu_ms = self.cpu_us.saturating_sub(then.cpu_us) as f64 / 1e3;
        format!(
            "{cpu_ms:.1} ms of CPU, {} faults, {} preempted",
            self.faults.saturating_sub(then.faults),
            self.preempted.saturating_sub(then.preempted)
        )
    }
}

fn restore_error(e: impl std::error::Error + Send + Sync + 'static) -> MigratableError {
    MigratableError::Restore(ID.into(), Box::new(e))
}

/// Replaces the device's state with `snapshot`'s (the device is fresh or
/// quiesced). Nothing changes unless the whole state is valid.
pub(crate) fn restore(shared: &Shared, snapshot: &Snapshot) -> Result<(), MigratableError> {
    let _cool = CoolHeap;
    // Each step's share (a restore sits in a migration's blackout).
    let u_start = Usage::now();
    let start = Instant::now();
    let saved: Saved<LoadedDsr, Objects> = snapshot.state(ID, VERSION)?;
    let decoded = start.elapsed();
    let u_decoded = Usage::now();
    let env = &shared.env;
    let session = match saved.session {
        Some(s) => {
            let ns = Namespace::restore(&env.config.limits, &s.ns).map_err(restore_error)?;
            Some(Session {
                dsr: s.dsr,
                ns,
                objects: s.objects,
                link_up: s.link_up,
            })
        }
        None => None,
    };
    let checked = start.elapsed();
    let u_checked = Usage::now();
    env.irq
        .msix()
        .set_state(&saved.msix)
        .map_err(restore_error)?;
    let routed = start.elapsed();
    let mut state = shared.lock();
    let locked = start.elapsed();
    let base = state.uar_base;
    state.session = session;
    let ahead = env.hub.ahead();
    let eventfds = state.session.as_ref().map_or(0, |s| s.objects.eventfds());
    if let Some(s) = state.session.as_mut() {
        s.objects
            .attach_doorbells(&env.hub, base)
            .map_err(restore_error)?;
    }
    state.err = saved.err;
    state.dsr_low = saved.dsr_low;
    state.active = saved.active;
    env.irq.set_imr(saved.imr);
    env.irq.set_icr(saved.icr);
    shared.wire.inbox.set_open(saved.active);
    let attached = start.elapsed();
    let u_attached = Usage::now();
    let taken = ahead.saturating_sub(env.hub.ahead());
    if let Some(s) = &state.session {
        s.objects.log_ids("restored");
    }
    drop(state);
    shared.rearm_cqs.store(true, Ordering::Release);
    // A paused device (a migration's destination, a snapshot's VM) runs
    // its QPs, and its worker watches the new doorbells (an `epoll_ctl`
    // each), once resumed: no part of a blackout.
    if !shared.paused.load(Ordering::Acquire) {
        shared.kick_all();
    }
    let ms = |d: Duration| d.as_millis();
    log::info!(
        "pvrdma: restore steps: decoded in {} ms ({}, {} KiB allocated), namespace {} ms ({}), \
         MSI-X {} ms, state lock {} ms, doorbells {} ms ({eventfds} eventfds, {taken} made \
         ahead; {} from MSI-X on)",
        ms(decoded),
        u_decoded.since(&u_start),
        u_decoded.heap.saturating_sub(u_start.heap) / 1024,
        ms(checked.saturating_sub(decoded)),
        u_checked.since(&u_decoded),
        ms(routed.saturating_sub(checked)),
        ms(locked.saturating_sub(routed)),
        ms(attached.saturating_sub(locked)),
        u_attached.since(&u_checked),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{warm_heap, CoolHeap, Usage};

    /// After `warm_heap`, as many small allocations as it warmed (a
    /// decode's) touch no new pages; without it they fault every page in.
    #[test]
    fn a_warmed_heap_is_faulted_in_ahead() {
        const BYTES: usize = 16 << 20;
        let cool = CoolHeap;
        warm_heap(BYTES);
        let before = Usage::now();
        let blocks: Vec<Vec<u8>> = (0..BYTES / 2048).map(|_| vec![1u8; 1500]).collect();
        let faults = Usage::now().faults.saturating_sub(before.faults);
        drop((std::hint::black_box(blocks), cool));
        // 16 MiB of pages is 4096 faults; a few for the pages around.
        assert!(faults < 200, "{faults} faults");
    }

    /// The step line's figures move with the work: pages touched for the
    /// first time, bytes allocated and kept, CPU spent. The pages are a
    /// fresh mapping of this test's own (a heap block may reuse pages
    /// another test already touched), and the heap block is large enough
    /// that other tests' frees meanwhile cannot hide it.
    #[test]
    fn usage_counts_faults_heap_and_cpu() {
        const PAGES: usize = 64;
        const HEAP: usize = 64 << 20;
        let before = Usage::now();
        // SAFETY: a new private anonymous mapping, checked, written only
        // within its length and unmapped below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGES * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        for page in 0..PAGES {
            // SAFETY: inside the mapping made above.
            unsafe { map.cast::<u8>().add(page * 4096).write_volatile(1) };
        }
        let kept = std::hint::black_box(vec![0u8; HEAP]);
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let after = Usage::now();
        // SAFETY: the mapping made above, unmapped once.
        unsafe { libc::munmap(map, PAGES * 4096) };
        assert!(
            after.faults.saturating_sub(before.faults) >= PAGES as u64,
            "faults"
        );
        assert!(
            after.heap.saturating_sub(before.heap) >= HEAP as u64,
            "heap"
        );
        assert!(after.cpu_us > before.cpu_us, "CPU");
        assert!(after.since(&before).contains(" faults, "));
        drop(std::hint::black_box((kept, x)));
    }
}
