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
use vm_migration::nested::Bytes;
use vm_migration::{MigratableError, Snapshot};

use crate::dsr::LoadedDsr;
use crate::namespace::{Namespace, NamespaceState};
use crate::objects::qp::saved::{with_ahead, Presented};
use crate::objects::session::Session;
use crate::objects::Objects;
use crate::state::Shared;

/// The component name in a VM snapshot.
pub(crate) const ID: &str = "pvrdma";
/// Layout of [`Saved`]; bump on any change (postcard is positional: a field
/// added anywhere inside, even `#[serde(default)]`, shifts everything after
/// it). 4: the completer's `retrying` and the responder's held ACK/NAK.
/// 5: a CQ's `ever_armed`. 6: a QP's and its engine's plain fields packed
/// into a byte string each (`rdma_transport::packed`). 7: a QP's fixed
/// part apart from its rings' indices, and left out when sent ahead.
/// 8: a QP's short part nested as bytes, left out when the same as sent
/// ahead. 9: the QPs as sent ahead listed apart from the others
/// (`saved::map`). 10: the namespace's IDs in use packed into a byte
/// string each. 11: no QPN index (made again from the QPs).
pub(crate) const VERSION: u32 = 11;

/// A restore's hint ([`hint`]): its name and layout. 2: the QPs' fixed
/// parts. 3: where BAR2 is, for their doorbells. 4: the short parts of the
/// QPs sent before (a later hint). 5: the QPs' handles beside both.
const HINT_ID: &str = "pvrdma-hint";
const HINT_VERSION: u32 = 5;

/// Most ring pages a hint sends ahead: the QPs past it are saved whole.
/// A page is at most 9 bytes encoded, so the hint stays within the
/// migration protocol's `MAX_HINTS_BYTES` with room for the rest.
const MOST_PRESENT_PAGES: usize = 1 << 20;
/// Most bytes of QPs' short parts a later hint sends (a QP's is some 300
/// bytes idle, more with work queued): the QPs past it come in the state,
/// and the hint stays within `MAX_HINTS_BYTES` beside the pages above.
const MOST_SENT_BYTES: usize = 6 << 20;

/// What a destination can make before the state comes; `Q` is the QPs'
/// fixed parts (`saved::Presented`), borrowed when sent, and `N` a QP's
/// handle and short part (`vm_migration::nested::Bytes`).
#[derive(Serialize, Deserialize)]
struct Hint<Q, N> {
    /// Eventfds the objects' doorbells hold.
    eventfds: u64,
    /// Where BAR2 is (the doorbells' ioeventfds), as the restore will
    /// most likely find it.
    uar_base: Option<u64>,
    /// QPs' parts that do not change while they live, by handle and `gen`, of the
    /// QPs not sent ahead before: their save inside the blackout leaves
    /// them out.
    qps: Vec<Q>,
    /// The short parts of the QPs sent ahead before (empty in the first
    /// hint): a QP's save that finds its own the same leaves it out.
    states: Vec<N>,
}

/// A hint as a destination reads it.
type Received = Hint<Presented, (u32, Bytes<Vec<u8>>)>;

/// What a destination can make ahead of restoring this device's state (its
/// doorbells' eventfds, a system call each inside the blackout otherwise)
/// and the QPs' parts that do not change, taken while the device runs;
/// `None` without a session. The QPs sent are marked so that the save
/// leaves those parts out, until [`forget_hint`]. Taken again (just before
/// a migration's switch-over), it also carries the short parts of the QPs
/// sent before, which the source keeps: a QP that stays the same until
/// the save is saved as its `gen` alone.
pub(crate) fn hint(shared: &Shared) -> Option<Snapshot> {
    if let Err(e) = keep_short_parts(shared) {
        log::warn!("pvrdma: no restore hint: {e}");
        forget_hint(shared);
        return None;
    }
    let mut state = shared.lock();
    let uar_base = state.uar_base;
    let objects = &mut state.session.as_mut()?.objects;
    let mut pages = 0usize;
    let mut fresh = Vec::new();
    for (&handle, qp) in objects.qps.iter_mut() {
        pages = pages.saturating_add(qp.fixed().pages());
        if !qp.presented && pages <= MOST_PRESENT_PAGES {
            qp.presented = true;
            fresh.push(handle);
        }
    }
    let hint = Hint {
        eventfds: u64::try_from(objects.eventfds()).unwrap_or(u64::MAX),
        uar_base,
        qps: fresh
            .iter()
            .filter_map(|&h| objects.qps.get(&h).map(|qp| (h, qp.gen, qp.fixed())))
            .collect(),
        states: objects
            .qps
            .iter()
            .filter_map(|(&h, qp)| qp.sent.as_deref().map(|b| (h, Bytes(b))))
            .collect(),
    };
    let hint = Snapshot::new(HINT_ID, HINT_VERSION, &hint);
    if hint.is_err() {
        forget(objects);
    }
    hint.ok()
}

/// QPs whose short parts [`keep_short_parts`] encodes per hold of the
/// state lock.
const SHORT_PARTS_PER_LOCK: usize = 128;

/// Has each QP sent ahead before (none in a first hint) keep its short
/// part as it is now (`sent`, which the hint then carries), up to
/// [`MOST_SENT_BYTES`]; the others keep none. A few QPs per hold of the
/// state lock, so that the worker serves traffic in between: held for
/// 4096 QPs at once (tens of milliseconds in the test host, just before
/// the pause), it let the peers' retransmission timers run out, and their
/// retransmissions then took the CPU from the switch-over.
fn keep_short_parts(shared: &Shared) -> Result<(), String> {
    let mut bytes = 0usize;
    let mut from = Some(0u32);
    while let Some(start) = from.take() {
        let mut state = shared.lock();
        let Some(session) = state.session.as_mut() else {
            break;
        };
        for (n, (&handle, qp)) in session.objects.qps.range_mut(start..).enumerate() {
            if n == SHORT_PARTS_PER_LOCK {
                from = Some(handle);
                break;
            }
            if !qp.presented {
                qp.send(None);
                continue;
            }
            let part = qp.short_bytes()?;
            if bytes.saturating_add(part.len()) <= MOST_SENT_BYTES {
                bytes = bytes.saturating_add(part.len());
                qp.send(Some(part.into()));
            } else {
                qp.send(None);
            }
        }
    }
    Ok(())
}

/// The migration that took the [`hint`] ended: saves are whole again.
pub(crate) fn forget_hint(shared: &Shared) {
    if let Some(s) = shared.lock().session.as_mut() {
        forget(&mut s.objects);
    }
}

fn forget(objects: &mut Objects) {
    for qp in objects.qps.values_mut() {
        qp.presented = false;
        qp.sent = None;
    }
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
/// warms the heap their objects' decode will take and keeps the QPs'
/// fixed parts for the restore, once checked: as many QPs and ring pages
/// as this device's limits allow, each ring as a restore checks it. A
/// later hint's QPs are kept too, and its short parts decoded into the
/// QPs they complete, checked as a restore checks them.
pub(crate) fn prepare(shared: &Shared, hint: &Snapshot) -> Result<(), MigratableError> {
    let start = Instant::now();
    let hint: Received = hint.state(HINT_ID, HINT_VERSION)?;
    let refused = |why: String| MigratableError::Restore(HINT_ID.into(), why.into());
    let l = &shared.env.config.limits;
    let mut ahead = std::mem::take(&mut shared.lock().ahead);
    let first = ahead.is_empty();
    let pages = hint
        .qps
        .iter()
        .map(|(_, _, fixed)| fixed.pages())
        .fold(ahead.pages(), usize::saturating_add);
    let qps = ahead.qps().saturating_add(hint.qps.len());
    if qps > usize::try_from(l.max_qp).unwrap_or(usize::MAX)
        || u64::try_from(pages).unwrap_or(u64::MAX) > l.max_mapped_pages
    {
        return Err(refused(format!(
            "{qps} QPs with {pages} ring pages sent ahead, over this device's limits"
        )));
    }
    let presented = hint.qps.len();
    let (made, heap) = if first {
        // A QP's send and receive share one, a CQ has two (arm, arm-solicited).
        let most = u64::from(l.max_qp)
            .saturating_add(u64::from(l.max_cq).saturating_mul(2))
            .saturating_add(u64::from(l.max_srq));
        let n = usize::try_from(hint.eventfds.min(most)).unwrap_or(0);
        let made = shared.env.hub.make_ahead(n);
        let heap = n.saturating_mul(HEAP_PER_EVENTFD).min(MOST_WARM_HEAP);
        warm_heap(heap);
        (made, heap)
    } else {
        (0, 0)
    };
    // The kept QPs' doorbells, made here and registered where the source
    // had BAR2 (the VMM defers the KVM calls until the VM runs, as it does
    // the restore's): eventfds, watches and registrations the restore
    // would otherwise make inside the blackout. The guest cannot ring them
    // before it runs here.
    for (handle, gen, mut fixed) in hint.qps {
        fixed
            .attach(&shared.env.hub, gen, hint.uar_base)
            .map_err(|e| MigratableError::Restore(HINT_ID.into(), Box::new(e)))?;
        ahead.keep(handle, gen, fixed).map_err(refused)?;
    }
    let completed = hint.states.len();
    let mut budget = vm_migration::MAX_DECODED_BYTES;
    for (handle, Bytes(short)) in &hint.states {
        ahead
            .complete(*handle, short, &mut budget)
            .map_err(refused)?;
    }
    shared.lock().ahead = ahead;
    log::info!(
        "pvrdma: {made} doorbell eventfds made, {presented} QPs' fixed parts kept with their \
         doorbells, {completed} QPs decoded and {} KiB of heap warmed ahead of the restore in {} \
         ms (hint: {})",
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
    let ahead = std::mem::take(&mut shared.lock().ahead);
    let (saved, same) = with_ahead(ahead, vm_migration::MAX_DECODED_BYTES, || {
        snapshot.state::<Saved<LoadedDsr, Objects>>(ID, VERSION)
    });
    let saved = saved?;
    let decoded = start.elapsed();
    let u_decoded = Usage::now();
    let env = &shared.env;
    let session = match saved.session {
        Some(mut s) => {
            let ns = Namespace::restore(&env.config.limits, &s.ns).map_err(restore_error)?;
            s.objects.check_doorbells().map_err(restore_error)?;
            s.objects.index_qpns().map_err(restore_error)?;
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
        "pvrdma: restore steps: decoded in {} ms ({}, {} KiB allocated; {same} QPs as decoded \
         ahead), namespace {} ms ({}), \
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
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use pvrdma_abi::cmd::CmdCode;
    use pvrdma_abi::verbs::qp_type;
    use vm_migration::{Pausable, Snapshot, Snapshottable};

    use super::{warm_heap, Bytes, CoolHeap, Hint, Received, Usage, HINT_ID, HINT_VERSION};
    use crate::config::Limits;
    use crate::objects::qp::saved::Presented;
    use crate::sim_driver::endpoint::{Endpoint, GID_B};
    use crate::sim_driver::{QpSpec, SimDriver};
    use crate::PvrdmaConfig;

    /// Held by the tests here that restore and by those that measure the
    /// heap: a restore's end sets glibc's thresholds back for the whole
    /// process, which lets it trim a heap another thread just warmed.
    static HEAP: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn heap() -> std::sync::MutexGuard<'static, ()> {
        HEAP.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Each QP as a restore must put it back: handle, `gen`, state, rings
    /// (pages, geometry, consumer index), doorbells and engine.
    fn qps(sim: &SimDriver) -> Vec<String> {
        let device = sim.device();
        let state = device.shared().lock();
        let objects = &state.session.as_ref().unwrap().objects;
        objects
            .qps
            .iter()
            .map(|(handle, qp)| {
                let classes: Vec<_> = qp.doorbells.classes().collect();
                format!(
                    "{handle} gen={} state={} sq={:?} rq={:?} doorbells={classes:?} engine={}",
                    qp.gen,
                    qp.state,
                    qp.sq,
                    qp.rq,
                    qp.engine.is_some()
                )
            })
            .collect()
    }

    fn presented(sim: &SimDriver, handle: u32) -> bool {
        let device = sim.device();
        let state = device.shared().lock();
        state.session.as_ref().unwrap().objects.qps[&handle].presented
    }

    /// An endpoint (a device with an RC QP), and the specs of more RC and
    /// UD QPs on its PD and CQ.
    fn endpoint() -> (SimDriver, QpSpec, QpSpec) {
        let b = Endpoint::on(SimDriver::new(), GID_B, QpSpec::rc);
        let rc = QpSpec::rc(b.pd, b.cq.handle);
        let ud = QpSpec {
            qp_type: qp_type::UD,
            ..rc
        };
        (b.sim, rc, ud)
    }

    /// `sim`'s restore hint, then its state once paused: short, its QPs'
    /// fixed parts having gone ahead in the hint.
    fn sent_ahead(sim: &SimDriver) -> (Snapshot, Snapshot) {
        let hint = sim.device().restore_hint().unwrap();
        sim.device().pause().unwrap();
        (hint, sim.device().snapshot().unwrap())
    }

    /// QPs destroyed, created (in the same handle) and modified between
    /// the restore hint and the later one, or after the later one, come
    /// back as the source had them at the switch-over: those sent ahead
    /// take their kept part, the others come whole, and a QP decoded
    /// ahead but destroyed since is not restored.
    #[test]
    fn qps_changed_after_the_hint_restore_as_at_the_switch_over() {
        let _heap = heap();
        for after_the_later_hint in [false, true] {
            let (mut sim, spec, ud) = endpoint();
            let gone = sim.create_qp(spec).unwrap();
            let kept = sim.create_qp(ud).unwrap();
            let dropped = sim.create_qp(ud).unwrap();
            sim.create_qp(ud).unwrap();
            let mut at_switch_over = Vec::new();
            let change = |sim: &mut SimDriver| {
                assert!(presented(sim, gone.handle) && presented(sim, kept.handle));
                sim.destroy(CmdCode::DestroyQp, gone.handle).unwrap();
                let bigger = QpSpec {
                    max_send_wr: 64,
                    ..spec
                };
                let new = sim.create_qp(bigger).unwrap();
                assert_eq!(new.handle, gone.handle, "the handle taken again");
                assert!(!presented(sim, new.handle), "a new QP is saved whole");
                sim.to_rts(kept.handle, qp_type::UD).unwrap();
                sim.destroy(CmdCode::DestroyQp, dropped.handle).unwrap();
                at_switch_over = qps(sim);
            };
            let (sim, _) = if after_the_later_hint {
                sim.migrate_paused_around(|_| (), change)
            } else {
                sim.migrate_paused_after(change)
            };
            assert_eq!(
                qps(&sim),
                at_switch_over,
                "after the later hint: {after_the_later_hint}"
            );
            assert_eq!(at_switch_over.len(), 4);
        }
    }

    /// A later hint (just before the switch-over) carries the short parts
    /// of the QPs sent before: a QP still the same at the save is saved as
    /// its `gen` alone (the state does not restore without that hint) and
    /// restores from what the hint sent; one changed after it (moved to
    /// RTS) comes as it is at the save.
    #[test]
    fn qps_the_same_since_the_later_hint_restore_from_it() {
        let _heap = heap();
        let (mut sim, _, ud) = endpoint();
        let changed = sim.create_qp(ud).unwrap();
        let first = sim.device().restore_hint().unwrap();
        let late = sim.device().restore_hint().unwrap();
        let sent: Received = late.state(HINT_ID, HINT_VERSION).unwrap();
        assert_eq!((sent.qps.len(), sent.states.len()), (0, 2));
        // Short parts of QPs whose fixed parts did not come are refused.
        assert!(SimDriver::new().device().prepare_restore(&late).is_err());
        sim.device().pause().unwrap();
        let same = sim.device().snapshot().unwrap();
        let fresh = SimDriver::new();
        fresh.device().prepare_restore(&first).unwrap();
        assert!(
            fresh.device().restore(&same).is_err(),
            "restored without them"
        );
        for hint in [&first, &late] {
            fresh.device().prepare_restore(hint).unwrap();
        }
        fresh.device().restore(&same).unwrap();
        assert_eq!(qps(&fresh), qps(&sim));

        sim.device().forget_hint();
        sim.device().resume().unwrap();
        let mut at_switch_over = Vec::new();
        let (restored, _) = sim.migrate_paused_around(
            |_| (),
            |sim| {
                sim.to_rts(changed.handle, qp_type::UD).unwrap();
                at_switch_over = qps(sim);
            },
        );
        assert_eq!(qps(&restored), at_switch_over);
        assert!(at_switch_over.iter().any(|q| q.contains(" state=3 ")));
    }

    /// The QPN index is made again from the restored QPs: received packets
    /// reach the QP of their QPN, and a state with two QPs of one QPN is
    /// refused, the device left as it was.
    #[test]
    fn restored_qps_are_indexed_by_their_own_qpns() {
        let _heap = heap();
        let (mut sim, rc, _) = endpoint();
        let other = sim.create_qp(rc).unwrap();
        let index = |sim: &SimDriver| {
            sim.device()
                .shared()
                .lock()
                .session
                .as_ref()
                .unwrap()
                .objects
                .qpns
                .clone()
        };
        let whole = sim.device().snapshot().unwrap();
        let fresh = SimDriver::new();
        fresh.device().restore(&whole).unwrap();
        assert_eq!(index(&fresh), index(&sim));
        assert_eq!(index(&sim).len(), 2, "the endpoint's QP and one more");
        {
            let device = sim.device();
            let mut state = device.shared().lock();
            let objects = &mut state.session.as_mut().unwrap().objects;
            let first = *objects.qpns.keys().next().unwrap();
            objects.qps.get_mut(&other.handle).unwrap().qpn = first;
        }
        let twice = sim.device().snapshot().unwrap();
        let fresh = SimDriver::new();
        assert!(fresh.device().restore(&twice).is_err());
        assert!(fresh.device().shared().lock().session.is_none());
    }

    /// A state whose QPs went ahead does not restore without their parts
    /// (no hint, or one whose QPs were not those): refused, the device
    /// left as it was; and once the migration is forgotten, the source
    /// saves whole states that restore anywhere.
    #[test]
    fn a_state_without_its_parts_sent_ahead_is_refused() {
        let _heap = heap();
        let b = Endpoint::on(SimDriver::new(), GID_B, QpSpec::rc);
        let (hint, short) = sent_ahead(&b.sim);
        let fresh = SimDriver::new();
        assert!(fresh.device().restore(&short).is_err());
        assert!(fresh.device().shared().lock().session.is_none());
        // Another device's QPs (none) sent ahead.
        let other = SimDriver::new().device().restore_hint();
        let empty = (0u64, None::<u64>, Vec::<()>::new(), Vec::<()>::new());
        let empty = Snapshot::new(HINT_ID, HINT_VERSION, &empty).unwrap();
        fresh
            .device()
            .prepare_restore(other.as_ref().unwrap_or(&empty))
            .unwrap();
        assert!(fresh.device().restore(&short).is_err());
        // With its own hint it restores.
        fresh.device().prepare_restore(&hint).unwrap();
        fresh.device().restore(&short).unwrap();
        // Forgotten: whole again, restored without a hint.
        b.sim.device().forget_hint();
        let whole = b.sim.device().snapshot().unwrap();
        assert!(whole.to_bytes().len() > short.to_bytes().len());
        SimDriver::new().device().restore(&whole).unwrap();
    }

    /// Two QPs whose parts sent ahead were swapped (each then has the
    /// other's rings and the doorbells of the other's handle) are refused
    /// at the restore, the device left as it was; the parts as sent
    /// restore.
    #[test]
    fn qps_sent_ahead_with_each_others_doorbells_are_refused() {
        let _heap = heap();
        let mut b = Endpoint::on(SimDriver::new(), GID_B, QpSpec::rc);
        b.sim.create_qp(QpSpec::rc(b.pd, b.cq.handle)).unwrap();
        let (hint, short) = sent_ahead(&b.sim);
        let parts =
            || -> Vec<Presented> { hint.state::<Received>(HINT_ID, HINT_VERSION).unwrap().qps };
        let (mut first, mut second) = (parts(), parts());
        assert_eq!(first.len(), 2);
        std::mem::swap(&mut first[0].2, &mut second[1].2);
        let swapped = [first.swap_remove(0), second.swap_remove(1)];
        let swapped = Snapshot::new(
            HINT_ID,
            HINT_VERSION,
            &Hint {
                eventfds: 0,
                uar_base: None,
                qps: swapped.iter().collect(),
                states: Vec::<Bytes<&[u8]>>::new(),
            },
        )
        .unwrap();
        let fresh = SimDriver::new();
        fresh.device().prepare_restore(&swapped).unwrap();
        assert!(fresh.device().restore(&short).is_err());
        assert!(fresh.device().shared().lock().session.is_none());
        fresh.device().prepare_restore(&hint).unwrap();
        fresh.device().restore(&short).unwrap();
    }

    /// The doorbells of the QPs sent ahead are registered when the hint
    /// comes, where the source had BAR2: the restore, inside the
    /// blackout, registers only the other objects' (the CQs'), and the
    /// QP's send doorbell then reaches the restored QP's eventfd.
    #[test]
    fn the_doorbells_of_qps_sent_ahead_are_registered_before_the_state_comes() {
        let _heap = heap();
        let b = Endpoint::on(SimDriver::new(), GID_B, QpSpec::rc);
        let (hint, short) = sent_ahead(&b.sim);
        let source = b.sim.ioevents.registrations();
        let fresh = SimDriver::new();
        let before = fresh.ioevents.registrations();
        fresh.device().prepare_restore(&hint).unwrap();
        let ahead: Vec<_> = fresh
            .ioevents
            .registrations()
            .into_iter()
            .filter(|r| !before.contains(r))
            .collect();
        assert_eq!(
            ahead.len(),
            2,
            "the QP's send and receive doorbells: {ahead:?}"
        );
        assert!(
            ahead.iter().all(|r| source.contains(r)),
            "where the source had them"
        );
        fresh.device().restore(&short).unwrap();
        let after = fresh.ioevents.registrations();
        assert!(
            ahead.iter().all(|r| after.contains(r)),
            "kept by the restore"
        );
        assert!(
            after.len() > before.len() + ahead.len(),
            "the CQs' made by the restore"
        );
        let (addr, value) = ahead[0];
        assert!(fresh.ioevents.lookup(addr, value.unwrap()).is_some());
    }

    /// A hint's QPs are the source's word: more QPs or ring pages than
    /// this device's limits allow are refused, and corrupted bytes are
    /// refused or taken without a panic.
    #[test]
    fn hostile_qps_sent_ahead_are_refused() {
        let _heap = heap();
        let mut b = Endpoint::on(SimDriver::new(), GID_B, QpSpec::rc);
        let spec = QpSpec::rc(b.pd, b.cq.handle);
        b.sim.create_qp(spec).unwrap();
        let real = b.sim.device().restore_hint().unwrap();
        let hint: Received = real.state(HINT_ID, HINT_VERSION).unwrap();
        assert_eq!(hint.qps.len(), 2);
        // Each copy another QP's (a `gen` sent twice is refused).
        let copies = |n: usize| {
            let qps: Vec<(u32, u64, _)> = (1u32..)
                .zip(hint.qps.iter().cycle().take(n))
                .map(|(n, (_, _, fixed))| (n, u64::from(n), fixed))
                .collect();
            Snapshot::new(
                HINT_ID,
                HINT_VERSION,
                &Hint {
                    eventfds: 0,
                    uar_base: None,
                    qps,
                    states: Vec::<Bytes<&[u8]>>::new(),
                },
            )
            .unwrap()
        };
        let limited = |limits: Limits| {
            SimDriver::with_config(&PvrdmaConfig {
                limits,
                ..PvrdmaConfig::default()
            })
        };
        let few_qps = limited(Limits {
            max_qp: 16,
            ..Limits::default()
        });
        few_qps.device().prepare_restore(&copies(16)).unwrap();
        // Kept across hints: one more is over the limit, as 17 at once.
        assert!(few_qps.device().prepare_restore(&copies(1)).is_err());
        let few = || {
            limited(Limits {
                max_qp: 16,
                ..Limits::default()
            })
        };
        assert!(few().device().prepare_restore(&copies(17)).is_err());
        // Two pages a QP (one for each ring).
        let few_pages = limited(Limits {
            max_mapped_pages: 8,
            ..Limits::default()
        });
        few_pages.device().prepare_restore(&copies(4)).unwrap();
        let few_pages = limited(Limits {
            max_mapped_pages: 8,
            ..Limits::default()
        });
        assert!(few_pages.device().prepare_restore(&copies(5)).is_err());
        let bytes = real.to_bytes();
        let mut refused = 0;
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0xa5;
            if let Ok(bad) = Snapshot::from_bytes(&bad) {
                let mut dev = few_qps.device();
                dev.shared().lock().ahead = Default::default();
                refused += usize::from(dev.prepare_restore(&bad).is_err());
            }
        }
        assert!(refused > 0);
    }

    /// After `warm_heap`, as many small allocations as it warmed (a
    /// decode's) touch no new pages; without it they fault every page in.
    #[test]
    fn a_warmed_heap_is_faulted_in_ahead() {
        let _heap = heap();
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
        let _heap = heap();
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
        // Half: the threads a test before this one left (its device's
        // workers ending) may free some of the process's heap meanwhile.
        let heap = after.heap.saturating_sub(before.heap);
        assert!(heap >= HEAP as u64 / 2, "heap {heap}");
        assert!(after.cpu_us > before.cpu_us, "CPU");
        assert!(after.since(&before).contains(" faults, "));
        drop(std::hint::black_box((kept, x)));
    }
}
