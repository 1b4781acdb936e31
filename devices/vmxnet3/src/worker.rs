// SPDX-License-Identifier: Apache-2.0
//! The data path: one thread per device running an event-manager loop.
//!
//! It wakes on the TX doorbells (KVM ioeventfds on `TXPROD[q]`, or the
//! register path signalling the same eventfds), on frames from the backend,
//! on port link changes, and on a timer polling the backend's link state.
//! All of guest memory it touches is reached through the activated
//! [`Active`] state under the [`DeviceState`] lock, which it holds for a
//! whole batch: QUIESCE_DEV and RESET_DEV take that lock and clear it, so
//! once they return the worker no longer reads the rings or writes guest
//! memory.
//!
//! Pausing (for migration) works the same way: [`Shared::set_run`] takes
//! that lock, so it returns between two batches, and every handler waits
//! under it while the device is paused ([`Shared::lock_running`]) before it
//! reads an eventfd, the backend or the timer. Doorbells rung and frames
//! arriving meanwhile stay in their eventfds and in the backend's queue,
//! and are served once the device runs again.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use device_worker::{Stoppable, WorkerHandle};
use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use log::{error, warn};
use net_port::{FrameBackend, Port, VnetHdr, MAX_FRAME_LEN};
use vm_memory::{GuestAddress, GuestAddressSpace, GuestMemory};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use crate::announce::Announcement;
use crate::interrupt::Interrupts;
use crate::metrics::Vmxnet3Metrics;
use crate::regs::{ECR_LINK, ECR_RQERR, ECR_TQERR, MAX_RX_QUEUES, MAX_TX_QUEUES};
use crate::ring::QueueFault;
use crate::rx::RxQueue;
use crate::shared::{update_ecr, write_queue_status, DeviceConf, QueueId};
use crate::stats::{RxStats, TxStats};
use crate::tx::{TxContext, TxQueue, TX_BUF_LEN};

const KILL_EVENT: u32 = 0;
const BACKEND_EVENT: u32 = 1;
const LINK_EVENT: u32 = 2;
const CARRIER_TIMER: u32 = 3;
const ANNOUNCE_TIMER: u32 = 4;
/// TX queue `q`'s doorbell is `TX_EVENT_BASE + q`.
const TX_EVENT_BASE: u32 = 8;
/// Frames taken from the backend per wake-up before doorbells get a turn.
const RX_BATCH: usize = 256;
/// How often the backend's link state is polled (a TAP has no cheaper
/// notification short of a netlink socket).
const CARRIER_POLL: Duration = Duration::from_secs(1);
/// Header bytes allowed on top of the MTU (`VMXNET3_MAX_ETH_HDR_SIZE`).
const MAX_ETH_HDR: usize = 22;

/// What ACTIVATE_DEV set up, until QUIESCE_DEV or RESET_DEV.
#[derive(Debug)]
pub(crate) struct Active {
    pub(crate) shared: GuestAddress,
    pub(crate) mtu: u16,
    pub(crate) event_intr: u8,
    pub(crate) tx: Vec<TxQueue>,
    pub(crate) rx: Vec<RxQueue>,
}

impl Active {
    pub(crate) fn new(conf: DeviceConf) -> Self {
        let queues = conf.rx.len();
        Active {
            shared: conf.shared,
            mtu: conf.mtu,
            event_intr: conf.event_intr,
            tx: conf.tx.into_iter().map(TxQueue::new).collect(),
            rx: conf
                .rx
                .into_iter()
                .enumerate()
                .map(|(i, q)| RxQueue::new(q, i, queues))
                .collect(),
        }
    }

    /// Sets `bits` in DriverShared `ecr` and raises the event interrupt.
    pub(crate) fn post_event<M: GuestMemory>(&self, mem: &M, intr: &Interrupts, bits: u32) {
        if let Err(e) = update_ecr(mem, self.shared, bits, 0) {
            error!("vmxnet3: cannot post event {bits:#x}: {e}");
            return;
        }
        intr.trigger(self.event_intr);
    }

    /// ECR write: the driver acknowledges `bits`.
    pub(crate) fn ack_events<M: GuestMemory>(&self, mem: &M, bits: u32) {
        if let Err(e) = update_ecr(mem, self.shared, 0, bits) {
            error!("vmxnet3: cannot acknowledge events {bits:#x}: {e}");
        }
    }
}

/// Whether the worker may serve the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum RunState {
    #[default]
    Running,
    /// Paused for migration: the worker waits before its next batch.
    Paused,
    /// The device is going away: the worker serves nothing more (a paused
    /// device's guest may be running on another host by now) and stops.
    Stopping,
}

/// What the register side (vCPU threads) and the worker share.
#[derive(Debug, Default)]
pub(crate) struct DeviceState {
    pub(crate) run: RunState,
    pub(crate) active: Option<Active>,
    /// Guest-visible statistics, per queue, from the last RESET_DEV.
    pub(crate) tx_stats: [TxStats; MAX_TX_QUEUES],
    pub(crate) rx_stats: [RxStats; MAX_RX_QUEUES],
    /// The link state the guest last read (GET_LINK): a LINK event is due
    /// whenever the carrier differs from it.
    pub(crate) reported_link: bool,
    /// A MAC to announce (set by a resume after a restore), for the worker
    /// to pick up on its next link event.
    pub(crate) announce: Option<[u8; 6]>,
}

/// The [`DeviceState`] lock and the signal that wakes a worker waiting out
/// a pause.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    state: Mutex<DeviceState>,
    run_changed: Condvar,
}

impl Shared {
    /// Sets the run state once the worker is between batches, and wakes it
    /// if it waits.
    pub(crate) fn set_run(&self, run: RunState) {
        lock(self).run = run;
        self.run_changed.notify_all();
    }

    /// The lock for a worker batch: waits while the device is paused;
    /// `None` once it is going away.
    fn lock_running(&self) -> Option<MutexGuard<'_, DeviceState>> {
        let guard = self
            .run_changed
            .wait_while(lock(self), |st| st.run == RunState::Paused)
            .unwrap_or_else(PoisonError::into_inner);
        (guard.run == RunState::Running).then_some(guard)
    }
}

pub(crate) type SharedState = Arc<Shared>;

pub(crate) fn lock(shared: &Shared) -> MutexGuard<'_, DeviceState> {
    shared.state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Stops the faulted queue `id` of `active` and tells the driver (queue
/// status, then TQERR or RQERR), which resets the device in response.
fn stop_queue<M: GuestMemory>(
    active: &mut Active,
    mem: &M,
    intr: &Interrupts,
    metrics: &Vmxnet3Metrics,
    id: QueueId,
    fault: &QueueFault,
) {
    let (desc, bit) = match id {
        QueueId::Tx(q) => {
            let Some(queue) = active.tx.get_mut(q) else {
                return;
            };
            queue.stopped = true;
            count_warn!(metrics.tx_queue_error, "{id} stopped: {fault}");
            (queue.conf.desc, ECR_TQERR)
        }
        QueueId::Rx(q) => {
            let Some(queue) = active.rx.get_mut(q) else {
                return;
            };
            queue.stopped = true;
            count_warn!(metrics.rx_queue_error, "{id} stopped: {fault}");
            (queue.conf.desc, ECR_RQERR)
        }
    };
    if let Err(e) = write_queue_status(mem, desc, true, fault.code()) {
        error!("vmxnet3: cannot write the status of {id}: {e}");
    }
    active.post_event(mem, intr, bit);
}

/// Everything the worker is built from.
pub(crate) struct WorkerParts<M> {
    pub(crate) mem: M,
    pub(crate) backend: Arc<dyn FrameBackend>,
    pub(crate) port: Arc<Port>,
    pub(crate) state: SharedState,
    pub(crate) intr: Arc<Interrupts>,
    pub(crate) metrics: Arc<Vmxnet3Metrics>,
    /// One per TX queue.
    pub(crate) tx_evts: Vec<EventFd>,
    pub(crate) link_evt: EventFd,
    pub(crate) kill_evt: EventFd,
}

/// The event subscriber that owns the data path.
pub(crate) struct Worker<M> {
    p: WorkerParts<M>,
    carrier_timer: TimerFd,
    /// Armed while an announcement has frames to come.
    announce_timer: TimerFd,
    announcement: Option<Announcement>,
    /// The backend's link state at the last poll.
    backend_link: bool,
    tx_buf: Vec<u8>,
    rx_buf: Vec<u8>,
    stopped: bool,
}

impl<M: GuestAddressSpace> Worker<M> {
    pub(crate) fn new(parts: WorkerParts<M>) -> Result<Self, SpawnError> {
        let mut carrier_timer = TimerFd::new().map_err(SpawnError::Timer)?;
        carrier_timer
            .reset(CARRIER_POLL, Some(CARRIER_POLL))
            .map_err(SpawnError::Timer)?;
        Ok(Worker {
            backend_link: parts.port.state().carrier,
            p: parts,
            carrier_timer,
            announce_timer: TimerFd::new().map_err(SpawnError::Timer)?,
            announcement: None,
            tx_buf: vec![0; TX_BUF_LEN],
            rx_buf: vec![0; MAX_FRAME_LEN],
            stopped: false,
        })
    }

    fn handle_tx(&mut self, q: usize) {
        let Some(mut guard) = self.p.state.lock_running() else {
            self.stopped = true;
            return;
        };
        let Some(evt) = self.p.tx_evts.get(q) else {
            return;
        };
        // The count is irrelevant: one pass serves everything posted.
        let _ = evt.read();
        let st = &mut *guard;
        let (Some(active), Some(stats)) = (st.active.as_mut(), st.tx_stats.get_mut(q)) else {
            return;
        };
        let Some(queue) = active.tx.get_mut(q).filter(|queue| !queue.stopped) else {
            return;
        };
        let mem = self.p.mem.memory();
        let mut ctx = TxContext {
            mem: &*mem,
            backend: &*self.p.backend,
            port: &self.p.port,
            metrics: &self.p.metrics,
            buf: &mut self.tx_buf,
        };
        match queue.process(&mut ctx, stats) {
            Ok(pass) => {
                if pass.completed {
                    self.p.intr.trigger(queue.conf.intr);
                }
                // Come back after the other events.
                if pass.more {
                    if let Err(e) = evt.write(1) {
                        error!("vmxnet3: cannot requeue TX queue {q}: {e}");
                    }
                }
            }
            Err(fault) => stop_queue(
                active,
                &*mem,
                &self.p.intr,
                &self.p.metrics,
                QueueId::Tx(q),
                &fault,
            ),
        }
    }

    /// Takes a batch of frames from the backend. On an error the backend
    /// is dropped from the loop for good (a TAP only fails when its
    /// interface is gone) rather than spinning on it.
    fn handle_backend(&mut self, events: EventSet, ops: &mut EventOps) {
        let Some(mut guard) = self.p.state.lock_running() else {
            self.stopped = true;
            return;
        };
        let st = &mut *guard;
        let mem = self.p.mem.memory();
        let mut delivered = false;
        let mut broken = events.intersects(EventSet::ERROR | EventSet::HANG_UP);
        for _ in 0..RX_BATCH {
            match self.p.backend.recv(&mut self.rx_buf) {
                Ok(Some((hdr, len))) => {
                    let frame = self.rx_buf.get(..len).unwrap_or_default();
                    // RoCE v2 for the port's RDMA function never reaches
                    // the guest's network stack.
                    if hdr.is_plain() && self.p.port.steer_to_rdma(frame) {
                        continue;
                    }
                    delivered |= receive(st, &*mem, &self.p.intr, &self.p.metrics, &hdr, frame);
                }
                Ok(None) => break,
                Err(e) => {
                    self.p.metrics.rx_backend_error.inc();
                    error!("vmxnet3: backend receive failed, reception stops: {e}");
                    broken = true;
                    break;
                }
            }
        }
        if delivered {
            if let Some(queue) = st.active.as_ref().and_then(|a| a.rx.first()) {
                self.p.intr.trigger(queue.conf.intr);
            }
        }
        if broken {
            let fd = self.p.backend.rx_fd();
            if let Err(e) = ops.remove(Events::empty_raw(fd)) {
                error!("vmxnet3: cannot stop watching the backend: {e}");
            }
        }
    }

    fn handle_link(&mut self) {
        let Some(mut st) = self.p.state.lock_running() else {
            self.stopped = true;
            return;
        };
        let _ = self.p.link_evt.read();
        let carrier = self.p.port.state().carrier;
        if let Some(active) = st.active.as_ref() {
            if carrier != st.reported_link {
                self.p.metrics.link_events.inc();
                active.post_event(&*self.p.mem.memory(), &self.p.intr, ECR_LINK);
            }
        }
        let announce = st.announce.take();
        drop(st);
        if let Some(mac) = announce {
            self.announcement = Some(Announcement::new(mac));
            self.announce();
        }
    }

    /// Sends the announcement's next frame and arms the timer for the one
    /// after, if any.
    fn announce(&mut self) {
        let Some(announcement) = self.announcement.as_mut() else {
            return;
        };
        if let Err(e) = self
            .p
            .backend
            .send(&VnetHdr::default(), announcement.next_frame())
        {
            warn!("vmxnet3: cannot announce the MAC: {e}");
        }
        let next = announcement.next_gap();
        if next.is_none() {
            self.announcement = None;
        }
        // Zero disarms the timer.
        if let Err(e) = self.announce_timer.reset(next.unwrap_or_default(), None) {
            warn!("vmxnet3: cannot schedule the next MAC announcement: {e}");
            self.announcement = None;
        }
    }

    fn handle_announce_timer(&mut self) {
        // A pause in between delays the frame, as it would any other.
        if self.p.state.lock_running().is_none() {
            self.stopped = true;
            return;
        }
        let _ = self.announce_timer.wait();
        self.announce();
    }

    /// The backend is the carrier's source, but only its changes are
    /// passed on, so a carrier set through the port by someone else (an
    /// API) stands until the backend itself changes.
    fn poll_carrier(&mut self) {
        // Waits out a pause too: a paused device changes nothing, not even
        // the port's carrier.
        let Some(_running) = self.p.state.lock_running() else {
            self.stopped = true;
            return;
        };
        let _ = self.carrier_timer.wait();
        let up = self.p.backend.link_up();
        if up != self.backend_link {
            self.backend_link = up;
            self.p.port.set_carrier(up);
        }
    }
}

/// Every frame from the backend the port's RDMA function did not claim
/// comes through here, to the guest's RX queue 0 (RSS is not emulated: one
/// queue serves every flow). Returns whether the frame was delivered.
fn receive<M: GuestMemory>(
    st: &mut DeviceState,
    mem: &M,
    intr: &Interrupts,
    metrics: &Vmxnet3Metrics,
    hdr: &VnetHdr,
    frame: &[u8],
) -> bool {
    if !hdr.is_plain() {
        count_warn!(
            metrics.rx_bad_vnet_hdr,
            "backend frame with offload work left: {hdr:?}"
        );
        return false;
    }
    let (Some(active), Some(stats)) = (st.active.as_mut(), st.rx_stats.first_mut()) else {
        metrics.rx_inactive.inc();
        return false;
    };
    if frame.len() > usize::from(active.mtu).saturating_add(MAX_ETH_HDR) {
        count_warn!(
            metrics.rx_too_large,
            "{}-byte frame exceeds the guest MTU {}",
            frame.len(),
            active.mtu
        );
        return false;
    }
    let Some(queue) = active.rx.first_mut().filter(|queue| !queue.stopped) else {
        metrics.rx_inactive.inc();
        return false;
    };
    match queue.deliver(mem, frame, metrics, stats) {
        Ok(delivered) => delivered,
        Err(fault) => {
            stop_queue(active, mem, intr, metrics, QueueId::Rx(0), &fault);
            false
        }
    }
}

impl<M: GuestAddressSpace> MutEventSubscriber for Worker<M> {
    fn init(&mut self, ops: &mut EventOps) {
        let mut events = vec![
            Events::with_data(&self.p.kill_evt, KILL_EVENT, EventSet::IN),
            Events::with_data_raw(self.p.backend.rx_fd(), BACKEND_EVENT, EventSet::IN),
            Events::with_data(&self.p.link_evt, LINK_EVENT, EventSet::IN),
            Events::with_data(&self.carrier_timer, CARRIER_TIMER, EventSet::IN),
            Events::with_data(&self.announce_timer, ANNOUNCE_TIMER, EventSet::IN),
        ];
        for (q, evt) in (TX_EVENT_BASE..).zip(&self.p.tx_evts) {
            events.push(Events::with_data(evt, q, EventSet::IN));
        }
        for event in events {
            if let Err(e) = ops.add(event) {
                error!(
                    "vmxnet3: failed to watch worker event {}: {e}",
                    event.data()
                );
            }
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        match events.data() {
            KILL_EVENT => self.stopped = true,
            BACKEND_EVENT => self.handle_backend(events.event_set(), ops),
            LINK_EVENT => self.handle_link(),
            CARRIER_TIMER => self.poll_carrier(),
            ANNOUNCE_TIMER => self.handle_announce_timer(),
            data => match data
                .checked_sub(TX_EVENT_BASE)
                .and_then(|q| usize::try_from(q).ok())
            {
                Some(q) => self.handle_tx(q),
                None => error!("vmxnet3: unexpected worker event {data}"),
            },
        }
    }
}

impl<M: GuestAddressSpace> Stoppable for Worker<M> {
    fn kill_evt(&self) -> &EventFd {
        &self.p.kill_evt
    }

    fn stopped(&self) -> bool {
        self.stopped
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("Failed to create the carrier poll timer")]
    Timer(#[source] vmm_sys_util::errno::Error),
    #[error(transparent)]
    Start(#[from] device_worker::SpawnError),
}

/// Builds the worker from `parts` and starts it on the `vmxnet3` thread.
pub(crate) fn spawn_worker<M>(parts: WorkerParts<M>) -> Result<WorkerHandle, SpawnError>
where
    M: GuestAddressSpace + Send + 'static,
{
    Ok(WorkerHandle::spawn("vmxnet3", Worker::new(parts)?)?)
}
