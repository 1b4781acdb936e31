// SPDX-License-Identifier: Apache-2.0
//! UAR doorbells (BAR2, ABI doc 5).
//!
//! Each object's doorbells become KVM ioeventfds with datamatch, at the
//! address of the UAR page that owns the object, registered when it is
//! created and removed when it is destroyed ([`Doorbells`] does both, the
//! latter on drop, so error paths and RESET cannot leak one):
//!
//! | object | offset | value                 | eventfd                  |
//! |--------|--------|-----------------------|--------------------------|
//! | QP     | 0x0    | `handle \| SEND`       | the QP's                 |
//! | QP     | 0x0    | `handle \| RECV`       | the QP's (same one)      |
//! | CQ     | 0x4    | `handle \| ARM`        | the CQ's arm eventfd     |
//! | CQ     | 0x4    | `handle \| ARM_SOL`    | the CQ's arm-sol eventfd |
//! | CQ     | 0x4    | `handle \| POLL`       | one device-wide eventfd  |
//! | SRQ    | 0x8    | `handle \| RECV`       | the SRQ's                |
//!
//! Send and receive share an eventfd (the worker looks at both queues, an
//! index read each) to halve the file descriptors a QP costs; the two arm
//! kinds cannot share, their difference is state the guest memory does not
//! hold. POLL is written on every empty poll: its eventfd is never watched,
//! only drained now and then, so it never costs a trip to userspace. No
//! registration is a wildcard, so KVM never has to choose between a
//! wildcard and a datamatch at one address.
//!
//! A write that matches no registration (a doorbell for an object of
//! another page, an unknown value, or any doorbell while registration
//! failed or decoding is off) exits as MMIO and reaches [`handle_write`],
//! which signals the same eventfd KVM would have, or ignores the write.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use pci::IoEventRegistrar;
use pvrdma_abi::regs::uar;
use pvrdma_abi::{HANDLE_MASK, PAGE_SHIFT, PAGE_SIZE};
use serde::{Deserialize, Serialize};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::metrics::Metrics;

/// One doorbell of a UAR page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Doorbell {
    QpSend,
    QpRecv,
    CqArm,
    CqArmSol,
    CqPoll,
    SrqRecv,
}

impl Doorbell {
    /// Offset within the UAR page.
    const fn offset(self) -> u64 {
        match self {
            Doorbell::QpSend | Doorbell::QpRecv => uar::QP_OFFSET,
            Doorbell::CqArm | Doorbell::CqArmSol | Doorbell::CqPoll => uar::CQ_OFFSET,
            Doorbell::SrqRecv => uar::SRQ_OFFSET,
        }
    }

    const fn flag(self) -> u32 {
        match self {
            Doorbell::QpSend => uar::QP_SEND,
            Doorbell::QpRecv => uar::QP_RECV,
            Doorbell::CqArm => uar::CQ_ARM,
            Doorbell::CqArmSol => uar::CQ_ARM_SOL,
            Doorbell::CqPoll => uar::CQ_POLL,
            Doorbell::SrqRecv => uar::SRQ_RECV,
        }
    }

    /// The kind of object the doorbell belongs to.
    const fn owner(self) -> Owner {
        match self {
            Doorbell::QpSend | Doorbell::QpRecv => Owner::Qp,
            Doorbell::CqArm | Doorbell::CqArmSol | Doorbell::CqPoll => Owner::Cq,
            Doorbell::SrqRecv => Owner::Srq,
        }
    }

    /// The watched eventfd it signals, `None` for POLL.
    const fn class(self) -> Option<Class> {
        match self {
            Doorbell::QpSend | Doorbell::QpRecv => Some(Class::Qp),
            Doorbell::CqArm => Some(Class::CqArm),
            Doorbell::CqArmSol => Some(Class::CqArmSol),
            Doorbell::CqPoll => None,
            Doorbell::SrqRecv => Some(Class::Srq),
        }
    }
}

/// Objects that have doorbells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    Qp,
    Cq,
    Srq,
}

/// What a watched eventfd means to the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    Qp = 1,
    CqArm = 2,
    CqArmSol = 3,
    Srq = 4,
}

impl Class {
    /// The worker's event data: class in the top byte, handle below.
    pub(crate) const fn event_data(self, handle: u32) -> u32 {
        (self as u32) << 24 | (handle & HANDLE_MASK)
    }

    pub(crate) fn from_event_data(data: u32) -> Option<(Class, u32)> {
        let class = match data >> 24 {
            1 => Class::Qp,
            2 => Class::CqArm,
            3 => Class::CqArmSol,
            4 => Class::Srq,
            _ => return None,
        };
        Some((class, data & HANDLE_MASK))
    }
}

/// A change to the worker's watch list.
#[derive(Debug)]
pub(crate) enum WatchOp {
    /// The worker shares the object's eventfd, so the descriptor stays
    /// open (and its number unused by anything else) until the worker has
    /// removed it from its epoll set.
    Add {
        data: u32,
        fd: Arc<EventFd>,
        gen: u64,
    },
    Remove {
        data: u32,
    },
}

/// What every [`Doorbells`] needs: the registrar, the shared POLL eventfd
/// and the worker's watch list.
pub(crate) struct Hub {
    ioevents: Arc<dyn IoEventRegistrar>,
    pub(crate) poll: Arc<EventFd>,
    watch: Mutex<Vec<WatchOp>>,
    /// Wakes the worker to apply `watch`.
    pub(crate) wake: EventFd,
    metrics: Arc<Metrics>,
    /// Eventfds made ahead of a restore ([`Hub::make_ahead`]), taken by
    /// [`Doorbells::attach`] before it makes any.
    ahead: Mutex<Vec<EventFd>>,
}

impl Hub {
    pub(crate) fn new(
        ioevents: Arc<dyn IoEventRegistrar>,
        metrics: Arc<Metrics>,
    ) -> io::Result<Self> {
        Ok(Self {
            ioevents,
            poll: Arc::new(EventFd::new(EFD_NONBLOCK)?),
            watch: Mutex::new(Vec::new()),
            wake: EventFd::new(EFD_NONBLOCK)?,
            metrics,
            ahead: Mutex::new(Vec::new()),
        })
    }

    /// Makes up to `n` eventfds for the doorbells of objects a restore
    /// will attach, so that the restore (inside a migration's blackout)
    /// takes them instead of making one system call each. Returns how
    /// many are made ahead; a failure (descriptors exhausted) ends it
    /// early: the rest are made by the restore, as without.
    pub(crate) fn make_ahead(&self, n: usize) -> usize {
        let mut ahead = self.ahead.lock().unwrap_or_else(PoisonError::into_inner);
        let more = n.saturating_sub(ahead.len());
        ahead.reserve(more);
        while ahead.len() < n {
            match EventFd::new(EFD_NONBLOCK) {
                Ok(fd) => ahead.push(fd),
                Err(e) => {
                    log::warn!("pvrdma: {} of {n} eventfds made ahead: {e}", ahead.len());
                    break;
                }
            }
        }
        ahead.len()
    }

    /// Eventfds made ahead and not taken.
    pub(crate) fn ahead(&self) -> usize {
        self.ahead
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Closes the eventfds made ahead that no restore took (once the VM
    /// runs: closing is no work for the blackout either).
    pub(crate) fn drop_ahead(&self) {
        let left = std::mem::take(&mut *self.ahead.lock().unwrap_or_else(PoisonError::into_inner));
        if !left.is_empty() {
            log::info!("pvrdma: {} eventfds made ahead were not needed", left.len());
        }
    }

    /// An eventfd made ahead, or a new one.
    fn eventfd(&self) -> io::Result<EventFd> {
        let ahead = self
            .ahead
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        ahead.map_or_else(|| EventFd::new(EFD_NONBLOCK), Ok)
    }

    /// Hands `ops` to the worker, which applies them when next woken.
    fn queue(&self, ops: impl IntoIterator<Item = WatchOp>) {
        self.watch
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(ops);
    }

    /// Wakes the worker to apply the queued ops (once for a batch: a
    /// restore attaches thousands of doorbells).
    pub(crate) fn wake_worker(&self) {
        if let Err(e) = self.wake.write(1) {
            log::error!("pvrdma: failed to wake the doorbell worker: {e}");
        }
    }

    /// The changes queued since the last call.
    pub(crate) fn take_watch_ops(&self) -> Vec<WatchOp> {
        std::mem::take(&mut *self.watch.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").finish_non_exhaustive()
    }
}

/// The doorbells of one object. Saved state keeps what they are (page,
/// handle, kinds); the eventfds and registrations are made again by
/// [`Doorbells::attach`] on restore.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Doorbells {
    /// `None` until attached (a restored object).
    #[serde(skip)]
    hub: Option<Arc<Hub>>,
    page: u32,
    handle: u32,
    kinds: Vec<Doorbell>,
    /// Watched eventfds, one per class.
    #[serde(skip)]
    fds: Vec<(Class, Arc<EventFd>)>,
    /// Where the ioeventfds are and which registrations succeeded.
    #[serde(skip)]
    base: Option<u64>,
    #[serde(skip)]
    registered: Vec<Doorbell>,
}

impl Doorbells {
    /// Eventfds for `kinds` of object `handle` on UAR page `page`, watched
    /// by the worker (which checks `gen` against the object), registered
    /// at `base` if decoding is on.
    pub(crate) fn new(
        hub: &Arc<Hub>,
        page: u32,
        handle: u32,
        gen: u64,
        kinds: &[Doorbell],
        base: Option<u64>,
    ) -> io::Result<Self> {
        let mut doorbells = Self {
            hub: None,
            page,
            handle,
            kinds: kinds.to_vec(),
            fds: Vec::new(),
            base: None,
            registered: Vec::new(),
        };
        doorbells.attach(hub, gen, base)?;
        hub.wake_worker();
        Ok(doorbells)
    }

    /// Whether these are the doorbells `kinds` of object `handle` on UAR
    /// page `page`, as its creation made them: a restored state's are the
    /// source's word, and one that named another object's handle or page
    /// would let the guest's ring of one drive the other.
    pub(crate) fn are(&self, page: u32, handle: u32, kinds: &[Doorbell]) -> bool {
        self.page == page && self.handle == handle && self.kinds == kinds
    }

    /// Makes the eventfds, queues their watch for the worker (the caller
    /// wakes it) and registers them at `base`; if attached already (made
    /// ahead of a restore), only moves them to `base`.
    pub(crate) fn attach(&mut self, hub: &Arc<Hub>, gen: u64, base: Option<u64>) -> io::Result<()> {
        if self.hub.is_some() {
            self.rebase(base);
            return Ok(());
        }
        let mut fds: Vec<(Class, Arc<EventFd>)> = Vec::new();
        for class in self.classes() {
            fds.push((class, Arc::new(hub.eventfd()?)));
        }
        let handle = self.handle;
        hub.queue(fds.iter().map(|(class, fd)| WatchOp::Add {
            data: class.event_data(handle),
            fd: Arc::clone(fd),
            gen,
        }));
        self.fds = fds;
        self.hub = Some(Arc::clone(hub));
        self.rebase(base);
        Ok(())
    }

    pub(crate) fn page(&self) -> u32 {
        self.page
    }

    /// The watched eventfds' classes, each once: one eventfd each.
    pub(crate) fn classes(&self) -> impl Iterator<Item = Class> + '_ {
        self.kinds.iter().enumerate().filter_map(|(i, kind)| {
            let class = kind.class()?;
            let earlier = self.kinds.get(..i).unwrap_or_default();
            earlier
                .iter()
                .all(|e| e.class() != Some(class))
                .then_some(class)
        })
    }

    fn fd(&self, kind: Doorbell) -> Option<&Arc<EventFd>> {
        match kind.class() {
            None => self.hub.as_ref().map(|hub| &hub.poll),
            Some(class) => self.fds.iter().find(|(c, _)| *c == class).map(|(_, fd)| fd),
        }
    }

    /// Guest address and value of `kind`'s ioeventfd at BAR2 `base`.
    fn address(&self, base: u64, kind: Doorbell) -> Option<(u64, u32)> {
        let page = u64::from(self.page).checked_mul(PAGE_SIZE)?;
        let addr = base.checked_add(page)?.checked_add(kind.offset())?;
        Some((addr, self.handle | kind.flag()))
    }

    /// Moves the ioeventfds to BAR2 `base` (or removes them for `None`).
    /// A failed registration is counted; that doorbell then exits to the
    /// VMM and still works through [`handle_write`].
    pub(crate) fn rebase(&mut self, base: Option<u64>) {
        if base == self.base {
            return;
        }
        self.unregister();
        self.base = base;
        let (Some(base), Some(hub)) = (base, self.hub.clone()) else {
            return;
        };
        for &kind in &self.kinds {
            let (Some((addr, value)), Some(fd)) = (self.address(base, kind), self.fd(kind)) else {
                continue;
            };
            match hub.ioevents.register_shared(fd, addr, Some(value)) {
                Ok(()) => self.registered.push(kind),
                Err(e) => guest_warn!(
                    hub.metrics.ioevent_failed,
                    "no ioeventfd for doorbell {kind:?} of handle {}: {e}",
                    self.handle
                ),
            }
        }
    }

    fn unregister(&mut self) {
        let (Some(base), Some(hub)) = (self.base, self.hub.clone()) else {
            return;
        };
        for kind in std::mem::take(&mut self.registered) {
            let (Some((addr, value)), Some(fd)) = (self.address(base, kind), self.fd(kind)) else {
                continue;
            };
            if let Err(e) = hub.ioevents.unregister(fd, addr, Some(value)) {
                log::warn!("pvrdma: failed to unregister doorbell {kind:?}: {e}");
            }
        }
    }

    /// Signals what KVM would have signalled for `kind`; false if this
    /// object has no such doorbell.
    fn ring(&self, kind: Doorbell) -> bool {
        if !self.kinds.contains(&kind) {
            return false;
        }
        match self.fd(kind).map(|fd| fd.write(1)) {
            Some(Ok(())) => true,
            Some(Err(e)) => {
                log::warn!("pvrdma: failed to signal doorbell {kind:?}: {e}");
                true
            }
            None => false,
        }
    }
}

impl Drop for Doorbells {
    fn drop(&mut self) {
        self.unregister();
        let handle = self.handle;
        if let Some(hub) = self.hub.as_ref() {
            hub.queue(self.fds.iter().map(|(class, _)| WatchOp::Remove {
                data: class.event_data(handle),
            }));
            hub.wake_worker();
        }
    }
}

/// The doorbells a 32-bit value at `offset` of a UAR page rings, and the
/// handle; `None` for a value no driver writes there.
fn decode(offset: u64, value: u32) -> Option<(Vec<Doorbell>, u32)> {
    let candidates: &[Doorbell] = match offset {
        uar::QP_OFFSET => &[Doorbell::QpSend, Doorbell::QpRecv],
        uar::CQ_OFFSET => &[Doorbell::CqArm, Doorbell::CqArmSol, Doorbell::CqPoll],
        uar::SRQ_OFFSET => &[Doorbell::SrqRecv],
        _ => return None,
    };
    let flags = value & !HANDLE_MASK;
    let known = candidates.iter().fold(0, |acc, k| acc | k.flag());
    if flags == 0 || flags & !known != 0 {
        return None;
    }
    let mut rung: Vec<Doorbell> = candidates
        .iter()
        .copied()
        .filter(|k| flags & k.flag() != 0)
        .collect();
    // ARM covers ARM_SOL: "any completion" includes solicited ones.
    if rung.contains(&Doorbell::CqArm) {
        rung.retain(|k| *k != Doorbell::CqArmSol);
    }
    Some((rung, value & HANDLE_MASK))
}

/// A guest write to BAR2 that no ioeventfd caught. Only 32-bit writes of
/// a known doorbell of an object owned by that page take effect; anything
/// else is counted and ignored. `doorbells_of` finds the doorbells of an
/// object by kind and handle (the session's objects, if any).
pub(crate) fn handle_write<'a>(
    doorbells_of: impl FnOnce(Owner, u32) -> Option<&'a Doorbells>,
    metrics: &Metrics,
    offset: u64,
    data: &[u8],
) {
    let Ok(bytes) = <[u8; 4]>::try_from(data) else {
        guest_warn!(
            metrics.doorbell_unmatched,
            "{}-byte UAR write at {offset:#x}",
            data.len()
        );
        return;
    };
    let value = u32::from_le_bytes(bytes);
    let page = u32::try_from(offset >> PAGE_SHIFT).unwrap_or(u32::MAX);
    let in_page = offset & (PAGE_SIZE - 1);
    let rung = decode(in_page, value).and_then(|(kinds, handle)| {
        let doorbells = doorbells_of(kinds.first()?.owner(), handle)?;
        if doorbells.page() != page {
            return None;
        }
        let mut any = false;
        for kind in kinds {
            any |= doorbells.ring(kind);
        }
        any.then_some(())
    });
    if rung.is_none() {
        guest_warn!(
            metrics.doorbell_unmatched,
            "UAR write {value:#x} at page {page} offset {in_page:#x} matches no doorbell"
        );
    }
}
